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
    algorithm::{Algorithm, Gcra},
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

/// Reads `clock` (named `what`) on the thread `thread` between two `Instant` readings, of
/// `inner` (read just after the clock was made) and `outer` (just before), and asserts that it
/// did not step back from `last` (then the reading) and lies between them, within the
/// tolerance.
fn read_in_step(
    thread: usize,
    what: &str,
    clock: &SystemClock,
    (inner, outer): (Instant, Instant),
    last: &mut u64,
) {
    let before = nanos(inner.elapsed());
    let now = clock.now();
    let after = nanos(outer.elapsed());
    assert!(
        now >= *last,
        "thread {thread}: {what} went back from {last} to {now}"
    );
    assert!(
        before.saturating_sub(tolerance(before)) <= now && now <= after + tolerance(after),
        "thread {thread}: {what} said {now} ns, Instant between {before} and {after}"
    );
    *last = now;
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
                    read_in_step(t, "SystemClock", &shared, (inner, outer), &mut last);
                    read_in_step(
                        t,
                        "own SystemClock",
                        &own,
                        (own_inner, own_outer),
                        &mut own_last,
                    );
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

/// How long each of the sixteen threads of a [`race`] goes on.
#[derive(Clone, Copy)]
enum Span {
    /// This many attempts.
    Attempts(usize),
    /// As many attempts as one second (of `Instant`) allows.
    OneSecond,
}

/// Sixteen threads race for the permits of one limiter, each calling `decide` (true if
/// admitted) over `span`; returns how many were admitted.
fn race<F: Fn() -> bool + Send + Sync + 'static>(decide: F, span: Span) -> u64 {
    let decide = Arc::new(decide);
    let admitted = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (decide, admitted, barrier) = (decide.clone(), admitted.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let begin = Instant::now();
                let mut attempts = 0;
                while match span {
                    Span::Attempts(n) => attempts < n,
                    Span::OneSecond => begin.elapsed() < Duration::from_secs(1),
                } {
                    attempts += 1;
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

/// A clock and the threads' cores it reads: on the default clock all agree (nothing to do
/// before a reading); on a [`SkewedClock`] each reading may come from another core.
trait Cores: Clock + Copy + Send + Sync + 'static {
    /// What a race's threads are on, for the failure messages.
    fn setting(&self) -> &'static str;
    /// A clock of the same kind, made now.
    fn fresh(&self) -> Self;
    /// Before each attempt: the scheduler may move the thread.
    fn before_each_reading(&self) {}
}

impl Cores for SystemClock {
    fn setting(&self) -> &'static str {
        "16 threads"
    }
    fn fresh(&self) -> Self {
        SystemClock::new()
    }
}

/// Sixteen threads race over `span` for the permits of a direct limiter of algorithm `A` for
/// `quota` on `clock`; returns how many were admitted.
fn race_direct<A: Algorithm, C: Cores>(quota: Quota, clock: C, span: Span) -> u64 {
    let limiter = DirectRateLimiter::builder(quota)
        .algorithm::<A>()
        .clock(clock)
        .build();
    race(
        move || {
            clock.before_each_reading();
            limiter.check().allowed
        },
        span,
    )
}

/// Asserts that a race of algorithm `A` on clocks like `clock` (`case` saying which race) admitted
/// exactly its quota of `quota` a day.
fn assert_exactly_the_quota<A>(clock: &impl Cores, admitted: u64, quota: u64, case: &str) {
    assert_eq!(
        admitted,
        quota,
        "{}: {case} on {quota} per day ({})",
        std::any::type_name::<A>(),
        clock.setting()
    );
}

/// Five rounds of sixteen threads, 400 attempts each, racing a direct limiter of algorithm `A`
/// for 1000 a day on a fresh clock of the kind of `clock` each round: each round admits exactly
/// the quota.
fn direct_race<A: Algorithm>(clock: impl Cores) {
    for round in 0..5 {
        let quota = Quota::per_day(1_000).unwrap();
        let admitted = race_direct::<A, _>(quota, clock.fresh(), Span::Attempts(400));
        assert_exactly_the_quota::<A>(
            &clock,
            admitted,
            1_000,
            &format!("round {round}: 6400 attempts"),
        );
    }
}

#[test]
fn sixteen_threads_racing_a_direct_limiter_on_the_default_clock_get_exactly_the_quota() {
    for_every_algorithm!(direct_race(SystemClock::new()));
}

/// Sixteen threads, 1000 attempts each, racing a keyed limiter of algorithm `A` for 500 a day
/// on `clock`, over 8 keys in turn: each key admits exactly the quota.
fn keyed_race<A: Algorithm>(clock: impl Cores) {
    let limiter = Arc::new(
        KeyedRateLimiter::<u64>::builder(Quota::per_day(500).unwrap())
            .algorithm::<A>()
            .clock(clock)
            .build(),
    );
    let per_key: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
    let next = Arc::new(AtomicU64::new(0));
    let (l, p, n) = (limiter.clone(), per_key.clone(), next.clone());
    race(
        move || {
            clock.before_each_reading();
            let key = n.fetch_add(1, Ordering::Relaxed) % 8;
            let allowed = l.check(&key).allowed;
            if allowed {
                p[key as usize].fetch_add(1, Ordering::Relaxed);
            }
            allowed
        },
        Span::Attempts(1_000),
    );
    for (key, admitted) in per_key.iter().enumerate() {
        let admitted = admitted.load(Ordering::Relaxed);
        assert_exactly_the_quota::<A>(&clock, admitted, 500, &format!("key {key}: 2000 attempts"));
    }
}

#[test]
fn sixteen_threads_racing_a_keyed_limiter_on_the_default_clock_get_exactly_the_quota_per_key() {
    for_every_algorithm!(keyed_race(SystemClock::new()));
}

/// Sixteen threads hammer a GCRA limiter of 2000 per second (burst 2000) on `clock` for a
/// second; answers how many it admitted.
fn admitted_in_a_second_of_2000_per_second<C: Cores>(clock: C) -> f64 {
    let quota = Quota::per_second(2_000).unwrap();
    race_direct::<Gcra, C>(quota, clock, Span::OneSecond) as f64
}

/// Asserts that `admitted` (of 2000 per second, burst 2000, in `elapsed` seconds) is at most
/// `most` and at least the burst plus 0.9 s of the rate.
fn assert_admitted_at_most(admitted: f64, most: f64, elapsed: f64) {
    assert!(
        admitted <= most,
        "admitted {admitted}, at most {most} in {elapsed} s"
    );
    assert!(
        admitted >= 2_000.0 + 2_000.0 * 0.9,
        "admitted only {admitted} in {elapsed} s"
    );
}

/// A GCRA limiter of 2000 per second (burst 2000) on the default clock, hammered by sixteen
/// threads for a second: it admits the burst plus what the rate replenished over the time
/// `Instant` measured, within the clock's tolerance, neither more nor (much) less.
#[test]
fn a_replenishing_limiter_on_the_default_clock_admits_what_instant_allows() {
    let started = Instant::now();
    let admitted = admitted_in_a_second_of_2000_per_second(SystemClock::new());
    let elapsed = started.elapsed().as_secs_f64();
    let most = 2_000.0 + 2_000.0 * elapsed * 1.001 + 2.0;
    assert_admitted_at_most(admitted, most, elapsed);
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

impl Cores for SkewedClock {
    fn setting(&self) -> &'static str {
        "16 threads on cores 4 ms apart"
    }
    fn fresh(&self) -> Self {
        SkewedClock::new()
    }
    fn before_each_reading(&self) {
        SkewedClock::move_to_another_core();
    }
}

/// Every reading of a thread may come from another core, up to 2 ms ahead of or behind real
/// time, so each thread's own readings jump back and forth and the threads' readings reach the
/// limiter out of order: every algorithm admits exactly the quota, direct and per key.
#[test]
fn sixteen_threads_on_cores_out_of_step_get_exactly_the_quota() {
    for_every_algorithm!(direct_race(SkewedClock::new()));
    for_every_algorithm!(keyed_race(SkewedClock::new()));
}

/// A GCRA limiter of 2000 per second (burst 2000) on cores out of step, hammered by sixteen
/// threads for a second: a reading 2 ms ahead replenishes as of then, and no reading behind
/// the latest takes back or adds anything, so it admits the burst plus what the rate
/// replenished between the earliest and the latest reading (at most the time `Instant` measured
/// plus 4 ms), neither more nor (much) less.
#[test]
fn a_replenishing_limiter_on_cores_out_of_step_admits_no_more_than_its_latest_reading_allows() {
    let clock = SkewedClock::new();
    let admitted = admitted_in_a_second_of_2000_per_second(clock);
    let elapsed = clock.0.elapsed().as_secs_f64();
    let most = 2_000.0 + 2_000.0 * (elapsed + 0.004) + 2.0;
    assert_admitted_at_most(admitted, most, elapsed);
}
