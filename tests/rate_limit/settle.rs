//! Costs settled from the response, inbound: a request reserves an estimate (its `max_tokens`)
//! and is settled to what its response reports, from a usage header, a JSON body or the last
//! event of a server-sent-event stream, read as the body streams by. Refusals speak in tokens.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{Policy, RateLimitLayer};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::Quota;

use crate::support::{drain, header_cost, header_key, keyed, retry_after, Handler};

/// A request of `max` tokens for tenant `t`; the handler answers that it used `used`.
fn request(max: u32, used: u32) -> Request<Body> {
    Request::builder()
        .uri("/v1/complete")
        .header("x-tenant", "t")
        .header("x-max-tokens", max.to_string())
        .header("x-used", used.to_string())
        .body(Body::empty())
        .unwrap()
}

/// How the handler reports what a request used.
#[derive(Clone, Copy)]
enum Report {
    Header,
    Json,
    /// An event stream, sent in chunks of this many bytes.
    Sse(usize),
}

fn handler(report: Report, calls: Arc<AtomicUsize>) -> Handler {
    Handler::new(service_fn(move |request: Request<Body>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let used: u32 = request.headers()["x-used"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let response = match report {
            Report::Header => Response::builder()
                .header("x-usage-total-tokens", used.to_string())
                .body(Body::from("done"))
                .unwrap(),
            Report::Json => Response::new(Body::from(format!(
                r#"{{"id":"c1","choices":[{{"text":"a \"usage\":{{\"total_tokens\":1}} echo"}}],"usage":{{"prompt_tokens":1,"total_tokens":{used}}}}}"#
            ))),
            Report::Sse(chunk) => {
                let stream = format!(
                    "data: {{\"choices\":[{{\"delta\":\"he\"}}]}}\r\n\r\n: keep-alive\r\n\r\n\
                     data: {{\"choices\":[],\"usage\":{{\"total_tokens\":{used}}}}}\r\n\r\ndata: [DONE]\r\n\r\n"
                )
                .into_bytes();
                let chunks: Vec<Result<Bytes, Infallible>> = stream
                    .chunks(chunk)
                    .map(|c| Ok(Bytes::copy_from_slice(c)))
                    .collect();
                Response::new(Body::from_stream(futures::stream::iter(chunks)))
            }
        };
        async move { Ok::<_, Infallible>(response) }
    }))
}

fn tokens_policy(
    limiter: &tower_bulwark::KeyedRateLimiter<String, tower_bulwark::algorithm::Gcra, ManualClock>,
    report: Report,
) -> Policy<
    impl tower_bulwark::rate_limit::KeyExtractor<Key = String>,
    impl tower_bulwark::Limiter<String>,
> {
    let policy = Policy::new("tokens", header_key("x-tenant"), limiter.clone())
        .unwrap()
        .cost_by(header_cost("x-max-tokens"));
    match report {
        Report::Header => policy.settle_by(|response| {
            response
                .headers
                .get("x-usage-total-tokens")?
                .to_str()
                .ok()?
                .parse()
                .ok()
        }),
        Report::Json => {
            policy.settle_from_body(BodyUsage::json(["usage", "total_tokens"]).unwrap())
        }
        Report::Sse(_) => {
            policy.settle_from_body(BodyUsage::sse(["usage", "total_tokens"]).unwrap())
        }
    }
}

/// A limiter of 10 000 tokens a minute per tenant, on `clock`.
fn ten_thousand_a_minute(
    clock: &ManualClock,
) -> tower_bulwark::KeyedRateLimiter<String, tower_bulwark::algorithm::Gcra, ManualClock> {
    keyed::<String>(Quota::per_minute(10_000).unwrap(), clock)
}

/// The tokens policy on `limiter` over a handler that reports usage in a header.
fn reported_in_a_header(
    limiter: &tower_bulwark::KeyedRateLimiter<String, tower_bulwark::algorithm::Gcra, ManualClock>,
) -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = impl std::fmt::Debug,
    Future = impl Send,
> + Clone {
    RateLimitLayer::new(tokens_policy(limiter, Report::Header))
        .layer(handler(Report::Header, Arc::default()))
}

/// Asserts that `service` refuses a request of 1 token with a `Retry-After` of `secs`.
async fn assert_refused_for<S>(service: &S, secs: u64)
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone,
    S::Error: std::fmt::Debug,
{
    let refused = service.clone().oneshot(request(1, 1)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some(secs));
}

/// The `RateLimit` field of the response `service` answers `request` with.
async fn ratelimit_field<S>(service: &S, request: Request<Body>) -> String
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone,
    S::Error: std::fmt::Debug,
{
    let response = service.clone().oneshot(request).await.unwrap();
    response.headers()["ratelimit"].to_str().unwrap().to_owned()
}

/// 10 000 tokens a minute; each request reserves 1 000 and uses 500: nineteen are admitted, not
/// ten (the twentieth needs 1 000 where 500 are left), and its refusal speaks in tokens: its
/// Retry-After is when 500 more are back, 3 s at one token every 6 ms. Whichever way the usage
/// is reported, and in whatever chunks the body comes.
#[tokio::test]
async fn a_tenant_gets_the_tokens_it_used_not_the_tokens_it_asked_for() {
    for report in [Report::Header, Report::Json, Report::Sse(7), Report::Sse(1)] {
        let clock = ManualClock::new();
        let limiter = ten_thousand_a_minute(&clock);
        let calls = Arc::new(AtomicUsize::new(0));
        let service = RateLimitLayer::new(tokens_policy(&limiter, report))
            .wrap_body()
            .layer(handler(report, calls.clone()));
        for i in 0..19 {
            let response = service.clone().oneshot(request(1000, 500)).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "request {i}");
            // The body read to its end: the settle happens there.
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert!(!body.is_empty());
        }
        let refused = service.clone().oneshot(request(1000, 500)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after(&refused), Some(3));
        let fields = refused.headers()["ratelimit"].to_str().unwrap().to_string();
        assert!(fields.contains("r=500"), "{fields}");
        assert_eq!(calls.load(Ordering::SeqCst), 19);
        assert_eq!(drain(&limiter, "t"), 500);
    }
}

/// The admitted response's `RateLimit` field tells the state after a head settle, in tokens.
#[tokio::test]
async fn the_admitted_headers_count_in_tokens_after_the_settle() {
    let clock = ManualClock::new();
    let limiter = ten_thousand_a_minute(&clock);
    let service = reported_in_a_header(&limiter);
    // Debt: 12 000 used of 10 000 on the second; the field says nothing is left.
    for (max, used, left) in [(4000, 3000, "r=7000"), (4000, 9000, "r=0")] {
        let fields = ratelimit_field(&service, request(max, used)).await;
        assert!(fields.contains(left), "{fields}");
    }
    // 2 000 tokens of debt (12 s) before the next token: the refusal says 13 s (rounded up).
    assert_refused_for(&service, 13).await;
}

/// The admitted response's `RateLimit` field tells when the key is whole again after the
/// settle, not after the estimate: 10 000 tokens a minute (6 ms a token). 9 000 used: `t=54`.
/// A request of 1 000 settled to 100 leaves 9 100 used, 54.6 s: `r=900;t=55` (the estimate
/// alone said 60). One of 100 settled to 900 leaves 10 000 used: `r=0;t=60` (the estimate alone
/// said 55); 60 ms later, one of 10 settled to 2 000 leaves 1 990 of debt: `t=72`, and the next
/// refusal waits for it.
#[tokio::test]
async fn the_headers_after_a_settle_tell_when_the_key_is_whole_again() {
    let clock = ManualClock::new();
    let limiter = ten_thousand_a_minute(&clock);
    let service = reported_in_a_header(&limiter);
    for (max, used, state) in [
        (9000, 9000, "r=1000;t=54"),
        (1000, 100, "r=900;t=55"),
        (100, 900, "r=0;t=60"),
    ] {
        let field = ratelimit_field(&service, request(max, used)).await;
        assert!(field.ends_with(state), "{field}");
    }
    // Let 10 tokens come back (60 ms), then settle 10 to 2 000.
    clock.advance(std::time::Duration::from_millis(60));
    let field = ratelimit_field(&service, request(10, 2000)).await;
    assert!(field.ends_with("r=0;t=72"), "{field}");
    // 1 990 tokens of debt (11.94 s) and the one asked for: 12 s.
    assert_refused_for(&service, 12).await;
}

/// A body dropped before its end settles to what it had read: an event stream whose usage
/// event went by settles to it; one dropped before keeps the estimate.
#[tokio::test]
async fn a_body_dropped_half_way_settles_to_what_was_read() {
    let clock = ManualClock::new();
    let limiter = ten_thousand_a_minute(&clock);
    let service = RateLimitLayer::new(tokens_policy(&limiter, Report::Sse(16)))
        .wrap_body()
        .layer(handler(Report::Sse(16), Arc::default()));
    let body_of_a_request = || async {
        let response = service.clone().oneshot(request(1000, 10)).await.unwrap();
        response.into_body()
    };
    // Read one chunk, then drop: the usage event has not gone by; 1 000 stay spent.
    let mut body = body_of_a_request().await;
    body.frame().await.unwrap().unwrap();
    drop(body);
    // Read all but the last chunk (the usage event went by), then drop: settled to 10.
    let mut body = body_of_a_request().await;
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        read.extend_from_slice(frame.unwrap().data_ref().unwrap());
        if read.windows(5).any(|w| w == b"[DONE") {
            break;
        }
    }
    drop(body);
    assert_eq!(drain(&limiter, "t"), 10_000 - 1000 - 10);
}

/// Another policy refuses: the tokens policy's estimate goes back, and no settle follows (the
/// inner service never ran). A settle function that panics keeps the estimate; one that
/// finds nothing keeps it too.
#[tokio::test]
async fn a_refused_request_settles_nothing_and_a_bad_settle_keeps_the_estimate() {
    let clock = ManualClock::new();
    let tokens = ten_thousand_a_minute(&clock);
    let per_tenant = keyed::<String>(Quota::per_minute(2).unwrap(), &clock);
    let calls = Arc::new(AtomicUsize::new(0));
    let policies = tokens_policy(&tokens, Report::Header)
        .and(Policy::new("requests", header_key("x-tenant"), per_tenant.clone()).unwrap());
    let service = RateLimitLayer::new(policies).layer(handler(Report::Header, calls.clone()));
    for _ in 0..2 {
        let ok = service.clone().oneshot(request(1000, 10)).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let refused = service.clone().oneshot(request(1000, 10)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(drain(&tokens, "t"), 10_000 - 20);

    let tokens = ten_thousand_a_minute(&clock);
    let panics = Policy::new("tokens", header_key("x-tenant"), tokens.clone())
        .unwrap()
        .cost_by(header_cost("x-max-tokens"))
        .settle_by(|response| {
            if response.headers.contains_key("x-usage-total-tokens") {
                panic!("a settle function that fails");
            }
            None
        });
    let service = RateLimitLayer::new(panics).layer(handler(Report::Header, Arc::default()));
    let response = service.clone().oneshot(request(1000, 10)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(drain(&tokens, "t"), 10_000 - 1000);
}

/// A body settle without `wrap_body` would never happen: the layer says so when it is applied.
#[test]
#[should_panic(expected = "the rate-limit policy `tokens` settles its cost from the response body")]
fn a_body_settle_without_wrap_body_is_refused_when_the_layer_is_applied() {
    let clock = ManualClock::new();
    let limiter = ten_thousand_a_minute(&clock);
    let _ = RateLimitLayer::new(tokens_policy(&limiter, Report::Json))
        .layer(handler(Report::Json, Arc::default()));
}

/// An answer in one of the shapes an LLM route gives, with its `Content-Type`: JSON, an event
/// stream, or the service's own error (JSON or streamed) that reports no usage.
fn shaped_answer(shape: &str, used: u32) -> Response<Body> {
    let (status, content_type, body) = match shape {
        "json" => (
            StatusCode::OK,
            "Application/JSON",
            format!(r#"{{"usage":{{"total_tokens":{used}}}}}"#),
        ),
        "sse" => (
            StatusCode::OK,
            "text/event-stream; charset=utf-8",
            format!(
                "data: {{\"choices\":[]}}\n\ndata: {{\"usage\":{{\"total_tokens\":{used}}}}}\n\n\
                 data: [DONE]\n\n"
            ),
        ),
        "error-json" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "application/problem+json",
            r#"{"title":"client quota spent"}"#.to_owned(),
        ),
        "error-with-usage" => (
            StatusCode::BAD_GATEWAY,
            "application/json",
            format!(r#"{{"error":"cut short","usage":{{"total_tokens":{used}}}}}"#),
        ),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/event-stream",
            "data: {\"error\":\"upstream unavailable\"}\n\n".to_owned(),
        ),
    };
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap()
}

/// One policy, one path, on a route that answers JSON or an event stream (`"stream": true`):
/// each answer is read in the shape its `Content-Type` names, whichever constructor made the
/// `BodyUsage`, and moves the key by what it used. The service's own error answers, streamed
/// or not, report no usage and cost nothing (no trick in the error body); an error that reports
/// usage (an upstream cut short) costs what it reports.
#[tokio::test]
async fn one_policy_settles_json_and_event_streams_and_an_error_costs_nothing() {
    let total = ["usage", "total_tokens"];
    for usage in [
        BodyUsage::json(total).unwrap(),
        BodyUsage::sse(total).unwrap(),
    ] {
        let clock = ManualClock::new();
        let limiter = ten_thousand_a_minute(&clock);
        let policy = Policy::new("tokens", header_key("x-tenant"), limiter.clone())
            .unwrap()
            .cost_by(header_cost("x-max-tokens"))
            .settle_from_body(usage.clone());
        let service = RateLimitLayer::new(policy)
            .wrap_body()
            .layer(Handler::new(service_fn(|request: Request<Body>| {
                let shape = request.headers()["x-shape"].to_str().unwrap().to_owned();
                let used = request.headers()["x-used"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                async move { Ok::<_, Infallible>(shaped_answer(&shape, used)) }
            })));
        let mut left: u64 = 10_000;
        for (shape, used) in [
            ("json", 300),
            ("sse", 200),
            ("error-json", 0),
            ("error-sse", 0),
            ("error-with-usage", 70),
        ] {
            let mut request = request(1000, used);
            request
                .headers_mut()
                .insert("x-shape", shape.parse().unwrap());
            let response = service.clone().oneshot(request).await.unwrap();
            response.into_body().collect().await.unwrap();
            left -= u64::from(used);
            let mut probe = self::request(1, 1);
            probe
                .headers_mut()
                .insert("x-shape", "json".parse().unwrap());
            let probe = service.clone().oneshot(probe).await.unwrap();
            let after = probe.headers()["ratelimit"].to_str().unwrap().to_owned();
            left -= 1;
            assert!(
                after.contains(&format!("r={left};")),
                "{usage:?} {shape}: {after}"
            );
        }
        assert_eq!(drain(&limiter, "t"), left, "{usage:?}");
    }
}

/// A settle far past what one request may take is charged as that (the limiter's rule), and the
/// admitted response's `RateLimit` field says so: 10 000 tokens a minute, a request of 10
/// settled to a million leaves the key spent for the minute, `r=0;t=60`, and the next token is
/// 6 ms away (the field said `t=6000`, the million's 100 minutes, before).
#[tokio::test]
async fn a_settle_past_the_capacity_is_told_as_the_limiter_charges_it() {
    let clock = ManualClock::new();
    let limiter = ten_thousand_a_minute(&clock);
    let service = reported_in_a_header(&limiter);
    let field = ratelimit_field(&service, request(10, 1_000_000)).await;
    assert!(field.ends_with("r=0;t=60"), "{field}");
    assert_refused_for(&service, 1).await;
    clock.advance(std::time::Duration::from_millis(6));
    assert_eq!(drain(&limiter, "t"), 1);
}
