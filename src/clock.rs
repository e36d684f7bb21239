//! Sources of time.
//!
//! Every time-dependent part of the crate reads time through a [`Clock`], a monotonic count of
//! nanoseconds since the clock's own origin. Production code uses [`SystemClock`]; tests use
//! [`ManualClock`], whose time moves only when the test moves it, or [`TokioClock`], which follows
//! tokio's timer and therefore `tokio::time::pause` / `advance`.
//!
//! # Why the default is `SystemClock`, not the time-stamp counter
//!
//! `QuantaClock` (feature `quanta`) reads the processor's time-stamp counter, the clock
//! governor uses by default. It is faster to read, and the algorithms would accept it: readings
//! that arrive out of order between threads (a thread that read the clock, was descheduled and
//! lost the race to a later reading, or a counter slightly out of step between cores) are decided
//! as of the latest reading the key has seen (for GCRA, that of any key of its shard), so a
//! stale reading admits neither more nor less. The default
//! still stays `SystemClock` (`std::time::Instant`), on this evidence (figures in
//! `BENCHMARKS.md`, "Which clock"):
//!
//! * **What the counter buys is small next to the rest of a keyed check.** Counted with
//!   callgrind, a keyed check is 406 instructions on `SystemClock` and 337 on `QuantaClock`
//!   (governor: 296). In time, on a 2-vCPU AMD EPYC virtual machine, the counter saved 35 to
//!   40 ns of 85 to 95 ns on an idle machine, and nothing measurable (about 300 ns either way)
//!   with another build running, where the load of the key's table entry dominates. Neither
//!   clock makes the keyed check level with governor's from one thread.
//! * **The counter's correctness depends on the platform.** `quanta` uses it when the processor
//!   reports a constant or invariant rate, and otherwise falls back to the operating system's
//!   clock. A counter that is constant but not invariant can stop in deep sleep states and fall
//!   behind real time; a virtual machine migrated live to a host with another counter frequency
//!   (without the hypervisor scaling it) sees the counter tick at a new rate; and the rate is
//!   measured once per process, against the system clock (for up to 200 ms, on the thread that
//!   makes the first `QuantaClock`), so an error in that measurement stays for the life of the
//!   process. A clock whose rate is off by some fraction makes every limit off by that fraction,
//!   silently. `Instant` is the operating system's monotonic clock and has none of these failure
//!   modes.
//! * **Creating a `QuantaClock` runs `cpuid`**, which a hypervisor traps: harmless when a
//!   limiter is built once, costly if limiters are built per request.
//!
//! Where the platform is known to have an invariant counter (bare metal, or a hypervisor that
//! exposes `invariant_tsc` and scales it across migrations), `QuantaClock` is one builder call
//! away: `KeyedRateLimiter::builder(quota).clock(QuantaClock::new()).build()`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
#[cfg(any(test, not(any(target_os = "linux", target_os = "android"))))]
use std::time::Instant;

/// A monotonic source of time, in nanoseconds since an origin chosen by the clock.
///
/// Implementations must never go backwards. Limiters are generic over their clock, so the call is
/// inlined and costs no more than the underlying read.
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

/// The default clock: the operating system's monotonic clock, the one `std::time::Instant` reads,
/// counted from the moment the clock was created.
///
/// On Linux and Android it reads `CLOCK_MONOTONIC` itself (through `rustix`), the clock behind
/// `Instant::now()`, and turns the reading into nanoseconds with one multiplication: the same time,
/// without `Instant`'s checked arithmetic and `Duration` in between (about 60 instructions less
/// per reading, measured with callgrind). Elsewhere it uses `Instant`.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Origin,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
type Origin = u64;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
type Origin = Instant;

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let origin = monotonic_nanos();
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let origin = Instant::now();
        Self { origin }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds since its own (boot-time) origin.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[inline]
fn monotonic_nanos() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    // The monotonic clock counts from boot: seconds and nanoseconds are never negative, and a u64
    // of nanoseconds lasts 584 years of uptime, so neither conversion nor sum loses anything in
    // practice (a broken reading saturates rather than wraps).
    u64::try_from(now.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
}

impl Clock for SystemClock {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[inline]
    fn now(&self) -> u64 {
        // The monotonic clock never goes back, so the reading is never below the origin; the
        // saturation only guards against a kernel that broke that promise.
        monotonic_nanos().saturating_sub(self.origin)
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    #[inline]
    fn now(&self) -> u64 {
        // Seconds and nanoseconds separately: cheaper than the 128-bit `as_nanos`, and a u64 of
        // nanoseconds lasts 584 years, so the saturation never happens in practice.
        let d = self.origin.elapsed();
        d.as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()))
    }
}

/// A clock that follows `tokio::time::Instant`.
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

/// A clock on the CPU's time-stamp counter (feature `quanta`), calibrated against the system
/// clock when first used.
///
/// Reading it costs a few nanoseconds where `Instant::now()` costs tens on many virtual
/// machines; where the counter is not reliable, `quanta` falls back to the operating system's
/// monotonic clock. `BENCHMARKS.md` compares the two.
#[cfg(feature = "quanta")]
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    origin: u64,
}

#[cfg(feature = "quanta")]
impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }
}

#[cfg(feature = "quanta")]
impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "quanta")]
impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
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
        let mut cur = self.nanos.load(Ordering::Acquire);
        loop {
            let next = cur.saturating_add(by);
            match self
                .nanos
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
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

    #[cfg(feature = "quanta")]
    #[test]
    fn quanta_clock_is_monotonic_and_agrees_with_the_system_clock() {
        let quanta = QuantaClock::new();
        let system = SystemClock::new();
        let mut last = quanta.now();
        for _ in 0..10_000 {
            let now = quanta.now();
            assert!(now >= last);
            last = now;
        }
        std::thread::sleep(Duration::from_millis(20));
        let (q, s) = (quanta.now(), system.now());
        // Both count from about the same origin; allow for scheduling between the two reads.
        assert!(q.abs_diff(s) < 10_000_000, "quanta {q} ns, system {s} ns");
        assert!(q >= 20_000_000);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
    }

    /// The clock reads the same time as `Instant`: every span it measures lies between two
    /// spans `Instant` measured around it, from four threads at once.
    #[test]
    fn system_clock_measures_what_instant_measures_from_many_threads() {
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
                            before <= now && now <= after,
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
