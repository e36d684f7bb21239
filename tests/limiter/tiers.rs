//! Tiers: a quota per key, chosen at decision time (an API key's plan), advertised in the
//! headers of that key's responses; refunds go back to the tier that decided.

use crate::common::keyed_on;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{HeaderValue, Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
use tower_bulwark::tiers::UnknownTier;
use tower_bulwark::{clock::ManualClock, tiers::Tiers, KeyedRateLimiter, Limiter, Quota};

use crate::common::listener;

type Keyed = KeyedRateLimiter<HeaderValue, tower_bulwark::algorithm::Gcra, ManualClock>;

fn keyed(quota: Quota, clock: &ManualClock) -> Keyed {
    keyed_on(quota, clock)
}

fn plan_of(key: &HeaderValue) -> &'static str {
    let key = key.as_bytes();
    if key.starts_with(b"pro-") {
        "pro"
    } else if key.starts_with(b"free-") {
        "free"
    } else {
        "nobody"
    }
}

async fn get_with_key(app: &Router, key: &str) -> http::Response<Body> {
    let request = Request::get("/items")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    app.clone()
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1))))
        .oneshot(request)
        .await
        .unwrap()
}

#[tokio::test]
async fn each_key_is_limited_and_advertised_by_its_own_plan() {
    let clock = ManualClock::new();
    let free = keyed(Quota::per_hour(3).unwrap(), &clock);
    let pro = keyed(Quota::per_hour(100).unwrap(), &clock);
    let plans = Tiers::new(plan_of, "free", free.clone()).tier("pro", pro.clone());
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("plan", HeaderKey::new("x-api-key").unwrap(), plans).unwrap(),
        ));
    let policy = |r: &http::Response<Body>| {
        listener::sf_list(r.headers()["ratelimit-policy"].to_str().unwrap())
    };
    let state =
        |r: &http::Response<Body>| listener::sf_list(r.headers()["ratelimit"].to_str().unwrap());
    let first_free = get_with_key(&app, "free-1").await;
    let first_pro = get_with_key(&app, "pro-1").await;
    assert_eq!(policy(&first_free)[0].1[0], ("q".to_string(), 3));
    assert_eq!(policy(&first_pro)[0].1[0], ("q".to_string(), 100));
    assert_eq!(state(&first_free)[0].1[0], ("r".to_string(), 2));
    assert_eq!(state(&first_pro)[0].1[0], ("r".to_string(), 99));
    // The free key runs out at 3, the pro key does not.
    let mut free_ok = 1;
    let mut pro_ok = 1;
    for _ in 0..9 {
        free_ok += u32::from(get_with_key(&app, "free-1").await.status() == StatusCode::OK);
        pro_ok += u32::from(get_with_key(&app, "pro-1").await.status() == StatusCode::OK);
    }
    assert_eq!((free_ok, pro_ok), (3, 10));
    let refused = get_with_key(&app, "free-1").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policy(&refused)[0].1[0], ("q".to_string(), 3));
    // The state lives in each tier's own limiter.
    assert_eq!(pro.len(), 1);
    assert_eq!(free.len(), 1);
}

#[tokio::test]
async fn a_key_that_names_no_plan_is_an_error_not_an_admission() {
    let clock = ManualClock::new();
    let plans = Tiers::new(plan_of, "free", keyed(Quota::per_hour(3).unwrap(), &clock));
    let err = plans
        .reserve(&HeaderValue::from_static("mallory"), 1)
        .await
        .unwrap_err();
    let unknown = err.downcast_ref::<UnknownTier>().expect("an UnknownTier");
    assert_eq!(
        unknown.to_string(),
        "the key's tier \"nobody\" has no limiter"
    );
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("plan", HeaderKey::new("x-api-key").unwrap(), plans).unwrap(),
        ));
    assert_eq!(
        get_with_key(&app, "mallory").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[test]
fn a_refund_goes_back_to_the_tier_that_decided_even_after_the_key_moved() {
    let clock = ManualClock::new();
    let free = keyed(Quota::per_hour(3).unwrap(), &clock);
    let pro = keyed(Quota::per_hour(3).unwrap(), &clock);
    let upgraded = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&upgraded);
    let plans = Tiers::new(
        move |_: &HeaderValue| {
            if flag.load(Ordering::SeqCst) {
                "pro"
            } else {
                "free"
            }
        },
        "free",
        free.clone(),
    )
    .tier("pro", pro.clone());
    let key = HeaderValue::from_static("k");
    let decision = plans.reserve_now(&key, 1).unwrap().unwrap();
    assert!(decision.allowed);
    upgraded.store(true, Ordering::SeqCst);
    // Refunded while the key is in `pro`: the permit goes back to `free`, which took it; `pro`
    // gains nothing it never gave.
    plans.refund(&key, 1, decision);
    assert_eq!(free.check(&key).remaining, 2, "free got its permit back");
    assert_eq!(pro.check(&key).remaining, 2, "pro is as it was");
}

#[test]
fn threads_racing_on_one_tier_get_exactly_its_quota() {
    for _ in 0..20 {
        let clock = ManualClock::new();
        let plans = Tiers::new(plan_of, "free", keyed(Quota::per_hour(5).unwrap(), &clock))
            .tier("pro", keyed(Quota::per_hour(37).unwrap(), &clock));
        let admitted = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (plans, admitted, barrier) =
                    (plans.clone(), Arc::clone(&admitted), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let key = HeaderValue::from_static("pro-shared");
                    barrier.wait();
                    for _ in 0..20 {
                        if plans.reserve_now(&key, 1).unwrap().unwrap().allowed {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(admitted.load(Ordering::SeqCst), 37);
    }
}
