//! A handler whose answers stream until the test lets them end, and that ends a request however
//! the request asks (`x-how`): the one shape of service the tests of holds (concurrent slots,
//! metered estimates, in memory and in Redis) attack.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use tokio::sync::Semaphore;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service};
use tower_bulwark::rate_limit::{PolicySet, RateLimitBody, RateLimitLayer};

/// What a streamed answer sends: its `Content-Type` (if any), a first chunk at once, and a
/// last one once the test lets the stream end.
pub struct Answer {
    pub content_type: Option<&'static str>,
    pub first: Bytes,
    pub last: Bytes,
}

/// A body that sends `first`, then holds until `ends` has a permit for it and sends `last`;
/// with `cut`, it fails after its first chunk instead.
pub fn held_body(ends: Arc<Semaphore>, first: Bytes, last: Bytes, cut: bool) -> Body {
    let first = futures::stream::once(async { Ok::<_, std::io::Error>(first) });
    let rest = futures::stream::once(async move {
        if cut {
            return Err(std::io::Error::other("cut"));
        }
        ends.acquire().await.unwrap().forget();
        Ok(last)
    });
    Body::from_stream(futures::StreamExt::chain(first, rest))
}

/// A handler that answers with [`held_body`] as `answer` shapes it from the request's headers;
/// `x-how: fail` fails instead of answering, `cut` sends a body that fails after its first
/// chunk, `panic` panics, `hang` never answers.
pub fn handler(
    ends: Arc<Semaphore>,
    answer: fn(&HeaderMap) -> Answer,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = std::io::Error, Future: Send> + Clone
{
    service_fn(move |request: Request<Body>| {
        let ends = Arc::clone(&ends);
        let how = request.headers()["x-how"].to_str().unwrap().to_owned();
        let shape = answer(request.headers());
        async move {
            match how.as_str() {
                "fail" => return Err(std::io::Error::other("the upstream is gone")),
                "panic" => panic!("a handler that panics"),
                "hang" => std::future::pending::<()>().await,
                _ => {}
            }
            let body = held_body(ends, shape.first, shape.last, how == "cut");
            let mut response = Response::new(body);
            if let Some(content_type) = shape.content_type {
                let value = http::HeaderValue::from_static(content_type);
                response
                    .headers_mut()
                    .insert(http::header::CONTENT_TYPE, value);
            }
            Ok(response)
        }
    })
}

/// The plain answer: `a`, then `b`.
pub fn plain_answer(_: &HeaderMap) -> Answer {
    Answer {
        content_type: None,
        first: Bytes::from("a"),
        last: Bytes::from("b"),
    }
}

/// A rate-limited service over [`handler`], as tests hold one.
pub type Limited = BoxCloneService<Request<Body>, Response<RateLimitBody<Body>>, std::io::Error>;

/// `policies` over [`handler`] (answering as `answer` shapes it), each admission held until its
/// response body ends ([`RateLimitLayer::wrap_body`]).
pub fn limited<P: PolicySet + Send + Sync + 'static>(
    policies: P,
    ends: &Arc<Semaphore>,
    answer: fn(&HeaderMap) -> Answer,
) -> Limited {
    BoxCloneService::new(
        RateLimitLayer::new(policies)
            .wrap_body()
            .layer(handler(Arc::clone(ends), answer)),
    )
}

/// [`limited`] answering [`plain_answer`], and the semaphore whose permits let its streams end
/// (none yet).
pub fn plainly_limited<P: PolicySet + Send + Sync + 'static>(
    policies: P,
) -> (Limited, Arc<Semaphore>) {
    let ends = Arc::new(Semaphore::new(0));
    (limited(policies, &ends, plain_answer), ends)
}

/// `n` calls of `call()` in a row, each asserted admitted (`200`; `what` says what a refusal
/// breaks): their answers, held.
pub async fn admitted_in_a_row<F, B, E>(
    call: impl Fn() -> F,
    n: usize,
    what: &str,
) -> Vec<Response<B>>
where
    F: std::future::Future<Output = Result<Response<B>, E>>,
    E: std::fmt::Debug,
{
    let mut admitted = Vec::new();
    for _ in 0..n {
        let response = call().await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK, "{what}");
        admitted.push(response);
    }
    admitted
}

/// A request of tenant `t` (header `x-tenant`) saying how the handler answers it.
pub fn request(how: &str) -> Request<Body> {
    Request::builder()
        .uri("/stream")
        .header("x-tenant", "t")
        .header("x-how", how)
        .body(Body::empty())
        .unwrap()
}

/// Asserts that the policy `streams`, four streams at once per tenant (`Policy::concurrent`),
/// admitted a stream with `status` and `headers`, and told it `left` are left.
pub fn assert_stream_admitted(status: http::StatusCode, headers: &HeaderMap, left: u64) {
    let header = |name: &str| headers[name].to_str().unwrap().to_owned();
    assert_eq!(status, http::StatusCode::OK);
    assert_eq!(header("ratelimit"), format!("\"streams\";r={left}"));
    assert_eq!(
        header("ratelimit-policy"),
        "\"streams\";q=4;qu=\"concurrent-requests\""
    );
}

/// Asserts that the policy `streams` refused a stream at once with `status` and `headers`,
/// telling it `qu="concurrent-requests"` and to come back in a second.
pub fn assert_stream_refused(status: http::StatusCode, headers: &HeaderMap) {
    let header = |name: &str| headers[name].to_str().unwrap().to_owned();
    assert_eq!(status, http::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header("retry-after"), "1");
    assert_eq!(header("ratelimit"), "\"streams\";r=0");
    assert!(header("ratelimit-policy").contains("qu=\"concurrent-requests\""));
}

/// `clients` `reqwest` clients racing, the `i`th sending `GET` as tenant `t` to
/// `urls[i % urls.len()]`: the answers admitted, each once it has sent its first chunk (`a`),
/// and the others, each in the order sent.
pub async fn racing_clients(
    client: &reqwest::Client,
    urls: &[String],
    clients: usize,
) -> (Vec<reqwest::Response>, Vec<reqwest::Response>) {
    let calls: Vec<_> = (0..clients)
        .map(|i| {
            let (client, url) = (client.clone(), urls[i % urls.len()].clone());
            tokio::spawn(async move {
                let sent = client.get(&url).header("x-tenant", "t").send().await;
                let mut response = sent.unwrap();
                if response.status() == http::StatusCode::OK {
                    assert_eq!(response.chunk().await.unwrap().unwrap(), "a");
                }
                response
            })
        })
        .collect();
    let (mut admitted, mut others) = (Vec::new(), Vec::new());
    for call in calls {
        let response = call.await.unwrap();
        if response.status() == http::StatusCode::OK {
            admitted.push(response);
        } else {
            others.push(response);
        }
    }
    (admitted, others)
}

/// `policy` on a real listener, on a layer that carries the body: `GET /stream` answers with a
/// held body (`a` at once, `b` once `ends` lets it end). Its URL.
pub async fn serve_held_streams<P: PolicySet + Send + Sync + 'static>(
    policy: P,
    ends: &Arc<Semaphore>,
) -> String {
    let ends = Arc::clone(ends);
    let app = axum::Router::new()
        .route(
            "/stream",
            axum::routing::get(move || {
                let ends = Arc::clone(&ends);
                async move { held_body(ends, Bytes::from("a"), Bytes::from("b"), false) }
            }),
        )
        .layer(RateLimitLayer::new(policy).wrap_body());
    format!("http://{}/stream", super::listener::serve(app).await)
}
