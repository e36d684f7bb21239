//! Per-call overhead of the outbound layers around a dependency that answers at once: the retry
//! layer and the circuit breaker next to tower's `retry` (with its `TpsBudget`) and
//! tower-resilience's retry and circuit breaker; the client quota next to tower's `RateLimit`
//! (one thread only: it is not `Clone`); the pushback, which no peer has. From one thread, and
//! from two sharing one budget, breaker, quota or pushback.
//!
//! ```sh
//! cargo bench --all-features --bench resilience -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Every call is `poll_ready`, then `call` with a fresh `GET` (`http::Request<()>`), the future
//! polled to completion with a no-op waker. The dependency answers `200` at once, so a figure is
//! what the layer adds to a call that succeeds; the `open` rows are a breaker that has opened,
//! answering every call with its refusal (what a caller pays during an outage). Each contender
//! is set up as its docs show for an HTTP dependency: a budget of retries, retrying a `503`.
//!
//! With `CALLS=n` in the environment it runs no benchmark but `n` calls of the contender named
//! by `CALL` on one thread, for valgrind to count instructions (run it for two values of `n` and
//! divide the difference, which leaves out start-up):
//!
//! `CALL=reqwest` and `CALL=reqwest-pushback` count whole `GET`s over loopback instead (client
//! and server in this process), bare and through the pushback: the call a layer's instructions
//! are a part of.
//!
//! ```sh
//! cargo bench --all-features --bench resilience --no-run
//! for n in 200000 400000; do
//!   CALLS=$n CALL=bulwark-retry valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/deps/resilience-* 2>&1 | grep 'Collected'
//! done
//! ```

#[path = "support/calls.rs"]
mod calls;
#[path = "support/loopback.rs"]
mod loopback;

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use calls::{on_threads, runtime};
use criterion::{criterion_group, Criterion};
use http::{Request, Response, StatusCode};
use loopback::Loopback;
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Layer, Service};
use tower_bulwark::outbound::breaker::Breaker;
use tower_bulwark::outbound::pushback::Pushback;
use tower_bulwark::outbound::quota::ClientQuotaLayer;
use tower_bulwark::outbound::retry::Retry;
use tower_bulwark::{DirectRateLimiter, Quota};

/// A dependency that answers at once: `200`, or `503` while `failing` is set.
#[derive(Clone, Default)]
struct Dependency {
    failing: Arc<AtomicBool>,
}

impl Service<Request<()>> for Dependency {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let mut response = Response::new(());
        if self.failing.load(Ordering::Relaxed) {
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        ready(Ok(response))
    }
}

/// tower's retry policy for an HTTP dependency: a `503` is retried while the budget allows.
#[derive(Clone)]
struct TowerPolicy(Arc<TpsBudget>);

impl<E> tower::retry::Policy<Request<()>, Response<()>, E> for TowerPolicy {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<()>,
        result: &mut Result<Response<()>, E>,
    ) -> Option<Self::Future> {
        match result {
            Ok(response) if response.status() == StatusCode::SERVICE_UNAVAILABLE => {
                self.0.withdraw().then(|| ready(()))
            }
            _ => {
                self.0.deposit();
                None
            }
        }
    }

    fn clone_request(&mut self, request: &Request<()>) -> Option<Request<()>> {
        Some(request.clone())
    }
}

/// One call: ready, call, and the future polled until it answers; whether it succeeded.
fn one_call<S: Service<Request<()>>>(service: &mut S, cx: &mut Context<'_>) -> bool {
    loop {
        match service.poll_ready(cx) {
            Poll::Ready(Ok(())) => break,
            Poll::Ready(Err(_)) => return false,
            Poll::Pending => std::hint::spin_loop(),
        }
    }
    let mut future = pin!(service.call(Request::new(())));
    loop {
        match future.as_mut().poll(cx) {
            Poll::Ready(result) => return black_box(result.is_ok()),
            Poll::Pending => std::hint::spin_loop(),
        }
    }
}

/// tower's retry with its budget, as its docs set it up: 20 % of calls, at least 10 a second.
fn tower_retry(dependency: Dependency) -> impl Service<Request<()>> + Clone + Send + 'static {
    let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2));
    tower::retry::RetryLayer::new(TowerPolicy(budget)).layer(dependency)
}

/// tower-resilience's retry with a token-bucket budget, retrying a `503`.
fn resilience_retry(dependency: Dependency) -> impl Service<Request<()>> + Clone + Send + 'static {
    let budget = tower_resilience::retry::RetryBudgetBuilder::new()
        .token_bucket()
        .tokens_per_second(10.0)
        .max_tokens(100)
        .build()
        .unwrap();
    tower_resilience::retry::RetryLayer::<Request<()>, Response<()>, Infallible>::builder()
        .max_attempts(3)
        .exponential_backoff(Duration::from_millis(100))
        .retry_on_response(|r: &Response<()>| r.status() == StatusCode::SERVICE_UNAVAILABLE)
        .budget(budget)
        .build()
        .layer(dependency)
}

/// The crate's retry layer, as built by default.
fn bulwark_retry(dependency: Dependency) -> impl Service<Request<()>> + Clone + Send + 'static {
    Retry::builder("bench")
        .build()
        .unwrap()
        .layer()
        .layer(dependency)
}

/// tower-resilience's circuit breaker, counting `5xx` as failures, open for an hour.
fn resilience_breaker(
    dependency: Dependency,
) -> impl Service<Request<()>> + Clone + Send + 'static {
    tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
        .minimum_number_of_calls(20)
        .wait_duration_in_open(Duration::from_secs(3600))
        .classify_response(|r: &Response<()>| r.status().is_server_error())
        .build()
        .unwrap()
        .layer(dependency)
}

/// The crate's circuit breaker, open for an hour.
fn bulwark_breaker(dependency: Dependency) -> impl Service<Request<()>> + Clone + Send + 'static {
    Breaker::builder("bench")
        .open_for(Duration::from_secs(3600))
        .build()
        .unwrap()
        .layer()
        .layer(dependency)
}

/// tower's client-side rate limit, with a quota no benchmark spends: a billion calls a second.
fn tower_rate_limit(dependency: Dependency) -> impl Service<Request<()>> {
    tower::limit::RateLimitLayer::new(NEVER_SPENT.into(), Duration::from_secs(1)).layer(dependency)
}

/// The crate's client quota with the same quota, one permit a call.
fn bulwark_quota(dependency: Dependency) -> impl Service<Request<()>> + Clone + Send + 'static {
    let quota = Quota::per_second(NEVER_SPENT).unwrap();
    ClientQuotaLayer::new("bench", DirectRateLimiter::new(quota)).layer(dependency)
}

/// The crate's pushback, as built by default: it reads each answer's headers (none here).
fn bulwark_pushback(dependency: Dependency) -> impl Service<Request<()>> + Clone + Send + 'static {
    Pushback::new("bench").layer().layer(dependency)
}

/// Calls a second no client quota here spends.
const NEVER_SPENT: u32 = 1_000_000_000;

/// Calls `$run` with each contender's name and a function that builds it around a dependency.
macro_rules! each_contender {
    ($run:ident $(, $arg:expr)*) => {
        $run("none", |d: Dependency| d $(, $arg)*);
        $run("tower retry, TpsBudget", tower_retry $(, $arg)*);
        $run("tower-resilience retry, budget", resilience_retry $(, $arg)*);
        $run("tower-bulwark Retry", bulwark_retry $(, $arg)*);
        $run("tower-resilience circuit breaker", resilience_breaker $(, $arg)*);
        $run("tower-bulwark Breaker", bulwark_breaker $(, $arg)*);
        $run("tower-bulwark client quota", bulwark_quota $(, $arg)*);
        $run("tower-bulwark Pushback", bulwark_pushback $(, $arg)*);
    };
}

/// Opens a breaker: the dependency fails until 100 calls have gone through it.
fn opened<S: Service<Request<()>>>(build: impl Fn(Dependency) -> S, cx: &mut Context<'_>) -> S {
    let dependency = Dependency::default();
    dependency.failing.store(true, Ordering::Relaxed);
    let mut service = build(dependency);
    for _ in 0..100 {
        one_call(&mut service, cx);
    }
    assert!(!one_call(&mut service, cx), "the breaker opened");
    service
}

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

fn one_thread<S: Service<Request<()>>>(
    name: &str,
    build: impl Fn(Dependency) -> S,
    group: &mut Group<'_>,
) {
    let mut cx = Context::from_waker(Waker::noop());
    let mut service = build(Dependency::default());
    group.bench_function(name, |b| b.iter(|| one_call(&mut service, &mut cx)));
    if name.contains("breaker") || name.contains("Breaker") {
        let mut service = opened(build, &mut cx);
        group.bench_function(format!("{name}, open"), |b| {
            b.iter(|| one_call(&mut service, &mut cx))
        });
    }
}

fn threads<S: Service<Request<()>> + Clone + Send>(
    name: &str,
    build: impl Fn(Dependency) -> S,
    group: &mut Group<'_>,
    runtime: &tokio::runtime::Handle,
) {
    let service = build(Dependency::default());
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            on_threads(runtime, &service, 2, iters, |s, cx, _| {
                one_call(s, cx);
            })
        })
    });
}

fn bench_all(c: &mut Criterion) {
    // The retry layers sleep on tokio's timer (never here: nothing fails); give them a context.
    let runtime = runtime();
    let _guard = runtime.enter();

    let mut group = c.benchmark_group("resilience/one thread");
    each_contender!(one_thread, &mut group);
    one_thread("tower RateLimit", tower_rate_limit, &mut group);
    group.finish();

    let mut group = c.benchmark_group("resilience/2 threads");
    each_contender!(threads, &mut group, runtime.handle());
    group.finish();
}

/// `calls` calls of the contender `wanted` if `name` is it (its name in lowercase with dashes
/// for spaces and commas, e.g. `tower-bulwark-retry`; `-open` after a breaker's opens it first).
fn count_if<S: Service<Request<()>>>(
    name: &str,
    build: impl Fn(Dependency) -> S,
    wanted: &str,
    calls: u64,
) {
    let slug = name
        .to_lowercase()
        .replace([' ', ','], "-")
        .replace("--", "-");
    let mut cx = Context::from_waker(Waker::noop());
    let mut service = if wanted == slug {
        build(Dependency::default())
    } else if wanted == format!("{slug}-open") {
        opened(build, &mut cx)
    } else {
        return;
    };
    for _ in 0..calls {
        one_call(&mut service, &mut cx);
    }
    println!("{calls} calls of {name}");
}

fn count(calls: u64) {
    let runtime = runtime();
    let _guard = runtime.enter();
    let wanted = std::env::var("CALL").expect("CALL names a contender");
    if wanted.starts_with("reqwest") {
        let loopback = Loopback::start();
        let mut bare = loopback.client();
        let mut pushback = Pushback::new("bench").layer().layer(loopback.client());
        for _ in 0..calls {
            match wanted.as_str() {
                "reqwest" => loopback.get(&mut bare),
                "reqwest-pushback" => loopback.get(&mut pushback),
                other => panic!("no contender {other}"),
            }
        }
        return println!("{calls} calls of {wanted}");
    }
    each_contender!(count_if, &wanted, calls);
    count_if("tower RateLimit", tower_rate_limit, &wanted, calls);
}

/// What a caller feels: a `reqwest` call over loopback, bare and through a retry layer above a
/// circuit breaker (the order the `outbound` docs give).
fn bench_reqwest(c: &mut Criterion) {
    let loopback = Loopback::start();
    let mut group = c.benchmark_group("resilience/reqwest over loopback");
    loopback.bench(&mut group, "bare client", || loopback.client());
    loopback.bench(&mut group, "tower-bulwark Retry and Breaker", || {
        let retry = Retry::builder("bench").build().unwrap();
        let breaker = Breaker::builder("bench").build().unwrap();
        tower::ServiceBuilder::new()
            .layer(retry.layer())
            .layer(breaker.layer())
            .service(loopback.client())
    });
    group.finish();
}

criterion_group!(benches, bench_all, bench_reqwest);

fn main() {
    if let Some(calls) = std::env::var("CALLS").ok().and_then(|n| n.parse().ok()) {
        return count(calls);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
