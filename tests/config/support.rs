//! What the tests of routes from a file share: an app behind a configured route, and a request
//! to it from a chosen peer.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::Request;
use tower::ServiceExt;
use tower_bulwark::config::Registry;

/// An app answering "ok" at `/` behind the configured route `route` of `registry`.
pub(crate) fn routed(registry: &Registry, route: &str) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(registry.route_layer(route).unwrap())
}

/// The response of `app` to a GET of `/` with the header fields `headers`, from the TCP peer
/// `peer`.
pub(crate) async fn get_from_peer(
    app: &Router,
    peer: SocketAddr,
    headers: &[(&str, &str)],
) -> http::Response<Body> {
    let mut request = Request::get("/");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    app.clone()
        .layer(MockConnectInfo(peer))
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}
