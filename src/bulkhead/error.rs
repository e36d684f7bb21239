//! The error of a refused call.

use std::fmt;
use std::sync::Arc;

/// A call refused by a bulkhead: no permit was free and there was no room, or no time left, to
/// wait for one.
///
/// The bulkhead services fail with [`BoxError`](crate::BoxError); test for a refusal with
/// `err.is::<BulkheadFull>()` or get it back with `err.downcast_ref::<BulkheadFull>()`.
#[derive(Clone, Debug)]
pub struct BulkheadFull {
    bulkhead: Arc<str>,
}

impl BulkheadFull {
    pub(crate) fn new(bulkhead: Arc<str>) -> Self {
        Self { bulkhead }
    }

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

impl std::error::Error for BulkheadFull {}
