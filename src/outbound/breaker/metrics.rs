//! A breaker's metrics (feature `metrics`): its state as a gauge and its calls by outcome, under
//! [the metric names](crate::observe#metric-names). The handles are registered with the
//! recorder at first use, so the recorder may be installed after the breaker is built. Without
//! the feature, these hold nothing and count nothing.

/// What happened to a call, counted under the `outcome` label, in this order: `success`,
/// `failure`, `slow`, `refused`.
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

/// The state gauge and the counters of calls by [`Outcome`].
#[cfg(feature = "metrics")]
type Handles = (metrics::Gauge, [metrics::Counter; 4]);

/// One breaker's handles, shared by its layers, services and calls.
#[derive(Default)]
pub(super) struct BreakerMetrics {
    #[cfg(feature = "metrics")]
    handles: std::sync::OnceLock<Handles>,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl BreakerMetrics {
    #[cfg(feature = "metrics")]
    fn handles(&self, name: &str) -> &Handles {
        use crate::observe::metric_names::{BREAKER_CALLS, BREAKER_STATE};
        self.handles.get_or_init(|| {
            let outcomes = ["success", "failure", "slow", "refused"];
            let calls = outcomes.map(|outcome| {
                metrics::counter!(BREAKER_CALLS, "name" => name.to_owned(), "outcome" => outcome)
            });
            (
                metrics::gauge!(BREAKER_STATE, "name" => name.to_owned()),
                calls,
            )
        })
    }

    /// Counts one call of breaker `name` under `outcome`.
    pub(super) fn count(&self, name: &str, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        self.handles(name).1[outcome as usize].increment(1);
    }

    /// Sets the state gauge of breaker `name`: 0 closed, 1 open, 2 half-open.
    pub(super) fn state(&self, name: &str, state: u8) {
        #[cfg(feature = "metrics")]
        self.handles(name).0.set(f64::from(state));
    }
}
