//! Attacks on the gRPC answers (feature `grpc`), from outside: the layer's own errors (no key,
//! a failing limiter), overload shedding and client-side refusals, read by tonic's client and
//! by Python's grpcio over a real listener; delays at their edges (under a millisecond, decades);
//! and which content types are answered as gRPC.

use std::net::SocketAddr;
use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::transport::Server;
use tonic::{Code, Status};
use tonic_types::StatusExt;
use tower::ServiceExt;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{GlobalKey, KeyError, Policy, RateLimitLayer};
use tower_bulwark::{outbound, KeyedRateLimiter, Quota};

use crate::grpc::{channel, grpcio, say_hello, serve, tokio_stream_of};
use crate::grpc_example::grpc::{Greeter, HelloReply, HelloRequest};

const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// What grpcio (C-core) read of the first call to `addr` that failed (`rapid` mode: up to six
/// calls), or `None` where grpcio is not installed and not required.
pub(crate) async fn grpcio_refusal(addr: SocketAddr) -> Option<serde_json::Value> {
    tokio::task::spawn_blocking(move || grpcio(addr, "rapid"))
        .await
        .unwrap()
}

/// The delay of a status's `RetryInfo`, if it has one.
pub(crate) fn retry_delay(status: &Status) -> Option<Duration> {
    status.get_details_retry_info().and_then(|i| i.retry_delay)
}

/// A status's `grpc-retry-pushback-ms`, as text.
pub(crate) fn pushback(status: &Status) -> Option<&str> {
    status.metadata().get(PUSHBACK).map(|v| v.to_str().unwrap())
}

/// The key errors of a closure key extractor, with a reason of any text (accents, a newline, a
/// `%`), through tonic's client and grpcio.
///
/// Promise, `src/rate_limit/grpc.rs:8-10`: "The layer's other answers keep their meaning: no
/// key is `INVALID_ARGUMENT` (or `UNAUTHENTICATED`, or `INTERNAL` for a server-side cause)";
/// `src/rate_limit/key/mod.rs:107-108`: the server-side reason "is logged, not sent";
/// `src/guide.rs:403`: the message "is `grpc-message`, as grpcio requires".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_errors_reason_of_any_text_reaches_tonic_and_grpcio_as_written() {
    const REASON: &str = "clé « x-who » absente:\n100% requis";
    type Make = fn(&'static str) -> KeyError;
    let cases: [(Make, Code, &str, bool); 3] = [
        (
            |r| KeyError::bad_request(r),
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            true,
        ),
        (
            |r| KeyError::unauthorized(r),
            Code::Unauthenticated,
            "UNAUTHENTICATED",
            true,
        ),
        (|r| KeyError::internal(r), Code::Internal, "INTERNAL", false),
    ];
    for (make, code, name, sent) in cases {
        let key = move |_: &RequestHead<'_>| Err::<(), _>(make(REASON));
        let limiter = KeyedRateLimiter::<()>::new(Quota::per_minute(5).unwrap());
        let policy = Policy::new("who", key, limiter).unwrap();
        let addr = serve(RateLimitLayer::new(policy).wrap_body()).await;
        let refused = say_hello(&channel(addr).await, &[]).await.unwrap_err();
        assert_eq!(refused.code(), code, "{refused:?}");
        assert_eq!(refused.message().contains(REASON), sent, "{refused:?}");
        let Some(seen) = grpcio_refusal(addr).await else {
            continue;
        };
        assert_eq!(
            (seen["ok"].as_u64(), seen["code"].as_str()),
            (Some(0), Some(name))
        );
        let message = seen["message"].as_str().unwrap();
        assert_eq!(message.contains(REASON), sent, "{seen}");
    }
}

/// A limiter that fails every decision (a store that is down), the layer failing closed: tonic
/// and grpcio read `UNAVAILABLE`; the raw answer is an HTTP 200 of `application/grpc` with the
/// status in its headers and no body (trailers-only).
///
/// Promise, `src/rate_limit/grpc.rs:8-10`: "The layer's other answers keep their meaning: ...
/// a failing limiter `UNAVAILABLE`"; `src/guide.rs:396-397`: "the rate-limit layer's own
/// answers to a gRPC call are gRPC statuses, trailers-only".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_limiter_is_unavailable_to_tonic_grpcio_and_on_the_wire() {
    let broken = || crate::support::Broken(Quota::per_minute(5).unwrap());
    let layer = || RateLimitLayer::new(Policy::new("store", GlobalKey, broken()).unwrap());
    let addr = serve(layer().wrap_body()).await;
    let refused = say_hello(&channel(addr).await, &[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    if let Some(seen) = grpcio_refusal(addr).await {
        assert_eq!(seen["code"], "UNAVAILABLE", "{seen}");
    }
    let service = tower::Layer::layer(
        &layer(),
        tower::service_fn(|_: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    let request = http::Request::post("/helloworld.Greeter/SayHello")
        .header("content-type", "application/grpc")
        .body(axum::body::Body::empty())
        .unwrap();
    let answer = service.oneshot(request).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["content-type"], "application/grpc");
    assert_eq!(answer.headers()["grpc-status"], "14");
    let body = axum::body::to_bytes(answer.into_body(), 1024)
        .await
        .unwrap();
    assert!(body.is_empty(), "trailers-only");
}

/// Overload protection on a tonic server, limit one: a bidirectional `Echo` holds the one place
/// until the client ends it, and a `SayHello` meanwhile is shed; tonic and grpcio read
/// `UNAVAILABLE` with the wait (one second, at least) in `grpc-retry-pushback-ms` and a
/// `RetryInfo`.
///
/// Promise, `src/overload/mod.rs:71-73`: "A gRPC call (feature `grpc`) gets `UNAVAILABLE`
/// instead, with the same wait in `grpc-retry-pushback-ms` and a `google.rpc.RetryInfo`";
/// `src/guide.rs:293`: "or gRPC `UNAVAILABLE` with the same delay".
#[cfg(feature = "adaptive")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_call_is_unavailable_with_its_wait_to_tonic_and_grpcio() {
    use tower_bulwark::bulkhead::adaptive::Limits;
    use tower_bulwark::overload::{Overload, Priority};

    let overload = Overload::builder("api")
        .limits(Limits::new(1, 1, 1).unwrap())
        .guarantee(Priority::Critical, 0.0)
        .unwrap()
        .clock(ManualClock::new())
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(overload.layer())
            .add_service(Greeter)
            .add_service(crate::grpc_streaming::Streams)
            .serve_with_incoming(tokio_stream_of(listener)),
    );
    let channel = channel(addr).await;
    let (held, _replies) = crate::grpc_streaming::echo(&channel).await.unwrap();
    assert_eq!(overload.in_flight(), 1);
    let shed = say_hello(&channel, &[]).await.unwrap_err();
    assert_eq!(shed.code(), Code::Unavailable, "{shed:?}");
    assert_eq!(pushback(&shed), Some("1000"), "{shed:?}");
    assert_eq!(retry_delay(&shed), Some(Duration::from_secs(1)));
    assert_eq!(outbound::retry_after(&shed), Some(Duration::from_secs(1)));
    if let Some(seen) = grpcio_refusal(addr).await {
        let read = (
            &seen["ok"],
            &seen["code"],
            &seen["pushback"],
            &seen["retry_delay_ms"],
        );
        assert_eq!(
            read,
            (
                &0.into(),
                &"UNAVAILABLE".into(),
                &"1000".into(),
                &1000.into()
            )
        );
    }
    drop(held);
}

/// Server refusals at the longest period a quota takes (2^60 ns, about 36.5 years; five calls,
/// so the sixth waits a fifth of it): tonic and grpcio read `RESOURCE_EXHAUSTED`, the pushback
/// the wait in whole milliseconds rounded up, and a `RetryInfo` of the same delay.
///
/// Promise, `src/guide.rs:402`: "tonic and grpcio ... see `RESOURCE_EXHAUSTED`, the pushback in
/// whole milliseconds, never 0, and a decodable `RetryInfo` on the sixth rapid call";
/// `src/rate_limit/grpc.rs:43`: "`wait` in whole milliseconds, rounded up (saturating)". The
/// existing proptest stops at periods of 10^13 ns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_decades_away_says_its_whole_wait_to_tonic_and_grpcio() {
    let quota = Quota::with_period(5, Quota::MAX_SPAN).unwrap();
    let wait = quota.emission_interval();
    let ms = wait.as_nanos().div_ceil(1_000_000);
    let serve_decades = || {
        let limiter = KeyedRateLimiter::<()>::builder(quota)
            .clock(ManualClock::new())
            .build();
        serve(RateLimitLayer::new(Policy::new("decades", GlobalKey, limiter).unwrap()).wrap_body())
    };
    let channel = channel(serve_decades().await).await;
    for _ in 0..5 {
        say_hello(&channel, &[]).await.unwrap();
    }
    let refused = say_hello(&channel, &[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(pushback(&refused), Some(ms.to_string().as_str()));
    let delay = retry_delay(&refused).unwrap();
    assert_eq!(delay.as_millis(), ms, "{delay:?} for {wait:?}");
    assert_eq!(outbound::retry_after(&refused), Some(delay));
    let Some(seen) = grpcio_refusal(serve_decades().await).await else {
        return;
    };
    assert_eq!(
        (&seen["ok"], &seen["code"]),
        (&5.into(), &"RESOURCE_EXHAUSTED".into())
    );
    assert_eq!(seen["pushback"], ms.to_string(), "{seen}");
    assert_eq!(
        seen["retry_delay_ms"].as_u64().map(u128::from),
        Some(ms),
        "{seen}"
    );
}

/// A tonic client behind a client quota whose next permit is 1.5 ms, then 100 ns, then about
/// 36.5 years away (the longest period): each `QuotaExhausted` comes back from tonic as
/// `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms` the wait in whole milliseconds rounded up,
/// never 0 (2, 1, 1 152 921 504 607), and a `RetryInfo` of no less than the wait.
///
/// Promise, `src/rate_limit/grpc.rs:257-260`: "that wait in a `google.rpc.RetryInfo` of its
/// details and in `grpc-retry-pushback-ms` (gRPC's retry design, A6), rounded up to whole
/// milliseconds as a refusal's is"; `src/outbound/quota/error.rs:14-17`.
#[tokio::test]
async fn a_client_quotas_refusal_says_a_wait_under_a_millisecond_or_of_decades_in_full() {
    use tower_bulwark::outbound::quota::ClientQuotaLayer;

    let open = KeyedRateLimiter::<()>::new(Quota::per_second(1000).unwrap());
    let policy = Policy::new("open", GlobalKey, open).unwrap();
    let addr = serve(RateLimitLayer::new(policy).wrap_body()).await;
    let channel = channel(addr).await;
    let clock = ManualClock::new();
    let fast = Quota::with_period(1, Duration::from_micros(1_500)).unwrap();
    let slow = Quota::with_period(1, Quota::MAX_SPAN).unwrap();
    let fast = tower_bulwark::DirectRateLimiter::builder(fast)
        .clock(clock.clone())
        .build();
    let slow = tower_bulwark::DirectRateLimiter::builder(slow)
        .clock(clock.clone())
        .build();
    let fast = tower::Layer::layer(&ClientQuotaLayer::new("fast", fast), channel.clone());
    let slow = tower::Layer::layer(&ClientQuotaLayer::new("slow", slow), channel);
    let call = |mut grpc: tonic::client::Grpc<_>| async move {
        grpc.ready().await.map_err(Status::from_error)?;
        let request = tonic::Request::new(HelloRequest { name: "q".into() });
        let path = PathAndQuery::from_static("/helloworld.Greeter/SayHello");
        let codec = tonic_prost::ProstCodec::default();
        grpc.unary::<_, HelloReply, _>(request, path, codec).await
    };
    let check = |refused: Status, wait: Duration| {
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        let ms = wait.as_nanos().div_ceil(1_000_000).to_string();
        assert_eq!(
            pushback(&refused),
            Some(ms.as_str()),
            "{wait:?}: {refused:?}"
        );
        let delay = retry_delay(&refused).unwrap();
        assert!(delay >= wait, "RetryInfo {delay:?} for a wait of {wait:?}");
        assert!(delay.as_nanos() <= wait.as_nanos().div_ceil(1_000_000) * 1_000_000);
        assert_eq!(outbound::retry_after(&refused), Some(delay));
    };
    call(tonic::client::Grpc::new(fast.clone())).await.unwrap();
    let refused = call(tonic::client::Grpc::new(fast.clone()))
        .await
        .unwrap_err();
    check(refused, Duration::from_micros(1_500));
    clock.advance(Duration::from_nanos(1_499_900));
    let refused = call(tonic::client::Grpc::new(fast)).await.unwrap_err();
    check(refused, Duration::from_nanos(100));
    call(tonic::client::Grpc::new(slow.clone())).await.unwrap();
    let refused = call(tonic::client::Grpc::new(slow)).await.unwrap_err();
    check(refused, Quota::MAX_SPAN);
}

/// For each of `content_types`, whether the rate-limit layer's refusal and the overload
/// protection's shed answer are gRPC's (an HTTP 200 with `grpc-status`) or HTTP's (429, 503):
/// `Some(true)`, `Some(false)`, or `None` where the two disagree or the status does.
#[cfg(feature = "adaptive")]
async fn answered_as_grpc(content_types: &[&str]) -> Vec<Option<bool>> {
    use tower_bulwark::bulkhead::adaptive::Limits;
    use tower_bulwark::overload::Overload;

    // Answers `/hold` never, anything else at once.
    let inner = tower::service_fn(|request: http::Request<axum::body::Body>| async move {
        if request.uri().path() == "/hold" {
            std::future::pending::<()>().await;
        }
        Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
    });
    let limiter = KeyedRateLimiter::<()>::new(Quota::per_hour(1).unwrap());
    let limit = RateLimitLayer::new(Policy::new("p", GlobalKey, limiter).unwrap());
    let limited = tower::Layer::layer(&limit, inner);
    let overload = Overload::builder("api")
        .limits(Limits::new(1, 1, 1).unwrap())
        .build();
    let shedder = tower::Layer::layer(&overload.layer(), inner);
    let request = |path: &str, content_type: &str| {
        let request = http::Request::post(path).header("content-type", content_type);
        request.body(axum::body::Body::empty()).unwrap()
    };
    limited
        .clone()
        .oneshot(request("/spend", "text/plain"))
        .await
        .unwrap();
    tokio::spawn(shedder.clone().oneshot(request("/hold", "text/plain")));
    while overload.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let mut seen = Vec::new();
    for content_type in content_types {
        let refused = limited
            .clone()
            .oneshot(request("/a", content_type))
            .await
            .unwrap();
        let shed = shedder
            .clone()
            .oneshot(request("/a", content_type))
            .await
            .unwrap();
        let read = |status: http::StatusCode, headers: &http::HeaderMap, http: u16| match (
            status.as_u16(),
            headers.contains_key("grpc-status"),
        ) {
            (200, true) => Some(true),
            (code, false) if code == http => Some(false),
            _ => None,
        };
        let refused = read(refused.status(), refused.headers(), 429);
        let shed = read(shed.status(), shed.headers(), 503);
        seen.push(if refused == shed { refused } else { None });
    }
    seen
}

/// Content types that are not `application/grpc` (gRPC-Web's, with or without a format, a
/// subtype that only starts alike) get the HTTP answers, 429 and 503, from the rate-limit layer
/// and the overload protection alike; `application/grpc` in any case with a format and a
/// parameter gets the gRPC one.
///
/// Promise, `src/rate_limit/grpc.rs:29-31`: "Whether `request` is a gRPC call: its content type
/// is `application/grpc`, alone or with a `+format` or parameters"; `src/guide.rs:404`:
/// requests "get a gRPC answer exactly when they are gRPC".
#[cfg(feature = "adaptive")]
#[tokio::test]
async fn grpc_web_and_look_alike_content_types_get_http_answers() {
    let not_grpc = [
        "application/grpc-web",
        "application/grpc-web+proto",
        "application/grpc-web-text",
        "application/grpc-web-text+proto",
        "application/grpcweb",
        "application/grpc/proto",
    ];
    assert_eq!(answered_as_grpc(&not_grpc).await, [Some(false); 6]);
    let grpc = [
        "Application/gRPC+proto;x=1",
        "APPLICATION/GRPC; charset=utf-8",
    ];
    assert_eq!(answered_as_grpc(&grpc).await, [Some(true); 2]);
}

/// `application/grpc` with a parameter after whitespace, which RFC 9110 (section 8.3.1,
/// `parameters = *( OWS ";" OWS [ parameter ] )`) makes the same media type with parameters,
/// gets the gRPC answers of the rate limit and the overload protection.
///
/// Promise, `src/rate_limit/grpc.rs:29-31`: "its content type is `application/grpc`, alone or
/// with a `+format` or parameters"; `src/overload/answer.rs:11`: "Whether the request is a gRPC
/// call, answered as one". (Found by this attack: both answered 429 and 503, and a gRPC client
/// would have read `UNAVAILABLE` with no pushback.)
#[cfg(feature = "adaptive")]
#[tokio::test]
async fn application_grpc_with_whitespace_before_its_parameters_gets_grpc_answers() {
    let grpc = ["application/grpc ;charset=utf-8", "application/grpc\t; a=b"];
    assert_eq!(answered_as_grpc(&grpc).await, [Some(true); 2]);
}

/// A call that costs more than the policy can ever admit, refused through a hook that falls
/// back to `Refusal::default_response`: tonic reads `RESOURCE_EXHAUSTED` with a pushback of
/// `-1` and no `RetryInfo`, and grpcio, whose retry policy lists `RESOURCE_EXHAUSTED`, does not
/// retry it (the limiter sees one attempt).
///
/// Promise, `src/rate_limit/refusal.rs:107-110`: "For a gRPC call (feature `grpc`), the
/// trailers-only `RESOURCE_EXHAUSTED` with the wait in `grpc-retry-pushback-ms` (`-1`, do not
/// retry, when no wait helps) and a `RetryInfo`, so a hook that answers only some requests
/// itself falls back to what the layer would send."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hooks_fallback_for_a_call_no_wait_admits_tells_grpcio_not_to_retry() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    use tower_bulwark::rate_limit::Refusal;

    // Counts the attempts that reach the layer: the key is found once per call.
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let key = move |_: &RequestHead<'_>| Ok::<_, KeyError>(_ = counted.fetch_add(1, SeqCst));
    let limiter = KeyedRateLimiter::<()>::new(Quota::per_minute(5).unwrap());
    let policy = Policy::new("greeter", key, limiter).unwrap();
    let layer = RateLimitLayer::new(policy.cost_by(|_| 6))
        .on_refusal(|refusal: &Refusal<'_>| refusal.default_response())
        .wrap_body();
    let addr = serve(layer).await;
    let refused = say_hello(&channel(addr).await, &[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(pushback(&refused), Some("-1"));
    assert_eq!(retry_delay(&refused), None);
    assert_eq!(outbound::retry_after(&refused), None);
    assert_eq!(attempts.swap(0, SeqCst), 1);
    let Some(seen) = tokio::task::spawn_blocking(move || grpcio(addr, "retry-exhausted"))
        .await
        .unwrap()
    else {
        return;
    };
    let read = (&seen["code"], &seen["pushback"]);
    assert_eq!(read, (&"RESOURCE_EXHAUSTED".into(), &"-1".into()));
    assert_eq!(attempts.load(SeqCst), 1, "grpcio retried: {seen}");
}

/// `outbound::retry_after` on statuses a dependency may send: the longer of the `RetryInfo` and
/// a readable pushback counts (a pushback that says not to retry names no time); a pushback of 0
/// is a wait of none, still a wait; a status a wait does not end reads `None` whatever it
/// carries.
///
/// Promise, `src/outbound/grpc.rs`: "the longer of the `RetryInfo` in its `details` ... and its
/// `pushback` (A6: milliseconds; a negative or unreadable value means \"do not retry\", and
/// names no time) ... Only a status that a wait can end counts: `RESOURCE_EXHAUSTED` and
/// `UNAVAILABLE`";
/// `src/outbound/mod.rs:121-122`: "with a `RetryInfo` or a non-negative
/// `grpc-retry-pushback-ms`".
#[test]
fn retry_after_reads_the_longer_of_a_statuss_retry_info_and_its_pushback() {
    use tonic_types::ErrorDetails;

    let status = |code: Code, delay: Option<u64>, pushback: &str| {
        let details = ErrorDetails::with_retry_info(delay.map(Duration::from_millis));
        let mut status = match delay {
            Some(_) => Status::with_error_details(code, "slow down", details),
            None => Status::new(code, "slow down"),
        };
        if !pushback.is_empty() {
            status
                .metadata_mut()
                .insert(PUSHBACK, pushback.parse().unwrap());
        }
        outbound::retry_after(&status)
    };
    let ms = |ms| Some(Duration::from_millis(ms));
    for code in [Code::ResourceExhausted, Code::Unavailable] {
        assert_eq!(status(code, Some(2_500), "-1"), ms(2_500), "{code:?}");
        assert_eq!(status(code, Some(2_500), "soon"), ms(2_500), "{code:?}");
        assert_eq!(status(code, Some(2_500), "9000"), ms(9_000), "{code:?}");
        assert_eq!(status(code, Some(2_500), "1000"), ms(2_500), "{code:?}");
        assert_eq!(status(code, Some(0), ""), ms(0), "{code:?}");
        assert_eq!(status(code, None, "0"), ms(0), "{code:?}");
        assert_eq!(status(code, None, "-1"), None, "{code:?}");
    }
    for code in [
        Code::Ok,
        Code::Internal,
        Code::DeadlineExceeded,
        Code::Aborted,
    ] {
        assert_eq!(status(code, Some(2_500), "9000"), None, "{code:?}");
    }
}
