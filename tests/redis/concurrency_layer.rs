//! `Policy::concurrent_in_redis` behind the HTTP layer: whatever ends a request (its body read
//! to the end or dropped, the handler's error, a body that fails, a panic, the request dropped
//! at any await point) gives its slot back exactly once; and over real listeners, two instances
//! share one key's slots for `reqwest` clients reading streamed bodies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{ConcurrencyLimiter, HeaderKey, Policy, RateLimitLayer};
use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::Quota;

use crate::common::listener::serve;
use crate::common::redis_server::{eventually, or_skip, RedisServer};

const KEY: &str = "c:{t}";

/// Four streams of each tenant at once, in the Redis of `store`; failures are errors.
fn streams(store: &RedisStore) -> Policy<HeaderKey, ConcurrencyLimiter<http::HeaderValue>> {
    streams_failing(store, RedisFailMode::Propagate)
}

/// [`streams`], with `fail_mode` deciding when Redis cannot.
fn streams_failing(
    store: &RedisStore,
    fail_mode: RedisFailMode,
) -> Policy<HeaderKey, ConcurrencyLimiter<http::HeaderValue>> {
    let redis = RedisRateLimiter::builder(Quota::per_second(1).unwrap(), store.clone())
        .client_clock(ManualClock::new())
        .prefix("c:")
        .timeout(Duration::from_secs(5))
        .fail_mode(fail_mode);
    let key = HeaderKey::new("x-tenant").unwrap();
    Policy::concurrent_in_redis("streams", key, 4, redis).unwrap()
}

/// `RedisFailMode::fallback`'s admissions for a concurrent policy are held as its slots are:
/// with Redis gone and a fallback of 2 an hour, two streams open at once leave a third out, and
/// each request that ends gives its admission back, so ten in a row are all admitted. They were
/// spent instead, and the third request of the hour was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_a_fallbacks_admissions_go_back_when_the_request_ends() {
    let (mut server, store) =
        or_skip!(RedisServer::with_store("fallback_admissions_go_back").await);
    let fallback = RedisFailMode::fallback(Quota::per_hour(2).unwrap());
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(streams_failing(&store, fallback), &ends, plain_answer);
    let call = |how: &str| service.clone().oneshot(request(how));
    server.kill();
    for i in 0..10 {
        let response = call("stream").await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "request {i}");
        ends.add_permits(1);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ab");
    }
    let open = [call("stream").await.unwrap(), call("stream").await.unwrap()];
    assert!(open.iter().all(|r| r.status() == StatusCode::OK));
    let third = call("stream").await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(open);
    assert_eq!(call("stream").await.unwrap().status(), StatusCode::OK);
}

fn held(server: &RedisServer) -> u64 {
    let reply = server.command(&["ZCARD", KEY]);
    reply.trim_start_matches(':').parse().unwrap()
}

/// A body that sends `a`, then holds until `ends` lets it send `b`.
fn held_body(ends: Arc<Semaphore>) -> Body {
    crate::common::held_stream::held_body(ends, Bytes::from("a"), Bytes::from("b"), false)
}

use crate::common::held_stream::{
    assert_stream_admitted, assert_stream_refused, limited, plain_answer, request,
};

/// Three streams held open, then a request that ends some other way: once its give-back has
/// reached Redis, three slots are held, not two (it freed its own slot, no other), so exactly
/// one more stream fits. The same after requests dropped at every point of their decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_a_request_ends_gives_its_own_slot_back_once() {
    let (server, store) = or_skip!(RedisServer::with_store("every_way_a_request_ends").await);
    crate::common::process::quiet_panics_starting_with("a handler that panics");
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(streams(&store), &ends, plain_answer);
    let call = |how: &str| service.clone().oneshot(request(how));
    for how in ["read", "fail", "cut", "panic", "hang", "dropped-body"] {
        let mut open = Vec::new();
        for _ in 0..3 {
            open.push(call("stream").await.unwrap());
        }
        match how {
            "read" => {
                let response = call("stream").await.unwrap();
                ends.add_permits(1);
                let body = response.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(body, "ab");
            }
            "fail" => assert!(call(how).await.is_err()),
            "cut" => {
                let body = call(how).await.unwrap().into_body();
                assert!(body.collect().await.is_err(), "the body fails");
            }
            "panic" => assert!(tokio::spawn(call(how)).await.unwrap_err().is_panic()),
            "hang" => {
                let hung = tokio::spawn(call(how));
                eventually("the hung request admitted", Duration::from_secs(10), || {
                    held(&server) == 4
                })
                .await;
                hung.abort();
                assert!(hung.await.unwrap_err().is_cancelled());
            }
            _ => drop(call("stream").await.unwrap()),
        }
        eventually(
            &format!("{how}: its slot back"),
            Duration::from_secs(10),
            || held(&server) == 3,
        )
        .await;
        let fourth = call("stream").await.unwrap();
        assert_eq!(fourth.status(), StatusCode::OK, "{how}");
        let fifth = call("stream").await.unwrap();
        assert_eq!(fifth.status(), StatusCode::TOO_MANY_REQUESTS, "{how}");
        drop((open, fourth));
        eventually("every slot back", Duration::from_secs(10), || {
            held(&server) == 0
        })
        .await;
    }
    // Requests dropped after 0 to 11 polls: before their call, while it is in flight, after it.
    for polls in 0..12 {
        let mut request = std::pin::pin!(call("hang"));
        for _ in 0..polls {
            let _ = crate::common::poll_once(request.as_mut());
            tokio::task::yield_now().await;
        }
    }
    // Their calls and give-backs may still be on their way: once they have all landed,
    // exactly four streams fit (a slot lost would keep a fourth out for good).
    let start = Instant::now();
    loop {
        let mut open = Vec::new();
        for _ in 0..4 {
            open.push(call("stream").await.unwrap());
        }
        if open.iter().all(|r| r.status() == StatusCode::OK) {
            let fifth = call("stream").await.unwrap();
            assert_eq!(fifth.status(), StatusCode::TOO_MANY_REQUESTS);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a slot never came back"
        );
        drop(open);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An instance: `/stream` answers with a held body, behind four streams per tenant in Redis.
async fn instance(server: &RedisServer, ends: &Arc<Semaphore>) -> String {
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let ends = Arc::clone(ends);
    let app = Router::new()
        .route(
            "/stream",
            get(move || {
                let ends = Arc::clone(&ends);
                async move { held_body(ends) }
            }),
        )
        .layer(RateLimitLayer::new(streams(&store)).wrap_body());
    format!("http://{}/stream", serve(app).await)
}

/// Two instances over real listeners, one Redis, four streams of tenant `t` at once in all:
/// `reqwest` clients reading streamed bodies get four, each told what is left; the fifth is
/// refused with `qu="concurrent-requests"` and `Retry-After: 1`; a stream read to its end, or
/// dropped by its client half-way, frees its slot for the other instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_a_keys_slots_over_real_listeners() {
    let server = or_skip!(RedisServer::start("two_instances_share_a_keys_slots"));
    let ends = Arc::new(Semaphore::new(0));
    let (a, b) = (
        instance(&server, &ends).await,
        instance(&server, &ends).await,
    );
    let client = reqwest::Client::new();
    let get = |url: &str| client.get(url).header("x-tenant", "t").send();
    let mut open = Vec::new();
    for (url, left) in [(&a, 3), (&a, 2), (&a, 1), (&b, 0)] {
        let mut response = get(url).await.unwrap();
        assert_stream_admitted(response.status(), response.headers(), left);
        assert_eq!(response.chunk().await.unwrap().unwrap(), "a", "streaming");
        open.push(response);
    }
    for url in [&a, &b] {
        let refused = get(url).await.unwrap();
        assert_stream_refused(refused.status(), refused.headers());
    }
    // Read to its end on instance a: its slot goes to instance b.
    ends.add_permits(1);
    let mut ended = open.remove(0);
    assert_eq!(ended.chunk().await.unwrap().unwrap(), "b");
    assert!(ended.chunk().await.unwrap().is_none());
    open.push(admitted_eventually(&server, || get(&b)).await);
    // Dropped by its client half-way on instance b: its slot goes to instance a.
    drop(open.pop());
    open.push(admitted_eventually(&server, || get(&a)).await);
    assert_eq!(
        get(&b).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(held(&server), 4);
}

/// The first response of `send()` that is admitted, once the slot freed has reached Redis
/// (bounded: ten seconds).
async fn admitted_eventually<F>(server: &RedisServer, send: impl Fn() -> F) -> reqwest::Response
where
    F: std::future::Future<Output = reqwest::Result<reqwest::Response>>,
{
    crate::common::first_within_ten_seconds("no slot came back", || {
        let sent = (held(server) < 4).then(&send);
        async move {
            let response = sent?.await.unwrap();
            (response.status() == StatusCode::OK).then_some(response)
        }
    })
    .await
}

/// `Tiers` of plans, each a Redis concurrency limiter (a limit of streams per plan): the
/// responses, admitted and refused, advertise slots (`qu="concurrent-requests"`, no window), as
/// a concurrent policy's do, and a refusal says what a concurrent policy's says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_of_redis_concurrency_limiters_are_advertised_as_slots() {
    use tower_bulwark::tiers::Tiers;
    let (_server, store) = or_skip!(RedisServer::with_store("tiers_of_redis_slots").await);
    let ends = Arc::new(Semaphore::new(0));
    let plan = |_: &http::HeaderValue| "free";
    let plans = Tiers::new(plan, "free", streams(&store).limiter().clone());
    let policy = Policy::new("streams", HeaderKey::new("x-tenant").unwrap(), plans).unwrap();
    let service = limited(policy, &ends, plain_answer);
    let mut open = Vec::new();
    for _ in 0..4 {
        let response = service.clone().oneshot(request("stream")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let advertised = response.headers()["ratelimit-policy"].to_str().unwrap();
        assert!(!advertised.contains(";w="), "admitted: {advertised}");
        open.push(response);
    }
    let refused = service.clone().oneshot(request("stream")).await.unwrap();
    assert_stream_refused(refused.status(), refused.headers());
    let advertised = refused.headers()["ratelimit-policy"].to_str().unwrap();
    assert!(!advertised.contains(";w="), "refused: {advertised}");
    ends.add_permits(4);
}
