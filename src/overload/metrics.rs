//! The `metrics` series of one overload protection (feature `metrics`).

use std::sync::OnceLock;

use metrics::{Counter, Gauge};

use super::Priority;
use crate::observe::metric_names::{
    OVERLOAD_IN_FLIGHT, OVERLOAD_LIMIT, OVERLOAD_QUEUE, OVERLOAD_REQUESTS,
};

/// The handles, registered with the recorder installed at the first request.
pub(super) struct Metrics {
    name: String,
    handles: OnceLock<Handles>,
}

struct Handles {
    /// The limit, the requests in flight and the queue's length.
    gauges: [Gauge; 3],
    /// By outcome (`admitted`, `shed`), then by class.
    requests: [[Counter; 3]; 2],
}

impl Metrics {
    pub(super) fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            handles: OnceLock::new(),
        }
    }

    fn handles(&self) -> &Handles {
        self.handles.get_or_init(|| {
            let name = self.name.clone();
            let counter = |outcome: &'static str, class: Priority| {
                metrics::counter!(OVERLOAD_REQUESTS, "name" => name.clone(),
                    "outcome" => outcome, "priority" => class.as_str())
            };
            let by_class = |outcome| Priority::ALL.map(|class| counter(outcome, class));
            let gauge = |gauge: &'static str| metrics::gauge!(gauge, "name" => name.clone());
            Handles {
                gauges: [OVERLOAD_LIMIT, OVERLOAD_IN_FLIGHT, OVERLOAD_QUEUE].map(gauge),
                requests: [by_class("admitted"), by_class("shed")],
            }
        })
    }

    /// Sets the limit, the requests in flight and the queue's length.
    pub(super) fn gauges(&self, figures: [usize; 3]) {
        for (gauge, figure) in self.handles().gauges.iter().zip(figures) {
            gauge.set(figure as f64);
        }
    }

    pub(super) fn count(&self, admitted: bool, class: Priority) {
        let outcome = usize::from(!admitted);
        self.handles().requests[outcome][class.index()].increment(1);
    }
}
