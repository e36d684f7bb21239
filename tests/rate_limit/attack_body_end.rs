//! Attacks on the response bodies a layer follows to their end (`src/body_end.rs`): the
//! bulkhead's `body_layer()` permit and the outcome its hooks see, and an inbound policy that
//! settles its cost from the body (`Policy::settle_from_body` behind `wrap_body`), against
//! hostile bodies: split usage, a body that reports its end early, trailers after data, an error
//! or a panic mid-stream, a body dropped before its first poll or polled after its end; and
//! bodies served by a real hyper server (axum on 127.0.0.1, reqwest as the client), which stops
//! polling a body once its `Content-Length` is written or its trailers are sent.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_bulwark::algorithm::Gcra;
use tower_bulwark::bulkhead::{Bulkhead, CallFinished, CallOutcome};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::limiter::Decision;
use tower_bulwark::rate_limit::{Policy, RateLimitLayer};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{BoxError, KeyedRateLimiter, Limiter, Quota};

use crate::common::listener::serve;
use crate::common::poll_once;
use crate::support::{header_cost, header_key, keyed};

// ---------------------------------------------------------------------------------------------
// A scripted body.
// ---------------------------------------------------------------------------------------------

/// One step of a [`Scripted`] body.
#[derive(Clone)]
enum Step {
    Data(Bytes),
    Trailers(HeaderMap),
    Fail,
    Panic,
    Pending,
}

/// A body that plays `steps`, then `None` (again and again if polled after its end). With
/// `ends_early`, `is_end_stream()` is true as soon as no step is left (right after its last
/// frame), as `Full` and hyper's own bodies report it.
struct Scripted {
    steps: VecDeque<Step>,
    ends_early: bool,
}

impl Scripted {
    fn new(steps: Vec<Step>, ends_early: bool) -> Self {
        Self {
            steps: steps.into(),
            ends_early,
        }
    }
}

impl http_body::Body for Scripted {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.steps.pop_front() {
            None => Poll::Ready(None),
            Some(Step::Data(bytes)) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Some(Step::Trailers(map)) => Poll::Ready(Some(Ok(Frame::trailers(map)))),
            Some(Step::Fail) => Poll::Ready(Some(Err(io::Error::other("attack: reset")))),
            Some(Step::Panic) => panic!("attack_body_end: the inner body panics"),
            Some(Step::Pending) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ends_early && self.steps.is_empty()
    }
}

fn data(bytes: &[u8]) -> Step {
    Step::Data(Bytes::copy_from_slice(bytes))
}

fn trailers() -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("x-checksum", HeaderValue::from_static("ok"));
    map
}

// ---------------------------------------------------------------------------------------------
// A limiter that records every settle and refund.
// ---------------------------------------------------------------------------------------------

type Inner = KeyedRateLimiter<String, Gcra, ManualClock>;

/// A GCRA limiter that records each `settle` (estimate, cost) and each `refund` (cost).
#[derive(Clone)]
struct Recording {
    inner: Inner,
    settles: Arc<Mutex<Vec<(u32, u32)>>>,
    refunds: Arc<Mutex<Vec<u32>>>,
    told: mpsc::UnboundedSender<(u32, u32)>,
}

impl Recording {
    fn new() -> (Self, mpsc::UnboundedReceiver<(u32, u32)>) {
        let clock = ManualClock::new();
        let (told, heard) = mpsc::unbounded_channel();
        let me = Self {
            inner: keyed::<String>(Quota::per_minute(100_000).unwrap(), &clock),
            settles: Arc::default(),
            refunds: Arc::default(),
            told,
        };
        (me, heard)
    }

    fn settles(&self) -> Vec<(u32, u32)> {
        self.settles.lock().unwrap().clone()
    }

    fn refunds(&self) -> Vec<u32> {
        self.refunds.lock().unwrap().clone()
    }
}

impl Limiter<String> for Recording {
    type Future = <Inner as Limiter<String>>::Future;

    fn quota(&self) -> Quota {
        self.inner.quota()
    }

    fn reserve(&self, key: &String, cost: u32) -> Self::Future {
        self.inner.reserve(key, cost)
    }

    fn reserve_now(&self, key: &String, cost: u32) -> Option<Result<Decision, BoxError>> {
        self.inner.reserve_now(key, cost)
    }

    fn refund(&self, key: &String, cost: u32, decision: Decision) -> bool {
        self.refunds.lock().unwrap().push(cost);
        self.inner.refund(key, cost, decision)
    }

    fn settle(&self, key: &String, estimate: u32, decision: Decision, cost: u32) -> bool {
        let settled = self.inner.settle(key, estimate, decision, cost);
        self.settles.lock().unwrap().push((estimate, cost));
        let _ = self.told.send((estimate, cost));
        settled
    }
}

const ESTIMATE: u32 = 1000;
const USED: u32 = 42;
const JSON: &[u8] = br#"{"id":"c1","usage":{"prompt_tokens":3,"total_tokens":42},"x":[1,2]}"#;

/// A tokens policy on `limiter`: key `x-tenant`, estimate `x-max`, settled from the body's
/// `usage.total_tokens`.
fn tokens_policy(
    limiter: &Recording,
) -> Policy<impl tower_bulwark::rate_limit::KeyExtractor<Key = String>, Recording> {
    Policy::new("tokens", header_key("x-tenant"), limiter.clone())
        .unwrap()
        .cost_by(header_cost("x-max"))
        .settle_from_body(BodyUsage::json(["usage", "total_tokens"]).unwrap())
}

fn request() -> Request<Body> {
    Request::builder()
        .uri("/v1/complete")
        .header("x-tenant", "t")
        .header("x-max", ESTIMATE.to_string())
        .body(Body::empty())
        .unwrap()
}

/// The rate-limited service's body for an answer of `status` whose body plays `steps`.
async fn body_of(
    limiter: &Recording,
    status: StatusCode,
    steps: Vec<Step>,
    ends_early: bool,
) -> tower_bulwark::rate_limit::RateLimitBody<Scripted> {
    let steps = Arc::new(Mutex::new(Some(steps)));
    let service = RateLimitLayer::new(tokens_policy(limiter))
        .wrap_body()
        .layer(service_fn(move |_: Request<Body>| {
            let steps = steps.lock().unwrap().take().unwrap();
            async move {
                let response = Response::builder()
                    .status(status)
                    .header(CONTENT_TYPE, "application/json")
                    .body(Scripted::new(steps, ends_early))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        }));
    let response = service.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), status);
    response.into_body()
}

/// Polls `body` up to `polls` times, stopping at its end or a panic of it, then drops it.
fn poll_then_drop<B: http_body::Body + Unpin>(mut body: B, polls: usize) {
    for _ in 0..polls {
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            poll_once(pin!(body.frame()))
        }));
        if matches!(polled, Ok(Poll::Ready(None)) | Err(_)) {
            break;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Inbound: a cost settled from the body.
// ---------------------------------------------------------------------------------------------

/// Promise (`Policy::settle_from_body`, src/rate_limit/policy.rs:256, and `UsageScan::feed`,
/// src/usage.rs:222 "any split of a body gives the same answer"): the usage split across two
/// and three frames at every byte position, read to the end by a body that reports its end
/// right after its last frame (and polled once more after it): settled exactly once, to 42,
/// before the `None` is even polled; nothing refunded.
#[tokio::test]
async fn json_usage_split_at_every_position_settles_exactly_once_at_the_last_frame() {
    for ends_early in [true, false] {
        for i in 0..=JSON.len() {
            for j in [i, (i + 7).min(JSON.len()), JSON.len()] {
                let (limiter, _) = Recording::new();
                let steps = vec![data(&JSON[..i]), data(&JSON[i..j]), data(&JSON[j..])];
                let mut body = body_of(&limiter, StatusCode::OK, steps, ends_early).await;
                let mut read = Vec::new();
                for _ in 0..3 {
                    let Poll::Ready(Some(Ok(frame))) = poll_once(pin!(body.frame())) else {
                        panic!("a data frame");
                    };
                    read.extend_from_slice(frame.data_ref().unwrap());
                }
                assert_eq!(read, JSON);
                if ends_early {
                    assert!(http_body::Body::is_end_stream(&body));
                    assert_eq!(limiter.settles(), vec![(ESTIMATE, USED)], "cut {i} {j}");
                }
                assert!(matches!(poll_once(pin!(body.frame())), Poll::Ready(None)));
                assert!(matches!(poll_once(pin!(body.frame())), Poll::Ready(None)));
                drop(body);
                assert_eq!(
                    limiter.settles(),
                    vec![(ESTIMATE, USED)],
                    "cut {i} {j} {ends_early}"
                );
                assert!(limiter.refunds().is_empty());
            }
        }
    }
}

/// Promise (src/rate_limit/policy.rs:256-258): "A body dropped before its end (the client went
/// away) settles to the cost read so far, if it was read, and otherwise keeps the estimate; so
/// does a body that fails." A failure, a panic of the inner body, or a drop, each after the
/// usage went by, settles to 42 exactly once; each before it keeps the estimate (no settle, no
/// refund); trailers after the data change nothing.
#[tokio::test]
async fn every_way_a_body_ends_settles_once_to_what_was_read() {
    crate::common::process::quiet_panics_starting_with("attack_body_end: the inner body");
    // `total_tokens":42` is complete only in the tail.
    let (head, tail) = JSON.split_at(40);
    let (whole, h, t) = (|| data(JSON), || data(head), || data(tail));
    // A body of `steps`, polled at most `polls` times then dropped; `settled`: to what it read.
    let case = |name, steps: Vec<Step>, polls: usize, settled: bool| {
        (name, steps, polls, settled.then_some((ESTIMATE, USED)))
    };
    let cases = [
        case("fails after", vec![whole(), Step::Fail], 2, true),
        case("fails before", vec![h(), Step::Fail, t()], 2, false),
        case("panics after", vec![whole(), Step::Panic], 2, true),
        case("panics before", vec![h(), Step::Panic, t()], 2, false),
        case("dropped after", vec![whole(), Step::Pending], 2, true),
        case("dropped before", vec![h(), t()], 1, false),
        case("never polled", vec![whole()], 0, false),
        case(
            "trailers after",
            vec![h(), t(), Step::Trailers(trailers())],
            usize::MAX,
            true,
        ),
    ];
    for (name, steps, polls, expected) in cases {
        let (limiter, _) = Recording::new();
        let body = body_of(&limiter, StatusCode::OK, steps, false).await;
        poll_then_drop(body, polls);
        let expected: Vec<_> = expected.into_iter().collect();
        assert_eq!(limiter.settles(), expected, "{name}");
        assert!(limiter.refunds().is_empty(), "{name}");
    }
}

/// Promise (src/rate_limit/policy.rs:258-260): an error answer that reports no usage settles to
/// zero, streamed or not, read to its end or dropped before the first poll; one whose body
/// reports usage settles to it.
#[tokio::test]
async fn an_error_answer_settles_to_zero_unless_its_body_says_otherwise() {
    let (limiter, _) = Recording::new();
    let body = body_of(
        &limiter,
        StatusCode::BAD_GATEWAY,
        vec![data(b"{\"error\":1}")],
        true,
    )
    .await;
    let _ = body.collect().await;
    let (limiter2, _) = Recording::new();
    drop(body_of(&limiter2, StatusCode::BAD_GATEWAY, vec![data(b"{}")], false).await);
    let (limiter3, _) = Recording::new();
    let body = body_of(&limiter3, StatusCode::BAD_GATEWAY, vec![data(JSON)], false).await;
    let _ = body.collect().await;
    assert_eq!(limiter.settles(), vec![(ESTIMATE, 0)]);
    assert_eq!(limiter2.settles(), vec![(ESTIMATE, 0)]);
    assert_eq!(limiter3.settles(), vec![(ESTIMATE, USED)]);
}

/// An event stream whose usage is in the last event before `[DONE]`, cut into three frames at
/// every pair of positions (a step of 5 for the second cut): settled exactly once to it.
#[tokio::test]
async fn sse_usage_in_the_last_event_at_every_split_settles_exactly_once() {
    let stream: &[u8] = b"data: {\"choices\":[{\"delta\":\"x\"}],\"usage\":null}\r\n\r\n: ping\n\n\
        data: {\"choices\":[],\r\ndata: \"usage\":{\"total_tokens\":42}}\n\ndata: [DONE]\n\n";
    for i in 0..=stream.len() {
        for j in (i..=stream.len()).step_by(5) {
            let (limiter, _) = Recording::new();
            let steps = vec![data(&stream[..i]), data(&stream[i..j]), data(&stream[j..])];
            let steps2 = steps.clone();
            let svc_steps = Arc::new(Mutex::new(Some(steps2)));
            let service = RateLimitLayer::new(tokens_policy(&limiter))
                .wrap_body()
                .layer(service_fn(move |_: Request<Body>| {
                    let steps = svc_steps.lock().unwrap().take().unwrap();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header(CONTENT_TYPE, "text/event-stream")
                                .body(Scripted::new(steps, true))
                                .unwrap(),
                        )
                    }
                }));
            drop(steps);
            let response = service.oneshot(request()).await.unwrap();
            let read = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&read[..], stream);
            assert_eq!(limiter.settles(), vec![(ESTIMATE, USED)], "cut {i} {j}");
        }
    }
}

/// Through a real server: a route whose handler streams its JSON answer in pieces with a
/// `Content-Length` (hyper stops polling the body once that many bytes are written, and drops
/// it without a `None`), read by reqwest: the settle is exactly the usage, once.
#[tokio::test]
async fn a_served_body_with_a_content_length_settles_exactly_once() {
    let (limiter, mut heard) = Recording::new();
    let app = Router::new()
        .route(
            "/v1/complete",
            get(|| async {
                let pieces: Vec<Result<Bytes, io::Error>> = JSON
                    .chunks(9)
                    .map(|c| Ok(Bytes::copy_from_slice(c)))
                    .collect();
                Response::builder()
                    .header(CONTENT_TYPE, "application/json")
                    .header(CONTENT_LENGTH, JSON.len())
                    .body(Body::from_stream(futures::stream::iter(pieces)))
                    .unwrap()
            }),
        )
        .route_layer(RateLimitLayer::new(tokens_policy(&limiter)).wrap_body());
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    for round in 1..=3 {
        let response = client
            .get(format!("http://{addr}/v1/complete"))
            .header("x-tenant", "t")
            .header("x-max", ESTIMATE.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(&response.bytes().await.unwrap()[..], JSON);
        let settled = tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await
            .expect("the served body never settled")
            .unwrap();
        assert_eq!(settled, (ESTIMATE, USED));
        assert_eq!(limiter.settles().len(), round);
    }
    assert!(limiter.refunds().is_empty());
}

// ---------------------------------------------------------------------------------------------
// The bulkhead's body layer: the outcome a served body reports.
// ---------------------------------------------------------------------------------------------

/// Serves `make`'s answers at `/x` behind a one-permit `body_layer()` bulkhead; returns the
/// server's address, the bulkhead, and the outcomes its `on_call_finished` hook reports.
async fn bulkhead_server(
    make: fn() -> Response<Body>,
) -> (
    std::net::SocketAddr,
    Bulkhead,
    mpsc::UnboundedReceiver<CallOutcome>,
) {
    let (told, heard) = mpsc::unbounded_channel();
    let bulkhead = Bulkhead::semaphore("downloads", 1)
        .on_call_finished(move |event: &CallFinished<'_>| {
            let _ = told.send(event.outcome);
        })
        .build();
    let app = Router::new()
        .route("/x", get(move || async move { make() }))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: BoxError| async {
                    StatusCode::SERVICE_UNAVAILABLE
                }))
                .layer(bulkhead.body_layer()),
        );
    (serve(app).await, bulkhead, heard)
}

/// GETs `/x` with reqwest, reads the whole body, and returns it with the outcome the hook saw.
async fn read_served(
    addr: std::net::SocketAddr,
    heard: &mut mpsc::UnboundedReceiver<CallOutcome>,
    trailers_too: bool,
) -> (Bytes, CallOutcome) {
    let mut request = reqwest::Client::new().get(format!("http://{addr}/x"));
    if trailers_too {
        request = request.header("te", "trailers");
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = response.bytes().await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), heard.recv())
        .await
        .expect("the call never finished")
        .unwrap();
    (bytes, outcome)
}

fn whole() -> Response<Body> {
    Response::new(Body::from("0123456789"))
}

fn streamed_with_a_length() -> Response<Body> {
    let pieces: Vec<Result<Bytes, io::Error>> = vec![
        Ok(Bytes::from_static(b"01234")),
        Ok(Bytes::from_static(b"56789")),
    ];
    Response::builder()
        .header(CONTENT_LENGTH, "10")
        .body(Body::from_stream(futures::stream::iter(pieces)))
        .unwrap()
}

fn streamed_then_trailers() -> Response<Body> {
    let frames: Vec<Result<Frame<Bytes>, io::Error>> = vec![
        Ok(Frame::data(Bytes::from_static(b"01234"))),
        Ok(Frame::data(Bytes::from_static(b"56789"))),
        Ok(Frame::trailers(trailers())),
    ];
    Response::new(Body::new(http_body_util::StreamBody::new(
        futures::stream::iter(frames),
    )))
}

/// A body made by `make`, served behind the bulkhead's `body_layer()` and read to its end by
/// reqwest (asking for trailers if `trailers_too`): the whole body, the permit back, and the
/// call a `Success`.
async fn served_and_read_to_its_end_is_a_success(make: fn() -> Response<Body>, trailers_too: bool) {
    let (addr, bulkhead, mut heard) = bulkhead_server(make).await;
    let (bytes, outcome) = read_served(addr, &mut heard, trailers_too).await;
    assert_eq!(&bytes[..], b"0123456789", "the client read the whole body");
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    assert_eq!(
        outcome,
        CallOutcome::Success,
        "a body read to its end is a Success"
    );
}

/// Baseline: a whole body (`Body::from`) served and read to its end is a `Success`.
#[tokio::test]
async fn a_served_whole_body_read_to_its_end_is_a_success() {
    served_and_read_to_its_end_is_a_success(whole, false).await;
}

/// Promise (`CallOutcome::Success`, src/bulkhead/events.rs:35-37: "when the body is held, the
/// body was read to its end"; `Cancelled`, :42-44: "the held body was dropped before its end").
/// A streamed body with a `Content-Length`, served by hyper and read to its last byte by the
/// client, was reported `Cancelled`: hyper writes the tenth byte, sees its length reached, and
/// drops the body without polling the `None` the permit waited for.
#[tokio::test]
async fn a_served_streamed_body_with_a_content_length_read_to_its_end_is_a_success() {
    served_and_read_to_its_end_is_a_success(streamed_with_a_length, false).await;
}

/// Promise (as above). A body whose last frame is its trailers (an `http_body_util::StreamBody`,
/// whose `is_end_stream` stays false) served and read to its end was reported `Cancelled`: hyper
/// drops a body once it has its trailers, the last frame a body has.
#[tokio::test]
async fn a_served_body_that_ends_with_trailers_is_a_success() {
    served_and_read_to_its_end_is_a_success(streamed_then_trailers, true).await;
}

/// A body with no data that ends in trailers (its size hint an exact zero), read through a
/// pushback that reads trailers: the `RESOURCE_EXHAUSTED` and the delay in them hold calls. A
/// watch that took an exact zero for the body's end at its start missed them.
#[cfg(feature = "grpc")]
#[tokio::test]
async fn trailers_after_no_data_are_read_by_a_pushback() {
    use http_body_util::Full;
    use tower_bulwark::outbound::pushback::Pushback;
    let mut fields = HeaderMap::new();
    fields.insert("grpc-status", HeaderValue::from_static("8"));
    fields.insert("grpc-retry-pushback-ms", HeaderValue::from_static("2000"));
    let pushback = Pushback::builder("trailers-only")
        .clock(ManualClock::new())
        .build();
    let svc = pushback
        .layer()
        .read_trailers()
        .layer(service_fn(move |_: ()| {
            let body =
                Full::new(Bytes::new()).with_trailers(std::future::ready(Some(Ok(fields.clone()))));
            async move { Ok::<_, Infallible>(Response::new(body)) }
        }));
    let body = svc.oneshot(()).await.unwrap().into_body();
    let read = body.collect().await.unwrap();
    assert!(read.trailers().is_some());
    assert_eq!(pushback.held_for(), Duration::from_secs(2));
}

/// The same trailers body under `oneshot`, read frame by frame to its trailers (as a gRPC
/// reader that has its status stops there) and then dropped: the body was read to its end.
#[tokio::test]
async fn a_body_read_to_its_trailers_then_dropped_is_a_success() {
    let (told, mut heard) = mpsc::unbounded_channel();
    let bulkhead = Bulkhead::semaphore("grpc-ish", 1)
        .on_call_finished(move |event: &CallFinished<'_>| {
            let _ = told.send(event.outcome);
        })
        .build();
    let svc = bulkhead.body_layer().layer(service_fn(|_: ()| async {
        Ok::<_, io::Error>(Response::new(Scripted::new(
            vec![data(b"0123456789"), Step::Trailers(trailers())],
            false,
        )))
    }));
    let mut body = svc.oneshot(()).await.unwrap().into_body();
    assert!(poll_once(pin!(body.frame())).is_ready());
    let Poll::Ready(Some(Ok(frame))) = poll_once(pin!(body.frame())) else {
        panic!("the trailers");
    };
    assert!(frame.is_trailers());
    drop(body);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    assert_eq!(heard.try_recv().unwrap(), CallOutcome::Success);
}

/// The hostile bodies under `body_layer()`, each outcome as documented
/// (src/bulkhead/permits.rs:413-415): read to a `None`, or to a frame after which the body
/// reports its end, `Success`; failed `Failure`; panicked while polled `Panicked`; dropped
/// before its end (or before its first poll) `Cancelled`; polled again after its end, nothing
/// more. The permit comes back exactly once each time.
#[tokio::test]
async fn each_way_a_held_body_ends_is_reported_once() {
    crate::common::process::quiet_panics_starting_with("attack_body_end: the inner body");
    type Case = (&'static str, Vec<Step>, bool, usize, CallOutcome);
    let cases: Vec<Case> = vec![
        (
            "to None",
            vec![data(b"a"), data(b"b")],
            false,
            5,
            CallOutcome::Success,
        ),
        (
            "ends early",
            vec![data(b"a"), data(b"b")],
            true,
            2,
            CallOutcome::Success,
        ),
        (
            "fails",
            vec![data(b"a"), Step::Fail, data(b"b")],
            false,
            5,
            CallOutcome::Failure,
        ),
        (
            "panics",
            vec![data(b"a"), Step::Panic],
            false,
            5,
            CallOutcome::Panicked,
        ),
        (
            "dropped midway",
            vec![data(b"a"), data(b"b")],
            false,
            1,
            CallOutcome::Cancelled,
        ),
        (
            "dropped pending",
            vec![data(b"a"), Step::Pending],
            false,
            2,
            CallOutcome::Cancelled,
        ),
        (
            "never polled",
            vec![data(b"a")],
            false,
            0,
            CallOutcome::Cancelled,
        ),
    ];
    for (name, steps, ends_early, polls, expected) in cases {
        let (told, mut heard) = mpsc::unbounded_channel();
        let bulkhead = Bulkhead::semaphore("hostile", 1)
            .on_call_finished(move |event: &CallFinished<'_>| {
                let _ = told.send(event.outcome);
            })
            .build();
        let steps = Arc::new(Mutex::new(Some(steps)));
        let svc = bulkhead.body_layer().layer(service_fn(move |_: ()| {
            let steps = steps.lock().unwrap().take().unwrap();
            async move { Ok::<_, io::Error>(Response::new(Scripted::new(steps, ends_early))) }
        }));
        let body = svc.oneshot(()).await.unwrap().into_body();
        poll_then_drop(body, polls);
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1, "{name}");
        assert_eq!(heard.try_recv().ok(), Some(expected), "{name}");
        assert!(heard.try_recv().is_err(), "{name}: reported twice");
    }
}

// ---------------------------------------------------------------------------------------------
// Overload protection: the permit in `OverloadBody`.
// ---------------------------------------------------------------------------------------------

/// Promise (src/overload/mod.rs:51-54): "A request holds its permit until its response body
/// ends, fails or is dropped ... The permit is given back exactly once whatever ends the
/// request: the body's end, its failure or drop, ..., a panic". Each hostile body holds its
/// place while unread, and gives it back exactly once (never below zero) however it ends.
#[cfg(feature = "adaptive")]
#[tokio::test]
async fn an_overload_body_gives_its_place_back_once_however_it_ends() {
    use tower_bulwark::overload::Overload;
    crate::common::process::quiet_panics_starting_with("attack_body_end: the inner body");
    type Case = (&'static str, Vec<Step>, bool, usize);
    let cases: Vec<Case> = vec![
        ("to None", vec![data(b"a"), data(b"b")], false, 9),
        ("ends early", vec![data(b"a"), data(b"b")], true, 2),
        (
            "trailers",
            vec![data(b"a"), Step::Trailers(trailers())],
            false,
            2,
        ),
        ("fails", vec![data(b"a"), Step::Fail], false, 9),
        ("panics", vec![data(b"a"), Step::Panic], false, 9),
        ("dropped pending", vec![data(b"a"), Step::Pending], false, 2),
        ("never polled", vec![data(b"a")], false, 0),
    ];
    let overload = Overload::builder("attack").build();
    for (name, steps, ends_early, polls) in cases {
        let steps = Arc::new(Mutex::new(Some(steps)));
        let svc = overload.layer().layer(service_fn(move |_: Request<()>| {
            let steps = steps.lock().unwrap().take().unwrap();
            async move { Ok::<_, Infallible>(Response::new(Scripted::new(steps, ends_early))) }
        }));
        let body = svc.oneshot(Request::new(())).await.unwrap().into_body();
        assert_eq!(overload.in_flight(), 1, "{name}: held while unread");
        poll_then_drop(body, polls);
        assert_eq!(overload.in_flight(), 0, "{name}");
    }
}

/// The crate's own pattern (src/bulkhead/mod.rs:76-92): a `reqwest::Client` behind
/// `body_layer()`, its answer turned into an `http::Response<reqwest::Body>`, here proxied by a
/// gateway to its own client as its answer. The upstream's body reaches the end client whole;
/// the call must end as a `Success`.
#[tokio::test]
async fn a_proxied_upstream_body_held_by_the_body_layer_is_a_success() {
    let upstream = serve(Router::new().route("/x", get(|| async { "0123456789" }))).await;
    let (told, mut heard) = mpsc::unbounded_channel();
    let bulkhead = Bulkhead::semaphore("upstream", 1)
        .on_call_finished(move |event: &CallFinished<'_>| {
            let _ = told.send(event.outcome);
        })
        .build();
    let client = ServiceBuilder::new()
        .layer(bulkhead.body_layer())
        .map_response(|response: reqwest::Response| http::Response::<reqwest::Body>::from(response))
        .service(reqwest::Client::new());
    let gateway = Router::new().route(
        "/x",
        get(move || {
            let client = client.clone();
            async move {
                let url = format!("http://{upstream}/x").parse().unwrap();
                let request = reqwest::Request::new(reqwest::Method::GET, url);
                let (parts, body) = client.oneshot(request).await.unwrap().into_parts();
                Response::from_parts(parts, Body::new(body))
            }
        }),
    );
    let gateway = serve(gateway).await;
    for _ in 0..2 {
        let response = reqwest::get(format!("http://{gateway}/x")).await.unwrap();
        assert_eq!(&response.bytes().await.unwrap()[..], b"0123456789");
        let outcome = tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await
            .expect("the call never finished")
            .unwrap();
        assert_eq!(outcome, CallOutcome::Success);
    }
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
}
