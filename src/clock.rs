//! Sources of time.
//!
//! Every time-dependent part of the crate reads time through a [`Clock`], a monotonic count of
//! nanoseconds since the clock's own origin. Production code uses [`SystemClock`]; tests use
//! [`ManualClock`], whose time moves only when the test moves it, or [`TokioClock`], which follows
//! tokio's timer and therefore `tokio::time::pause` / `advance`.
//!
//! # Why the default clock reads the time-stamp counter, checked
//!
//! [`SystemClock`] tells the time of the operating system's monotonic clock (`CLOCK_MONOTONIC`,
//! what `std::time::Instant` reads) but reads it, while it can, through the processor's
//! time-stamp counter, checking the counter against `CLOCK_MONOTONIC` (every 10 ms, on each
//! thread's first reading and every 4096th, and before giving out a reading that jumped), and
//! reading `CLOCK_MONOTONIC` itself from the first check that finds the counter astray. The
//! evidence, on a 2-vCPU AMD EPYC virtual machine (`benches/limiter.rs`; `BENCHMARKS.md` has the
//! tables):
//!
//! * **Reading `CLOCK_MONOTONIC` orders the processor's loads.** The kernel's vDSO reads the
//!   counter with a fence, which waits for every load before it. A keyed check that read it
//!   before its table lookup took 143 ns per check over 100 000 keys, 73 ns when it read it
//!   after the lookup (the order the keyed limiter now uses), and 46 ns on the counter read
//!   without a fence, as governor reads it (governor: 45 to 48 ns). Counted in instructions the
//!   clocks differ little (a keyed check is 345 on `CLOCK_MONOTONIC` through the vDSO, 338 on
//!   the bare counter, 357 on the checked counter); the time is in the fence.
//! * **The counter's failure modes are found, not trusted away.** `quanta` uses the counter only
//!   where the processor reports an invariant rate, and measures that rate against
//!   `CLOCK_MONOTONIC` once per process. What can still go wrong is a counter that jumps, stops
//!   or changes rate (a live migration to a host with another frequency, without the hypervisor
//!   scaling it), or a rate measured wrong. Each shows as a difference between what the counter
//!   and `CLOCK_MONOTONIC` counted since a checkpoint; more than 0.2 ms plus 0.1 % of that time
//!   and the clock falls back for good, with a warning in the log, carrying on from the time
//!   `CLOCK_MONOTONIC` counted. The tests of this module drive the check with clocks that run
//!   fast or slow by 0.05 to 2 %, oscillate, jump ahead or back by a microsecond to an hour or
//!   to the end of the range, stop (read by long- and short-lived threads), or are read by a
//!   thread that is descheduled mid-check, and race readings against a fall back.
//! * **The algorithms accept readings out of order.** A counter can be slightly out of step
//!   between cores, and any reading can lose a race between threads; every algorithm decides a
//!   stale reading as of the latest reading the key has seen (for GCRA, that of any key of its
//!   shard), so such a reading admits neither more nor less.
//!
//! `QuantaClock` (feature `quanta`) reads the counter without the check, as governor does.
//! [`TokioClock`] and [`ManualClock`] are for tests; any type implementing [`Clock`] can be
//! passed to a builder's `clock` method.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;
#[cfg(any(test, not(any(target_os = "linux", target_os = "android"))))]
use std::time::Instant;

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

/// The default clock: the operating system's monotonic clock (`CLOCK_MONOTONIC`, the clock
/// `std::time::Instant` reads), read through the processor's time-stamp counter while the counter
/// keeps step with it, counted from the moment the clock was created.
///
/// Reading `CLOCK_MONOTONIC` costs a call into the kernel's vDSO, whose counter read is fenced:
/// it waits for every load before it, so a limiter that reads it cannot overlap its table lookup
/// with the read. The counter itself (through `quanta`, which uses it only where the processor
/// reports an invariant rate) is read without a fence.
///
/// The counter is checked against `CLOCK_MONOTONIC` every 10 ms of counter time, on each
/// thread's first reading and every 4096th: the time both counted since a checkpoint (renewed
/// each second) may differ by 0.2 ms plus 0.1 % of it. A counter that differs by more (one that
/// stopped, jumped, or changed rate, as after a live migration to a host with another
/// frequency) is dropped for good, with a warning, and every later reading comes from
/// `CLOCK_MONOTONIC`, carried on from the time it counted since the checkpoint; a jump is not
/// kept. A reading more than 10 ms past the latest check, or earlier than it, is not given out
/// before a check has vouched for it, so a jump is found by the first reading that sees it. A
/// comparison made while the checking thread was descheduled is skipped, not trusted. On one
/// thread readings never step back by up to a second (the thread's previous reading is given
/// instead; a larger step back, which only a counter found jumping far back could cause, is let
/// through rather than stop the thread's clock that long). So a counter that strays is found
/// within one check, and a rate off by less than about 0.12 % (`quanta` measures it to far
/// better) would make every limit off by as much. The module docs give the measurements behind
/// this choice.
///
/// The first `SystemClock` of a process measures the counter's rate against `CLOCK_MONOTONIC`
/// (a few milliseconds, up to 200 ms); later ones only read it.
#[derive(Clone, Copy)]
pub struct SystemClock {
    source: &'static Checked<Counter, Os>,
    origin: u64,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        static SOURCE: OnceLock<Checked<Counter, Os>> = OnceLock::new();
        let source = SOURCE.get_or_init(|| Checked::new(Counter::new(), Os::new()));
        Self {
            source,
            origin: source.now(),
        }
    }

    /// Whether readings still come from the time-stamp counter (`false` once it strayed from
    /// `CLOCK_MONOTONIC`, or where the platform has none that `quanta` trusts).
    pub fn reads_counter(&self) -> bool {
        !self.source.fell_back()
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
            .field("reads_counter", &self.reads_counter())
            .finish()
    }
}

impl Clock for SystemClock {
    #[inline(always)]
    fn now(&self) -> u64 {
        self.source.now().saturating_sub(self.origin)
    }
}

/// The time-stamp counter (or whatever `quanta` found best), in nanoseconds since this value was
/// made: [`SystemClock`]'s fast source, and all of `QuantaClock`.
#[derive(Clone, Debug)]
struct Counter {
    clock: quanta::Clock,
    origin: u64,
}

impl Counter {
    fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }
}

impl Clock for Counter {
    #[inline(always)]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
struct Os {
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    origin: Instant,
}

impl Os {
    fn new() -> Self {
        Self {
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            origin: Instant::now(),
        }
    }
}

impl Clock for Os {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[inline]
    fn now(&self) -> u64 {
        monotonic_nanos()
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    #[inline]
    fn now(&self) -> u64 {
        saturating_nanos(self.origin.elapsed())
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

/// How often, in `fast` time, a reading of [`Checked`] also reads the reference.
const CHECK_EVERY: u64 = 10_000_000;
/// How often, in readings on one thread, a reading of [`Checked`] also reads the reference (and
/// the first reading of every thread does), so that a fast clock that stopped is found too.
const CHECK_EVERY_READS: u32 = 4096;
/// The difference always allowed between what the two sources counted since a checkpoint:
/// 0.2 ms.
const SLACK: u64 = 200_000;
/// The difference allowed per nanosecond counted, as a divisor: 1/1000, i.e. 0.1 %.
const RATE_DIVISOR: u64 = 1_000;
/// The time after which a check sets a new checkpoint: rates are compared over at least this.
const RATE_SPAN: u64 = 1_000_000_000;
/// A check whose two reference readings are further apart than this (the thread was
/// descheduled between them) is skipped.
const MAX_CHECK_SPAN: u64 = 200_000;
/// A reading earlier than the thread's previous one by at most this much is answered with the
/// previous one; a larger step back (a counter that jumped far back, found by the same
/// reading) is let through rather than stop the thread's clock for longer.
const MAX_HIDDEN_STEP_BACK: u64 = 1_000_000_000;

/// A fast clock checked against a reference clock: readings come from `fast`, moved into the
/// reference's time base, until the time the two counted since a checkpoint differs by more
/// than [`SLACK`] plus that time / [`RATE_DIVISOR`]; from then on from `reference`, carried on
/// from the time the reference counted since the checkpoint (plus at most the tolerance, when
/// `fast` was ahead).
///
/// A reading checks when `fast` has moved [`CHECK_EVERY`] past the latest check or gone back
/// before it by more than [`SLACK`], on a thread's first reading and on every
/// [`CHECK_EVERY_READS`]-th. On one thread, readings never step back by up to
/// [`MAX_HIDDEN_STEP_BACK`] (the thread's previous reading is answered instead).
pub(crate) struct Checked<F, R> {
    /// Tells this clock apart in the threads' latest readings (an address could be reused).
    id: usize,
    fast: F,
    reference: R,
    /// `fast`'s readings, less `fast_origin`, plus `anchor`, are in the reference's time base.
    fast_origin: u64,
    anchor: u64,
    /// The reading (in the reference's time base) that started the latest check; readings
    /// outside `[checked_at - SLACK, checked_at + CHECK_EVERY)` wait for a check.
    checked_at: AtomicU64,
    /// Both sources' readings at the latest checkpoint; held while checking.
    point: Mutex<Point>,
    fell_back: AtomicBool,
    /// Once fallen back, readings are `carry_on` plus what the reference counted since
    /// `fell_back_at`.
    carry_on: AtomicU64,
    fell_back_at: AtomicU64,
}

impl<F: Clock, R: Clock> Checked<F, R> {
    pub(crate) fn new(fast: F, reference: R) -> Self {
        // Read the reference around the fast clock; a pair taken across a descheduling would
        // put the two out of step from the start, so take another (the last one if every try
        // was interrupted: the first checks then tell).
        let (mut before, mut zero) = (reference.now(), fast.now());
        for _ in 0..100 {
            let after = reference.now();
            if after.saturating_sub(before) <= MAX_CHECK_SPAN {
                before += after.saturating_sub(before) / 2;
                break;
            }
            before = reference.now();
            zero = fast.now();
        }
        static IDS: AtomicUsize = AtomicUsize::new(1);
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            fast,
            reference,
            fast_origin: zero,
            anchor: before,
            checked_at: AtomicU64::new(before),
            point: Mutex::new(Point {
                fast: before,
                reference: before,
            }),
            fell_back: AtomicBool::new(false),
            carry_on: AtomicU64::new(0),
            fell_back_at: AtomicU64::new(0),
        }
    }

    pub(crate) fn fell_back(&self) -> bool {
        self.fell_back.load(Ordering::Acquire)
    }

    #[inline(always)]
    pub(crate) fn now(&self) -> u64 {
        let now = if self.fell_back.load(Ordering::Acquire) {
            self.reference_reading()
        } else {
            let now = self.fast_reading();
            if within_check(now, self.checked_at.load(Ordering::Relaxed)) {
                now
            } else {
                self.check_due(now)
            }
        };
        self.per_thread(now)
    }

    #[inline(always)]
    fn fast_reading(&self) -> u64 {
        self.fast
            .now()
            .saturating_sub(self.fast_origin)
            .saturating_add(self.anchor)
    }

    fn reference_reading(&self) -> u64 {
        let since = self
            .reference
            .now()
            .saturating_sub(self.fell_back_at.load(Ordering::Relaxed));
        self.carry_on.load(Ordering::Relaxed).saturating_add(since)
    }

    /// The thread's side of a reading: counts it, checks on the thread's first and every
    /// [`CHECK_EVERY_READS`]-th, and never answers less than the thread's previous reading of
    /// this clock (within [`MAX_HIDDEN_STEP_BACK`]).
    #[inline(always)]
    fn per_thread(&self, now: u64) -> u64 {
        // One thread-local, read once and written once, each access a small closure the
        // compiler keeps inline (a closure holding all of this was called out of line).
        let ThreadReadings { reads, clock, last } = THREAD.with(Cell::get);
        let reads = reads.wrapping_add(1);
        let mut now = now;
        if reads % CHECK_EVERY_READS == 1 && !self.fell_back() {
            now = self.check_on_thread(now);
        }
        let me = self.id;
        if clock == me && now < last && last - now <= MAX_HIDDEN_STEP_BACK {
            now = last;
        }
        let readings = ThreadReadings {
            reads,
            clock: me,
            last: now,
        };
        THREAD.with(|thread| thread.set(readings));
        now
    }

    /// The check a thread makes on its first reading and every [`CHECK_EVERY_READS`]-th, unless
    /// another thread is checking.
    #[cold]
    #[inline(never)]
    fn check_on_thread(&self, now: u64) -> u64 {
        match self.point.try_lock() {
            Ok(point) => self.check(now, point),
            Err(_) => now,
        }
    }

    /// A reading outside the window of the latest check: it is not given out before a check
    /// (this one, or another thread's under way, which it waits for) has vouched for it.
    #[cold]
    #[inline(never)]
    fn check_due(&self, now: u64) -> u64 {
        let point = self.point.lock().unwrap_or_else(PoisonError::into_inner);
        if self.fell_back() {
            return self.reference_reading();
        }
        if within_check(now, self.checked_at.load(Ordering::Relaxed)) {
            // Another thread checked after this reading was taken, and it fits.
            return now;
        }
        self.check(now, point)
    }

    /// Compares the sources (`point` is the checkpoint, held); `now` is the reading that asked.
    /// Answers the reading to give: `now`, or the reference's if the clock has fallen back.
    fn check(&self, now: u64, mut point: MutexGuard<'_, Point>) -> u64 {
        if self.fell_back() {
            return self.reference_reading();
        }
        let before = self.reference.now();
        let fast = self.fast_reading();
        let after = self.reference.now();
        let span = after.saturating_sub(before);
        if span > MAX_CHECK_SPAN {
            // Descheduled between the readings: this comparison proves nothing either way.
            return now;
        }
        let reference = before + span / 2;
        let elapsed = reference.saturating_sub(point.reference);
        // What the reference says the fast clock should read now.
        let expected = point.fast.saturating_add(elapsed);
        let drift = fast.abs_diff(expected);
        let allowed = SLACK + elapsed / RATE_DIVISOR + span / 2;
        if drift <= allowed {
            if elapsed >= RATE_SPAN {
                *point = Point { fast, reference };
            }
            // Vouched for: readings near this one need no check until the next is due. (Only
            // now: a reading taken while this check is under way waits for it.)
            self.checked_at.store(now, Ordering::Relaxed);
            return now;
        }
        // From here on the reference decides, carrying on from the time it counted since the
        // checkpoint; from a little later if the fast clock ran ahead (at most the tolerance, so
        // that readings given out just before do not come out much later than those after, and
        // a jump far ahead is not kept).
        let carry_on = fast.clamp(expected, expected.saturating_add(allowed));
        self.carry_on.store(carry_on, Ordering::Relaxed);
        self.fell_back_at.store(reference, Ordering::Relaxed);
        self.fell_back.store(true, Ordering::Release);
        tracing::warn!(
            drift_ns = drift,
            over_ns = elapsed,
            "the time-stamp counter strayed from CLOCK_MONOTONIC by {drift} ns in {elapsed} ns; \
             the clock reads the operating system's clock from now on"
        );
        self.reference_reading()
    }
}

/// What a thread remembers of its readings of [`Checked`] clocks.
#[derive(Clone, Copy)]
struct ThreadReadings {
    /// How many readings of [`Checked`] clocks this thread made.
    reads: u32,
    /// The id of the [`Checked`] clock that `last` was read from.
    clock: usize,
    /// This thread's latest reading.
    last: u64,
}

thread_local! {
    static THREAD: Cell<ThreadReadings> = const {
        Cell::new(ThreadReadings { reads: 0, clock: 0, last: 0 })
    };
}

/// Whether a fast reading `now` lies within the window a check at `checked_at` vouches for,
/// `[checked_at - SLACK, checked_at + CHECK_EVERY)`; outside it a check is due (or `fast` went
/// back).
#[inline(always)]
fn within_check(now: u64, checked_at: u64) -> bool {
    now.wrapping_sub(checked_at.wrapping_sub(SLACK)) < CHECK_EVERY + SLACK
}

/// Both sources' readings at a checkpoint (`fast` in the reference's time base).
struct Point {
    fast: u64,
    reference: u64,
}

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

/// The CPU's time-stamp counter (feature `quanta`), read as [`SystemClock`] reads it but
/// without its checks against `CLOCK_MONOTONIC`: governor's kind of clock.
///
/// `quanta` measures the counter's rate against the operating system's clock when first used,
/// and falls back to that clock where the counter is not reliable. A counter that jumps, stops
/// or changes rate later goes unnoticed here; `SystemClock` finds it. `BENCHMARKS.md` compares
/// the clocks.
#[cfg(feature = "quanta")]
#[derive(Clone, Debug)]
pub struct QuantaClock(Counter);

#[cfg(feature = "quanta")]
impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self(Counter::new())
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
        self.0.now()
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

    fn checked_pair() -> (ManualClock, ManualClock, Checked<ManualClock, ManualClock>) {
        let fast = ManualClock::new();
        let reference = ManualClock::new();
        reference.set(Duration::from_secs(100));
        let checked = Checked::new(fast.clone(), reference.clone());
        (fast, reference, checked)
    }

    const MS: Duration = Duration::from_millis(1);

    /// A fast clock whose rate is off by 50 ppm (far more than quanta's calibration error) is
    /// kept for a whole simulated day, checked each second.
    #[test]
    fn a_fast_clock_in_step_is_kept_for_a_day() {
        let (fast, reference, checked) = checked_pair();
        let start = checked.now();
        for _ in 0..86_400 {
            reference.advance(Duration::from_secs(1));
            fast.advance(Duration::from_micros(1_000_050));
            let now = checked.now();
            assert!(!checked.fell_back());
            assert_eq!(now - start, saturating_nanos(fast.elapsed()));
        }
    }

    /// Readings never step back, and from the fall back on they move exactly as the reference.
    fn falls_back_and_follows_the_reference<F: Clock>(
        mut advance_fast: impl FnMut(),
        reference: &ManualClock,
        checked: &Checked<F, ManualClock>,
        mut last: u64,
    ) {
        assert!(checked.fell_back());
        for _ in 0..100 {
            let now = checked.now();
            assert!(now >= last, "stepped back from {last} to {now}");
            last = now;
            advance_fast();
            reference.advance(MS);
            assert_eq!(checked.now() - last, 1_000_000, "follows the reference");
            last += 1_000_000;
        }
    }

    #[test]
    fn a_fast_clock_one_percent_fast_is_dropped_within_a_few_checks() {
        let (fast, reference, checked) = checked_pair();
        let mut last = checked.now();
        let mut steps = 0;
        while !checked.fell_back() {
            reference.advance(MS);
            fast.advance(Duration::from_micros(1_010));
            let now = checked.now();
            assert!(now >= last);
            last = now;
            steps += 1;
            assert!(steps <= 60, "1 % fast still trusted after {steps} ms");
        }
        falls_back_and_follows_the_reference(|| fast.advance(MS * 7), &reference, &checked, last);
    }

    /// A clock a test can set anywhere, backwards too (a counter that jumped back).
    #[derive(Clone, Default)]
    struct Settable(Arc<AtomicU64>);

    impl Clock for Settable {
        fn now(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
    }

    #[test]
    fn a_fast_clock_that_jumps_ahead_or_back_is_dropped_at_the_next_reading() {
        for jump_ahead in [true, false] {
            let fast = Settable::default();
            let reference = ManualClock::new();
            reference.set(Duration::from_secs(100));
            let checked = Checked::new(fast.clone(), reference.clone());
            for _ in 0..50 {
                reference.advance(MS);
                fast.0.fetch_add(1_000_000, Ordering::Relaxed);
                checked.now();
            }
            let last = checked.now();
            assert!(!checked.fell_back());
            if jump_ahead {
                fast.0.fetch_add(5_000_000_000, Ordering::Relaxed);
            } else {
                fast.0.store(10_000_000, Ordering::Relaxed);
            }
            let now = checked.now();
            assert!(checked.fell_back(), "jump ahead {jump_ahead}: not found");
            assert!(now >= last, "stepped back from {last} to {now}");
            let next = checked.now();
            assert!(next >= now, "stepped back from {now} to {next}");
            falls_back_and_follows_the_reference(
                || {
                    fast.0.fetch_add(7_000_000, Ordering::Relaxed);
                },
                &reference,
                &checked,
                next,
            );
        }
    }

    #[test]
    fn a_fast_clock_that_stops_is_dropped_after_at_most_a_few_thousand_readings() {
        let (fast, reference, checked) = checked_pair();
        fast.advance(MS);
        reference.advance(MS);
        let last = checked.now();
        let mut readings = 0;
        while !checked.fell_back() {
            reference.advance(Duration::from_micros(1));
            let now = checked.now();
            if !checked.fell_back() {
                assert_eq!(now, last, "stopped");
            }
            readings += 1;
            assert!(
                readings <= CHECK_EVERY_READS,
                "a stopped clock still trusted"
            );
        }
        // It carries on from the time the reference counted, not from where it stood still.
        let now = checked.now();
        assert!(now >= last + saturating_nanos(Duration::from_micros(u64::from(readings))) - 1_000);
        falls_back_and_follows_the_reference(|| fast.advance(MS * 7), &reference, &checked, now);
    }

    /// A check between whose two reference readings the thread was descheduled is skipped: a
    /// reference that moves 1 ms while being read twice proves nothing.
    #[test]
    fn a_check_interrupted_by_the_scheduler_is_not_trusted() {
        struct Jumpy {
            clock: ManualClock,
            reads: AtomicU64,
        }
        impl Clock for Jumpy {
            fn now(&self) -> u64 {
                // Making the clock reads the reference twice, then each check reads it twice;
                // the second reading of each check comes 1 ms after the first.
                let n = self.reads.fetch_add(1, Ordering::Relaxed);
                if n >= 3 && n % 2 == 1 {
                    self.clock.advance(MS);
                }
                self.clock.now()
            }
        }
        let fast = ManualClock::new();
        let reference = ManualClock::new();
        let checked = Checked::new(
            fast.clone(),
            Jumpy {
                clock: reference.clone(),
                reads: AtomicU64::new(0),
            },
        );
        for _ in 0..100 {
            fast.advance(MS * 20);
            checked.now();
            assert!(!checked.fell_back());
        }
    }

    /// The clock reads the time `Instant` reads, within the check's tolerance, and never goes
    /// back on a thread, from four threads at once.
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
                        // The counter is measured against the same clock to within a few
                        // microseconds; allow the check's own slack.
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
        assert!(SystemClock::new().reads_counter() || cfg!(not(target_arch = "x86_64")));
    }
}

/// Attacks on the checked counter, written from the docs of [`SystemClock`] before reading
/// [`Checked`]: drift at and around the tolerance, oscillation, small and large jumps, readings
/// at the ends of the range, preemption at every point of a check, threads racing a fall back,
/// and the number of checks under eight threads.
#[cfg(test)]
mod attack_tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Barrier;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;
    const SEC: u64 = 1_000_000_000;

    /// A clock a test sets anywhere, backwards and across `u64::MAX` too.
    #[derive(Clone, Default)]
    struct Wild(Arc<AtomicU64>);

    impl Wild {
        fn at(nanos: u64) -> Self {
            Self(Arc::new(AtomicU64::new(nanos)))
        }
        fn add(&self, by: u64) {
            self.0.fetch_add(by, Ordering::AcqRel); // wraps
        }
        fn set(&self, to: u64) {
            self.0.store(to, Ordering::Release);
        }
    }

    impl Clock for Wild {
        fn now(&self) -> u64 {
            self.0.load(Ordering::Acquire)
        }
    }

    /// A counter at 1 s and a reference at 100 s (both set by the test), and the clock that
    /// checks the one against the other.
    fn wild_pair() -> (Wild, Wild, Checked<Wild, Wild>) {
        let (fast, reference) = (Wild::at(SEC), Wild::at(100 * SEC));
        let checked = Checked::new(fast.clone(), reference.clone());
        (fast, reference, checked)
    }

    /// Readings of a checked clock on one thread: never back.
    struct Reader<'a, F: Clock, R: Clock> {
        checked: &'a Checked<F, R>,
        last: u64,
    }

    impl<'a, F: Clock, R: Clock> Reader<'a, F, R> {
        fn new(checked: &'a Checked<F, R>) -> Self {
            let last = checked.now();
            Self { checked, last }
        }
        fn read(&mut self) -> u64 {
            let now = self.checked.now();
            assert!(now >= self.last, "stepped back from {} to {now}", self.last);
            self.last = now;
            now
        }
    }

    /// Drives a fast clock that runs `ppm_fast` parts per million fast (negative: slow) against
    /// the reference in steps of `step` ns, for at most `span` ns of reference time; returns the
    /// reference time at which the fall back was found, if it was, checking monotonicity and
    /// that, until it is found, the clock tells the fast clock's time.
    fn drive_rate(ppm_fast: i64, step: u64, span: u64) -> Option<u64> {
        let fast = Wild::at(7 * SEC);
        let reference = Wild::at(100 * SEC);
        let checked = Checked::new(fast.clone(), reference.clone());
        let mut reader = Reader::new(&checked);
        let start = reader.last;
        let mut elapsed = 0u64;
        let mut fast_elapsed = 0u64;
        while elapsed < span {
            elapsed += step;
            let target =
                (i128::from(elapsed) * (1_000_000 + i128::from(ppm_fast)) / 1_000_000) as u64;
            fast.add(target - fast_elapsed);
            fast_elapsed = target;
            reference.add(step);
            let now = reader.read();
            if checked.fell_back() {
                return Some(elapsed);
            }
            assert_eq!(
                now - start,
                fast_elapsed,
                "reads the fast clock while trusted"
            );
        }
        None
    }

    #[test]
    fn a_fast_clock_off_by_less_than_the_tolerance_is_kept_for_ten_minutes() {
        for ppm in [900, -900, 500, -500] {
            assert_eq!(
                drive_rate(ppm, MS, 600 * SEC),
                None,
                "{ppm} ppm off, within 0.2 ms + 0.1 % of any span, was dropped"
            );
        }
    }

    /// 0.15 % fast or slow exceeds 0.2 ms + 0.1 % after 0.4 s of a checkpoint; 0.5 % after
    /// 50 ms; 2 % after about 10 ms. Each is found within one check interval of that.
    #[test]
    fn a_fast_clock_beyond_the_tolerance_is_dropped_when_it_exceeds_it() {
        for (ppm, by) in [
            (1_500, 420 * MS),
            (-1_500, 420 * MS),
            (5_000, 62 * MS),
            (-5_000, 62 * MS),
            (20_000, 22 * MS),
            (-20_000, 22 * MS),
        ] {
            let found = drive_rate(ppm, 100 * US, 5 * SEC);
            assert!(
                found.is_some_and(|at| at <= by),
                "{ppm} ppm off: found at {found:?} ns of reference time, expected by {by}"
            );
        }
    }

    /// 0.13 % exceeds 0.2 ms + 0.1 % after 0.67 s, within the one second a checkpoint lives.
    #[test]
    fn a_fast_clock_0_13_percent_off_is_dropped_within_a_checkpoint() {
        for ppm in [1_300, -1_300] {
            let found = drive_rate(ppm, MS, 60 * SEC);
            assert!(
                found.is_some_and(|at| at <= 700 * MS),
                "{ppm} ppm off: found at {found:?}"
            );
        }
    }

    /// Fast by 0.5 % for 100 ms, then slow by 0.5 % for 100 ms: no net drift, but 0.5 ms astray
    /// in the middle, well beyond 0.2 ms + 0.1 % of 100 ms.
    #[test]
    fn a_fast_clock_that_oscillates_beyond_the_tolerance_is_dropped() {
        let fast = Wild::at(0);
        let reference = Wild::at(100 * SEC);
        let checked = Checked::new(fast.clone(), reference.clone());
        let mut reader = Reader::new(&checked);
        let mut found = None;
        'outer: for period in 0..10u64 {
            for i in 0..2_000u64 {
                reference.add(100 * US);
                fast.add(if (i / 1_000) % 2 == 0 {
                    100_500
                } else {
                    99_500
                });
                reader.read();
                if checked.fell_back() {
                    found = Some(period * 200 + i / 10);
                    break 'outer;
                }
            }
        }
        assert!(
            found.is_some_and(|ms| ms <= 70),
            "0.5 % oscillation found after {found:?} ms"
        );
    }

    /// Fast then slow by 0.05 %, 100 ms each, for a minute: in step, kept.
    #[test]
    fn a_fast_clock_that_oscillates_within_the_tolerance_is_kept() {
        let fast = Wild::at(0);
        let reference = Wild::at(100 * SEC);
        let checked = Checked::new(fast.clone(), reference.clone());
        let mut reader = Reader::new(&checked);
        for i in 0..600_000u64 {
            reference.add(100 * US);
            fast.add(if (i / 1_000) % 2 == 0 {
                100_050
            } else {
                99_950
            });
            reader.read();
            assert!(!checked.fell_back(), "dropped after {i} steps");
        }
    }

    /// A counter that jumps back by less than a check interval: readings must not step back
    /// (`Clock`: "Implementations must never go backwards"), and the jump is found.
    #[test]
    fn a_fast_clock_that_jumps_back_a_little_never_steps_back() {
        for back in [US, 300 * US, 3 * MS, 9 * MS, 11 * MS] {
            let (fast, reference, checked) = wild_pair();
            let mut reader = Reader::new(&checked);
            for _ in 0..1_000 {
                fast.add(50 * US);
                reference.add(50 * US);
                reader.read();
            }
            assert!(!checked.fell_back());
            fast.set(fast.now() - back);
            let mut steps = 0;
            while !checked.fell_back() && steps < 10_000 {
                fast.add(10 * US);
                reference.add(10 * US);
                reader.read();
                steps += 1;
            }
            if back > SLACK {
                assert!(checked.fell_back(), "a jump back of {back} ns not found");
            }
            for _ in 0..100 {
                fast.add(10 * US);
                reference.add(10 * US);
                reader.read();
            }
        }
    }

    /// A counter that jumps an hour ahead: the clock may not tell a time far from the
    /// reference's for more than about a check interval, and never steps back.
    #[test]
    fn a_fast_clock_that_jumps_an_hour_ahead_does_not_carry_the_hour() {
        let (fast, reference, checked) = wild_pair();
        let mut reader = Reader::new(&checked);
        let start = reader.last;
        for _ in 0..100 {
            fast.add(MS);
            reference.add(MS);
            reader.read();
        }
        fast.add(3_600 * SEC);
        for _ in 0..100 {
            fast.add(MS);
            reference.add(MS);
            let now = reader.read();
            let told = now - start;
            let counted = reference.now() - 100 * SEC;
            assert!(
                told <= counted + CHECK_EVERY + SLACK,
                "told {told} ns since the start, the reference counted {counted}"
            );
        }
        assert!(checked.fell_back());
    }

    /// A counter that jumps to the end of the range (a garbage counter value, scaled): found,
    /// and no reading after it steps back.
    #[test]
    fn a_fast_clock_that_jumps_to_the_end_of_the_range_never_steps_back() {
        let (fast, reference, checked) = wild_pair();
        let mut reader = Reader::new(&checked);
        for _ in 0..20 {
            fast.add(MS);
            reference.add(MS);
            reader.read();
        }
        fast.set(u64::MAX - MS);
        for _ in 0..20 {
            fast.add(US);
            reference.add(MS);
            reader.read();
        }
        assert!(checked.fell_back());
    }

    /// The reference and the counter jump together (a VM paused and resumed, both counting):
    /// in step, kept. The reference alone jumps: the counter is astray, dropped, no step back.
    #[test]
    fn a_reference_that_jumps() {
        let (fast, reference, checked) = wild_pair();
        let mut reader = Reader::new(&checked);
        for _ in 0..100 {
            fast.add(MS);
            reference.add(MS);
            reader.read();
            fast.add(5 * SEC);
            reference.add(5 * SEC);
            reader.read();
        }
        assert!(
            !checked.fell_back(),
            "dropped a counter that jumped with the reference"
        );
        reference.add(5 * SEC);
        for _ in 0..5_000 {
            fast.add(US);
            reference.add(US);
            reader.read();
        }
        assert!(
            checked.fell_back(),
            "reference 5 s ahead of the counter, not found"
        );
    }

    /// Readings at the ends of the range: a counter near 2^62 and beyond; a reference
    /// saturating at `u64::MAX`. No panic (debug builds check overflow), no step back.
    #[test]
    fn readings_at_the_ends_of_the_range() {
        // Counter and reference near MAX_NOW and beyond, in step: kept.
        for origin in [MAX_NOW - 5 * MS, MAX_NOW, MAX_NOW + MS, u64::MAX / 2] {
            let fast = Wild::at(origin);
            let reference = Wild::at(origin + 100 * SEC);
            let checked = Checked::new(fast.clone(), reference.clone());
            let mut reader = Reader::new(&checked);
            for _ in 0..50 {
                fast.add(MS);
                reference.add(MS);
                reader.read();
            }
            assert!(!checked.fell_back(), "origin {origin}: in step, dropped");
        }
        // Reference near u64::MAX, saturating there (as `monotonic_nanos` does).
        let fast = Wild::at(SEC);
        let reference = ManualClock::new();
        reference.set(Duration::from_nanos(u64::MAX - 20 * MS));
        let checked = Checked::new(fast.clone(), reference.clone());
        let mut reader = Reader::new(&checked);
        for _ in 0..5_000 {
            fast.add(10 * US);
            reference.advance(Duration::from_micros(10));
            reader.read();
        }
        // Both at zero, counter running, reference stuck at zero.
        let fast = Wild::at(0);
        let reference = Wild::at(0);
        let checked = Checked::new(fast.clone(), reference.clone());
        let mut reader = Reader::new(&checked);
        for _ in 0..5_000 {
            fast.add(10 * US);
            reader.read();
        }
        assert!(
            checked.fell_back(),
            "a reference standing still while the counter ran"
        );
    }

    /// The fast clock reads more than the reference when the checked clock is made (the anchor
    /// would be negative): in step, it must be kept. Not reachable through `SystemClock`, whose
    /// counter starts at zero against a boot-time `CLOCK_MONOTONIC`.
    #[test]
    fn a_fast_clock_ahead_of_the_reference_at_construction_is_kept() {
        let fast = Wild::at(200 * SEC);
        let reference = Wild::at(100 * SEC);
        let checked = Checked::new(fast.clone(), reference.clone());
        let mut reader = Reader::new(&checked);
        for _ in 0..50 {
            fast.add(MS);
            reference.add(MS);
            reader.read();
        }
        assert!(!checked.fell_back(), "in step, dropped");
    }

    /// Both clocks in step; the thread that makes the checked clock is descheduled between its
    /// reference reading and its fast reading (both clocks move 5 ms): the counter in step must
    /// be kept. For `SystemClock` this is the first `SystemClock` of the process.
    #[test]
    fn a_pause_while_the_checked_clock_is_made_does_not_drop_a_counter_in_step() {
        struct PausesOnce {
            inner: Wild,
            other: Wild,
            paused: AtomicBool,
        }
        impl Clock for PausesOnce {
            fn now(&self) -> u64 {
                let value = self.inner.now();
                if !self.paused.swap(true, Ordering::Relaxed) {
                    self.inner.add(5 * MS);
                    self.other.add(5 * MS);
                }
                value
            }
        }
        let fast = Wild::at(SEC);
        let reference = Wild::at(100 * SEC);
        let checked = Checked::new(
            fast.clone(),
            PausesOnce {
                inner: reference.clone(),
                other: fast.clone(),
                paused: AtomicBool::new(false),
            },
        );
        let mut reader = Reader::new(&checked);
        for _ in 0..100 {
            fast.add(MS);
            reference.add(MS);
            reader.read();
        }
        assert!(!checked.fell_back(), "in step, dropped");
    }

    /// Both clocks in step, but the checking thread is descheduled (both clocks move 5 ms, or
    /// 300 ms) right after its `k`-th clock reading, for every `k` through the first checks:
    /// a counter in step is never dropped, whichever reading the pause follows.
    #[test]
    fn a_pause_after_any_reading_of_a_check_never_drops_a_counter_in_step() {
        struct Paused {
            inner: Wild,
            both: [Wild; 2],
            reads: Arc<AtomicU64>,
            pause_after: u64,
            pause: u64,
        }
        impl Clock for Paused {
            fn now(&self) -> u64 {
                let value = self.inner.now();
                if self.reads.fetch_add(1, Ordering::Relaxed) == self.pause_after {
                    for clock in &self.both {
                        clock.add(self.pause);
                    }
                }
                value
            }
        }
        let mut dropped = Vec::new();
        for pause in [5 * MS, 300 * MS] {
            for step in [20 * MS, 10 * US] {
                for pause_after in 1..120 {
                    let fast = Wild::at(SEC);
                    let reference = Wild::at(100 * SEC);
                    let reads = Arc::new(AtomicU64::new(0));
                    let make = |inner: &Wild| Paused {
                        inner: inner.clone(),
                        both: [fast.clone(), reference.clone()],
                        reads: reads.clone(),
                        pause_after,
                        pause,
                    };
                    let checked = Checked::new(make(&fast), make(&reference));
                    let mut reader = Reader::new(&checked);
                    for _ in 0..if step > MS { 60 } else { 20_000 } {
                        fast.add(step);
                        reference.add(step);
                        reader.read();
                    }
                    if checked.fell_back() {
                        dropped.push((pause, step, pause_after));
                    }
                }
            }
        }
        assert!(
            dropped.is_empty(),
            "in step, dropped after a pause (pause ns, step ns, clock reading): {dropped:?}"
        );
    }

    /// Eight threads read while a counter in step turns 1 % fast, then jumps back a second:
    /// no thread's readings step back, before, during or after the fall back.
    #[test]
    fn threads_reading_through_a_fall_back_never_step_back() {
        for jump_back in [false, true] {
            let (fast, reference, checked) = wild_pair();
            let checked = Arc::new(checked);
            let stop = Arc::new(AtomicBool::new(false));
            let readers: Vec<_> = (0..8)
                .map(|_| {
                    let (checked, stop) = (checked.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut reader = Reader::new(&checked);
                        let mut n = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            reader.read();
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            for i in 0..200_000u64 {
                reference.add(US);
                if i < 50_000 {
                    fast.add(US);
                } else {
                    fast.add(US + 10);
                }
                if jump_back && i == 100_000 {
                    fast.set(fast.now() - SEC);
                }
                if i % 64 == 0 {
                    std::thread::yield_now();
                }
            }
            stop.store(true, Ordering::Relaxed);
            for reader in readers {
                reader.join().expect("a reader stepped back or panicked");
            }
            assert!(checked.fell_back());
        }
    }

    /// A thread takes a check on a counter that jumped a second ahead and is descheduled in
    /// the middle of it (before its reference readings, or between them while the counter runs
    /// on); meanwhile another thread reads the counter (and may wait for the check). When the
    /// first finds the jump and falls back, the other's next reading must not step back.
    fn race_a_reading_against_a_check(block_on_read: u64) -> (u64, u64) {
        struct Gate {
            inner: Wild,
            /// Reads left before the gate closes; `u64::MAX` when disarmed.
            arm: AtomicU64,
            entered: mpsc::SyncSender<()>,
            release: Mutex<mpsc::Receiver<()>>,
        }
        impl Clock for Gate {
            fn now(&self) -> u64 {
                let value = self.inner.now();
                if self.arm.load(Ordering::Acquire) != u64::MAX
                    && self.arm.fetch_sub(1, Ordering::AcqRel) == 1
                {
                    self.entered.send(()).unwrap();
                    self.release.lock().unwrap().recv().unwrap();
                }
                value
            }
        }
        let (entered_tx, entered_rx) = mpsc::sync_channel(1);
        let (release_tx, release_rx) = mpsc::channel();
        let fast = Wild::at(SEC);
        let reference = Wild::at(100 * SEC);
        let checked = Arc::new(Checked::new(
            fast.clone(),
            Gate {
                inner: reference.clone(),
                arm: AtomicU64::new(u64::MAX),
                entered: entered_tx,
                release: Mutex::new(release_rx),
            },
        ));
        let barrier = Arc::new(Barrier::new(2));
        let other = {
            let (checked, barrier) = (checked.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut reader = Reader::new(&checked);
                barrier.wait(); // 1: in step
                barrier.wait(); // 2: the checker is inside its check
                let ahead = reader.read();
                barrier.wait(); // 3: read while the check was under way
                barrier.wait(); // 4: the checker fell back
                let after = checked.now();
                (ahead, after)
            })
        };
        let mut reader = Reader::new(&checked);
        for _ in 0..100 {
            fast.add(MS);
            reference.add(MS);
            reader.read();
        }
        barrier.wait(); // 1
        fast.add(SEC);
        checked
            .reference
            .arm
            .store(block_on_read, Ordering::Release);
        let checker = {
            let checked = checked.clone();
            std::thread::spawn(move || checked.now())
        };
        entered_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("setup: the checker never read the reference");
        // The counter runs on while the checker is descheduled; the reference is not read.
        fast.add(5 * MS);
        barrier.wait(); // 2
                        // The other thread's reading may wait for the check under way (a reading outside the
                        // latest check's window is not given out unchecked): let the checker go on after a
                        // while, as the scheduler would.
        std::thread::sleep(Duration::from_millis(50));
        release_tx.send(()).unwrap();
        barrier.wait(); // 3
        checker.join().unwrap();
        assert!(checked.fell_back(), "a counter a second ahead not found");
        barrier.wait(); // 4
        other.join().expect("no panic")
    }

    #[test]
    fn a_reading_taken_before_a_checks_reference_readings_does_not_step_back() {
        let (ahead, after) = race_a_reading_against_a_check(1);
        assert!(after >= ahead, "stepped back from {ahead} to {after}");
    }

    #[test]
    fn a_reading_taken_between_a_checks_reference_readings_does_not_step_back() {
        let (ahead, after) = race_a_reading_against_a_check(2);
        assert!(after >= ahead, "stepped back from {ahead} to {after}");
    }

    /// A counter that stops, read by many short-lived threads (a thread per connection), each
    /// reading fewer than 4096 times: the docs promise the counter "can make a limit wrong for at
    /// most about one check interval".
    #[test]
    fn a_stopped_counter_read_by_short_lived_threads_is_dropped() {
        let (fast, reference, checked) = wild_pair();
        let checked = Arc::new(checked);
        for _ in 0..100 {
            fast.add(MS);
            reference.add(MS);
            checked.now();
        }
        for _ in 0..200 {
            let (checked, reference) = (checked.clone(), reference.clone());
            std::thread::spawn(move || {
                for _ in 0..1_000 {
                    reference.add(US);
                    checked.now();
                }
            })
            .join()
            .unwrap();
        }
        assert!(
            checked.fell_back(),
            "stopped for 200 ms of reference time over 200 000 readings, still trusted"
        );
    }

    /// Eight threads read as fast as they can for a second, counter in step (both clocks read
    /// `Instant`): the counter is kept, and the check runs about once per 10 ms plus once per
    /// 4096 readings of a thread, not once per reading.
    #[test]
    fn eight_threads_reading_flat_out_check_about_once_per_interval() {
        struct Mono(Instant);
        impl Clock for Mono {
            fn now(&self) -> u64 {
                saturating_nanos(self.0.elapsed())
            }
        }
        struct Counting(Mono, Arc<AtomicU64>);
        impl Clock for Counting {
            fn now(&self) -> u64 {
                self.1.fetch_add(1, Ordering::Relaxed);
                self.0.now()
            }
        }
        let counted = Arc::new(AtomicU64::new(0));
        let checked = Arc::new(Checked::new(
            Mono(Instant::now()),
            Counting(Mono(Instant::now()), counted.clone()),
        ));
        let base = counted.load(Ordering::Relaxed);
        let started = Instant::now();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let checked = checked.clone();
                std::thread::spawn(move || {
                    let mut reader = Reader::new(&checked);
                    let begin = Instant::now();
                    let mut n = 0u64;
                    while begin.elapsed() < Duration::from_secs(1) {
                        reader.read();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let readings: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let elapsed = started.elapsed();
        let reference_reads = counted.load(Ordering::Relaxed) - base;
        assert!(
            !checked.fell_back(),
            "a counter in step (Instant itself) dropped"
        );
        let intervals = saturating_nanos(elapsed) / CHECK_EVERY + 1;
        let expected_checks = intervals + readings / u64::from(CHECK_EVERY_READS) + 8;
        // A check reads the reference a few times; allow three reads and racing threads twice.
        assert!(
            reference_reads <= 6 * expected_checks,
            "{reference_reads} reference reads for {readings} readings over {elapsed:?} \
             (about {expected_checks} checks expected)"
        );
        assert!(readings > 100_000, "only {readings} readings");
    }
}
