//! The error of a call refused by a client-side quota.

use std::sync::Arc;
use std::time::Duration;

/// A call that was not sent because the client-side quota for its dependency was spent and its
/// next permit was further away than the quota's `max_wait`.
///
/// The services fail with [`BoxError`](crate::BoxError); test for it with
/// `err.is::<QuotaExhausted>()`. The refusal spent nothing of the quota, and the call may be
/// sent again after [`retry_after`](Self::retry_after).
///
/// With the `grpc` feature, its [`source`](std::error::Error::source) is a `tonic::Status` of
/// `RESOURCE_EXHAUSTED` with the wait in a `RetryInfo` and `grpc-retry-pushback-ms`: a tonic
/// client behind the quota gets that status back from the call, where any other error would be
/// `UNKNOWN`.
#[derive(Clone, Debug)]
pub struct QuotaExhausted {
    pub(super) quota: Arc<str>,
    pub(super) retry_after: Duration,
    #[cfg(feature = "grpc")]
    pub(super) status: crate::rate_limit::grpc::LazyStatus,
}

impl QuotaExhausted {
    /// The name of the quota that refused the call.
    pub fn quota(&self) -> &str {
        &self.quota
    }

    /// How long from the refusal until the same call would be admitted, if nothing else took
    /// the permits first.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

crate::outbound::refusal!(
    QuotaExhausted,
    quota,
    ResourceExhausted,
    "client quota `{}` is spent; next permit in {:?}"
);
