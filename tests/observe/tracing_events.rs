//! Refusals as `tracing` events: each refused request at the layer, whatever built its limiters,
//! and each refusal of a named instance with its key; captured on the test's own thread while
//! the binary's other tests reach the same call sites on theirs (see
//! `common::process::thread_subscriber`).

use http::StatusCode;
use tower_bulwark::config::Registry;

use crate::common::process::{assert_once, debug_events, lines_with};
use crate::orders::{get_orders, router, runtime, ORDERS_CONFIG};

#[test]
fn a_refused_request_is_a_debug_event_naming_its_policies_with_limiters_built_in_code() {
    use axum::extract::connect_info::MockConnectInfo;
    use tower_bulwark::{KeyedRateLimiter, PeerIp, Policy, Quota, RateLimitLayer};

    let text = debug_events(|| {
        runtime().block_on(async {
            let per_ip = KeyedRateLimiter::new(Quota::per_hour(2).unwrap());
            let app = axum::Router::new()
                .route("/orders", axum::routing::get(|| async { "ok" }))
                .route_layer(RateLimitLayer::new(
                    Policy::new("per-ip", PeerIp::new(), per_ip).unwrap(),
                ))
                .layer(MockConnectInfo(std::net::SocketAddr::from((
                    [192, 0, 2, 1],
                    1,
                ))));
            for _ in 0..2 {
                assert_eq!(get_orders(&app).await, StatusCode::OK);
            }
            assert_eq!(get_orders(&app).await, StatusCode::TOO_MANY_REQUESTS);
        })
    });
    let refusals = lines_with(&text, "rate limit: refusing the request");
    assert_eq!(refusals.len(), 1, "{text}");
    assert!(refusals[0].contains("DEBUG"), "{}", refusals[0]);
    assert!(
        refusals[0].contains(r#"policies=["per-ip"]"#),
        "{}",
        refusals[0]
    );
    // One permit of two an hour: 30 minutes, less the moment the requests took.
    assert!(
        refusals[0].contains("retry_after_secs=1800"),
        "{}",
        refusals[0]
    );
}

#[test]
fn each_refusal_is_a_debug_event_with_name_key_and_delay_unless_keys_are_hidden() {
    let text = debug_events(|| {
        runtime().block_on(async {
            let registry = Registry::from_toml_str(ORDERS_CONFIG).unwrap();
            let api = router(&registry, "api", [198, 51, 100, 23]);
            for _ in 0..11 {
                get_orders(&api).await;
            }
            let private = router(&registry, "private", [192, 0, 2, 99]);
            get_orders(&private).await;
            assert_eq!(get_orders(&private).await, StatusCode::TOO_MANY_REQUESTS);
        });
    });
    let refusals = lines_with(&text, "rate limit refused a request");
    assert_eq!(refusals.len(), 2, "{text}");
    let api = refusals.iter().find(|l| l.contains("limiter=api")).unwrap();
    assert!(api.contains("DEBUG"), "{api}");
    assert!(api.contains("key=Ip(198.51.100.23)"), "{api}");
    // Six minutes (one permit of ten per hour) less the moments the requests took, in whole
    // milliseconds rounded up.
    let retry_ms: u64 = api
        .split("retry_after_ms=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!((359_000..=360_000).contains(&retry_ms), "{api}");
    let private = refusals
        .iter()
        .find(|l| l.contains("limiter=private"))
        .unwrap();
    assert!(
        !private.contains("192.0.2.99"),
        "a hidden key leaks: {private}"
    );
    assert!(private.contains("key=(hidden)"), "{private}");
}

/// A usage the policy's settle function cannot read is one `debug` line naming the policy (the
/// estimate stands); a settle function that panics is one `error` line. Once per request.
#[test]
fn an_unreadable_usage_is_one_log_line_naming_the_policy() {
    use tower::{Layer, ServiceExt};
    use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
    use tower_bulwark::{KeyedRateLimiter, Quota};

    let inner = tower::service_fn(|request: http::Request<axum::body::Body>| async move {
        let usage = request.headers().get("x-answer").cloned();
        let mut response = http::Response::new(axum::body::Body::empty());
        if let Some(usage) = usage {
            response.headers_mut().insert("x-usage-total-tokens", usage);
        }
        Ok::<_, std::convert::Infallible>(response)
    });
    let policy = Policy::new(
        "llm-tokens",
        GlobalKey,
        KeyedRateLimiter::new(Quota::per_minute(1000).unwrap()),
    )
    .unwrap()
    .cost(100)
    .settle_by(|response| {
        let value = response
            .headers
            .get("x-usage-total-tokens")?
            .to_str()
            .ok()?;
        if value == "panic" {
            panic!("a settle function that fails");
        }
        value.parse().ok()
    });
    let service = RateLimitLayer::new(policy).layer(inner);
    let call = |answer: Option<&'static str>| {
        let mut request = http::Request::new(axum::body::Body::empty());
        if let Some(answer) = answer {
            request
                .headers_mut()
                .insert("x-answer", answer.parse().unwrap());
        }
        let service = service.clone();
        runtime().block_on(async move { service.oneshot(request).await.unwrap() });
    };
    let unreadable = "no cost could be read from the response; the cost asked for stands";
    for answer in [None, Some("12.5"), Some("-1"), Some("99999999999")] {
        let logged = debug_events(|| call(answer));
        assert_eq!(
            logged.matches(unreadable).count(),
            1,
            "{answer:?}: {logged}"
        );
        assert!(logged.contains("llm-tokens"), "{logged}");
    }
    let logged = debug_events(|| call(Some("12")));
    assert!(!logged.contains(unreadable), "{logged}");
    let logged = debug_events(|| call(Some("panic")));
    assert_once(&logged, "settle function panicked");
    assert!(logged.contains("ERROR"), "{logged}");
}

/// A malformed or absurd field of a family of tokens is one log line, however many readings
/// use it (the quota of calls, when the tokens are spent, and the tokens themselves).
#[test]
fn a_malformed_token_field_is_one_log_line() {
    use tower_bulwark::outbound::Pushback;

    let observe = |fields: &[(&'static str, &str)]| {
        let pushback = Pushback::builder("llm")
            .clock(tower_bulwark::clock::ManualClock::new())
            .max_hold(std::time::Duration::from_secs(60))
            .build();
        let mut response = http::Response::new(());
        for (name, value) in fields {
            response.headers_mut().insert(*name, value.parse().unwrap());
        }
        debug_events(|| pushback.observe(&response))
    };
    let malformed = observe(&[
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-tokens", "soon"),
    ]);
    assert_once(&malformed, "malformed rate-limit field");
    let capped = observe(&[
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-tokens", "6m0s"),
    ]);
    assert_once(&capped, "longer hold than max_hold");
}

/// A wait said in milliseconds is one figure wherever it is logged: a named limiter's refusal
/// and a shadow policy's "would have refused" both round 1.5 ms up to 2 (the shadow event
/// rounded it down to 1 before).
#[test]
fn a_wait_in_milliseconds_is_rounded_up_alike_in_every_log_event() {
    use std::time::Duration;
    use tower::{Layer, ServiceExt};
    use tower_bulwark::clock::ManualClock;
    use tower_bulwark::observe::Observed;
    use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
    use tower_bulwark::{DirectRateLimiter, Quota};

    // One permit each 1.5 ms, a burst of one: the second request waits 1.5 ms.
    let quota = Quota::with_period(2, Duration::from_millis(3))
        .and_then(|q| q.with_burst(1))
        .unwrap();
    let limiter = DirectRateLimiter::builder(quota)
        .clock(ManualClock::new())
        .build();
    let policy = Policy::new("watched", GlobalKey, Observed::new("watched", limiter))
        .unwrap()
        .shadow();
    let inner = tower::service_fn(|_: http::Request<axum::body::Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
    });
    let service = RateLimitLayer::new(policy).layer(inner);
    let text = debug_events(|| {
        runtime().block_on(async {
            for _ in 0..2 {
                let request = http::Request::new(axum::body::Body::empty());
                let response = service.clone().oneshot(request).await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
            }
        })
    });
    for event in [
        "rate limit refused a request",
        "the policy would have refused the request",
    ] {
        let lines = lines_with(&text, event);
        assert_eq!(lines.len(), 1, "{event}: {text}");
        assert!(lines[0].contains("retry_after_ms=2"), "{}", lines[0]);
    }
}
