//! A token policy on a Redis `Metered` limiter through the layer: streams settle, from their
//! event streams, to what they used however many are in flight, and whatever ends a request its
//! hold in Redis is settled once.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::Quota;

use super::metered::{holds, in_memory_after_four_streams, metered};
use crate::common::redis_server::{eventually, or_skip, RedisServer};

/// An event stream that sends a first event, waits for a permit of `ends`, then reports the
/// usage the request's `x-used` header names and ends.
fn streams(
    ends: Arc<Semaphore>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(move |request: Request<Body>| {
        let ends = Arc::clone(&ends);
        let used = request.headers()["x-used"].to_str().unwrap().to_owned();
        async move {
            let first =
                futures::stream::once(async { Ok::<_, Infallible>(Bytes::from("data: {}\n\n")) });
            let rest = futures::stream::once(async move {
                ends.acquire().await.unwrap().forget();
                let usage =
                    format!("data: {{\"usage\":{{\"total_tokens\":{used}}}}}\n\ndata: [DONE]\n\n");
                Ok(Bytes::from(usage))
            });
            let body = Body::from_stream(futures::StreamExt::chain(first, rest));
            Ok(Response::builder()
                .header("content-type", "text/event-stream")
                .body(body)
                .unwrap())
        }
    })
}

/// A request of tenant `t` for `max` tokens, of which the stream says it used `used`.
fn completion(max: u32, used: u32) -> Request<Body> {
    Request::builder()
        .header("x-tenant", "t")
        .header("x-max-tokens", max.to_string())
        .header("x-used", used.to_string())
        .body(Body::empty())
        .unwrap()
}

fn left_in(response: &Response<impl Sized>) -> u64 {
    let field = response.headers()["ratelimit"].to_str().unwrap();
    let r = field.split(';').find_map(|p| p.strip_prefix("r=")).unwrap();
    r.parse().unwrap()
}

/// The gateway on a Redis `Metered` policy: four streams of `max_tokens` 1 000 at once,
/// each using 500 and ending a second later, settled from their event streams by the layer.
/// The next request's `RateLimit` says what the in-memory `Metered` says, to the token; a
/// stream dropped half way keeps its estimate, and no hold is left behind.
#[tokio::test]
async fn streams_through_the_layer_settle_exactly_in_redis() {
    let (server, store) = or_skip!(RedisServer::with_store("metered_layer").await);
    let clock = ManualClock::new();
    let quota = Quota::per_minute(10_000).unwrap();
    let limiter = metered(&store, quota, &clock, "layer:", Duration::from_secs(600));
    let cost = |head: &RequestHead<'_>| {
        head.headers["x-max-tokens"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let policy = Policy::new(
        "tokens",
        HeaderKey::new("x-tenant").unwrap(),
        limiter.clone(),
    )
    .unwrap()
    .cost_by(cost)
    .settle_from_body(BodyUsage::sse(["usage", "total_tokens"]).unwrap());
    let ends = Arc::new(Semaphore::new(0));
    let service = RateLimitLayer::new(policy)
        .wrap_body()
        .layer(streams(Arc::clone(&ends)));
    let tenant = HeaderValue::from_static("t");
    let unheld = || async {
        let what = "every hold of the tenant settled in redis";
        eventually(what, Duration::from_secs(5), || {
            holds(&server, &limiter, "t") == 0
        })
        .await;
    };
    let mut open = Vec::new();
    for left in [9000, 8000, 7000, 6000] {
        let response = service
            .clone()
            .oneshot(completion(1000, 500))
            .await
            .unwrap();
        assert_eq!(left_in(&response), left);
        open.push(response);
    }
    assert_eq!(holds(&server, &limiter, tenant.to_str().unwrap()), 4);
    clock.advance(Duration::from_secs(1));
    ends.add_permits(4);
    for response in open {
        response.into_body().collect().await.unwrap();
    }
    unheld().await;
    let expected = in_memory_after_four_streams().remaining;
    let next = service.clone().oneshot(completion(1, 1)).await.unwrap();
    assert_eq!(left_in(&next), expected);
    ends.add_permits(1);
    next.into_body().collect().await.unwrap();

    let dropped = service.clone().oneshot(completion(1000, 10)).await.unwrap();
    assert_eq!(left_in(&dropped), expected - 1000);
    drop(dropped);
    unheld().await;
    let last = service.clone().oneshot(completion(1, 1)).await.unwrap();
    assert_eq!(
        left_in(&last),
        expected - 1000 - 1,
        "the dropped stream's 1 000 stand"
    );
}
