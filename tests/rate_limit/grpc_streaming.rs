//! Streaming gRPC calls through the rate-limit layer and a server-side bulkhead (feature `grpc`),
//! on a tonic server over a real listener: a server-streaming and a bidirectional call are each
//! decided once, at their start, and a bulkhead's permit is held until the stream ends, read to
//! its end or dropped; a call the full bulkhead refuses is `RESOURCE_EXHAUSTED`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{SinkExt, Stream, StreamExt};
use http::uri::PathAndQuery;
use tonic::codegen::Service;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status, Streaming};
use tonic_types::{ErrorDetails, StatusExt};
use tower::Layer;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::{self, Pushback};
use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
use tower_bulwark::{Bulkhead, KeyedRateLimiter, Quota};

use crate::grpc::say_hello;
use crate::grpc_example::grpc::{Greeter, HelloReply, HelloRequest};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Replies = Pin<Box<dyn Stream<Item = Result<HelloReply, Status>> + Send>>;

/// `test.Streams`: `Count` answers a request naming a number with that many replies;
/// `Echo` answers each message of the call's stream with one reply, until the caller ends it.
#[derive(Clone, Default)]
pub(crate) struct Streams;

impl tonic::server::NamedService for Streams {
    const NAME: &'static str = "test.Streams";
}

struct Count;

impl tonic::server::ServerStreamingService<HelloRequest> for Count {
    type Response = HelloReply;
    type ResponseStream = Replies;
    type Future = BoxFuture<Result<tonic::Response<Replies>, Status>>;

    fn call(&mut self, request: tonic::Request<HelloRequest>) -> Self::Future {
        Box::pin(async move {
            let n: usize = request
                .into_inner()
                .name
                .parse()
                .map_err(|_| Status::invalid_argument("not a number"))?;
            let replies = futures::stream::iter(0..n).map(|i| {
                Ok(HelloReply {
                    message: i.to_string(),
                })
            });
            Ok(tonic::Response::new(Box::pin(replies) as Replies))
        })
    }
}

/// One reply, then `RESOURCE_EXHAUSTED` in the trailers, with its delay as the request names it:
/// `retry-info` a `RetryInfo` of 30 s, `pushback` a `grpc-retry-pushback-ms` of 20 s.
struct Fail;

impl tonic::server::ServerStreamingService<HelloRequest> for Fail {
    type Response = HelloReply;
    type ResponseStream = Replies;
    type Future = BoxFuture<Result<tonic::Response<Replies>, Status>>;

    fn call(&mut self, request: tonic::Request<HelloRequest>) -> Self::Future {
        let status = if request.into_inner().name == "retry-info" {
            let details = ErrorDetails::with_retry_info(Some(Duration::from_secs(30)));
            Status::with_error_details(Code::ResourceExhausted, "slow down", details)
        } else {
            let mut status = Status::resource_exhausted("slow down");
            (status.metadata_mut()).insert("grpc-retry-pushback-ms", "20000".parse().unwrap());
            status
        };
        let replies = futures::stream::iter([
            Ok(HelloReply {
                message: "first".into(),
            }),
            Err(status),
        ]);
        Box::pin(async move { Ok(tonic::Response::new(Box::pin(replies) as Replies)) })
    }
}

struct Echo;

impl tonic::server::StreamingService<HelloRequest> for Echo {
    type Response = HelloReply;
    type ResponseStream = Replies;
    type Future = BoxFuture<Result<tonic::Response<Replies>, Status>>;

    fn call(&mut self, request: tonic::Request<Streaming<HelloRequest>>) -> Self::Future {
        let replies = request.into_inner().map(|message| {
            message.map(|m| HelloReply {
                message: format!("echo {}", m.name),
            })
        });
        Box::pin(async move { Ok(tonic::Response::new(Box::pin(replies) as Replies)) })
    }
}

impl Service<http::Request<tonic::body::Body>> for Streams {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(match request.uri().path() {
                "/test.Streams/Count" => grpc.server_streaming(Count, request).await,
                "/test.Streams/Echo" => grpc.streaming(Echo, request).await,
                "/test.Streams/Fail" => grpc.server_streaming(Fail, request).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

/// A `Count` of `n` replies.
async fn count(channel: &Channel, n: usize) -> Result<Streaming<HelloReply>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let request = tonic::Request::new(HelloRequest {
        name: n.to_string(),
    });
    let path = PathAndQuery::from_static("/test.Streams/Count");
    let response = grpc
        .server_streaming(request, path, tonic_prost::ProstCodec::default())
        .await?;
    Ok(response.into_inner())
}

/// An `Echo` of the messages sent into the returned sender, until it is dropped.
pub(crate) async fn echo(
    channel: &Channel,
) -> Result<
    (
        futures::channel::mpsc::Sender<HelloRequest>,
        Streaming<HelloReply>,
    ),
    Status,
> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let (sender, messages) = futures::channel::mpsc::channel(4);
    let path = PathAndQuery::from_static("/test.Streams/Echo");
    let response = grpc
        .streaming(
            tonic::Request::new(messages),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await?;
    Ok((sender, response.into_inner()))
}

async fn send(sender: &mut futures::channel::mpsc::Sender<HelloRequest>, name: &str) {
    sender
        .send(HelloRequest { name: name.into() })
        .await
        .unwrap();
}

/// Every message of `stream`, read to its end.
async fn read_to_end(mut stream: Streaming<HelloReply>) -> Vec<String> {
    let mut messages = Vec::new();
    while let Some(reply) = stream.message().await.unwrap() {
        messages.push(reply.message);
    }
    messages
}

/// Serves `Streams` and the greeter on a free loopback port, behind the layer `$layer`.
macro_rules! serve {
    ($layer:expr) => {{
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.map(|(stream, _)| stream);
            Some((accepted, listener))
        });
        let routes = tonic::service::Routes::new(Streams).add_service(Greeter);
        tokio::spawn(
            Server::builder()
                .layer($layer)
                .add_routes(routes)
                .serve_with_incoming(incoming),
        );
        addr
    }};
}

/// Waits, a bounded time, for `bulkhead` to have every permit free again: the server gives a
/// stream's permit back in its own task, after the client has seen the end.
async fn until_free(bulkhead: &Bulkhead) {
    for _ in 0..2000 {
        let snapshot = bulkhead.snapshot();
        if snapshot.available_concurrent_calls == snapshot.max_allowed_concurrent_calls {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the permit was not given back: {:?}", bulkhead.snapshot());
}

/// Three calls a minute (a manual clock: no permit comes back): a server-streaming call of 50
/// replies and a bidirectional call of 50 messages each spend one permit, at their start, so a
/// unary call still has the third; the next streaming calls are refused before anything streams.
#[tokio::test]
async fn a_streaming_call_is_decided_once_at_its_start() {
    let limiter = KeyedRateLimiter::<()>::builder(Quota::per_minute(3).unwrap())
        .clock(ManualClock::new())
        .build();
    let layer = RateLimitLayer::new(Policy::new("calls", GlobalKey, limiter).unwrap());
    let addr = serve!(layer.wrap_body());
    let channel = crate::grpc::channel(addr).await;

    let counted = read_to_end(count(&channel, 50).await.unwrap()).await;
    assert_eq!(counted.len(), 50);

    let (mut sender, mut echoes) = echo(&channel).await.unwrap();
    for i in 0..50 {
        send(&mut sender, &i.to_string()).await;
        let reply = echoes.message().await.unwrap().unwrap();
        assert_eq!(reply.message, format!("echo {i}"));
    }
    drop(sender);
    assert!(echoes.message().await.unwrap().is_none());

    assert!(say_hello(&channel, &[]).await.is_ok());
    let refused = count(&channel, 50).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let refused = echo(&channel).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
}

/// A bulkhead of one call on the server, layered as bodies: while a bidirectional stream is
/// open, every other call (unary or streaming) is `RESOURCE_EXHAUSTED` naming the bulkhead; the
/// permit comes back when the stream is read to its end, and when a client drops a
/// server-streaming call midway; each permitted call finishes exactly once.
#[tokio::test]
async fn a_server_bulkhead_holds_a_streams_permit_until_it_ends() {
    let bulkhead = Bulkhead::semaphore("streams", 1).build();
    let addr = serve!(bulkhead.body_layer());
    let channel = crate::grpc::channel(addr).await;

    let (mut sender, mut echoes) = echo(&channel).await.unwrap();
    send(&mut sender, "open").await;
    assert_eq!(
        echoes.message().await.unwrap().unwrap().message,
        "echo open"
    );
    let full = say_hello(&channel, &[]).await.unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    assert!(
        full.message().contains("bulkhead `streams` is full"),
        "{}",
        full.message()
    );
    assert_eq!(
        count(&channel, 3).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    assert_eq!(
        echo(&channel).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    // Still open: its messages still flow.
    send(&mut sender, "still").await;
    assert_eq!(
        echoes.message().await.unwrap().unwrap().message,
        "echo still"
    );
    drop(sender);
    assert!(read_to_end(echoes).await.is_empty());
    until_free(&bulkhead).await;
    assert!(say_hello(&channel, &[]).await.is_ok());

    // A server-streaming call the client drops after its first reply.
    let mut counting = count(&channel, 1_000_000).await.unwrap();
    assert_eq!(counting.message().await.unwrap().unwrap().message, "0");
    assert_eq!(
        say_hello(&channel, &[]).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    drop(counting);
    until_free(&bulkhead).await;
    assert!(say_hello(&channel, &[]).await.is_ok());

    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.total_permitted, 4, "{snapshot:?}");
    assert_eq!(snapshot.total_rejected, 4, "{snapshot:?}");
    assert_eq!(snapshot.total_finished, 4, "{snapshot:?}");
}

/// A `Fail` call through `client`: its first reply, then the status its trailers hold.
async fn fail<T>(client: T, delay: &str) -> Status
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower_bulwark::BoxError> + Send,
    T::Error: Into<tower_bulwark::BoxError>,
{
    let mut grpc = tonic::client::Grpc::new(client);
    grpc.ready().await.map_err(Into::into).unwrap();
    let request = tonic::Request::new(HelloRequest { name: delay.into() });
    let path = PathAndQuery::from_static("/test.Streams/Fail");
    let mut replies = grpc
        .server_streaming::<_, HelloReply, _>(request, path, tonic_prost::ProstCodec::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replies.message().await.unwrap().unwrap().message, "first");
    replies.message().await.unwrap_err()
}

/// A dependency that refuses a call after it has begun to answer says so in trailers: a
/// pushback that reads them holds calls for the delay of their `RetryInfo`, or of their
/// `grpc-retry-pushback-ms`, and the next call through it fails at once with the time left; one
/// that reads heads only has nothing to go by.
#[tokio::test]
async fn a_pushback_reading_trailers_holds_calls_for_a_refusal_that_comes_last() {
    let addr = serve!(tower::layer::util::Identity::new());
    let channel = crate::grpc::channel(addr).await;
    let clock = ManualClock::new();

    let heads_only = Pushback::builder("heads").clock(clock.clone()).build();
    let status = fail(heads_only.layer().layer(channel.clone()), "retry-info").await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(heads_only.held_for(), Duration::ZERO);

    for (delay, wait) in [("retry-info", 30), ("pushback", 20)] {
        let pushback = Pushback::builder("streams").clock(clock.clone()).build();
        let client = pushback.layer().read_trailers().layer(channel.clone());
        let status = fail(client.clone(), delay).await;
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert_eq!(pushback.held_for(), Duration::from_secs(wait), "{delay}");
        let mut grpc = tonic::client::Grpc::new(client);
        grpc.ready().await.unwrap();
        let request = tonic::Request::new(HelloRequest { name: "x".into() });
        let path = PathAndQuery::from_static("/helloworld.Greeter/SayHello");
        let held = grpc
            .unary::<_, HelloReply, _>(request, path, tonic_prost::ProstCodec::default())
            .await
            .unwrap_err();
        assert_eq!(
            outbound::retry_after(&held),
            Some(Duration::from_secs(wait)),
            "{held:?}"
        );
    }
}

/// A client quota on a tonic `Channel`, keyed by the method a call names (two calls a minute
/// each), above a client-side bulkhead of one call: a third `SayHello` fails at once with the
/// `QuotaExhausted` as its status's source and the wait it names, while `Echo` has its own two;
/// a call the bulkhead refuses (a stream holds its permit) is `RESOURCE_EXHAUSTED` and gives
/// its quota permit back, since it never went out.
#[tokio::test]
async fn a_client_quota_on_a_channel_counts_calls_per_method_and_only_those_sent() {
    use tower_bulwark::outbound::{ClientQuotaLayer, QuotaExhausted};

    let addr = serve!(tower::layer::util::Identity::new());
    let limiter = KeyedRateLimiter::<String>::builder(Quota::per_minute(2).unwrap())
        .clock(ManualClock::new())
        .build();
    let bulkhead = Bulkhead::semaphore("channel", 1).build();
    let client = ClientQuotaLayer::new("greeter", limiter)
        .key(|request: &http::Request<tonic::body::Body>| request.uri().path().to_owned())
        .layer(
            bulkhead
                .body_layer()
                .layer(crate::grpc::channel(addr).await),
        );
    let hello = || {
        let mut grpc = tonic::client::Grpc::new(client.clone());
        async move {
            grpc.ready().await.unwrap();
            let request = tonic::Request::new(HelloRequest { name: "q".into() });
            let path = PathAndQuery::from_static("/helloworld.Greeter/SayHello");
            grpc.unary::<_, HelloReply, _>(request, path, tonic_prost::ProstCodec::default())
                .await
        }
    };

    // An open `Echo` holds the bulkhead's one permit: this `SayHello` never goes out.
    let mut grpc = tonic::client::Grpc::new(client.clone());
    grpc.ready().await.unwrap();
    let (mut sender, messages) = futures::channel::mpsc::channel(4);
    let path = PathAndQuery::from_static("/test.Streams/Echo");
    let mut echoes = grpc
        .streaming::<_, _, HelloReply, _>(
            tonic::Request::new(messages),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap()
        .into_inner();
    send(&mut sender, "open").await;
    assert_eq!(
        echoes.message().await.unwrap().unwrap().message,
        "echo open"
    );
    let full = hello().await.unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    drop(sender);
    assert!(read_to_end(echoes).await.is_empty());
    until_free(&bulkhead).await;

    // The refused call's permit came back: two calls still go.
    hello().await.unwrap();
    hello().await.unwrap();
    let spent = hello().await.unwrap_err();
    let mut chain = std::iter::successors(Some(&spent as &dyn std::error::Error), |e| e.source());
    assert!(chain.any(|e| e.is::<QuotaExhausted>()), "{spent:?}");
    assert_eq!(outbound::retry_after(&spent), Some(Duration::from_secs(30)));
    assert_eq!(
        bulkhead.snapshot().total_permitted,
        3,
        "the spent call went nowhere"
    );
}
