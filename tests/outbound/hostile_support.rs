//! What the attacks on the outbound layers share: a `Pushback` on a `ManualClock`, a dependency
//! whose answers a test sends in the order it chooses, calls started and polled by hand, the
//! time a refused call is told, and a dependency that echoes its call.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Response;
use tokio::sync::oneshot;
use tower::Layer;
use tower::{service_fn, Service, ServiceExt};
use tower_bulwark::clock::Clock;
use tower_bulwark::outbound::pushback::{Pacing, PushbackBuilder};
use tower_bulwark::outbound::{self, Pushback, PushedBack};
use tower_bulwark::{
    clock::{ManualClock, TokioClock},
    BoxError,
};

/// A `Pushback` for "partner" on a `ManualClock`, and the clock.
pub(crate) fn manual() -> (Pushback<ManualClock>, ManualClock) {
    on_manual_clock(Pushback::builder("partner"))
}

/// [`manual`] pacing the calls a window grants by `pacing`.
pub(crate) fn manual_with(pacing: Pacing) -> (Pushback<ManualClock>, ManualClock) {
    on_manual_clock(Pushback::builder("partner").pacing(pacing))
}

/// `builder` built on a new `ManualClock`, and the clock.
pub(crate) fn on_manual_clock(builder: PushbackBuilder) -> (Pushback<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (builder.clock(clock.clone()).build(), clock)
}

/// A `Pushback` for "partner" on tokio's clock, `configure`d further.
pub(crate) fn on_tokio_clock_with(
    configure: impl FnOnce(PushbackBuilder<TokioClock>) -> PushbackBuilder<TokioClock>,
) -> Pushback<TokioClock> {
    configure(Pushback::builder("partner").clock(TokioClock::new())).build()
}

/// A `Pushback` for "partner" on tokio's clock, with the default settings.
pub(crate) fn on_tokio_clock() -> Pushback<TokioClock> {
    on_tokio_clock_with(std::convert::identity)
}

/// A `Pushback` for "partner" on tokio's clock whose calls wait up to `max_wait` for a hold to
/// end.
pub(crate) fn tokio_waiting_up_to(max_wait: Duration) -> Pushback<TokioClock> {
    on_tokio_clock_with(|builder| builder.max_wait(max_wait))
}

/// A dependency that answers each call with the response sent on the call's own channel, so
/// that a test chooses the order in which answers arrive. Counts the calls that reach it.
pub(crate) fn scripted(
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

/// A client through `pushback` to a [`scripted`] dependency, and the count of the calls that
/// reach the dependency.
pub(crate) fn scripted_client<C: Clock + Clone>(
    pushback: &Pushback<C>,
) -> (
    impl Service<
            oneshot::Receiver<Response<()>>,
            Response = Response<()>,
            Error = BoxError,
            Future: Send,
        > + Clone,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    (pushback.layer().layer(scripted(calls.clone())), calls)
}

/// Starts a call through `client` and polls it once so that it is at the dependency.
pub(crate) async fn start<S>(
    client: &S,
) -> (
    oneshot::Sender<Response<()>>,
    Pin<Box<impl Future<Output = Result<Response<()>, BoxError>>>>,
)
where
    S: Service<oneshot::Receiver<Response<()>>, Response = Response<()>, Error = BoxError> + Clone,
{
    let (tx, rx) = oneshot::channel();
    let mut call = Box::pin(client.clone().oneshot(rx));
    assert!(futures::poll!(&mut call).is_pending());
    (tx, call)
}

/// Answers a call [`start`]ed, `(tx, call)`, with `answer`, and waits for what the client
/// returns.
pub(crate) async fn answer_call<F>(
    (tx, call): (oneshot::Sender<Response<()>>, F),
    answer: Response<()>,
) -> Response<()>
where
    F: Future<Output = Result<Response<()>, BoxError>>,
{
    tx.send(answer).unwrap();
    call.await.unwrap()
}

/// A 200 whose `RateLimit` field says nothing is left for a second, under the
/// `RateLimit-Policy` `policy` for the windows after.
pub(crate) fn spent_for_a_second_under(policy: &str) -> Response<()> {
    crate::common::response(
        200,
        &[
            ("ratelimit-policy", policy),
            ("ratelimit", r#""p";r=0;t=1"#),
        ],
    )
}

/// Starts two calls through `client` and answers them out of order: the newer first, with
/// `newer`, then the older, with `older`.
pub(crate) async fn answer_out_of_order<S>(client: &S, newer: Response<()>, older: Response<()>)
where
    S: Service<oneshot::Receiver<Response<()>>, Response = Response<()>, Error = BoxError> + Clone,
{
    let older_call = start(client).await;
    let newer_call = start(client).await;
    answer_call(newer_call, newer).await;
    answer_call(older_call, older).await;
}

pub(crate) fn is_pushed_back(result: Result<Response<()>, BoxError>) -> Option<Duration> {
    let err = result.err()?;
    assert!(err.is::<PushedBack>(), "{err}");
    outbound::retry_after(&*err)
}

/// A new call through `client`, which must be refused at once: the time it is told to wait.
pub(crate) fn refused<S>(client: &S) -> Duration
where
    S: Service<oneshot::Receiver<Response<()>>, Response = Response<()>, Error = BoxError> + Clone,
{
    let (_tx, rx) = oneshot::channel();
    match client.clone().oneshot(rx).now_or_never_pending() {
        Some(result) => is_pushed_back(result).expect("refused"),
        None => panic!("the call reached the dependency"),
    }
}

/// Polls a future once: its output if it is ready, `None` if it is pending (a call that reached
/// the dependency).
pub(crate) trait NowOrNever: Future + Sized {
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

pub(crate) fn echo(
    calls: Arc<AtomicUsize>,
) -> impl Service<u32, Response = u32, Error = BoxError, Future: Send> + Clone {
    service_fn(move |n: u32| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(n) }
    })
}
