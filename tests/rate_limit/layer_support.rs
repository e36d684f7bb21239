//! What the tests of `RateLimitLayer` through axum's router share: the `/orders` route behind a
//! layer, a request sent from a peer address with headers, a response's body, and a `RateLimit`
//! entry's parameters written out; a limiter that decides later, like a remote one.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::connect_info::MockConnectInfo;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::Request;
use tokio::sync::watch;
use tower::ServiceExt;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{PeerIp, Policy, PolicySet, RateLimitLayer};
use tower_bulwark::{limiter::Decision, BoxError, Limiter, Quota};

use crate::support::keyed;

/// The `/orders` route behind `layer`.
pub(crate) fn orders<P: PolicySet>(layer: RateLimitLayer<P>) -> Router {
    Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(layer)
}

/// The `/orders` route behind one policy, `name`, of `quota` on `clock` per peer address.
pub(crate) fn orders_per_peer(name: &str, quota: Quota, clock: &ManualClock) -> Router {
    let per_peer = Policy::new(name, PeerIp::new(), keyed(quota, clock)).unwrap();
    orders(RateLimitLayer::new(per_peer))
}

/// The `/orders` route behind `layer`, and the count of the requests that reach its handler.
pub(crate) fn counted_orders<P: PolicySet>(layer: RateLimitLayer<P>) -> (Router, Arc<AtomicUsize>) {
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
        .route_layer(layer);
    (app, hits)
}

/// A GET of `/orders` without a body.
pub(crate) fn get_orders() -> Request<Body> {
    Request::get("/orders").body(Body::empty()).unwrap()
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

/// A limiter that answers like a remote one: it decides from `local`'s state on a later poll,
/// and only while its gate is open; counts the decisions asked of it and its refunds.
#[derive(Clone)]
pub(crate) struct Later<L> {
    pub(crate) local: L,
    pub(crate) gate: watch::Receiver<bool>,
    pub(crate) asked: Arc<AtomicUsize>,
    pub(crate) refunds: Arc<AtomicUsize>,
}

impl<L> Later<L> {
    /// A `Later` deciding from `local` with its gate open, and the sender that shuts and opens
    /// the gate.
    pub(crate) fn new(local: L) -> (Self, watch::Sender<bool>) {
        let (open, gate) = watch::channel(true);
        let later = Later {
            local,
            gate,
            asked: Arc::new(AtomicUsize::new(0)),
            refunds: Arc::new(AtomicUsize::new(0)),
        };
        (later, open)
    }
}

impl<L: Limiter<IpAddr> + Clone> Limiter<IpAddr> for Later<L> {
    type Future = Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send>>;

    fn quota(&self) -> Quota {
        self.local.quota()
    }

    fn reserve(&self, key: &IpAddr, cost: u32) -> Self::Future {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let (local, mut gate, key) = (self.local.clone(), self.gate.clone(), *key);
        Box::pin(async move {
            tokio::task::yield_now().await;
            gate.wait_for(|open| *open).await.unwrap();
            local.reserve(&key, cost).await
        })
    }

    fn refund(&self, key: &IpAddr, cost: u32, decision: Decision) -> bool {
        self.refunds.fetch_add(1, Ordering::SeqCst);
        self.local.refund(key, cost, decision)
    }

    /// As a limiter of its own that gives back only by refunds: the difference of a settle to
    /// less goes back through `refund`, and nothing is charged.
    fn settle(&self, key: &IpAddr, estimate: u32, decision: Decision, cost: u32) -> bool {
        cost < estimate && Limiter::refund(self, key, estimate - cost, decision)
    }
}
