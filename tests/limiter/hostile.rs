//! The in-memory limiters under hostile conditions: stale and out-of-order clock readings,
//! requests vetoed by another policy, refunds racing later reservations, key floods, clocks near
//! their end and absurd periods. Each test names the promise it holds.
//!
//! Time is injected: a [`ManualClock`] where time only moves forward, and a [`ScriptedClock`]
//! whose reading each thread chooses, to reproduce a thread that read the clock and then lost the
//! race to one that read it later. No test sleeps.

use crate::attack_direct::name;
use crate::common::for_every_algorithm;
use crate::common::manual_clock_at;
use crate::common::waits_up_to;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use tower_bulwark::{
    algorithm::{Algorithm, Gcra, SlidingCounter, SlidingLog},
    clock::{Clock, ManualClock},
    limiter::{Decision, Overflow},
    DirectRateLimiter, KeyedRateLimiter, Limiter, Quota,
};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

thread_local! {
    static READING: Cell<u64> = const { Cell::new(0) };
}

/// A clock whose reading is whatever the calling thread last set: a stale or out-of-order
/// reading on demand.
#[derive(Clone, Copy, Debug, Default)]
struct ScriptedClock;

impl ScriptedClock {
    fn set(nanos: u64) {
        READING.with(|r| r.set(nanos));
    }
}

impl Clock for ScriptedClock {
    fn now(&self) -> u64 {
        READING.with(Cell::get)
    }
}

fn keyed<A: Algorithm, C: Clock>(quota: Quota, clock: C) -> KeyedRateLimiter<u64, A, C> {
    KeyedRateLimiter::<u64>::builder(quota)
        .algorithm::<A>()
        .clock(clock)
        .build()
}

fn decide<L: Limiter<u64>>(limiter: &L, key: u64, cost: u32) -> Decision {
    limiter.reserve_now(&key, cost).unwrap().unwrap()
}

// ---- item 5: a refused request still spent window permits ----

/// 5/min on a window algorithm plus 1/s on GCRA, four requests a second for five seconds, each
/// admitted only if both policies admit, the other one's admission given back otherwise (as the
/// HTTP layer does). The window must be left exactly as it was by every vetoed request: five
/// admitted, one a second (main admitted 2 and locked the client out for the minute).
#[test]
fn a_request_vetoed_by_another_policy_spends_nothing() {
    fn run<A: Algorithm>() {
        let clock = ManualClock::new();
        let window = keyed::<A, _>(Quota::per_minute(5).unwrap(), clock.clone());
        let gcra = keyed::<Gcra, _>(Quota::per_second(1).unwrap(), clock.clone());
        let mut admitted = 0;
        for _ in 0..20 {
            let w = decide(&window, 0, 1);
            let g = decide(&gcra, 0, 1);
            match (w.allowed, g.allowed) {
                (true, true) => admitted += 1,
                (true, false) => assert!(window.refund(&0, 1, w)),
                (false, true) => assert!(gcra.refund(&0, 1, g)),
                (false, false) => {}
            }
            clock.advance(Duration::from_millis(250));
        }
        assert_eq!(admitted, 5, "{}", name::<A>());
        // And the window has nothing left for the rest of the minute.
        assert!(!decide(&window, 0, 1).allowed, "{}", name::<A>());
    }
    for_every_algorithm!(run);
}

/// A veto given back later than the decision, the key's latest admission (GCRA gives back only
/// that one; see the GCRA refund tests below), leaves the key exactly as a twin that never saw
/// the request: as many admissions follow.
#[test]
fn a_veto_given_back_later_leaves_the_key_as_if_never_made() {
    fn run<A: Algorithm>() {
        let quota = Quota::per_minute(3).unwrap();
        let (clock, twin_clock) = (ManualClock::new(), ManualClock::new());
        let limiter = keyed::<A, _>(quota, clock.clone());
        let twin = keyed::<A, _>(quota, twin_clock.clone());
        assert!(decide(&limiter, 1, 1).allowed);
        let vetoed = decide(&limiter, 1, 1);
        assert!(vetoed.allowed);
        assert!(decide(&twin, 1, 1).allowed);
        for c in [&clock, &twin_clock] {
            c.advance(Duration::from_secs(20));
        }
        // Its own admission, for its key: taken back (`true`), whatever comes back of it.
        assert!(limiter.refund(&1, 1, vetoed), "{}", name::<A>());
        let after = |l: &KeyedRateLimiter<u64, A, ManualClock>| -> Vec<Decision> {
            (0..5).map(|_| decide(l, 1, 1)).collect()
        };
        assert_eq!(after(&limiter), after(&twin), "{}", name::<A>());
    }
    for_every_algorithm!(run);
}

// ---- a GCRA refund gave back a slot that a later admission held ----

/// One permit a second, burst 1, waits up to 10 s, on a manual clock.
fn one_a_second(clock: &ManualClock) -> KeyedRateLimiter<u64, Gcra, ManualClock> {
    let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(10));
    keyed::<Gcra, _>(quota, clock.clone())
}

/// All at 0: a permit used; A reserves (due 1 s), B reserves (due 2 s); A leaves. A refund
/// that moved the TAT back from 3 s to 2 s gave the next caller B's slot at 2 s: two permits
/// due at one instant with a burst of one, while A's slot at 1 s went unused. A's permits stay
/// spent (B holds the slots after it); the latest reservation's refund is exact.
#[test]
fn a_gcra_refund_never_hands_out_a_slot_a_later_reservation_holds() {
    let clock = ManualClock::new();
    let limiter = one_a_second(&clock);
    assert!(decide(&limiter, 1, 1).allowed);
    let a = decide(&limiter, 1, 1);
    let b = decide(&limiter, 1, 1);
    assert_eq!(
        (a.wait, b.wait),
        (Duration::from_secs(1), Duration::from_secs(2))
    );
    limiter.refund(&1, 1, a);
    let c = decide(&limiter, 1, 1);
    assert!(c.allowed);
    assert_eq!(c.wait, Duration::from_secs(3), "not B's slot at 2 s");
    // C is the latest: its refund is exact, and the next caller takes its slot.
    limiter.refund(&1, 1, c);
    assert_eq!(decide(&limiter, 1, 1).wait, Duration::from_secs(3));
}

/// The same with a vetoed immediate admission given back after a later reservation: a permit
/// used at 0 and a reservation at 0.5 s (due 1 s); the first is given back. Moving the TAT back
/// by the half second still ahead gave the next caller a slot at 1.5 s, half a second after the
/// reservation's with a burst of one.
#[test]
fn a_vetoed_gcra_admission_behind_a_later_reservation_stays_spent() {
    let clock = ManualClock::new();
    let limiter = one_a_second(&clock);
    let first = decide(&limiter, 1, 1);
    clock.set(Duration::from_millis(500));
    let later = decide(&limiter, 1, 1);
    assert_eq!(later.wait, Duration::from_millis(500));
    limiter.refund(&1, 1, first);
    let next = decide(&limiter, 1, 1);
    assert_eq!(
        next.wait,
        Duration::from_millis(1500),
        "due at 2 s, a second after the reservation due at 1 s"
    );
}

/// Burst 1: A admitted at 0 (TAT 1 s), B admitted at 1 s (TAT 2 s), then A's veto is given back
/// at 1 s. A's slot has passed and B holds the next one: nothing goes back, and a third caller
/// at 1 s is refused (it would be admitted beside B if the TAT went back to 1 s). In sequence
/// the old refund kept back the time elapsed and gave nothing either; racing B (the loom model
/// `gcra_refund_of_an_admission_racing_a_newer_clock_read`) it read the key's clock before B
/// moved it and gave back B's slot.
#[test]
fn a_late_gcra_refund_never_frees_a_later_admissions_slot() {
    let clock = ManualClock::new();
    let limiter = one_a_second(&clock);
    let a = decide(&limiter, 1, 1);
    assert!(a.allowed && a.wait.is_zero());
    clock.set(Duration::from_secs(1));
    let b = decide(&limiter, 1, 1);
    assert!(b.allowed && b.wait.is_zero());
    limiter.refund(&1, 1, a);
    let c = decide(&limiter, 1, 1);
    assert_eq!(c.wait, Duration::from_secs(1), "{c:?}");
    // And without waiting: refused, retry in a second.
    let clock = ManualClock::new();
    let limiter = keyed::<Gcra, _>(Quota::per_second(1).unwrap(), clock.clone());
    let a = decide(&limiter, 1, 1);
    clock.set(Duration::from_secs(1));
    assert!(decide(&limiter, 1, 1).allowed);
    limiter.refund(&1, 1, a);
    let c = decide(&limiter, 1, 1);
    assert!(!c.allowed, "{c:?}");
    assert_eq!(c.retry_after, Duration::from_secs(1));
}

// ---- items 6 and 9: clock readings older than the state ----

/// Item 6: the sliding counter's `now - start` underflowed (a panic in debug builds) when a
/// thread read the clock before another rolled the window; every algorithm must decide a stale
/// reading as of the latest reading its state has seen, never panic and never drop weight.
#[test]
fn a_reading_older_than_the_state_is_decided_as_of_the_latest() {
    fn run<A: Algorithm>() {
        ScriptedClock::set(0);
        let limiter = keyed::<A, _>(Quota::per_second(4).unwrap(), ScriptedClock);
        ScriptedClock::set(S + 200 * MS);
        let fresh: Vec<Decision> = (0..2).map(|_| decide(&limiter, 7, 1)).collect();
        assert!(fresh.iter().all(|d| d.allowed));
        // A thread that read the clock 300 ms earlier, in the previous window, decides now.
        ScriptedClock::set(S - 100 * MS);
        let stale: Vec<Decision> = (0..4).map(|_| decide(&limiter, 7, 1)).collect();
        // A twin that saw only fresh readings.
        ScriptedClock::set(0);
        let twin = keyed::<A, _>(Quota::per_second(4).unwrap(), ScriptedClock);
        ScriptedClock::set(S + 200 * MS);
        for _ in 0..2 {
            decide(&twin, 7, 1);
        }
        let fresh_twin: Vec<Decision> = (0..4).map(|_| decide(&twin, 7, 1)).collect();
        assert_eq!(stale, fresh_twin, "{}", name::<A>());
    }
    for_every_algorithm!(run);
}

/// GCRA with out-of-order readings admitted fewer than its burst: the first admission at 1 ms
/// set the TAT from 1 ms, and readings of 0 ms then fell short of it by 1 ms.
#[test]
fn stale_readings_get_exactly_the_limit() {
    fn run<A: Algorithm>() {
        ScriptedClock::set(0);
        let limiter = keyed::<A, _>(Quota::per_minute(5).unwrap(), ScriptedClock);
        ScriptedClock::set(S + MS);
        assert!(decide(&limiter, 1, 1).allowed);
        ScriptedClock::set(S);
        let admitted = 1 + (0..20).filter(|_| decide(&limiter, 1, 1).allowed).count();
        assert_eq!(admitted, 5, "{}", name::<A>());
    }
    for_every_algorithm!(run);
}

/// Item 9, reproduced deterministically with a per-thread clock: 10/s, five admitted at 0 s and
/// five at 0.5 s; a thread reading 1.0 s prunes the first five and takes one; a thread that read
/// 0.9 s before it decides after it. Recorded at 0.9 s, its admission made eleven in the window
/// (−0.1 s, 0.9 s], and at 1.95 s nine more were admitted where eight fit.
#[test]
fn sliding_log_never_admits_over_the_limit_with_a_stale_reading() {
    ScriptedClock::set(0);
    let limiter = keyed::<SlidingLog, _>(Quota::per_second(10).unwrap(), ScriptedClock);
    let at = |t: u64, n: usize| {
        ScriptedClock::set(t);
        (0..n).filter(|_| decide(&limiter, 1, 1).allowed).count()
    };
    assert_eq!(at(0, 5), 5);
    assert_eq!(at(S / 2, 5), 5);
    assert_eq!(at(S, 1), 1);
    assert_eq!(at(S - S / 10, 1), 1, "decided as of 1.0 s, where it fits");
    // The window (0.95 s, 1.95 s] holds the two admitted at 1.0 s: eight more fit, not nine.
    assert_eq!(at(S + 95 * S / 100, 20), 8);
}

// ---- item 7: the sliding counter refused steady traffic below the quota ----

/// 1/h at 90 % of the rate refused 13 of 30 (Retry-After 7200); 2/h refused 21 of 50.
#[test]
fn sliding_counter_admits_steady_traffic_below_the_rate_for_small_limits() {
    for (permits, requests) in [(1u32, 30u64), (2, 50)] {
        let clock = ManualClock::new();
        let limiter = DirectRateLimiter::builder(Quota::per_hour(permits).unwrap())
            .algorithm::<SlidingCounter>()
            .clock(clock.clone())
            .build();
        // Evenly spaced at 90 % of the rate.
        let spacing = 3600 * S / u64::from(permits) * 10 / 9;
        let refused: Vec<Decision> = (0..requests)
            .filter_map(|i| {
                clock.set(Duration::from_nanos(i * spacing));
                let d = limiter.check();
                (!d.allowed).then_some(d)
            })
            .collect();
        assert!(refused.is_empty(), "{permits}/h: {refused:?}");
    }
}

// ---- item 8: a refunded sliding-log reservation's slot could not be reused ----

/// 2/s, `max_wait` 10 s; two admitted at 0, four callers at 0 wait 1, 1, 2 and 2 s. The first
/// waiter gives its reservation back: the next caller takes the free slot at 1 s, not one at 3 s.
#[test]
fn sliding_log_reuses_a_refunded_reservation_slot() {
    let quota = waits_up_to(Quota::per_second(2).unwrap(), Duration::from_secs(10));
    let limiter = keyed::<SlidingLog, _>(quota, ManualClock::new());
    assert!(decide(&limiter, 1, 1).allowed);
    assert!(decide(&limiter, 1, 1).allowed);
    let mut waits: Vec<Option<Decision>> = (0..4).map(|_| Some(decide(&limiter, 1, 1))).collect();
    let secs: Vec<u64> = waits.iter().flatten().map(|d| d.wait.as_secs()).collect();
    assert_eq!(secs, [1, 1, 2, 2]);
    limiter.refund(&1, 1, waits[0].take().unwrap());
    assert_eq!(decide(&limiter, 1, 1).wait, Duration::from_secs(1));
    assert_eq!(decide(&limiter, 1, 1).wait, Duration::from_secs(3));
    // A hole before later reservations is used, and only while every window around it has room.
    limiter.refund(&1, 1, waits[2].take().unwrap());
    assert_eq!(decide(&limiter, 1, 1).wait, Duration::from_secs(2));
}

// ---- items 10 and 11: absurd periods and clocks ----

/// A clock near `u64::MAX` ns made fixed window and sliding log admit everything and GCRA panic.
/// Readings beyond 2^62 ns are taken as 2^62 ns: time stands still, every limit keeps holding.
#[test]
fn a_clock_near_u64_max_never_wraps_admits_everything_or_panics() {
    fn run<A: Algorithm>() {
        for built_near_max in [false, true] {
            let clock = ManualClock::new();
            if built_near_max {
                clock.set(Duration::from_nanos(u64::MAX - 5 * S));
            }
            let quota = waits_up_to(Quota::per_minute(5).unwrap(), Duration::from_secs(30));
            let limiter = keyed::<A, _>(quota, clock.clone());
            clock.set(Duration::from_nanos(u64::MAX - 3 * S));
            let mut admitted = 0;
            for _ in 0..200 {
                let d = decide(&limiter, 1, 1);
                if d.allowed {
                    admitted += 1;
                    limiter.refund(&1, 1, d);
                    let again = decide(&limiter, 1, 1);
                    assert!(
                        again.allowed,
                        "{}: a refund gives the permit back",
                        name::<A>()
                    );
                }
                clock.advance(Duration::from_millis(100));
            }
            assert!(admitted <= 10, "{}: admitted {admitted}", name::<A>());
            assert!(admitted >= 5, "{}: admitted {admitted}", name::<A>());
            assert!(!decide(&limiter, 1, 1).allowed, "{}", name::<A>());
        }
    }
    for_every_algorithm!(run);
}

/// Item 10: `Quota::with_period(1, u64::MAX ns)` panicked in debug at the first GCRA check and
/// admitted 40 of 40 in release. It is refused now; the longest period accepted computes
/// exactly in every algorithm.
#[test]
fn absurd_periods_are_refused_and_the_longest_accepted_is_exact() {
    let err = Quota::with_period(1, Duration::from_nanos(u64::MAX)).unwrap_err();
    assert_eq!(err.field(), "period");
    assert!(err.to_string().contains("2^60"), "{err}");
    fn run<A: Algorithm>() {
        let clock = manual_clock_at(Duration::from_secs(1_000_000));
        let quota = waits_up_to(
            Quota::with_period(2, Quota::MAX_SPAN).unwrap(),
            Quota::MAX_SPAN,
        );
        let limiter = keyed::<A, _>(quota, clock.clone());
        let waits: Vec<Duration> = (0..40)
            .map(|_| decide(&limiter, 1, 1))
            .filter(|d| d.allowed)
            .map(|d| d.wait)
            .collect();
        let refused = decide(&limiter, 1, 1);
        assert!(!refused.allowed);
        // Two at once, then as each algorithm lays out the next period (`P`, 2^60 ns), waiting
        // up to `P`: GCRA one every P/2 (its emission interval); the fixed window and the
        // sliding log the next period's two at `P`; the sliding counter none (its next permit
        // comes 1 ns into the next window, past `max_wait`). Its retry is the wait it would
        // need; every key is whole again two periods on.
        let p = Quota::MAX_SPAN;
        let zero = Duration::ZERO;
        let (want_waits, want_retry) = match name::<A>() {
            "Gcra" => (vec![zero, zero, p / 2, p], p * 3 / 2),
            "FixedWindow" | "SlidingLog" => (vec![zero, zero, p, p], p * 2),
            _ => (vec![zero, zero], p + Duration::from_nanos(1)),
        };
        assert_eq!(waits, want_waits, "{}", name::<A>());
        assert_eq!(
            (refused.retry_after, refused.reset_after),
            (want_retry, p * 2),
            "{}",
            name::<A>()
        );
    }
    for_every_algorithm!(run);
}

// ---- item 4: a key flood evicted the clients being limited ----

/// 20 clients use their whole 10/min, then 100 × `max_keys` fresh keys of one request each
/// arrive within the same minute. All 20 stay limited; the store never holds more than
/// `max_keys`.
#[test]
fn a_key_flood_never_hands_a_limited_client_a_fresh_quota() {
    fn run<A: Algorithm>() {
        for overflow in [Overflow::EvictNearestIdle, Overflow::RefuseNewKeys] {
            let clock = ManualClock::new();
            let max_keys = 1_000;
            let limiter = KeyedRateLimiter::<u64>::builder(Quota::per_minute(10).unwrap())
                .algorithm::<A>()
                .clock(clock.clone())
                .max_keys(max_keys)
                .overflow(overflow)
                .build();
            let heavy = 0..20u64;
            for key in heavy.clone() {
                let admitted = (0..10).filter(|_| limiter.check(&key).allowed).count();
                assert_eq!(admitted, 10);
            }
            for key in 1_000_000..1_000_000 + 100 * max_keys as u64 {
                limiter.check(&key);
                assert!(limiter.len() <= max_keys);
                if key % 2_000 == 0 {
                    clock.advance(Duration::from_millis(100));
                }
            }
            assert!(clock.elapsed() < Duration::from_secs(60));
            let limited = heavy.filter(|key| !limiter.check(key).allowed).count();
            assert_eq!(limited, 20, "{} {overflow:?}", name::<A>());
        }
    }
    for_every_algorithm!(run);
}

// ---- concurrency: OS threads released together, readings stale and out of order ----

/// `threads` readings drawn in turn from a manual clock at 1 s that moves 1 µs between draws,
/// handed out in a permuted order that changes with `round`.
fn permuted_readings(threads: u64, round: u64) -> Vec<u64> {
    let manual = ManualClock::new();
    manual.set(Duration::from_secs(1));
    let mut readings = vec![0; threads as usize];
    for i in 0..threads {
        readings[((i * 7 + round) % threads) as usize] = manual.now();
        manual.advance(Duration::from_micros(1));
    }
    readings
}

/// How many of `requests` requests of key 1 one thread admits, deciding them all at the latest
/// of the readings [`permuted_readings`] draws for `threads` threads.
fn admitted_at_the_latest_reading<A: Algorithm>(
    quota: Quota,
    threads: u64,
    requests: u64,
) -> usize {
    let clock = ManualClock::new();
    let limiter = keyed::<A, _>(quota, clock.clone());
    clock.set(Duration::from_secs(1) + Duration::from_micros(threads));
    (0..requests)
        .filter(|_| decide(&limiter, 1, 1).allowed)
        .count()
}

/// One OS thread per reading of `readings`, released together by a barrier, each deciding one
/// request with its reading on `limiter` (on the [`ScriptedClock`]); the threads take turns
/// between the keys 1 to `keys`. Answers how many each key admitted.
fn race_with_readings<L>(limiter: &L, readings: Vec<u64>, keys: usize) -> Vec<usize>
where
    L: Limiter<u64> + Clone + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(readings.len()));
    let admitted: Arc<Vec<AtomicUsize>> =
        Arc::new((0..keys).map(|_| AtomicUsize::new(0)).collect());
    let handles: Vec<_> = readings
        .into_iter()
        .enumerate()
        .map(|(i, reading)| {
            let barrier = Arc::clone(&barrier);
            let admitted = Arc::clone(&admitted);
            let limiter = limiter.clone();
            thread::spawn(move || {
                let key = i % keys;
                ScriptedClock::set(reading);
                barrier.wait();
                if decide(&limiter, key as u64 + 1, 1).allowed {
                    admitted[key].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect()
}

/// `threads` OS threads race, released together by a barrier. Each decides with a reading drawn
/// from a shared [`ManualClock`] at a different moment (it moves 1 µs between draws), handed out
/// so that the order of the readings is not the order of the threads: the readings reach the
/// state stale and out of order. Exactly as many are admitted as one thread deciding the same
/// requests at the latest reading admits: on a keyed limiter's key and on a direct limiter's
/// (a GCRA key keeps its word and its latest reading in one word that one compare-and-swap
/// changes; the loom models check the two apart, the reading published, then the word changed).
#[test]
fn racing_threads_with_stale_readings_get_exactly_the_limit() {
    fn run<A: Algorithm>() {
        const THREADS: u64 = 24;
        for max_wait in [Duration::ZERO, Duration::from_secs(60)] {
            let quota = waits_up_to(Quota::per_minute(5).unwrap(), max_wait);
            let expected = admitted_at_the_latest_reading::<A>(quota, THREADS, THREADS);
            for round in 0..20u64 {
                ScriptedClock::set(0);
                let keyed = keyed::<A, _>(quota, ScriptedClock);
                let direct = DirectRateLimiter::builder(quota).algorithm::<A>();
                let direct = direct.clock(ScriptedClock).build();
                let admitted = [
                    race_with_readings(&keyed, permuted_readings(THREADS, round), 1)[0],
                    race_with_readings(&direct, permuted_readings(THREADS, round), 1)[0],
                ];
                let name = name::<A>();
                let context = format!("{name} max_wait {max_wait:?} round {round}");
                assert_eq!(admitted, [expected; 2], "keyed, direct: {context}");
            }
        }
    }
    for_every_algorithm!(run);
}

/// The same race over two keys of one shard (a store of 16 keys has one shard), the threads
/// taking turns between them: the keys share the shard's floor reading and its give-backs'
/// mark, and the window algorithms' shard locks. Each key still gets exactly its quota, as one
/// thread deciding its requests at the latest reading would.
#[test]
fn two_keys_of_one_shard_with_interleaved_stale_readings_get_exactly_their_quota_each() {
    fn run<A: Algorithm>() {
        const THREADS: u64 = 24;
        let keyed_in_one_shard = |quota: Quota, clock| {
            KeyedRateLimiter::<u64>::builder(quota)
                .algorithm::<A>()
                .clock(clock)
                .max_keys(16)
                .build()
        };
        for max_wait in [Duration::ZERO, Duration::from_secs(60)] {
            let quota = waits_up_to(Quota::per_minute(5).unwrap(), max_wait);
            let expected = admitted_at_the_latest_reading::<A>(quota, THREADS, THREADS / 2);
            assert!(expected >= 5, "{}", name::<A>());
            for round in 0..20u64 {
                ScriptedClock::set(0);
                let limiter = keyed_in_one_shard(quota, ScriptedClock);
                let admitted = race_with_readings(&limiter, permuted_readings(THREADS, round), 2);
                for (key, admitted) in admitted.into_iter().enumerate() {
                    assert_eq!(
                        admitted,
                        expected,
                        "{} max_wait {max_wait:?} round {round} key {}",
                        name::<A>(),
                        key + 1
                    );
                }
            }
        }
    }
    for_every_algorithm!(run);
}

/// Items 10 and 11 through a configuration file: an absurd period is an error naming the field,
/// and a positive duration that would round to zero is an error naming the value, never a
/// silent zero (`max_wait = "0.5ns"` meant "never wait").
#[cfg(feature = "config")]
#[test]
fn config_refuses_absurd_and_sub_nanosecond_durations() {
    use tower_bulwark::config::Registry;
    let file = |period: &str, max_wait: &str| {
        format!(
            "[rate_limiters.api]\nlimit_for_period = 1\nlimit_refresh_period = \"{period}\"\n\
             max_wait = \"{max_wait}\"\n"
        )
    };
    let err = Registry::from_toml_str(&file("18446744073709551615ns", "0s")).unwrap_err();
    assert!(err.path().ends_with("limit_refresh_period"), "{err}");
    assert!(err.message().contains("2^60"), "{err}");
    let err = Registry::from_toml_str(&file("1s", "0.5ns")).unwrap_err();
    assert!(err.path().ends_with("max_wait"), "{err}");
    assert!(err.message().contains("0.5ns"), "{err}");
    let ok = Registry::from_toml_str(&file("1s", "0.5us")).unwrap();
    assert_eq!(
        ok.rate_limiter("api").unwrap().quota().max_wait(),
        Duration::from_nanos(500)
    );
}

// ---- a shared GCRA key: refusals by another policy, with admissions in between ----

/// Admits on `limiter` until it refuses, at the clock's current instant.
fn admitted_until_refused<L: Limiter<u64>>(limiter: &L) -> u64 {
    let mut n = 0;
    while decide(limiter, 0, 1).allowed {
        n += 1;
        assert!(n <= 1_000, "never refused");
    }
    n
}

/// A shared key (a tenant, a route) under GCRA, with requests that another policy refuses
/// interleaved with requests that are admitted: each refused one gives back what it took even
/// though others were admitted after it, so refusals drain nothing. At one instant the refund is
/// exact; with time between the two it is never more generous than if the refused request had
/// never come, and it still gives back all but the time elapsed.
#[test]
fn refusals_on_a_shared_gcra_key_drain_nothing_while_others_are_admitted() {
    // Ten a second, a burst of ten: T = 100 ms.
    let quota = Quota::per_second(10).unwrap();
    for gap_ms in [0u64, 30] {
        let clock = ManualClock::new();
        let vetoed = keyed::<Gcra, _>(quota, clock.clone());
        let twin = keyed::<Gcra, _>(quota, clock.clone());
        let kept = keyed::<Gcra, _>(quota, clock.clone());
        for _ in 0..4 {
            let refused_elsewhere = decide(&vetoed, 0, 1);
            assert!(refused_elsewhere.allowed);
            assert!(decide(&kept, 0, 1).allowed);
            clock.advance(Duration::from_millis(gap_ms));
            // Another request of the tenant is admitted before the refund arrives.
            assert!(decide(&vetoed, 0, 1).allowed);
            assert!(decide(&twin, 0, 1).allowed);
            assert!(decide(&kept, 0, 1).allowed);
            vetoed.refund(&0, 1, refused_elsewhere);
        }
        let (v, t, k) = (
            admitted_until_refused(&vetoed),
            admitted_until_refused(&twin),
            admitted_until_refused(&kept),
        );
        crate::common::assert_refunds_between(gap_ms, v, t, k);
    }
}
