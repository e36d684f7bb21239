//! What a layer keeps of its gRPC refusals, one value per set of violated policies (the message
//! and the `google.rpc.Status` up to its `RetryInfo`), tried against refusals that differ in
//! every other way: another set of policies, another delay, a call that no wait lets through.
//! Each refusal must say its own policies and its own delay, never a value kept from another.

use crate::common::keyed_on;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt;
use tower::ServiceExt;
use tower_bulwark::algorithm::Gcra;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
use tower_bulwark::{KeyedRateLimiter, Quota};

/// What a client reads of a refusal: the message, the violated policies of the `QuotaFailure`,
/// the pushback, and the `RetryInfo` if there is one.
#[derive(Debug, PartialEq)]
struct Read {
    message: String,
    subjects: Vec<String>,
    pushback_ms: i64,
    retry_info: Option<Duration>,
}

fn read(response: &http::Response<axum::body::Body>) -> Read {
    let headers = response.headers();
    assert_eq!(headers.get("grpc-status").unwrap(), "8");
    let status = Status::from_header_map(headers).unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let details = <tonic_types::pb::Status as prost::Message>::decode(status.details()).unwrap();
    // grpcio's `rpc_status.from_call` requires both to be the call's.
    assert_eq!(details.code, Code::ResourceExhausted as i32);
    assert_eq!(details.message, status.message());
    let errors = status.get_error_details();
    Read {
        message: status.message().to_owned(),
        subjects: (errors.quota_failure().unwrap().violations.iter())
            .map(|v| v.subject.clone())
            .collect(),
        pushback_ms: (headers
            .get("grpc-retry-pushback-ms")
            .unwrap()
            .to_str()
            .unwrap())
        .parse()
        .unwrap(),
        retry_info: errors.retry_info().map(|info| info.retry_delay.unwrap()),
    }
}

/// One gRPC call at a time through a layer of `policies`, on a runtime of its own, for tests that
/// are not async (proptests).
pub fn grpc_calls(
    policies: Vec<Policy<GlobalKey, KeyedRateLimiter<(), Gcra, ManualClock>>>,
) -> impl Fn() -> http::Response<axum::body::Body> {
    let service = tower::Layer::layer(
        &RateLimitLayer::new(policies),
        tower::service_fn(|_: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    move || {
        let request = http::Request::builder()
            .header("content-type", "application/grpc")
            .body(axum::body::Body::empty())
            .unwrap();
        runtime.block_on(service.clone().oneshot(request)).unwrap()
    }
}

fn expected(message: &str, subjects: &[&str], pushback_ms: i64) -> Read {
    Read {
        message: message.to_owned(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        pushback_ms,
        retry_info: u64::try_from(pushback_ms).ok().map(Duration::from_millis),
    }
}

/// Two policies, each taking part only in calls that carry its header (`x-big` makes `a`'s
/// cost more than it can ever admit): refusals of `a`, of `b`, of both, of `a` later, and of
/// `a` for a call it can never admit, in an order where each follows one of another kind.
#[tokio::test]
async fn each_refusal_says_its_own_policies_and_delay() {
    let clock = ManualClock::new();
    let limiter = |quota| keyed_on::<(), _>(quota, &clock);
    let a = Policy::new("a", GlobalKey, limiter(Quota::per_hour(1).unwrap()))
        .unwrap()
        .cost_by(|request| match request.headers.get("x-a") {
            Some(_) if request.headers.contains_key("x-big") => 5,
            Some(_) => 1,
            None => 0,
        });
    let b = Policy::new("b", GlobalKey, limiter(Quota::per_minute(1).unwrap()))
        .unwrap()
        .cost_by(|request| u32::from(request.headers.contains_key("x-b")));
    let service = tower::Layer::layer(
        &RateLimitLayer::new(a.and(b)),
        tower::service_fn(|_: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    let call = |headers: &[&str]| {
        let mut request = http::Request::builder().header("content-type", "application/grpc");
        for name in headers {
            request = request.header(*name, "1");
        }
        service
            .clone()
            .oneshot(request.body(axum::body::Body::empty()).unwrap())
    };
    for spend in [&["x-a"][..], &["x-b"]] {
        let admitted = call(spend).await.unwrap();
        assert!(admitted.headers().get("grpc-status").is_none());
    }
    let only_a = expected("rate limit exceeded: a", &["a"], 3_600_000);
    assert_eq!(read(&call(&["x-a"]).await.unwrap()), only_a);
    let only_b = expected("rate limit exceeded: b", &["b"], 60_000);
    assert_eq!(read(&call(&["x-b"]).await.unwrap()), only_b);
    let both = expected("rate limit exceeded: a, b", &["a", "b"], 3_600_000);
    assert_eq!(read(&call(&["x-a", "x-b"]).await.unwrap()), both);
    assert_eq!(read(&call(&["x-b"]).await.unwrap()), only_b);

    // Later, the same set: the kept part is the same, the delay is the new one.
    clock.advance(Duration::from_secs(1_800));
    let later = expected("rate limit exceeded: a", &["a"], 1_800_000);
    assert_eq!(read(&call(&["x-a"]).await.unwrap()), later);

    // A delay of another size of `Duration` (seconds of one byte, nanoseconds of five).
    clock.advance(Duration::from_millis(1_798_500));
    let last = expected("rate limit exceeded: a", &["a"], 1_500);
    assert_eq!(read(&call(&["x-a"]).await.unwrap()), last);

    // A call that no wait lets through, of the same set: said otherwise, and it leaves the kept
    // part as it was.
    let never = expected(
        "rate limit exceeded: the call costs more than a can ever admit",
        &["a"],
        -1,
    );
    assert_eq!(read(&call(&["x-a", "x-big"]).await.unwrap()), never);
    assert_eq!(read(&call(&["x-a"]).await.unwrap()), last);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(100))]

    /// One layer refusing again and again as its clock moves on by any steps: each refusal's
    /// `RetryInfo` and pushback are the wait left, in whole milliseconds rounded up, whatever
    /// size its `Duration` takes and whichever sizes the layer met before.
    #[test]
    fn the_delay_is_each_refusals_own_as_time_passes(
        period_ns in 2u64..10_000_000_000_000,
        steps in proptest::collection::vec(0.0f64..0.5, 1..12),
    ) {
        let clock = ManualClock::new();
        let quota = Quota::with_period(1, Duration::from_nanos(period_ns)).unwrap();
        let limiter = keyed_on::<(), _>(quota, &clock);
        let call = grpc_calls(vec![Policy::new("p", GlobalKey, limiter).unwrap()]);
        call();
        let mut left = period_ns;
        for step in steps {
            // Each step a fraction of what is left, so that the permit never comes back.
            let by = (left as f64 * step) as u64;
            clock.advance(Duration::from_nanos(by));
            left -= by;
            let pushback = i64::try_from(left.div_ceil(1_000_000).max(1)).unwrap();
            proptest::prop_assert_eq!(read(&call()), expected("rate limit exceeded: p", &["p"], pushback));
        }
    }
}
