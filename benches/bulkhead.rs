//! Per-call overhead of a bulkhead around a no-op service, next to `tower::limit::ConcurrencyLimit`
//! and tower-resilience's bulkhead, uncontended and with two threads sharing one limit; and what
//! a caller feels: a `reqwest` call over loopback, bare, behind `ConcurrencyLimit` (tokio's
//! semaphore) and behind a bulkhead.
//!
//! ```sh
//! cargo bench --bench bulkhead -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! The "three hooks" line sets every event hook, so it also pays for two clock reads per call.
//!
//! Every call is `poll_ready` then `call`, and the response future is polled to completion with a
//! no-op waker (all contenders answer at once here: the limit is far above the callers). The
//! limit is 1024 so that nothing is refused and every contender does the same work per call.

#[path = "support/calls.rs"]
mod calls;
#[path = "support/loopback.rs"]
mod loopback;

use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use calls::{on_threads, runtime};
use criterion::{criterion_group, criterion_main, Criterion};
use loopback::Loopback;
use tower::limit::ConcurrencyLimitLayer;
use tower::{Layer, Service};
use tower_bulwark::bulkhead::{Bulkhead, CallFinished, CallPermitted, CallRejected};

const LIMIT: usize = 1024;

/// The cheapest service there is.
#[derive(Clone, Copy)]
struct Noop;

impl Service<u64> for Noop {
    type Response = u64;
    type Error = std::convert::Infallible;
    type Future = Ready<Result<u64, Self::Error>>;

    #[inline]
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    #[inline]
    fn call(&mut self, request: u64) -> Self::Future {
        ready(Ok(request))
    }
}

/// One call: ready, call, and the future polled until it answers.
#[inline]
fn one_call<S: Service<u64>>(service: &mut S, cx: &mut Context<'_>, n: u64) {
    loop {
        match service.poll_ready(cx) {
            Poll::Ready(Ok(())) => break,
            Poll::Ready(Err(_)) => panic!("not ready"),
            Poll::Pending => std::hint::spin_loop(),
        }
    }
    let mut future = pin!(service.call(n));
    loop {
        match future.as_mut().poll(cx) {
            Poll::Ready(Ok(response)) => {
                black_box(response);
                return;
            }
            Poll::Ready(Err(_)) => panic!("call failed"),
            Poll::Pending => std::hint::spin_loop(),
        }
    }
}

fn bench_all(c: &mut Criterion) {
    // tower-resilience's bulkhead reads tokio's clock; give it a runtime context.
    let runtime = runtime();
    let _guard = runtime.enter();

    let ours = || {
        Bulkhead::semaphore("bench", LIMIT)
            .build()
            .layer()
            .layer(Noop)
    };
    let tower_limit = || ConcurrencyLimitLayer::new(LIMIT).layer(Noop);
    let resilience = || {
        tower_resilience::bulkhead::BulkheadLayer::builder()
            .max_concurrent_calls(LIMIT)
            .reject_when_full()
            .name("bench")
            .build()
            .unwrap()
            .layer(Noop)
    };

    let mut group = c.benchmark_group("bulkhead/uncontended");
    let mut cx = Context::from_waker(Waker::noop());
    group.bench_function("noop (no limit)", |b| {
        let mut service = Noop;
        let mut n = 0;
        b.iter(|| {
            n += 1;
            one_call(&mut service, &mut cx, n)
        })
    });
    group.bench_function("tower ConcurrencyLimit", |b| {
        let mut service = tower_limit();
        let mut n = 0;
        b.iter(|| {
            n += 1;
            one_call(&mut service, &mut cx, n)
        })
    });
    group.bench_function("tower-bulwark Bulkhead", |b| {
        let mut service = ours();
        let mut n = 0;
        b.iter(|| {
            n += 1;
            one_call(&mut service, &mut cx, n)
        })
    });
    group.bench_function("tower-bulwark Bulkhead, three hooks", |b| {
        let mut service = Bulkhead::semaphore("bench", LIMIT)
            .on_call_permitted(|event: &CallPermitted<'_>| {
                black_box(event);
            })
            .on_call_rejected(|event: &CallRejected<'_>| {
                black_box(event);
            })
            .on_call_finished(|event: &CallFinished<'_>| {
                black_box(event.duration);
            })
            .build()
            .layer()
            .layer(Noop);
        let mut n = 0;
        b.iter(|| {
            n += 1;
            one_call(&mut service, &mut cx, n)
        })
    });
    group.bench_function("tower-resilience Bulkhead", |b| {
        let mut service = resilience();
        let mut n = 0;
        b.iter(|| {
            n += 1;
            one_call(&mut service, &mut cx, n)
        })
    });
    group.finish();

    let mut group = c.benchmark_group("bulkhead/2 threads");
    group.bench_function("tower ConcurrencyLimit", |b| {
        let service = tower_limit();
        b.iter_custom(|iters| on_threads(runtime.handle(), &service, 2, iters, one_call))
    });
    group.bench_function("tower-bulwark Bulkhead", |b| {
        let service = ours();
        b.iter_custom(|iters| on_threads(runtime.handle(), &service, 2, iters, one_call))
    });
    group.bench_function("tower-resilience Bulkhead", |b| {
        let service = resilience();
        b.iter_custom(|iters| on_threads(runtime.handle(), &service, 2, iters, one_call))
    });
    group.finish();
}

fn bench_reqwest(c: &mut Criterion) {
    let loopback = Loopback::start();
    let mut group = c.benchmark_group("bulkhead/reqwest over loopback");
    loopback.bench(&mut group, "bare client", || loopback.client());
    loopback.bench(&mut group, "tower ConcurrencyLimit", || {
        ConcurrencyLimitLayer::new(LIMIT).layer(loopback.client())
    });
    loopback.bench(&mut group, "tower-bulwark Bulkhead", || {
        let bulkhead = Bulkhead::semaphore("bench", LIMIT).build();
        bulkhead.layer().layer(loopback.client())
    });
    group.finish();
}

criterion_group!(benches, bench_all, bench_reqwest);
criterion_main!(benches);
