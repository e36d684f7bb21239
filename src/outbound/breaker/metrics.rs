//! A breaker's metrics (feature `metrics`): its state as a gauge and its calls by outcome, under
//! [the metric names](crate::observe#metric-names). The handles are registered with the
//! recorder at first use, so the recorder may be installed after the breaker is built. Without
//! the feature, these hold nothing and count nothing.

use std::sync::Arc;

#[cfg(feature = "metrics")]
use crate::observe::metric_names::{BREAKER_CALLS, BREAKER_STATE};

/// What happened to a call, counted under the `outcome` label.
#[derive(Clone, Copy)]
pub(super) enum Outcome {
    /// Counted, neither failed nor slow.
    Success,
    /// Counted as a failure (slow or not).
    Failure,
    /// Counted as slow, not failed.
    Slow,
    /// Refused with `BreakerOpen`.
    Refused,
}

/// The `outcome` labels, in the order of [`Outcome`].
#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 4] = ["success", "failure", "slow", "refused"];

#[cfg(feature = "metrics")]
struct Handles {
    state: metrics::Gauge,
    calls: [metrics::Counter; 4],
}

pub(super) struct BreakerMetrics {
    #[cfg(feature = "metrics")]
    name: Arc<str>,
    #[cfg(feature = "metrics")]
    handles: std::sync::OnceLock<Handles>,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl BreakerMetrics {
    pub(super) fn new(name: &Arc<str>) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            name: Arc::clone(name),
            #[cfg(feature = "metrics")]
            handles: std::sync::OnceLock::new(),
        }
    }

    #[cfg(feature = "metrics")]
    fn handles(&self) -> &Handles {
        self.handles.get_or_init(|| {
            let name = || self.name.to_string();
            Handles {
                state: metrics::gauge!(BREAKER_STATE, "name" => name()),
                calls: OUTCOMES
                    .map(|outcome| metrics::counter!(BREAKER_CALLS, "name" => name(), "outcome" => outcome)),
            }
        })
    }

    /// Counts one call under `outcome`.
    pub(super) fn count(&self, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        self.handles().calls[outcome as usize].increment(1);
    }

    /// Sets the state gauge: 0 closed, 1 open, 2 half-open.
    pub(super) fn state(&self, state: u8) {
        #[cfg(feature = "metrics")]
        self.handles().state.set(f64::from(state));
    }
}
