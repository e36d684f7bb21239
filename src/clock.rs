//! Sources of time.
//!
//! Every time-dependent part of the crate reads time through a [`Clock`], a count of nanoseconds
//! since the clock's own origin. Production code uses [`SystemClock`], quanta's clock, as
//! governor does by default; [`InstantClock`] reads std's [`Instant`] instead. Tests use
//! [`ManualClock`], whose time moves only when the test moves it, or [`TokioClock`], which
//! follows tokio's timer and therefore `tokio::time::pause` / `advance`. Any type implementing
//! [`Clock`] can be passed to a builder's `clock` method.
//!
//! # What the limiters ask of a clock
//!
//! Little: no clock read by several threads delivers its readings in order, because a thread
//! that read the clock can lose the race to one that read it later. So every algorithm decides a
//! reading older than the latest its state has seen as of that latest reading: a stale or
//! out-of-order reading admits neither more nor less than an in-order one would. (GCRA's state
//! sees the readings that changed it: a refusal changes nothing and records nothing, so a
//! reading older than a refused one is decided as of itself, which refuses where a fresh one
//! might admit, never the other way round.) A clock whose
//! readings differ a little between processor cores is just another source of such readings. A
//! clock that runs fast or slow makes every limit fast or slow by as much; one that stops stops
//! replenishment.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A monotonic source of time, in nanoseconds since an origin chosen by the clock.
///
/// Readings taken one after another on a thread should never go backwards. Readings of different
/// threads may reach a limiter out of order (a thread that read the clock can lose the race to a
/// later reading), and every algorithm decides such a reading as of the key's latest one.
/// Limiters are generic over their clock, so the call is inlined and costs no more than the
/// underlying read.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds elapsed since this clock's origin.
    fn now(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
}

/// The latest instant the algorithms work with: 2^62 ns, about 146 years after the clock's
/// origin. A later reading (a broken clock, or one set near `u64::MAX`) is taken as this
/// instant: time stands still there, so every limit keeps holding (permits stop replenishing)
/// and no sum of an instant and a bounded span (see [`Quota`](crate::Quota)) can wrap.
pub(crate) const MAX_NOW: u64 = 1 << 62;

pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The default clock: [`quanta`](https://docs.rs/quanta)'s, read as governor reads it, counted
/// from the moment this clock was created.
///
/// Where the processor has a counter that ticks at a constant rate whatever its power state
/// (x86-64 with an invariant time-stamp counter, or AArch64's system counter), quanta reads that
/// counter and scales it to nanoseconds at a rate it measures against the operating system's
/// monotonic clock (the clock [`Instant`] reads) once per process, when the first quanta clock
/// is made (a few milliseconds, at most 200). Elsewhere it reads the operating system's clock.
///
/// What it guarantees: quanta promises that readings of one of its clocks increase
/// monotonically (`quanta::Clock::now`; this clock reads the same counter and scales it the
/// same way, as governor does). That rests on the counter: quanta checks only that the processor
/// reports an invariant one. That the counters of all cores agree is up to the processor and
/// the hypervisor (the kernel checks it for its own clock, but quanta does not ask the kernel),
/// and quanta's own caveats say raw readings may warp and drift from the reference clock. A
/// counter that changes rate after the measurement (a virtual machine moved to a host of another
/// frequency, unscaled) goes unnoticed. So: on one thread readings never go back as long as the
/// cores' counters agree; readings of different threads may reach a limiter out of order
/// whatever the clock, and the algorithms decide those as of the latest (see the
/// [module docs](self)). Time spent suspended is not counted.
///
/// Why this clock and not [`InstantClock`]: std's `Instant` goes through the kernel's vDSO,
/// whose counter read is fenced: it waits for every load before it. A keyed limiter reads the
/// clock beside its load of the key's entry, which over many keys often misses the caches, so
/// a fenced read waits for that miss; quanta reads the counter without a fence, and the two
/// overlap. `BENCHMARKS.md` has the measurements (the keyed check on `InstantClock` falls
/// outside the crate's bound of 1.5 times governor's). [`InstantClock`] is there for those who
/// prefer the clock source the kernel chooses and watches.
#[derive(Clone, Copy)]
pub struct SystemClock {
    counter: &'static Counter,
    /// The counter's reading, in nanoseconds, when this clock was made.
    origin: u64,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        // One quanta clock for the process: quanta calibrates once anyway, and a reference
        // keeps this clock `Copy`.
        static COUNTER: OnceLock<Counter> = OnceLock::new();
        let counter = COUNTER.get_or_init(|| {
            let clock = quanta::Clock::new();
            let base = clock.raw();
            Counter { clock, base }
        });
        Self {
            counter,
            origin: counter.nanos(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SystemClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SystemClock")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> u64 {
        self.counter.nanos().saturating_sub(self.origin)
    }
}

/// quanta's clock, in nanoseconds since its raw reading `base`, the same for every
/// [`SystemClock`] of the process: two clocks' readings taken at one instant differ by exactly
/// the distance of their origins (scaling each clock's own span would round each its own way).
struct Counter {
    clock: quanta::Clock,
    base: u64,
}

impl Counter {
    #[inline]
    fn nanos(&self) -> u64 {
        // Zero for a raw reading before the base (a core whose counter lags).
        self.clock.delta_as_nanos(self.base, self.clock.raw())
    }
}

/// std's [`Instant`]: the operating system's monotonic clock (on Linux `CLOCK_MONOTONIC`),
/// counted from the moment this clock was created.
///
/// The kernel chooses its clock source and stops using a time-stamp counter it finds unstable;
/// std documents `Instant` as monotonic, adding that hardware, virtualization or operating
/// system bugs can break that in rare cases. A reading costs a call into the vDSO whose counter
/// read is fenced, which is why it is not the default (see [`SystemClock`]).
#[derive(Clone, Copy, Debug)]
pub struct InstantClock {
    origin: Instant,
}

impl InstantClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for InstantClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for InstantClock {
    #[inline]
    fn now(&self) -> u64 {
        saturating_nanos(self.origin.elapsed())
    }
}

/// A clock that reads tokio's time (`tokio::time::Instant`), counted from its creation.
///
/// Under `tokio::time::pause()` it moves exactly as tokio's timer does, so a test can check that a
/// waiting request is admitted at the instant its reservation falls due, without real sleeping.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is tokio's now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> u64 {
        saturating_nanos(self.origin.elapsed())
    }
}

/// A clock for tests: time stands still until the test calls [`advance`](Self::advance) or
/// [`set`](Self::set).
///
/// Clones share one time, so a test keeps a clone and hands another to the limiter.
#[derive(Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A manual clock standing at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        let _ = (self.nanos).fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            Some(now.saturating_add(by))
        });
    }

    /// Sets the time since the origin. Setting it backwards is ignored: clocks are monotonic.
    pub fn set(&self, since_origin: Duration) {
        self.nanos
            .fetch_max(saturating_nanos(since_origin), Ordering::AcqRel);
    }

    /// The time since the origin.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now())
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.nanos.load(Ordering::Acquire)
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.elapsed())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_never_backwards() {
        let clock = ManualClock::new();
        let other = clock.clone();
        assert_eq!(clock.now(), 0);
        other.advance(Duration::from_millis(5));
        assert_eq!(clock.now(), 5_000_000);
        clock.set(Duration::from_millis(2));
        assert_eq!(clock.now(), 5_000_000, "set backwards is ignored");
        clock.set(Duration::from_secs(1));
        assert_eq!(other.elapsed(), Duration::from_secs(1));
    }

    #[test]
    fn instant_clock_is_monotonic_and_agrees_with_the_system_clock() {
        let instant = InstantClock::new();
        let system = SystemClock::new();
        let mut last = instant.now();
        for _ in 0..10_000 {
            let now = instant.now();
            assert!(now >= last);
            last = now;
        }
        // The instant clock's span over a sleep lies between the system clock's spans read
        // just inside and just outside it, give or take a millisecond of the two clocks'
        // resolutions, however the thread is scheduled between the reads.
        let (s0, i0, s0_after) = (system.now(), instant.now(), system.now());
        std::thread::sleep(Duration::from_millis(20));
        let (s1, i1, s1_after) = (system.now(), instant.now(), system.now());
        let span = i1 - i0;
        let (inside, outside) = (s1.saturating_sub(s0_after), s1_after - s0);
        assert!(
            span + 1_000_000 >= inside && span <= outside + 1_000_000,
            "instant {span} ns, system between {inside} and {outside} ns"
        );
        assert!(span >= 20_000_000);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
    }

    /// The clock reads the time `Instant` reads, to within 0.2 ms (quanta measures the counter's
    /// rate against the same clock, aiming at an error of 10 ns over its calibration), and never
    /// goes back on a thread, from four threads at once.
    #[test]
    fn system_clock_measures_what_instant_measures_from_many_threads() {
        const SLACK: u64 = 200_000;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    let outer = Instant::now();
                    let clock = SystemClock::new();
                    let inner = Instant::now();
                    let mut last = clock.now();
                    for i in 0..20_000u32 {
                        if i % 5_000 == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        let before = inner.elapsed();
                        let now = clock.now();
                        let after = outer.elapsed();
                        assert!(now >= last, "went back from {last} to {now}");
                        last = now;
                        let (before, after) = (saturating_nanos(before), saturating_nanos(after));
                        assert!(
                            before.saturating_sub(SLACK) <= now && now <= after + SLACK,
                            "SystemClock said {now} ns, Instant between {before} and {after}"
                        );
                    }
                    last
                })
            })
            .collect();
        for thread in threads {
            assert!(thread.join().expect("no panic") >= 4_000_000);
        }
    }
}
