//! The limit under a step in latency: a service whose latency jumps from W to 3W brings the
//! limit down, and latency back at W brings it up again. Time is a manual clock, moved by W or
//! 3W while a wave of requests holding the whole limit waits at the gate.

use std::time::Duration;

use tower::ServiceExt;
use tower_bulwark::bulkhead::adaptive::{Gradient, Limits};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::overload::{Overload, Priority};

use crate::support::{fixed, gated, request, Gated, Svc};

const W: Duration = Duration::from_millis(50);

/// One wave: as many requests as the limit admits, all answered after `latency`; returns the
/// limit after it.
async fn wave(
    overload: &Overload,
    service: &Svc,
    gated: &Gated,
    clock: &ManualClock,
    latency: Duration,
    entered: &mut tokio::sync::mpsc::UnboundedReceiver<Priority>,
) -> usize {
    let n = overload.limit();
    let calls: Vec<_> = (0..n)
        .map(|_| tokio::spawn(service.clone().oneshot(request(Priority::Critical))))
        .collect();
    for _ in 0..n {
        entered.recv().await.unwrap();
    }
    assert_eq!(overload.in_flight(), n);
    clock.advance(latency);
    gated.gate.add_permits(n);
    for call in calls {
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(overload.in_flight(), 0);
    overload.limit()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_falls_when_latency_triples_and_recovers_when_it_returns() {
    let clock = ManualClock::new();
    let overload = fixed(10)
        .limits(Limits::new(2, 10, 200).unwrap())
        .algorithm(Gradient::default())
        .clock(clock.clone())
        .build();
    let (service, gated, mut entered) = gated(&overload);
    let mut at_w = 0;
    for _ in 0..30 {
        at_w = wave(&overload, &service, &gated, &clock, W, &mut entered).await;
    }
    assert!(
        at_w > 10,
        "a limit in use at the baseline latency grows: {at_w}"
    );
    let mut at_3w = at_w;
    for _ in 0..30 {
        at_3w = wave(&overload, &service, &gated, &clock, 3 * W, &mut entered).await;
    }
    assert!(
        at_3w * 2 < at_w,
        "three times the latency: from {at_w} down to {at_3w}"
    );
    let mut back = at_3w;
    for _ in 0..30 {
        back = wave(&overload, &service, &gated, &clock, W, &mut entered).await;
    }
    assert!(
        back > at_3w * 2,
        "latency back at W: from {at_3w} up to {back}"
    );
}

#[tokio::test]
async fn a_request_that_fails_gives_no_sample() {
    let clock = ManualClock::new();
    let overload = Overload::builder("api")
        .limits(Limits::new(1, 4, 8).unwrap())
        .clock(clock.clone())
        .build();
    let failing = tower::service_fn(|_: http::Request<axum::body::Body>| async {
        Err::<http::Response<axum::body::Body>, _>("broken")
    });
    let service = tower::Layer::layer(&overload.layer(), failing);
    for _ in 0..100 {
        clock.advance(W * 100);
        assert!(service
            .clone()
            .oneshot(request(Priority::Default))
            .await
            .is_err());
    }
    assert_eq!(overload.limit(), 4, "errors moved the limit");
    assert_eq!(overload.in_flight(), 0);
}
