//! RateLimitLayer end to end: a real listener on 127.0.0.1 and a real HTTP client.

use crate::common::listener::{serve, sf_list};
use std::net::IpAddr;

use axum::routing::get;
use axum::Router;
use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{clock::ManualClock, KeyedRateLimiter, Quota};

fn param(item: &(String, Vec<(String, i64)>), key: &str) -> i64 {
    item.1
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no `{key}` in {item:?}"))
        .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_requests_against_a_limit_of_ten_get_exactly_ten_oks() {
    // The clock stands still, so no permit is replenished during the test: the count is exact.
    let clock = ManualClock::new();
    let limiter = KeyedRateLimiter::<IpAddr>::builder(Quota::per_second(10).unwrap())
        .clock(clock)
        .build();
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("per-ip", PeerIp::new(), limiter).unwrap(),
        ));
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/orders");

    let mut tasks = Vec::new();
    for _ in 0..100 {
        let client = client.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let response = client.get(&url).send().await.unwrap();
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = response.bytes().await.unwrap();
            (status, headers, body)
        }));
    }
    let mut oks = 0;
    let mut refused = 0;
    let mut remaining_seen = Vec::new();
    for task in tasks {
        let (status, headers, body) = task.await.unwrap();
        let policy = sf_list(headers["ratelimit-policy"].to_str().unwrap());
        assert_eq!(policy.len(), 1);
        assert_eq!(policy[0].0, "per-ip");
        assert_eq!(param(&policy[0], "q"), 10);
        assert_eq!(param(&policy[0], "w"), 1);
        let ratelimit = sf_list(headers["ratelimit"].to_str().unwrap());
        assert_eq!(ratelimit.len(), 1);
        assert_eq!(ratelimit[0].0, "per-ip");
        match status {
            200 => {
                oks += 1;
                assert_eq!(body, "ok");
                remaining_seen.push(param(&ratelimit[0], "r"));
            }
            429 => {
                refused += 1;
                assert_eq!(headers["retry-after"], "1");
                assert_eq!(param(&ratelimit[0], "r"), 0);
                assert_eq!(param(&ratelimit[0], "t"), 1);
                assert_eq!(headers["content-type"], "application/problem+json");
                let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(problem["status"], 429);
                assert_eq!(problem["violated-policies"], serde_json::json!(["per-ip"]));
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((oks, refused), (10, 90));
    // Every admitted request saw a different number of permits left: none was counted twice.
    remaining_seen.sort_unstable();
    assert_eq!(remaining_seen, (0..10).collect::<Vec<i64>>());
}

#[tokio::test]
async fn a_route_without_the_layer_is_untouched_over_the_wire() {
    let app = crate::common::listener::orders_one_an_hour("per-ip", PeerIp::new())
        .route("/health", get(|| async { "up" }));
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    let orders = format!("http://{addr}/orders");
    assert_eq!(client.get(&orders).send().await.unwrap().status(), 200);
    let refused = client.get(&orders).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "3600");
    for _ in 0..5 {
        let health = client
            .get(format!("http://{addr}/health"))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), 200);
        assert!(health.headers().get("ratelimit").is_none());
        assert_eq!(health.text().await.unwrap(), "up");
    }
}
