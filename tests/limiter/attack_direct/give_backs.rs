//! Give-backs across changes, `acquire` dropped, foreign decisions, bad input, panics and
//! stale readings on a direct limiter (sections 7 to 14).

use super::*;

// 7. A refund after a change of period, of an admission made two windows before it: never more
//    than if the request had never been made (the twin never saw it).

/// Admissions of both at `clock`'s instants, cumulated: the refunded limiter never ahead.
fn assert_never_ahead_of_twin<A: Algorithm>(
    a: &DirectRateLimiter<A, ManualClock>,
    twin: &DirectRateLimiter<A, ManualClock>,
    clock: &ManualClock,
    steps: u32,
    step_ms: u64,
    context: &str,
) {
    let (mut got, mut twin_got) = (0, 0);
    for i in 0..steps {
        got += drain(a);
        twin_got += drain(twin);
        assert!(
            got <= twin_got,
            "{}: {context}: step {i} ({:?}): {got} admitted after the refund, {twin_got} by a \
             twin that never made the request",
            name::<A>(),
            clock.elapsed()
        );
        clock.advance(Duration::from_millis(step_ms));
    }
}

/// A limiter and its twin on one manual clock, which the attack treats alike but for what it
/// attacks.
type Twins<A> = (
    ManualClock,
    DirectRateLimiter<A, ManualClock>,
    DirectRateLimiter<A, ManualClock>,
);

fn twins<A: Algorithm>(q: Quota) -> Twins<A> {
    let clock = ManualClock::new();
    let (a, twin) = (direct(q, clock.clone()), direct(q, clock.clone()));
    (clock, a, twin)
}

fn refund_two_windows_back_across_a_period_change<A: Algorithm>() {
    let q = quota(10, S, 10, 0);
    let (clock, a, twin) = twins::<A>(q);
    clock.set(Duration::from_millis(500));
    let old = a.check_n(5).unwrap();
    assert!(old.allowed);
    clock.set(Duration::from_millis(1_999));
    assert_eq!(drain(&a), drain(&twin), "{}", name::<A>());
    clock.set(Duration::from_millis(2_500));
    assert_eq!(drain(&a), drain(&twin), "{}", name::<A>());
    let longer = quota(10, 2 * S, 10, 0);
    [&a, &twin].iter().for_each(|l| l.set_quota(longer));
    assert!(refund(&a, 5, old));
    assert_never_ahead_of_twin(&a, &twin, &clock, 12, 500, "refund of 0.5 s");
}

// 8. A reservation into the next window, the period lengthened, then the reservation given
//    back (a waiter gone): never more than if it had never been made, and the window of the
//    change admits at most the larger quota.

fn reservation_refunded_after_the_period_grew<A: Algorithm>() {
    let q = quota(10, S, 10, S);
    let (clock, a, twin) = twins::<A>(q);
    clock.set(Duration::from_millis(500));
    assert_eq!(drain(&a), drain(&twin), "{}", name::<A>());
    let waiter = reserve(&a, 1).unwrap();
    assert!(
        waiter.allowed && !waiter.wait.is_zero(),
        "{}: {waiter:?}",
        name::<A>()
    );
    let longer = quota(10, 4 * S, 10, S);
    [&a, &twin].iter().for_each(|l| l.set_quota(longer));
    assert!(refund(&a, 1, waiter));
    assert_never_ahead_of_twin(&a, &twin, &clock, 20, 250, "waiter gone");
}

// 8b. A refund whose admission is no longer the key's latest, though the key's TAT came back to
//     the very value that admission left (an earlier admission given back, then a later one):
//     never more than if the request had never been made.

fn refund_of_an_admission_whose_tat_came_back<A: Algorithm>() {
    // GCRA: one permit a second, burst 2; the windows: 2 per 2 s.
    let q = quota(2, 2 * S, 2, 0);
    let (clock, a, twin) = twins::<A>(q);
    let (d0, d1, t0) = (a.check(), a.check(), twin.check());
    assert!(d0.allowed && d1.allowed && t0.allowed, "{}", name::<A>());
    // The first is vetoed at once (both limiters); the twin never sees the second.
    assert!(refund(&a, 1, d0) && refund(&twin, 1, t0));
    clock.set(Duration::from_secs(1));
    let (d3, t3) = (a.check(), twin.check());
    assert!(d3.allowed && t3.allowed, "{}", name::<A>());
    // GCRA: the TAT is back at 2 s, the value the second admission left, but that admission
    // is no longer the latest. It is given back now.
    assert!(refund(&a, 1, d1));
    // Both given back: at this instant the key holds only the third, so one more fits a burst
    // of 2 (GCRA), or a window of 2 (the windows).
    let (now_a, now_twin) = (drain(&a), drain(&twin));
    let admitted_at_one_second = 1 + now_a;
    assert!(
        admitted_at_one_second <= 2,
        "{}: {} admitted at 1 s with a limit of 2 (the other two given back)",
        name::<A>(),
        admitted_at_one_second
    );
    assert!(
        now_a <= now_twin,
        "{}: {now_a} against {now_twin}",
        name::<A>()
    );
    clock.advance(Duration::from_millis(250));
    assert_never_ahead_of_twin(&a, &twin, &clock, 8, 250, "TAT came back");
}

// 9. `set_quota` preempted between its clock reading and its store (a monotonic clock; the
//    thread just loses the CPU) while checks move on: no more than the larger quota.

fn preempted_set_quota<A: Algorithm>() {
    preempted_change::<A, _>(
        |clock| direct::<A, _>(quota(10, 10 * S, 10, 0), clock),
        |l, q| l.set_quota(q),
        |l| l.quota(),
        |l| drain(l),
    );
}

/// The same, on a key of a keyed limiter, whose shards each carry their rule on.
fn preempted_set_quota_keyed<A: Algorithm>() {
    preempted_change::<A, _>(
        |clock| {
            KeyedRateLimiter::<&str>::builder(quota(10, 10 * S, 10, 0))
                .algorithm::<A>()
                .clock(clock)
                .build()
        },
        |l, q| l.set_quota(q),
        |l| l.quota(),
        |l| admitted_until_refused(|| l.check(&"k").allowed),
    );
}

/// 10 per 10 s, windows from 0; a change to 10 per second reads the clock at 0.5 s and loses
/// the CPU while checks drain the key at 50.5 s; once it is stored, the same instant admits
/// nothing more.
fn preempted_change<A: Algorithm, L: Clone + Send>(
    build: impl FnOnce(GateClock) -> L,
    set_quota: impl Fn(&L, Quota) + Send + Copy,
    quota_of: impl Fn(&L) -> Quota,
    drain: impl Fn(&L) -> u64,
) {
    let time = ManualClock::new();
    let clock = GateClock::new(&time);
    let limiter = build(clock.clone());
    time.set(Duration::from_millis(500));
    let faster = quota(10, S, 10, 0);
    let changer = limiter.clone();
    let (admitted, ()) = while_held(
        &clock,
        move || set_quota(&changer, faster),
        || {
            // The change read 0.5 s and lost the CPU; time runs on to 50.5 s and the key is
            // drained under the quota still in force.
            time.set(Duration::from_millis(50_500));
            drain(&limiter)
        },
    );
    assert_eq!(quota_of(&limiter), faster);
    // Same instant, 50.5 s: the window in progress (under either quota) already gave 10.
    let again = drain(&limiter);
    assert!(
        admitted + again <= 10,
        "{}: {admitted} admitted, then {again} more at the same instant once a change that read \
         the clock earlier was stored (larger quota: 10)",
        name::<A>()
    );
}

// 10. `acquire` futures dropped at every poll while the quota changes give their permit back:
//     never more than a twin that never asked; exactly it when the change keeps the interval
//     and the period.

async fn acquire_dropped_after_polls<A: Algorithm>(polls: usize, keep_period: bool) {
    let first = quota(2, S, 2, 5 * S);
    let second = if keep_period {
        quota(2, S, 5, 3 * S)
    } else {
        quota(4, 2 * S, 3, 3 * S)
    };
    let a = direct::<A, _>(first, TokioClock::new());
    let twin = direct::<A, _>(first, TokioClock::new());
    tokio::time::advance(Duration::from_millis(100)).await;
    for _ in 0..2 {
        assert!(a.check().allowed && twin.check().allowed, "{}", name::<A>());
    }
    let mut future = Box::pin(acquire(&a, &(), 1));
    let both = [&a, &twin];
    let ready = poll_up_to(future.as_mut(), polls, |i| async move {
        tokio::time::advance(Duration::from_millis(50)).await;
        let q = if i % 2 == 0 { second } else { first };
        both.iter().for_each(|l| l.set_quota(q));
    })
    .await;
    assert!(
        ready.is_none(),
        "{}: ready after {polls} polls",
        name::<A>()
    );
    drop(future);
    let (mut got, mut twin_got) = (0, 0);
    for step in 0..12 {
        got += drain(&a);
        twin_got += drain(&twin);
        let context = format!(
            "{}: dropped after {polls} polls (keep_period {keep_period}), step {step}: {got} \
             admitted, {twin_got} by a twin that never acquired",
            name::<A>()
        );
        assert!(got <= twin_got, "more than the twin: {context}");
        if keep_period {
            assert_eq!(got, twin_got, "permit not given back: {context}");
        }
        tokio::time::advance(Duration::from_millis(400)).await;
    }
}

fn paused_acquire_dropped_at_every_poll<A: Algorithm>() {
    paused_runtime().block_on(acquire_dropped_at_every_poll::<A>());
}

async fn acquire_dropped_at_every_poll<A: Algorithm>() {
    for polls in 1..=4 {
        for keep_period in [true, false] {
            acquire_dropped_after_polls::<A>(polls, keep_period).await;
        }
    }
}

/// The `Acquire` future's `must_use` says "futures do nothing unless polled": dropped before its
/// first poll (a `select!` whose other branch was ready), it keeps no permit nobody will use.
/// Both `acquire`s below, each on a runtime of its own whose clock is paused.
fn paused_acquire_dropped_before_its_first_poll<A: Algorithm>() {
    paused_runtime().block_on(acquire_dropped_before_its_first_poll::<A>());
    paused_runtime().block_on(acquire_admitted_at_once_dropped_before_its_first_poll::<A>());
}

async fn acquire_dropped_before_its_first_poll<A: Algorithm>() {
    let q = quota(2, S, 2, 5 * S);
    let n = name::<A>();
    // A reservation: the burst is spent, then an `acquire` that would wait is dropped unpolled.
    let (a, twin) = (tokio_direct_with::<A>(q), tokio_direct_with::<A>(q));
    let (first, twin_first) = (a.check_n(2).unwrap(), twin.check_n(2).unwrap());
    assert!(first.allowed && twin_first.allowed);
    drop(a.acquire());
    // Settled to what they cost (Metered holds them until then; nothing for the others).
    assert!(settle(&a, 2, first, 2) && settle(&twin, 2, twin_first, 2));
    let (mut got, mut twin_got) = (0, 0);
    for step in 0..8 {
        tokio::time::advance(Duration::from_millis(500)).await;
        got += drain(&a);
        twin_got += drain(&twin);
        assert_eq!(
            got, twin_got,
            "{n}: an `acquire` future that would have waited, dropped before its first poll, \
             kept its reservation ({got} admitted by step {step}, {twin_got} by a twin)"
        );
    }
}

/// The same, for an `acquire` admitted at once: its caller never saw the admission.
async fn acquire_admitted_at_once_dropped_before_its_first_poll<A: Algorithm>() {
    let q = quota(2, S, 2, 5 * S);
    let n = name::<A>();
    let (a, twin) = (tokio_direct_with::<A>(q), tokio_direct_with::<A>(q));
    drop(acquire(&a, &(), 1));
    let (got, twin_got) = (drain(&a), drain(&twin));
    assert_eq!(
        got, twin_got,
        "{n}: an `acquire` future admitted at once, dropped before its first poll, kept its \
         permit ({got} admitted after, {twin_got} by a twin)"
    );
}

// 11. A decision from another limiter (direct or keyed, same quota and clock) or built by hand
//     gives nothing back; a clone's does, once.

fn foreign_decisions_give_nothing<A: Algorithm>() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(3));
    let q = quota(5, S, 5, S);
    let a = direct::<A, _>(q, clock.clone());
    let other = direct::<A, _>(q, clock.clone());
    let keyed = KeyedRateLimiter::<()>::builder(q)
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    let twin = direct::<A, _>(q, clock.clone());
    let (first_a, first_twin) = (a.check_n(5).unwrap(), twin.check_n(5).unwrap());
    assert!(first_a.allowed && first_twin.allowed, "{}", name::<A>());
    let from_other = other.check_n(3).unwrap();
    let from_keyed = keyed.check_n(&(), 3).unwrap();
    let reserved_other = reserve(&other, 2).unwrap();
    assert!(from_other.allowed && from_keyed.allowed && reserved_other.allowed);
    let n = name::<A>();
    assert!(
        !refund(&a, 3, from_other),
        "{n}: another direct limiter's decision taken back"
    );
    assert!(
        !settle(&a, 3, from_keyed, 0),
        "{n}: a keyed limiter's decision settled"
    );
    assert!(
        !refund(&a, 2, reserved_other),
        "{n}: another limiter's reservation taken back"
    );
    let by_hand = Decision::allowed(5, 5, Duration::ZERO);
    assert!(
        !refund(&a, 5, by_hand),
        "{n}: a hand-built decision taken back"
    );
    assert!(
        !settle(&a, 5, Decision::allowed(5, 5, Duration::ZERO), 0),
        "{n}"
    );
    a.set_quota(quota(7, S, 7, 0));
    twin.set_quota(quota(7, S, 7, 0));
    assert_eq!(
        drain(&a),
        drain(&twin),
        "{n}: a foreign decision gave something back"
    );
    // Settled to what they cost (Metered holds them until then; nothing for the others).
    assert!(settle(&a, 5, first_a, 5) && settle(&twin, 5, first_twin, 5));
    // A clone takes back its original's decision.
    clock.advance(Duration::from_secs(5));
    let d = a.check_n(4).unwrap();
    assert!(d.allowed);
    let left = drain(&twin);
    assert!(
        refund(&a.clone(), 4, d),
        "{n}: a clone refused its original's decision"
    );
    assert_eq!(drain(&a), left, "{n}");
}

// 12. Bad input: absurd costs, costs above capacity, huge clock values, quotas at their bounds,
//     a clock thrown from u64::MAX back to 0 across changes: errors, never a panic.

fn bad_input<A: Algorithm>() {
    let n = name::<A>();
    let extremes = [
        Quota::with_period(1, Quota::MAX_SPAN)
            .unwrap()
            .with_burst(2)
            .unwrap()
            .with_max_wait(Quota::MAX_SPAN)
            .unwrap(),
        Quota::with_period(u32::MAX, Duration::from_nanos(1))
            .unwrap()
            .with_burst(u32::MAX)
            .unwrap(),
        Quota::with_period(u32::MAX, Quota::MAX_SPAN).unwrap(),
        quota(3, 7, 1, 0),
    ];
    for start in [u64::MAX, 1 << 62, (1 << 62) + 1, 0] {
        let dial = Dial::at(start);
        let l = direct::<A, _>(extremes[0], dial.clone());
        for (round, &reading) in [u64::MAX, 0, 1 << 62, u64::MAX - 1, 5, u64::MAX]
            .iter()
            .enumerate()
        {
            dial.set(reading);
            let q = extremes[round % extremes.len()];
            l.set_quota(q);
            let cap = if is_gcra::<A>() {
                q.burst()
            } else {
                q.permits()
            };
            let context = format!("{n}: start {start}, reading {reading}, {q:?}");
            assert_eq!(
                l.check_n(cap.saturating_add(1))
                    .err()
                    .map(|e| (e.requested(), e.capacity())),
                (cap < u32::MAX).then(|| (cap + 1, cap)),
                "{context}"
            );
            let err = reserve(&l, u32::MAX).err();
            assert_eq!(err.is_some(), cap < u32::MAX, "{context}");
            let at_cap = l.check_n(cap).expect(&context);
            let waited = reserve(&l, cap).expect(&context);
            let one = l.check();
            if at_cap.allowed {
                settle(&l, u32::MAX, at_cap, u32::MAX);
            }
            if waited.allowed {
                refund(&l, u32::MAX, waited);
            }
            if one.allowed {
                settle(&l, 1, one, u32::MAX);
            }
            let _ = l.check_n(1);
            let _ = format!("{l:?}");
        }
    }
}

// 13. Panics: a clock that panics inside `set_quota`, a thread that panics holding decisions it
//     never gives back. (An algorithm whose `with_quota` panicked under the change mutex was
//     attacked here too while `Algorithm` was open to other crates; it is sealed now.)

const PLANNED: &str = "attack_direct planned panic";

thread_local! {
    static CLOCK_PANICS: Cell<bool> = const { Cell::new(false) };
}

#[derive(Clone, Default)]
struct PanickyClock(ManualClock);

impl Clock for PanickyClock {
    fn now(&self) -> u64 {
        if CLOCK_PANICS.with(Cell::get) {
            panic!("{PLANNED}: the clock");
        }
        self.0.now()
    }
}

#[test]
fn attack_panics_leave_the_limiter_whole() {
    quiet_panics_starting_with(PLANNED);
    // A clock that panics inside set_quota.
    let clock = PanickyClock::default();
    let l = direct::<Gcra, _>(quota(5, S, 5, 0), clock.clone());
    std::thread::scope(|s| {
        let l = l.clone();
        let r = s
            .spawn(move || {
                CLOCK_PANICS.with(|p| p.set(true));
                l.set_quota(quota(50, S, 50, 0));
            })
            .join();
        assert!(r.is_err());
    });
    assert_eq!(
        l.quota(),
        quota(5, S, 5, 0),
        "a change whose clock panicked was stored"
    );
    l.set_quota(quota(6, S, 6, 0));
    assert_eq!(drain(&l), 6);

    // A thread that panics holding admissions: what it took stays taken, nothing else moves.
    each_reporting_all(&five!(a_thread_panics_holding_admissions));
}

fn a_thread_panics_holding_admissions<A: Algorithm>() {
    let clock = ManualClock::new();
    let l = direct::<A, _>(quota(30, S, 30, 0), clock);
    let barrier = Barrier::new(3);
    let took = AtomicU64::new(0);
    let (panicked_took, others_took) = std::thread::scope(|s| {
        let took = &took;
        let barrier = &barrier;
        let doomed = {
            let l = l.clone();
            s.spawn(move || {
                barrier.wait();
                let mut held = Vec::new();
                for _ in 0..10 {
                    let d = l.check_n(2).unwrap();
                    if d.allowed {
                        took.fetch_add(2, Ordering::SeqCst);
                        held.push(d);
                    }
                }
                panic!("{PLANNED}: holding {} admissions", held.len());
            })
        };
        let others: Vec<_> = (0..2)
            .map(|_| {
                let l = l.clone();
                s.spawn(move || {
                    barrier.wait();
                    (0..40).filter(|_| l.check().allowed).count() as u64
                })
            })
            .collect();
        assert!(doomed.join().is_err());
        let others: u64 = others.into_iter().map(|h| h.join().unwrap()).sum();
        (took.load(Ordering::SeqCst), others)
    });
    let left = drain(&l);
    assert_eq!(panicked_took + others_took + left, 30, "{}", name::<A>());
}

// 14. A stale reading after a refusal: the algorithms that record every reading decide it as of
//     the refused one; GCRA records the readings that changed the key (the clock module's docs),
//     so it decides it as of itself: refused where a fresh one may be admitted, never admitted
//     where a fresh one is refused.

fn stale_reading_after_a_refusal<A: Algorithm>() {
    // GCRA: one permit a second, burst 3; the windows: 3 per 3 s.
    let q = quota(3, 3 * S, 3, 0);
    let (stale, fresh) = (Dial::at(0), Dial::at(0));
    let (a, b) = (
        direct::<A, _>(q, stale.clone()),
        direct::<A, _>(q, fresh.clone()),
    );
    assert_eq!(a.check_n(3).unwrap(), b.check_n(3).unwrap());
    // Read at 1.5 s: three permits do not fit yet (one has come back).
    stale.set(1_500 * MS);
    fresh.set(1_500 * MS);
    let (ra, rb) = (a.check_n(3).unwrap(), b.check_n(3).unwrap());
    assert!(!ra.allowed && !rb.allowed);
    // A thread that read 0.5 s, before the refused one, arrives now; its twin reads 1.5 s.
    stale.set(500 * MS);
    let (da, db) = (a.check(), b.check());
    assert!(
        !da.allowed || db.allowed,
        "{}: a reading older than a refused one admitted where a fresh one is refused: {da:?} \
         vs {db:?}",
        name::<A>()
    );
    if !name::<A>().ends_with("Gcra") {
        assert_eq!(
            da.allowed,
            db.allowed,
            "{}: a reading older than the latest the key saw (1.5 s, refused) admitted \
             differently from a fresh one: {da:?} vs {db:?}",
            name::<A>()
        );
    }
}

attack_tests! {
    attack_a_refund_two_windows_back_across_a_period_change_gives_back_nothing: four!(refund_two_windows_back_across_a_period_change),
    attack_a_reservation_given_back_after_the_period_grew_frees_no_slot_of_the_window_in_progress: four!(reservation_refunded_after_the_period_grew),
    attack_a_refund_whose_tat_came_back_gives_back_no_more_than_a_twin_never_asked: four!(refund_of_an_admission_whose_tat_came_back),
    attack_a_set_quota_preempted_after_reading_the_clock_admits_no_more_than_the_larger_quota: five!(preempted_set_quota),
    attack_a_keyed_set_quota_preempted_after_reading_the_clock_admits_no_more_than_the_larger_quota: five!(preempted_set_quota_keyed),
    attack_acquire_dropped_at_every_poll_while_the_quota_changes_gives_its_permit_back: five!(paused_acquire_dropped_at_every_poll),
    attack_acquire_dropped_before_its_first_poll_keeps_no_permit_nor_reservation: five!(paused_acquire_dropped_before_its_first_poll),
    attack_foreign_decisions_give_nothing_back_to_a_direct_limiter: five!(foreign_decisions_give_nothing),
    attack_bad_input_is_an_error_never_a_panic_or_overflow: five!(bad_input),
    attack_a_stale_reading_after_a_refusal_is_never_decided_more_generously: five!(stale_reading_after_a_refusal),
}
