//! A gRPC call through `RateLimitLayer` beside an HTTP request through the same layer, in process
//! (no sockets), admitted and refused: what the gRPC answers cost.
//!
//! ```sh
//! cargo bench --bench grpc --features grpc
//! ```

use std::hint::black_box;

use axum::body::Body;
use criterion::{criterion_group, criterion_main, Criterion};
use http::Request;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
use tower_bulwark::{KeyedRateLimiter, Quota};

fn request(grpc: bool) -> Request<Body> {
    // Both with a content type, so that they differ only in what it says.
    let content_type = if grpc {
        "application/grpc"
    } else {
        "application/json"
    };
    let request =
        Request::post("/helloworld.Greeter/SayHello").header("content-type", content_type);
    request.body(Body::empty()).unwrap()
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let inner = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    for (name, quota) in [
        ("admitted", Quota::per_second(1_000_000_000).unwrap()),
        ("refused", Quota::per_hour(1).unwrap()),
    ] {
        let policy = Policy::new("greeter", GlobalKey, KeyedRateLimiter::<()>::new(quota)).unwrap();
        let service = RateLimitLayer::new(policy).layer(inner);
        // Spend the one permit of the refusing quota.
        runtime
            .block_on(service.clone().oneshot(request(false)))
            .unwrap();
        let mut group = c.benchmark_group(format!("grpc/{name}"));
        for (kind, grpc) in [("http", false), ("grpc", true)] {
            group.bench_function(kind, |b| {
                let mut service = service.clone();
                b.iter(|| {
                    let response = runtime.block_on(async {
                        service.ready().await.unwrap();
                        service.call(request(grpc)).await.unwrap()
                    });
                    black_box(response)
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
