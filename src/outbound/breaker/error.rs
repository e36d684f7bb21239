//! The error of a call the breaker refused.

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

crate::outbound::refusal!(
    BreakerOpen,
    breaker,
    Unavailable,
    "circuit breaker `{}` is open; next call in {:?}"
);
