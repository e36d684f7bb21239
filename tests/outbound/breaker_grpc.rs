//! A tonic client behind a breaker (features `adaptive` and `grpc`), against a tonic server on
//! a real listener: the server's `RESOURCE_EXHAUSTED` answers open the breaker, and the calls it
//! then refuses come back from tonic as `UNAVAILABLE` with the delay, in a `RetryInfo` and in
//! `grpc-retry-pushback-ms`.

use std::net::SocketAddr;
use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tonic_types::StatusExt;
use tower_bulwark::algorithm::Gcra;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::observe::Observed;
use tower_bulwark::outbound::breaker::{Breaker, BreakerState, Window};
use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
use tower_bulwark::{outbound, KeyedRateLimiter, Quota};

#[path = "../../examples/grpc.rs"]
#[allow(dead_code)]
mod grpc;

use grpc::{Greeter, HelloReply, HelloRequest};

/// The greeter behind a rate limit of two calls a minute on a frozen clock, on a free port;
/// the limiter, observed, counts the calls that reached the server.
async fn serve() -> (
    SocketAddr,
    Observed<KeyedRateLimiter<(), Gcra, ManualClock>>,
) {
    let limiter = KeyedRateLimiter::<()>::builder(Quota::per_minute(2).unwrap())
        .clock(ManualClock::new())
        .build();
    let observed = Observed::new("greeter", limiter);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        Some((listener.accept().await.map(|(stream, _)| stream), listener))
    });
    let policy = Policy::new("greeter", GlobalKey, observed.clone()).unwrap();
    tokio::spawn(
        Server::builder()
            .layer(RateLimitLayer::new(policy).wrap_body())
            .add_service(Greeter)
            .serve_with_incoming(incoming),
    );
    (addr, observed)
}

#[tokio::test]
async fn a_tonic_client_behind_an_open_breaker_gets_unavailable_with_the_delay() {
    let (addr, observed) = serve().await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let clock = ManualClock::new();
    let breaker = Breaker::builder("greeter")
        .window(Window::Calls(4))
        .minimum_calls(4)
        .open_for(Duration::from_millis(2_500))
        .clock(clock.clone())
        .build()
        .unwrap();
    let client = tower::Layer::layer(&breaker.layer(), channel);
    let call = || {
        let mut grpc = tonic::client::Grpc::new(client.clone());
        async move {
            grpc.ready().await.map_err(Status::from_error)?;
            let request = tonic::Request::new(HelloRequest { name: "b".into() });
            let path = PathAndQuery::from_static("/helloworld.Greeter/SayHello");
            grpc.unary::<_, HelloReply, _>(request, path, tonic_prost::ProstCodec::default())
                .await
        }
    };
    // Two answers, then two refusals by the server: half the window failed.
    call().await.unwrap();
    call().await.unwrap();
    for _ in 0..2 {
        assert_eq!(call().await.unwrap_err().code(), Code::ResourceExhausted);
    }
    assert_eq!(
        breaker.state(),
        BreakerState::Open {
            until: Duration::from_millis(2_500)
        }
    );

    clock.advance(Duration::from_millis(1_000));
    let refused = call().await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused
        .message()
        .contains("circuit breaker `greeter` is open"));
    let wait = Some(Duration::from_millis(1_500));
    assert_eq!(
        refused.get_details_retry_info().and_then(|i| i.retry_delay),
        wait
    );
    let pushback = refused.metadata().get("grpc-retry-pushback-ms");
    assert_eq!(pushback.unwrap(), "1500");
    assert_eq!(outbound::retry_after(&refused), wait);
    let snapshot = observed.snapshot();
    assert_eq!(
        (snapshot.allowed, snapshot.limited),
        (2, 2),
        "the refused call never reached the server"
    );
}
