//! The error of a call refused by a client-side quota.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A call that was not sent because the client-side quota for its dependency was spent and its
/// next permit was further away than the quota's `max_wait`.
///
/// The services fail with [`BoxError`](crate::BoxError); test for it with
/// `err.is::<QuotaExhausted>()`. The refusal spent nothing of the quota, and the call may be
/// sent again after [`retry_after`](Self::retry_after).
#[derive(Clone, Debug)]
pub struct QuotaExhausted {
    pub(super) quota: Arc<str>,
    pub(super) retry_after: Duration,
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

impl fmt::Display for QuotaExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "client quota `{}` is spent; next permit in {:?}",
            self.quota, self.retry_after
        )
    }
}

impl std::error::Error for QuotaExhausted {}
