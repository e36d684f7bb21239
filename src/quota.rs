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

    /// `permits` per `period`. The burst defaults to `permits`, the maximum wait to zero.
    pub fn with_period(permits: u32, period: Duration) -> Result<Self, QuotaError> {
        if permits == 0 {
            return Err(QuotaError::new("permits", "must be at least 1"));
        }
        if period.is_zero() {
            return Err(QuotaError::new("period", "must be longer than zero"));
        }
        let period_nanos = u64::try_from(period.as_nanos())
            .map_err(|_| QuotaError::new("period", "is too long (at most about 584 years)"))?;
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
    pub fn with_max_wait(mut self, max_wait: Duration) -> Result<Self, QuotaError> {
        self.max_wait_nanos = u64::try_from(max_wait.as_nanos())
            .map_err(|_| QuotaError::new("max_wait", "is too long (at most about 584 years)"))?;
        Ok(self)
    }

    fn check_burst(&self, burst: u32) -> Result<(), QuotaError> {
        self.emission_interval_nanos()
            .checked_mul(u64::from(burst))
            .map(|_| ())
            .ok_or_else(|| {
                QuotaError::new("burst", "times the emission interval overflows 584 years")
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
                Quota::with_period(1, Duration::from_secs(u64::MAX / 2_000_000_000))
                    .and_then(|q| q.with_burst(u32::MAX)),
                "burst",
            ),
            (
                Quota::per_second(1).and_then(|q| q.with_max_wait(Duration::MAX)),
                "max_wait",
            ),
        ];
        for (result, field) in cases {
            let err = result.expect_err(field);
            assert_eq!(err.field(), field);
            assert!(err.to_string().contains(field), "{err}");
        }
    }
}
