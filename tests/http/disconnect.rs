//! Clients that go away mid-request, over a real listener on 127.0.0.1: the server drops the
//! request's future, and every permit it held (a rate-limit reservation, a bulkhead place in the
//! queue) must come back.
//!
//! Nothing here sleeps to pass: the test waits, with a deadline, for a state it can observe.

use crate::common::keyed_on;
use crate::common::listener::serve;
use crate::common::waits_up_to;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::observe::Observed;
use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{clock::ManualClock, Limiter, Quota};

/// Waits until `done` holds, checking between short pauses; fails after ten seconds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn send_get(addr: SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    stream
}

async fn status_of(mut stream: TcpStream) -> String {
    let mut buf = vec![0; 1024];
    let n = stream.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap()
        .to_owned()
}

/// Held (README "Waiting": "if its client goes away meanwhile, the permit is given back"): a
/// client that disconnects while its request waits for a permit gets the reservation given
/// back, over a real connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_while_waiting_gives_its_reservation_back() {
    let clock = ManualClock::new();
    // One per minute, waits up to a minute: the second request waits (the clock never moves).
    let quota = waits_up_to(Quota::per_minute(1).unwrap(), Duration::from_secs(60));
    let limiter = Observed::new("wait", keyed_on::<IpAddr, _>(quota, &clock));
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("wait", PeerIp::new(), limiter.clone()).unwrap(),
        ));
    let addr = serve(app).await;
    assert_eq!(
        status_of(send_get(addr, "/orders").await).await,
        "HTTP/1.1 200 OK"
    );
    let waiting = send_get(addr, "/orders").await;
    eventually("the second request holds a reservation", || {
        limiter.snapshot().waiting_requests == 1
    })
    .await;
    drop(waiting);
    eventually("the reservation is given back", || {
        limiter.snapshot().waiting_requests == 0
    })
    .await;
    // Given back: the next reservation is one period ahead, not two.
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let next = Limiter::reserve_now(limiter.get_ref(), &ip, 1)
        .unwrap()
        .unwrap();
    assert!(next.allowed);
    assert_eq!(next.wait, Duration::from_secs(60));
}

/// Held (bulkhead docs: a queued call "that is dropped (its caller gave up ...) leaves the queue
/// at once"; a running call dropped gives its permit back): handlers calling a dependency
/// through a queue bulkhead, whose clients hang up while queued and while running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_hang_up_free_their_bulkhead_places() {
    let bulkhead = Bulkhead::queue("dep", 1, 4).build();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let dependency = {
        let gate = gate.clone();
        tower::service_fn(move |()| {
            let gate = gate.clone();
            async move {
                gate.acquire().await.unwrap().forget();
                Ok::<_, std::io::Error>("paid")
            }
        })
    };
    let client = bulkhead.layer().layer(dependency);
    let app = Router::new().route(
        "/pay",
        get(move || {
            let mut client = client.clone();
            async move {
                match client.ready().await.unwrap().call(()).await {
                    Ok(body) => body.to_string(),
                    Err(e) => e.to_string(),
                }
            }
        }),
    );
    let addr = serve(app).await;
    let running = send_get(addr, "/pay").await;
    eventually("the first call runs", || {
        bulkhead.snapshot().available_concurrent_calls == 0
    })
    .await;
    let queued = send_get(addr, "/pay").await;
    let queued_too = send_get(addr, "/pay").await;
    eventually("two calls queue", || bulkhead.snapshot().queue_depth == 2).await;
    drop(queued);
    eventually("the dropped call leaves the queue", || {
        bulkhead.snapshot().queue_depth == 1
    })
    .await;
    // The running call's client hangs up: its permit passes to the one still queued.
    drop(running);
    eventually("the permit passes on", || {
        bulkhead.snapshot().queue_depth == 0
    })
    .await;
    gate.add_permits(1);
    assert_eq!(status_of(queued_too).await, "HTTP/1.1 200 OK");
    eventually("every permit is back", || {
        let s = bulkhead.snapshot();
        s.available_concurrent_calls == 1 && s.total_finished == s.total_permitted
    })
    .await;
    let s = bulkhead.snapshot();
    assert_eq!(s.total_permitted, 2, "{s:?}");
    assert_eq!(s.total_rejected, 0);
}
