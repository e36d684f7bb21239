//! A pushback's metrics (feature `metrics`): every [`Pushback`](super::Pushback), built by hand
//! or from a config file, counts its calls by outcome and the answers that asked it to hold
//! calls, by what they said. Names and labels are in
//! [`metric_names`](crate::observe::metric_names).
//!
//! Without the feature, [`PushbackMetrics`] holds nothing and records nothing.

use std::sync::Arc;

use super::answer::Answer;
#[cfg(feature = "metrics")]
use super::answer::Dialect;
#[cfg(feature = "metrics")]
use crate::observe::metric_names as m;

/// What happened to a call, counted under the `outcome` label.
#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    /// Sent at once.
    Admitted,
    /// Sent once the hold it waited for had ended.
    Waited,
    /// Refused with `PushedBack`, at once or after waiting.
    Refused,
}

/// The `outcome` labels, in the order of [`Outcome`].
#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 3] = ["admitted", "waited", "refused"];

/// The holds' counters: a `Retry-After` (or a 429 naming no time) first, then a spent quota
/// of each dialect, in the order of [`Dialect::ALL`].
#[cfg(feature = "metrics")]
const HOLD_REASONS: usize = 1 + Dialect::ALL.len();

/// The `reason` label of the hold counted at `index`.
#[cfg(feature = "metrics")]
fn hold_reason(index: usize) -> &'static str {
    match index.checked_sub(1) {
        None => "retry_after",
        Some(dialect) => Dialect::ALL[dialect].label(),
    }
}

#[cfg(feature = "metrics")]
struct Handles {
    calls: [metrics::Counter; 3],
    holds: [metrics::Counter; HOLD_REASONS],
    held: metrics::Gauge,
}

/// One pushback's metric handles, registered with the recorder at first use (so the recorder
/// may be installed after the pushback is built) and then used without building keys or
/// allocating.
pub(crate) struct PushbackMetrics {
    #[cfg(feature = "metrics")]
    name: Arc<str>,
    #[cfg(feature = "metrics")]
    handles: std::sync::OnceLock<Handles>,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl PushbackMetrics {
    pub(crate) fn new(name: &Arc<str>) -> Self {
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
            let name = self.name.to_string();
            Handles {
                calls: OUTCOMES.map(|outcome| {
                    metrics::counter!(m::PUSHBACK_CALLS, "name" => name.clone(), "outcome" => outcome)
                }),
                holds: std::array::from_fn(|index| {
                    metrics::counter!(m::PUSHBACK_HOLDS, "name" => name.clone(), "reason" => hold_reason(index))
                }),
                held: metrics::gauge!(m::PUSHBACK_HELD_SECONDS, "name" => name.clone()),
            }
        })
    }

    /// Counts one call under `outcome`.
    pub(crate) fn count(&self, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        self.handles().calls[outcome as usize].increment(1);
    }

    /// A response read, with what it asked: a hold, a spent quota, or both.
    pub(crate) fn observed(&self, answer: &Answer) {
        #[cfg(feature = "metrics")]
        {
            if answer.hold.is_some_and(|hold| !hold.is_zero()) {
                self.handles().holds[0].increment(1);
            }
            let spent = answer
                .quota
                .filter(|quota| quota.remaining == 0 && !quota.window.is_zero());
            if let Some(quota) = spent {
                // `Dialect::ALL` lists the variants in the order of declaration.
                self.handles().holds[1 + quota.dialect as usize].increment(1);
            }
        }
    }
}

#[cfg(feature = "metrics")]
impl<C: crate::clock::Clock> super::Pushback<C> {
    /// Sets this pushback's gauge
    /// [`PUSHBACK_HELD_SECONDS`](crate::observe::metric_names::PUSHBACK_HELD_SECONDS) from
    /// [`held_for`](Self::held_for); call it before rendering a scrape
    /// ([`Registry::publish_gauges`](crate::config::Registry::publish_gauges) does it for
    /// configured pushbacks). Counters are recorded as calls and answers pass.
    pub fn publish_gauges(&self) {
        let held_for = self.held_for().as_secs_f64();
        self.dependency.metrics.handles().held.set(held_for);
    }
}
