//! A bulkhead's metrics (feature `metrics`): every bulkhead, built by hand or from a config
//! file, counts its calls and their durations through the `metrics` facade. Names and types are
//! in [the metric names](crate::observe#metric-names).

use std::sync::{Arc, OnceLock};

use super::events::{CallFinished, CallPermitted, CallRejected};
use super::handle::BulkheadBuilder;
use crate::observe::metric_names as m;

/// One bulkhead's handles, registered with the recorder at its first call (so the recorder may
/// be installed after the bulkhead is built) and then used without building keys or allocating:
/// the `permitted`, `rejected` and `finished` counters and the call-duration histogram.
struct Handles {
    name: Arc<str>,
    registered: OnceLock<([metrics::Counter; 3], metrics::Histogram)>,
}

impl Handles {
    fn get(&self) -> &([metrics::Counter; 3], metrics::Histogram) {
        self.registered.get_or_init(|| {
            let name = self.name.to_string();
            let calls = ["permitted", "rejected", "finished"].map(|outcome| {
                metrics::counter!(m::BULKHEAD_CALLS, "name" => name.clone(), "outcome" => outcome)
            });
            (
                calls,
                metrics::histogram!(m::BULKHEAD_DURATION, "name" => name),
            )
        })
    }
}

/// Adds the hooks that record the calls of the bulkhead `builder` makes.
pub(super) fn record_calls(builder: BulkheadBuilder) -> BulkheadBuilder {
    let handles = Arc::new(Handles {
        name: Arc::clone(&builder.name),
        registered: OnceLock::new(),
    });
    let (permitted, rejected, finished) = (Arc::clone(&handles), Arc::clone(&handles), handles);
    builder
        .on_call_permitted(move |_: &CallPermitted<'_>| permitted.get().0[0].increment(1))
        .on_call_rejected(move |_: &CallRejected<'_>| rejected.get().0[1].increment(1))
        .on_call_finished(move |e: &CallFinished<'_>| {
            let (calls, duration) = finished.get();
            calls[2].increment(1);
            duration.record(e.duration.as_secs_f64());
        })
}

/// Sets `name`'s gauges from a snapshot.
pub(super) fn publish_gauges(name: &str, s: &super::BulkheadSnapshot) {
    let name = name.to_owned();
    metrics::gauge!(m::BULKHEAD_AVAILABLE, "name" => name.clone())
        .set(s.available_concurrent_calls as f64);
    metrics::gauge!(m::BULKHEAD_MAX, "name" => name.clone())
        .set(s.max_allowed_concurrent_calls as f64);
    metrics::gauge!(m::BULKHEAD_QUEUE, "name" => name).set(s.queue_depth as f64);
}
