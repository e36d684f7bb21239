//! Attacks on the gRPC promises (feature `grpc`): a pushback reading trailers (hostile, doubled,
//! dropped), a server bulkhead under a storm of streams dropped at every point and a client
//! that vanishes, the rate-limit layer raced by streaming and unary calls, and client bulkheads
//! on a tonic `Channel`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, Stream, StreamExt};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use prost::Message;
use tonic::codegen::Service;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status, Streaming};
use tonic_prost::ProstCodec;
use tonic_types::StatusExt;
use tower::{Layer, ServiceExt};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::{self, Pushback};
use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
use tower_bulwark::{BoxError, Bulkhead, KeyedRateLimiter, Quota};

use crate::grpc_example::grpc::{Greeter, HelloReply, HelloRequest};

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;
type Replies = Pin<Box<dyn Stream<Item = Result<HelloReply, Status>> + Send>>;
type Sender = futures::channel::mpsc::Sender<HelloRequest>;
type Streamed = Result<Streaming<HelloReply>, Status>;
const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);
const ZERO: Duration = Duration::ZERO;
const PUSHBACK: &str = "grpc-retry-pushback-ms";

// ---- A scripted origin for `Pushback::layer().read_trailers()`: a head, then frames ----

/// A body that yields its frames in order, and counts itself dropped.
struct Scripted(VecDeque<Frame<Bytes>>, Arc<AtomicUsize>);
impl Body for Scripted {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}
impl Drop for Scripted {
    fn drop(&mut self) {
        self.1.fetch_add(1, SeqCst);
    }
}

/// What the origin answers: head fields (beside `content-type: application/grpc`) and frames.
type Script = (HeaderMap, Vec<Frame<Bytes>>);

/// The origin's bodies dropped, and the calls that reached it.
#[derive(Clone, Default)]
struct Counts(Arc<AtomicUsize>, Arc<AtomicUsize>);

type Answer = http::Response<Scripted>;

fn origin(counts: &Counts) -> impl Service<Script, Response = Answer, Error = BoxError> + Clone {
    let counts = counts.clone();
    tower::service_fn(move |(head, frames): Script| {
        counts.1.fetch_add(1, SeqCst);
        let mut response = http::Response::new(Scripted(frames.into(), counts.0.clone()));
        *response.headers_mut() = head;
        let grpc = HeaderValue::from_static("application/grpc");
        response.headers_mut().insert("content-type", grpc);
        async move { Ok::<_, BoxError>(response) }
    })
}

/// The fields `pairs` name, leaving out those of empty values.
fn fields(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let field = |(n, v): &(&str, &[u8])| (n.parse().unwrap(), HeaderValue::from_bytes(v).unwrap());
    let pairs = pairs.iter().filter(|(_, v)| !v.is_empty());
    pairs.map(field).collect()
}

/// `grpc-status: 8` with a `grpc-retry-pushback-ms` of `ms`.
fn refusal(ms: &str) -> HeaderMap {
    fields(&[("grpc-status", b"8"), (PUSHBACK, ms.as_bytes())])
}

/// A stream begun (a message's frame), then `trailers`.
fn stream_then(trailers: HeaderMap) -> Vec<Frame<Bytes>> {
    let message = Frame::data(Bytes::from_static(b"\0\0\0\0\0"));
    vec![message, Frame::trailers(trailers)]
}

/// Calls `service` with `script` and reads up to `frames` frames of the answer, then drops it.
async fn call<S, B: Body>(service: &S, script: Script, frames: usize) -> Result<(), BoxError>
where
    S: Service<Script, Response = http::Response<B>, Error = BoxError> + Clone,
{
    let body = service.clone().oneshot(script).await?.into_body();
    let mut body = std::pin::pin!(body);
    for _ in 0..frames {
        if !matches!(body.frame().await, Some(Ok(_))) {
            break;
        }
    }
    Ok(())
}

fn dependency(max_hold: Duration) -> Pushback<ManualClock> {
    let builder = Pushback::builder("dep").max_hold(max_hold);
    builder.clock(ManualClock::new()).build()
}

/// `grpc-status-details-bin` of a `google.rpc.Status` whose one detail is a `RetryInfo` of
/// `seconds` and `nanos` as written (any values), or of `raw` bytes in its place.
fn retry_info(seconds: i64, nanos: i32, raw: Option<&[u8]>) -> Vec<u8> {
    let mut info = tonic_types::pb::RetryInfo::default();
    let delay = info.retry_delay.insert(Default::default());
    (delay.seconds, delay.nanos) = (seconds, nanos);
    let mut status = tonic_types::pb::Status {
        code: 8,
        ..Default::default()
    };
    status.details.push(Default::default());
    status.details[0].type_url = "type.googleapis.com/google.rpc.RetryInfo".into();
    status.details[0].value = raw.map_or_else(|| info.encode_to_vec(), <[u8]>::to_vec);
    let details = status.encode_to_vec().into();
    let (mut map, tonic) = (
        HeaderMap::new(),
        Status::with_details(Code::ResourceExhausted, "x", details),
    );
    tonic.add_header(&mut map).unwrap();
    map["grpc-status-details-bin"].as_bytes().to_vec()
}

/// Trailers of every shape after a stream has begun, each under a `max_hold` of 600 s and of
/// 5 s: the hold is exact (`true`) where the docs name it, else bounded by what the trailers
/// say; never over `max_hold`, never a panic.
#[tokio::test]
async fn hostile_trailers_hold_exactly_what_they_say_and_never_longer() {
    let (valid, negative) = (retry_info(30, 0, None), retry_info(-5, 0, None));
    let huge = retry_info(i64::MAX, 999_999_999, None);
    let carry = retry_info(1, 2_000_000_000, None);
    let garbage_any = retry_info(0, 0, Some(b"\xff\xff\xff"));
    let t = |status: &str, details: &[u8], pushback: &[u8]| {
        let (s, d) = ("grpc-status", "grpc-status-details-bin");
        fields(&[(s, status.as_bytes()), (d, details), (PUSHBACK, pushback)])
    };
    let (mut junk, mut lines) = (refusal("2000"), refusal("3000"));
    for i in 0..9_998 {
        let name = HeaderName::try_from(format!("x-junk-{i}")).unwrap();
        junk.append(name, HeaderValue::from_static("v"));
        lines.append(PUSHBACK, HeaderValue::from_static("999999999"));
    }
    let cases = [
        (t("8", b"", b"1500"), 1500 * MS, true),
        (t("14", b"", b"20"), 20 * MS, true),
        (t("8", &valid, b""), 30 * SECOND, true),
        (t("8", &valid, b"1"), 30 * SECOND, true),
        (t("8", &negative, b"7000"), 7 * SECOND, false),
        (t("8", &huge, b""), 600 * SECOND, true),
        (t("8", &carry, b""), 3 * SECOND, false),
        (t("8", &garbage_any, b"11"), 11 * MS, true),
        (t("8", b"!!not base64!!", b"7"), 7 * MS, true),
        (t("8", b"3q2+7w==", b"9"), 9 * MS, true),
        (t("8", b"AAAA", b""), ZERO, true),
        (t("8", b"", b"-1"), ZERO, true),
        (t("8", b"", b"-0"), ZERO, true),
        (t("8", b"", b"soon"), ZERO, true),
        (t("8", b"", b"1e3"), ZERO, true),
        (t("8", b"", b"\xff\xfe"), ZERO, true),
        (t("8", b"", b"99999999999999999999"), ZERO, true),
        (t("8", b"", b"18446744073709551615"), 600 * SECOND, true),
        (t("8", b"", b" 1500 "), 1500 * MS, false),
        (t("0", b"", b"1500"), ZERO, true),
        (t("13", b"", b"1500"), ZERO, true),
        (t("08", b"", b"1500"), ZERO, true),
        // Trailers of an HTTP 200 with no grpc-status: nothing says to wait.
        (t("", b"", b"5000"), ZERO, true),
        (t("", &valid, b""), ZERO, true),
        (
            fields(&[("retry-after", b"30"), (PUSHBACK, b"5000")]),
            ZERO,
            true,
        ),
        (HeaderMap::new(), ZERO, true),
        (junk, 2 * SECOND, true),
        (lines, 600 * SECOND, false),
    ];
    let counts = Counts::default();
    for (trailers, expected, exact) in &cases {
        let shown = format!("{:?}", trailers.iter().take(3).collect::<Vec<_>>());
        for max_hold in [600 * SECOND, 5 * SECOND] {
            let pushback = dependency(max_hold);
            let client = pushback.layer().read_trailers().layer(origin(&counts));
            let script = (HeaderMap::new(), stream_then(trailers.clone()));
            call(&client, script, 9).await.unwrap();
            let (held, bound) = (pushback.held_for(), (*expected).min(max_hold));
            if *exact {
                assert_eq!(held, bound, "{shown} (max_hold {max_hold:?})");
            } else {
                assert!(held <= bound, "{shown}: held {held:?} > {bound:?}");
            }
        }
    }
}

/// A trailer hold of 20 s: each call fails at once with the time left, to the millisecond, and
/// reaches nothing until the clock has moved exactly 20 s. Only the first trailer section
/// counts; a hold set by the head is not shortened by the trailers, and is extended by them.
#[tokio::test]
async fn a_trailer_hold_lasts_exactly_its_delay() {
    let (counts, clock) = (Counts::default(), ManualClock::new());
    let pushback = Pushback::builder("dep").clock(clock.clone()).build();
    let client = pushback.layer().read_trailers().layer(origin(&counts));
    let script = (HeaderMap::new(), stream_then(refusal("20000")));
    call(&client, script, 9).await.unwrap();
    assert_eq!(pushback.held_for(), 20 * SECOND);
    let empty = || (HeaderMap::new(), Vec::new());
    for (advance, left) in [(ZERO, 20 * SECOND), (19_999 * MS, MS)] {
        clock.advance(advance);
        let held = call(&client, empty(), 0).await.unwrap_err();
        assert_eq!(outbound::retry_after(&*held), Some(left), "{held}");
    }
    assert_eq!(counts.1.load(SeqCst), 1, "held calls reached nothing");
    clock.advance(MS);
    call(&client, empty(), 0).await.unwrap();
    assert_eq!(counts.1.load(SeqCst), 2);

    // (the head's pushback, the first trailers', the second trailers', the hold).
    for (head, first, second, hold) in [
        (None, "1000", Some("300000"), SECOND),
        (Some("10000"), "1000", None, 10 * SECOND),
        (Some("1000"), "10000", None, 10 * SECOND),
    ] {
        let pushback = dependency(600 * SECOND);
        let client = pushback.layer().read_trailers().layer(origin(&counts));
        let mut frames = stream_then(refusal(first));
        frames.extend(second.map(|ms| Frame::trailers(refusal(ms))));
        let script = (head.map(refusal).unwrap_or_default(), frames);
        call(&client, script, 9).await.unwrap();
        assert_eq!(pushback.held_for(), hold, "{head:?} {first} {second:?}");
    }
}

/// A body dropped before its trailers (after 0, 1 or 2 data frames) records nothing: the
/// refusal in its trailers sets no hold, the origin's body is dropped each time, and 300 such
/// calls leave no heap behind on this thread. A heads-only pushback ignores trailers it reads.
#[tokio::test]
async fn a_body_dropped_before_its_trailers_records_nothing_and_leaks_nothing() {
    let counts = Counts::default();
    let pushback = dependency(600 * SECOND);
    let client = pushback.layer().read_trailers().layer(origin(&counts));
    let script = || {
        let mut frames = stream_then(refusal("30000"));
        frames.insert(0, Frame::data(Bytes::from_static(b"\0\0\0\0\0")));
        (HeaderMap::new(), frames)
    };
    let run = |n: usize| {
        let client = client.clone();
        async move {
            for i in 0..n {
                call(&client, script(), i % 3).await.unwrap();
            }
        }
    };
    run(30).await;
    let before = crate::counting::live_bytes();
    run(300).await;
    let grown = crate::counting::live_bytes() - before;
    assert!(grown < 512, "300 dropped bodies left {grown} bytes");
    assert_eq!(counts.0.load(SeqCst), 330);
    assert_eq!(pushback.held_for(), ZERO);

    let heads_only = dependency(600 * SECOND);
    let client = heads_only.layer().layer(origin(&counts));
    call(&client, script(), 9).await.unwrap();
    assert_eq!(heads_only.held_for(), ZERO);
}

// ---- `attack.Streams`, a tonic service that counts the streams open in its handlers ----

/// Streams open in the handlers now, and at most.
#[derive(Default)]
struct Gauge(AtomicUsize, AtomicUsize);

struct Open(Arc<Gauge>);
impl Drop for Open {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, SeqCst);
    }
}

/// `replies`, counted open until they end (the state is dropped then), fail, or are dropped.
fn guarded(gauge: &Arc<Gauge>, replies: Replies) -> Replies {
    gauge.1.fetch_max(gauge.0.fetch_add(1, SeqCst) + 1, SeqCst);
    let open = Some(Open(gauge.clone()));
    let next = |(mut replies, mut open): (Replies, Option<Open>)| async move {
        let item = replies.next().await?;
        if item.is_err() {
            open = None; // Its last item: tonic ends the body with it.
        }
        Some((item, (replies, open)))
    };
    Box::pin(futures::stream::unfold((replies, open), next))
}

/// `Count` (n replies), `Hang` (one reply, then nothing, forever), `Echo` (bidirectional),
/// `Fail` (one reply, then `RESOURCE_EXHAUSTED` in trailers: `pushback:V` with a
/// `grpc-retry-pushback-ms` of V, `retry:S` with a `RetryInfo` of S seconds, `junk:N` with N
/// lines of metadata and a pushback of 2 s).
#[derive(Clone, Default)]
struct Streams(Arc<Gauge>);

impl tonic::server::NamedService for Streams {
    const NAME: &'static str = "attack.Streams";
}

fn reply(message: String) -> Result<HelloReply, Status> {
    Ok(HelloReply { message })
}

fn failure(name: &str) -> Status {
    let (kind, value) = name.split_once(':').unwrap_or_default();
    let mut status = Status::resource_exhausted("slow down");
    if kind == "retry" {
        let delay = Some(SECOND * value.parse().unwrap());
        let details = tonic_types::ErrorDetails::with_retry_info(delay);
        status = Status::with_error_details(Code::ResourceExhausted, "slow down", details);
    }
    let metadata = status.metadata_mut();
    for _ in 0..value.parse().unwrap_or(0) * usize::from(kind == "junk") {
        metadata.append("x-junk", "0123456789".parse().unwrap());
    }
    let pushback = [("pushback", value), ("junk", "2000")];
    if let Some((_, ms)) = pushback.iter().find(|(k, _)| *k == kind) {
        metadata.insert(PUSHBACK, ms.parse().unwrap());
    }
    status
}

/// One method of `Streams`, by its name.
struct Method(Arc<Gauge>, &'static str);

type Answered = BoxFuture<Result<tonic::Response<Replies>, Status>>;

impl tonic::server::ServerStreamingService<HelloRequest> for Method {
    type Response = HelloReply;
    type ResponseStream = Replies;
    type Future = Answered;
    fn call(&mut self, request: tonic::Request<HelloRequest>) -> Answered {
        let name = request.into_inner().name;
        let replies: Replies = match self.1 {
            "Count" => {
                let n: usize = name.parse().unwrap_or(0);
                Box::pin(futures::stream::iter((0..n).map(|i| reply(i.to_string()))))
            }
            "Hang" => {
                let first = futures::stream::iter([reply("0".into())]);
                Box::pin(first.chain(futures::stream::pending()))
            }
            _ => {
                let replies = [reply("first".into()), Err(failure(&name))];
                Box::pin(futures::stream::iter(replies))
            }
        };
        let replies = guarded(&self.0, replies);
        Box::pin(async move { Ok(tonic::Response::new(replies)) })
    }
}

impl tonic::server::StreamingService<HelloRequest> for Method {
    type Response = HelloReply;
    type ResponseStream = Replies;
    type Future = Answered;
    fn call(&mut self, request: tonic::Request<Streaming<HelloRequest>>) -> Answered {
        let echoes = request.into_inner().map(|m| reply(m?.name));
        let replies = guarded(&self.0, Box::pin(echoes));
        Box::pin(async move { Ok(tonic::Response::new(replies)) })
    }
}

impl Service<http::Request<tonic::body::Body>> for Streams {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let gauge = self.0.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
            let method = match request.uri().path().strip_prefix("/attack.Streams/") {
                Some("Echo") => return Ok(grpc.streaming(Method(gauge, "Echo"), request).await),
                Some("Count") => "Count",
                Some("Hang") => "Hang",
                Some("Fail") => "Fail",
                _ => return Ok(Status::unimplemented("no such method").into_http()),
            };
            Ok(grpc.server_streaming(Method(gauge, method), request).await)
        })
    }
}

/// Serves `Streams` (counting into `$gauge`) and the greeter behind `$layer` on a free port,
/// and connects `$n` channels to it.
macro_rules! serve {
    ($layer:expr, $gauge:expr, $n:expr) => {{
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = futures::stream::unfold(listener, |listener| async move {
            Some((listener.accept().await.map(|(stream, _)| stream), listener))
        });
        let routes = tonic::service::Routes::new(Streams($gauge)).add_service(Greeter);
        let server = Server::builder().layer($layer).add_routes(routes);
        tokio::spawn(server.serve_with_incoming(incoming));
        let channels = futures::future::join_all((0..$n).map(|_| crate::grpc::channel(addr)));
        (addr, channels.await)
    }};
}

/// Waits, a bounded time, until `done` (the server frees a stream's permit in its own task).
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..3000 {
        if done() {
            return;
        }
        tokio::time::sleep(MS).await;
    }
    panic!("never: {what}");
}

async fn until_free(bulkhead: &Bulkhead) {
    let free = |max| bulkhead.snapshot().available_concurrent_calls == max;
    let max = bulkhead.snapshot().max_allowed_concurrent_calls;
    until(&format!("every permit of {bulkhead:?} free"), || free(max)).await;
}

/// The bounds of a tonic client over any service (a `Channel` behind layers).
pub(crate) trait Client:
    tonic::client::GrpcService<tonic::body::Body, ResponseBody = Self::Body, Error = Self::Failure>
{
    type Body: Body<Data = Bytes, Error = Self::BodyError> + Send + 'static;
    type BodyError: Into<BoxError> + Send;
    type Failure: Into<BoxError>;
}
impl<T: tonic::client::GrpcService<tonic::body::Body>> Client for T
where
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<BoxError> + Send,
    T::Error: Into<BoxError>,
{
    type Body = T::ResponseBody;
    type BodyError = <T::ResponseBody as Body>::Error;
    type Failure = T::Error;
}

/// `client`, ready for a call.
pub(crate) async fn ready<T: Client>(client: T) -> Result<tonic::client::Grpc<T>, Status> {
    let mut grpc = tonic::client::Grpc::new(client);
    let ready = grpc.ready().await;
    ready.map_err(|e| Status::from_error(e.into()))?;
    Ok(grpc)
}

pub(crate) fn request(name: &str) -> tonic::Request<HelloRequest> {
    tonic::Request::new(HelloRequest { name: name.into() })
}

/// A server-streaming call of `method`.
async fn open<T: Client>(client: T, method: &str, name: &str) -> Streamed {
    let path = format!("/attack.Streams/{method}").try_into().unwrap();
    let mut grpc = ready(client).await?;
    let call = grpc.server_streaming(request(name), path, ProstCodec::default());
    Ok(call.await?.into_inner())
}

pub(crate) async fn hello<T: Client>(client: T) -> Result<HelloReply, Status> {
    let path = http::uri::PathAndQuery::from_static("/helloworld.Greeter/SayHello");
    let mut grpc = ready(client).await?;
    let call = grpc.unary(request("a"), path, ProstCodec::default());
    Ok(call.await?.into_inner())
}

/// An `Echo` of what is sent into the sender, until it is dropped.
async fn echo(channel: &Channel) -> Result<(Sender, Streaming<HelloReply>), Status> {
    let (sender, messages) = futures::channel::mpsc::channel(4);
    let path = http::uri::PathAndQuery::from_static("/attack.Streams/Echo");
    let mut grpc = ready(channel.clone()).await?;
    let call = grpc.streaming(tonic::Request::new(messages), path, ProstCodec::default());
    Ok((sender, call.await?.into_inner()))
}

async fn send(sender: &mut Sender, name: &str) -> Result<(), Status> {
    let sent = sender.send(HelloRequest { name: name.into() }).await;
    sent.map_err(|e| Status::internal(e.to_string()))
}

/// Reads `stream` to its end, or `limit` messages: how many it read.
async fn read(stream: &mut Streaming<HelloReply>, limit: usize) -> Result<usize, Status> {
    let mut n = 0;
    while n < limit && stream.message().await?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// A refusal in the trailers of a stream that has begun, through a tonic `Channel` behind a
/// pushback reading trailers: held exactly what it says, or (2000 lines of metadata, which the
/// client may refuse to read) no more; never a panic.
#[tokio::test]
async fn a_trailer_reading_channel_holds_what_a_midstream_refusal_says() {
    let (_, channels) = serve!(tower::layer::util::Identity::new(), Arc::default(), 1);
    for (name, expected, exact) in [
        ("pushback:1500", 1500 * MS, true),
        ("retry:30", 30 * SECOND, true),
        ("pushback:-1", ZERO, true),
        ("pushback:banana", ZERO, true),
        ("pushback:99999999999999999999", ZERO, true),
        ("pushback:86400000", 600 * SECOND, true),
        ("none:", ZERO, true),
        ("junk:2000", 2 * SECOND, false),
    ] {
        let pushback = dependency(600 * SECOND);
        let client = pushback.layer().read_trailers().layer(channels[0].clone());
        let mut replies = open(client, "Fail", name).await.unwrap();
        let (last, held) = (
            read(&mut replies, 9).await.unwrap_err(),
            pushback.held_for(),
        );
        if exact {
            assert_eq!(last.code(), Code::ResourceExhausted, "{name}: {last:?}");
            assert_eq!(held, expected, "{name}");
        } else {
            assert!(held <= expected, "{name}: held {held:?}; {last:?}");
        }
    }
}

/// One call of a storm, by `kind`: streams dropped before their first message, after some, at
/// their end, hanging; a call future dropped after one poll; a unary call.
async fn storm_call(channel: &Channel, kind: usize) -> Result<(), Status> {
    let count = |n: &'static str| open(channel.clone(), "Count", n);
    match kind {
        0 => drop(count("1000000").await?),
        1 => drop(read(&mut count("1000000").await?, 3).await?),
        2 => match read(&mut count("5").await?, usize::MAX).await? {
            5 => {}
            n => return Err(Status::data_loss(format!("{n} of 5 replies"))),
        },
        3 => drop(echo(channel).await?),
        4 | 5 => {
            let (mut sender, mut echoes) = echo(channel).await?;
            for i in 0..3 {
                send(&mut sender, &i.to_string()).await?;
                read(&mut echoes, 1).await?;
            }
            if kind == 5 {
                drop(sender);
                read(&mut echoes, usize::MAX).await?;
            }
        }
        6 => drop(read(&mut open(channel.clone(), "Hang", "").await?, 1).await?),
        7 => drop(futures::poll!(Box::pin(count("1000000")))),
        _ => drop(hello(channel.clone()).await?),
    }
    Ok(())
}

/// A server bulkhead of 4 (named in UTF-8, with a `%`): four hanging streams fill it, and each
/// kind of call is `RESOURCE_EXHAUSTED` naming it. Then 40 tasks on 4 connections make 120
/// calls of every kind at once (a refused one tried again, up to 50 times); then a client
/// vanishes (its runtime dropped: its connection closes with no `RST_STREAM`) with three
/// streams open. At most 4 streams are ever open in the handlers, every refusal names the
/// bulkhead, nothing else fails, and every permit comes back exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_bulkhead_gives_every_streams_permit_back_once_under_a_storm() {
    const NAME: &str = "streams ü%";
    let bulkhead = Bulkhead::semaphore(NAME, 4).build();
    let gauge = Arc::new(Gauge::default());
    let (addr, channels) = serve!(bulkhead.body_layer(), gauge.clone(), 4);
    let is_full = format!("bulkhead `{NAME}` is full");
    let full = move |s: &Status| s.code() == Code::ResourceExhausted && s.message() == is_full;
    let mut hanging = Vec::new();
    for channel in &channels {
        hanging.push(open(channel.clone(), "Hang", "").await.unwrap());
        assert_eq!(read(hanging.last_mut().unwrap(), 1).await.unwrap(), 1);
    }
    let refused = [
        open(channels[0].clone(), "Count", "3").await.unwrap_err(),
        echo(&channels[1]).await.unwrap_err(),
        hello(channels[2].clone()).await.unwrap_err(),
    ];
    assert!(refused.iter().all(&full), "{refused:?}");
    drop(hanging);
    until_free(&bulkhead).await;

    let outcomes = (0..40).map(|task: usize| {
        let (channel, full) = (channels[task % 4].clone(), full.clone());
        tokio::spawn(async move {
            let (mut refused, mut unexpected) = (0, Vec::new());
            for kind in (0..3).map(|round| (task * 7 + round * 3) % 9) {
                for _ in 0..50 {
                    match storm_call(&channel, kind).await {
                        Err(status) if full(&status) => refused += 1,
                        Err(status) => unexpected.push((kind, status)),
                        Ok(()) => break,
                    }
                    tokio::task::yield_now().await;
                }
            }
            (refused, unexpected)
        })
    });
    let (mut refused, mut unexpected) = (3, Vec::new());
    for outcome in futures::future::join_all(outcomes).await {
        let (seen, failed) = outcome.unwrap();
        refused += seen;
        unexpected.extend(failed);
    }
    until_free(&bulkhead).await;
    let permitted = bulkhead.snapshot().total_permitted;

    let held = bulkhead.clone();
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let streams = runtime.block_on(async {
            let channel = crate::grpc::channel(addr).await;
            let mut hang = open(channel.clone(), "Hang", "").await.unwrap();
            let mut count = open(channel.clone(), "Count", "1000000").await.unwrap();
            let (mut sender, mut echoes) = echo(&channel).await.unwrap();
            send(&mut sender, "x").await.unwrap();
            for stream in [&mut hang, &mut count, &mut echoes] {
                assert_eq!(read(stream, 1).await.unwrap(), 1);
            }
            (hang, count, sender, echoes, channel)
        });
        assert_eq!(held.snapshot().available_concurrent_calls, 1);
        drop(runtime);
        drop(streams);
    })
    .await
    .unwrap();
    until_free(&bulkhead).await;

    assert!(unexpected.is_empty(), "{unexpected:?}");
    let s = bulkhead.snapshot();
    let counts = (s.total_permitted, s.total_finished, s.queue_depth);
    assert_eq!(counts, (permitted + 3, permitted + 3, 0), "{s:?}");
    assert!(
        s.total_rejected >= refused,
        "{s:?}: {refused} refusals seen"
    );
    let open = (gauge.0.load(SeqCst), gauge.1.load(SeqCst));
    assert_eq!(
        open,
        (0, 4),
        "streams open in the handlers now, and at most"
    );
}

/// 64 tasks on 4 connections race unary, server-streaming and bidirectional calls into a quota
/// of 10 a minute on a clock that stands still: exactly 10 are admitted (and complete), and
/// each of the other 54 is `RESOURCE_EXHAUSTED` naming the policy, with a
/// `grpc-retry-pushback-ms` of a positive whole number of milliseconds (6 s: one call's refill).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_streaming_and_unary_calls_admit_exactly_the_quota() {
    let quota = Quota::per_minute(10).unwrap();
    let limiter = KeyedRateLimiter::<()>::builder(quota).clock(ManualClock::new());
    let layer = RateLimitLayer::new(Policy::new("race", GlobalKey, limiter.build()).unwrap());
    let (_, channels) = serve!(layer.wrap_body(), Arc::default(), 4);
    let start = Arc::new(tokio::sync::Barrier::new(64));
    let tasks = (0..64).map(|task| {
        let (channel, start) = (channels[task % 4].clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            match task % 3 {
                0 => hello(channel).await.map(drop),
                1 => storm_call(&channel, 2).await,
                _ => storm_call(&channel, 5).await,
            }
        })
    });
    let (mut admitted, mut refused) = (0, 0);
    for outcome in futures::future::join_all(tasks).await {
        let Err(status) = outcome.unwrap() else {
            admitted += 1;
            continue;
        };
        refused += 1;
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("race"), "{status:?}");
        let value = status.metadata().get(PUSHBACK);
        let pushback = value.and_then(|v| v.to_str().ok()).unwrap_or_default();
        let whole = !pushback.starts_with('0') && pushback.bytes().all(|b| b.is_ascii_digit());
        let positive = pushback.parse::<u64>().is_ok_and(|ms| ms > 0);
        assert!(whole && positive, "{pushback:?}");
        assert_eq!(pushback, "6000");
    }
    assert_eq!((admitted, refused), (10, 54));
    let after = hello(channels[0].clone()).await.unwrap_err();
    assert_eq!(after.code(), Code::ResourceExhausted, "{after:?}");
}

/// One call every 10 ms, on a manual clock: a streaming call refused 10 ms, then 4.999999 ms,
/// then 1 ns before the next is due says 10, 5 and 1 ms ("never 0"), with a `RetryInfo` that
/// is not zero and not longer; 1 ns later a call goes.
#[tokio::test]
async fn a_refusal_a_nanosecond_before_its_end_still_says_to_wait() {
    let clock = ManualClock::new();
    let quota = Quota::with_period(1, 10 * MS).unwrap();
    let limiter = KeyedRateLimiter::<()>::builder(quota).clock(clock.clone());
    let layer = RateLimitLayer::new(Policy::new("tight", GlobalKey, limiter.build()).unwrap());
    let (_, channels) = serve!(layer.wrap_body(), Arc::default(), 1);
    let channel = &channels[0];
    hello(channel.clone()).await.unwrap();
    for (advance, expected) in [(0, "10"), (5_000_001, "5"), (4_999_998, "1")] {
        clock.advance(Duration::from_nanos(advance));
        let refused = open(channel.clone(), "Count", "1").await.unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        assert_eq!(refused.metadata().get(PUSHBACK).unwrap(), expected);
        let info = refused.get_error_details().retry_info().cloned();
        let (delay, most) = (
            info.and_then(|i| i.retry_delay),
            MS * expected.parse().unwrap(),
        );
        assert!(delay.is_some_and(|d| d > ZERO && d <= most), "{delay:?}");
    }
    clock.advance(Duration::from_nanos(1));
    let mut admitted = open(channel.clone(), "Count", "1").await.unwrap();
    assert_eq!(read(&mut admitted, 9).await.unwrap(), 1);
}

/// Client bulkheads of 2 on a tonic `Channel` (refusing at once, waiting 1 ms, and queueing
/// one call), alone and below a pushback reading trailers: with two streams open through one,
/// calls fail with `RESOURCE_EXHAUSTED` naming it, reach no handler and set no hold; a queued
/// call goes when a stream ends, and every permit comes back.
#[tokio::test]
async fn a_client_bulkhead_on_a_channel_refuses_with_resource_exhausted_naming_it() {
    let gauge = Arc::new(Gauge::default());
    let (_, channels) = serve!(tower::layer::util::Identity::new(), gauge.clone(), 1);
    let waits = Bulkhead::semaphore("client-side", 2).max_wait(MS);
    let bulkheads = [
        (Bulkhead::semaphore("client-side", 2).build(), false),
        (waits.build(), false),
        (Bulkhead::queue("client-side", 2, 1).build(), true),
    ];
    for (bulkhead, queues) in bulkheads {
        let client = bulkhead.body_layer().layer(channels[0].clone());
        let pushback = dependency(600 * SECOND);
        let above = pushback.layer().read_trailers().layer(client.clone());
        let mut hanging = Vec::new();
        for _ in 0..2 {
            hanging.push(open(client.clone(), "Hang", "").await.unwrap());
            assert_eq!(read(hanging.last_mut().unwrap(), 1).await.unwrap(), 1);
        }
        let queued = queues.then(|| tokio::spawn(hello(above.clone())));
        let depth = || bulkhead.snapshot().queue_depth == usize::from(queues);
        until("one call queued", depth).await;
        let refused = [
            hello(client.clone()).await.unwrap_err(),
            open(client.clone(), "Count", "3").await.unwrap_err(),
            hello(above.clone()).await.unwrap_err(),
            open(above.clone(), "Count", "3").await.unwrap_err(),
        ];
        for status in &refused {
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            let named = status.message().contains("bulkhead `client-side` is full");
            assert!(named, "{status:?}");
        }
        assert_eq!(pushback.held_for(), ZERO);
        assert_eq!(gauge.1.load(SeqCst), 2, "refused calls reached no handler");
        drop(hanging);
        if let Some(queued) = queued {
            queued.await.unwrap().unwrap();
        }
        until_free(&bulkhead).await;
        hello(above).await.unwrap();
        let snapshot = bulkhead.snapshot();
        let permitted = 3 + u64::from(queues);
        let counts = (snapshot.total_permitted, snapshot.total_finished);
        assert_eq!(counts, (permitted, permitted), "{snapshot:?}");
        assert_eq!(snapshot.total_rejected, 4, "{snapshot:?}");
    }
}
