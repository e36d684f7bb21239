//! The Redis limiter behind the HTTP layer: the same 429, `Retry-After`, `RateLimit` headers and
//! problem body as the in-memory limiter gives, request for request.

use crate::common::keyed_on;
use std::time::Duration;

use crate::common::redis_server::{or_skip, RedisServer};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderValue, Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
use tower_bulwark::redis::{RedisRateLimiter, RedisStore};
use tower_bulwark::{clock::ManualClock, Limiter, Quota};

fn app<L: Limiter<HeaderValue>>(limiter: L) -> Router {
    let layer = RateLimitLayer::new(
        Policy::new("per-key", HeaderKey::new("x-api-key").unwrap(), limiter).unwrap(),
    );
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer)
}

async fn call(app: &Router, key: &str) -> (StatusCode, Vec<(String, String)>, Vec<u8>) {
    let request = Request::get("/")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let mut headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap()
        .to_vec();
    (status, headers, body)
}

#[tokio::test]
async fn a_redis_refusal_is_the_same_429_as_in_memory() {
    let server = or_skip!(RedisServer::start(
        "a_redis_refusal_is_the_same_429_as_in_memory"
    ));
    let clock = ManualClock::new();
    let quota = Quota::per_second(2).unwrap();
    let memory = app(keyed_on::<HeaderValue, _>(quota, &clock));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let redis = app(RedisRateLimiter::builder(quota, store)
        .client_clock(clock.clone())
        .build()
        .unwrap());
    let mut refusals = 0;
    for step in 0..12 {
        for key in ["alice", "bob"] {
            let m = call(&memory, key).await;
            let r = call(&redis, key).await;
            assert_eq!(m, r, "step {step}, key {key}");
            refusals += usize::from(m.0 == StatusCode::TOO_MANY_REQUESTS);
        }
        clock.advance(Duration::from_millis(if step % 3 == 2 { 700 } else { 10 }));
    }
    assert!(refusals > 4, "the sequence must reach refusals: {refusals}");
}
