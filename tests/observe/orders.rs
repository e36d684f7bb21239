//! The app the observability tests call: one `/orders` route limited by a named rate limiter of
//! a registry, for a client at a fixed address, and a runtime on the test's own thread.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::config::Registry;

/// The registry of the observed app: rate limiters `api` (10 an hour per peer) and `private` (1
/// an hour per peer, its keys hidden), and the bulkhead `payment` (2 calls at once).
pub const ORDERS_CONFIG: &str = r#"
[rate_limiters.api]
limit_for_period = 10
limit_refresh_period = "1h"
key = "peer_ip"

[rate_limiters.private]
limit_for_period = 1
limit_refresh_period = "1h"
key = "peer_ip"
hide_keys = true

[bulkheads.payment]
max_concurrent_calls = 2
"#;

/// A runtime on the calling thread, so that the test's thread sees every event and allocation.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `/orders` behind the registry's rate limiter `name`, called from `peer`.
pub fn router(registry: &Registry, name: &str, peer: [u8; 4]) -> Router {
    Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(registry.rate_limit_layer(name).unwrap())
        .layer(MockConnectInfo(SocketAddr::from((peer, 4000))))
}

/// The status of one `GET /orders`.
pub async fn get_orders(app: &Router) -> StatusCode {
    let req = Request::get("/orders").body(Body::empty()).unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}
