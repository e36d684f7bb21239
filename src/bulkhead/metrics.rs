//! A bulkhead's metrics (feature `metrics`): every bulkhead, built by hand or from a config
//! file, counts its calls and their durations through the `metrics` facade. Names and types are
//! in [`metric_names`](crate::observe::metric_names).

use std::sync::{Arc, OnceLock};

use super::events::{CallFinished, CallPermitted, CallRejected};
use super::handle::BulkheadBuilder;
use crate::observe::metric_names as m;

/// One bulkhead's handles, registered with the recorder at its first call (so the recorder may
/// be installed after the bulkhead is built) and then used without building keys or allocating.
struct Handles {
    name: Arc<str>,
    calls: OnceLock<[metrics::Counter; 3]>,
    duration: OnceLock<metrics::Histogram>,
}

impl Handles {
    /// The `permitted`, `rejected` and `finished` counters.
    fn calls(&self) -> &[metrics::Counter; 3] {
        self.calls.get_or_init(|| {
            let name = self.name.to_string();
            ["permitted", "rejected", "finished"].map(|outcome| {
                metrics::counter!(m::BULKHEAD_CALLS, "name" => name.clone(), "outcome" => outcome)
            })
        })
    }

    fn duration(&self) -> &metrics::Histogram {
        self.duration.get_or_init(
            || metrics::histogram!(m::BULKHEAD_DURATION, "name" => self.name.to_string()),
        )
    }
}

/// Adds the hooks that record `name`'s calls to `builder`.
pub(super) fn record_calls(builder: BulkheadBuilder, name: Arc<str>) -> BulkheadBuilder {
    let handles = Arc::new(Handles {
        name,
        calls: OnceLock::new(),
        duration: OnceLock::new(),
    });
    let (permitted, rejected, finished) = (Arc::clone(&handles), Arc::clone(&handles), handles);
    builder
        .on_call_permitted(move |_: &CallPermitted<'_>| permitted.calls()[0].increment(1))
        .on_call_rejected(move |_: &CallRejected<'_>| rejected.calls()[1].increment(1))
        .on_call_finished(move |e: &CallFinished<'_>| {
            finished.calls()[2].increment(1);
            finished.duration().record(e.duration.as_secs_f64());
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
