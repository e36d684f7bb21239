//! The outbound layers' metrics (feature `metrics`): every [`Pushback`](super::Pushback) and
//! [`ClientQuotaLayer`](super::ClientQuotaLayer), built by hand or from a config file, counts
//! its calls by outcome, and a pushback counts the answers that asked it to hold calls, by what
//! they said. Names and labels are in [the metric names](crate::observe#metric-names).
//!
//! The limiter under a client quota counts its own decisions as well (an
//! [`Observed`](crate::observe::Observed) limiter, as every configured one is, under its own
//! name); the quota's counters are what happened to the calls.
//!
//! Every handle is registered with the recorder at first use (so the recorder may be installed
//! after the layer is built), under the name its owner passes in, and then used without building
//! keys or allocating. Without the feature, these hold nothing and count nothing.

use super::pushback::answer::Answer;
#[cfg(feature = "metrics")]
use super::pushback::answer::Dialect;
#[cfg(feature = "metrics")]
use crate::observe::metric_names as m;
#[cfg(feature = "metrics")]
use std::sync::OnceLock;

/// What happened to a call, counted under the `outcome` label.
#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    /// Sent at once.
    Admitted,
    /// Sent once the hold it waited for had ended, or its permits had fallen due.
    Waited,
    /// Refused with `PushedBack` (at once or after waiting) or `QuotaExhausted`.
    Refused,
    /// A client quota's limiter could not decide (its error, such as a cost it can never grant
    /// or a store that failed under a fail mode that propagates errors).
    Failed,
}

/// The `outcome` labels, in the order of [`Outcome`].
#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 4] = ["admitted", "waited", "refused", "failed"];

/// The counters of `metric` for `name`, one an outcome of the first `N`.
#[cfg(feature = "metrics")]
fn call_counters<const N: usize>(metric: &'static str, name: &str) -> [metrics::Counter; N] {
    std::array::from_fn(
        |index| metrics::counter!(metric, "name" => name.to_owned(), "outcome" => OUTCOMES[index]),
    )
}

/// One client quota's counters, shared by its layer, services and calls.
#[derive(Default)]
pub(crate) struct ClientQuotaMetrics {
    #[cfg(feature = "metrics")]
    calls: OnceLock<[metrics::Counter; 4]>,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl ClientQuotaMetrics {
    /// Counts one call of quota `name` under `outcome`.
    pub(crate) fn count(&self, name: &str, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        self.calls
            .get_or_init(|| call_counters(m::CLIENT_QUOTA_CALLS, name))[outcome as usize]
            .increment(1);
    }
}

/// The `reason` labels of the holds' counters: a `Retry-After` (or a 429 naming no time) first,
/// then a spent quota of each dialect, in the order [`Dialect`] declares them (`Custom` last).
#[cfg(feature = "metrics")]
const HOLD_REASONS: [&str; 2 + Dialect::Custom as usize] = [
    "retry_after",
    "ratelimit",
    "x_ratelimit",
    "openai",
    "anthropic",
    "custom",
];

#[cfg(feature = "metrics")]
struct Handles {
    /// A pushback fails no call of its own: no `failed` outcome.
    calls: [metrics::Counter; 3],
    holds: [metrics::Counter; HOLD_REASONS.len()],
    held: metrics::Gauge,
}

/// One pushback's metric handles.
#[derive(Default)]
pub(crate) struct PushbackMetrics {
    #[cfg(feature = "metrics")]
    handles: OnceLock<Handles>,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl PushbackMetrics {
    /// The handles of pushback `name`.
    #[cfg(feature = "metrics")]
    fn handles(&self, name: &str) -> &Handles {
        self.handles.get_or_init(|| {
            let name = name.to_owned();
            Handles {
                calls: call_counters(m::PUSHBACK_CALLS, &name),
                holds: HOLD_REASONS.map(|reason| {
                    metrics::counter!(m::PUSHBACK_HOLDS, "name" => name.clone(), "reason" => reason)
                }),
                held: metrics::gauge!(m::PUSHBACK_HELD_SECONDS, "name" => name.clone()),
            }
        })
    }

    /// Counts one call of pushback `name` under `outcome`.
    pub(crate) fn count(&self, name: &str, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        self.handles(name).calls[outcome as usize].increment(1);
    }

    /// A response read by pushback `name`, with what it asked: a hold, a spent quota, or both.
    pub(crate) fn observed(&self, name: &str, answer: &Answer) {
        #[cfg(feature = "metrics")]
        {
            if answer.hold.is_some_and(|hold| !hold.is_zero()) {
                self.handles(name).holds[0].increment(1);
            }
            // Once per dialect with a spent quota; `HOLD_REASONS` lists the dialects in the
            // order of declaration.
            let mut spent = [false; HOLD_REASONS.len() - 1];
            for quota in &answer.quotas {
                spent[quota.dialect as usize] |= quota.remaining == 0 && !quota.window.is_zero();
            }
            for (dialect, _) in spent.iter().enumerate().filter(|(_, spent)| **spent) {
                self.handles(name).holds[1 + dialect].increment(1);
            }
        }
    }
}

#[cfg(feature = "metrics")]
impl<C: crate::clock::Clock> super::Pushback<C> {
    /// Sets this pushback's gauge
    /// `bulwark_pushback_held_seconds` from
    /// [`held_for`](Self::held_for); call it before rendering a scrape
    /// (`config::Registry::publish_gauges`, feature `config`, does it for
    /// configured pushbacks). Counters are recorded as calls and answers pass.
    pub fn publish_gauges(&self) {
        let held_for = self.held_for().as_secs_f64();
        let dependency = &self.dependency;
        let handles = dependency.metrics.handles(&dependency.name);
        handles.held.set(held_for);
    }
}

/// A retry layer's series: attempts by kind, then retries not made by reason, in the order of
/// `Attempt` and `Skipped`.
#[cfg(all(feature = "adaptive", feature = "metrics"))]
const RETRY_SERIES: [(&str, &str, &str); 4] = [
    (m::RETRY_ATTEMPTS, "kind", "first"),
    (m::RETRY_ATTEMPTS, "kind", "retry"),
    (m::RETRY_SKIPPED, "reason", "budget"),
    (m::RETRY_SKIPPED, "reason", "wait"),
];

/// One retry handle's counters (feature `adaptive`).
#[cfg(feature = "adaptive")]
#[derive(Default)]
pub(crate) struct RetryMetrics {
    #[cfg(feature = "metrics")]
    counters: OnceLock<[metrics::Counter; RETRY_SERIES.len()]>,
}

#[cfg(feature = "adaptive")]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl RetryMetrics {
    /// Counts one event of retries `name` in the series at `index` in [`RETRY_SERIES`].
    fn count(&self, name: &str, index: usize) {
        #[cfg(feature = "metrics")]
        self.counters.get_or_init(|| {
            RETRY_SERIES.map(|(metric, label, value)| {
                metrics::counter!(metric, "name" => name.to_owned(), label => value)
            })
        })[index]
            .increment(1);
    }

    /// Counts one attempt of retries `name` of `kind`.
    pub(crate) fn attempt(&self, name: &str, kind: super::retry::Attempt) {
        self.count(name, kind as usize);
    }

    /// Counts one retry of retries `name` not made, for `reason`.
    pub(crate) fn skipped(&self, name: &str, reason: super::retry::Skipped) {
        self.count(name, 2 + reason as usize);
    }
}
