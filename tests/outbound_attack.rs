//! Attacks on the outbound layers from what their docs promise: answers that arrive out of
//! order, pacing that a newer answer loosens, `held_for` against what a call meets, hostile
//! header values, calls in flight ended every way, and client quotas under races, drops and
//! tower's wrappers. Time is a `ManualClock` or tokio's paused timer; no test sleeps to pass.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::{Response, StatusCode};
use tokio::sync::oneshot;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_bulwark::outbound::pushback::{Pacing, DEFAULT_MAX_HOLD};
use tower_bulwark::outbound::{self, ClientQuotaLayer, Pushback, PushedBack, QuotaExhausted};
use tower_bulwark::{
    clock::{ManualClock, TokioClock},
    limiter::InsufficientCapacity,
    BoxError, DirectRateLimiter, Quota,
};

fn response(status: u16, headers: &[(&str, &str)]) -> Response<()> {
    let mut builder = Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap()
}

fn manual() -> (Pushback<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (Pushback::builder("partner").clock(clock.clone()).build(), clock)
}

/// A dependency that answers each call with the response sent on the call's own channel, so
/// that a test chooses the order in which answers arrive. Counts the calls that reach it.
fn scripted(
    calls: Arc<AtomicUsize>,
) -> impl Service<
    oneshot::Receiver<Response<()>>,
    Response = Response<()>,
    Error = BoxError,
    Future: Send,
> + Clone {
    service_fn(move |answer: oneshot::Receiver<Response<()>>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(answer.await?) }
    })
}

/// Starts a call through `client` and polls it once so that it is at the dependency.
async fn start<S>(
    client: &S,
) -> (
    oneshot::Sender<Response<()>>,
    Pin<Box<impl Future<Output = Result<Response<()>, BoxError>>>>,
)
where
    S: Service<oneshot::Receiver<Response<()>>, Response = Response<()>, Error = BoxError>
        + Clone,
{
    let (tx, rx) = oneshot::channel();
    let mut call = Box::pin(client.clone().oneshot(rx));
    assert!(futures::poll!(&mut call).is_pending());
    (tx, call)
}

fn is_pushed_back(result: Result<Response<()>, BoxError>) -> Option<Duration> {
    let err = result.err()?;
    assert!(err.is::<PushedBack>(), "{err}");
    outbound::retry_after(&*err)
}

/// A new call through `client`, which must be refused at once: the time it is told to wait.
fn refused<S>(client: &S) -> Duration
where
    S: Service<oneshot::Receiver<Response<()>>, Response = Response<()>, Error = BoxError>
        + Clone,
{
    let (_tx, rx) = oneshot::channel();
    match client.clone().oneshot(rx).now_or_never_pending() {
        Some(result) => is_pushed_back(result).expect("refused"),
        None => panic!("the call reached the dependency"),
    }
}

// ---------------------------------------------------------------------------------------------
// Answers out of order.

/// A 429 says "nothing left for 60 s" through `RateLimit`; the answer to a call that was on
/// its way before it, and that the server may well have written first, arrives after it and
/// says 5 left. The dependency's newest word must not be loosened by an older one.
#[tokio::test]
async fn an_older_lenient_answer_does_not_lift_an_exhausted_quota() {
    let (pushback, clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (early_tx, early) = start(&client).await;
    let (late_tx, late) = start(&client).await;
    late_tx
        .send(response(429, &[("ratelimit", r#""p";r=0;t=60"#)]))
        .unwrap();
    assert_eq!(late.await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(pushback.held_for(), Duration::from_secs(60));
    early_tx
        .send(response(200, &[("ratelimit", r#""p";r=5;t=60"#)]))
        .unwrap();
    early.await.unwrap();
    assert_eq!(pushback.held_for(), Duration::from_secs(60));
    assert_eq!(refused(&client), Duration::from_secs(60));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    clock.advance(Duration::from_secs(60));
    assert_eq!(pushback.held_for(), Duration::ZERO);
}

/// Both say nothing is left; the older one says for a shorter time. The exhausted window must
/// not be shortened by it.
#[tokio::test]
async fn an_older_answer_does_not_shorten_an_exhausted_window() {
    let (pushback, clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (early_tx, early) = start(&client).await;
    let (late_tx, late) = start(&client).await;
    late_tx
        .send(response(200, &[("ratelimit", r#""p";r=0;t=60"#)]))
        .unwrap();
    late.await.unwrap();
    early_tx
        .send(response(200, &[("ratelimit", r#""p";r=0;t=1"#)]))
        .unwrap();
    early.await.unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(refused(&client), Duration::from_secs(59));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// An older answer that is stricter still counts: out of order, the stricter word wins.
#[tokio::test]
async fn an_older_stricter_answer_still_tightens() {
    let (pushback, _clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (early_tx, early) = start(&client).await;
    let (late_tx, late) = start(&client).await;
    late_tx
        .send(response(200, &[("ratelimit", r#""p";r=50;t=60"#)]))
        .unwrap();
    late.await.unwrap();
    early_tx
        .send(response(200, &[("ratelimit", r#""p";r=0;t=30"#)]))
        .unwrap();
    early.await.unwrap();
    assert_eq!(pushback.held_for(), Duration::from_secs(30));
}

/// In order, a newer answer replaces the older one: a window that reset lets calls go again.
#[tokio::test]
async fn a_newer_answer_still_replaces_an_older_one() {
    let (pushback, _clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (tx, call) = start(&client).await;
    tx.send(response(200, &[("ratelimit", r#""p";r=0;t=60"#)]))
        .unwrap();
    call.await.unwrap();
    assert_eq!(pushback.held_for(), Duration::from_secs(60));
    // An answer obtained elsewhere, after it, says the window has reset.
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=10;t=60"#)]));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    let (tx, call) = start(&client).await;
    tx.send(response(200, &[])).unwrap();
    call.await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Pacing and `held_for`.

/// `Pacing::Spread`: "one every t / r". One call left in 60 s, then its answer says 100 left in
/// 60 s: the next call is due 600 ms later, not 60 s.
#[tokio::test]
async fn spread_follows_a_newer_looser_answer() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner")
        .clock(clock.clone())
        .pacing(Pacing::Spread)
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=1;t=60"#)]));
    let (tx, call) = start(&client).await;
    tx.send(response(200, &[("ratelimit", r#""p";r=100;t=60"#)]))
        .unwrap();
    call.await.unwrap();
    assert!(pushback.held_for() <= Duration::from_millis(600));
    clock.advance(Duration::from_millis(600));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    let (tx, call) = start(&client).await;
    tx.send(response(200, &[])).unwrap();
    call.await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `held_for` is "how long from now until a call may be sent": when it says zero, a call goes.
/// After an exhausted window whose policy grants `q = 1` while one call is still in flight, the
/// next window has nothing left for anyone.
#[tokio::test]
async fn held_for_agrees_with_what_the_next_call_meets() {
    let (pushback, clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (_slow_tx, slow) = start(&client).await;
    let (tx, call) = start(&client).await;
    tx.send(response(
        200,
        &[
            ("ratelimit-policy", r#""p";q=1;w=10"#),
            ("ratelimit", r#""p";r=0;t=1"#),
        ],
    ))
    .unwrap();
    call.await.unwrap();
    clock.advance(Duration::from_secs(1));
    let said = pushback.held_for();
    let (_tx, rx) = oneshot::channel();
    let met = match client.clone().oneshot(rx).now_or_never_pending() {
        Some(result) => is_pushed_back(result).unwrap_or_default(),
        None => Duration::ZERO,
    };
    assert_eq!(said, met, "held_for said {said:?}, the call met {met:?}");
    assert_eq!(met, Duration::from_secs(10));
    drop(slow);
}

/// Polls a future once: its output if it is ready, `None` if it is pending (a call that reached
/// the dependency).
trait NowOrNever: Future + Sized {
    fn now_or_never_pending(self) -> Option<Self::Output> {
        let mut fut = Box::pin(self);
        let waker = futures::task::noop_waker();
        match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        }
    }
}
impl<F: Future> NowOrNever for F {}
