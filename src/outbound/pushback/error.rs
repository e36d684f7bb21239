//! The error of a call held back by the dependency's own word.

use std::sync::Arc;
use std::time::Duration;

/// A call that was not sent because the dependency asked for no calls until later (a
/// `Retry-After`, or a quota it advertised running out), and that time was further away than
/// the layer's `max_wait`.
///
/// The services fail with [`BoxError`](crate::BoxError); test for it with
/// `err.is::<PushedBack>()`. It is neither a timeout nor a
/// [`BulkheadFull`](crate::BulkheadFull): the call never reached the dependency, and it may be
/// sent again after [`retry_after`](Self::retry_after).
///
/// With the `grpc` feature, its [`source`](std::error::Error::source) is a `tonic::Status` of
/// `UNAVAILABLE` (the dependency asked not to be called for now) with the wait in a `RetryInfo`
/// and `grpc-retry-pushback-ms`: a tonic client behind the pushback gets that status back from
/// the call, where any other error would be `UNKNOWN`.
#[derive(Clone, Debug)]
pub struct PushedBack {
    pub(super) dependency: Arc<str>,
    pub(super) retry_after: Duration,
    #[cfg(feature = "grpc")]
    pub(super) status: crate::rate_limit::grpc::LazyStatus,
}

impl PushedBack {
    /// The name of the dependency that asked for the hold.
    pub fn dependency(&self) -> &str {
        &self.dependency
    }

    /// How long from the refusal until a call may be sent, as the dependency last said: the
    /// same time [`Pushback::held_for`](super::Pushback::held_for) gave then, whichever of a
    /// `Retry-After`, a spent quota or the pacing ends last.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

crate::outbound::refusal!(
    PushedBack,
    dependency,
    Unavailable,
    "dependency `{}` asked for no calls for another {:?}"
);
