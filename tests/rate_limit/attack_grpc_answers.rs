//! Attacks on issue 36's promise (feature `grpc`): one way to a gRPC status for every answer the
//! crate gives, read by tonic's client (and by Python's grpcio where it is installed) over a
//! real listener: a refusal of a concurrent policy and one of several policies, a hook's
//! fallback, a full bulkhead (server and client), a shed call, an open breaker and a held call,
//! each with its code, its message (names of any text) and its wait, from decades down to the
//! last nanosecond, or no wait where none ends it.

use std::net::SocketAddr;
use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::transport::Server;
use tonic::{Code, Status};
use tonic_types::StatusExt;
use tower::Layer;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer, Refusal};
use tower_bulwark::{outbound, Bulkhead, KeyedRateLimiter, Quota};

use crate::attack_grpc::{grpcio_refusal, pushback, retry_delay};
use crate::grpc::{channel, say_hello, serve, tokio_stream_of};
use crate::grpc_example::grpc::Greeter;
use crate::grpc_hostile::{hello, ready, request};
use crate::grpc_streaming::{echo, Streams};
use crate::support::Refuses;

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);
/// A name gRPC must carry whole: accents, a newline, and `%41`, which a `grpc-message` that
/// was not percent-encoded would turn into `A`.
const HOSTILE: &str = "50%41 « é »\nx";

/// What a status tells a client of when to call again: its code, its `grpc-retry-pushback-ms`
/// and the delay of its `RetryInfo`.
fn told(status: &Status) -> (Code, Option<&str>, Option<Duration>) {
    (status.code(), pushback(status), retry_delay(status))
}

/// The same, as grpcio read it (its `RetryInfo` in whole milliseconds).
fn grpcio_told(seen: &serde_json::Value) -> (&str, Option<&str>, Option<u64>) {
    let code = seen["code"].as_str().unwrap_or_default();
    (
        code,
        seen["pushback"].as_str(),
        seen["retry_delay_ms"].as_u64(),
    )
}

/// `wait` in whole milliseconds, rounded up: what a pushback says of it.
fn ceil_ms(wait: Duration) -> u64 {
    u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap()
}

/// A limiter of `quota` on a clock that stands still.
fn frozen(quota: Quota) -> KeyedRateLimiter<(), tower_bulwark::algorithm::Gcra, ManualClock> {
    KeyedRateLimiter::<()>::builder(quota)
        .clock(ManualClock::new())
        .build()
}

/// Serves the greeter and `test.Streams` behind `$layer` on a free loopback port.
macro_rules! serve_streams {
    ($layer:expr) => {{
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let routes = tonic::service::Routes::new(Streams).add_service(Greeter);
        tokio::spawn(
            Server::builder()
                .layer($layer)
                .add_routes(routes)
                .serve_with_incoming(tokio_stream_of(listener)),
        );
        addr
    }};
}

/// While an `Echo` holds the one place of the server at `addr`: what tonic reads of a
/// `SayHello`, and what grpcio reads of its first call (`None` without grpcio).
async fn refused_while_held(addr: SocketAddr) -> (Status, Option<serde_json::Value>) {
    let channel = channel(addr).await;
    let held = echo(&channel).await.unwrap();
    let refused = say_hello(&channel, &[]).await.unwrap_err();
    let seen = grpcio_refusal(addr).await;
    drop(held);
    (refused, seen)
}

/// Asserts what tonic read of a refusal (its code, pushback and `RetryInfo` delay), and grpcio
/// where it ran, and that each read a message naming `named`.
fn both_told(
    (refused, seen): &(Status, Option<serde_json::Value>),
    tonic: (Code, Option<&str>, Option<Duration>),
    grpcio: (&str, Option<&str>, Option<u64>),
    named: &str,
) {
    assert_eq!(told(refused), tonic, "{refused:?}");
    assert!(refused.message().contains(named), "{refused:?}");
    if let Some(seen) = seen {
        assert_eq!(grpcio_told(seen), grpcio, "{seen}");
        assert!(seen["message"].as_str().unwrap().contains(named), "{seen}");
    }
}

/// A concurrent policy of one slot, held by a stream: a call refused for want of a slot is
/// `RESOURCE_EXHAUSTED` with a wait of one second (not `-1`, "do not retry": a slot frees).
///
/// Promise, `Policy::concurrent`: "A request that finds no free slot is refused at once, like
/// any other policy's refusal (a `429`, ...), with `Retry-After: 1` (when a slot frees is not
/// known)"; `Refusal::default_response`: "For a gRPC call ..., the trailers-only
/// `RESOURCE_EXHAUSTED` with the wait in `grpc-retry-pushback-ms` (`-1`, do not retry, when no
/// wait helps) and a `RetryInfo`".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_policys_refusal_tells_grpc_clients_to_wait_a_second() {
    let slots = Policy::concurrent("streams", GlobalKey, 1).unwrap();
    let answer = refused_while_held(serve_streams!(RateLimitLayer::new(slots).wrap_body())).await;
    let wait = (Code::ResourceExhausted, Some("1000"), Some(SECOND));
    let grpcio = ("RESOURCE_EXHAUSTED", Some("1000"), Some(1000));
    both_told(&answer, wait, grpcio, "streams");
}

/// Two policies, five a minute (named `50%41`) and five an hour: the sixth call violates both.
fn two_policies() -> impl tower_bulwark::rate_limit::PolicySet + Clone {
    let minute = Policy::new("50%41", GlobalKey, frozen(Quota::per_minute(5).unwrap()));
    let hour = Policy::new("hour", GlobalKey, frozen(Quota::per_hour(5).unwrap()));
    minute.unwrap().and(hour.unwrap())
}

/// The sixth call through tonic's client to the server at `addr`.
async fn sixth(addr: SocketAddr) -> Status {
    let channel = channel(addr).await;
    for _ in 0..5 {
        say_hello(&channel, &[]).await.unwrap();
    }
    say_hello(&channel, &[]).await.unwrap_err()
}

/// A refusal by two policies names both, in the message (`%` arriving as written) and in the
/// `QuotaFailure`, and waits for the longer (12 minutes) in the pushback and the `RetryInfo`,
/// to tonic and to grpcio.
///
/// Promise, README "gRPC": "A refusal is a trailers-only `RESOURCE_EXHAUSTED` naming the
/// violated policies, with the delay in `grpc-retry-pushback-ms` ... and in
/// `grpc-status-details-bin`: a `google.rpc.Status` holding a `RetryInfo` and a `QuotaFailure`
/// with each violated policy"; `Refusal::retry_after`: "the longest of the violated
/// policies' `retry_after`".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_two_policies_names_both_and_waits_for_the_longer() {
    let refused = sixth(serve(RateLimitLayer::new(two_policies()).wrap_body()).await).await;
    let wait = Duration::from_secs(720);
    assert_eq!(
        told(&refused),
        (Code::ResourceExhausted, Some("720000"), Some(wait))
    );
    assert_eq!(refused.message(), "rate limit exceeded: 50%41, hour");
    let failure = refused.get_details_quota_failure().unwrap();
    let subjects: Vec<_> = failure
        .violations
        .iter()
        .map(|v| v.subject.as_str())
        .collect();
    assert_eq!(subjects, ["50%41", "hour"]);
    let addr = serve(RateLimitLayer::new(two_policies()).wrap_body()).await;
    let Some(seen) = grpcio_refusal(addr).await else {
        return;
    };
    let read = (grpcio_told(&seen), &seen["message"], &seen["violations"]);
    let subjects = serde_json::json!(["50%41", "hour"]);
    let expected = ("RESOURCE_EXHAUSTED", Some("720000"), Some(720_000));
    assert_eq!(
        read,
        (expected, &refused.message().into(), &subjects),
        "{seen}"
    );
}

/// A hook that falls back to `default_response` answers exactly what the layer without a hook
/// answers: the same code, message, details and metadata (pushback and `RateLimit` fields; the
/// server's `date` aside).
///
/// Promise, `Refusal::default_response`: "so a hook that answers only some requests itself
/// falls back to what the layer would send".
#[tokio::test]
async fn a_hooks_fallback_is_the_layers_own_grpc_answer_field_for_field() {
    let hook = |refusal: &Refusal<'_>| refusal.default_response();
    let hooked = RateLimitLayer::new(two_policies()).on_refusal(hook);
    let hooked = sixth(serve(hooked.wrap_body()).await).await;
    let plain = sixth(serve(RateLimitLayer::new(two_policies()).wrap_body()).await).await;
    let fields = |s: &Status| {
        let mut metadata = s.metadata().clone().into_headers();
        // hyper's `date`, which two answers a second boundary apart tell apart; every field
        // the layer writes is compared.
        metadata.remove(http::header::DATE);
        (
            s.code(),
            s.message().to_owned(),
            s.details().to_vec(),
            metadata,
        )
    };
    assert_eq!(fields(&hooked), fields(&plain));
    assert!(pushback(&hooked).is_some(), "{hooked:?}");
}

/// A server bulkhead of one place, named with accents, a newline and `%41`, held by a stream:
/// a call is `RESOURCE_EXHAUSTED` naming it as written, with no pushback and no `RetryInfo`
/// (no wait ends a full bulkhead), to tonic and to grpcio.
///
/// Promise, `BulkheadFull`: "its `source` is a `tonic::Status` of `RESOURCE_EXHAUSTED` naming
/// the bulkhead"; README "gRPC": "each with the wait in a `RetryInfo` and
/// `grpc-retry-pushback-ms` where one ends it".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_bulkhead_of_any_name_is_named_as_written_with_no_pushback() {
    let bulkhead = Bulkhead::semaphore(HOSTILE, 1).build();
    let answer = refused_while_held(serve_streams!(bulkhead.body_layer())).await;
    let (tonic, grpcio) = (
        (Code::ResourceExhausted, None, None),
        ("RESOURCE_EXHAUSTED", None, None),
    );
    both_told(
        &answer,
        tonic,
        grpcio,
        &format!("bulkhead `{HOSTILE}` is full"),
    );
}

/// Overload protection of one place, named with accents, a newline and `%41`, held by a
/// stream: a shed call is `UNAVAILABLE` with a wait of one second, its message naming the
/// protection as written, to tonic and to grpcio.
///
/// Promise, `overload` "Shed answers": "a `detail` naming the protection and the wait ... A gRPC
/// call (feature `grpc`) gets `UNAVAILABLE` instead, with the same wait in
/// `grpc-retry-pushback-ms` and a `google.rpc.RetryInfo`".
#[cfg(feature = "adaptive")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_call_names_a_protection_of_any_name_as_written() {
    use tower_bulwark::bulkhead::adaptive::Limits;
    use tower_bulwark::overload::{Overload, Priority};

    let overload = Overload::builder(HOSTILE)
        .limits(Limits::new(1, 1, 1).unwrap())
        .guarantee(Priority::Critical, 0.0)
        .unwrap()
        .clock(ManualClock::new())
        .build();
    let answer = refused_while_held(serve_streams!(overload.layer())).await;
    let tonic = (Code::Unavailable, Some("1000"), Some(SECOND));
    let grpcio = ("UNAVAILABLE", Some("1000"), Some(1000));
    both_told(
        &answer,
        tonic,
        grpcio,
        &format!("'{HOSTILE}' is overloaded"),
    );
}

/// A full client bulkhead on a `Channel` (a server stream holds its one place): tonic reads
/// `RESOURCE_EXHAUSTED` naming it, with no pushback and no `RetryInfo`, and
/// `outbound::retry_after` finds no wait.
///
/// Promise, README "gRPC": "a spent client quota or a full bulkhead `RESOURCE_EXHAUSTED`, ...,
/// each with the wait in a `RetryInfo` and `grpc-retry-pushback-ms` where one ends it";
/// `outbound::retry_after`: "`None` for any other error: ..., a `BulkheadFull`".
#[tokio::test]
async fn a_full_client_bulkhead_says_no_wait() {
    let addr = serve_streams!(tower::layer::util::Identity::new());
    let bulkhead = Bulkhead::semaphore(HOSTILE, 1).build();
    let client = bulkhead.body_layer().layer(channel(addr).await);
    let mut grpc = ready(client.clone()).await.unwrap();
    let path = PathAndQuery::from_static("/test.Streams/Count");
    let codec = tonic_prost::ProstCodec::<_, crate::grpc_example::grpc::HelloReply>::default();
    let held = grpc.server_streaming(request("1000000"), path, codec).await;
    let refused = hello(client).await.unwrap_err();
    assert_eq!(
        told(&refused),
        (Code::ResourceExhausted, None, None),
        "{refused:?}"
    );
    assert!(refused.message().contains(HOSTILE), "{refused:?}");
    assert_eq!(outbound::retry_after(&refused), None);
    drop(held);
}

/// What tonic reads of a refusal by a limiter that refuses with `wait`.
async fn refused_by(wait: Duration) -> Status {
    let policy = Policy::new("user", GlobalKey, Refuses(wait)).unwrap();
    let addr = serve(RateLimitLayer::new(policy).wrap_body()).await;
    say_hello(&channel(addr).await, &[]).await.unwrap_err()
}

/// A limiter of the user's that refuses with a wait of zero (a `Decision::refused` raises it to
/// a nanosecond): tonic reads `RESOURCE_EXHAUSTED` with a pushback of 1 ms, not 0, and a
/// `RetryInfo` of the same.
///
/// Promise, `guide` "gRPC": "the pushback in whole milliseconds, never 0, and a decodable
/// `RetryInfo`"; `Decision::retry_after`: "never zero when refused".
#[tokio::test]
async fn a_refusal_of_no_wait_still_says_a_millisecond() {
    let refused = refused_by(Duration::ZERO).await;
    assert_eq!(
        told(&refused),
        (Code::ResourceExhausted, Some("1"), Some(MS))
    );
}

/// A limiter of the user's that refuses with a wait of 2^63 ms (about 292 million years, one
/// millisecond past what `grpc-retry-pushback-ms`, an `i64`, can say), or of `Duration::MAX`:
/// the pushback and the `RetryInfo` say one delay, the longest the pushback can say.
///
/// Promise, README "gRPC": "A refusal is a trailers-only `RESOURCE_EXHAUSTED` ..., with the
/// delay in `grpc-retry-pushback-ms` ... and in `grpc-status-details-bin`: a
/// `google.rpc.Status` holding a `RetryInfo`"; `Decision::retry_after` sets no bound on a
/// limiter's wait.
#[tokio::test]
async fn a_refusal_of_292_million_years_says_one_delay_in_both_fields() {
    for wait in [Duration::from_millis(1 << 63), Duration::MAX] {
        let refused = refused_by(wait).await;
        let (code, pushback, delay) = told(&refused);
        assert_eq!(code, Code::ResourceExhausted, "{refused:?}");
        let pushback: u128 = pushback.unwrap().parse().unwrap();
        assert_eq!(pushback, delay.unwrap().as_millis(), "{refused:?}");
        assert_eq!(pushback, i64::MAX as u128, "{refused:?}");
    }
}

/// A breaker open for the longest span (about 36.5 years), then a nanosecond less than that
/// later, 100 ns before it closes: tonic reads `UNAVAILABLE` with the wait in whole
/// milliseconds rounded up, never 0, in the pushback and the `RetryInfo`.
///
/// Promise, `BreakerOpen`: "its `source` is a `tonic::Status` of `UNAVAILABLE` with the wait in
/// a `RetryInfo` and `grpc-retry-pushback-ms`"; `guide` "gRPC": the pushback "in whole
/// milliseconds, never 0".
#[cfg(feature = "adaptive")]
#[tokio::test]
async fn an_open_breaker_says_its_wait_from_decades_down_to_its_last_nanosecond() {
    use tower_bulwark::outbound::breaker::{Breaker, Window};

    let two = Policy::new("two", GlobalKey, frozen(Quota::per_minute(2).unwrap())).unwrap();
    let channel = channel(serve(RateLimitLayer::new(two).wrap_body()).await).await;
    let clock = ManualClock::new();
    let breaker = Breaker::builder(HOSTILE)
        .window(Window::Calls(4))
        .minimum_calls(4)
        .open_for(Quota::MAX_SPAN)
        .clock(clock.clone())
        .build()
        .unwrap();
    let client = breaker.layer().layer(channel);
    for _ in 0..4 {
        _ = hello(client.clone()).await;
    }
    let left = [Quota::MAX_SPAN, Duration::from_nanos(100)];
    for (advance, left) in [(Duration::ZERO, left[0]), (left[0] - left[1], left[1])] {
        clock.advance(advance);
        let refused = hello(client.clone()).await.unwrap_err();
        let ms = ceil_ms(left);
        let wait = (
            Code::Unavailable,
            Some(ms.to_string()),
            Some(Duration::from_millis(ms)),
        );
        let (code, pushback, delay) = told(&refused);
        assert_eq!(
            (code, pushback.map(str::to_owned), delay),
            wait,
            "{refused:?}"
        );
        assert!(refused.message().contains(HOSTILE), "{refused:?}");
    }
}

/// A pushback obeying a server refusal of about 7.3 years (one call in the longest span), then
/// 100 ns before that hold ends: each held call comes back from tonic as `UNAVAILABLE` with the
/// hold left in whole milliseconds rounded up, never 0, in the pushback and the `RetryInfo`.
///
/// Promise, `PushedBack`: "its `source` is a `tonic::Status` of `UNAVAILABLE` ... with the wait
/// in a `RetryInfo` and `grpc-retry-pushback-ms`"; `PushedBack::retry_after`: "the same time
/// `Pushback::held_for` gave then".
#[tokio::test]
async fn a_held_call_says_the_servers_wait_from_years_down_to_its_last_nanosecond() {
    use tower_bulwark::outbound::Pushback;

    let quota = Quota::with_period(1, Quota::MAX_SPAN).unwrap();
    let once = Policy::new("once", GlobalKey, frozen(quota)).unwrap();
    let layer = RateLimitLayer::new(once).without_admitted_headers();
    let channel = channel(serve(layer.wrap_body()).await).await;
    let clock = ManualClock::new();
    let pushback = Pushback::builder(HOSTILE)
        .max_hold(Duration::MAX)
        .clock(clock.clone())
        .build();
    let client = pushback.layer().layer(channel);
    hello(client.clone()).await.unwrap();
    let server = hello(client.clone()).await.unwrap_err();
    let hold = retry_delay(&server).unwrap();
    assert_eq!(
        hold,
        Duration::from_millis(ceil_ms(Quota::MAX_SPAN)),
        "{server:?}"
    );
    let last = Duration::from_nanos(100);
    for (advance, left) in [(Duration::ZERO, hold), (hold - last, last)] {
        clock.advance(advance);
        assert_eq!(pushback.held_for(), left);
        let held = hello(client.clone()).await.unwrap_err();
        let ms = ceil_ms(left);
        let (code, told_ms, delay) = told(&held);
        let wait = (
            Code::Unavailable,
            Some(ms.to_string()),
            Some(Duration::from_millis(ms)),
        );
        assert_eq!((code, told_ms.map(str::to_owned), delay), wait, "{held:?}");
    }
}
