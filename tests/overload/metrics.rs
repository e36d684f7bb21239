//! The metrics of an overload protection (feature `metrics`): its limit, the requests in flight
//! and queued, and the requests admitted and shed by class, as a recorder sees them.

#![cfg(feature = "metrics")]

use tower::ServiceExt;
use tower_bulwark::overload::Priority;

use crate::common::recorded::{counter, gauge, on_own_recorder, runtime, series, Series};
use crate::support::{fixed, gated, request};

/// The gauges of the protection `api`: its limit, in flight, queued.
fn gauges(all: &Series) -> [f64; 3] {
    ["limit", "in_flight", "queue_depth"]
        .map(|name| gauge(all, &format!("bulwark_overload_{name}"), &[("name", "api")]))
}

/// The requests of the protection `api` with `outcome`, by class: critical, default, sheddable.
fn requests(all: &Series, outcome: &str) -> [u64; 3] {
    ["critical", "default", "sheddable"].map(|class| {
        let labels = [("name", "api"), ("outcome", outcome), ("priority", class)];
        counter(all, "bulwark_overload_requests_total", &labels)
    })
}

/// Two critical requests fill a limit of two; a default and a sheddable one are shed. The
/// recorder sees the limit, both in flight, each class's admissions and sheds; once the two
/// have ended, none in flight and nothing more counted.
#[test]
fn the_limit_in_flight_and_each_class_admitted_and_shed_are_recorded() {
    let ((), after) = on_own_recorder(&runtime(), |snapshotter| async move {
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
        assert_eq!(gauges(&during), [2.0, 2.0, 0.0]);
        assert_eq!(requests(&during, "admitted"), [2, 0, 0]);
        assert_eq!(requests(&during, "shed"), [0, 1, 1]);
        assert_eq!(during.len(), 3 + 6, "{during:?}");

        gated.gate.add_permits(2);
        for task in critical {
            let response = task.await.unwrap().unwrap();
            assert_eq!(response.status(), 200);
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
        }
        assert_eq!(overload.in_flight(), 0);
    });
    // A snapshot takes the counters' increments since the last one: nothing more counted.
    assert_eq!(gauges(&after), [2.0, 0.0, 0.0]);
    assert_eq!(requests(&after, "admitted"), [0; 3]);
    assert_eq!(requests(&after, "shed"), [0; 3]);
}
