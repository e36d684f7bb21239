//! The default clock (`SystemClock`) attacked with real threads and real clocks: sixteen
//! threads reading one clock for two seconds on a two-core machine (so that they are preempted
//! often), and real limiters on the default clock raced by sixteen threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use tower_bulwark::{
    algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::{Clock, SystemClock},
    DirectRateLimiter, KeyedRateLimiter, Quota,
};

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// The documented tolerance of a reading against `CLOCK_MONOTONIC` after `elapsed` ns: 0.2 ms
/// plus 0.1 %, and 20 µs for the rate `quanta` measured.
fn tolerance(elapsed: u64) -> u64 {
    200_000 + elapsed / 1_000 + 20_000
}

/// Sixteen threads read one `SystemClock` (and a second one made on each thread) for two
/// seconds: no reading steps back on a thread, each lies between the `Instant`s read around it
/// (within the documented tolerance), and the clock still reads the counter at the end.
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
    assert!(
        shared.reads_counter() || cfg!(not(target_arch = "x86_64")),
        "the counter was dropped on a machine whose counter is invariant"
    );
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
    direct_race::<Gcra>();
    direct_race::<FixedWindow>();
    direct_race::<SlidingLog>();
    direct_race::<SlidingCounter>();
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
    keyed_race::<Gcra>();
    keyed_race::<FixedWindow>();
    keyed_race::<SlidingLog>();
    keyed_race::<SlidingCounter>();
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
