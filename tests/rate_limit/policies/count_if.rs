//! `count_if`: the permit stays spent when the inner service fails or the future is dropped
//! after the call, and comes back exactly once when the response does not count (a waiting
//! reservation too), before the headers describe what is left.

use std::time::Duration;

use http::StatusCode;
use tower::{Service, ServiceExt};
use tower_bulwark::rate_limit::RateLimitLayer;
use tower_bulwark::{
    clock::{ManualClock, TokioClock},
    Quota,
};

use super::accounting::{call, log, policy, req, sliding_log, svc, two_logs, Inner, Mode};
use crate::common::listener::{sf_entries, sf_names};
use crate::common::{poll_once, waits_up_to};
use crate::support::param;

/// Promise: count_if with a waiting policy: the request waits for its reservation, and when
/// the response does not count, the reservation is given back (exactly, with a sliding log);
/// when the wait is refused by a later policy, the reservation is given back at once.
#[tokio::test(start_paused = true)]
async fn a_waiting_count_if_reservation_is_given_back_when_it_does_not_count() {
    let clock = TokioClock::new();
    let waits = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(5));
    let waiting = sliding_log(waits, clock, Mode::Now);
    let veto = sliding_log(Quota::per_hour(2).unwrap(), clock, Mode::Later(1));
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &waiting)
                .count_if(|r| r.status == StatusCode::UNAUTHORIZED)
                .and(policy(1, &veto).cost_by(|p| u32::from(p.headers.contains_key("x-veto")))),
        ),
        &inner,
    );
    let start = tokio::time::Instant::now();
    let ok = service.clone().oneshot(req(&[("x-status", "401")])).await;
    assert_eq!(ok.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(waiting.net("k"), 1);
    // Over the limit: waits one second, then is not counted.
    let ok = service.clone().oneshot(req(&[])).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(waiting.net("k"), 1, "the reservation came back");
    // Two vetoes use the veto policy up; the third waits for nothing: refused at once.
    for _ in 0..2 {
        let r = service.clone().oneshot(req(&[("x-veto", "1")])).await;
        assert_eq!(r.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(waiting.net("k"), 1);
    let before = tokio::time::Instant::now();
    let refused = service
        .clone()
        .oneshot(req(&[("x-veto", "1")]))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        before.elapsed(),
        Duration::ZERO,
        "a refused request never waits"
    );
    assert_eq!(
        waiting.net("k"),
        1,
        "the reservation of a refused request came back"
    );
    assert_eq!(waiting.bad_refunds() + veto.bad_refunds(), 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(waiting.probe("k"), 1);
}

/// Promise: the permit stays spent when the inner service fails instead of answering, or when
/// the future is dropped after the call, and is given back exactly once when the response does
/// not count; the headers of the admitted response still parse.
#[test]
fn count_if_keeps_the_permit_on_error_and_drop_and_refunds_once_otherwise() {
    let (a, b) = two_logs((10, Mode::Later(1)), (10, Mode::Now));
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &a)
                .count_if(|r| r.status.is_server_error())
                .and(policy(1, &b).count_if(|r| r.status.is_client_error())),
        ),
        &inner,
    );
    // Inner error: both kept.
    assert!(call(&service, req(&[("x-fail", "1")])).is_err());
    assert_eq!((a.net("k"), b.net("k")), (1, 1));
    // 500: a keeps, b gives back. 404: b keeps, a gives back. 200: both give back.
    for (status, expect) in [("500", (2, 1)), ("404", (2, 2)), ("200", (2, 2))] {
        let r = call(&service, req(&[("x-status", status)])).unwrap();
        assert_eq!(r.status().as_str(), status);
        assert_eq!(sf_names(r.headers(), "ratelimit"), ["p0", "p1"]);
        assert_eq!((a.net("k"), b.net("k")), expect, "status {status}");
    }
    // Dropped after the call (the handler is still working): both kept.
    let mut s = service.clone();
    let mut future = Box::pin(s.call(req(&[("x-yield", "5")])));
    while inner.calls() < 5 {
        assert!(poll_once(future.as_mut()).is_pending());
    }
    drop(future);
    assert_eq!((a.net("k"), b.net("k")), (3, 3));
    assert_eq!(a.refunds(), 2);
    assert_eq!(b.refunds(), 2);
    assert_eq!(a.probe("k"), 7);
    assert_eq!(b.probe("k"), 7);
}

/// Promise (module docs): `RateLimit`'s `r` is the permits left. On a response that a count_if
/// policy does not count, the permit comes back before the client sees the header, so the header
/// describes the key as it is, not as if the request had counted (one attempt fewer on every
/// successful login). `t` is draft -11's effective window: with the whole quota left, the
/// quota's own window (here an hour).
#[test]
fn the_headers_of_a_response_that_does_not_count_describe_what_is_left() {
    let clock = ManualClock::new();
    let failures = log(5, &clock, Mode::Now);
    let service = svc(
        RateLimitLayer::new(
            policy(0, &failures).count_if(|r| r.status == StatusCode::UNAUTHORIZED),
        ),
        &Inner::default(),
    );
    for i in 0..3 {
        let ok = call(&service, req(&[])).unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(failures.probe("k"), 5, "nothing counted");
        let entries = sf_entries(ok.headers(), "ratelimit");
        assert_eq!(
            (param(&entries[0], "r"), param(&entries[0], "t")),
            (5, 3600),
            "response {i}: the header says fewer permits are left than are"
        );
    }
}
