//! gRPC calls through the rate-limit layer (feature `grpc`): a tonic server on a real listener,
//! the canonical `helloworld.Greeter/SayHello` (messages with prost's derive), called by tonic's
//! client. A refusal is a gRPC `RESOURCE_EXHAUSTED` with the delay in `grpc-retry-pushback-ms`
//! and a decodable `RetryInfo`, beside a `QuotaFailure` naming the policy; the layer's other
//! answers are gRPC statuses too. The greeter is `examples/grpc.rs`'s.

use std::net::SocketAddr;
use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tonic_types::StatusExt;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{
    GlobalKey, HeaderKey, Policy, PolicySet, RateLimitLayer, WrapBody,
};
use tower_bulwark::{KeyedRateLimiter, Quota};

// The greeter and its messages are the example's: one copy serves both.
use crate::grpc_example::grpc::{Greeter, HelloReply, HelloRequest};

/// Serves the greeter behind `layer` on a free loopback port.
pub async fn serve<P: PolicySet>(layer: RateLimitLayer<P, WrapBody>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream_of(listener);
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(Greeter)
            .serve_with_incoming(incoming),
    );
    addr
}

/// The listener's connections as the stream tonic serves.
pub(crate) fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

/// One `SayHello` through tonic's client, with `metadata` added.
pub async fn say_hello(
    channel: &Channel,
    metadata: &[(&'static str, &'static str)],
) -> Result<tonic::Response<HelloReply>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(e.to_string()))?;
    let mut request = tonic::Request::new(HelloRequest {
        name: "bulwark".into(),
    });
    for (name, value) in metadata {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    let path = PathAndQuery::from_static("/helloworld.Greeter/SayHello");
    grpc.unary(request, path, tonic_prost::ProstCodec::default())
        .await
}

/// A gRPC channel connected to the server at `addr`.
pub(crate) async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Five a minute, then the sixth call is `RESOURCE_EXHAUSTED`: the message names the policy,
/// `grpc-retry-pushback-ms` is the exact wait in whole milliseconds (12 s, for one call every
/// 12 s), the details hold a `RetryInfo` of the same delay and a `QuotaFailure` naming the
/// policy, and the draft-11 fields are in the metadata.
#[tokio::test]
async fn the_sixth_rapid_call_is_resource_exhausted_with_its_retry_delay() {
    let clock = ManualClock::new();
    let limiter = KeyedRateLimiter::<()>::builder(Quota::per_minute(5).unwrap())
        .clock(clock)
        .build();
    let policy = Policy::new("greeter", GlobalKey, limiter).unwrap();
    let addr = serve(RateLimitLayer::new(policy).wrap_body()).await;
    let channel = channel(addr).await;
    for i in 0..5 {
        let reply = say_hello(&channel, &[]).await.unwrap();
        assert_eq!(reply.get_ref().message, "Hello bulwark!", "call {i}");
        assert!(reply.metadata().get("ratelimit").is_some());
    }
    let refused = say_hello(&channel, &[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("greeter"),
        "{}",
        refused.message()
    );
    let pushback = refused.metadata().get("grpc-retry-pushback-ms").unwrap();
    assert_eq!(pushback, "12000");
    let details = refused.get_error_details();
    let retry = details.retry_info().expect("a RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(12)));
    let quota = details.quota_failure().expect("a QuotaFailure");
    assert_eq!(quota.violations.len(), 1);
    assert_eq!(quota.violations[0].subject, "greeter");
    let fields = refused
        .metadata()
        .get("ratelimit")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(fields.contains("\"greeter\";r=0;t=12"), "{fields}");
}

/// A refusal hook that answers only some requests itself falls back to the layer's answer with
/// `Refusal::default_response`: for a gRPC call, the same `RESOURCE_EXHAUSTED` with its
/// `RetryInfo` as without a hook, and `Refusal::retry_after` is the exact wait (12 s).
#[tokio::test]
async fn a_refusal_hook_falls_back_to_the_grpc_answer() {
    use std::sync::{Arc, Mutex};
    use tower_bulwark::rate_limit::Refusal;

    let limiter = KeyedRateLimiter::<()>::builder(Quota::per_minute(5).unwrap())
        .clock(ManualClock::new())
        .build();
    let policy = Policy::new("greeter", GlobalKey, limiter).unwrap();
    let waits = Arc::new(Mutex::new(Vec::new()));
    let seen = waits.clone();
    let layer = RateLimitLayer::new(policy)
        .on_refusal(move |refusal: &Refusal<'_>| {
            seen.lock().unwrap().push(refusal.retry_after());
            refusal.default_response()
        })
        .wrap_body();
    let channel = channel(serve(layer).await).await;
    for _ in 0..5 {
        say_hello(&channel, &[]).await.unwrap();
    }
    let refused = say_hello(&channel, &[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let retry = refused.get_error_details().retry_info().cloned();
    assert_eq!(
        retry.and_then(|r| r.retry_delay),
        Some(Duration::from_secs(12))
    );
    assert_eq!(*waits.lock().unwrap(), [Some(Duration::from_secs(12))]);
}

/// The layer's other answers to a gRPC call are gRPC statuses: a missing key is
/// `INVALID_ARGUMENT` with the reason; a call costing more than the quota can ever admit is
/// `RESOURCE_EXHAUSTED` with a negative pushback (do not retry) and no `RetryInfo`.
#[tokio::test]
async fn the_layers_other_answers_are_grpc_statuses() {
    let tenants = Policy::new(
        "per-tenant",
        HeaderKey::new("x-tenant").unwrap(),
        KeyedRateLimiter::new(Quota::per_minute(5).unwrap()),
    )
    .unwrap()
    .cost_by(|request| {
        if request.headers.contains_key("x-huge") {
            6
        } else {
            1
        }
    });
    let addr = serve(RateLimitLayer::new(tenants).wrap_body()).await;
    let channel = channel(addr).await;
    let missing = say_hello(&channel, &[]).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
    assert!(
        missing.message().contains("x-tenant"),
        "{}",
        missing.message()
    );
    let huge = say_hello(&channel, &[("x-tenant", "a"), ("x-huge", "1")])
        .await
        .unwrap_err();
    assert_eq!(huge.code(), Code::ResourceExhausted);
    assert_eq!(huge.metadata().get("grpc-retry-pushback-ms").unwrap(), "-1");
    assert!(huge.get_error_details().retry_info().is_none());
    assert!(say_hello(&channel, &[("x-tenant", "a")]).await.is_ok());
}

/// One layer, two kinds of clients: a refused gRPC call (any `application/grpc` content type,
/// any case, with a `+format` or parameters, and over HTTP/1.1 too) is a trailers-only gRPC
/// status; a plain HTTP request, or a content type that only starts like gRPC's, the usual 429.
#[tokio::test]
async fn grpc_calls_get_grpc_answers_and_plain_http_the_usual_429() {
    use tower::ServiceExt;

    let limiter = KeyedRateLimiter::<()>::new(Quota::per_hour(1).unwrap());
    let layer = RateLimitLayer::new(Policy::new("greeter", GlobalKey, limiter).unwrap());
    let service = tower::Layer::layer(
        &layer,
        tower::service_fn(|_: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    let call = |content_type: Option<&'static str>, version: http::Version| {
        let mut request = http::Request::builder()
            .uri("/helloworld.Greeter/SayHello")
            .version(version);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        service
            .clone()
            .oneshot(request.body(axum::body::Body::empty()).unwrap())
    };
    assert_eq!(
        call(None, http::Version::HTTP_2).await.unwrap().status(),
        200
    );
    for content_type in [
        "application/grpc",
        "application/grpc+proto",
        "APPLICATION/GRPC+json",
        "application/grpc; charset=utf-8",
    ] {
        for version in [http::Version::HTTP_2, http::Version::HTTP_11] {
            let refused = call(Some(content_type), version).await.unwrap();
            assert_eq!(refused.status(), 200, "{content_type}");
            assert_eq!(refused.headers()["grpc-status"], "8", "{content_type}");
            assert!(refused.headers().contains_key("grpc-status-details-bin"));
            let body = axum::body::to_bytes(refused.into_body(), 1024)
                .await
                .unwrap();
            assert!(body.is_empty(), "trailers-only");
        }
    }
    for content_type in [
        None,
        Some("application/grpcx"),
        Some("application/json"),
        Some("text/grpc"),
    ] {
        let refused = call(content_type, http::Version::HTTP_11).await.unwrap();
        assert_eq!(refused.status(), 429, "{content_type:?}");
        assert!(!refused.headers().contains_key("grpc-status"));
    }
}

/// Runs `tests/rate_limit/grpc_client.py` (Python's grpcio: gRPC C-core, not tonic) against
/// `addr` in `mode`, and returns the JSON line it prints; `None` when grpcio is not installed
/// and the run does not require it (`.ci/run` installs it and sets `BULWARK_REQUIRE_GRPCIO`).
pub(crate) fn grpcio(addr: SocketAddr, mode: &str) -> Option<serde_json::Value> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/rate_limit/grpc_client.py"
    );
    let probe = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_status"])
        .output();
    if !probe.is_ok_and(|out| out.status.success()) {
        assert!(
            std::env::var_os("BULWARK_REQUIRE_GRPCIO").is_none(),
            "grpcio is required: pip install grpcio grpcio-status"
        );
        eprintln!("skipped: Python's grpcio is not installed");
        return None;
    }
    let out = std::process::Command::new("python3")
        .args([script, &addr.to_string(), mode])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_str(stdout.trim()).unwrap())
}

/// A greeter limited to `quota` on a clock that stands still, and the counts of its limiter.
async fn greeter(
    quota: Quota,
) -> (
    SocketAddr,
    tower_bulwark::observe::Observed<
        KeyedRateLimiter<(), tower_bulwark::algorithm::Gcra, ManualClock>,
    >,
) {
    let limiter = KeyedRateLimiter::<()>::builder(quota)
        .clock(ManualClock::new())
        .build();
    let observed = tower_bulwark::observe::Observed::new("greeter", limiter);
    let policy = Policy::new("greeter", GlobalKey, observed.clone()).unwrap();
    (
        serve(RateLimitLayer::new(policy).wrap_body()).await,
        observed,
    )
}

/// A client that is not ours sees the same refusal: grpcio's sixth rapid call is
/// `RESOURCE_EXHAUSTED`, with the pushback trailer and a `RetryInfo` and `QuotaFailure` it
/// decodes with Google's own protos.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_sees_resource_exhausted_with_the_pushback_and_a_retry_info() {
    let (addr, _) = greeter(Quota::per_minute(5).unwrap()).await;
    let Some(seen) = tokio::task::spawn_blocking(move || grpcio(addr, "rapid"))
        .await
        .unwrap()
    else {
        return;
    };
    assert_eq!(seen["ok"], 5, "{seen}");
    assert_eq!(seen["code"], "RESOURCE_EXHAUSTED", "{seen}");
    assert_eq!(seen["pushback"], "12000", "{seen}");
    assert_eq!(seen["retry_delay_ms"], 12000, "{seen}");
    assert_eq!(seen["violations"], serde_json::json!(["greeter"]), "{seen}");
}

/// grpcio's retries (A6): a policy that lists only `UNAVAILABLE` does not retry a refusal (the
/// limiter sees one attempt); one that lists `RESOURCE_EXHAUSTED` retries once, no sooner than
/// the pushback said (200 ms at five a second), though its own backoff is 1 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_retries_a_refusal_only_when_told_and_only_after_the_pushback() {
    let per_second = Quota::per_second(5).unwrap();
    for (mode, attempts) in [("retry-unavailable", 1), ("retry-exhausted", 2)] {
        let (addr, observed) = greeter(per_second).await;
        let channel = channel(addr).await;
        for _ in 0..5 {
            say_hello(&channel, &[]).await.unwrap();
        }
        let Some(seen) = tokio::task::spawn_blocking(move || grpcio(addr, mode))
            .await
            .unwrap()
        else {
            return;
        };
        assert_eq!(seen["code"], "RESOURCE_EXHAUSTED", "{mode}: {seen}");
        assert_eq!(
            observed.snapshot().limited,
            attempts,
            "{mode}: attempts refused"
        );
        if attempts == 2 {
            let elapsed = seen["elapsed_ms"].as_f64().unwrap();
            assert!(
                elapsed >= 200.0,
                "{mode}: retried after {elapsed} ms, before the pushback"
            );
        }
    }
}

/// Keys for gRPC: the peer's address from tonic's `TcpConnectInfo` (`PeerIp`, no axum needed),
/// and the method a call names (`GrpcMethod`): two per method per peer, so `SayHello` is
/// refused on its third call while another method still has its own budget (answered
/// `UNIMPLEMENTED` by the server, past the layer). A path that names no method is
/// `INVALID_ARGUMENT`.
#[tokio::test]
async fn calls_are_keyed_by_peer_address_and_by_method() {
    use tower_bulwark::rate_limit::{GrpcMethod, PeerIp};

    let per_peer = Policy::new(
        "per-peer",
        PeerIp::new(),
        KeyedRateLimiter::new(Quota::per_minute(100).unwrap()),
    )
    .unwrap();
    let per_method = Policy::new(
        "per-method",
        GrpcMethod,
        KeyedRateLimiter::new(Quota::per_minute(2).unwrap()),
    )
    .unwrap();
    let addr = serve(RateLimitLayer::new(per_peer.and(per_method)).wrap_body()).await;
    let channel = channel(addr).await;
    for _ in 0..2 {
        let reply = say_hello(&channel, &[]).await.unwrap();
        let fields = reply
            .metadata()
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            fields.contains("\"per-peer\""),
            "keyed by the peer, not refused: {fields}"
        );
    }
    let refused = say_hello(&channel, &[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("per-method"),
        "{}",
        refused.message()
    );
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let other = grpc
        .unary::<HelloRequest, HelloReply, _>(
            tonic::Request::new(HelloRequest { name: "x".into() }),
            PathAndQuery::from_static("/helloworld.Greeter/SayGoodbye"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        other.code(),
        Code::Unimplemented,
        "its own budget: {other:?}"
    );
    grpc.ready().await.unwrap();
    let nameless = grpc
        .unary::<HelloRequest, HelloReply, _>(
            tonic::Request::new(HelloRequest { name: "x".into() }),
            PathAndQuery::from_static("/no-method"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(nameless.code(), Code::InvalidArgument, "{nameless:?}");
}

/// A tonic client behind `Pushback` obeys a gRPC refusal. The server sends no `RateLimit`
/// fields on admitted calls (with them, the pushback would hold the sixth call itself), so the
/// sixth reaches it and gets a trailers-only `RESOURCE_EXHAUSTED`, whose `RetryInfo` holds the
/// channel for 12 s: the seventh never reaches the server and fails at once with the
/// `PushedBack`'s status, `UNAVAILABLE` with a `RetryInfo` of 12 s. `outbound::retry_after`
/// reads 12 s from both statuses.
#[tokio::test]
async fn a_tonic_client_behind_pushback_holds_calls_for_the_refusals_retry_delay() {
    use tower_bulwark::outbound::{self, Pushback};

    let limiter = KeyedRateLimiter::<()>::builder(Quota::per_minute(5).unwrap())
        .clock(ManualClock::new())
        .build();
    let observed = tower_bulwark::observe::Observed::new("greeter", limiter);
    let policy = Policy::new("greeter", GlobalKey, observed.clone()).unwrap();
    let addr = serve(
        RateLimitLayer::new(policy)
            .without_admitted_headers()
            .wrap_body(),
    )
    .await;
    let clock = ManualClock::new();
    let pushback = Pushback::builder("greeter").clock(clock.clone()).build();
    let client = tower::Layer::layer(&pushback.layer(), channel(addr).await);
    let call = || {
        let mut grpc = tonic::client::Grpc::new(client.clone());
        async move {
            grpc.ready()
                .await
                .map_err(|e| Status::unknown(e.to_string()))?;
            let request = tonic::Request::new(HelloRequest { name: "pb".into() });
            let path = PathAndQuery::from_static("/helloworld.Greeter/SayHello");
            grpc.unary::<_, HelloReply, _>(request, path, tonic_prost::ProstCodec::default())
                .await
        }
    };
    for _ in 0..5 {
        call().await.unwrap();
    }
    let refused = call().await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        outbound::retry_after(&refused),
        Some(Duration::from_secs(12))
    );
    assert_eq!(pushback.held_for(), Duration::from_secs(12));
    let held = call().await.unwrap_err();
    assert_eq!(held.code(), Code::Unavailable, "{held:?}");
    assert_eq!(
        outbound::retry_after(&held),
        Some(Duration::from_secs(12)),
        "{held:?}"
    );
    assert_eq!(
        held.get_details_retry_info()
            .and_then(|info| info.retry_delay),
        Some(Duration::from_secs(12))
    );
    assert_eq!(
        observed.snapshot().limited,
        1,
        "the held call never reached the server"
    );
}

/// A tonic client behind a client-side quota of one call a minute: the second call never
/// leaves, and tonic hands back the `QuotaExhausted`'s status, `RESOURCE_EXHAUSTED` with the
/// wait (a minute) in a `RetryInfo` and `grpc-retry-pushback-ms`, not `UNKNOWN`.
#[tokio::test]
async fn a_tonic_client_behind_a_client_quota_gets_resource_exhausted_with_the_wait() {
    use tower_bulwark::outbound::quota::ClientQuotaLayer;

    let open = KeyedRateLimiter::<()>::new(Quota::per_second(1000).unwrap());
    let addr =
        serve(RateLimitLayer::new(Policy::new("open", GlobalKey, open).unwrap()).wrap_body()).await;
    let quota = tower_bulwark::DirectRateLimiter::builder(Quota::per_minute(1).unwrap())
        .clock(ManualClock::new())
        .build();
    let layer = ClientQuotaLayer::new("greeter", quota);
    let client = tower::Layer::layer(&layer, channel(addr).await);
    let call = || {
        let mut grpc = tonic::client::Grpc::new(client.clone());
        async move {
            grpc.ready().await.map_err(Status::from_error)?;
            let request = tonic::Request::new(HelloRequest { name: "q".into() });
            let path = PathAndQuery::from_static("/helloworld.Greeter/SayHello");
            grpc.unary::<_, HelloReply, _>(request, path, tonic_prost::ProstCodec::default())
                .await
        }
    };
    call().await.unwrap();
    let refused = call().await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("greeter"), "{refused:?}");
    assert_eq!(
        refused
            .get_details_retry_info()
            .and_then(|info| info.retry_delay),
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        refused.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "60000"
    );
}

/// What a gRPC answer's headers say, however hostile: the pushback reads a `RetryInfo`, else a
/// non-negative `grpc-retry-pushback-ms`; a negative or unreadable pushback ("do not retry"),
/// a status a wait does not end, or a `grpc-status-details-bin` that is not base64 or not a
/// `Status` sets no hold and never panics; no hold outlasts `max_hold`.
#[test]
fn hostile_grpc_answers_set_no_hold_beyond_what_they_say() {
    use tower_bulwark::outbound::Pushback;

    // The answer's fields, and the hold they set.
    type Case<'a> = (&'a [(&'a str, &'a [u8])], Duration);
    let cases: &[Case] = &[
        (
            &[("grpc-status", b"8"), ("grpc-retry-pushback-ms", b"1500")],
            Duration::from_millis(1500),
        ),
        (
            &[("grpc-status", b"14"), ("grpc-retry-pushback-ms", b"20")],
            Duration::from_millis(20),
        ),
        (
            &[("grpc-status", b"8"), ("grpc-retry-pushback-ms", b"-1")],
            Duration::ZERO,
        ),
        (
            &[("grpc-status", b"8"), ("grpc-retry-pushback-ms", b"soon")],
            Duration::ZERO,
        ),
        (
            &[
                ("grpc-status", b"8"),
                ("grpc-retry-pushback-ms", b"99999999999999999999"),
            ],
            Duration::ZERO,
        ),
        (
            &[("grpc-status", b"13"), ("grpc-retry-pushback-ms", b"1500")],
            Duration::ZERO,
        ),
        (
            &[("grpc-status", b"0"), ("grpc-retry-pushback-ms", b"1500")],
            Duration::ZERO,
        ),
        (
            &[
                ("grpc-status", b"banana"),
                ("grpc-retry-pushback-ms", b"1500"),
            ],
            Duration::ZERO,
        ),
        (
            &[
                ("grpc-status", b"8"),
                ("grpc-status-details-bin", b"!!not base64!!"),
                ("grpc-retry-pushback-ms", b"7"),
            ],
            Duration::from_millis(7),
        ),
        (
            &[("grpc-status", b"8"), ("grpc-status-details-bin", b"AAAA")],
            Duration::ZERO,
        ),
        (
            &[
                ("grpc-status", b"8"),
                ("grpc-retry-pushback-ms", b"86400000000"),
            ],
            Duration::from_secs(600),
        ),
    ];
    // `RetryInfo` delays of any seconds and nanoseconds, signs mixed: read whole, negative as
    // none, capped at `max_hold` (600 s by default); never a panic (this build checks overflow),
    // from a trailers-only answer and from a `tonic::Status` alike.
    let retry_info = |seconds: i64, nanos: i32| {
        let delay = prost_types::Duration { seconds, nanos };
        let info = tonic_types::pb::RetryInfo {
            retry_delay: Some(delay),
        };
        let details = tonic_types::pb::Status {
            code: 8,
            message: String::new(),
            details: vec![prost_types::Any {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                value: prost::Message::encode_to_vec(&info),
            }],
        };
        prost::Message::encode_to_vec(&details)
    };
    // (seconds, nanoseconds, what `retry_after` reads, what the pushback holds)
    let delays = [
        (i64::MIN, 0, Duration::ZERO, Duration::ZERO),
        (i64::MIN, i32::MIN, Duration::ZERO, Duration::ZERO),
        (-5, 0, Duration::ZERO, Duration::ZERO),
        (0, -1, Duration::ZERO, Duration::ZERO),
        (
            2,
            -500_000_000,
            Duration::from_millis(1500),
            Duration::from_millis(1500),
        ),
        (
            3,
            250_000_000,
            Duration::from_millis(3250),
            Duration::from_millis(3250),
        ),
        (
            i64::MAX,
            i32::MAX,
            Duration::from_nanos(u64::MAX),
            Duration::from_secs(600),
        ),
    ];
    for (seconds, nanos, read, held) in delays {
        let details = retry_info(seconds, nanos);
        let status = Status::with_details(Code::ResourceExhausted, "", details.clone().into());
        let error: tower_bulwark::BoxError = Box::new(status);
        let said = tower_bulwark::outbound::retry_after(&*error);
        assert_eq!(
            said,
            Some(read),
            "tonic::Status with {seconds} s {nanos} ns"
        );
        let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &details);
        let pushback = Pushback::builder("dep").clock(ManualClock::new()).build();
        let mut response = http::Response::new(());
        response
            .headers_mut()
            .insert("grpc-status", "8".parse().unwrap());
        let value = http::HeaderValue::from_str(&encoded).unwrap();
        response
            .headers_mut()
            .insert("grpc-status-details-bin", value);
        pushback.observe(&response);
        assert_eq!(
            pushback.held_for(),
            held,
            "details with {seconds} s {nanos} ns"
        );
    }
    for (headers, expected) in cases {
        let pushback = Pushback::builder("dep").clock(ManualClock::new()).build();
        let mut response = http::Response::new(());
        for (name, value) in *headers {
            response
                .headers_mut()
                .append(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        pushback.observe(&response);
        assert_eq!(pushback.held_for(), *expected, "{headers:?}");
    }
}

/// The adaptive bulkhead's default classifier judges trailers-only gRPC answers by their
/// `grpc-status`: `RESOURCE_EXHAUSTED`, `UNAVAILABLE` and `DEADLINE_EXCEEDED` bring the limit
/// down, any other status is a healthy sample, as a plain 200 is.
#[cfg(feature = "adaptive")]
#[test]
fn the_adaptive_bulkheads_classifier_reads_grpc_statuses() {
    use tower_bulwark::bulkhead::adaptive::{Classify, HttpOverload, Verdict};

    let judge = |status: Option<&str>| {
        let mut response = http::Response::new(());
        if let Some(status) = status {
            response
                .headers_mut()
                .insert("grpc-status", status.parse().unwrap());
        }
        HttpOverload::default().classify(Ok(&response))
    };
    for overload in ["4", "8", "14"] {
        assert_eq!(judge(Some(overload)), Verdict::Overloaded, "{overload}");
    }
    for healthy in ["0", "2", "13", "16", "banana"] {
        assert_eq!(judge(Some(healthy)), Verdict::Healthy, "{healthy}");
    }
    assert_eq!(judge(None), Verdict::Healthy);
    // A status on several lines is read as the pushback reads one: lines that agree count once,
    // lines that differ name none (the first line was read).
    let judge_lines = |lines: [&str; 2]| {
        let mut response = http::Response::new(());
        for line in lines {
            (response.headers_mut()).append("grpc-status", line.parse().unwrap());
        }
        HttpOverload::default().classify(Ok(&response))
    };
    assert_eq!(judge_lines(["8", "8"]), Verdict::Overloaded);
    assert_eq!(judge_lines(["8", "0"]), Verdict::Healthy);
    // Only an HTTP 200 is a trailers-only gRPC answer: a proxy's 429, 503 or 504 is overload
    // whatever `grpc-status` it carries (it was judged healthy by that status).
    for (http_status, grpc_status) in [(503, "2"), (429, "13"), (504, "0")] {
        let mut response = http::Response::new(());
        *response.status_mut() = http::StatusCode::from_u16(http_status).unwrap();
        (response.headers_mut()).insert("grpc-status", grpc_status.parse().unwrap());
        let verdict = HttpOverload::default().classify(Ok(&response));
        assert_eq!(verdict, Verdict::Overloaded, "{http_status} {grpc_status}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// Hostile gRPC requests (any content type, HTTP/1.1 or 2, a `grpc-timeout` of any shape, a
    /// key in metadata of any bytes, no key at all): never a panic; an answer the client can
    /// read (a gRPC status for a gRPC content type, an HTTP status otherwise); and the key's
    /// budget spent exactly by the calls that reached the handler.
    #[test]
    fn hostile_grpc_requests_get_a_clear_answer_and_spend_only_what_was_admitted(
        content_type in proptest::option::of(proptest::prop_oneof![
            proptest::strategy::Just(b"application/grpc".to_vec()),
            proptest::strategy::Just(b"application/grpc+proto".to_vec()),
            proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        ]),
        timeout in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24)),
        tenant in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)),
        http1 in proptest::prelude::any::<bool>(),
        calls in 1usize..5,
    ) {
        use tower::ServiceExt;

        let limiter = KeyedRateLimiter::<http::HeaderValue>::new(Quota::per_hour(2).unwrap());
        let policy = Policy::new("per-tenant", HeaderKey::new("x-tenant").unwrap(), limiter.clone()).unwrap();
        let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = reached.clone();
        let service = tower::Layer::layer(
            &RateLimitLayer::new(policy),
            tower::service_fn(move |_: http::Request<axum::body::Body>| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty())) }
            }),
        );
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let grpc_type = content_type.as_deref().is_some_and(|t| {
            let t = String::from_utf8_lossy(t).to_ascii_lowercase();
            t == "application/grpc" || t.starts_with("application/grpc+") || t.starts_with("application/grpc;")
        });
        let mut key = None;
        for _ in 0..calls {
            let mut request = http::Request::new(axum::body::Body::empty());
            *request.version_mut() = if http1 { http::Version::HTTP_11 } else { http::Version::HTTP_2 };
            let headers = request.headers_mut();
            for (name, value) in [("content-type", &content_type), ("grpc-timeout", &timeout), ("x-tenant", &tenant)] {
                if let Some(value) = value.as_ref().and_then(|v| http::HeaderValue::from_bytes(v).ok()) {
                    if name == "x-tenant" {
                        key = Some(value.clone());
                    }
                    headers.insert(name, value);
                }
            }
            let response = runtime.block_on(service.clone().oneshot(request)).unwrap();
            let grpc_status = response.headers().get("grpc-status").cloned();
            let content_type_is_grpc = response.headers().get("content-type").is_some_and(|v| v == "application/grpc");
            let handled = response.status() == 200 && grpc_status.is_none();
            if !handled {
                // The layer answered: as gRPC exactly when the request was gRPC.
                proptest::prop_assert_eq!(grpc_status.is_some(), grpc_type, "{:?}", response.headers());
                proptest::prop_assert_eq!(content_type_is_grpc, grpc_type);
            }
        }
        let reached = reached.load(std::sync::atomic::Ordering::SeqCst);
        proptest::prop_assert!(reached <= 2);
        if let Some(key) = key.filter(|k| !k.is_empty() && k.len() <= 256) {
            // HeaderKey's keys: a value of 1 to 256 bytes (as the layer read it).
            let mut left = 0;
            while limiter.check(&key).allowed { left += 1; }
            proptest::prop_assert_eq!(left + reached, 2, "key {:?}", key);
        }
    }
}

/// A policy name with a `%` in it reaches the client as written: `grpc-message` is
/// percent-encoded, and the details' `QuotaFailure` names it exactly.
#[tokio::test]
async fn a_policy_name_with_a_percent_sign_reaches_the_client_as_written() {
    use tower::ServiceExt;

    let limiter = KeyedRateLimiter::<()>::new(Quota::per_hour(1).unwrap());
    let policy = Policy::new("50% of the plan", GlobalKey, limiter).unwrap();
    let service = tower::Layer::layer(
        &RateLimitLayer::new(policy),
        tower::service_fn(|_: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    let call = || {
        let request = http::Request::builder()
            .header("content-type", "application/grpc")
            .body(axum::body::Body::empty())
            .unwrap();
        service.clone().oneshot(request)
    };
    call().await.unwrap();
    let refused = call().await.unwrap();
    let status = Status::from_header_map(refused.headers()).unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded: 50% of the plan");
    let quota = status.get_error_details().quota_failure().unwrap().clone();
    assert_eq!(quota.violations[0].subject, "50% of the plan");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// The refusal's `grpc-status-details-bin`, written by hand into a buffer of its exact size,
    /// is a `google.rpc.Status` tonic-types decodes, whatever the policies: one to three names
    /// of any printable ASCII up to the longest allowed (so that every length of the message
    /// and the details crosses a varint boundary), periods down to the nanosecond. Its code is
    /// `RESOURCE_EXHAUSTED`, its message is the `grpc-message` (percent-decoded) as grpcio
    /// requires, its `RetryInfo` is the `grpc-retry-pushback-ms` and its `QuotaFailure` names
    /// each refusing policy, in order.
    #[test]
    fn the_refusals_details_decode_for_any_policy_names_and_delays(
        policies in proptest::collection::vec(
            ("[ -~]{1,64}", 1u64..10_000_000_000_000),
            1..4,
        ),
    ) {
        let set: Vec<_> = policies
            .iter()
            .map(|(name, nanos)| {
                let quota = Quota::with_period(1, Duration::from_nanos(*nanos)).unwrap();
                let limiter = KeyedRateLimiter::<()>::builder(quota).clock(ManualClock::new()).build();
                Policy::new(name.clone(), GlobalKey, limiter).unwrap()
            })
            .collect();
        let call = crate::grpc_refusals::grpc_calls(set);
        call();
        let refused = call();
        let headers = refused.headers();
        proptest::prop_assert_eq!(headers.get("grpc-status").unwrap(), "8");
        let status = Status::from_header_map(headers).unwrap();
        let details = <tonic_types::pb::Status as prost::Message>::decode(status.details()).unwrap();
        proptest::prop_assert_eq!(details.code, Code::ResourceExhausted as i32);
        proptest::prop_assert_eq!(&details.message, status.message());
        let names: Vec<&str> = policies.iter().map(|(name, _)| name.as_str()).collect();
        proptest::prop_assert!(status.message().contains(&names.join(", ")), "{}", status.message());
        let errors = status.get_error_details();
        let subjects: Vec<&str> = (errors.quota_failure().unwrap().violations.iter())
            .map(|v| v.subject.as_str())
            .collect();
        proptest::prop_assert_eq!(subjects, names);
        let pushback: u64 = (headers.get("grpc-retry-pushback-ms").unwrap().to_str().unwrap())
            .parse()
            .unwrap();
        let longest = policies.iter().map(|(_, nanos)| *nanos).max().unwrap();
        proptest::prop_assert_eq!(pushback, longest.div_ceil(1_000_000));
        proptest::prop_assert_eq!(
            errors.retry_info().unwrap().retry_delay,
            Some(Duration::from_millis(pushback))
        );
    }
}
