//! Per-request overhead of the overload protection around a service that answers at once, next
//! to what tower has for the same place (`load_shed` over `concurrency_limit`: a fixed limit
//! that sheds the excess), from one thread and from several sharing one protection. Every
//! request is `poll_ready`, then `call` with a fresh `GET`, the future polled to completion with a
//! no-op waker and the response (its body) dropped, which gives the permit back. The limits are
//! far above the callers, so nothing is shed and every contender does the same work a request.
//!
//! ```sh
//! cargo bench --features adaptive --bench overload -- --warm-up-time 1 --measurement-time 3
//! THREADS=8 cargo bench --features adaptive --bench overload -- threads   # more threads
//! ```
//!
//! With `CALLS=n` it runs no benchmark but `n` requests of `CALL` (`tower-shed` or `overload`)
//! on one thread, for valgrind to count instructions (run it for two values of `n` and divide
//! the difference).

#[path = "support/calls.rs"]
mod calls;

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use calls::{on_threads, runtime};
use criterion::{criterion_group, Criterion};
use http::{Request, Response};
use http_body_util::Empty;
use tower::{Service, ServiceBuilder};
use tower_bulwark::bulkhead::adaptive::Limits;
use tower_bulwark::overload::Overload;

/// A service that answers `200` with an empty body at once.
#[derive(Clone, Copy)]
struct Noop;

impl Service<Request<()>> for Noop {
    type Response = Response<Empty<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(Empty::new())))
    }
}

/// One request: ready, call, the future polled until it answers, the response dropped.
fn one_call<S: Service<Request<()>>>(service: &mut S, cx: &mut Context<'_>) {
    loop {
        match service.poll_ready(cx) {
            Poll::Ready(Ok(())) => break,
            Poll::Ready(Err(_)) => panic!("not ready"),
            Poll::Pending => std::hint::spin_loop(),
        }
    }
    let mut future = pin!(service.call(Request::new(())));
    loop {
        match future.as_mut().poll(cx) {
            Poll::Ready(result) => return drop(black_box(result.ok().expect("answered"))),
            Poll::Pending => std::hint::spin_loop(),
        }
    }
}

/// Requests in flight that neither contender reaches.
const LIMIT: usize = 1000;

/// tower's fixed limit with shedding.
fn tower_shed() -> impl Service<Request<()>> + Clone + Send {
    ServiceBuilder::new()
        .load_shed()
        .concurrency_limit(LIMIT)
        .service(Noop)
}

/// The overload protection, its limit held at `LIMIT` (the default algorithm, AIMD, still runs
/// on every answer's latency; only its bounds keep it there).
fn overload() -> impl Service<Request<()>> + Clone + Send {
    let limits = Limits::new(LIMIT, LIMIT, LIMIT).unwrap();
    let overload = Overload::builder("bench").limits(limits).build();
    tower::Layer::layer(&overload.layer(), Noop)
}

fn bench_all(c: &mut Criterion) {
    let runtime = runtime();
    let _guard = runtime.enter();
    let mut cx = Context::from_waker(Waker::noop());
    let mut group = c.benchmark_group("overload/one thread");
    let mut service = tower_shed();
    group.bench_function("tower load_shed + concurrency_limit", |b| {
        b.iter(|| one_call(&mut service, &mut cx))
    });
    let mut service = overload();
    group.bench_function("tower-bulwark Overload", |b| {
        b.iter(|| one_call(&mut service, &mut cx))
    });
    group.finish();

    let threads = std::env::var("THREADS").map_or(2, |t| t.parse().expect("THREADS: a count"));
    let mut group = c.benchmark_group(format!("overload/{threads} threads"));
    let (shed, protection) = (tower_shed(), overload());
    let handle = runtime.handle();
    group.bench_function("tower load_shed + concurrency_limit", |b| {
        b.iter_custom(|iters| on_threads(handle, &shed, threads, iters, |s, cx, _| one_call(s, cx)))
    });
    group.bench_function("tower-bulwark Overload", |b| {
        b.iter_custom(|iters| {
            on_threads(handle, &protection, threads, iters, |s, cx, _| {
                one_call(s, cx)
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench_all);

/// `calls` requests through `service`.
fn count<S: Service<Request<()>>>(mut service: S, calls: u64, cx: &mut Context<'_>) {
    for _ in 0..calls {
        one_call(&mut service, cx);
    }
}

fn main() {
    if let Some(calls) = std::env::var("CALLS").ok().and_then(|n| n.parse().ok()) {
        let runtime = runtime();
        let _guard = runtime.enter();
        let mut cx = Context::from_waker(Waker::noop());
        let call = std::env::var("CALL");
        match call.as_deref() {
            Ok("tower-shed") => count(tower_shed(), calls, &mut cx),
            Ok("overload") => count(overload(), calls, &mut cx),
            other => panic!("CALL is tower-shed or overload, not {other:?}"),
        }
        return println!("{calls} requests of {}", std::env::var("CALL").unwrap());
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
