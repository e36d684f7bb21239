//! Hostile settles through the HTTP layer: bodies split at every byte, with trailers, failing
//! or dropped mid-number; response futures dropped at every poll; hostile usage bodies; two
//! settle policies on one key and limiter; panics beside other policies; shadows; refusals;
//! stacked layers, a `Vec` of boxed policies, reservations that waited, racing tasks, debt.

use std::convert::Infallible;
use std::task::Poll;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::algorithm::{Algorithm, Gcra, SlidingLog};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::rate_limit::{KeyExtractor, Policy, RateLimitLayer};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{BoxError, KeyedRateLimiter, Quota};

use crate::common::poll_once;
use crate::support::{header_cost, header_key, retry_after, yields};

pub(crate) type Tokens<A = Gcra> = KeyedRateLimiter<String, A, ManualClock>;

/// The tokens a tenant has a minute (one every 6 ms).
pub(crate) const Q: u64 = 10_000;
pub(crate) const TOTAL: [&str; 2] = ["usage", "total_tokens"];

pub(crate) fn tokens<A: Algorithm>(clock: &ManualClock) -> Tokens<A> {
    KeyedRateLimiter::builder(Quota::per_minute(Q as u32).unwrap())
        .algorithm::<A>()
        .clock(clock.clone())
        .build()
}

pub(crate) fn drain<A: Algorithm>(l: &Tokens<A>) -> u64 {
    let key = "t".to_string();
    (0..=Q).take_while(|_| l.check(&key).allowed).count() as u64
}

pub(crate) fn json() -> BodyUsage {
    BodyUsage::json(TOTAL).unwrap()
}

pub(crate) fn usage(sse: bool) -> BodyUsage {
    (if sse { BodyUsage::sse } else { BodyUsage::json })(TOTAL).unwrap()
}

/// A request of tenant `t` with these headers.
pub(crate) fn request(headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::builder().uri("/v1").header("x-tenant", "t");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).unwrap()
}

/// The response to a request with these headers.
pub(crate) async fn call<S, B>(service: S, headers: &[(&str, &str)]) -> Response<B>
where
    S: tower::Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    service.oneshot(request(headers)).await.unwrap()
}

/// The settled cost in response header `x-used`.
fn used(parts: &http::response::Parts) -> Option<u32> {
    parts.headers.get("x-used")?.to_str().ok()?.parse().ok()
}

/// The response's `RateLimit` field.
fn rl<B>(response: &Response<B>) -> &str {
    response.headers()["ratelimit"].to_str().unwrap()
}

/// A policy on `l` reserving the request's `x-est` (1 000 without it).
pub(crate) fn policy<A: Algorithm>(
    name: &str,
    l: &Tokens<A>,
) -> Policy<impl KeyExtractor<Key = String>, Tokens<A>> {
    let cost = header_cost("x-est");
    fixed(name, l, 0).cost_by(move |head| if cost(head) == 1 { 1000 } else { cost(head) })
}

/// A policy on `l` reserving `cost` for every request.
fn fixed<A: Algorithm>(
    name: &str,
    l: &Tokens<A>,
    cost: u32,
) -> Policy<impl KeyExtractor<Key = String>, Tokens<A>> {
    Policy::new(name, header_key("x-tenant"), l.clone())
        .unwrap()
        .cost(cost)
}

/// A body of these data frames, then the trailers, then a failure, as asked.
pub(crate) fn frames(chunks: Vec<Bytes>, trailers: Option<HeaderMap>, fail: bool) -> Body {
    let mut frames: Vec<Result<Frame<Bytes>, BoxError>> =
        chunks.into_iter().map(|c| Ok(Frame::data(c))).collect();
    frames.extend(trailers.map(|t| Ok(Frame::trailers(t))));
    if fail {
        frames.push(Err("the upstream reset the stream".into()));
    }
    Body::new(StreamBody::new(futures::stream::iter(frames)))
}

/// A handler answering every request with `make(request)`.
macro_rules! answer {
    ($make:expr) => {{
        let make = $make;
        service_fn(move |request: Request<Body>| {
            let response: Response<Body> = make(request);
            async move { Ok::<_, Infallible>(response) }
        })
    }};
}

/// A handler that echoes the request's `x-status`, `x-used` (a header) and `x-body` (the JSON
/// body's `usage.total_tokens`).
macro_rules! echo {
    () => {
        answer!(|request: Request<Body>| {
            let h = request.headers();
            let mut response = Response::builder();
            if let Some(status) = h.get("x-status") {
                response = response.status(status.to_str().unwrap());
            }
            if let Some(n) = h.get("x-used") {
                response = response.header("x-used", n);
            }
            let body = h.get("x-body").map(|n| n.to_str().unwrap().to_string());
            let body = body.map(|n| format!(r#"{{"usage":{{"total_tokens":{n}}}}}"#));
            response.body(Body::from(body.unwrap_or_default())).unwrap()
        })
    };
}

/// A JSON body and an event stream, each split in two at every byte (empty frames at the
/// ends), then trailers: body and trailers reach the client unchanged, and the settle is
/// exactly the usage (not the 1 in the echoed prompt, not the 5 of the earlier event).
#[tokio::test]
async fn body_settles_hold_at_every_split_and_keep_the_trailers() {
    let json_body: &'static [u8] =
        br#"{"x":"\"usage\":{\"total_tokens\":1}","usage":{"prompt_tokens":9,"total_tokens":123}}"#;
    let sse: &'static [u8] = b"data: {\"usage\":{\"total_tokens\":5}}\r\n\r\n: ping\r\n\r\n\
        data: {\"choices\":[],\"usage\":{\"total_tokens\":123}}\r\n\r\ndata: [DONE]\r\n\r\n";
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", HeaderValue::from_static("abc"));
    for (is_sse, body) in [(false, json_body), (true, sse)] {
        for cut in 0..=body.len() {
            let l = tokens::<Gcra>(&ManualClock::new());
            let sent = trailers.clone();
            let service = RateLimitLayer::new(policy("tokens", &l).settle_from_body(usage(is_sse)));
            let service = service.wrap_body().layer(answer!(move |_| {
                let b = Bytes::from_static(body);
                let chunks = vec![b.slice(..cut), b.slice(cut..)];
                Response::new(frames(chunks, Some(sent.clone()), false))
            }));
            let response = call(service, &[]).await;
            let collected = response.into_body().collect().await.unwrap();
            let at = format!("sse {is_sse} cut {cut}");
            assert_eq!(collected.trailers(), Some(&trailers), "{at}");
            assert_eq!(collected.to_bytes(), body, "{at}");
            assert_eq!(drain(&l), Q - 123, "{at}");
        }
    }
}

/// A body that fails or is dropped after its usage went by settles to it; before (mid-number:
/// `4` of `42` is not a cost yet) it keeps the estimate. The failure reaches the client.
#[tokio::test]
async fn a_body_that_fails_or_is_dropped_settles_only_to_a_cost_it_read_whole() {
    let body: &'static [u8] = br#"{"usage":{"total_tokens":42},"id":"x"}"#;
    let n = body.iter().position(|&b| b == b'4').unwrap();
    for (cut, want) in [(n, 1000), (n + 1, 1000), (n + 3, 42), (body.len(), 42)] {
        for fail in [false, true] {
            let l = tokens::<Gcra>(&ManualClock::new());
            let service = RateLimitLayer::new(policy("tokens", &l).settle_from_body(json()));
            let service = service.wrap_body().layer(answer!(move |_| {
                let b = Bytes::from_static(body);
                Response::new(frames(vec![b.slice(..cut), b.slice(cut..)], None, fail))
            }));
            let mut response = call(service, &[]).await.into_body();
            let first = response.frame().await.unwrap().unwrap();
            assert_eq!(first.into_data().unwrap(), body[..cut]);
            if fail {
                response.frame().await.unwrap().unwrap();
                let failure = response.frame().await.unwrap();
                assert!(failure.is_err(), "the failure goes on");
                assert!(response.frame().await.is_none());
            }
            drop(response);
            // Failing, both chunks were read (the whole body): the usage went by.
            let want = if fail { 42 } else { want };
            assert_eq!(drain(&l), Q - want, "cut {cut}, failed {fail}");
        }
    }
}

/// The response future dropped after every number of polls, while the handler is still busy:
/// each policy's estimate stands (a settle needs the response); once it answers, the head
/// settles, and the body policy's response, dropped unread, keeps its estimate.
#[tokio::test]
async fn a_response_future_dropped_at_every_poll_keeps_each_estimate() {
    for polls in 0..8 {
        let clock = ManualClock::new();
        let (head, body) = (tokens::<Gcra>(&clock), tokens::<SlidingLog>(&clock));
        let policies = policy("head", &head)
            .settle_by(used)
            .and(policy("body", &body).settle_from_body(json()));
        let handler = service_fn(|_: Request<Body>| async {
            yields(3).await;
            let response = Response::builder().header("x-used", "10");
            let body = Body::from(r#"{"usage":{"total_tokens":7}}"#);
            Ok::<_, Infallible>(response.body(body).unwrap())
        });
        let service = RateLimitLayer::new(policies).wrap_body().layer(handler);
        let mut future = std::pin::pin!(service.oneshot(request(&[])));
        let answered = (0..polls).find_map(|_| match poll_once(future.as_mut()) {
            Poll::Ready(response) => Some(response.unwrap()),
            Poll::Pending => None,
        });
        // Never polled: nothing was decided, nothing is spent.
        let (done, est) = (answered.is_some(), if polls == 0 { 0 } else { 1000 });
        drop(answered);
        let head_cost = if done { 10 } else { est };
        assert_eq!(drain(&head), Q - head_cost, "{polls} polls");
        assert_eq!(drain(&body), Q - est, "{polls} polls");
    }
}

/// Hostile usage bodies (`want mode body`; `j` JSON, `s` events; `E` the estimate, `C` the
/// capacity; `¤` a byte that is not UTF-8, `␍` a CR, `⏎` a LF, `DEEP` 100 000 arrays deep).
const HOSTILE: &str = r#"
C j {"usage":{"total_tokens":4294967301}}
C j {"usage":{"total_tokens":18446744073709551615}}
E j {"usage":{"total_tokens":18446744073709551621}}
0 j {"usage":{"total_tokens":0}}
E j {"x":DEEP,"usage":{"total_tokens":7}}
7 j {"usage":{"total_tokens":7},"x":DEEP}
E j {"a":1,¤"usage":{"total_tokens":7}}
3 j {"usage":{"total_tokens":3},"usage":{"total_tokens":900}}
E j {"usage":[{"total_tokens":3}]}
E j 
E s database: {"usage":{"total_tokens":1}}⏎⏎
C s data: {"usage":{"total_tokens":4294967301}}⏎⏎
9 s data: {"usage":{"total_tokens":3}}␍␍data: {"usage":{"total_tokens":9}}␍␍
8 s data: DEEP⏎⏎data: {"usage":{"total_tokens":8}}⏎⏎
"#;

/// Each hostile body in one frame and in frames of one byte: numbers past `u32` are charged
/// as the capacity (never truncated to a few tokens); past `u64`, nested too deep first, not
/// UTF-8, a field that only starts like `data`: the estimate. The body always goes unchanged.
#[tokio::test]
async fn hostile_usage_bodies_settle_as_the_docs_say() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for case in HOSTILE.lines().filter(|line| !line.is_empty()) {
        let [want, mode, body] =
            <[&str; 3]>::try_from(case.splitn(3, ' ').collect::<Vec<_>>()).unwrap();
        let want = match want {
            "E" => 1000,
            "C" => Q,
            n => n.parse().unwrap(),
        };
        let body = body.replace("DEEP", &deep).replace('␍', "\r");
        let body = body.replace('⏎', "\n");
        let mut bytes = Vec::new();
        for (i, part) in body.split('¤').enumerate() {
            bytes.extend(if i > 0 { &[0xff][..] } else { &[] });
            bytes.extend(part.as_bytes());
        }
        let body = bytes;
        for one_byte in [false, true] {
            let l = tokens::<Gcra>(&ManualClock::new());
            let sent = Bytes::from(body.clone());
            let policy = policy("tokens", &l).settle_from_body(usage(mode == "s"));
            let service = RateLimitLayer::new(policy);
            let service = service.wrap_body().layer(answer!(move |_| {
                let size = if one_byte { 1 } else { sent.len().max(1) };
                let at = (0..sent.len()).step_by(size);
                let chunks = at.map(|at| sent.slice(at..(at + size).min(sent.len())));
                Response::new(frames(chunks.collect(), None, false))
            }));
            let response = call(service, &[]).await;
            let got = response.into_body().collect().await.unwrap().to_bytes();
            assert!(got == body, "{case:.60}: the body changed");
            assert_eq!(drain(&l), Q - want, "{case:.60}, one byte: {one_byte}");
        }
    }
}

/// Two settle policies on one key of one limiter, one from the head and one from the body, in
/// every direction (given back, charged, both): the key ends at exactly what both cost.
#[tokio::test]
async fn two_settle_policies_on_one_key_and_limiter_add_up() {
    async fn run<A: Algorithm>() {
        let rows = [
            (3000, 100, 2000, 50),
            (100, 900, 2000, 10),
            (500, 900, 400, 800),
        ];
        for (a_est, a, b_est, b) in rows.into_iter().chain([(3000, 0, 3000, 0)]) {
            let l = tokens::<A>(&ManualClock::new());
            let policies = fixed("head", &l, a_est)
                .settle_by(used)
                .and(fixed("body", &l, b_est).settle_from_body(json()));
            let service = RateLimitLayer::new(policies).wrap_body().layer(echo!());
            let (a_s, b_s) = (a.to_string(), b.to_string());
            let response = call(service, &[("x-used", &a_s), ("x-body", &b_s)]).await;
            assert_eq!(response.status(), StatusCode::OK);
            response.into_body().collect().await.unwrap();
            let who = std::any::type_name::<A>();
            assert_eq!(drain(&l), Q - a - b, "{who}: {a_est}, {a}, {b_est}, {b}");
        }
    }
    run::<Gcra>().await;
    run::<SlidingLog>().await;
}

/// `count_if` replaces an earlier `settle_by`: a response that does not count gives everything
/// back (and its header says so), one that counts keeps the estimate, not what `settle_by`
/// would have said. A policy of cost zero is out of the request: its settle charges nothing.
#[tokio::test]
async fn count_if_replaces_settle_by_and_a_zero_cost_settles_nothing() {
    let clock = ManualClock::new();
    let (l, zero) = (tokens::<Gcra>(&clock), tokens::<Gcra>(&clock));
    let counted = fixed("failures", &l, 5)
        .settle_by(|_| Some(1))
        .count_if(|parts| parts.status == StatusCode::INTERNAL_SERVER_ERROR);
    let free = fixed("free", &zero, 0).settle_by(|_| Some(5000));
    let service = RateLimitLayer::new(counted.and(free)).layer(echo!());
    let ok = call(service.clone(), &[]).await;
    assert_eq!(rl(&ok), format!(r#""failures";r={Q};t=60"#));
    let failed = call(service, &[("x-status", "500")]).await;
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!((drain(&l), drain(&zero)), (Q - 5, Q));
}

/// A settle function that panics keeps its own policy's estimate and no other's, whichever
/// side of the chain it is on, and so does a panicking `count_if` (it counts); the request is
/// answered.
#[tokio::test]
async fn a_panicking_settle_spoils_only_its_own_policy() {
    for panics_first in [true, false] {
        let clock = ManualClock::new();
        let [p, good, c] = [(); 3].map(|_| tokens::<Gcra>(&clock));
        let panicking =
            policy("panics", &p).settle_by(|_| -> Option<u32> { panic!("settle fails") });
        let fine = policy("fine", &good).settle_by(used);
        let counts = fixed("counts", &c, 5).count_if(|_| panic!("a predicate that fails"));
        let response = if panics_first {
            let layer = RateLimitLayer::new(panicking.and(fine.and(counts)));
            call(layer.layer(echo!()), &[("x-used", "10")]).await
        } else {
            let layer = RateLimitLayer::new(fine.and(counts.and(panicking)));
            call(layer.layer(echo!()), &[("x-used", "10")]).await
        };
        assert_eq!(response.status(), StatusCode::OK);
        let left = (drain(&p), drain(&good), drain(&c));
        assert_eq!(left, (Q - 1000, Q - 10, Q - 5), "first: {panics_first}");
    }
}

/// A request another policy refuses, before or after the settle policies in the chain, spends
/// nothing on them and settles nothing (the handler never runs, whatever it would report).
#[tokio::test]
async fn a_request_refused_by_another_policy_settles_nothing() {
    for refuser_first in [true, false] {
        let clock = ManualClock::new();
        let [l, body_l, gate] = [(); 3].map(|_| tokens::<Gcra>(&clock));
        gate.check_n(&"t".to_string(), Q as u32).unwrap();
        let head = policy("head", &l).settle_by(|_| Some(u32::MAX));
        let body = policy("body", &body_l).settle_from_body(json());
        let asks = [("x-body", "9999")];
        let response = if refuser_first {
            let layer = RateLimitLayer::new(fixed("gate", &gate, 1).and(head.and(body)));
            call(layer.wrap_body().layer(echo!()), &asks).await
        } else {
            let layer = RateLimitLayer::new(head.and(body.and(fixed("gate", &gate, 1))));
            call(layer.wrap_body().layer(echo!()), &asks).await
        };
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        response.into_body().collect().await.unwrap();
        let left = (drain(&l), drain(&body_l));
        assert_eq!(left, (Q, Q), "refuser first: {refuser_first}");
    }
}

/// The body is passed unchanged, its length included (a `content-length` response stays one):
/// the exact size hint and the end of the stream show through, and a client that stops at the
/// end of the stream (as hyper does) and drops the body still settles.
#[tokio::test]
async fn a_sized_body_keeps_its_length_and_settles_when_dropped_at_its_end() {
    use http_body::Body as _;
    let l = tokens::<Gcra>(&ManualClock::new());
    let layer = RateLimitLayer::new(policy("tokens", &l).settle_from_body(json()));
    let service = layer.wrap_body().layer(echo!());
    let mut body = call(service, &[("x-body", "7")]).await.into_body();
    let sent = r#"{"usage":{"total_tokens":7}}"#;
    assert_eq!(body.size_hint().exact(), Some(sent.len() as u64));
    assert!(!body.is_end_stream());
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), sent.as_bytes());
    assert!(body.is_end_stream(), "the end of the stream is hidden");
    drop(body);
    assert_eq!(drain(&l), Q - 7);
}

/// A shadow policy settles what it admitted, and a request it would have refused (which goes
/// on) leaves it no debt: a refusal has nothing to settle.
#[tokio::test]
async fn a_shadow_policy_settles_its_admissions_and_nothing_it_refused() {
    let clock = ManualClock::new();
    let (l, body_l) = (tokens::<Gcra>(&clock), tokens::<Gcra>(&clock));
    let body = fixed("body", &body_l, Q as u32).settle_from_body(json());
    let policies = fixed("shadow", &l, Q as u32).settle_by(used);
    let policies = policies.shadow().and(body.shadow());
    let service = RateLimitLayer::new(policies).wrap_body().layer(echo!());
    for n in ["9000", "5000"] {
        let response = call(service.clone(), &[("x-used", n), ("x-body", n)]).await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "a shadow refuses nothing"
        );
        response.into_body().collect().await.unwrap();
    }
    // The first settled to 9 000 (54 s of tokens); the second would have been refused, so its
    // 5 000 are charged nowhere: 54 s on, both keys are whole.
    clock.advance(Duration::from_secs(54));
    let left = (drain(&l), drain(&body_l));
    assert_eq!(left, (Q, Q), "debt charged for a refusal");
}

/// Two layers stacked, each settling from the body (each wraps the other's body): both read
/// the one body as it goes by, each its own path, and the client gets it unchanged. And a `Vec`
/// of settle policies (as a configuration builds them) on boxed limiters of two algorithms.
#[tokio::test]
async fn stacked_layers_and_a_vec_of_policies_each_settle() {
    let clock = ManualClock::new();
    let (outer, inner) = (tokens::<Gcra>(&clock), tokens::<SlidingLog>(&clock));
    let sent = r#"{"usage":{"prompt_tokens":30,"total_tokens":70}}"#;
    let prompt = BodyUsage::json(["usage", "prompt_tokens"]).unwrap();
    let handler = answer!(move |_| Response::new(frames(vec![sent.into()], None, false)));
    let inner_layer = RateLimitLayer::new(policy("inner", &inner).settle_from_body(json()));
    let service = RateLimitLayer::new(policy("outer", &outer).settle_from_body(prompt))
        .wrap_body()
        .layer(inner_layer.wrap_body().layer(handler));
    let response = call(service, &[]).await;
    let got = response.into_body().collect().await.unwrap();
    assert_eq!(got.to_bytes(), sent);
    assert_eq!((drain(&outer), drain(&inner)), (Q - 30, Q - 70));

    let (a, b) = (tokens::<Gcra>(&clock), tokens::<SlidingLog>(&clock));
    let boxed = |name, l: BoxLimiter<String>| {
        Policy::new(name, header_key("x-tenant"), l)
            .unwrap()
            .cost(1000)
    };
    let (head, body) = (BoxLimiter::new(a.clone()), BoxLimiter::new(b.clone()));
    let policies = vec![
        boxed("head", head).settle_by(used),
        boxed("body", body).settle_from_body(json()),
    ];
    let service = RateLimitLayer::new(policies).wrap_body().layer(echo!());
    let response = call(service, &[("x-used", "1500"), ("x-body", "70")]).await;
    let fields = rl(&response).to_string();
    assert!(fields.contains(r#""head";r=8500;"#), "{fields}");
    response.into_body().collect().await.unwrap();
    assert_eq!((drain(&a), drain(&b)), (Q - 1500, Q - 70));
}

/// Settles of `u32::MAX` are charged as the capacity. From the head, the admitted field says
/// nothing is left; the next request is refused with what is left (fewer than its cost) and a
/// `Retry-After`; one above the capacity is refused without one. From the bodies of five
/// requests in flight at once: 50 000 tokens (five minutes) of debt in all, exactly, never
/// wrapping: the refusal says `r=0` and 240.012 s, rounded up.
#[tokio::test]
async fn settles_of_u32_max_pile_up_as_capacity_and_the_headers_say_so() {
    let clock = ManualClock::new();
    let l = tokens::<Gcra>(&clock);
    let service = RateLimitLayer::new(policy("tokens", &l).settle_by(used)).layer(echo!());
    let ask = |est, n| {
        let service = service.clone();
        async move { call(service, &[("x-est", est), ("x-used", n)]).await }
    };
    let emptied = ask("1000", "4294967295").await;
    assert!(rl(&emptied).contains("r=0;"), "{:?}", emptied.headers());
    clock.advance(Duration::from_secs(3)); // 500 tokens back
    let refused = ask("1000", "1").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(rl(&refused).contains("r=500;"), "{}", rl(&refused));
    assert_eq!(retry_after(&refused), Some(3));
    let never = ask("20000", "1").await;
    assert_eq!(never.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(retry_after(&never), None);
    assert_eq!(drain(&l), 500);

    let l = tokens::<Gcra>(&clock);
    let layer = RateLimitLayer::new(policy("tokens", &l).settle_from_body(json()));
    let service = layer.wrap_body().layer(echo!());
    let mut bodies = Vec::new();
    for _ in 0..5 {
        let response = call(service.clone(), &[("x-body", "4294967295")]).await;
        bodies.push(response.into_body());
    }
    for body in bodies {
        body.collect().await.unwrap();
    }
    let refused = call(service, &[("x-est", "2")]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(rl(&refused).contains("r=0;"), "{}", rl(&refused));
    assert_eq!(retry_after(&refused), Some(241));
    clock.advance(Duration::from_secs(240));
    assert_eq!(drain(&l), 0);
    clock.advance(Duration::from_millis(6));
    assert_eq!(drain(&l), 1);
}

/// Outbound: a settle read from the response gives back and charges (`u32::MAX` as the
/// capacity); with `SettleLater`, eight threads racing to settle clones of one `Unsettled`
/// settle it once, and one dropped unsettled keeps the estimate.
#[tokio::test]
async fn outbound_settles_give_back_charge_and_count_once() {
    use tower_bulwark::outbound::quota::{SettleLater, Unsettled};
    use tower_bulwark::outbound::ClientQuotaLayer;
    let clock = ManualClock::new();
    let [l, later] = [(); 2].map(|_| tokens::<Gcra>(&clock));
    let upstream = service_fn(|request: Request<Body>| async move {
        let n = request.headers()["x-used"].clone();
        Ok::<_, BoxError>(
            Response::builder()
                .header("x-used", n)
                .body(Body::empty())
                .unwrap(),
        )
    });
    let cost = |r: &Request<Body>| r.headers()["x-est"].to_str().unwrap().parse().unwrap();
    let key = |_: &Request<Body>| "t".to_string();
    let client = ClientQuotaLayer::new("llm", l.clone())
        .key(key)
        .cost_by(cost)
        .settle_by(|r: &Response<Body>| r.headers()["x-used"].to_str().ok()?.parse().ok());
    let client = client.layer(upstream);
    for (est, used) in [("1000", "100"), ("1000", "4294967295")] {
        let request = request(&[("x-est", est), ("x-used", used)]);
        client.clone().oneshot(request).await.unwrap();
    }
    // 100 + the capacity: 60.6 s of tokens.
    assert_eq!(
        l.check(&"t".to_string()).retry_after,
        Duration::from_millis(606)
    );

    let layer = ClientQuotaLayer::new("llm", later.clone())
        .key(key)
        .cost_by(cost);
    let client = layer.settle_by(SettleLater).layer(upstream);
    let ask = || {
        client
            .clone()
            .oneshot(request(&[("x-est", "1000"), ("x-used", "0")]))
    };
    let response = ask().await.unwrap();
    let unsettled = response.extensions().get::<Unsettled>().unwrap().clone();
    drop(response);
    let settled = std::thread::scope(|s| {
        let racers: Vec<_> = (0..8)
            .map(|_| s.spawn(|| unsettled.clone().settle(10)))
            .collect();
        racers
            .into_iter()
            .map(|r| r.join().unwrap())
            .filter(|&won| won)
            .count()
    });
    assert_eq!(settled, 1, "one call settled {settled} times");
    drop(ask().await.unwrap());
    assert_eq!(drain(&later), Q - 10 - 1000);
}
