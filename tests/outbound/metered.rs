//! A client quota on a `Metered` limiter: calls in flight hold their estimates, and whatever
//! ends a call (its body read, dropped unread, a failed or dropped call, a settle rule that
//! reads nothing), its hold is settled exactly once.

use std::time::Duration;

use tower::{Layer, Service, ServiceExt};
use tower_bulwark::algorithm::Metered;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::ClientQuotaLayer;
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{BoxError, DirectRateLimiter, Limiter, Quota};

use crate::settle_from_body::upstream;

type Tokens = DirectRateLimiter<Metered, ManualClock>;

/// 1 000 tokens an hour, settled exactly, on `clock`.
fn tokens(clock: &ManualClock) -> Tokens {
    DirectRateLimiter::builder(Quota::per_hour(1000).unwrap())
        .algorithm::<Metered>()
        .clock(clock.clone())
        .build()
}

fn post(url: &str) -> reqwest::Request {
    reqwest::Request::new(reqwest::Method::POST, url.parse().unwrap())
}

/// Whether `n` tokens fit now (given back at once); more than the quota never does.
fn fits(tokens: &Tokens, n: u32) -> bool {
    let Ok(decision) = tokens.check_n(n) else {
        return false;
    };
    let allowed = decision.allowed;
    if allowed {
        assert!(Limiter::<()>::refund(tokens, &(), n, decision));
    }
    allowed
}

/// Runs `call` through `client` and ends it as `how` says.
async fn end<S>(client: S, call: reqwest::Request, how: &str)
where
    S: Service<reqwest::Request, Response = reqwest::Response, Error = BoxError>,
{
    let answer = client.oneshot(call);
    match how {
        "read" => drop(answer.await.unwrap().bytes().await.unwrap()),
        "dropped-body" => drop(answer.await.unwrap()),
        "failed" => assert!(answer.await.is_err()),
        _ => {
            let dropped = tokio::time::timeout(Duration::from_millis(50), answer).await;
            assert!(dropped.is_err(), "dropped while the call is under way");
        }
    }
}

/// Each call estimated at 100, settled from its body: what each way of ending leaves spent at
/// once, and an hour later, the whole quota back (nothing held for good).
#[tokio::test]
async fn every_way_a_call_ends_settles_its_hold_exactly_once() {
    let server = upstream().await;
    let url = |at: &str| format!("{}{at}", server.uri());
    let usage = BodyUsage::json(["usage", "total_tokens"]).unwrap();
    let cases = [
        ("/json", "read", 30),
        ("/sse", "read", 40),
        ("/busy", "read", 0),
        ("/json", "dropped-body", 100),
        ("/slow", "dropped-call", 100),
        ("unreachable", "failed", 100),
    ];
    for (at, how, spent) in cases {
        let clock = ManualClock::new();
        let tokens = tokens(&clock);
        let client = ClientQuotaLayer::new("llm", tokens.clone())
            .cost(100)
            .settle_by(usage.clone())
            .layer(reqwest::Client::new());
        let target = if at == "unreachable" {
            "http://127.0.0.1:9/".to_owned()
        } else {
            url(at)
        };
        end(client, post(&target), how).await;
        assert!(fits(&tokens, 1000 - spent), "{at} {how}: {spent} spent");
        assert!(
            !fits(&tokens, 1001 - spent),
            "{at} {how}: no less than {spent}"
        );
        clock.advance(Duration::from_secs(3600));
        assert!(fits(&tokens, 1000), "{at} {how}: nothing held for good");
    }
}

/// A client quota that settles nothing, or whose rule reads nothing: the estimate stands, and
/// is not held for good.
#[tokio::test]
async fn holds_settle_without_a_settle_rule() {
    let server = upstream().await;
    let url = format!("{}/json", server.uri());
    for rule in ["none", "reads-nothing"] {
        let clock = ManualClock::new();
        let tokens = tokens(&clock);
        let layer = ClientQuotaLayer::new("llm", tokens.clone()).cost(100);
        if rule == "none" {
            end(layer.layer(reqwest::Client::new()), post(&url), "read").await;
        } else {
            let layer = layer.settle_by(|_: &reqwest::Response| None);
            end(layer.layer(reqwest::Client::new()), post(&url), "read").await;
        }
        assert!(
            fits(&tokens, 900) && !fits(&tokens, 901),
            "{rule}: the estimate stands"
        );
        clock.advance(Duration::from_secs(3600));
        assert!(fits(&tokens, 1000), "{rule}: nothing held for good");
    }
}
