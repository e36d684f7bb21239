//! A client quota's metrics (feature `metrics`): every [`ClientQuotaLayer`](super::ClientQuotaLayer),
//! built by hand or from a config file, counts its calls by outcome. Names and labels are in
//! [`metric_names`](crate::observe::metric_names).
//!
//! The limiter under the layer counts its own decisions as well (an
//! [`Observed`](crate::observe::Observed) limiter, as every configured one is, under its own
//! name); these counters are the quota's view: what happened to the calls.
//!
//! Without the feature, [`ClientQuotaMetrics`] is an empty type whose methods do nothing.

#[cfg(feature = "metrics")]
mod enabled {
    use std::sync::{Arc, OnceLock};

    use crate::observe::metric_names as m;

    /// The outcomes of a call, in the order of the handles.
    const OUTCOMES: [&str; 4] = ["admitted", "waited", "refused", "failed"];

    struct Counters {
        name: Arc<str>,
        calls: OnceLock<[metrics::Counter; 4]>,
    }

    /// One client quota's counters, shared by its layer, services and calls; registered with the
    /// recorder at the first call (so the recorder may be installed after the layer is built)
    /// and then used without building keys or allocating.
    #[derive(Clone)]
    pub(crate) struct ClientQuotaMetrics(Arc<Counters>);

    impl ClientQuotaMetrics {
        pub(crate) fn new(name: &Arc<str>) -> Self {
            Self(Arc::new(Counters {
                name: Arc::clone(name),
                calls: OnceLock::new(),
            }))
        }

        fn count(&self, outcome: usize) {
            let calls = self.0.calls.get_or_init(|| {
                let name = self.0.name.to_string();
                OUTCOMES.map(|outcome| {
                    metrics::counter!(m::CLIENT_QUOTA_CALLS, "name" => name.clone(), "outcome" => outcome)
                })
            });
            calls[outcome].increment(1);
        }

        /// A call whose permits were there: sent at once.
        pub(crate) fn admitted(&self) {
            self.count(0);
        }

        /// A call that waited for its permits and was then sent.
        pub(crate) fn waited(&self) {
            self.count(1);
        }

        /// A call refused with `QuotaExhausted`.
        pub(crate) fn refused(&self) {
            self.count(2);
        }

        /// A call the limiter could not decide (its error, such as a cost it can never grant or
        /// a store that failed under a fail mode that propagates errors).
        pub(crate) fn failed(&self) {
            self.count(3);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod enabled {
    use std::sync::Arc;

    /// Nothing to record without the `metrics` feature.
    #[derive(Clone)]
    pub(crate) struct ClientQuotaMetrics;

    impl ClientQuotaMetrics {
        pub(crate) fn new(_: &Arc<str>) -> Self {
            Self
        }

        pub(crate) fn admitted(&self) {}

        pub(crate) fn waited(&self) {}

        pub(crate) fn refused(&self) {}

        pub(crate) fn failed(&self) {}
    }
}

pub(crate) use enabled::ClientQuotaMetrics;
