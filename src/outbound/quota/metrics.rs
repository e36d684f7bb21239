//! A client quota's metrics (feature `metrics`): every [`ClientQuotaLayer`](super::ClientQuotaLayer),
//! built by hand or from a config file, counts its calls by outcome. Names and labels are in
//! [`metric_names`](crate::observe::metric_names).
//!
//! The limiter under the layer counts its own decisions as well (an
//! [`Observed`](crate::observe::Observed) limiter, as every configured one is, under its own
//! name); these counters are the quota's view: what happened to the calls.
//!
//! Without the feature, [`ClientQuotaMetrics`] holds nothing and counts nothing.

use std::sync::Arc;

/// What happened to a call, counted under the `outcome` label.
#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    /// Its permits were there: sent at once.
    Admitted,
    /// It waited for its permits and was then sent.
    Waited,
    /// Refused with `QuotaExhausted`.
    Refused,
    /// The limiter could not decide (its error, such as a cost it can never grant or a store
    /// that failed under a fail mode that propagates errors).
    Failed,
}

/// The `outcome` labels, in the order of [`Outcome`].
#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 4] = ["admitted", "waited", "refused", "failed"];

/// One client quota's counters, shared by its layer, services and calls; registered with the
/// recorder at the first call (so the recorder may be installed after the layer is built) and
/// then used without building keys or allocating.
#[derive(Clone)]
pub(crate) struct ClientQuotaMetrics {
    #[cfg(feature = "metrics")]
    counters: Arc<(Arc<str>, std::sync::OnceLock<[metrics::Counter; 4]>)>,
}

impl ClientQuotaMetrics {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(name: &Arc<str>) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            counters: Arc::new((Arc::clone(name), std::sync::OnceLock::new())),
        }
    }

    /// Counts one call under `outcome`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn count(&self, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        {
            let (name, calls) = &*self.counters;
            let calls = calls.get_or_init(|| {
                OUTCOMES.map(|label| {
                    let name = name.to_string();
                    metrics::counter!(crate::observe::metric_names::CLIENT_QUOTA_CALLS, "name" => name, "outcome" => label)
                })
            });
            calls[outcome as usize].increment(1);
        }
    }
}
