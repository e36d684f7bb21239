//! The cost of RateLimitLayer on one request through an axum router, in process (no sockets):
//! the same variants as `benches/http_wrk.sh`, which measures them over loopback.
//!
//! ```sh
//! cargo bench --bench http
//! ```
//!
//! Before the timings it prints the heap allocations per request of each variant, counted by the
//! global allocator: unlike time, that count does not move with the load on the machine.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::routing::get;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use http::Request;
use tower::{Service, ServiceExt};
use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{KeyedRateLimiter, Quota};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

const NEVER_REFUSES: u32 = 1_000_000_000;

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a side note.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

fn bulwark(quota: Quota) -> RateLimitLayer<Policy<PeerIp, KeyedRateLimiter<IpAddr>>> {
    let limiter = KeyedRateLimiter::<IpAddr>::new(quota);
    RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter).unwrap())
}

fn variants() -> Vec<(&'static str, Router)> {
    let never = Quota::per_second(NEVER_REFUSES).unwrap();
    let hourly = Quota::per_hour(1).unwrap();
    let governor = |replenish_nanos: Option<u64>, burst: u32| {
        let mut builder = GovernorConfigBuilder::default();
        match replenish_nanos {
            Some(nanos) => builder.per_nanosecond(nanos),
            None => builder.per_second(3600),
        };
        GovernorLayer::new(builder.burst_size(burst).finish().unwrap())
    };
    vec![
        ("none", hello()),
        // A layer that does nothing: what axum's `route_layer` plumbing costs by itself.
        (
            "identity-layer",
            hello().route_layer(tower::layer::util::Identity::new()),
        ),
        ("bulwark", hello().route_layer(bulwark(never))),
        (
            "bulwark-bare",
            hello().route_layer(bulwark(never).without_admitted_headers()),
        ),
        (
            "governor",
            hello().route_layer(governor(Some(1), NEVER_REFUSES)),
        ),
        ("bulwark-refuse", hello().route_layer(bulwark(hourly))),
        ("governor-refuse", hello().route_layer(governor(None, 1))),
    ]
}

/// One request through `service`, body read to the end.
async fn send(service: &mut axum::routing::RouterIntoService<Body>, peer: SocketAddr) {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    black_box(body);
}

fn requests(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let peer = SocketAddr::from(([127, 0, 0, 1], 40_000));
    println!("heap allocations per request (after a warm-up):");
    for (name, app) in variants() {
        let mut service = app.with_state::<()>(()).into_service::<Body>();
        rt.block_on(async {
            for _ in 0..100 {
                send(&mut service, peer).await;
            }
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            for _ in 0..1000 {
                send(&mut service, peer).await;
            }
            let per_request = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 1000.0;
            println!("  {name:16} {per_request:5.1}");
        });
    }
    let mut group = c.benchmark_group("http_request");
    group.measurement_time(Duration::from_secs(3));
    for (name, app) in variants() {
        let mut service = app.with_state::<()>(()).into_service::<Body>();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        send(&mut service, peer).await;
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, requests);
criterion_main!(benches);
