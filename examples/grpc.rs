//! A tonic gRPC server limited per peer IP, and a tonic client that obeys its refusals.
//!
//! ```sh
//! cargo run --example grpc --features grpc              # serves on ADDR (127.0.0.1:50051)
//! cargo run --example grpc --features grpc -- --client  # 20 calls through Pushback
//! ```
//!
//! The server is the canonical `helloworld.Greeter/SayHello` (`HelloRequest { string name = 1; }`,
//! `HelloReply { string message = 1; }`, written with prost's derive: no `protoc`), limited to 5
//! calls a second per peer IP with a burst of 5. A call over the limit is answered
//! `RESOURCE_EXHAUSTED` with the delay in `grpc-retry-pushback-ms` and a `RetryInfo`.
//!
//! The client sends 20 calls as fast as it can through `Pushback`, which reads the server's
//! answers (its `RateLimit` fields, and any refusal's delay) and holds calls back for up to two
//! seconds. It prints `RESULT ok=N refused=M early_calls=K`: early calls are calls that went out
//! while a refusal's delay the client had read was still running (0 expected).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use tonic::codegen::Service;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tower::ServiceExt;
use tower_bulwark::outbound::{self, Pushback};
use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{BoxError, KeyedRateLimiter, Quota};

/// `helloworld.HelloRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloRequest {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `helloworld.HelloReply`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloReply {
    #[prost(string, tag = "1")]
    pub message: String,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The greeter, as tonic's generated code would serve it.
#[derive(Clone, Default)]
pub struct Greeter;

impl tonic::server::NamedService for Greeter {
    const NAME: &'static str = "helloworld.Greeter";
}

struct SayHello;

impl tonic::server::UnaryService<HelloRequest> for SayHello {
    type Response = HelloReply;
    type Future = BoxFuture<Result<tonic::Response<HelloReply>, Status>>;

    fn call(&mut self, request: tonic::Request<HelloRequest>) -> Self::Future {
        let message = format!("Hello {}!", request.into_inner().name);
        Box::pin(async move { Ok(tonic::Response::new(HelloReply { message })) })
    }
}

impl Service<http::Request<tonic::body::Body>> for Greeter {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            if request.uri().path() != "/helloworld.Greeter/SayHello" {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(SayHello, request).await)
        })
    }
}

/// Serves the greeter, 5 calls a second per peer IP (burst 5), on `listener`.
pub async fn serve(listener: tokio::net::TcpListener) -> Result<(), BoxError> {
    let per_ip = KeyedRateLimiter::new(Quota::per_second(5)?.with_burst(5)?);
    let policy = Policy::new("per-ip", PeerIp::new(), per_ip)?;
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    Server::builder()
        .layer(RateLimitLayer::new(policy).wrap_body())
        .add_service(Greeter)
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

/// What the client saw.
#[derive(Debug, Default)]
pub struct Outcome {
    pub ok: usize,
    pub refused: usize,
    pub early_calls: usize,
}

/// Sends 20 calls to `addr` as fast as they go, through a `Pushback` that may hold each for up
/// to two seconds.
pub async fn run_client(addr: SocketAddr) -> Result<Outcome, BoxError> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    // Until when a refusal the client has read asked it to wait.
    let hold_until: Arc<Mutex<Option<Instant>>> = Arc::default();
    let early = Arc::new(Mutex::new(0));
    // Below the pushback: what actually goes out, checked against the refusals read so far.
    let witness = {
        let (hold_until, early) = (Arc::clone(&hold_until), Arc::clone(&early));
        tower::service_fn(move |request: http::Request<tonic::body::Body>| {
            if hold_until
                .lock()
                .unwrap()
                .is_some_and(|until| Instant::now() < until)
            {
                *early.lock().unwrap() += 1;
            }
            channel.clone().oneshot(request)
        })
    };
    let pushback = Pushback::builder("greeter")
        .max_wait(Duration::from_secs(2))
        .build();
    let client = tower::Layer::layer(&pushback.layer(), witness);
    let mut outcome = Outcome::default();
    for i in 0..20 {
        let mut grpc = tonic::client::Grpc::new(client.clone());
        grpc.ready()
            .await
            .map_err(|e| Status::unknown(e.to_string()))?;
        let request = tonic::Request::new(HelloRequest {
            name: format!("call {i}"),
        });
        let path = PathAndQuery::from_static("/helloworld.Greeter/SayHello");
        match grpc
            .unary::<_, HelloReply, _>(request, path, tonic_prost::ProstCodec::default())
            .await
        {
            Ok(_) => outcome.ok += 1,
            Err(status) => {
                if status.code() == Code::ResourceExhausted {
                    outcome.refused += 1;
                }
                if let Some(wait) = outbound::retry_after(&status) {
                    *hold_until.lock().unwrap() = Some(Instant::now() + wait);
                }
            }
        }
    }
    outcome.early_calls = *early.lock().unwrap();
    Ok(outcome)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr: SocketAddr = std::env::var("ADDR")
        .unwrap_or_else(|_| "127.0.0.1:50051".into())
        .parse()?;
    if std::env::args().any(|arg| arg == "--client") {
        let outcome = run_client(addr).await?;
        println!(
            "RESULT ok={} refused={} early_calls={}",
            outcome.ok, outcome.refused, outcome.early_calls
        );
        return Ok(());
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("helloworld.Greeter limited to 5 calls a second per peer IP (burst 5)");
    println!("listening on {}", listener.local_addr()?);
    serve(listener).await
}
