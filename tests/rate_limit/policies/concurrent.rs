//! `Policy::concurrent`: requests in flight per key, each holding its slot until its response
//! body ends, whatever ends it, and every slot back exactly once.

use std::sync::Arc;

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::{Layer, ServiceExt};
use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};

use crate::common::held_stream::{
    assert_stream_admitted, assert_stream_refused, handler, limited, plain_answer, request, Limited,
};

/// At most four streams of tenant `t` at once, over the held stream's handler.
fn streams(ends: &Arc<Semaphore>) -> Limited {
    let policy = Policy::concurrent("streams", HeaderKey::new("x-tenant").unwrap(), 4).unwrap();
    limited(policy, ends, plain_answer)
}

fn header(response: &Response<impl Sized>, name: &str) -> String {
    response.headers()[name].to_str().unwrap().to_owned()
}

/// Six streams at once on one key, four allowed: four admitted, each told what is left; two
/// refused at once, told `qu="concurrent-requests"` and to come back in a second; once a stream
/// ends (read to its end, or dropped), a new one is admitted.
#[tokio::test]
async fn four_of_six_streams_are_admitted_and_a_slot_frees_when_one_ends() {
    let ends = Arc::new(Semaphore::new(0));
    let service = streams(&ends);
    let mut open = Vec::new();
    for left in [3, 2, 1, 0] {
        let response = service.clone().oneshot(request("stream")).await.unwrap();
        assert_stream_admitted(response.status(), response.headers(), left);
        open.push(response);
    }
    for _ in 0..2 {
        let refused = service.clone().oneshot(request("stream")).await.unwrap();
        assert_stream_refused(refused.status(), refused.headers());
    }
    // One stream read to its end frees its slot; one dropped half-way frees its own.
    ends.add_permits(1);
    let ended = open
        .pop()
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(ended, "ab");
    let again = service.clone().oneshot(request("stream")).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    drop(open.pop());
    let and_again = service.clone().oneshot(request("stream")).await.unwrap();
    assert_eq!(and_again.status(), StatusCode::OK);
    let refused = service.clone().oneshot(request("stream")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Three streams held open, then a request that ends some other way: whatever ended it (the
/// handler's error, a body that fails, a panic, the request dropped before an answer), it
/// gave its slot back exactly once: one more stream fits, and the next is refused.
#[tokio::test]
async fn every_way_a_request_ends_gives_its_slot_back_exactly_once() {
    for how in ["fail", "cut", "panic", "hang", "dropped-body"] {
        let ends = Arc::new(Semaphore::new(0));
        let service = streams(&ends);
        let mut open = Vec::new();
        for _ in 0..3 {
            open.push(service.clone().oneshot(request("stream")).await.unwrap());
        }
        match how {
            "fail" => assert!(service.clone().oneshot(request(how)).await.is_err()),
            "cut" => {
                let body = service
                    .clone()
                    .oneshot(request(how))
                    .await
                    .unwrap()
                    .into_body();
                assert!(body.collect().await.is_err(), "the body fails");
            }
            "panic" => {
                let call = tokio::spawn(service.clone().oneshot(request(how)));
                assert!(call.await.unwrap_err().is_panic());
            }
            "hang" => {
                let call = service.clone().oneshot(request(how));
                let timeout = tokio::time::timeout(std::time::Duration::from_millis(20), call);
                assert!(timeout.await.is_err(), "dropped while the handler hangs");
            }
            _ => drop(service.clone().oneshot(request("stream")).await.unwrap()),
        }
        let fourth = service.clone().oneshot(request("stream")).await.unwrap();
        assert_eq!(fourth.status(), StatusCode::OK, "{how}: its slot came back");
        let fifth = service.clone().oneshot(request("stream")).await.unwrap();
        assert_eq!(
            fifth.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{how}: back once only"
        );
        drop(open);
    }
}

/// Tasks racing for four slots, each holding its stream open: exactly four are admitted; a
/// token policy in the same decision charges nothing for the refused ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_requests_get_exactly_the_slots_and_a_refusal_costs_no_tokens() {
    use http::HeaderValue;
    use tower_bulwark::{clock::ManualClock, KeyedRateLimiter, Quota};
    for _round in 0..20 {
        let ends = Arc::new(Semaphore::new(0));
        let tokens = KeyedRateLimiter::<HeaderValue>::builder(Quota::per_minute(10_000).unwrap())
            .clock(ManualClock::new())
            .build();
        let policies = Policy::new(
            "tokens",
            HeaderKey::new("x-tenant").unwrap(),
            tokens.clone(),
        )
        .unwrap()
        .cost(100)
        .and(Policy::concurrent("streams", HeaderKey::new("x-tenant").unwrap(), 4).unwrap());
        let service = limited(policies, &ends, plain_answer);
        let calls: Vec<_> = (0..16)
            .map(|_| tokio::spawn(service.clone().oneshot(request("stream"))))
            .collect();
        let mut admitted = Vec::new();
        for call in calls {
            let response = call.await.unwrap().unwrap();
            if response.status() == StatusCode::OK {
                admitted.push(response);
            }
        }
        assert_eq!(admitted.len(), 4);
        // Four requests of 100 tokens hold what they took; the twelve refused took nothing.
        let probe = tokens.check(&HeaderValue::from_static("t"));
        assert_eq!(probe.remaining, 10_000 - 400 - 1);
        drop(admitted);
    }
}

/// A hold without `wrap_body` would never end: the layer says so when it is applied. No slot
/// at all is refused when the policy is built.
#[test]
#[should_panic(expected = "the rate-limit policy `streams` holds its requests' slots")]
fn a_hold_without_wrap_body_is_refused_when_the_layer_is_applied() {
    let zero = Policy::concurrent("streams", HeaderKey::new("x-tenant").unwrap(), 0);
    assert!(zero.unwrap_err().to_string().contains("in_flight"));
    let policy = Policy::concurrent("streams", HeaderKey::new("x-tenant").unwrap(), 4).unwrap();
    let _ = RateLimitLayer::new(policy).layer(handler(Arc::new(Semaphore::new(0)), plain_answer));
}

/// A request refused by another policy gave its slot back: the refusal's `RateLimit` lists the
/// policy that refused and leaves the concurrent one out (its slot count is the one the previous
/// answer told), as it leaves out a rate policy that admitted.
#[tokio::test]
async fn a_refusal_by_another_policy_leaves_the_slots_out_of_ratelimit() {
    use http::HeaderValue;
    use tower_bulwark::{KeyedRateLimiter, Quota};
    let tokens = KeyedRateLimiter::<HeaderValue>::new(Quota::per_minute(100).unwrap());
    let policies = Policy::new("tokens", HeaderKey::new("x-tenant").unwrap(), tokens)
        .unwrap()
        .cost(100)
        .and(Policy::concurrent("streams", HeaderKey::new("x-tenant").unwrap(), 4).unwrap());
    let service = limited(policies, &Arc::new(Semaphore::new(0)), plain_answer);
    let first = service.clone().oneshot(request("stream")).await.unwrap();
    assert_eq!(
        header(&first, "ratelimit"),
        "\"tokens\";r=0;t=60, \"streams\";r=3"
    );
    let refused = service.clone().oneshot(request("stream")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let field = header(&refused, "ratelimit");
    assert!(field.starts_with("\"tokens\";r=0;t="), "{field}");
    assert!(!field.contains("streams"), "{field}");
}
