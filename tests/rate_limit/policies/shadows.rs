//! Shadow policies (`shadow`, `shadow_advertised`): they never make a request wait, never
//! refuse, never answer 503; a silent one stays out of every header, an advertised one is in
//! them as if enforced; both count only admitted requests.

use crate::common::waits_up_to;
use std::time::Duration;

use http::StatusCode;
use tower::ServiceExt;
use tower_bulwark::rate_limit::RateLimitLayer;
use tower_bulwark::{
    clock::{ManualClock, TokioClock},
    Quota,
};

use super::accounting::{body_json, gcra, log, policy, req, sliding_log, svc, Inner, Mode};
use crate::common::listener::{sf_entries, sf_names};
use crate::support::{param, violated};

/// Promise: "A shadow policy never makes a request wait", with a single policy and with an
/// enforced policy that does not wait beside it.
#[tokio::test(start_paused = true)]
async fn a_lone_waiting_shadow_never_makes_a_request_wait() {
    let waits = waits_up_to(Quota::per_hour(1).unwrap(), Duration::from_secs(3 * 3600));
    let make = || gcra(waits, TokioClock::new(), Mode::Now);
    let lone = make();
    let inner = Inner::default();
    let alone = svc(
        RateLimitLayer::new(policy(0, &lone).shadow_advertised()),
        &inner,
    );
    let paired_shadow = make();
    let enforced = make();
    let paired = svc(
        RateLimitLayer::new(vec![
            policy(0, &paired_shadow).shadow(),
            policy(1, &enforced).cost_by(|p| u32::from(p.headers.contains_key("x-paid"))),
        ]),
        &inner,
    );
    let start = tokio::time::Instant::now();
    for i in 0..3 {
        let r = alone.clone().oneshot(req(&[])).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        let entries = sf_entries(r.headers(), "ratelimit");
        assert_eq!(entries.len(), 1);
        let r = paired.clone().oneshot(req(&[])).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        assert!(
            r.headers().get("ratelimit").is_none(),
            "only the silent shadow decided"
        );
    }
    let r = paired.clone().oneshot(req(&[("x-paid", "1")])).await;
    assert_eq!(r.unwrap().status(), StatusCode::OK);
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a shadow made a request wait"
    );
    assert_eq!(
        lone.net("k"),
        3,
        "the shadow counted (one now, two reservations)"
    );
    assert_eq!(paired_shadow.net("k"), 4);
}

/// Promise: shadow policies never make a request wait, never refuse and never answer 503; a
/// silent shadow stays out of every header (admitted, refused, legacy), an advertised one is in
/// them as if enforced on admitted responses.
#[tokio::test(start_paused = true)]
async fn shadows_never_refuse_never_wait_never_503_and_stay_out_of_headers() {
    let clock = ManualClock::new();
    let waits = waits_up_to(Quota::per_hour(1).unwrap(), Duration::from_secs(7200));
    let waiting = |mode| sliding_log(waits, clock.clone(), mode);
    let silent_wait = waiting(Mode::Now);
    let adv_wait = waiting(Mode::Later(1));
    let silent_full = log(3, &clock, Mode::Now);
    let silent_fail = log(1, &clock, Mode::LaterFail(1));
    let enforced = log(2, &clock, Mode::Later(1));
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &silent_wait)
                .shadow()
                .and(policy(1, &adv_wait).shadow_advertised())
                .and(policy(2, &silent_full).shadow().cost(3))
                .and(policy(3, &silent_fail).shadow())
                .and(policy(4, &enforced).count_if(|r| r.status != StatusCode::OK)),
        )
        .with_legacy_headers(),
        &inner,
    );
    let start = tokio::time::Instant::now();
    let mut statuses = Vec::new();
    for i in 0..4 {
        let status = if i < 2 { "500" } else { "200" };
        let response = service
            .clone()
            .oneshot(req(&[("x-status", status)]))
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO, "request {i} waited");
        statuses.push(response.status());
        for header in ["ratelimit-policy", "ratelimit"] {
            let names = sf_names(response.headers(), header);
            assert!(
                !names
                    .iter()
                    .any(|n| ["p0", "p2", "p3"].contains(&n.as_str())),
                "request {i}: a silent shadow in {header}: {names:?}"
            );
        }
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(sf_names(response.headers(), "ratelimit"), ["p4"]);
            assert_eq!(response.headers()["x-ratelimit-limit"], "2");
            assert_eq!(violated(&body_json(response)), ["p4"]);
        } else {
            let entries = sf_entries(response.headers(), "ratelimit");
            let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
            assert_eq!(names, ["p1", "p4"], "request {i}");
            assert_ne!(
                response.headers()["x-ratelimit-limit"],
                "3",
                "request {i}: the silent shadow binds the legacy headers"
            );
            if i >= 1 {
                assert_eq!(param(&entries[0], "r"), 0, "the advertised shadow is over");
            }
        }
    }
    assert_eq!(
        statuses,
        [
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(inner.calls(), 2);
    // The shadows counted the admitted requests only (the refused ones gave theirs back).
    assert_eq!(silent_full.net("k"), 3);
    assert_eq!(silent_wait.net("k"), 2, "one now, one reservation");
    assert_eq!(enforced.net("k"), 2);
    for a in [
        &silent_wait,
        &adv_wait,
        &silent_full,
        &silent_fail,
        &enforced,
    ] {
        assert_eq!(a.bad_refunds(), 0);
    }
}
