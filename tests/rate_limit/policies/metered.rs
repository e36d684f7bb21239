//! A token policy on a `Metered` limiter through the layer: streams settle to what they used
//! however many are in flight and however long they last, and whatever ends a request, its
//! held estimate is settled exactly once (to what the body said, or else the estimate stands).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_bulwark::algorithm::Metered;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{HeaderKey, Policy};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

use crate::common::held_stream::{limited, Limited};
use crate::support::{header_cost, keyed};

type Tokens = KeyedRateLimiter<http::HeaderValue, Metered, ManualClock>;

/// 10 000 tokens a minute per tenant, settled exactly, on `clock`.
fn tokens(clock: &ManualClock) -> Tokens {
    KeyedRateLimiter::builder(Quota::per_minute(10_000).unwrap())
        .algorithm::<Metered>()
        .clock(clock.clone())
        .build()
}

/// A request of tenant `t` for `max` tokens, of which the handler says it used `used`, ending
/// as `how` says (see [`event_stream`]).
fn request(max: u32, used: u32, how: &str) -> Request<Body> {
    Request::builder()
        .uri("/v1/complete")
        .header("x-tenant", "t")
        .header("x-max-tokens", max.to_string())
        .header("x-used", used.to_string())
        .header("x-how", how)
        .body(Body::empty())
        .unwrap()
}

/// An event stream (`crate::common::held_stream`) that sends a first event, holds until `ends`
/// lets it end, then reports the request's `x-used` (none with `x-how: silent`) and ends.
fn event_stream(headers: &http::HeaderMap) -> crate::common::held_stream::Answer {
    let header = |name: &str| headers[name].to_str().unwrap().to_owned();
    let usage = if header("x-how") == "silent" {
        String::new()
    } else {
        format!(
            "data: {{\"usage\":{{\"total_tokens\":{}}}}}\n\n",
            header("x-used")
        )
    };
    crate::common::held_stream::Answer {
        content_type: Some("text/event-stream"),
        first: Bytes::from("data: {\"choices\":[]}\n\n"),
        last: Bytes::from(usage + "data: [DONE]\n\n"),
    }
}

/// The tokens policy on `limiter`, settled from the event stream ([`event_stream`]).
fn gateway(limiter: &Tokens, ends: &Arc<Semaphore>) -> Limited {
    let policy = Policy::new(
        "tokens",
        HeaderKey::new("x-tenant").unwrap(),
        limiter.clone(),
    )
    .unwrap()
    .cost_by(header_cost("x-max-tokens"))
    .settle_from_body(BodyUsage::sse(["usage", "total_tokens"]).unwrap());
    limited(policy, ends, event_stream)
}

/// Whether `n` tokens fit on tenant `t` now (given back at once).
fn fits(limiter: &Tokens, n: u32) -> bool {
    let key = http::HeaderValue::from_static("t");
    let decision = limiter.check_n(&key, n).unwrap();
    let allowed = decision.allowed;
    if allowed {
        assert!(limiter.refund(&key, n, decision));
    }
    allowed
}

fn ratelimit(response: &Response<impl Sized>) -> String {
    response.headers()["ratelimit"].to_str().unwrap().to_owned()
}

/// Four streams of `max_tokens` 1 000 at once, each using 500 and ending a second later: the
/// next request's `RateLimit` says what a key charged 500 a stream up front says a second
/// later, to the token (nothing lost; at least 10 000 − 2 001).
#[tokio::test]
async fn four_concurrent_streams_lose_nothing() {
    let clock = ManualClock::new();
    let (limiter, ends) = (tokens(&clock), Arc::new(Semaphore::new(0)));
    let service = gateway(&limiter, &ends);
    let mut open = Vec::new();
    for left in [9000, 8000, 7000, 6000] {
        let response = service.clone().oneshot(request(1000, 500, "stream")).await;
        let response = response.unwrap();
        let field = ratelimit(&response);
        assert!(
            field.starts_with(&format!("\"tokens\";r={left};")),
            "{field}"
        );
        open.push(response);
    }
    clock.advance(Duration::from_secs(1));
    ends.add_permits(4);
    for response in open {
        response.into_body().collect().await.unwrap();
    }
    let next = service.clone().oneshot(request(1, 1, "stream")).await;

    let exact_clock = ManualClock::new();
    let exact = keyed::<&str>(Quota::per_minute(10_000).unwrap(), &exact_clock);
    for _ in 0..4 {
        assert!(exact.check_n(&"t", 500).unwrap().allowed);
    }
    exact_clock.advance(Duration::from_secs(1));
    let expected = exact.check_n(&"t", 1).unwrap().remaining;
    assert!(expected >= 10_000 - 2001);
    assert!(
        ratelimit(&next.unwrap()).starts_with(&format!("\"tokens\";r={expected};")),
        "r={expected}"
    );
}

/// Whatever ends a request (its stream read to the end with or without usage, dropped half
/// way, failing; the handler failing, panicking, or dropped before it answers), its held
/// estimate is settled once: at once, the key has what the request's usage (or else its
/// estimate) leaves; a minute later it is whole, nothing held for good.
#[tokio::test]
async fn every_way_a_request_ends_settles_its_hold_exactly_once() {
    for how in [
        "stream",
        "silent",
        "dropped-body",
        "cut",
        "fail",
        "panic",
        "hang",
    ] {
        let clock = ManualClock::new();
        let (limiter, ends) = (tokens(&clock), Arc::new(Semaphore::new(1)));
        let service = gateway(&limiter, &ends);
        let call = service.clone().oneshot(request(1000, 300, how));
        match how {
            "stream" | "silent" => {
                let body = call.await.unwrap().into_body();
                body.collect().await.unwrap();
            }
            "dropped-body" => drop(call.await.unwrap()),
            "cut" => assert!(call.await.unwrap().into_body().collect().await.is_err()),
            "fail" => assert!(call.await.is_err()),
            "panic" => assert!(tokio::spawn(call).await.unwrap_err().is_panic()),
            _ => {
                let hung = tokio::time::timeout(Duration::from_millis(20), call).await;
                assert!(hung.is_err(), "dropped while the handler hangs");
            }
        }
        let spent = if how == "stream" { 300 } else { 1000 };
        assert!(fits(&limiter, 10_000 - spent), "{how}: {spent} spent");
        assert!(
            !fits(&limiter, 10_001 - spent),
            "{how}: no more than {spent}"
        );
        clock.advance(Duration::from_secs(60));
        assert!(fits(&limiter, 10_000), "{how}: nothing held for good");
    }
}

/// A metered limiter under a policy that settles nothing, or that reads a header the answer
/// lacks: the hold is settled all the same, to the estimate. Under another policy's veto, it
/// is given back.
#[tokio::test]
async fn holds_settle_without_a_settle_rule_and_go_back_under_a_veto() {
    for rule in ["none", "missing-header", "vetoed"] {
        let clock = ManualClock::new();
        let (limiter, ends) = (tokens(&clock), Arc::new(Semaphore::new(1)));
        let key = || HeaderKey::new("x-tenant").unwrap();
        let policy = Policy::new("tokens", key(), limiter.clone())
            .unwrap()
            .cost(1000);
        let policy = match rule {
            "none" => policy,
            _ => policy
                .settle_by(|answer| answer.headers.get("x-usage")?.to_str().ok()?.parse().ok()),
        };
        let spent = KeyedRateLimiter::new(Quota::per_minute(1).unwrap());
        spent.check(&http::HeaderValue::from_static("t"));
        let answer = if rule == "vetoed" {
            let veto = Policy::new("veto", key(), spent).unwrap();
            limited(policy.and(veto), &ends, event_stream)
                .oneshot(request(1000, 1, "stream"))
                .await
        } else {
            limited(policy, &ends, event_stream)
                .oneshot(request(1000, 1, "stream"))
                .await
        };
        let answer = answer.unwrap();
        if rule == "vetoed" {
            assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
            assert!(fits(&limiter, 10_000), "the veto gave the hold back");
            continue;
        }
        answer.into_body().collect().await.unwrap();
        assert!(
            fits(&limiter, 9000) && !fits(&limiter, 9001),
            "{rule}: the estimate stands"
        );
        clock.advance(Duration::from_secs(60));
        assert!(fits(&limiter, 10_000), "{rule}: nothing held for good");
    }
}
