//! A pushback's metrics (feature `metrics`): every [`Pushback`](super::Pushback), built by hand
//! or from a config file, counts its calls by outcome and the answers that asked it to hold
//! calls, by what they said. Names and labels are in
//! [`metric_names`](crate::observe::metric_names).
//!
//! Without the feature, [`PushbackMetrics`] is an empty type whose methods do nothing.

#[cfg(feature = "metrics")]
mod enabled {
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use super::super::answer::{Answer, Dialect};
    use crate::observe::metric_names as m;

    /// The outcomes of a call, in the order of [`Handles::calls`].
    const OUTCOMES: [&str; 3] = ["admitted", "waited", "refused"];

    /// The holds' counters: a `Retry-After` (or a 429 naming no time) first, then a spent quota
    /// of each dialect, in the order of [`Dialect::ALL`].
    const HOLD_REASONS: usize = 1 + Dialect::ALL.len();

    /// The `reason` label of the hold counted at `index`.
    fn hold_reason(index: usize) -> &'static str {
        match index.checked_sub(1) {
            None => "retry_after",
            Some(dialect) => Dialect::ALL[dialect].label(),
        }
    }

    struct Handles {
        calls: [metrics::Counter; 3],
        holds: [metrics::Counter; HOLD_REASONS],
        held: metrics::Gauge,
    }

    /// One pushback's metric handles, registered with the recorder at first use (so the
    /// recorder may be installed after the pushback is built) and then used without building
    /// keys or allocating.
    pub(crate) struct PushbackMetrics {
        name: Arc<str>,
        handles: OnceLock<Handles>,
    }

    impl PushbackMetrics {
        pub(crate) fn new(name: &Arc<str>) -> Self {
            Self {
                name: Arc::clone(name),
                handles: OnceLock::new(),
            }
        }

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

        /// A call sent at once.
        pub(crate) fn admitted(&self) {
            self.handles().calls[0].increment(1);
        }

        /// A call sent once the hold it waited for had ended.
        pub(crate) fn waited(&self) {
            self.handles().calls[1].increment(1);
        }

        /// A call refused with `PushedBack`, at once or after waiting.
        pub(crate) fn refused(&self) {
            self.handles().calls[2].increment(1);
        }

        /// A response read, with what it asked: a hold, a spent quota, or both.
        pub(crate) fn observed(&self, answer: &Answer) {
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

        /// Sets the gauge of the time left until a call may go.
        pub(crate) fn publish_held_for(&self, held_for: Duration) {
            self.handles().held.set(held_for.as_secs_f64());
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod enabled {
    use std::sync::Arc;

    use super::super::answer::Answer;

    /// Nothing to record without the `metrics` feature.
    pub(crate) struct PushbackMetrics;

    impl PushbackMetrics {
        pub(crate) fn new(_: &Arc<str>) -> Self {
            Self
        }

        pub(crate) fn admitted(&self) {}

        pub(crate) fn waited(&self) {}

        pub(crate) fn refused(&self) {}

        pub(crate) fn observed(&self, _: &Answer) {}
    }
}

pub(crate) use enabled::PushbackMetrics;

#[cfg(feature = "metrics")]
impl<C: crate::clock::Clock> super::Pushback<C> {
    /// Sets this pushback's gauge
    /// [`PUSHBACK_HELD_SECONDS`](crate::observe::metric_names::PUSHBACK_HELD_SECONDS) from
    /// [`held_for`](Self::held_for); call it before rendering a scrape
    /// ([`Registry::publish_gauges`](crate::config::Registry::publish_gauges) does it for
    /// configured pushbacks). Counters are recorded as calls and answers pass.
    pub fn publish_gauges(&self) {
        self.dependency.metrics.publish_held_for(self.held_for());
    }
}
