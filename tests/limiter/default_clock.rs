//! The default clock (`SystemClock`) attacked with real threads and real clocks: sixteen
//! threads reading one clock for two seconds on a two-core machine (so that they are preempted
//! often), and real limiters on the default clock raced by sixteen threads; and limiters raced by
//! sixteen threads whose clocks disagree, as cores whose counters are out of step would.

use crate::common::for_every_algorithm;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use tower_bulwark::{
    algorithm::Algorithm,
    clock::{Clock, SystemClock},
    DirectRateLimiter, KeyedRateLimiter, Quota,
};

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// The tolerance of a reading against `CLOCK_MONOTONIC` after `elapsed` ns: 0.2 ms plus 0.1 %,
/// and 20 µs, far more than the error of the rate `quanta` measures against that clock.
fn tolerance(elapsed: u64) -> u64 {
    200_000 + elapsed / 1_000 + 20_000
}

/// Sixteen threads read one `SystemClock` (and a second one made on each thread) for two
/// seconds: no reading steps back on a thread, and each lies between the `Instant`s read around
/// it (within the tolerance).
#[test]
fn sixteen_threads_read_the_system_clock_in_step_with_instant() {
    let outer = Instant::now();
    let shared = SystemClock::new();
    let inner = Instant::now();
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let barrier = barrier.clone();
            thread::spawn(move || {
                let own_outer = Instant::now();
                let own = SystemClock::new();
                let own_inner = Instant::now();
                barrier.wait();
                let (mut last, mut own_last, mut n) = (shared.now(), own.now(), 0u64);
                while inner.elapsed() < Duration::from_secs(2) {
                    let before = nanos(inner.elapsed());
                    let now = shared.now();
                    let after = nanos(outer.elapsed());
                    assert!(now >= last, "thread {t}: went back from {last} to {now}");
                    assert!(
                        before.saturating_sub(tolerance(before)) <= now
                            && now <= after + tolerance(after),
                        "thread {t}: SystemClock said {now} ns, Instant between {before} and {after}"
                    );
                    last = now;
                    let before = nanos(own_inner.elapsed());
                    let own_now = own.now();
                    let after = nanos(own_outer.elapsed());
                    assert!(own_now >= own_last, "thread {t}: own clock went back");
                    assert!(
                        before.saturating_sub(tolerance(before)) <= own_now
                            && own_now <= after + tolerance(after),
                        "thread {t}: own SystemClock said {own_now} ns, Instant between {before} and {after}"
                    );
                    own_last = own_now;
                    n += 1;
                    if n % 100_000 == 0 {
                        thread::yield_now();
                    }
                }
                n
            })
        })
        .collect();
    let readings: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("no panic"))
        .sum();
    assert!(readings > 100_000, "only {readings} readings");
}

/// Sixteen threads race for the permits of one limiter on the default clock; returns how many
/// were admitted. `attempts` per thread.
fn race<F: Fn() -> bool + Send + Sync + 'static>(decide: F, attempts: usize) -> u64 {
    let decide = Arc::new(decide);
    let admitted = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (decide, admitted, barrier) = (decide.clone(), admitted.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for _ in 0..attempts {
                    if decide() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("no panic");
    }
    admitted.load(Ordering::Relaxed)
}

fn direct_race<A: Algorithm>() {
    for round in 0..5 {
        let limiter = DirectRateLimiter::builder(Quota::per_day(1_000).unwrap())
            .algorithm::<A>()
            .build();
        let admitted = race(move || limiter.check().allowed, 400);
        assert_eq!(
            admitted,
            1_000,
            "{}: round {round}: 16 threads, 6400 attempts on 1000 per day",
            std::any::type_name::<A>()
        );
    }
}

#[test]
fn sixteen_threads_racing_a_direct_limiter_on_the_default_clock_get_exactly_the_quota() {
    for_every_algorithm!(direct_race);
}

fn keyed_race<A: Algorithm>() {
    let limiter = Arc::new(
        KeyedRateLimiter::<u64>::builder(Quota::per_day(500).unwrap())
            .algorithm::<A>()
            .build(),
    );
    let per_key: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
    let next = Arc::new(AtomicU64::new(0));
    let (l, p, n) = (limiter.clone(), per_key.clone(), next.clone());
    race(
        move || {
            let key = n.fetch_add(1, Ordering::Relaxed) % 8;
            let allowed = l.check(&key).allowed;
            if allowed {
                p[key as usize].fetch_add(1, Ordering::Relaxed);
            }
            allowed
        },
        1_000,
    );
    for (key, admitted) in per_key.iter().enumerate() {
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            500,
            "{}: key {key}: 2000 attempts on 500 per day",
            std::any::type_name::<A>()
        );
    }
}

#[test]
fn sixteen_threads_racing_a_keyed_limiter_on_the_default_clock_get_exactly_the_quota_per_key() {
    for_every_algorithm!(keyed_race);
}

/// A GCRA limiter of 2000 per second (burst 2000) on the default clock, hammered by sixteen
/// threads for a second: it admits the burst plus what the rate replenished over the time
/// `Instant` measured, within the clock's tolerance, neither more nor (much) less.
#[test]
fn a_replenishing_limiter_on_the_default_clock_admits_what_instant_allows() {
    let started = Instant::now();
    let limiter = Arc::new(DirectRateLimiter::new(Quota::per_second(2_000).unwrap()));
    let admitted = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (limiter, admitted, barrier) = (limiter.clone(), admitted.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let begin = Instant::now();
                while begin.elapsed() < Duration::from_secs(1) {
                    if limiter.check().allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("no panic");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    let most = 2_000.0 + 2_000.0 * elapsed * 1.001 + 2.0;
    assert!(
        admitted <= most,
        "admitted {admitted}, at most {most} in {elapsed} s"
    );
    assert!(
        admitted >= 2_000.0 + 2_000.0 * 0.9,
        "admitted only {admitted} in {elapsed} s"
    );
}

/// How far apart the cores' counters are in the races on [`SkewedClock`]: up to 2 ms either way
/// of real time, thousands of times more than the cores of one machine disagree by.
const MAX_SKEW: i64 = 2_000_000;

static NEXT_SEED: AtomicU64 = AtomicU64::new(0x2545_F491_4F6C_DD1D);

thread_local! {
    /// How far the counter of the core this thread runs on is from real time, in ns.
    static SKEW: Cell<i64> = const { Cell::new(0) };
    static SEED: Cell<u64> =
        Cell::new(NEXT_SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) | 1);
}

/// Real time (`Instant` since the clock was made, plus an hour so that no skew goes below zero)
/// plus the skew of the core the calling thread is on: the clock of a machine whose cores'
/// counters are out of step, read by threads the scheduler moves between cores.
#[derive(Clone, Copy, Debug)]
struct SkewedClock(Instant);

impl SkewedClock {
    const BASE: u64 = 3_600_000_000_000;

    fn new() -> Self {
        Self(Instant::now())
    }

    /// The scheduler moves the calling thread to another core, whose counter is up to
    /// [`MAX_SKEW`] ahead of or behind real time.
    fn move_to_another_core() {
        let mut seed = SEED.with(Cell::get);
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        SEED.with(|s| s.set(seed));
        let span = 2 * MAX_SKEW.unsigned_abs() + 1;
        let skew = i64::try_from(seed % span).unwrap() - MAX_SKEW;
        SKEW.with(|s| s.set(skew));
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> u64 {
        let real = Self::BASE + nanos(self.0.elapsed());
        real.checked_add_signed(SKEW.with(Cell::get)).unwrap()
    }
}

fn direct_race_on_skewed_clocks<A: Algorithm>() {
    for round in 0..5 {
        let limiter = DirectRateLimiter::builder(Quota::per_day(1_000).unwrap())
            .algorithm::<A>()
            .clock(SkewedClock::new())
            .build();
        let admitted = race(
            move || {
                SkewedClock::move_to_another_core();
                limiter.check().allowed
            },
            400,
        );
        assert_eq!(
            admitted,
            1_000,
            "{}: round {round}: 16 threads on cores 4 ms apart, 6400 attempts on 1000 per day",
            std::any::type_name::<A>()
        );
    }
}

fn keyed_race_on_skewed_clocks<A: Algorithm>() {
    let limiter = Arc::new(
        KeyedRateLimiter::<u64>::builder(Quota::per_day(500).unwrap())
            .algorithm::<A>()
            .clock(SkewedClock::new())
            .build(),
    );
    let per_key: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
    let next = Arc::new(AtomicU64::new(0));
    let (l, p, n) = (limiter.clone(), per_key.clone(), next.clone());
    race(
        move || {
            SkewedClock::move_to_another_core();
            let key = n.fetch_add(1, Ordering::Relaxed) % 8;
            let allowed = l.check(&key).allowed;
            if allowed {
                p[key as usize].fetch_add(1, Ordering::Relaxed);
            }
            allowed
        },
        1_000,
    );
    for (key, admitted) in per_key.iter().enumerate() {
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            500,
            "{}: key {key}: 2000 attempts on 500 per day from cores 4 ms apart",
            std::any::type_name::<A>()
        );
    }
}

/// Every reading of a thread may come from another core, up to 2 ms ahead of or behind real
/// time, so each thread's own readings jump back and forth and the threads' readings reach the
/// limiter out of order: every algorithm admits exactly the quota, direct and per key.
#[test]
fn sixteen_threads_on_cores_out_of_step_get_exactly_the_quota() {
    for_every_algorithm!(direct_race_on_skewed_clocks);
    for_every_algorithm!(keyed_race_on_skewed_clocks);
}

/// A GCRA limiter of 2000 per second (burst 2000) on cores out of step, hammered by sixteen
/// threads for a second: a reading 2 ms ahead replenishes as of then, and no reading behind
/// the latest takes back or adds anything, so it admits the burst plus what the rate
/// replenished between the earliest and the latest reading (at most the time `Instant` measured
/// plus 4 ms), neither more nor (much) less.
#[test]
fn a_replenishing_limiter_on_cores_out_of_step_admits_no_more_than_its_latest_reading_allows() {
    let clock = SkewedClock::new();
    let limiter = Arc::new(
        DirectRateLimiter::builder(Quota::per_second(2_000).unwrap())
            .clock(clock)
            .build(),
    );
    let admitted = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (limiter, admitted, barrier) = (limiter.clone(), admitted.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let begin = Instant::now();
                while begin.elapsed() < Duration::from_secs(1) {
                    SkewedClock::move_to_another_core();
                    if limiter.check().allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("no panic");
    }
    let elapsed = clock.0.elapsed().as_secs_f64();
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    let most = 2_000.0 + 2_000.0 * (elapsed + 0.004) + 2.0;
    assert!(
        admitted <= most,
        "admitted {admitted}, at most {most} in {elapsed} s"
    );
    assert!(
        admitted >= 2_000.0 + 2_000.0 * 0.9,
        "admitted only {admitted} in {elapsed} s"
    );
}
