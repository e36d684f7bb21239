//! A service whose requests wait at a gate the test opens, counting the requests that reach it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use tokio::sync::{mpsc, Semaphore};
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::adaptive::{LimitAlgorithm, Limits};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::overload::{Overload, OverloadBuilder, Priority};

pub type Svc = BoxCloneService<http::Request<Body>, http::Response<Body>, std::convert::Infallible>;

/// The inner service: each request reports its class on `entered`, counts itself in `reached`
/// and waits for a permit of `gate`.
#[derive(Clone)]
pub struct Gated {
    pub gate: Arc<Semaphore>,
    pub reached: Arc<AtomicUsize>,
    pub entered: Arc<mpsc::UnboundedSender<Priority>>,
}

/// A protection of a fixed `limit` whose classes come from `x-priority`, on a manual clock,
/// without guarantees, and with `Critical` held at the limit (no borrowing).
pub fn fixed(limit: usize) -> OverloadBuilder {
    let no_guarantees = |builder: OverloadBuilder| {
        let builder = builder.guarantee(Priority::Critical, 0.0).unwrap();
        let builder = builder.guarantee(Priority::Default, 0.0).unwrap();
        builder.critical_borrowing(1.0).unwrap()
    };
    no_guarantees(Overload::builder("api"))
        .limits(Limits::new(limit, limit, limit).unwrap())
        .clock(ManualClock::new())
        .priority_by(|head| {
            let value = head.headers.get("x-priority").and_then(|v| v.to_str().ok());
            value.map_or(Priority::Default, Priority::from_header_value)
        })
}

/// `builder` with its limit moving between `min` and `max`, from `initial`, under `algorithm`,
/// on a manual clock that the test moves: the builder and the clock.
pub fn moving_limit(
    builder: OverloadBuilder,
    (min, initial, max): (usize, usize, usize),
    algorithm: impl LimitAlgorithm,
) -> (OverloadBuilder, ManualClock) {
    let clock = ManualClock::new();
    let builder = builder
        .limits(Limits::new(min, initial, max).unwrap())
        .algorithm(algorithm)
        .clock(clock.clone());
    (builder, clock)
}

/// A service whose calls alternate: each answers `answer(odd, request)`, `odd` being true for the
/// second call, the fourth and so on; and the count of the calls that reached it.
pub fn alternating<F, Fut, R, E>(
    answer: F,
) -> (
    Arc<AtomicUsize>,
    impl Service<http::Request<Body>, Response = R, Error = E, Future = Fut> + Clone,
)
where
    F: Fn(bool, http::Request<Body>) -> Fut + Clone,
    Fut: Future<Output = Result<R, E>>,
{
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let service = tower::service_fn(move |request| {
        answer(counted.fetch_add(1, Ordering::SeqCst) % 2 == 1, request)
    });
    (calls, service)
}

/// `overload` in front of a gated service; the receiver hears of each request that reached it.
pub fn gated(overload: &Overload) -> (Svc, Gated, mpsc::UnboundedReceiver<Priority>) {
    let (sender, entered) = mpsc::unbounded_channel();
    let gated = Gated {
        gate: Arc::new(Semaphore::new(0)),
        reached: Arc::new(AtomicUsize::new(0)),
        entered: Arc::new(sender),
    };
    let state = gated.clone();
    let inner = tower::service_fn(move |request: http::Request<Body>| {
        let state = state.clone();
        async move {
            state.reached.fetch_add(1, Ordering::SeqCst);
            let class = request
                .headers()
                .get("x-priority")
                .and_then(|v| v.to_str().ok());
            let _ = state
                .entered
                .send(class.map_or(Priority::Default, Priority::from_header_value));
            state.gate.acquire().await.unwrap().forget();
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("done")))
        }
    });
    let service = overload
        .layer()
        .layer(inner)
        .map_response(|r| r.map(Body::new));
    (BoxCloneService::new(service), gated, entered)
}

/// A request of `class`.
pub fn request(class: Priority) -> http::Request<Body> {
    let name = match class {
        Priority::Critical => "critical",
        Priority::Default => "default",
        Priority::Sheddable => "sheddable",
    };
    http::Request::get("/work")
        .header("x-priority", name)
        .body(Body::empty())
        .unwrap()
}

/// The response `service` answers a request of `class` with.
pub async fn answer_to<S, B>(service: &S, class: Priority) -> http::Response<B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    service.clone().oneshot(request(class)).await.unwrap()
}

/// The body, unread, of the response `service` answers a request of the default class with.
pub async fn body_of_a_default_request<S, B>(service: &S) -> B
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    answer_to(service, Priority::Default).await.into_body()
}

/// A request of `class` sent through `service` and polled once, still waiting (queued): the
/// test fails if it was answered.
pub fn queued(
    service: &Svc,
    class: Priority,
) -> std::pin::Pin<Box<tower::util::Oneshot<Svc, http::Request<Body>>>> {
    use futures::FutureExt;
    let mut waiting = Box::pin(service.clone().oneshot(request(class)));
    assert!((&mut waiting).now_or_never().is_none(), "answered at once");
    waiting
}

/// A request inside a [`gated`] service, which the test lets out.
pub type Inside = tokio::task::JoinHandle<Result<http::Response<Body>, std::convert::Infallible>>;

/// Sends a request of `class` through `service` (in front of a [`gated`] one) and waits until
/// `entered` hears that it reached the gate: the request, held inside until the test lets it
/// out.
pub async fn held_inside(
    service: &Svc,
    entered: &mut mpsc::UnboundedReceiver<Priority>,
    class: Priority,
) -> Inside {
    let inside = tokio::spawn(service.clone().oneshot(request(class)));
    entered.recv().await.unwrap();
    inside
}

/// A protection of limit 1 with a queue of `capacity` waiting up to `max_wait`, in front of a
/// [`gated`] service with one request of `class` already inside it: the next request finds the
/// limit reached.
pub async fn one_inside(
    capacity: usize,
    max_wait: std::time::Duration,
    class: Priority,
) -> (
    Overload,
    Svc,
    Gated,
    mpsc::UnboundedReceiver<Priority>,
    Inside,
) {
    let overload = fixed(1).queue(capacity, max_wait).unwrap().build();
    let (service, gated, mut entered) = gated(&overload);
    let inside = held_inside(&service, &mut entered, class).await;
    (overload, service, gated, entered, inside)
}

/// A request of `class` called on a clone of `service` once it is ready (admitted, queued or
/// shed in `call`), its future not polled yet.
pub async fn called(
    service: &Svc,
    class: Priority,
) -> <Svc as Service<http::Request<Body>>>::Future {
    let mut caller = service.clone();
    caller.ready().await.unwrap();
    caller.call(request(class))
}
