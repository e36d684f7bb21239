//! The metrics of an overload protection (feature `metrics`): its limit, the requests in flight
//! and queued, and the requests admitted and shed by class, as a recorder sees them.

#![cfg(feature = "metrics")]

use std::collections::BTreeMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower::ServiceExt;
use tower_bulwark::overload::Priority;

use crate::support::{fixed, gated, request};

/// Every series of the protection named `api`: its metric name and labels other than `name`,
/// and its value (gauges as whole numbers).
fn series(snapshotter: &Snapshotter) -> BTreeMap<String, u64> {
    let mut found = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if !key
            .labels()
            .any(|l| l.key() == "name" && l.value() == "api")
        {
            continue;
        }
        let mut name = key.name().to_owned();
        for label in key.labels().filter(|l| l.key() != "name") {
            name.push_str(&format!(" {}={}", label.key(), label.value()));
        }
        let value = match value {
            DebugValue::Counter(n) => n,
            DebugValue::Gauge(g) => g.into_inner() as u64,
            DebugValue::Histogram(h) => h.len() as u64,
        };
        found.insert(name, value);
    }
    found
}

/// Two critical requests fill a limit of two; a default and a sheddable one are shed. The
/// recorder sees the limit, both in flight, each class's admissions and sheds; once the two
/// have ended, none in flight and nothing more counted.
#[test]
fn the_limit_in_flight_and_each_class_admitted_and_shed_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let overload = fixed(2).build();
            let (service, gated, mut entered) = gated(&overload);
            let critical: Vec<_> = (0..2)
                .map(|_| tokio::spawn(service.clone().oneshot(request(Priority::Critical))))
                .collect();
            for _ in 0..2 {
                entered.recv().await.unwrap();
            }
            for class in [Priority::Default, Priority::Sheddable] {
                let response = service.clone().oneshot(request(class)).await.unwrap();
                assert_eq!(response.status(), 503);
            }

            let during = series(&snapshotter);
            // A snapshot takes the counters' increments since the last one.
            let expected = |in_flight: u64, counted: u64| {
                let mut expected = BTreeMap::from([
                    ("bulwark_overload_limit".to_owned(), 2),
                    ("bulwark_overload_in_flight".to_owned(), in_flight),
                    ("bulwark_overload_queue_depth".to_owned(), 0),
                ]);
                for (outcome, class, n) in [
                    ("admitted", "critical", 2),
                    ("admitted", "default", 0),
                    ("admitted", "sheddable", 0),
                    ("shed", "critical", 0),
                    ("shed", "default", 1),
                    ("shed", "sheddable", 1),
                ] {
                    let name = format!(
                        "bulwark_overload_requests_total outcome={outcome} priority={class}"
                    );
                    expected.insert(name, n * counted);
                }
                expected
            };
            assert_eq!(during, expected(2, 1));

            gated.gate.add_permits(2);
            for task in critical {
                let response = task.await.unwrap().unwrap();
                assert_eq!(response.status(), 200);
                axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .unwrap();
            }
            assert_eq!(overload.in_flight(), 0);
            // Nothing counted since; none in flight.
            assert_eq!(series(&snapshotter), expected(0, 0));
        })
    });
}
