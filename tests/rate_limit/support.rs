//! Set-ups the rate-limit tests share: in-memory limiters on a manual clock, a limiter whose
//! store is down, keys and costs read from a header, a peer address, the admitted headers
//! switched on or off, and readers for what a client gets back (the problem details' violated
//! policies, `Retry-After`, a `RateLimit` entry's parameter).

// Without the `axum` feature, the modules that use some of these are not built.
#![allow(dead_code)]

use crate::common::keyed_on;
use std::future::Future;
use std::hash::Hash;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{to_bytes, Body};
use http::Response;
use tower_bulwark::algorithm::Gcra;
use tower_bulwark::clock::{Clock, ManualClock};
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::Decision;
use tower_bulwark::rate_limit::{KeyError, PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{BoxError, KeyedRateLimiter, Limiter, Quota};

use crate::common::YieldOnce;

/// A handler as the layer's tests write one: an HTTP service that never fails, boxed.
pub type Handler =
    tower::util::BoxCloneSyncService<http::Request<Body>, Response<Body>, std::convert::Infallible>;

/// A GCRA limiter of `quota` per key on `clock`, so that time passes only when the test says.
pub fn keyed<K: Hash + Eq + Clone + Send + Sync + 'static>(
    quota: Quota,
    clock: &ManualClock,
) -> KeyedRateLimiter<K, Gcra, ManualClock> {
    keyed_on(quota, clock)
}

/// The policy `name`, keyed by the peer's IP, of a [`keyed`] limiter of `quota` on `clock`.
pub fn per_peer(
    name: &str,
    quota: Quota,
    clock: &ManualClock,
) -> Policy<PeerIp, KeyedRateLimiter<std::net::IpAddr, Gcra, ManualClock>> {
    Policy::new(name, PeerIp::new(), keyed(quota, clock)).unwrap()
}

/// How many single permits `limiter` still grants `key` right now (takes them all).
pub fn drain<C: Clock>(limiter: &KeyedRateLimiter<String, Gcra, C>, key: &str) -> u64 {
    let key = key.to_string();
    crate::common::admitted_until_refused(|| limiter.check(&key).allowed)
}

/// A limiter whose every decision fails, as a Redis limiter whose server is down does. Nothing
/// is ever granted, so a refund is a bug of the layer: it panics.
#[derive(Clone, Debug)]
pub struct Broken(pub Quota);

impl<K> Limiter<K> for Broken {
    type Future = std::future::Ready<Result<Decision, BoxError>>;

    fn quota(&self) -> Quota {
        self.0
    }

    fn reserve(&self, _: &K, _: u32) -> Self::Future {
        std::future::ready(Err("the store is down".into()))
    }

    fn refund(&self, _: &K, _: u32, _: Decision) -> bool {
        panic!("nothing was granted, nothing may be refunded");
    }

    /// As a limiter of its own that gives back only by refunds: the difference of a settle to
    /// less goes back through `refund`, and nothing is charged.
    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        cost < estimate && Limiter::refund(self, key, estimate - cost, decision)
    }
}

/// A limiter that decides like a remote one: `reserve_now` is `None`, its future is pending
/// `pendings` times and then takes the decision from a real in-memory limiter, or fails.
#[derive(Clone)]
pub struct Slow<K> {
    pub inner: KeyedRateLimiter<K, Gcra, ManualClock>,
    pendings: usize,
    fail: bool,
    /// Futures that took a decision.
    pub decided: Arc<AtomicUsize>,
}

impl<K> Slow<K> {
    /// Decides with `inner` after `pendings` pending polls, or fails there if `fail`.
    pub fn new(inner: KeyedRateLimiter<K, Gcra, ManualClock>, pendings: usize, fail: bool) -> Self {
        Self {
            inner,
            pendings,
            fail,
            decided: Arc::default(),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Limiter<K> for Slow<K> {
    type Future = Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send>>;

    fn quota(&self) -> Quota {
        self.inner.quota()
    }

    fn reserve(&self, key: &K, cost: u32) -> Self::Future {
        let (inner, key, pendings, fail) =
            (self.inner.clone(), key.clone(), self.pendings, self.fail);
        let decided = Arc::clone(&self.decided);
        Box::pin(async move {
            yields(pendings).await;
            if fail {
                return Err("the remote limiter is down".into());
            }
            decided.fetch_add(1, Ordering::SeqCst);
            inner.reserve_now(&key, cost).unwrap()
        })
    }

    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        self.inner.refund(key, cost, decision)
    }

    /// As a limiter of its own that gives back only by refunds: the difference of a settle to
    /// less goes back through `refund`, and nothing is charged.
    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        cost < estimate && Limiter::refund(self, key, estimate - cost, decision)
    }
}

/// A key extractor: the value of header `name`, or a 400 without it.
pub fn header_key(
    name: &'static str,
) -> impl Fn(&RequestHead<'_>) -> Result<String, KeyError> + Clone + Send + Sync + 'static {
    move |head: &RequestHead<'_>| {
        head.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| KeyError::bad_request(format!("no {name}")))
    }
}

/// A cost function: the number in header `name`, 1 without it.
pub fn header_cost(
    name: impl Into<String>,
) -> impl Fn(&RequestHead<'_>) -> u32 + Clone + Send + Sync + 'static {
    let name = name.into();
    move |head: &RequestHead<'_>| {
        head.headers
            .get(name.as_str())
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    }
}

/// A client's address: `ip` on an ephemeral port.
pub fn peer(ip: &str) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), 40_000)
}

/// The layer with the headers of admitted responses on or off.
pub fn with_admitted_headers<P>(layer: RateLimitLayer<P>, on: bool) -> RateLimitLayer<P> {
    if on {
        layer
    } else {
        layer.without_admitted_headers()
    }
}

/// Pending `n` times (waking itself each time), then ready: a limiter or handler that takes
/// `n` polls to answer.
pub async fn yields(n: usize) {
    for _ in 0..n {
        YieldOnce::default().await;
    }
}

/// The response's body parsed as JSON (the problem details of a refusal).
pub async fn json(response: Response<Body>) -> serde_json::Value {
    let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The names in a problem details' `violated-policies`.
pub fn violated(json: &serde_json::Value) -> Vec<String> {
    json["violated-policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// The response's `Retry-After` in seconds, if it has one.
pub fn retry_after<B>(response: &Response<B>) -> Option<u64> {
    response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap())
}

/// Parameter `name` of a parsed `RateLimit` entry (see `sf_entries`); panics without it.
pub fn param(entry: &(String, Vec<(String, i64)>), name: &str) -> i64 {
    entry
        .1
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("{entry:?} has no {name}"))
        .1
}

/// A limiter of a user's own that refuses every call with `retry_after` (raised to a nanosecond
/// if zero).
#[derive(Clone)]
pub struct Refuses(pub std::time::Duration);

impl<K> Limiter<K> for Refuses {
    type Future = std::future::Ready<Result<Decision, BoxError>>;

    fn quota(&self) -> Quota {
        Quota::per_minute(5).unwrap()
    }

    fn reserve(&self, _: &K, _: u32) -> Self::Future {
        let wait = self.0;
        std::future::ready(Ok(Decision::refused(5, 0, wait, wait)))
    }

    fn refund(&self, _: &K, _: u32, _: Decision) -> bool {
        false
    }

    fn settle(&self, _: &K, _: u32, _: Decision, _: u32) -> bool {
        false
    }
}
