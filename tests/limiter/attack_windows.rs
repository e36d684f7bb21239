//! Attacks on the window algorithms' give-backs after their transitions were written once
//! (`window_transitions!`): `FixedWindow`, `SlidingCounter` and `SlidingLog` through
//! `DirectRateLimiter` and `KeyedRateLimiter`, with `Limiter::refund` and `Limiter::settle`,
//! racing threads, stale readings, quota changes and costs at their bounds. Each test quotes the
//! promise it attacks (the algorithm module's table, each algorithm's docs, `Limiter::refund`,
//! `Limiter::settle`, `KeyedRateLimiter::set_quota`, and the guide's refund table).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use tower_bulwark::algorithm::{Algorithm, FixedWindow, SlidingCounter, SlidingLog};
use tower_bulwark::clock::{Clock, ManualClock};
use tower_bulwark::limiter::Decision;
use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Limiter, Quota};

use crate::attack_direct::{direct, drain, name, read_here, refund, settle, Dial};
use crate::common::{admitted_until_refused, joined};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// One `#[test]` per window algorithm for a generic function.
macro_rules! each_window {
    ($f:ident: $fw:ident, $sc:ident, $sl:ident) => {
        #[test]
        fn $fw() {
            $f::<FixedWindow>();
        }
        #[test]
        fn $sc() {
            $f::<SlidingCounter>();
        }
        #[test]
        fn $sl() {
            $f::<SlidingLog>();
        }
    };
}

fn keyed<A: Algorithm, C: Clock>(q: Quota, clock: C) -> KeyedRateLimiter<u32, A, C> {
    KeyedRateLimiter::<u32>::builder(q)
        .algorithm::<A>()
        .clock(clock)
        .build()
}

/// A direct limiter built at its clock's origin (so that windows are whole periods), the clock
/// then set to `ns`; and the clock.
fn direct_at<A: Algorithm>(q: Quota, ns: u64) -> (DirectRateLimiter<A, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let l = direct::<A, _>(q, clock.clone());
    clock.to(ns);
    (l, clock)
}

/// [`direct_at`]'s keyed limiter.
fn keyed_at<A: Algorithm>(
    q: Quota,
    ns: u64,
) -> (KeyedRateLimiter<u32, A, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let l = keyed::<A, _>(q, clock.clone());
    clock.to(ns);
    (l, clock)
}

fn drain_key<A: Algorithm, C: Clock>(l: &KeyedRateLimiter<u32, A, C>, key: u32) -> u64 {
    admitted_until_refused(|| l.check(&key).allowed)
}

fn per_second(permits: u32) -> Quota {
    Quota::per_second(permits).unwrap()
}

/// `tries` decisions of `check`; the n-th admission (n from 1) is given back at once through
/// `give_back`, which must take it back, where `back(n)` says so, and kept otherwise. How many
/// were kept.
fn take_giving_back(
    tries: u32,
    check: impl Fn() -> Decision,
    give_back: impl Fn(Decision) -> bool,
    back: impl Fn(u64) -> bool,
) -> u64 {
    let (mut admitted, mut kept) = (0u64, 0u64);
    for _ in 0..tries {
        let d = check();
        if !d.allowed {
            continue;
        }
        admitted += 1;
        if back(admitted) {
            assert!(give_back(d), "an admission of its own");
        } else {
            kept += 1;
        }
    }
    kept
}

/// `run(t)` on `threads` threads (t from 0) that start together: the sum of what they return.
fn race(threads: usize, run: impl Fn(usize) -> u64 + Send + Sync + 'static) -> u64 {
    let (run, barrier) = (Arc::new(run), Arc::new(Barrier::new(threads)));
    let handles = (0..threads)
        .map(|t| {
            let (run, barrier) = (run.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                run(t)
            })
        })
        .collect();
    joined(handles).into_iter().sum()
}

/// What racing threads kept and what is left add up to exactly `limit`.
fn assert_kept_and_left_are(kept: u64, left: u64, limit: u32, what: &str) {
    assert_eq!(
        kept + left,
        u64::from(limit),
        "{what}: {kept} kept, {left} left"
    );
}

/// A clock the twins below move to an instant (nanoseconds since its origin).
trait Dialed: Clock + Clone {
    fn to(&self, ns: u64);
}

impl Dialed for Dial {
    fn to(&self, ns: u64) {
        self.set(ns);
    }
}

impl Dialed for ManualClock {
    fn to(&self, ns: u64) {
        self.set(Duration::from_nanos(ns));
    }
}

/// A direct limiter and its twin, each on a clock of its own moved with the other's: the twin
/// makes the same decisions but for the admissions the other gives back.
struct Twins<A: Algorithm, C: Clock> {
    mine: DirectRateLimiter<A, C>,
    twin: DirectRateLimiter<A, C>,
    clocks: [C; 2],
}

impl<A: Algorithm, C: Dialed> Twins<A, C> {
    fn new(q: Quota, clock: impl Fn() -> C) -> Self {
        let clocks = [clock(), clock()];
        Self {
            mine: direct::<A, _>(q, clocks[0].clone()),
            twin: direct::<A, _>(q, clocks[1].clone()),
            clocks,
        }
    }

    /// Both clocks at `ns`.
    fn at(&self, ns: u64) {
        for clock in &self.clocks {
            clock.to(ns);
        }
    }

    /// `n` permits taken by both, each admitted.
    fn both_take(&self, n: u32) {
        for _ in 0..n {
            assert!(self.mine.check().allowed);
            assert!(self.twin.check().allowed);
        }
    }

    /// At `at`, `before` permits taken by both, then one by mine alone, admitted: its decision,
    /// to give back.
    fn mine_takes_one_more(&self, at: u64, before: u32) -> Decision {
        self.at(at);
        self.both_take(before);
        let d = self.mine.check();
        assert!(d.allowed);
        d
    }

    /// What each has left now, taking it: (mine, the twin's).
    fn drains(&self) -> (u64, u64) {
        (drain(&self.mine), drain(&self.twin))
    }

    /// Both have exactly as much left now (taking it); `what` says where not.
    fn assert_as_much_left(&self, what: std::fmt::Arguments) {
        let (mine, theirs) = self.drains();
        assert_eq!(mine, theirs, "{}: {what}", name::<A>());
    }
}

// ---------------------------------------------------------------------------------------------
// Racing threads with refunds interleaved.

/// The guide's table: fixed window "exact for the last permits taken: every immediate admission
/// while no reservation is outstanding"; sliding log "exact, past or future: the entry is
/// removed"; sliding counter "exact: the count of the window holding the charge shrinks"; and
/// "N threads racing for L get exactly L": threads racing at one instant, each giving back every
/// other admission at once, keep exactly L between them and what is left.
fn racing_threads_with_interleaved_refunds_keep_exactly_the_limit<A: Algorithm>() {
    const L: u32 = 200;
    const THREADS: usize = 8;
    for keyed_limiter in [false, true] {
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(10 * S + 250 * MS));
        let direct_l = Arc::new(direct::<A, _>(per_second(L), clock.clone()));
        let keyed_l = Arc::new(keyed::<A, _>(per_second(L), clock.clone()));
        let kept = {
            let (direct_l, keyed_l) = (direct_l.clone(), keyed_l.clone());
            race(THREADS, move |t| {
                let back = |admitted: u64| (admitted + t as u64) % 2 == 0;
                if keyed_limiter {
                    let give_back = |d| Limiter::refund(&*keyed_l, &7, 1, d);
                    take_giving_back(L, || keyed_l.check(&7), give_back, back)
                } else {
                    take_giving_back(L, || direct_l.check(), |d| refund(&direct_l, 1, d), back)
                }
            })
        };
        let left = if keyed_limiter {
            drain_key(&keyed_l, 7)
        } else {
            drain(&direct_l)
        };
        let what = format!("{} (keyed: {keyed_limiter})", name::<A>());
        assert_kept_and_left_are(kept, left, L, &what);
    }
}

each_window!(racing_threads_with_interleaved_refunds_keep_exactly_the_limit:
    racing_refunds_fixed_window, racing_refunds_sliding_counter, racing_refunds_sliding_log);

/// The algorithm module: "each algorithm decides a reading older than the latest its key has
/// seen as of that latest reading", with the refund rows of the guide: threads that each read
/// their own instant of one window (arriving out of order) race for L, giving back every other
/// admission; exactly L are kept between them and what is left at the latest reading.
fn racing_threads_with_their_own_readings_and_refunds_keep_exactly_the_limit<A: Algorithm>() {
    const L: u32 = 120;
    const THREADS: u64 = 6;
    let base = 20 * S;
    let dial = Dial::at(0);
    let l = Arc::new(keyed::<A, _>(per_second(L), dial.clone()));
    dial.set(base);
    // The key is first seen at the window's start.
    let first = l.check(&1);
    assert!(first.allowed);
    assert!(Limiter::refund(&*l, &1, 1, first));
    let kept = {
        let l = l.clone();
        race(THREADS as usize, move |t| {
            // Thread t reads 0, 150, 300, ... ms into the window; later threads' readings are
            // stale to the earlier ones' once a later one has been seen.
            read_here(Some(base + (THREADS - 1 - t as u64) * 150 * MS));
            let give_back = |d| Limiter::refund(&*l, &1, 1, d);
            let kept = take_giving_back(L, || l.check(&1), give_back, |n| n % 2 == 0);
            read_here(None);
            kept
        })
    };
    dial.set(base + (THREADS - 1) * 150 * MS);
    assert_kept_and_left_are(kept, drain_key(&l, 1), L, name::<A>());
}

each_window!(racing_threads_with_their_own_readings_and_refunds_keep_exactly_the_limit:
    stale_racing_refunds_fixed_window, stale_racing_refunds_sliding_counter,
    stale_racing_refunds_sliding_log);

// ---------------------------------------------------------------------------------------------
// Stale and out-of-order readings at a give-back.

/// The guide's refund table: the fixed window gives back "exact for the last permits taken";
/// the sliding log "exact, past or future"; the sliding counter "exact: the count of the window
/// holding the charge shrinks (previous, current or next)"; and each algorithm's "A clock
/// reading older than the latest one the key has seen is decided as of that latest reading":
/// an admission given back by a thread whose reading is stale (from the window before) leaves
/// the key exactly as a twin that never made it.
fn a_give_back_at_a_stale_reading_is_exact<A: Algorithm>() {
    const L: u32 = 10;
    for taken_before in [0u32, 3, 9] {
        // Built at the clocks' origin, so that windows are whole seconds.
        let twins = Twins::<A, _>::new(per_second(L), || Dial::at(0));
        let d = twins.mine_takes_one_more(10 * S + 500 * MS, taken_before);
        // The give-back comes from a thread that read the clock a whole window earlier.
        read_here(Some(9 * S + 600 * MS));
        assert!(refund(&twins.mine, 1, d), "{}", name::<A>());
        read_here(None);
        for at in [10 * S + 500 * MS, 10 * S + 900 * MS, 11 * S + 100 * MS] {
            twins.at(at);
            twins.assert_as_much_left(format_args!("{taken_before} taken before, at {at} ns"));
        }
    }
}

each_window!(a_give_back_at_a_stale_reading_is_exact:
    stale_give_back_fixed_window, stale_give_back_sliding_counter, stale_give_back_sliding_log);

/// `Limiter::refund`: "No more than the decision took is ever given back", and the guide: "An
/// admission charged in a past that no longer weighs on the key (a fixed window's ended cycle, a
/// sliding log entry older than the window) is spent: there is nothing to give back"; the
/// sliding counter's "the count of the window holding the charge shrinks (previous [...])": an
/// admission made late in one window and given back in the next leaves the key as a twin that
/// never made it, never better off.
fn a_give_back_from_the_window_before_is_never_more_than_it_weighs<A: Algorithm>() {
    const L: u32 = 10;
    for taken_before in [0u32, 4, 9] {
        for back_at in [
            10 * S + MS,
            10 * S + 500 * MS,
            10 * S + 999 * MS,
            11 * S + MS,
        ] {
            let twins = Twins::<A, _>::new(per_second(L), ManualClock::new);
            let d = twins.mine_takes_one_more(9 * S + 900 * MS, taken_before);
            twins.at(back_at);
            // Someone else takes one in the new window first (where the window still has
            // room for it with the admission to give back in it).
            if taken_before < 9 {
                twins.both_take(1);
            }
            assert!(refund(&twins.mine, 1, d));
            twins.assert_as_much_left(format_args!(
                "{taken_before} taken at 9.9 s, given back at {back_at} ns"
            ));
        }
    }
}

each_window!(a_give_back_from_the_window_before_is_never_more_than_it_weighs:
    window_before_fixed_window, window_before_sliding_counter, window_before_sliding_log);

// ---------------------------------------------------------------------------------------------
// Costs at their bounds.

/// `Limiter::refund`: "No more than the decision took is ever given back, whatever cost says";
/// `Limiter::settle`: "The crate's limiters take the estimate from the decision where it is
/// smaller than estimate, so that a settle never gives back what was not taken": a decision of
/// one permit given back as `u32::MAX`, or settled from an estimate of `u32::MAX` to zero, frees
/// exactly one permit.
fn give_backs_of_more_than_was_taken_free_only_what_was<A: Algorithm>() {
    const L: u32 = 10;
    for how in 0..4 {
        let (l, _) = direct_at::<A>(per_second(L), 5 * S + 100 * MS);
        let mut decisions: Vec<Decision> = (0..L).map(|_| l.check()).collect();
        assert!(decisions.iter().all(|d| d.allowed));
        let d = decisions.pop().unwrap();
        let taken = match how {
            0 => refund(&l, u32::MAX, d),
            1 => refund(&l, L + 1, d),
            2 => settle(&l, u32::MAX, d, 0),
            _ => settle(&l, L, d, 0),
        };
        assert!(taken, "{} way {how}", name::<A>());
        assert_eq!(drain(&l), 1, "{} way {how}", name::<A>());
    }
}

each_window!(give_backs_of_more_than_was_taken_free_only_what_was:
    over_refund_fixed_window, over_refund_sliding_counter, over_refund_sliding_log);

/// `Limiter::settle`: "A cost above the most one request can take (InsufficientCapacity's
/// capacity) is charged as that most", and "A charge is never refused: beyond what the key has
/// left it is debt, which its next requests wait for as they would for permits it used": a
/// settle of three permits to `u32::MAX` is charged as the capacity (L), so the key is spent
/// now and, two windows later, has its whole limit again.
fn a_settle_to_u32_max_is_charged_as_the_capacity<A: Algorithm>() {
    const L: u32 = 10;
    let (l, clock) = direct_at::<A>(per_second(L), 3 * S + 200 * MS);
    assert_eq!(
        l.check_n(u32::MAX).unwrap_err().capacity(),
        L,
        "{}",
        name::<A>()
    );
    let d = l.check_n(3).unwrap();
    assert!(d.allowed);
    assert!(settle(&l, 3, d, u32::MAX), "{}", name::<A>());
    assert_eq!(drain(&l), 0, "{}: spent after the charge", name::<A>());
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        drain(&l),
        u64::from(L),
        "{}: two windows after a charge of the capacity",
        name::<A>()
    );
}

each_window!(a_settle_to_u32_max_is_charged_as_the_capacity:
    settle_max_fixed_window, settle_max_sliding_counter, settle_max_sliding_log);

/// `Quota::with_burst`: "The window algorithms admit permits per window and ignore the burst",
/// and `check_n`: "InsufficientCapacity if cost is more than the quota can ever admit at
/// once": with a burst far above the permits, a cost of L is admitted, L + 1 and `u32::MAX` are
/// refused with a capacity of L, and a cost of L given back frees all L.
fn costs_at_the_bounds_ignore_the_burst<A: Algorithm>() {
    const L: u32 = 7;
    let (l, clock) = direct_at::<A>(per_second(L).with_burst(1_000).unwrap(), S);
    for cost in [L + 1, u32::MAX] {
        let err = l.check_n(cost).unwrap_err();
        assert_eq!(err.capacity(), L, "{} cost {cost}", name::<A>());
    }
    let d = l.check_n(L).unwrap();
    assert!(d.allowed, "{}", name::<A>());
    assert_eq!(d.remaining, 0, "{}", name::<A>());
    assert!(!l.check().allowed, "{}", name::<A>());
    assert!(refund(&l, L, d));
    assert_eq!(drain(&l), u64::from(L), "{}", name::<A>());
    // Two windows on, a cost of one more than is left is refused and takes nothing.
    clock.advance(Duration::from_secs(2));
    let d = l.check_n(L - 1).unwrap();
    assert!(d.allowed);
    let refused = l.check_n(2).unwrap();
    assert!(!refused.allowed, "{}", name::<A>());
    assert!(!refund(&l, 2, refused), "a refusal is not taken back");
    assert_eq!(drain(&l), 1, "{}", name::<A>());
    assert!(refund(&l, L - 1, d));
}

each_window!(costs_at_the_bounds_ignore_the_burst:
    bounds_fixed_window, bounds_sliding_counter, bounds_sliding_log);

// ---------------------------------------------------------------------------------------------
// Quota changes between a decision and its give-back.

/// `KeyedRateLimiter::set_quota`: "What a key has used stays used [...] A refund of such a
/// decision is made with the new algorithm, by the same rules as any other", the guide (fixed
/// window: "after a change of period, only what the change's window kept comes back"; sliding
/// counter: "after a change of period, only in a window the change kept") and `Limiter::refund`:
/// "No more than the decision took is ever given back [...] whatever set_quota changed since":
/// immediate admissions given back after a change of the limit alone (same period) come back
/// whole, so the key then has exactly the new limit; never more.
fn give_backs_after_a_change_of_the_limit_come_back_whole<A: Algorithm>() {
    for (old, new) in [(10u32, 20u32), (10, 4), (10, 10), (1, 1_000)] {
        let (l, _) = keyed_at::<A>(per_second(old), 4 * S + 300 * MS);
        let taken: Vec<Decision> = (0..old).map(|_| l.check(&3)).collect();
        assert!(taken.iter().all(|d| d.allowed));
        l.set_quota(per_second(new));
        for d in taken {
            assert!(Limiter::refund(&l, &3, 1, d), "{}", name::<A>());
        }
        let what = format!(
            "{}: {old} taken, quota now {new}, all given back",
            name::<A>()
        );
        assert_eq!(drain_key(&l, 3), u64::from(new), "{what}");
    }
}

each_window!(give_backs_after_a_change_of_the_limit_come_back_whole:
    limit_change_fixed_window, limit_change_sliding_counter, limit_change_sliding_log);

/// `KeyedRateLimiter::set_quota`: "A decision made while the change is under way uses the old
/// pair or the new one; once this returns, every decision uses the new one [...] A refund of such
/// a decision is made with the new algorithm, by the same rules as any other" and the guide's
/// exact refunds: threads racing at one instant with interleaved refunds, while another thread
/// sets the same quota again and again, keep exactly L between them and what is left.
fn racing_refunds_through_quota_changes_to_the_same_quota<A: Algorithm>() {
    const L: u32 = 150;
    const THREADS: usize = 6;
    let l = Arc::new(keyed_at::<A>(per_second(L), 7 * S + 100 * MS).0);
    let done = Arc::new(AtomicBool::new(false));
    // The race starts once the changer has made its first change, so that it runs beside the
    // racers however the machine schedules its threads.
    let (changing, first_change) = std::sync::mpsc::channel();
    let changer = {
        let (l, done) = (l.clone(), done.clone());
        std::thread::spawn(move || {
            l.set_quota(per_second(L));
            changing.send(()).unwrap();
            while !done.load(Ordering::SeqCst) {
                l.set_quota(per_second(L));
                std::thread::yield_now();
            }
        })
    };
    first_change.recv().unwrap();
    let kept = {
        let l = l.clone();
        race(THREADS, move |_| {
            // Each decision is followed by a yield, to let the changer in between.
            let check = || {
                let d = l.check(&9);
                std::thread::yield_now();
                d
            };
            take_giving_back(L, check, |d| Limiter::refund(&*l, &9, 1, d), |n| n % 3 == 0)
        })
    };
    done.store(true, Ordering::SeqCst);
    changer.join().unwrap();
    assert_kept_and_left_are(kept, drain_key(&l, 9), L, name::<A>());
}

each_window!(racing_refunds_through_quota_changes_to_the_same_quota:
    same_quota_racing_fixed_window, same_quota_racing_sliding_counter,
    same_quota_racing_sliding_log);

/// `Limiter::refund`: "No more than the decision took is ever given back, whatever cost says,
/// and whatever set_quota changed since": admissions taken under a long period, given back
/// after the period shrank and the clock moved on, never leave the key with more than a twin
/// that never made them.
fn give_backs_after_the_period_shrank_never_over_grant<A: Algorithm>() {
    for later in [0u64, 100 * MS, 999 * MS, 3 * S] {
        let long = Quota::with_period(10, Duration::from_secs(10)).unwrap();
        let short = Quota::with_period(10, Duration::from_secs(1)).unwrap();
        let twins = Twins::<A, _>::new(long, ManualClock::new);
        twins.at(20 * S + 500 * MS);
        twins.both_take(4);
        let given: Vec<Decision> = (0..6).map(|_| twins.mine.check()).collect();
        assert!(given.iter().all(|d| d.allowed));
        twins.mine.set_quota(short);
        twins.twin.set_quota(short);
        twins.at(20 * S + 500 * MS + later);
        for d in given {
            refund(&twins.mine, 1, d);
        }
        let (mine, theirs) = twins.drains();
        assert!(
            mine <= theirs,
            "{}: {later} ns after the change, {mine} left against the twin's {theirs}",
            name::<A>()
        );
    }
}

each_window!(give_backs_after_the_period_shrank_never_over_grant:
    shrunk_period_fixed_window, shrunk_period_sliding_counter, shrunk_period_sliding_log);
