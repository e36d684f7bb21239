//! RateLimitLayer through axum's router with `oneshot` and a manual clock: no listener, no sleeps.
//! What a client gets back (refusals, `Retry-After`, headers and bodies, a hook's refusal),
//! several policies and routes, and a limiter that fails. Keys are in `layer_keys.rs`, waiting
//! and deferred decisions in `layer_waits.rs`.

use std::time::Duration;

use crate::common::listener::sf_entries;
use crate::support::{json, keyed, peer, Broken};
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::rate_limit::{FailMode, GlobalKey, PeerIp, Policy, RateLimitLayer, Refusal};
use tower_bulwark::{algorithm::SlidingLog, clock::ManualClock, KeyedRateLimiter, Quota};

use super::layer_support::*;

#[tokio::test]
async fn ten_pass_the_eleventh_is_refused_and_a_second_later_one_passes() {
    let clock = ManualClock::new();
    let app = orders_per_peer("per-ip", Quota::per_second(10).unwrap(), &clock);
    let client = peer("203.0.113.9");

    for i in 0..10 {
        let response = send(&app, client, &[]).await;
        assert_eq!(response.status(), StatusCode::OK, "request {i}");
        let headers = response.headers().clone();
        assert_eq!(
            sf_entries(&headers, "ratelimit-policy"),
            [("per-ip".to_string(), params(&[("q", 10), ("w", 1)]))]
        );
        assert_eq!(
            sf_entries(&headers, "ratelimit"),
            [("per-ip".to_string(), params(&[("r", 9 - i), ("t", 1)]))]
        );
        assert_eq!(body(response).await, "ok");
    }

    let refused = send(&app, client, &[]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let headers = refused.headers().clone();
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(
        sf_entries(&headers, "ratelimit-policy"),
        [("per-ip".to_string(), params(&[("q", 10), ("w", 1)]))]
    );
    assert_eq!(
        sf_entries(&headers, "ratelimit"),
        [("per-ip".to_string(), params(&[("r", 0), ("t", 1)]))]
    );
    let problem = json(refused).await;
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["status"], 429);
    assert!(problem["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert_eq!(
        problem["detail"],
        "The request exceeds the quota of 'per-ip'; retry in 1 second."
    );
    assert_eq!(problem["violated-policies"], serde_json::json!(["per-ip"]));

    clock.advance(Duration::from_secs(1));
    let again = send(&app, client, &[]).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(body(again).await, "ok");
}

#[tokio::test]
async fn a_policy_name_with_quotes_and_backslashes_is_escaped_in_headers_and_body() {
    let clock = ManualClock::new();
    let name = r#"say "hi" \ twice"#;
    let app = orders_per_peer(name, Quota::per_hour(1).unwrap(), &clock);
    let client = peer("198.51.100.4");
    assert_eq!(send(&app, client, &[]).await.status(), StatusCode::OK);

    let refused = send(&app, client, &[]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "3600");
    assert_eq!(
        sf_entries(refused.headers(), "ratelimit"),
        [(name.to_string(), params(&[("r", 0), ("t", 3600)]))]
    );
    let problem = json(refused).await;
    assert_eq!(
        problem["detail"],
        format!("The request exceeds the quota of '{name}'; retry in 3600 seconds.")
    );
    assert_eq!(problem["violated-policies"], serde_json::json!([name]));
}

#[tokio::test]
async fn retry_after_rounds_up_and_is_never_zero() {
    let clock = ManualClock::new();
    let app = orders_per_peer("slow", Quota::per_minute(1).unwrap(), &clock);
    let client = peer("198.51.100.1");
    assert_eq!(send(&app, client, &[]).await.status(), StatusCode::OK);
    clock.advance(Duration::from_millis(500));
    let refused = send(&app, client, &[]).await;
    // 59.5 s left: the header says 60, never 59.
    assert_eq!(refused.headers()["retry-after"], "60");
    clock.advance(Duration::from_millis(59_499));
    let refused = send(&app, client, &[]).await;
    // 1 ms left: 1, never 0.
    assert_eq!(refused.headers()["retry-after"], "1");
    clock.advance(Duration::from_millis(1));
    assert_eq!(send(&app, client, &[]).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn several_policies_a_refused_request_spends_nothing_and_names_what_it_violated() {
    let clock = ManualClock::new();
    let per_second = keyed(Quota::per_second(2).unwrap(), &clock);
    let per_minute = keyed(Quota::per_minute(3).unwrap(), &clock);
    let app = orders(RateLimitLayer::new(
        Policy::new("per-second", PeerIp::new(), per_second.clone())
            .unwrap()
            .and(Policy::new("per-minute", PeerIp::new(), per_minute.clone()).unwrap()),
    ));
    let client = peer("192.0.2.10");
    let ok = send(&app, client, &[]).await;
    assert_eq!(
        sf_entries(ok.headers(), "ratelimit-policy"),
        [
            ("per-second".to_string(), params(&[("q", 2), ("w", 1)])),
            ("per-minute".to_string(), params(&[("q", 3), ("w", 60)])),
        ]
    );
    assert_eq!(
        sf_entries(ok.headers(), "ratelimit"),
        [
            ("per-second".to_string(), params(&[("r", 1), ("t", 1)])),
            // Whole again in 20 s, but two permits take 40 s at 3 per minute: draft -11's `t`
            // is the window in which to use no more than `r`, never a faster rate than q/w.
            ("per-minute".to_string(), params(&[("r", 2), ("t", 40)])),
        ]
    );
    assert_eq!(send(&app, client, &[]).await.status(), StatusCode::OK);
    // The per-second policy refuses the third; the per-minute permit it was granted goes back.
    for _ in 0..5 {
        let refused = send(&app, client, &[]).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let problem = json(refused).await;
        assert_eq!(
            problem["violated-policies"],
            serde_json::json!(["per-second"])
        );
    }
    let key = client.ip();
    assert_eq!(
        per_minute.check(&key).remaining,
        0,
        "two spent, one left, this takes it"
    );

    // A second later the per-second policy admits, but the per-minute one is spent (GCRA, one
    // permit every 20 s; the one taken at 0 s is replenished at 20 s): it alone is named, with
    // its own wait.
    clock.advance(Duration::from_secs(1));
    let refused = send(&app, client, &[]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "19");
    let problem = json(refused).await;
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["per-minute"])
    );
    // The per-second permit of that refused request was given back.
    assert_eq!(per_second.check(&key).remaining, 1);
}

#[tokio::test]
async fn two_violated_policies_are_both_named_with_the_longest_retry_after() {
    let clock = ManualClock::new();
    let a = keyed::<()>(Quota::per_second(1).unwrap(), &clock);
    let b = KeyedRateLimiter::<()>::builder(Quota::per_hour(1).unwrap())
        .clock(clock.clone())
        .algorithm::<SlidingLog>()
        .build();
    let layer = RateLimitLayer::new(
        Policy::new("burst", GlobalKey, BoxLimiter::new(a))
            .unwrap()
            .and(Policy::new("hourly", GlobalKey, BoxLimiter::new(b)).unwrap()),
    );
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let get = || Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(
        app.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );
    let refused = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "3600");
    assert_eq!(
        sf_entries(refused.headers(), "ratelimit"),
        [
            ("burst".to_string(), params(&[("r", 0), ("t", 1)])),
            ("hourly".to_string(), params(&[("r", 0), ("t", 3600)])),
        ]
    );
    let problem = json(refused).await;
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["burst", "hourly"])
    );
    assert_eq!(
        problem["detail"],
        "The request exceeds the quota of 'burst' and 'hourly'; retry in 3600 seconds."
    );
}

#[tokio::test]
async fn routes_carry_their_own_policies_and_unlimited_routes_are_untouched() {
    let clock = ManualClock::new();
    let strict = keyed(Quota::per_second(1).unwrap(), &clock);
    let loose = keyed(Quota::per_second(3).unwrap(), &clock);
    let app = Router::new()
        .route(
            "/orders",
            get(|| async { "orders" }).route_layer(RateLimitLayer::new(
                Policy::new("orders", PeerIp::new(), strict).unwrap(),
            )),
        )
        .route(
            "/search",
            get(|| async { "search" }).route_layer(RateLimitLayer::new(
                Policy::new("search", PeerIp::new(), loose).unwrap(),
            )),
        )
        .route("/health", get(|| async { "up" }))
        .layer(MockConnectInfo(peer("192.0.2.50")));
    let status = |path: &'static str| {
        let app = app.clone();
        async move {
            let response = app
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            (
                response.status(),
                response.headers().contains_key("ratelimit"),
            )
        }
    };
    assert_eq!(status("/orders").await, (StatusCode::OK, true));
    assert_eq!(status("/orders").await.0, StatusCode::TOO_MANY_REQUESTS);
    for _ in 0..3 {
        assert_eq!(status("/search").await, (StatusCode::OK, true));
    }
    assert_eq!(status("/search").await.0, StatusCode::TOO_MANY_REQUESTS);
    for _ in 0..20 {
        assert_eq!(status("/health").await, (StatusCode::OK, false));
    }
}

#[tokio::test]
async fn works_in_a_service_builder_and_clones_share_one_budget() {
    let clock = ManualClock::new();
    let limiter = keyed::<()>(Quota::per_second(3).unwrap(), &clock);
    let layer = RateLimitLayer::new(Policy::new("global", GlobalKey, limiter).unwrap());
    async fn hi(_req: Request<Body>) -> Result<Response, std::convert::Infallible> {
        Ok(Response::new(Body::from("hi")))
    }
    let service = ServiceBuilder::new().layer(layer.clone()).service_fn(hi);
    let other = ServiceBuilder::new().layer(layer).service_fn(hi);
    let req = || Request::new(Body::empty());
    let mut statuses = Vec::new();
    for svc in [
        service.clone(),
        other.clone(),
        service.clone(),
        other.clone(),
        service,
    ] {
        statuses.push(svc.oneshot(req()).await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

#[tokio::test]
async fn responses_keep_the_inner_body_type_and_wrap_body_serves_any_body() {
    use http_body_util::combinators::UnsyncBoxBody;
    use http_body_util::{BodyExt, Full};
    use std::convert::Infallible;

    let once = || {
        let limiter = keyed::<()>(Quota::per_second(1).unwrap(), &ManualClock::new());
        RateLimitLayer::new(Policy::new("global", GlobalKey, limiter).unwrap())
    };
    // Sends two requests to a service with a budget of one: the status, headers and body of the
    // admitted response and of the refused one. `B` is the service's response body type.
    async fn admit_then_refuse<B, S>(svc: S) -> [(StatusCode, HeaderMap, Bytes); 2]
    where
        S: tower::Service<Request<Body>, Response = http::Response<B>> + Clone,
        S::Error: std::fmt::Debug,
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        let mut out = Vec::new();
        for _ in 0..2 {
            let response = svc
                .clone()
                .oneshot(Request::new(Body::empty()))
                .await
                .unwrap();
            let (parts, body) = response.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            out.push((parts.status, parts.headers, bytes));
        }
        out.try_into().unwrap()
    }
    let refusal_is_a_problem = |(status, headers, bytes): &(StatusCode, HeaderMap, Bytes)| {
        assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(headers["retry-after"], "1");
        assert_eq!(headers["content-type"], "application/problem+json");
        let problem: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(problem["status"], 429);
        assert_eq!(problem["violated-policies"], serde_json::json!(["global"]));
    };

    // By default the response body is the inner service's own type (here axum's `Body`, which
    // axum then passes on without boxing it again; `admit_then_refuse::<Body, _>` checks the
    // type); the 429 is made from bytes into that type.
    let same = ServiceBuilder::new()
        .layer(once())
        .service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::from("same")))
        });
    let [admitted, refused] = admit_then_refuse::<Body, _>(same).await;
    assert_eq!((admitted.0, &*admitted.2), (StatusCode::OK, &b"same"[..]));
    refusal_is_a_problem(&refused);

    // A body that cannot be made from bytes needs `wrap_body`.
    type Boxed = UnsyncBoxBody<Bytes, Infallible>;
    let wrapped =
        ServiceBuilder::new()
            .layer(once().wrap_body())
            .service_fn(|_: Request<Body>| async {
                let body: Boxed = Full::new(Bytes::from_static(b"boxed")).boxed_unsync();
                Ok::<_, Infallible>(http::Response::new(body))
            });
    let [admitted, refused] = admit_then_refuse(wrapped).await;
    assert_eq!((admitted.0, &*admitted.2), (StatusCode::OK, &b"boxed"[..]));
    assert_eq!(admitted.1["ratelimit"], r#""global";r=0;t=1"#);
    refusal_is_a_problem(&refused);
}

#[tokio::test]
async fn headers_on_admission_can_be_turned_off_and_legacy_headers_on() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_second(2).unwrap(), &clock);
    let app = orders(
        RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter.clone()).unwrap())
            .without_admitted_headers(),
    );
    let client = peer("192.0.2.77");
    let ok = send(&app, client, &[]).await;
    assert!(!ok.headers().contains_key("ratelimit"));
    assert!(!ok.headers().contains_key("ratelimit-policy"));

    let app = orders(
        RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter).unwrap())
            .with_legacy_headers(),
    );
    let ok = send(&app, client, &[]).await;
    assert_eq!(ok.headers()["x-ratelimit-limit"], "2");
    assert_eq!(ok.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(ok.headers()["x-ratelimit-reset"], "1");
    assert!(ok.headers().contains_key("ratelimit"));
    let refused = send(&app, client, &[]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["x-ratelimit-limit"], "2");
    assert_eq!(refused.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(refused.headers()["x-ratelimit-reset"], "1");
}

#[tokio::test]
async fn a_hook_builds_the_refusal() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_second(1).unwrap(), &clock);
    let app = orders(
        RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter).unwrap()).on_refusal(
            |refusal: &Refusal<'_>| {
                let mut response = refusal.default_response();
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                *response.body_mut() = Bytes::from(format!(
                    "{} {} refused by {}",
                    refusal.request().method,
                    refusal.request().uri,
                    refusal.violated_policies().collect::<Vec<_>>().join(",")
                ));
                response
            },
        ),
    );
    let client = peer("192.0.2.99");
    assert_eq!(send(&app, client, &[]).await.status(), StatusCode::OK);
    let refused = send(&app, client, &[]).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(body(refused).await, "GET /orders refused by per-ip");
}

#[tokio::test]
async fn a_failing_limiter_answers_503_or_fails_open() {
    let clock = ManualClock::new();
    let working = keyed(Quota::per_second(5).unwrap(), &clock);
    let quota = Quota::per_second(1).unwrap();
    let layer = |mode| {
        RateLimitLayer::new(
            Policy::new("local", PeerIp::new(), BoxLimiter::new(working.clone()))
                .unwrap()
                .and(Policy::new("shared", PeerIp::new(), BoxLimiter::new(Broken(quota))).unwrap()),
        )
        .limiter_error_mode(mode)
    };
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(layer(FailMode::Closed));
    let client = peer("192.0.2.5");
    let closed = send(&app, client, &[]).await;
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(closed.headers()["content-type"], "application/problem+json");
    // The local permit granted before the failure was given back.
    assert_eq!(working.check(&client.ip()).remaining, 4);

    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(layer(FailMode::Open));
    let open = send(&app, client, &[]).await;
    assert_eq!(open.status(), StatusCode::OK);
    // Only the policy that decided is reported.
    assert_eq!(
        sf_entries(open.headers(), "ratelimit"),
        [("local".to_string(), params(&[("r", 3), ("t", 1)]))]
    );
}
