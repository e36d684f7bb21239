//! RateLimitLayer through axum's router with `oneshot` and a manual clock: no listener, no sleeps.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::listener::sf_entries;
use crate::common::poll_once;
use crate::support::{json, keyed, peer, Broken};
use axum::body::{to_bytes, Body};
use axum::extract::connect_info::MockConnectInfo;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::rate_limit::{
    Cidr, FailMode, ForwardedIp, GlobalKey, HeaderKey, KeyError, PeerIp, Policy, PolicySet,
    RateLimitLayer, Refusal,
};
use tower_bulwark::{
    algorithm::SlidingLog,
    clock::{ManualClock, TokioClock},
    limiter::Decision,
    BoxError, KeyedRateLimiter, Limiter, Quota,
};

type IpLimiter = KeyedRateLimiter<IpAddr, tower_bulwark::algorithm::Gcra, ManualClock>;

fn orders<P: PolicySet>(layer: RateLimitLayer<P>) -> Router {
    Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(layer)
}

async fn send(app: &Router, from: SocketAddr, headers: &[(&str, &str)]) -> Response {
    let mut request = Request::get("/orders").body(Body::empty()).unwrap();
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        let value = http::HeaderValue::from_bytes(value.as_bytes()).unwrap();
        request.headers_mut().append(name, value);
    }
    app.clone()
        .layer(MockConnectInfo(from))
        .oneshot(request)
        .await
        .unwrap()
}

async fn body(response: Response) -> Bytes {
    to_bytes(response.into_body(), usize::MAX).await.unwrap()
}

fn params(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[tokio::test]
async fn ten_pass_the_eleventh_is_refused_and_a_second_later_one_passes() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_second(10).unwrap(), &clock);
    let app = orders(RateLimitLayer::new(
        Policy::new("per-ip", PeerIp::new(), limiter).unwrap(),
    ));
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
    let limiter = keyed(Quota::per_hour(1).unwrap(), &clock);
    let app = orders(RateLimitLayer::new(
        Policy::new(name, PeerIp::new(), limiter).unwrap(),
    ));
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
    let limiter = keyed(Quota::per_minute(1).unwrap(), &clock);
    let app = orders(RateLimitLayer::new(
        Policy::new("slow", PeerIp::new(), limiter).unwrap(),
    ));
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
async fn clients_have_their_own_budgets_and_ipv6_is_keyed_by_its_64() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_second(2).unwrap(), &clock);
    let app = orders(RateLimitLayer::new(
        Policy::new("per-ip", PeerIp::new(), limiter).unwrap(),
    ));
    for client in ["192.0.2.1", "192.0.2.2"] {
        for _ in 0..2 {
            assert_eq!(send(&app, peer(client), &[]).await.status(), StatusCode::OK);
        }
        assert_eq!(
            send(&app, peer(client), &[]).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    // Rotating addresses inside one /64 does not escape the limit...
    let rotating = [
        "2001:db8:0:1::1",
        "2001:db8:0:1::2",
        "2001:db8:0:1:ffff:ffff:ffff:ffff",
    ];
    assert_eq!(
        send(&app, peer(rotating[0]), &[]).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, peer(rotating[1]), &[]).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, peer(rotating[2]), &[]).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // ...while the next /64 is another client.
    assert_eq!(
        send(&app, peer("2001:db8:0:2::1"), &[]).await.status(),
        StatusCode::OK
    );
    // An IPv4 client seen through a dual-stack socket is the same IPv4 client.
    assert_eq!(
        send(&app, peer("::ffff:192.0.2.1"), &[]).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_wider_ipv6_prefix_groups_more_addresses() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_second(1).unwrap(), &clock);
    let app = orders(RateLimitLayer::new(
        Policy::new("per-48", PeerIp::new().ipv6_prefix(48), limiter).unwrap(),
    ));
    assert_eq!(
        send(&app, peer("2001:db8:1:1::1"), &[]).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, peer("2001:db8:1:ffff::1"), &[]).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, peer("2001:db8:2::1"), &[]).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn an_untrusted_peer_cannot_choose_its_key_with_forwarding_headers() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_second(1).unwrap(), &clock);
    let layer = RateLimitLayer::new(
        Policy::new(
            "per-client",
            ForwardedIp::x_forwarded_for(["10.0.0.0/8".parse::<Cidr>().unwrap()]),
            limiter,
        )
        .unwrap(),
    );
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(layer);
    let attacker = peer("198.51.100.66");
    assert_eq!(
        send(&app, attacker, &[("x-forwarded-for", "192.0.2.1")])
            .await
            .status(),
        StatusCode::OK
    );
    for forged in ["192.0.2.2", "192.0.2.3, 10.0.0.1", "garbage"] {
        assert_eq!(
            send(&app, attacker, &[("x-forwarded-for", forged)])
                .await
                .status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{forged}"
        );
    }
}

#[tokio::test]
async fn behind_trusted_proxies_the_rightmost_untrusted_address_is_the_client() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_second(1).unwrap(), &clock);
    let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()];
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new(
                "per-client",
                ForwardedIp::x_forwarded_for(trusted.clone()),
                limiter.clone(),
            )
            .unwrap(),
        ));
    let proxy = peer("10.0.0.2");
    // The client wrote 6.6.6.6 itself; the edge proxy appended the address it saw, 192.0.2.7,
    // and an inner proxy appended the edge proxy's address.
    let chain = [("x-forwarded-for", "6.6.6.6, 192.0.2.7, 10.0.0.1")];
    assert_eq!(send(&app, proxy, &chain).await.status(), StatusCode::OK);
    assert_eq!(
        send(&app, proxy, &chain).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // The same client with another forged prefix is still 192.0.2.7.
    let forged = [("x-forwarded-for", "1.1.1.1, 192.0.2.7, 10.0.0.1")];
    assert_eq!(
        send(&app, proxy, &forged).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Split over two header lines, the list is the same.
    let split = [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "192.0.2.7, 10.0.0.1"),
    ];
    assert_eq!(
        send(&app, proxy, &split).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client behind the same proxy has its own budget.
    let other = [("x-forwarded-for", "192.0.2.8")];
    assert_eq!(send(&app, proxy, &other).await.status(), StatusCode::OK);

    // RFC 7239 `Forwarded`, with IPv6 clients keyed by their /64.
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("per-client", ForwardedIp::forwarded(trusted), limiter).unwrap(),
        ));
    let v6 = [(
        "forwarded",
        r#"for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https, for="[fd00::1]""#,
    )];
    assert_eq!(
        send(&app, peer("fd00::2"), &v6).await.status(),
        StatusCode::OK
    );
    let same_64 = [("forwarded", r#"for="[2001:db8:cafe::99]""#)];
    assert_eq!(
        send(&app, peer("10.9.9.9"), &same_64).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn malformed_forwarding_headers_never_panic_and_never_choose_the_key() {
    let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
    let xff = ForwardedIp::x_forwarded_for(trusted.clone());
    let fwd = ForwardedIp::forwarded(trusted);
    let proxy: IpAddr = "10.0.0.2".parse().unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let answer = |r: Result<IpAddr, KeyError>| match r {
        Ok(ip) => Some(ip),
        Err(e) => {
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{e}");
            None
        }
    };

    // (header value, expected client). A hop that cannot be read before the client's address is
    // found is a 400 (`None`): never the trusted proxy's address, never one the sender wrote.
    let xff_cases: &[(&[u8], Option<IpAddr>)] = &[
        (b"", Some(proxy)),
        (b",,, ,", Some(proxy)),
        (b"192.0.2.1", Some(ip("192.0.2.1"))),
        (b" 192.0.2.1 ,, ", Some(ip("192.0.2.1"))),
        (b"192.0.2.1:8080", Some(ip("192.0.2.1"))),
        (b"[2001:db8::1]:443", Some(ip("2001:db8::1"))),
        (b"unknown", None),
        (b"192.0.2.1, garbage", None),
        (b"garbage, 192.0.2.1", Some(ip("192.0.2.1"))),
        (b"192.0.2.1, 10.0.0.9, not-an-ip", None),
        (b"192.0.2.1, not-an-ip, 10.0.0.9", None),
        (b"300.1.1.1", None),
        (b"192.0.2.1/24", None),
        (b"[2001:db8::1", None),
        (b"2001:db8::1]", None),
        (b"::ffff:10.0.0.5", Some(ip("::ffff:10.0.0.5"))),
        (b"\xff\xfe\xfd", None),
        (b"192.0.2.1\xff", None),
        (b"\"192.0.2.1\"", None),
        (&[b'1'; 4000], None),
    ];
    for (value, expected) in xff_cases {
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(value).unwrap(),
        );
        assert_eq!(
            answer(xff.client_ip(proxy, &headers)),
            *expected,
            "X-Forwarded-For: {:?}",
            String::from_utf8_lossy(value)
        );
    }

    let fwd_cases: &[(&[u8], Option<IpAddr>)] = &[
        (b"", Some(proxy)),
        (
            b"for=192.0.2.60;proto=http;by=203.0.113.43",
            Some(ip("192.0.2.60")),
        ),
        (b"FOR=192.0.2.60", Some(ip("192.0.2.60"))),
        (
            b"for=\"[2001:db8:cafe::17]:4711\"",
            Some(ip("2001:db8:cafe::17")),
        ),
        (b"for=unknown", None),
        (b"for=_hidden, for=192.0.2.1", Some(ip("192.0.2.1"))),
        (b"for=192.0.2.1, for=_hidden", None),
        (b"proto=https", None),
        (b"for=192.0.2.1;for=192.0.2.2", None),
        (b"for=\"192.0.2.1", None),
        (b"for=\"192.0.2.1, for=192.0.2.2\"", None),
        (b"for", None),
        (b"for=", None),
        (b";;;,,,", None),
        (b"for=192.0.2.1;;", Some(ip("192.0.2.1"))),
        (b"for=\"\\\"\"", None),
        (b"for=\xff", None),
        (b"for=192.0.2.1, for=10.0.0.7", Some(ip("192.0.2.1"))),
        // Every hop trusted: the request came from inside; the leftmost trusted hop is the key.
        (b"for=10.0.0.9, for=10.0.0.7", Some(ip("10.0.0.9"))),
    ];
    for (value, expected) in fwd_cases {
        let mut headers = HeaderMap::new();
        headers.insert("forwarded", http::HeaderValue::from_bytes(value).unwrap());
        assert_eq!(
            answer(fwd.client_ip(proxy, &headers)),
            *expected,
            "Forwarded: {:?}",
            String::from_utf8_lossy(value)
        );
    }
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
async fn a_request_without_a_key_gets_the_documented_answer() {
    let clock = ManualClock::new();
    // No ConnectInfo: the server is set up wrong, 500 with problem+json and no internals.
    let limiter = keyed(Quota::per_second(1).unwrap(), &clock);
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("per-ip", PeerIp::new(), limiter.clone()).unwrap(),
        ));
    let request = || Request::get("/orders").body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem = json(response).await;
    assert_eq!(problem["status"], 500);
    assert!(!problem["detail"].as_str().unwrap().contains("ConnectInfo"));

    // Failing open lets it through, uncounted.
    let open = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(
            RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter).unwrap())
                .key_error_mode(FailMode::Open),
        );
    for _ in 0..3 {
        assert_eq!(
            open.clone().oneshot(request()).await.unwrap().status(),
            StatusCode::OK
        );
    }

    // A missing API key is the client's fault: 400, and the reason is told.
    let per_key = keyed(Quota::per_second(1).unwrap(), &clock);
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("per-key", HeaderKey::new("x-api-key").unwrap(), per_key).unwrap(),
        ));
    let response = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let problem = json(response).await;
    assert!(problem["detail"].as_str().unwrap().contains("x-api-key"));
    let with_key = |key: &str| {
        Request::get("/orders")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        app.clone().oneshot(with_key("k1")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        app.clone().oneshot(with_key("k1")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        app.clone().oneshot(with_key("k2")).await.unwrap().status(),
        StatusCode::OK
    );
    let twice = Request::get("/orders")
        .header("x-api-key", "k3")
        .header("x-api-key", "k4")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        app.oneshot(twice).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn a_closure_can_be_the_key() {
    let clock = ManualClock::new();
    let limiter = keyed::<String>(Quota::per_second(1).unwrap(), &clock);
    let by_tenant = |head: &RequestHead| {
        head.uri
            .path()
            .split('/')
            .nth(1)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| KeyError::bad_request("no tenant in the path"))
    };
    let app = Router::new()
        .route("/{tenant}/orders", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            Policy::new("per-tenant", by_tenant, limiter).unwrap(),
        ));
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    let status = |path: &'static str| {
        let app = app.clone();
        async move { app.oneshot(get(path)).await.unwrap().status() }
    };
    assert_eq!(status("/acme/orders").await, StatusCode::OK);
    assert_eq!(status("/acme/orders").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status("/globex/orders").await, StatusCode::OK);
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

/// Counts the requests that reach the handler.
fn counting_app(
    limiter: KeyedRateLimiter<IpAddr, tower_bulwark::algorithm::Gcra, TokioClock>,
) -> (Router, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let app = Router::new()
        .route(
            "/orders",
            get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { "ok" }
            }),
        )
        .route_layer(RateLimitLayer::new(
            Policy::new("per-ip", PeerIp::new(), limiter).unwrap(),
        ))
        .layer(MockConnectInfo(peer("192.0.2.200")));
    (app, hits)
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_for_its_permit_then_proceeds() {
    let quota = Quota::per_second(1)
        .unwrap()
        .with_max_wait(Duration::from_secs(1))
        .unwrap();
    let limiter = KeyedRateLimiter::builder(quota)
        .clock(TokioClock::new())
        .build();
    let (app, hits) = counting_app(limiter);
    let get = || Request::get("/orders").body(Body::empty()).unwrap();
    let start = tokio::time::Instant::now();
    assert_eq!(
        app.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    // The second permit falls due in one second: the request waits for it, then passes.
    let waited = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(waited.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // Two permits ahead would be a wait of two seconds, more than `max_wait`: refused at once.
    assert_eq!(
        app.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );
    let mut third = Box::pin(app.clone().oneshot(get()));
    assert!(poll_once(Pin::new(&mut third)).is_pending());
    let refused = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "refused without waiting"
    );
    drop(third);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_request_gives_its_permit_back() {
    let quota = Quota::per_second(1)
        .unwrap()
        .with_max_wait(Duration::from_secs(1))
        .unwrap();
    let limiter = KeyedRateLimiter::builder(quota)
        .clock(TokioClock::new())
        .build();
    let (app, hits) = counting_app(limiter);
    let get = || Request::get("/orders").body(Body::empty()).unwrap();
    assert_eq!(
        app.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );

    // This one holds the next permit and waits for it...
    let mut waiting = Box::pin(app.clone().oneshot(get()));
    assert!(poll_once(Pin::new(&mut waiting)).is_pending());
    // ...so another would have to wait two seconds, and is refused.
    let refused = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // The waiting client goes away: its permit comes back, and the next request gets it.
    drop(waiting);
    let mut next = Box::pin(app.clone().oneshot(get()));
    assert!(
        poll_once(Pin::new(&mut next)).is_pending(),
        "it waits for the returned permit"
    );
    let start = tokio::time::Instant::now();
    assert_eq!(next.await.unwrap().status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "the dropped request never reached the handler"
    );
}

/// A limiter that answers like a remote one: the decision arrives on a later poll, and only once
/// `open` is set.
struct Remote {
    local: IpLimiter,
    open: Arc<std::sync::atomic::AtomicBool>,
    asked: Arc<AtomicUsize>,
}

impl Limiter<IpAddr> for Remote {
    type Future = Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send>>;

    fn quota(&self) -> Quota {
        Limiter::<IpAddr>::quota(&self.local)
    }

    fn reserve(&self, key: &IpAddr, cost: u32) -> Self::Future {
        let local = self.local.clone();
        let open = self.open.clone();
        let key = *key;
        self.asked.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::task::yield_now().await;
            while !open.load(Ordering::SeqCst) {
                tokio::task::yield_now().await;
            }
            Limiter::reserve(&local, &key, cost).await
        })
    }

    fn refund(&self, key: &IpAddr, cost: u32, decision: Decision) -> bool {
        Limiter::refund(&self.local, key, cost, decision)
    }

    /// As a limiter of its own that gives back only by refunds: the difference of a settle to
    /// less goes back through `refund`, and nothing is charged.
    fn settle(&self, key: &IpAddr, estimate: u32, decision: Decision, cost: u32) -> bool {
        cost < estimate && Limiter::refund(self, key, estimate - cost, decision)
    }
}

#[tokio::test]
async fn limiters_that_decide_later_are_awaited_and_refunded_like_the_others() {
    let clock = ManualClock::new();
    let local = keyed(Quota::per_second(5).unwrap(), &clock);
    let remote_state = keyed(Quota::per_second(2).unwrap(), &clock);
    let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let asked = Arc::new(AtomicUsize::new(0));
    let remote = Remote {
        local: remote_state.clone(),
        open: open.clone(),
        asked: asked.clone(),
    };
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("local", PeerIp::new(), BoxLimiter::new(local.clone()))
                .unwrap()
                .and(Policy::new("remote", PeerIp::new(), BoxLimiter::new(remote)).unwrap()),
        ));
    let client = peer("192.0.2.33");
    let ok = send(&app, client, &[]).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(body(ok).await, "ok");
    assert_eq!(send(&app, client, &[]).await.status(), StatusCode::OK);
    let refused = send(&app, client, &[]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let problem = json(refused).await;
    assert_eq!(problem["violated-policies"], serde_json::json!(["remote"]));
    // Two local permits spent by the admitted requests; the refused one's was given back.
    assert_eq!(local.check(&client.ip()).remaining, 2);
    assert_eq!(asked.load(Ordering::SeqCst), 3);

    // A request whose remote decision is still out when the client goes away gives back the
    // local permit it already holds.
    open.store(false, Ordering::SeqCst);
    let other = peer("192.0.2.34");
    let mut request = Request::get("/orders").body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(other));
    let mut in_flight = Box::pin(app.clone().oneshot(request));
    assert!(poll_once(Pin::new(&mut in_flight)).is_pending());
    assert!(poll_once(Pin::new(&mut in_flight)).is_pending());
    assert_eq!(
        asked.load(Ordering::SeqCst),
        4,
        "the remote policy is being asked"
    );
    let probe = local.check(&other.ip());
    assert_eq!(probe.remaining, 3, "one local permit is held");
    // The probe goes back, so the held permit is the key's latest admission again (a GCRA
    // refund gives back only that one).
    Limiter::refund(&local, &other.ip(), 1, probe);
    drop(in_flight);
    assert_eq!(
        local.check(&other.ip()).remaining,
        4,
        "and given back: only this check holds a permit"
    );
}

/// With headers off, one policy takes the shortest way (the limiter only says whether the
/// permits were taken at once). Every algorithm must still wait, refuse and count exactly there:
/// 3 at once, a 4th that waits for its permit, a 5th refused with `Retry-After`, and 300
/// concurrent requests racing for the 37 permits of another key get exactly 37.
#[tokio::test(start_paused = true)]
async fn with_headers_off_every_algorithm_waits_refuses_and_counts_exactly() {
    use tower_bulwark::algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter};

    async fn run<A: Algorithm>(name: &str) {
        let quota = Quota::per_second(3)
            .unwrap()
            .with_max_wait(Duration::from_millis(400))
            .unwrap();
        let limiter = KeyedRateLimiter::<IpAddr>::builder(quota)
            .algorithm::<A>()
            .clock(TokioClock::new())
            .build();
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let app = Router::new()
            .route(
                "/orders",
                get(move || {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async { "ok" }
                }),
            )
            .route_layer(
                RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter).unwrap())
                    .without_admitted_headers(),
            );
        let from = |ip: &str| app.clone().layer(MockConnectInfo(peer(ip)));
        let request = || Request::get("/orders").body(Body::empty()).unwrap();
        let client = "192.0.2.10";
        for _ in 0..3 {
            let ok = from(client).oneshot(request()).await.unwrap();
            assert_eq!(ok.status(), StatusCode::OK, "{name}");
            assert!(!ok.headers().contains_key("ratelimit"), "{name}");
        }
        // The algorithms that can reserve a later permit make the 4th wait for it (the window
        // algorithms, whose next permit is a window away, refuse it); the 5th, at the same
        // instant, would wait past `max_wait` and is refused at once.
        let start = tokio::time::Instant::now();
        let fourth = tokio::spawn(from(client).oneshot(request()));
        tokio::task::yield_now().await;
        let fifth = from(client).oneshot(request()).await.unwrap();
        assert_eq!(fifth.status(), StatusCode::TOO_MANY_REQUESTS, "{name}");
        assert!(fifth.headers().contains_key("retry-after"), "{name}");
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "{name}: refused without waiting"
        );
        let fourth = fourth.await.unwrap().unwrap();
        if fourth.status() == StatusCode::OK {
            assert!(start.elapsed() > Duration::ZERO, "{name}: admitted at once");
            assert!(start.elapsed() <= Duration::from_millis(400), "{name}");
        } else {
            assert_eq!(fourth.status(), StatusCode::TOO_MANY_REQUESTS, "{name}");
        }
        let admitted_so_far = hits.load(Ordering::SeqCst);

        // 300 requests of one client at once, for a fresh budget of 37.
        let quota = Quota::per_hour(37).unwrap();
        let limiter = KeyedRateLimiter::<IpAddr>::builder(quota)
            .algorithm::<A>()
            .clock(TokioClock::new())
            .build();
        let app = Router::new()
            .route("/orders", get(|| async { "ok" }))
            .route_layer(
                RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter).unwrap())
                    .without_admitted_headers(),
            )
            .layer(MockConnectInfo(peer("192.0.2.11")));
        let tasks: Vec<_> = (0..300)
            .map(|_| tokio::spawn(app.clone().oneshot(request())))
            .collect();
        let mut ok = 0;
        for task in tasks {
            let response = task.await.unwrap().unwrap();
            match response.status() {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("{name}: {other}"),
            }
        }
        assert_eq!(ok, 37, "{name}");
        assert!((3..=4).contains(&admitted_so_far), "{name}");
    }
    run::<Gcra>("gcra").await;
    run::<FixedWindow>("fixed window").await;
    run::<SlidingLog>("sliding log").await;
    run::<SlidingCounter>("sliding counter").await;
}
