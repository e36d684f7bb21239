//! RateLimitLayer through axum's router with `oneshot` on tokio's paused clock, where a decision
//! takes time: a request that waits for its permit (and gives it back when dropped), limiters
//! that decide on a later poll, and with headers off every algorithm waiting, refusing and
//! counting exactly.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{poll_once, tokio_keyed, tokio_keyed_with, waits_up_to};
use crate::support::{json, keyed, peer};
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{algorithm::SlidingLog, clock::ManualClock, Limiter, Quota};

use super::layer_support::*;

/// The status `app` answers a GET of `/orders` with.
async fn status_of(app: &Router) -> StatusCode {
    app.clone().oneshot(get_orders()).await.unwrap().status()
}

/// A GET of `/orders` through `app`, polled once: it holds a permit that is not yet due and
/// waits for it.
fn waiting_for_a_permit(app: &Router) -> impl std::future::Future + Unpin {
    let mut request = Box::pin(app.clone().oneshot(get_orders()));
    assert!(poll_once(Pin::new(&mut request)).is_pending());
    request
}

/// The `/orders` route of one request a second per peer, a request waiting up to a second for
/// its permit, sent from one peer on tokio's clock; and the count of the requests that reach its
/// handler.
fn one_a_second_waiting_app() -> (Router, Arc<AtomicUsize>) {
    let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(1));
    let (app, hits) = counted_orders(RateLimitLayer::new(
        Policy::new("per-ip", PeerIp::new(), tokio_keyed::<IpAddr>(quota)).unwrap(),
    ));
    (app.layer(MockConnectInfo(peer("192.0.2.200"))), hits)
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_for_its_permit_then_proceeds() {
    let (app, hits) = one_a_second_waiting_app();
    let start = tokio::time::Instant::now();
    assert_eq!(status_of(&app).await, StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::ZERO);
    // The second permit falls due in one second: the request waits for it, then passes.
    let waited = app.clone().oneshot(get_orders()).await.unwrap();
    assert_eq!(waited.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // Two permits ahead would be a wait of two seconds, more than `max_wait`: refused at once.
    assert_eq!(status_of(&app).await, StatusCode::OK);
    let third = waiting_for_a_permit(&app);
    assert_eq!(status_of(&app).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "refused without waiting"
    );
    drop(third);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_request_gives_its_permit_back() {
    let (app, hits) = one_a_second_waiting_app();
    assert_eq!(status_of(&app).await, StatusCode::OK);

    // This one holds the next permit and waits for it...
    let waiting = waiting_for_a_permit(&app);
    // ...so another would have to wait two seconds, and is refused.
    assert_eq!(status_of(&app).await, StatusCode::TOO_MANY_REQUESTS);

    // The waiting client goes away: its permit comes back, and the next request gets it.
    drop(waiting);
    let mut next = Box::pin(app.clone().oneshot(get_orders()));
    assert!(
        poll_once(Pin::new(&mut next)).is_pending(),
        "it waits for the returned permit"
    );
    let start = tokio::time::Instant::now();
    assert_eq!(next.await.unwrap().status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "the dropped request never reached the handler"
    );
}

#[tokio::test]
async fn limiters_that_decide_later_are_awaited_and_refunded_like_the_others() {
    let clock = ManualClock::new();
    let local = keyed(Quota::per_second(5).unwrap(), &clock);
    let remote_state = keyed(Quota::per_second(2).unwrap(), &clock);
    let (remote, open) = Later::new(remote_state.clone());
    let asked = remote.asked.clone();
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("local", PeerIp::new(), BoxLimiter::new(local.clone()))
                .unwrap()
                .and(Policy::new("remote", PeerIp::new(), BoxLimiter::new(remote)).unwrap()),
        ));
    let client = peer("192.0.2.33");
    let ok = send(&app, client, &[]).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(body(ok).await, "ok");
    assert_eq!(send(&app, client, &[]).await.status(), StatusCode::OK);
    let refused = send(&app, client, &[]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let problem = json(refused).await;
    assert_eq!(problem["violated-policies"], serde_json::json!(["remote"]));
    // Two local permits spent by the admitted requests; the refused one's was given back.
    assert_eq!(local.check(&client.ip()).remaining, 2);
    assert_eq!(asked.load(Ordering::SeqCst), 3);

    // A request whose remote decision is still out when the client goes away gives back the
    // local permit it already holds.
    open.send_replace(false);
    let other = peer("192.0.2.34");
    let mut request = Request::get("/orders").body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(other));
    let mut in_flight = Box::pin(app.clone().oneshot(request));
    assert!(poll_once(Pin::new(&mut in_flight)).is_pending());
    assert!(poll_once(Pin::new(&mut in_flight)).is_pending());
    assert_eq!(
        asked.load(Ordering::SeqCst),
        4,
        "the remote policy is being asked"
    );
    let probe = local.check(&other.ip());
    assert_eq!(probe.remaining, 3, "one local permit is held");
    // The probe goes back, so the held permit is the key's latest admission again (a GCRA
    // refund gives back only that one).
    Limiter::refund(&local, &other.ip(), 1, probe);
    drop(in_flight);
    assert_eq!(
        local.check(&other.ip()).remaining,
        4,
        "and given back: only this check holds a permit"
    );
}

/// With headers off, one policy takes the shortest way (the limiter only says whether the
/// permits were taken at once). Every algorithm must still wait, refuse and count exactly there:
/// 3 at once, a 4th that waits for its permit, a 5th refused with `Retry-After`, and 300
/// concurrent requests racing for the 37 permits of another key get exactly 37.
#[tokio::test(start_paused = true)]
async fn with_headers_off_every_algorithm_waits_refuses_and_counts_exactly() {
    use tower_bulwark::algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter};

    async fn run<A: Algorithm>(name: &str) {
        let quota = waits_up_to(Quota::per_second(3).unwrap(), Duration::from_millis(400));
        let limiter = tokio_keyed_with::<IpAddr, A>(quota);
        let (app, hits) = counted_orders(
            RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter).unwrap())
                .without_admitted_headers(),
        );
        let from = |ip: &str| app.clone().layer(MockConnectInfo(peer(ip)));
        let request = || Request::get("/orders").body(Body::empty()).unwrap();
        let client = "192.0.2.10";
        for _ in 0..3 {
            let ok = from(client).oneshot(request()).await.unwrap();
            assert_eq!(ok.status(), StatusCode::OK, "{name}");
            assert!(!ok.headers().contains_key("ratelimit"), "{name}");
        }
        // The algorithms that can reserve a later permit make the 4th wait for it (the window
        // algorithms, whose next permit is a window away, refuse it); the 5th, at the same
        // instant, would wait past `max_wait` and is refused at once.
        let start = tokio::time::Instant::now();
        let fourth = tokio::spawn(from(client).oneshot(request()));
        tokio::task::yield_now().await;
        let fifth = from(client).oneshot(request()).await.unwrap();
        assert_eq!(fifth.status(), StatusCode::TOO_MANY_REQUESTS, "{name}");
        assert!(fifth.headers().contains_key("retry-after"), "{name}");
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "{name}: refused without waiting"
        );
        let fourth = fourth.await.unwrap().unwrap();
        if fourth.status() == StatusCode::OK {
            assert!(start.elapsed() > Duration::ZERO, "{name}: admitted at once");
            assert!(start.elapsed() <= Duration::from_millis(400), "{name}");
        } else {
            assert_eq!(fourth.status(), StatusCode::TOO_MANY_REQUESTS, "{name}");
        }
        let admitted_so_far = hits.load(Ordering::SeqCst);

        // 300 requests of one client at once, for a fresh budget of 37.
        let quota = Quota::per_hour(37).unwrap();
        let limiter = tokio_keyed_with::<IpAddr, A>(quota);
        let app = Router::new()
            .route("/orders", get(|| async { "ok" }))
            .route_layer(
                RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter).unwrap())
                    .without_admitted_headers(),
            )
            .layer(MockConnectInfo(peer("192.0.2.11")));
        let tasks: Vec<_> = (0..300)
            .map(|_| tokio::spawn(app.clone().oneshot(request())))
            .collect();
        let mut ok = 0;
        for task in tasks {
            let response = task.await.unwrap().unwrap();
            match response.status() {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("{name}: {other}"),
            }
        }
        assert_eq!(ok, 37, "{name}");
        assert!((3..=4).contains(&admitted_so_far), "{name}");
    }
    run::<Gcra>("gcra").await;
    run::<FixedWindow>("fixed window").await;
    run::<SlidingLog>("sliding log").await;
    run::<SlidingCounter>("sliding counter").await;
}
