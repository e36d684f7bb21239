//! Adversarial tests of the HTTP layer: cancellation at each await point with several policies,
//! mixed failing / refusing / waiting policies, odd policy names on the wire, HEAD requests, and
//! the observability counters of policies vetoed by another one.

use crate::common::listener::{serve, sf_entries, sf_list};
use crate::common::{poll_once, waits_up_to};
use crate::support::{keyed, Broken};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tower::ServiceExt;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::observe::Observed;
use tower_bulwark::rate_limit::{FailMode, PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{
    clock::{ManualClock, TokioClock},
    KeyedRateLimiter, Limiter, Quota,
};

use super::layer_support::{counted_orders, get_orders, Later};

type Tokio = KeyedRateLimiter<IpAddr, tower_bulwark::algorithm::Gcra, TokioClock>;

fn tokio_limiter(quota: Quota) -> Tokio {
    KeyedRateLimiter::builder(quota)
        .clock(TokioClock::new())
        .build()
}

/// Held: README "Several policies ... one refused by any spends nothing from the others" and
/// "Waiting ... if its client goes away meanwhile, the permit is given back", with three
/// policies where one decides later: a request dropped while the remote policy is still
/// deciding, and one dropped while waiting after a deferred decision, give back every permit
/// exactly once; the next request then waits one period, not two.
#[tokio::test(start_paused = true)]
async fn three_policies_dropped_at_each_await_point_give_every_permit_back_once() {
    let wide = tokio_limiter(Quota::per_hour(10).unwrap());
    let remote_state = tokio_limiter(Quota::per_hour(5).unwrap());
    let waiting = tokio_limiter(waits_up_to(
        Quota::per_second(1).unwrap(),
        Duration::from_secs(1),
    ));
    let (later, open) = Later::new(remote_state.clone());
    let client: SocketAddr = "192.0.2.77:5000".parse().unwrap();
    let (app, hits) = counted_orders(RateLimitLayer::new(
        Policy::new("wide", PeerIp::new(), BoxLimiter::new(wide.clone()))
            .unwrap()
            .and(Policy::new("remote", PeerIp::new(), BoxLimiter::new(later.clone())).unwrap())
            .and(Policy::new("waiting", PeerIp::new(), BoxLimiter::new(waiting.clone())).unwrap()),
    ));
    let app = app.layer(MockConnectInfo(client));

    let start = tokio::time::Instant::now();
    assert_eq!(
        app.clone().oneshot(get_orders()).await.unwrap().status(),
        StatusCode::OK
    );

    // Dropped while the remote policy decides: `wide` was granted, `waiting` not yet asked.
    open.send_replace(false);
    let mut reserving = Box::pin(app.clone().oneshot(get_orders()));
    assert!(poll_once(reserving.as_mut()).is_pending());
    assert!(poll_once(reserving.as_mut()).is_pending());
    drop(reserving);
    assert_eq!(
        later.refunds.load(Ordering::SeqCst),
        0,
        "remote never granted"
    );

    // Dropped while waiting for `waiting`'s permit, after the deferred decision.
    open.send_replace(true);
    let mut waiter = Box::pin(app.clone().oneshot(get_orders()));
    for _ in 0..8 {
        assert!(poll_once(waiter.as_mut()).is_pending());
        tokio::task::yield_now().await;
    }
    assert_eq!(later.asked.load(Ordering::SeqCst), 3);
    drop(waiter);
    assert_eq!(
        later.refunds.load(Ordering::SeqCst),
        1,
        "remote given back once"
    );

    // The next request waits one second (its own permit), not two.
    assert_eq!(
        app.clone().oneshot(get_orders()).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // Two requests admitted: each hourly budget is down by exactly two.
    assert_eq!(wide.check(&client.ip()).remaining, 10 - 2 - 1);
    assert_eq!(remote_state.check(&client.ip()).remaining, 5 - 2 - 1);
}

/// Held: one policy errors (the layer fails open), one refuses, one reserves a wait: the answer
/// is an immediate 429 naming only the refusing policy, with headers that parse as Structured
/// Fields and a body that parses as JSON, and the waiting policy's reservation is given back.
#[tokio::test(start_paused = true)]
async fn an_erroring_a_refusing_and_a_waiting_policy_give_one_clean_429() {
    let refusing = tokio_limiter(Quota::per_hour(1).unwrap());
    let waiting = tokio_limiter(waits_up_to(
        Quota::per_second(1).unwrap(),
        Duration::from_secs(5),
    ));
    let client: SocketAddr = "192.0.2.78:5000".parse().unwrap();
    let ip = client.ip();
    // Spend both, so the request is refused by one and would wait on the other.
    assert!(refusing.check(&ip).allowed);
    assert!(waiting.check(&ip).allowed);
    let broken = BoxLimiter::new(Broken(Quota::per_second(3).unwrap()));
    let policies = Policy::new("broken", PeerIp::new(), broken)
        .unwrap()
        .and(Policy::new("refusing", PeerIp::new(), BoxLimiter::new(refusing.clone())).unwrap())
        .and(Policy::new("waiting", PeerIp::new(), BoxLimiter::new(waiting.clone())).unwrap());
    let layer = RateLimitLayer::new(policies)
        .limiter_error_mode(FailMode::Open)
        .with_legacy_headers();
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(layer)
        .layer(MockConnectInfo(client));
    let start = tokio::time::Instant::now();
    let refused = app.clone().oneshot(get_orders()).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "refused at once");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = refused.headers().clone();
    assert_eq!(h["retry-after"], "3600");
    assert_eq!(h["x-ratelimit-reset"], "3600");
    assert_eq!(h["x-ratelimit-remaining"], "0");
    let policy = sf_entries(&h, "ratelimit-policy");
    assert_eq!(
        policy.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        ["broken", "refusing", "waiting"]
    );
    // Only the violated policy is listed: the waiting policy's reservation was given back, so
    // its decision no longer describes the key (and its window need not fit under Retry-After).
    let state = sf_entries(&h, "ratelimit");
    assert_eq!(
        state,
        [(
            "refusing".to_string(),
            vec![("r".to_string(), 0), ("t".to_string(), 3600)]
        )]
    );
    let body = axum::body::to_bytes(refused.into_body(), usize::MAX)
        .await
        .unwrap();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["refusing"])
    );
    assert_eq!(problem["status"], 429);
    // The waiting policy's reservation went back: a new reservation waits 1 s, not 2 s.
    let d = Limiter::reserve_now(&waiting, &ip, 1).unwrap().unwrap();
    assert!(d.allowed);
    assert_eq!(d.wait, Duration::from_secs(1));
}

/// Held: policy names made of every character that needs escaping in a Structured Field string
/// or in JSON (quotes, backslashes, commas, semicolons, `=`), up to the 64-character maximum,
/// come out of a real listener as headers that `sfv` parses back to the exact names and a body
/// that `serde_json` parses back to the exact names; a HEAD request gets the same 429 head and
/// no body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_policy_names_survive_the_wire_and_head_gets_no_body() {
    let names = [
        r#"a"b\c, d;e=f"#.to_string(),
        "\"".repeat(64),
        "\\".repeat(64),
        (0x20u8..=0x7e).map(char::from).take(64).collect::<String>(),
    ];
    let clock = ManualClock::new();
    let limiters: Vec<_> = names
        .iter()
        .map(|_| keyed::<IpAddr>(Quota::per_hour(1).unwrap(), &clock))
        .collect();
    let layer = RateLimitLayer::new(
        names
            .iter()
            .zip(&limiters)
            .map(|(n, l)| Policy::new(n.clone(), PeerIp::new(), l.clone()).unwrap())
            .collect::<Vec<_>>(),
    )
    .with_legacy_headers();
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(layer);
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/orders");

    let ok = client.get(&url).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let policy = sf_list(ok.headers()["ratelimit-policy"].to_str().unwrap());
    assert_eq!(
        policy.iter().map(|p| p.0.clone()).collect::<Vec<_>>(),
        names.to_vec()
    );
    let state = sf_list(ok.headers()["ratelimit"].to_str().unwrap());
    assert_eq!(
        state.iter().map(|p| p.0.clone()).collect::<Vec<_>>(),
        names.to_vec()
    );
    assert_eq!(ok.text().await.unwrap(), "ok");

    let refused = client.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    let head_of_get = refused.headers().clone();
    let problem: serde_json::Value =
        serde_json::from_slice(&refused.bytes().await.unwrap()).expect("the problem body is JSON");
    assert_eq!(
        problem["violated-policies"],
        serde_json::Value::from(names.to_vec())
    );
    assert_eq!(
        sf_list(head_of_get["ratelimit"].to_str().unwrap())
            .iter()
            .map(|p| p.0.clone())
            .collect::<Vec<_>>(),
        names.to_vec()
    );

    let head = client.head(&url).send().await.unwrap();
    assert_eq!(head.status(), 429);
    for name in [
        "retry-after",
        "ratelimit-policy",
        "ratelimit",
        "content-type",
    ] {
        assert_eq!(head.headers()[name], head_of_get[name], "{name}");
    }
    assert!(head.bytes().await.unwrap().is_empty());
}

/// `/orders` behind one layer of two policies keyed by the peer address, `wide` then `narrow`,
/// for requests from `client`.
fn wide_then_narrow<L>(wide: L, narrow: L, client: SocketAddr) -> Router
where
    L: Limiter<IpAddr> + Clone + Send + Sync + 'static,
    L::Future: Send,
{
    Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("wide", PeerIp::new(), wide)
                .unwrap()
                .and(Policy::new("narrow", PeerIp::new(), narrow).unwrap()),
        ))
        .layer(MockConnectInfo(client))
}

/// Promise (`observe` docs, `LimiterSnapshot::allowed`: "Decisions that admitted the request";
/// metric `bulwark_ratelimiter_calls_total{outcome="allowed"}`; `available_permissions`:
/// "Permits left after the latest decision"): with two observed policies in one layer, a request
/// that the second refuses is not admitted, and the first policy's permit is given back
/// ("a refused request leaves every limiter exactly as it was").
///
/// `Observed::refund` only un-records waits: the vetoed admission stays counted as `allowed`
/// (so the metric says three admissions where one request reached the handler) and
/// `available_permissions` keeps the pre-refund figure.
#[tokio::test]
async fn a_request_refused_by_another_policy_is_not_counted_allowed() {
    let clock = ManualClock::new();
    let observed = |name: &str, quota| Observed::new(name, keyed::<IpAddr>(quota, &clock));
    let wide = observed("wide", Quota::per_hour(10).unwrap());
    let narrow = observed("narrow", Quota::per_hour(1).unwrap());
    let client: SocketAddr = "192.0.2.79:5000".parse().unwrap();
    let app = wide_then_narrow(wide.clone(), narrow.clone(), client);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(app.clone().oneshot(get_orders()).await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // The limiter itself is right: the vetoed permits came back (9 left, 8 after this check).
    let wide_snapshot = wide.snapshot();
    assert_eq!(wide.get_ref().check(&client.ip()).remaining, 8);
    assert_eq!(narrow.snapshot().limited, 2);
    assert_eq!(
        (wide_snapshot.allowed, wide_snapshot.available_permissions),
        (1, 9),
        "one request was admitted and `wide` has 9 permits left; the snapshot says {wide_snapshot:?}"
    );
}

/// Promise (`response.rs`, `Refusal::headers`: the refusal's `RateLimit` lists "the violated
/// policies only, each with `r=0` and its own wait"; README "one refused by any spends nothing
/// from the others"). A policy that admitted and was vetoed is left out of the 429's `RateLimit`
/// (listed with the state of its given-back admission, it would show `r` one too low and `t`
/// one interval too long), `Retry-After` covers every window listed, and the limiter shows
/// nothing was spent.
#[tokio::test]
async fn a_refusal_reports_the_real_state_of_the_policies_it_did_not_spend() {
    let clock = ManualClock::new();
    let limiter = |quota| keyed::<IpAddr>(quota, &clock);
    let wide = limiter(Quota::per_hour(10).unwrap());
    let narrow = limiter(Quota::per_hour(1).unwrap());
    let client: SocketAddr = "192.0.2.80:5000".parse().unwrap();
    let app = wide_then_narrow(wide.clone(), narrow.clone(), client);
    let ok = app.clone().oneshot(get_orders()).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let after_ok = sf_entries(ok.headers(), "ratelimit");
    assert_eq!(after_ok[0].0, "wide");
    // Nine left, whole again in 360 s, but nine take 3240 s at 10 per hour.
    assert_eq!(
        after_ok[0].1,
        [("r".to_string(), 9), ("t".to_string(), 3240)]
    );

    let refused = app.clone().oneshot(get_orders()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "3600");
    let state = sf_entries(refused.headers(), "ratelimit");
    assert_eq!(
        state,
        [(
            "narrow".to_string(),
            vec![("r".to_string(), 0), ("t".to_string(), 3600)]
        )],
        "only the violated policy is listed"
    );
    // The limiter agrees that nothing was spent from `wide`: 9 left (8 after this check).
    assert_eq!(wide.check(&client.ip()).remaining, 8);
}
