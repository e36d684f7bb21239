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
    limit: Gauge,
    in_flight: Gauge,
    queue: Gauge,
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
            Handles {
                limit: metrics::gauge!(OVERLOAD_LIMIT, "name" => name.clone()),
                in_flight: metrics::gauge!(OVERLOAD_IN_FLIGHT, "name" => name.clone()),
                queue: metrics::gauge!(OVERLOAD_QUEUE, "name" => name.clone()),
                requests: [by_class("admitted"), by_class("shed")],
            }
        })
    }

    pub(super) fn gauges(&self, limit: usize, in_flight: usize, queued: usize) {
        let handles = self.handles();
        handles.limit.set(limit as f64);
        handles.in_flight.set(in_flight as f64);
        handles.queue.set(queued as f64);
    }

    pub(super) fn count(&self, admitted: bool, class: Priority) {
        let outcome = usize::from(!admitted);
        self.handles().requests[outcome][class.index()].increment(1);
    }
}
