//! Tasks racing on two threads through axum with `count_if` policies (every algorithm, and one
//! deciding later like a remote store): exactly the limit reaches the handler, and the permits of
//! responses that do not count come back for exactly the limit more.

use crate::common::keyed_on;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::rate_limit::{GlobalKey, PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{
    algorithm::{Algorithm, FixedWindow, Gcra, SlidingLog},
    clock::ManualClock,
    KeyedRateLimiter, Limiter, Quota,
};

use super::accounting::{log, policy, Mode};
use crate::common::listener::sf_names;

/// Promise: with count_if, "a client over the limit is refused before the inner service runs":
/// many tasks racing on two threads for a limit of L, with every response counting, put exactly
/// L in the handler; once those responses do not count, their permits come back and exactly L
/// more get in. Through axum with `MockConnectInfo`, alongside a shadow and a second count_if
/// policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_with_count_if_put_exactly_the_limit_in_the_handler_fixed_window() {
    race::<FixedWindow>().await;
}

/// The same race on a sliding log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_with_count_if_put_exactly_the_limit_in_the_handler_sliding_log() {
    race::<SlidingLog>().await;
}

/// The same race on GCRA (refunds of admissions that are no longer the key's latest are exact
/// on a frozen clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_with_count_if_put_exactly_the_limit_in_the_handler_gcra() {
    race::<Gcra>().await;
}

/// The same race with the count_if limit decided later, as a remote limiter does (the layer
/// holds the first policy's admission while the second decides): exactly the limit reaches the
/// handler, and the first policy keeps exactly what the admitted requests counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_with_a_remote_count_if_policy_put_exactly_the_limit_in_the_handler() {
    const LIMIT: usize = 5;
    const TASKS: usize = 40;
    let clock = ManualClock::new();
    let wide = log(1000, &clock, Mode::Now);
    let remote = log(LIMIT as u32, &clock, Mode::Later(2));
    let (login, gate_tx, entered) = gated_login();
    let app = login.route_layer(RateLimitLayer::new(
        policy(0, &wide)
            .count_if(|r| r.status != StatusCode::OK)
            .and(policy(1, &remote).count_if(|r| r.status == StatusCode::UNAUTHORIZED)),
    ));
    for (round, status) in [(0, StatusCode::OK), (1, StatusCode::UNAUTHORIZED)] {
        let tasks = start_round(&app, &gate_tx, &entered, round, (TASKS, LIMIT)).await;
        assert_eq!(
            wide.net("k"),
            LIMIT as i64,
            "round {round}: only the requests in the handler hold the wide policy's permits \
             (round 0's responses did not count; the refused gave theirs back)"
        );
        gate_tx.send_replace(Some(status));
        for t in tasks {
            t.await.unwrap();
        }
    }
    assert_eq!(remote.net("k"), LIMIT as i64);
    assert_eq!(wide.net("k"), LIMIT as i64);
    assert_eq!(remote.probe("k"), 0);
    assert_eq!(wide.bad_refunds() + remote.bad_refunds(), 0);
}

async fn race<A: Algorithm>() {
    const LIMIT: usize = 7;
    const TASKS: usize = 48;
    let clock = ManualClock::new();
    let per_ip = KeyedRateLimiter::<IpAddr>::builder(Quota::per_hour(LIMIT as u32).unwrap())
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    let shadow = keyed_on::<IpAddr, _>(Quota::per_hour(1).unwrap(), &clock);
    let global = tower_bulwark::DirectRateLimiter::builder(Quota::per_hour(1000).unwrap())
        .algorithm::<SlidingLog>()
        .clock(clock.clone())
        .build();
    let (login, gate_tx, entered) = gated_login();
    let app = login
        .route_layer(RateLimitLayer::new(
            Policy::new("failures", PeerIp::new(), per_ip)
                .unwrap()
                .count_if(|r| r.status == StatusCode::UNAUTHORIZED)
                .and(
                    Policy::new("curious", PeerIp::new(), shadow)
                        .unwrap()
                        .shadow(),
                )
                .and(
                    Policy::new("all", GlobalKey, global.clone())
                        .unwrap()
                        .count_if(|r| r.status != StatusCode::OK),
                ),
        ))
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 4], 1))));

    for (round, status) in [(0, StatusCode::OK), (1, StatusCode::UNAUTHORIZED)] {
        let tasks = start_round(&app, &gate_tx, &entered, round, (TASKS, LIMIT)).await;
        gate_tx.send_replace(Some(status));
        let mut got = HashMap::new();
        for t in tasks {
            *got.entry(t.await.unwrap()).or_insert(0) += 1;
        }
        assert_eq!(got[&status], LIMIT, "round {round}: {got:?}");
        assert_eq!(got[&StatusCode::TOO_MANY_REQUESTS], TASKS - LIMIT);
    }
    // Round 0's responses did not count; round 1's did: the failures policy is full.
    let request = Request::get("/login").body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        sf_names(response.headers(), "ratelimit"),
        ["failures"],
        "only the refusing policy"
    );
    // The global policy counted only round 1's 401s.
    let mut left = 0;
    while Limiter::<()>::reserve_now(&global, &(), 1)
        .unwrap()
        .unwrap()
        .allowed
    {
        left += 1;
    }
    assert_eq!(left, 1000 - LIMIT);
}

/// Round `round` of a race: closes the gate, sends `tasks` requests to `/login` at once through
/// `app`, and waits until each is either in the handler (counted in `entered`) or refused;
/// exactly `limit` must be in the handler. Returns the tasks, each ending with its response's
/// status once the gate opens.
async fn start_round(
    app: &Router,
    gate_tx: &tokio::sync::watch::Sender<Option<StatusCode>>,
    entered: &AtomicUsize,
    round: u32,
    (tasks, limit): (usize, usize),
) -> Vec<tokio::task::JoinHandle<StatusCode>> {
    gate_tx.send_replace(None);
    entered.store(0, Ordering::SeqCst);
    let refused = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (app, refused) = (app.clone(), refused.clone());
            tokio::spawn(async move {
                let request = Request::get("/login").body(Body::empty()).unwrap();
                let response = app.oneshot(request).await.unwrap();
                if response.status() == StatusCode::TOO_MANY_REQUESTS {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                response.status()
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while entered.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst) < tasks {
        assert!(std::time::Instant::now() < deadline, "round {round} hangs");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(entered.load(Ordering::SeqCst), limit, "round {round}");
    handles
}

/// A `/login` route whose handler counts the requests that reach it and answers, once the gate
/// is open, the status sent on it; with the gate's sender and the count.
fn gated_login() -> (
    Router,
    tokio::sync::watch::Sender<Option<StatusCode>>,
    Arc<AtomicUsize>,
) {
    let (gate_tx, gate) = tokio::sync::watch::channel(None::<StatusCode>);
    let entered = Arc::new(AtomicUsize::new(0));
    let counter = entered.clone();
    let login = Router::new().route(
        "/login",
        get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let mut gate = gate.clone();
            async move { gate.wait_for(Option::is_some).await.unwrap().unwrap() }
        }),
    );
    (login, gate_tx, entered)
}
