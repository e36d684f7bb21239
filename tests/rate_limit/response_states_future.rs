//! The HTTP layer's response future, driven by hand through every state: deferred reservations,
//! waits and calls with headers settled after `count_if`, and a poll after completion that panics
//! with the documented message (or the inner future's own) while Debug works in every state.

use crate::common::{block_on, poll_once, waits_up_to};
use crate::support::{keyed, Slow};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
use tower_bulwark::{Limiter, Quota};

use super::response_states_support::*;

// ---------------------------------------------------------------------------------------------
// The response future, driven by hand through every state
// ---------------------------------------------------------------------------------------------

/// An inner service whose futures are `std::future::Ready` (polled again after completion they
/// panic with std's own message), answering the status of `x-answer`, counting its calls.
#[derive(Clone, Default)]
struct ReadyInner {
    calls: Arc<AtomicUsize>,
}

impl Service<Request<Body>> for ReadyInner {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Response<Body>, std::convert::Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let status = request
            .headers()
            .get("x-answer")
            .map_or(200, |v| v.to_str().unwrap().parse().unwrap());
        std::future::ready(Ok(Response::builder()
            .status(status)
            .body(Body::empty())
            .unwrap()))
    }
}

const READY_AGAIN: &str = "`Ready` polled after completion";
const DOCUMENTED: &str = "ResponseFuture polled after completion";

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "<not a string>".into())
}

/// Polls a completed future once more: it must panic with exactly `expected`, and its Debug
/// must still work afterwards.
fn assert_poll_again_panics<F: Future + std::fmt::Debug>(mut future: Pin<&mut F>, expected: &str) {
    let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut()).is_ready()));
    match outcome {
        Ok(ready) => panic!("polled after completion, it did not panic (ready: {ready})"),
        Err(panic) => assert_eq!(panic_message(panic), expected),
    }
    let debug = format!("{future:?}");
    assert!(debug.starts_with("ResponseFuture"), "{debug}");
}

fn two_header_request(answer: u16) -> Request<Body> {
    Request::get("/r")
        .header("x-k0", "a")
        .header("x-k1", "a")
        .header("x-answer", answer.to_string())
        .body(Body::empty())
        .unwrap()
}

/// A limiter that decides later, then a policy that counts only server errors: the future goes
/// reserving -> waiting -> calling, never calls the inner service before the permit falls due,
/// then adds headers that describe the state after the `count_if` settled (the permit back for a
/// 200, spent for a 500), and spends exactly that. Without a wait, reserving -> calling with the
/// headers. Polled again after completion, it panics with the inner future's own message, and
/// its Debug works in every state.
#[tokio::test(start_paused = true)]
async fn deferred_reserve_wait_call_adds_headers_and_settles_after_the_wait() {
    for (answer, prespent) in [(200u16, true), (500, true), (200, false), (500, false)] {
        let clock = ManualClock::new();
        let slow_quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(2));
        let slow = keyed(slow_quota, &clock);
        let fast = keyed(Quota::per_minute(5).unwrap(), &clock);
        let a = HeaderValue::from_static("a");
        if prespent {
            assert!(slow.check(&a).allowed);
        }
        let policies = Policy::new(
            "slow",
            HeaderKey::new("x-k0").unwrap(),
            Slow::new(slow.clone(), 2, false),
        )
        .unwrap()
        .and(
            Policy::new("fast", HeaderKey::new("x-k1").unwrap(), fast.clone())
                .unwrap()
                .count_if(|parts| parts.status.is_server_error()),
        );
        let inner = ReadyInner::default();
        let mut service = RateLimitLayer::new(policies).layer(inner.clone());
        let ctx = format!("answer {answer}, prespent {prespent}");
        let mut future = Box::pin(service.call(two_header_request(answer)));
        let debug = format!("{future:?}");
        assert!(
            debug.contains("\"reserving\"") && debug.contains("permits_held: 0"),
            "{ctx}: {debug}"
        );
        assert!(poll_once(future.as_mut()).is_pending(), "{ctx}");
        assert!(format!("{future:?}").contains("\"reserving\""), "{ctx}");
        let response = if prespent {
            assert!(poll_once(future.as_mut()).is_pending(), "{ctx}");
            let debug = format!("{future:?}");
            assert!(
                debug.contains("\"waiting\"") && debug.contains("permits_held: 2"),
                "{ctx}: {debug}"
            );
            tokio::time::advance(Duration::from_millis(999)).await;
            assert!(poll_once(future.as_mut()).is_pending(), "{ctx}");
            assert_eq!(
                inner.calls.load(Ordering::SeqCst),
                0,
                "{ctx}: called before the wait ended"
            );
            tokio::time::advance(Duration::from_millis(1)).await;
            match poll_once(future.as_mut()) {
                Poll::Ready(response) => response.unwrap(),
                Poll::Pending => panic!("{ctx}: not ready when the permit fell due"),
            }
        } else {
            match poll_once(future.as_mut()) {
                Poll::Ready(response) => response.unwrap(),
                Poll::Pending => panic!("{ctx}: not ready once both policies admitted"),
            }
        };
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1, "{ctx}");
        assert_eq!(response.status().as_u16(), answer, "{ctx}");
        let fast_left = if answer == 500 { 4 } else { 5 };
        // The slow key's one permit is spent either way (and its headers say so).
        let slow_left = 0;
        assert_eq!(
            header_text(response.headers(), "ratelimit-policy").as_deref(),
            Some("\"slow\";q=1;w=1, \"fast\";q=5;w=60"),
            "{ctx}"
        );
        let ratelimit = header_text(response.headers(), "ratelimit").unwrap();
        assert_eq!(
            items(&ratelimit),
            vec![
                ("slow".to_owned(), slow_left),
                ("fast".to_owned(), fast_left)
            ],
            "{ctx}: {ratelimit}"
        );
        let debug = format!("{future:?}");
        assert!(
            debug.contains("\"calling\"") && debug.contains("settles_after_response: false"),
            "{ctx}: {debug}"
        );
        assert_poll_again_panics(future.as_mut(), READY_AGAIN);
        drop(future);
        // Exactly what the headers said is left.
        assert_eq!(peek(&fast, "a").1, fast_left - 1, "{ctx}");
        let next = slow.reserve_now(&a, 1).unwrap().unwrap();
        assert_eq!(
            next.wait,
            Duration::from_secs(if prespent { 2 } else { 1 }),
            "{ctx}"
        );
    }
}

/// Every way a future completes, polled once more: the layer's own answers (a refusal decided
/// in `call`, one decided after a deferred reservation, a key error) panic with the documented
/// message; the inner service's answers (untouched, with headers, settled) pass the inner
/// future's own panic through. Debug works before, after, and after the panic.
#[tokio::test(start_paused = true)]
async fn poll_after_completion_panics_with_the_documented_message_only() {
    let clock = ManualClock::new();
    let key0 = || HeaderKey::new("x-k0").unwrap();
    let a = HeaderValue::from_static("a");
    // (layer shape, expected status, expected message)
    for shape in 0..7 {
        let limiter = keyed(Quota::per_hour(1).unwrap(), &clock);
        let inner = ReadyInner::default();
        let one = || Policy::new("one", key0(), limiter.clone()).unwrap();
        let slow = || Policy::new("slow", key0(), Slow::new(limiter.clone(), 1, false)).unwrap();
        let request = if shape == 4 {
            Request::get("/r").body(Body::empty()).unwrap()
        } else {
            two_header_request(200)
        };
        // Shapes 1, 3 and 5 find the key spent: refusals.
        if matches!(shape, 1 | 3 | 5) {
            assert!(limiter.check(&a).allowed);
        }
        type Boxed =
            Pin<Box<dyn FutureDebugOut<Output = Result<Response<Body>, std::convert::Infallible>>>>;
        let mut future: Boxed = match shape {
            // Untouched: one policy without headers.
            0 => Box::pin(
                RateLimitLayer::new(one())
                    .without_admitted_headers()
                    .layer(inner.clone())
                    .call(request),
            ),
            // A refusal decided in `call`.
            1 => Box::pin(
                RateLimitLayer::new(one())
                    .layer(inner.clone())
                    .call(request),
            ),
            // With headers.
            2 => Box::pin(
                RateLimitLayer::new(one())
                    .layer(inner.clone())
                    .call(request),
            ),
            // A refusal after a deferred reservation.
            3 => Box::pin(
                RateLimitLayer::new(slow())
                    .layer(inner.clone())
                    .call(request),
            ),
            // A key error.
            4 => Box::pin(
                RateLimitLayer::new(one())
                    .layer(inner.clone())
                    .call(request),
            ),
            // A refusal by the second of two policies.
            5 => Box::pin(
                RateLimitLayer::new(
                    Policy::new("free", key0(), keyed(Quota::per_hour(100).unwrap(), &clock))
                        .unwrap()
                        .and(one()),
                )
                .layer(inner.clone())
                .call(request),
            ),
            // Settled by `count_if`.
            _ => Box::pin(
                RateLimitLayer::new(one().count_if(|p| p.status.is_server_error()))
                    .layer(inner.clone())
                    .call(request),
            ),
        };
        let (status, message) = match shape {
            0 | 2 | 6 => (StatusCode::OK, READY_AGAIN),
            4 => (StatusCode::BAD_REQUEST, DOCUMENTED),
            _ => (StatusCode::TOO_MANY_REQUESTS, DOCUMENTED),
        };
        let _ = format!("{future:?}");
        let response = block_on(future.as_mut()).unwrap();
        assert_eq!(response.status(), status, "shape {shape}");
        let debug = format!("{future:?}");
        let state = if status == StatusCode::OK {
            "\"calling\""
        } else {
            "\"answering\""
        };
        assert!(debug.contains(state), "shape {shape}: {debug}");
        let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut()).is_ready()));
        match outcome {
            Ok(ready) => panic!("shape {shape}: polled again, no panic (ready: {ready})"),
            Err(panic) => assert_eq!(panic_message(panic), message, "shape {shape}"),
        }
        assert_eq!(format!("{future:?}"), debug, "shape {shape}");
        // And once more: still the same panic, nothing worse.
        let again = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut()).is_ready()));
        assert_eq!(panic_message(again.unwrap_err()), message, "shape {shape}");
        drop(future);
        assert_eq!(
            inner.calls.load(Ordering::SeqCst),
            usize::from(status == StatusCode::OK),
            "shape {shape}"
        );
    }
}

/// A future that is `Debug` too, so the different response futures fit one box.
trait FutureDebugOut: Future + std::fmt::Debug {}

impl<F: Future + std::fmt::Debug> FutureDebugOut for F {}
