//! What the tests of `RateLimitLayer` through axum's router share: the `/orders` route behind a
//! layer, a request sent from a peer address with headers, a response's body, and a `RateLimit`
//! entry's parameters written out.

use std::net::SocketAddr;

use axum::body::{to_bytes, Body};
use axum::extract::connect_info::MockConnectInfo;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::Request;
use tower::ServiceExt;
use tower_bulwark::rate_limit::{PolicySet, RateLimitLayer};

pub(crate) fn orders<P: PolicySet>(layer: RateLimitLayer<P>) -> Router {
    Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(layer)
}

pub(crate) async fn send(app: &Router, from: SocketAddr, headers: &[(&str, &str)]) -> Response {
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

pub(crate) async fn body(response: Response) -> Bytes {
    to_bytes(response.into_body(), usize::MAX).await.unwrap()
}

pub(crate) fn params(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}
