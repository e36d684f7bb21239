//! Exemptions: requests that skip every policy reach the service uncounted and carry no
//! rate-limit headers; everything else is limited as before.

use std::net::IpAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{Cidr, PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{clock::ManualClock, KeyedRateLimiter, Quota};

use crate::support::{keyed, peer};

fn limiter() -> KeyedRateLimiter<IpAddr, tower_bulwark::algorithm::Gcra, ManualClock> {
    keyed(Quota::per_hour(1).unwrap(), &ManualClock::new())
}

fn app(
    layer: RateLimitLayer<
        Policy<PeerIp, KeyedRateLimiter<IpAddr, tower_bulwark::algorithm::Gcra, ManualClock>>,
    >,
    client: &str,
) -> Router {
    Router::new()
        .route("/health", get(|| async { "up" }))
        .route("/orders", get(|| async { "ok" }))
        .route_layer(layer)
        .layer(MockConnectInfo(peer(client)))
}

async fn get_path(app: &Router, path: &str) -> (StatusCode, bool) {
    let response = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let headers = response.headers();
    let has_ratelimit_headers = headers.contains_key("ratelimit")
        || headers.contains_key("ratelimit-policy")
        || headers.contains_key("retry-after");
    (response.status(), has_ratelimit_headers)
}

#[tokio::test]
async fn an_exempt_path_is_never_counted_nor_given_headers() {
    let per_ip = limiter();
    let layer = RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), per_ip.clone()).unwrap())
        .exempt(|head: &RequestHead| head.uri.path() == "/health");
    let app = app(layer, "198.51.100.1");
    for _ in 0..20 {
        assert_eq!(get_path(&app, "/health").await, (StatusCode::OK, false));
    }
    assert_eq!(per_ip.len(), 0, "exempt requests leave no key behind");
    // Everything else is limited as before, headers and all.
    assert_eq!(get_path(&app, "/orders").await, (StatusCode::OK, true));
    assert_eq!(
        get_path(&app, "/orders").await,
        (StatusCode::TOO_MANY_REQUESTS, true)
    );
    // And the health check still passes while the client is limited.
    assert_eq!(get_path(&app, "/health").await, (StatusCode::OK, false));
}

#[tokio::test]
async fn exempt_networks_match_the_tcp_peer_and_exemptions_add_up() {
    let per_ip = limiter();
    let layer = RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), per_ip.clone()).unwrap())
        .exempt_networks(["10.0.0.0/8".parse::<Cidr>().unwrap()])
        .exempt(|head: &RequestHead| head.uri.path() == "/health");
    let internal = app(layer.clone(), "10.1.2.3");
    for _ in 0..5 {
        assert_eq!(
            get_path(&internal, "/orders").await,
            (StatusCode::OK, false)
        );
    }
    assert_eq!(per_ip.len(), 0);
    let outside = app(layer, "198.51.100.2");
    assert_eq!(get_path(&outside, "/orders").await, (StatusCode::OK, true));
    assert_eq!(
        get_path(&outside, "/orders").await,
        (StatusCode::TOO_MANY_REQUESTS, true)
    );
    // The path exemption holds beside the network one.
    assert_eq!(get_path(&outside, "/health").await, (StatusCode::OK, false));
    assert_eq!(per_ip.len(), 1);
}
