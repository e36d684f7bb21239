//! The error of a call the breaker refused, and of a breaker's bad setting.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A call that was not sent because the circuit breaker in front of the dependency was open
/// (or half-open with all its probes out).
///
/// The services fail with [`BoxError`](crate::BoxError); test for it with
/// `err.is::<BreakerOpen>()`. The call reached nothing; it may be sent again after
/// [`retry_after`](Self::retry_after), which
/// [`outbound::retry_after`](crate::outbound::retry_after) reads too.
///
/// With the `grpc` feature, its [`source`](std::error::Error::source) is a `tonic::Status` of
/// `UNAVAILABLE` with the wait in a `RetryInfo` and `grpc-retry-pushback-ms`: a tonic client
/// behind the breaker gets that status back from the call, where any other error would be
/// `UNKNOWN`.
#[derive(Clone, Debug)]
pub struct BreakerOpen {
    pub(super) breaker: Arc<str>,
    pub(super) retry_after: Duration,
    #[cfg(feature = "grpc")]
    pub(super) status: crate::rate_limit::grpc::LazyStatus,
}

impl BreakerOpen {
    /// The name of the breaker that refused the call.
    pub fn breaker(&self) -> &str {
        &self.breaker
    }

    /// How long from the refusal until the breaker lets a call through: the rest of its open
    /// time, or, refused while the half-open probes are out, `open_for` (if they fail, it opens
    /// for that long again; if they succeed, calls go sooner).
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

impl fmt::Display for BreakerOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "circuit breaker `{}` is open; next call in {:?}",
            self.breaker, self.retry_after
        )
    }
}

impl std::error::Error for BreakerOpen {
    #[cfg(feature = "grpc")]
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.status
            .of(self, tonic::Code::Unavailable, Some(self.retry_after))
    }
}

/// A setting of a circuit breaker was out of range; the message names the setting, the value
/// given and what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerConfigError {
    setting: &'static str,
    value: String,
    expected: &'static str,
}

impl BreakerConfigError {
    /// The name of the setting that was refused, such as `failure_rate` or `window_calls`: the
    /// builder's method, and the field of the configuration file.
    pub fn setting(&self) -> &str {
        self.setting
    }
}

impl fmt::Display for BreakerConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "circuit breaker: `{}` must be {}, got {}",
            self.setting, self.expected, self.value
        )
    }
}

impl std::error::Error for BreakerConfigError {}

/// `Ok` if `ok`, otherwise the error that `setting`, given `value`, must be `expected`.
pub(super) fn ensure(
    ok: bool,
    setting: &'static str,
    value: impl fmt::Debug,
    expected: &'static str,
) -> Result<(), BreakerConfigError> {
    let value = format!("{value:?}");
    ok.then_some(()).ok_or(BreakerConfigError {
        setting,
        value,
        expected,
    })
}
