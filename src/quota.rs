//! How much a limiter admits: a number of permits per period, a burst, and an optional wait.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// A rate: `permits` per `period`, with a `burst` and an optional `max_wait`.
///
/// The names say what they mean: [`Quota::per_second(10)`](Quota::per_second) is ten permits per
/// second. Every constructor validates its input and returns a [`QuotaError`] naming the field
/// that was wrong; nothing here panics.
///
/// # Bounds
///
/// Every algorithm, in memory and in the Redis scripts (which compute in microseconds with Lua
/// numbers, exact below 2^53), must compute every instant and count exactly. So:
///
/// * `period` is at most [`MAX_SPAN`](Self::MAX_SPAN) (2^60 ns, about 36.5 years);
/// * `burst` × the emission interval is at most `2 · MAX_SPAN` (about 73 years);
/// * `max_wait` is at most `MAX_SPAN`, and the permits it can hold,
///   `permits · (max_wait / period + 2)`, stay below [`MAX_PERMITS`](Self::MAX_PERMITS) (2^53).
///
/// Together with clock readings clamped to 2^62 ns (about 146 years after the clock's origin),
/// every sum an algorithm forms stays below 2^64 (and, in microseconds after the Unix epoch,
/// below 2^53), so nothing wraps, saturates into a wrong answer or loses precision.
///
/// ```
/// use std::time::Duration;
/// use tower_bulwark::Quota;
///
/// let quota = Quota::per_second(10)?
///     .with_burst(20)?
///     .with_max_wait(Duration::from_millis(250))?;
/// assert_eq!(quota.permits(), 10);
/// assert_eq!(quota.burst(), 20);
/// assert_eq!(quota.emission_interval(), Duration::from_millis(100));
/// # Ok::<(), tower_bulwark::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    permits: u32,
    period_nanos: u64,
    burst: u32,
    max_wait_nanos: u64,
}

impl Quota {
    /// The longest `period` and `max_wait`: 2^60 ns (about 36.5 years).
    pub const MAX_SPAN: Duration = Duration::from_nanos(MAX_SPAN_NANOS);

    /// The most permits a key may owe at once (granted plus reserved): 2^53.
    pub const MAX_PERMITS: u64 = 1 << 53;

    /// `permits` per second.
    pub fn per_second(permits: u32) -> Result<Self, QuotaError> {
        Self::with_period(permits, Duration::from_secs(1))
    }

    /// `permits` per minute.
    pub fn per_minute(permits: u32) -> Result<Self, QuotaError> {
        Self::with_period(permits, Duration::from_secs(60))
    }

    /// `permits` per hour.
    pub fn per_hour(permits: u32) -> Result<Self, QuotaError> {
        Self::with_period(permits, Duration::from_secs(3600))
    }

    /// `permits` per day (86 400 seconds).
    pub fn per_day(permits: u32) -> Result<Self, QuotaError> {
        Self::with_period(permits, Duration::from_secs(86_400))
    }

    /// `permits` per `period`. The burst defaults to `permits`, the maximum wait to zero.
    ///
    /// # Errors
    ///
    /// A [`QuotaError`] naming the field when `permits` is zero or `period` is zero or longer
    /// than [`MAX_SPAN`](Self::MAX_SPAN). The `per_*` shorthands fail the same way.
    pub fn with_period(permits: u32, period: Duration) -> Result<Self, QuotaError> {
        if permits == 0 {
            return Err(QuotaError::new("permits", "must be at least 1"));
        }
        if period.is_zero() {
            return Err(QuotaError::new("period", "must be longer than zero"));
        }
        let period_nanos = span_nanos("period", period)?;
        let quota = Self {
            permits,
            period_nanos,
            burst: permits,
            max_wait_nanos: 0,
        };
        quota.check_burst(permits)?;
        Ok(quota)
    }

    /// Sets how many permits may be taken at once after an idle spell (GCRA's bucket size).
    ///
    /// The window algorithms admit `permits` per window and ignore the burst.
    ///
    /// # Errors
    ///
    /// A [`QuotaError`] for `burst` when it is zero, or when `burst` emission intervals last
    /// longer than 2^61 ns (about 73 years).
    pub fn with_burst(mut self, burst: u32) -> Result<Self, QuotaError> {
        if burst == 0 {
            return Err(QuotaError::new("burst", "must be at least 1"));
        }
        self.check_burst(burst)?;
        self.burst = burst;
        Ok(self)
    }

    /// Sets how long a caller of an `acquire` method may wait for a permit.
    ///
    /// Zero (the default) refuses at once. A request whose permit would arrive later than
    /// `max_wait` is refused at once and reserves nothing.
    ///
    /// At most [`MAX_SPAN`](Self::MAX_SPAN), and short enough that the permits it can hold,
    /// `permits · (max_wait / period + 2)`, stay below [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// # Errors
    ///
    /// A [`QuotaError`] for `max_wait` when either bound is passed.
    pub fn with_max_wait(mut self, max_wait: Duration) -> Result<Self, QuotaError> {
        let nanos = span_nanos("max_wait", max_wait)?;
        let held = (u128::from(nanos / self.period_nanos) + 2) * u128::from(self.permits);
        if held > u128::from(Self::MAX_PERMITS) {
            return Err(QuotaError::new(
                "max_wait",
                "holds too many permits: permits · (max_wait / period + 2) must be at most 2^53",
            ));
        }
        self.max_wait_nanos = nanos;
        Ok(self)
    }

    fn check_burst(&self, burst: u32) -> Result<(), QuotaError> {
        self.emission_interval_nanos()
            .checked_mul(u64::from(burst))
            .filter(|&h| h <= 2 * MAX_SPAN_NANOS)
            .map(|_| ())
            .ok_or_else(|| {
                QuotaError::new(
                    "burst",
                    "times the emission interval is too long (at most 2^61 ns, about 73 years)",
                )
            })
    }

    /// Permits per period.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The period over which [`permits`](Self::permits) are granted (the window of the window
    /// algorithms).
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_nanos)
    }

    /// The burst: how many permits GCRA grants at once after an idle spell.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// How long an `acquire` may wait for a permit; zero refuses at once.
    pub fn max_wait(&self) -> Duration {
        Duration::from_nanos(self.max_wait_nanos)
    }

    /// The time one permit takes to replenish: `period / permits`, rounded up to the nanosecond so
    /// that the limiter never admits more than its stated rate.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.emission_interval_nanos())
    }

    pub(crate) fn period_nanos(&self) -> u64 {
        self.period_nanos
    }

    pub(crate) fn max_wait_nanos(&self) -> u64 {
        self.max_wait_nanos
    }

    pub(crate) fn emission_interval_nanos(&self) -> u64 {
        self.period_nanos.div_ceil(u64::from(self.permits))
    }
}

/// [`Quota::MAX_SPAN`] in nanoseconds.
const MAX_SPAN_NANOS: u64 = 1 << 60;

/// `span` in nanoseconds, or the error naming `field` when it is longer than
/// [`Quota::MAX_SPAN`].
fn span_nanos(field: &'static str, span: Duration) -> Result<u64, QuotaError> {
    let too_long = QuotaError::new(field, "is too long (at most 2^60 ns, about 36.5 years)");
    let nanos = u64::try_from(span.as_nanos()).ok();
    nanos.filter(|&n| n <= MAX_SPAN_NANOS).ok_or(too_long)
}

/// A quota value that cannot be used, naming the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaError {
    field: &'static str,
    reason: &'static str,
}

impl QuotaError {
    pub(crate) fn new(field: &'static str, reason: &'static str) -> Self {
        Self { field, reason }
    }

    /// The name of the field that was wrong (`permits`, `period`, `burst` or `max_wait`).
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid quota: `{}` {}", self.field, self.reason)
    }
}

impl Error for QuotaError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_constructors_mean_what_they_say() {
        let q = Quota::per_second(10).unwrap();
        assert_eq!(q.permits(), 10);
        assert_eq!(q.period(), Duration::from_secs(1));
        assert_eq!(q.burst(), 10);
        assert_eq!(q.max_wait(), Duration::ZERO);
        assert_eq!(q.emission_interval(), Duration::from_millis(100));
        assert_eq!(
            Quota::per_minute(60).unwrap().emission_interval(),
            Duration::from_secs(1)
        );
        assert_eq!(
            Quota::per_hour(1).unwrap().period(),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn interval_rounds_up_so_the_rate_is_never_exceeded() {
        let q = Quota::per_second(3).unwrap();
        assert_eq!(q.emission_interval_nanos(), 333_333_334);
    }

    #[test]
    fn invalid_values_name_their_field() {
        let cases: Vec<(Result<Quota, QuotaError>, &str)> = vec![
            (Quota::per_second(0), "permits"),
            (Quota::with_period(1, Duration::ZERO), "period"),
            (Quota::with_period(1, Duration::MAX), "period"),
            (Quota::per_second(1).and_then(|q| q.with_burst(0)), "burst"),
            (
                Quota::with_period(1, Quota::MAX_SPAN).and_then(|q| q.with_burst(u32::MAX)),
                "burst",
            ),
            (
                Quota::per_second(1).and_then(|q| q.with_max_wait(Duration::MAX)),
                "max_wait",
            ),
            // Issue 11, item 10: absurd periods were accepted and broke the arithmetic.
            (
                Quota::with_period(1, Duration::from_nanos(u64::MAX)),
                "period",
            ),
            (
                Quota::with_period(1, Quota::MAX_SPAN + Duration::from_nanos(1)),
                "period",
            ),
            (
                Quota::with_period(1, Duration::from_secs(300 * 365 * 86_400)),
                "period",
            ),
            (
                Quota::with_period(1, Quota::MAX_SPAN).and_then(|q| q.with_burst(3)),
                "burst",
            ),
            (
                Quota::per_second(1)
                    .and_then(|q| q.with_max_wait(Quota::MAX_SPAN + Duration::from_nanos(1))),
                "max_wait",
            ),
            (
                Quota::with_period(u32::MAX, Duration::from_nanos(1))
                    .and_then(|q| q.with_max_wait(Duration::from_millis(10))),
                "max_wait",
            ),
        ];
        for (result, field) in cases {
            let err = result.expect_err(field);
            assert_eq!(err.field(), field);
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn the_bounds_themselves_are_accepted() {
        let q = Quota::with_period(1, Quota::MAX_SPAN).unwrap();
        assert_eq!(q.period(), Quota::MAX_SPAN);
        let q = q
            .with_burst(2)
            .unwrap()
            .with_max_wait(Quota::MAX_SPAN)
            .unwrap();
        assert_eq!(q.max_wait(), Quota::MAX_SPAN);
        // With the period equal to the bound, rounding the interval up never trips the burst
        // bound for the default burst.
        assert!(Quota::with_period(u32::MAX, Quota::MAX_SPAN).is_ok());
        assert!(Quota::with_period(3, Quota::MAX_SPAN).is_ok());
        // 2^53 permits held is the limit, inclusive.
        let q = Quota::with_period(1 << 20, Duration::from_nanos(1)).unwrap();
        assert!(q.with_max_wait(Duration::from_nanos((1 << 33) - 2)).is_ok());
        assert!(q
            .with_max_wait(Duration::from_nanos((1 << 33) - 1))
            .is_err());
    }
}
