//! The error of a refused call.

use std::fmt;
use std::sync::Arc;

/// A call refused by a bulkhead: no permit was free and there was no room, or no time left, to
/// wait for one.
///
/// The bulkhead services fail with [`BoxError`](crate::BoxError); test for a refusal with
/// `err.is::<BulkheadFull>()` or get it back with `err.downcast_ref::<BulkheadFull>()`.
///
/// With the `grpc` feature, its [`source`](std::error::Error::source) is a `tonic::Status` of
/// `RESOURCE_EXHAUSTED` naming the bulkhead: tonic looks for a status among an error's sources,
/// so a bulkhead layered on a tonic server (`Server::builder().layer(bulkhead.body_layer())`)
/// refuses a call with that status, and a tonic client behind a bulkhead gets it back from the
/// call, where any other error would be `UNKNOWN`.
#[derive(Clone, Debug)]
pub struct BulkheadFull {
    pub(super) bulkhead: Arc<str>,
    /// What tonic answers for this error, built when tonic first asks.
    #[cfg(feature = "grpc")]
    pub(super) status: crate::rate_limit::grpc::LazyStatus,
}

impl BulkheadFull {
    /// The name of the bulkhead that refused the call.
    pub fn bulkhead(&self) -> &str {
        &self.bulkhead
    }
}

impl fmt::Display for BulkheadFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bulkhead `{}` is full", self.bulkhead)
    }
}

impl std::error::Error for BulkheadFull {
    #[cfg(feature = "grpc")]
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.status.of(self, tonic::Code::ResourceExhausted, None)
    }
}
