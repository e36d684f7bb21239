//! Exact permit accounting in the layer's response future: its permits are released exactly
//! once whatever happens to it (dropped in every state, limiters that pend or fail, inner
//! services that panic or fail, headers on and off, `count_if`).
//!
//! Every count is checked against the real limiter's state afterwards (what is left of the
//! budget, drained permit by permit), never against a fake.

use crate::common::{block_on, poll_once, tokio_keyed, waits_up_to, YieldOnce};
use crate::support::{drain, header_key, keyed, with_admitted_headers, Slow};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::algorithm::Gcra;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{
    FailMode, KeyError, Policy, PolicySet, RateLimitLayer, RateLimitService,
};
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

// ---------------------------------------------------------------------------------------------
// The response future: permits released exactly once
// ---------------------------------------------------------------------------------------------

/// An inner service that counts its calls and answers 200 (or, per the `x-answer` header, a
/// given status, a panic in its future, or an error).
#[derive(Clone, Default)]
struct Inner {
    calls: Arc<AtomicUsize>,
}

impl Service<Request<Body>> for Inner {
    type Response = Response<Body>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = request
            .headers()
            .get("x-answer")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_else(|| "200".into());
        if answer == "call-panic" {
            panic!("the inner service's call panicked");
        }
        Box::pin(async move {
            YieldOnce::default().await;
            match answer.as_str() {
                "panic" => panic!("the handler panicked"),
                "error" => Err(std::io::Error::other("the handler failed")),
                status => Ok(Response::builder()
                    .status(status.parse::<u16>().unwrap())
                    .body(Body::from("inner"))
                    .unwrap()),
            }
        })
    }
}

fn req(answer: &str) -> Request<Body> {
    Request::get("/r")
        .header("x-tenant", "t")
        .header("x-gate", "g")
        .header("x-answer", answer)
        .body(Body::empty())
        .unwrap()
}

/// A [`Slow`] limiter of 5 per minute on `clock`, pending `pendings` polls, failing if `fails`.
fn slow_per_minute(clock: &ManualClock, pendings: usize, fails: bool) -> Slow<String> {
    Slow::new(keyed(Quota::per_minute(5).unwrap(), clock), pendings, fails)
}

/// A fast policy, 5 a minute per `x-tenant` on `clock`, then `slow` per `x-gate`, in one layer
/// (its admitted headers on or off) around a fresh [`Inner`]: the fast policy's limiter, the
/// inner service and the layer's service.
fn fast_then_slow(
    clock: &ManualClock,
    slow: &Slow<String>,
    headers: bool,
) -> (
    KeyedRateLimiter<String, Gcra, ManualClock>,
    Inner,
    RateLimitService<Inner, impl PolicySet>,
) {
    let fast = keyed(Quota::per_minute(5).unwrap(), clock);
    let policies = Policy::new("fast", header_key("x-tenant"), fast.clone())
        .unwrap()
        .and(Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap());
    let inner = Inner::default();
    let layer = with_admitted_headers(RateLimitLayer::new(policies), headers);
    (fast, inner.clone(), layer.layer(inner))
}

/// Waits for `service` to be ready, then sends it `req("200")` and waits for the answer.
async fn ready_then_call<S>(service: &mut S) -> S::Response
where
    S: Service<Request<Body>>,
    S::Error: std::fmt::Debug,
{
    service
        .ready()
        .await
        .unwrap()
        .call(req("200"))
        .await
        .unwrap()
}

fn debug_state(future: &impl std::fmt::Debug) -> String {
    format!("{future:?}")
}

/// A real policy then a slow one: the future waits on the slow limiter holding the first
/// policy's permit. Dropped before its first poll, or after any number of pending polls, it
/// gives that permit back (exactly once: the budget is whole again, not more), the slow
/// limiter's future never decided, and the inner service was never called.
#[test]
fn dropped_while_a_limiter_is_pending_gives_back_exactly_once() {
    for polls in 0..4 {
        for headers in [false, true] {
            let clock = ManualClock::new();
            let slow = slow_per_minute(&clock, 5, false);
            let (fast, inner, mut service) = fast_then_slow(&clock, &slow, headers);
            let mut future = Box::pin(service.call(req("200")));
            let debug = debug_state(&future);
            assert!(
                debug.contains("reserving") && debug.contains("permits_held: 1"),
                "{debug}"
            );
            for _ in 0..polls {
                assert!(poll_once(future.as_mut()).is_pending());
                let debug = debug_state(&future);
                assert!(debug.contains("reserving"), "{debug}");
            }
            drop(future);
            assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
            assert_eq!(slow.decided.load(Ordering::SeqCst), 0);
            assert_eq!(
                drain(&fast, "t"),
                5,
                "polls {polls}: the fast permit given back once"
            );
            assert_eq!(drain(&slow.inner, "g"), 5);
        }
    }
}

/// The same pair driven to the end: both permits spent exactly once, the inner service called
/// once; the future's Debug tells each state; headers only when asked for.
#[test]
fn a_deferred_admission_spends_each_permit_once() {
    for headers in [false, true] {
        let clock = ManualClock::new();
        let slow = slow_per_minute(&clock, 2, false);
        let (fast, inner, mut service) = fast_then_slow(&clock, &slow, headers);
        let mut future = Box::pin(service.call(req("200")));
        let response = loop {
            match poll_once(future.as_mut()) {
                Poll::Ready(response) => break response.unwrap(),
                Poll::Pending => {
                    let debug = debug_state(&future);
                    assert!(
                        debug.contains("reserving") || debug.contains("calling"),
                        "{debug}"
                    );
                }
            }
        };
        let _ = debug_state(&future);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers().contains_key("ratelimit"), headers);
        assert_eq!(response.headers().contains_key("ratelimit-policy"), headers);
        drop(future);
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
        assert_eq!(drain(&fast, "t"), 4);
        assert_eq!(drain(&slow.inner, "g"), 4);
    }
}

/// A slow limiter that fails: closed, the request is answered 503 and the first policy's
/// permit given back; open, it goes through and that permit is spent, once.
#[test]
fn a_failing_limiter_gives_back_or_spends_exactly_once() {
    for (mode, status, left) in [
        (FailMode::Closed, StatusCode::SERVICE_UNAVAILABLE, 5),
        (FailMode::Open, StatusCode::OK, 4),
    ] {
        for slow_first in [false, true] {
            let clock = ManualClock::new();
            let fast = keyed(Quota::per_minute(5).unwrap(), &clock);
            let slow = slow_per_minute(&clock, 2, true);
            let fast_policy = Policy::new("fast", header_key("x-tenant"), fast.clone()).unwrap();
            let slow_policy = Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap();
            let inner = Inner::default();
            let response = if slow_first {
                let layer =
                    RateLimitLayer::new(slow_policy.and(fast_policy)).limiter_error_mode(mode);
                let mut service = layer.layer(inner.clone());
                block_on(service.call(req("200"))).unwrap()
            } else {
                let layer =
                    RateLimitLayer::new(fast_policy.and(slow_policy)).limiter_error_mode(mode);
                let mut service = layer.layer(inner.clone());
                block_on(service.call(req("200"))).unwrap()
            };
            assert_eq!(
                response.status(),
                status,
                "{mode:?}, slow first {slow_first}"
            );
            assert_eq!(
                inner.calls.load(Ordering::SeqCst),
                usize::from(status == StatusCode::OK)
            );
            assert_eq!(drain(&fast, "t"), left, "{mode:?}, slow first {slow_first}");
            assert_eq!(drain(&slow.inner, "g"), 5);
        }
    }
}

/// A waiting reservation (the Wait state) dropped before its first poll, or half-way through
/// its sleep: the reservation is given back, so the next caller gets the very same slot. Driven
/// to the end, the inner service runs exactly when the slot falls due.
#[tokio::test(start_paused = true)]
async fn dropped_during_the_wait_gives_the_slot_back() {
    for (polls, sleep_ms) in [(0u64, 0u64), (1, 0), (1, 300), (3, 999)] {
        for headers in [false, true] {
            let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(5));
            let limiter = tokio_keyed::<String>(quota);
            let layer = RateLimitLayer::new(
                Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap(),
            );
            let layer = with_admitted_headers(layer, headers);
            let inner = Inner::default();
            let mut service = layer.layer(inner.clone());
            let first = ready_then_call(&mut service).await;
            assert_eq!(first.status(), StatusCode::OK);
            let start = tokio::time::Instant::now();
            let mut waiting = Box::pin(service.ready().await.unwrap().call(req("200")));
            let debug = debug_state(&waiting);
            assert!(
                debug.contains("waiting") && debug.contains("permits_held: 1"),
                "{debug}"
            );
            for _ in 0..polls {
                tokio::time::advance(Duration::from_millis(sleep_ms / polls.max(1))).await;
                assert!(poll_once(waiting.as_mut()).is_pending());
                assert!(debug_state(&waiting).contains("waiting"));
            }
            let elapsed = start.elapsed();
            drop(waiting);
            assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
            // The slot at start + 1 s is free again: a new reservation waits exactly until it.
            let again = limiter.reserve_now(&"t".to_string(), 1).unwrap().unwrap();
            assert!(again.allowed);
            assert_eq!(
                again.wait,
                Duration::from_secs(1) - elapsed,
                "polls {polls}, headers {headers}"
            );
            limiter.refund(&"t".to_string(), 1, again);
            // Driven to the end, the next waiter is called when its slot falls due.
            let response = ready_then_call(&mut service).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers().contains_key("ratelimit"), headers);
            assert_eq!(start.elapsed(), Duration::from_secs(1), "polls {polls}");
            assert_eq!(inner.calls.load(Ordering::SeqCst), 2);
            // Now start + 2 s is the next slot.
            let next = limiter.reserve_now(&"t".to_string(), 1).unwrap().unwrap();
            assert_eq!(next.wait, Duration::from_secs(1));
            tokio::time::advance(Duration::from_secs(10)).await;
        }
    }
}

/// A slow limiter that grants a waiting reservation: the future goes Reserve -> Wait; dropped in
/// the Wait state, both policies' permits are given back (the slow one's slot is free again).
#[tokio::test(start_paused = true)]
async fn dropped_in_a_wait_reached_through_a_pending_limiter_gives_both_back() {
    let clock = ManualClock::new();
    let waiting_quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(3));
    let slow = Slow::new(keyed(waiting_quota, &clock), 2, false);
    assert!(slow.inner.check(&"g".to_string()).allowed);
    let (fast, inner, mut service) = fast_then_slow(&clock, &slow, true);
    let mut future = Box::pin(service.call(req("200")));
    let mut states = Vec::new();
    for _ in 0..4 {
        assert!(poll_once(future.as_mut()).is_pending());
        states.push(debug_state(&future));
    }
    assert!(states.last().unwrap().contains("waiting"), "{states:?}");
    assert!(
        states.last().unwrap().contains("permits_held: 2"),
        "{states:?}"
    );
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(poll_once(future.as_mut()).is_pending());
    drop(future);
    assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
    assert_eq!(drain(&fast, "t"), 5);
    // The slow limiter's key is back to one spent permit: a reservation waits one interval.
    let again = slow
        .inner
        .reserve_now(&"g".to_string(), 1)
        .unwrap()
        .unwrap();
    assert_eq!(again.wait, Duration::from_secs(1));
}

/// The inner service panics (inside its future) or fails: the request reached it, so its permit
/// is spent, exactly once, on every path (fast path, headers, two policies, `count_if` whose
/// predicate would not count the response), and the future's Debug still works afterwards.
#[test]
fn an_inner_panic_or_error_spends_the_permit_exactly_once() {
    for answer in ["panic", "error"] {
        for shape in 0..4 {
            let clock = ManualClock::new();
            let limiter = keyed(Quota::per_minute(5).unwrap(), &clock);
            let other = keyed(Quota::per_minute(5).unwrap(), &clock);
            let inner = Inner::default();
            let one = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
            let mut future: Pin<Box<dyn FutureDebug>> = match shape {
                0 => Box::pin(IsErr(
                    RateLimitLayer::new(one)
                        .without_admitted_headers()
                        .layer(inner.clone())
                        .call(req(answer)),
                )),
                1 => Box::pin(IsErr(
                    RateLimitLayer::new(one)
                        .layer(inner.clone())
                        .call(req(answer)),
                )),
                2 => Box::pin(IsErr(
                    RateLimitLayer::new(
                        one.and(Policy::new("gate", header_key("x-gate"), other.clone()).unwrap()),
                    )
                    .layer(inner.clone())
                    .call(req(answer)),
                )),
                _ => Box::pin(IsErr(
                    RateLimitLayer::new(one.count_if(|parts| parts.status.is_server_error()))
                        .without_admitted_headers()
                        .layer(inner.clone())
                        .call(req(answer)),
                )),
            };
            let debug = future.debug();
            assert!(debug.contains("calling"), "{debug}");
            if shape == 3 {
                assert!(debug.contains("settles_after_response: true"), "{debug}");
            }
            assert!(poll_once(future.as_mut()).is_pending());
            let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut())));
            match answer {
                "panic" => assert!(outcome.is_err(), "shape {shape}: the panic goes through"),
                _ => assert!(
                    matches!(outcome, Ok(Poll::Ready(true))),
                    "shape {shape}: the error goes through"
                ),
            }
            let _ = future.debug();
            drop(future);
            assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
            assert_eq!(drain(&limiter, "t"), 4, "{answer}, shape {shape}");
            if shape == 2 {
                assert_eq!(drain(&other, "g"), 4);
            }
        }
    }
}

/// A future over a `Result` that is `Debug` too, so different response futures fit one box;
/// its output says whether the result was an error.
trait FutureDebug: Future<Output = bool> {
    fn debug(&self) -> String;
}

struct IsErr<F>(F);

impl<F, T, E> Future for IsErr<F>
where
    F: Future<Output = Result<T, E>> + Unpin,
{
    type Output = bool;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        Pin::new(&mut self.0).poll(cx).map(|r| r.is_err())
    }
}

impl<F, T, E> FutureDebug for IsErr<F>
where
    F: Future<Output = Result<T, E>> + Unpin + std::fmt::Debug,
{
    fn debug(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// `count_if` on each path: a response that does not count gives its permit back exactly once
/// (the budget is whole, not more than whole), one that counts keeps it spent; a future dropped
/// after the inner service was called but before the response keeps it spent.
#[test]
fn count_if_settles_exactly_once() {
    for headers in [false, true] {
        for (answer, left) in [("200", 5u64), ("500", 4), ("drop", 4)] {
            let clock = ManualClock::new();
            let limiter = keyed(Quota::per_minute(5).unwrap(), &clock);
            let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone())
                .unwrap()
                .count_if(|parts| parts.status.is_server_error());
            let layer = RateLimitLayer::new(policy);
            let layer = with_admitted_headers(layer, headers);
            let inner = Inner::default();
            let mut service = layer.layer(inner.clone());
            let mut future =
                Box::pin(service.call(req(if answer == "drop" { "200" } else { answer })));
            let debug = debug_state(&future);
            assert!(debug.contains("settles_after_response: true"), "{debug}");
            if answer == "drop" {
                assert!(poll_once(future.as_mut()).is_pending());
                drop(future);
            } else {
                let response = block_on(future.as_mut()).unwrap();
                assert_eq!(response.status().as_u16(), answer.parse::<u16>().unwrap());
                assert_eq!(response.headers().contains_key("ratelimit"), headers);
                if headers && answer == "200" {
                    // The client is told the permit is back.
                    let value = response.headers()["ratelimit"].to_str().unwrap();
                    assert!(value.contains("r=5;"), "{value}");
                }
                let _ = debug_state(&future);
            }
            assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
            assert_eq!(drain(&limiter, "t"), left, "headers {headers}, {answer}");
        }
    }
}

/// Refusals and the Debug of the Answer state: a refused request never reaches the inner
/// service, spends nothing more, and its future's Debug works before and after completion.
#[test]
fn answered_futures_spend_nothing_and_debug_in_every_state() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_minute(1).unwrap(), &clock);
    let inner = Inner::default();
    let layer = RateLimitLayer::new(
        Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap(),
    )
    .without_admitted_headers();
    let mut service = layer.layer(inner.clone());
    let mut admitted = Box::pin(service.call(req("200")));
    let debug = debug_state(&admitted);
    assert!(
        debug.contains("calling") && debug.contains("settles_after_response: false"),
        "{debug}"
    );
    let mut refused = Box::pin(service.call(req("200")));
    let debug = debug_state(&refused);
    assert!(
        debug.contains("answering") && debug.contains("permits_held: 0"),
        "{debug}"
    );
    let response = block_on(refused.as_mut()).unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(debug_state(&refused).contains("answering"));
    let response = block_on(admitted.as_mut()).unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let _ = debug_state(&admitted);
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(60));
    assert_eq!(drain(&limiter, "t"), 1);
    // Futures of the fast path dropped before their first poll: the request was handed to
    // the inner service in `call`, so each admitted one is spent, once; refusals spend nothing.
    let limiter = keyed(Quota::per_minute(5).unwrap(), &clock);
    let inner = Inner::default();
    let mut service = RateLimitLayer::new(
        Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap(),
    )
    .without_admitted_headers()
    .layer(inner.clone());
    for _ in 0..7 {
        drop(service.call(req("200")));
    }
    assert_eq!(inner.calls.load(Ordering::SeqCst), 5);
    assert_eq!(drain(&limiter, "t"), 0);
}

/// A panic while deciding the rest of a request, after a pending limiter admitted it (a key
/// extractor or a cost function of the next policy): the future keeps what it holds (its
/// Debug says so) and, dropped, gives the admission back exactly once.
#[test]
fn a_panic_deciding_after_a_pending_limiter_gives_back() {
    for panicking_cost in [false, true] {
        let clock = ManualClock::new();
        let slow = slow_per_minute(&clock, 2, false);
        let other = keyed(Quota::per_minute(5).unwrap(), &clock);
        let boom = move |head: &RequestHead<'_>| -> Result<String, KeyError> {
            if !panicking_cost && head.headers.contains_key("x-boom") {
                panic!("the key extractor panicked");
            }
            Ok("o".to_string())
        };
        let next = Policy::new("other", boom, other.clone()).unwrap().cost_by(
            move |head: &RequestHead<'_>| {
                if panicking_cost && head.headers.contains_key("x-boom") {
                    panic!("the cost function panicked");
                }
                1
            },
        );
        let policies = Policy::new("slow", header_key("x-gate"), slow.clone())
            .unwrap()
            .and(next);
        let inner = Inner::default();
        let mut service = RateLimitLayer::new(policies).layer(inner.clone());
        let mut request = req("200");
        request.headers_mut().insert("x-boom", "1".parse().unwrap());
        let mut future = Box::pin(service.call(request));
        assert!(poll_once(future.as_mut()).is_pending());
        let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut())));
        assert!(outcome.is_err(), "the panic goes through");
        let debug = debug_state(&future);
        assert!(debug.contains("permits_held: 1"), "{debug}");
        drop(future);
        assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
        assert_eq!(drain(&slow.inner, "g"), 5, "cost panics {panicking_cost}");
        assert_eq!(drain(&other, "o"), 5);
    }
}

/// An inner service whose `call` itself panics: the request was handed over, so on every path
/// (the fast path, headers on, two policies, a policy that decides later, `count_if`) its
/// permits are spent exactly once (never given back, never charged twice), and a future left
/// behind by the panic still shows its Debug and drops cleanly.
#[test]
fn an_inner_call_that_panics_spends_exactly_once() {
    for shape in 0..5 {
        let clock = ManualClock::new();
        let limiter = keyed(Quota::per_minute(5).unwrap(), &clock);
        let slow = slow_per_minute(&clock, 2, false);
        let inner = Inner::default();
        let one = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
        let called = catch_unwind(AssertUnwindSafe(|| -> Option<Pin<Box<dyn FutureDebug>>> {
            match shape {
                0 => {
                    let mut s = RateLimitLayer::new(one)
                        .without_admitted_headers()
                        .layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
                1 => {
                    let mut s = RateLimitLayer::new(one).layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
                2 => {
                    let mut s = RateLimitLayer::new(one.count_if(|p| p.status.is_server_error()))
                        .layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
                3 => {
                    let two =
                        one.and(Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap());
                    let mut s = RateLimitLayer::new(two).layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
                _ => {
                    let two = one
                        .count_if(|p| p.status.is_server_error())
                        .and(Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap());
                    let mut s = RateLimitLayer::new(two)
                        .without_admitted_headers()
                        .layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
            }
        }));
        match called {
            // Decided in `call`: the panic came out of it.
            Err(_) => assert!(shape < 3, "shape {shape}"),
            Ok(future) => {
                assert!(
                    shape >= 3,
                    "shape {shape}: the inner call did not panic in `call`"
                );
                let mut future = future.unwrap();
                assert!(poll_once(future.as_mut()).is_pending());
                let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut())));
                assert!(outcome.is_err(), "shape {shape}: the panic goes through");
                let debug = future.debug();
                assert!(debug.contains("permits_held: 0"), "{debug}");
                drop(future);
                assert_eq!(drain(&slow.inner, "g"), 4, "shape {shape}");
            }
        }
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
        assert_eq!(drain(&limiter, "t"), 4, "shape {shape}");
    }
}
