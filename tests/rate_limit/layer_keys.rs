//! RateLimitLayer through axum's router with `oneshot` and a manual clock, on the key of a
//! request: each client its own budget (IPv6 by prefix), forwarding headers only behind trusted
//! proxies and never choosing the key when malformed, a request without a key, and a closure as
//! the key.

use std::net::IpAddr;

use crate::support::{json, keyed, peer};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{
    Cidr, FailMode, ForwardedIp, HeaderKey, KeyError, PeerIp, Policy, RateLimitLayer,
};
use tower_bulwark::{clock::ManualClock, Quota};

use super::layer_support::*;

#[tokio::test]
async fn clients_have_their_own_budgets_and_ipv6_is_keyed_by_its_64() {
    let clock = ManualClock::new();
    let app = orders_per_peer("per-ip", Quota::per_second(2).unwrap(), &clock);
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
async fn an_ipv4_prefix_groups_a_network_for_peers_and_forwarded_clients() {
    let clock = ManualClock::new();
    let by_peer = orders(RateLimitLayer::new(
        Policy::new(
            "per-24",
            PeerIp::new().ipv4_prefix(24),
            keyed(Quota::per_second(1).unwrap(), &clock),
        )
        .unwrap(),
    ));
    let forwarded = ForwardedIp::x_forwarded_for(["10.0.0.0/8".parse::<Cidr>().unwrap()]);
    let by_client = orders(RateLimitLayer::new(
        Policy::new(
            "per-24",
            forwarded.ipv4_prefix(24),
            keyed(Quota::per_second(1).unwrap(), &clock),
        )
        .unwrap(),
    ));
    let proxy = peer("10.0.0.2");
    let from = |client| [("x-forwarded-for", client)];
    // One address of a /24 spends the network's budget: another of it is refused, one of the
    // next /24 is not, and a mapped address of the first /24 is the same IPv4 network.
    for (first, same, mapped, next) in [
        ("192.0.2.1", "192.0.2.254", "::ffff:192.0.2.9", "192.0.3.1"),
        (
            "198.51.100.1",
            "198.51.100.200",
            "::ffff:198.51.100.7",
            "198.51.101.1",
        ),
    ] {
        assert_eq!(
            send(&by_peer, peer(first), &[]).await.status(),
            StatusCode::OK
        );
        for refused in [same, mapped] {
            let status = send(&by_peer, peer(refused), &[]).await.status();
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
        }
        assert_eq!(
            send(&by_peer, peer(next), &[]).await.status(),
            StatusCode::OK
        );
        assert_eq!(
            send(&by_client, proxy, &from(first)).await.status(),
            StatusCode::OK
        );
        for refused in [same, mapped] {
            let status = send(&by_client, proxy, &from(refused)).await.status();
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
        }
        assert_eq!(
            send(&by_client, proxy, &from(next)).await.status(),
            StatusCode::OK
        );
    }
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
