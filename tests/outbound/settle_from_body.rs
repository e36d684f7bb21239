//! A client quota settled from the answer's body as the caller reads it
//! (`ClientQuotaLayer::settle_by(BodyUsage)`, for a `reqwest::Client`): JSON or an event stream
//! by the answer's `Content-Type`, an error that reports no usage costs nothing, a body dropped
//! unread keeps the estimate, and the caller gets the answer as the dependency sent it.

use crate::common::dependency::mount;
use crate::common::direct_on;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::ClientQuotaLayer;
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{algorithm::Gcra, BoxError, DirectRateLimiter, Quota};
use wiremock::matchers::path;
use wiremock::{MockServer, ResponseTemplate};

const EVENTS: &str = "data: {\"choices\":[{\"delta\":\"hi\"}]}\n\n\
                      data: {\"choices\":[],\"usage\":{\"total_tokens\":40}}\n\ndata: [DONE]\n\n";

/// A mock LLM API: `/json` used 30 tokens, `/sse` streams 40, `/busy` is its own 503 without
/// usage, `/cut` a 502 that reports 20, `/slow` answers after a minute.
pub(crate) async fn upstream() -> MockServer {
    let server = MockServer::start().await;
    let answers = [
        (
            "/json",
            200,
            "application/json",
            r#"{"usage":{"total_tokens":30}}"#,
        ),
        ("/sse", 200, "text/event-stream", EVENTS),
        ("/busy", 503, "application/json", r#"{"error":"busy"}"#),
        (
            "/cut",
            502,
            "application/json",
            r#"{"error":"cut","usage":{"total_tokens":20}}"#,
        ),
    ];
    for (at, status, content_type, body) in answers {
        let answer = ResponseTemplate::new(status).set_body_raw(body, content_type);
        mount(&server, path(at), answer).await;
    }
    let slow = ResponseTemplate::new(200).set_delay(std::time::Duration::from_secs(60));
    mount(&server, path("/slow"), slow).await;
    server
}

/// 1 000 tokens an hour on a clock that stands still, and a `reqwest` client estimating each
/// call at 100 and settling it from its body.
fn client() -> (
    DirectRateLimiter<Gcra, ManualClock>,
    impl Service<reqwest::Request, Response = reqwest::Response, Error = BoxError, Future: Send> + Clone,
) {
    let tokens = direct_on(Quota::per_hour(1000).unwrap(), &ManualClock::new());
    let usage = BodyUsage::json(["usage", "total_tokens"]).unwrap();
    let client = ClientQuotaLayer::new("llm", tokens.clone())
        .cost(100)
        .settle_by(usage)
        .layer(reqwest::Client::new());
    (tokens, client)
}

fn post(server: &MockServer, at: &str) -> reqwest::Request {
    let url = format!("{}{at}", server.uri()).parse().unwrap();
    reqwest::Request::new(reqwest::Method::POST, url)
}

/// What the limiter has left: every permit taken until it refuses.
fn left(tokens: &DirectRateLimiter<Gcra, ManualClock>) -> u32 {
    let mut left = 0;
    while tokens.check().allowed {
        left += 1;
    }
    left
}

#[tokio::test]
async fn each_answer_settles_to_what_its_body_reports_json_or_events() {
    let server = upstream().await;
    let (tokens, client) = client();
    for (at, status, body) in [
        ("/json", 200, r#"{"usage":{"total_tokens":30}}"#),
        ("/sse", 200, EVENTS),
        ("/busy", 503, r#"{"error":"busy"}"#),
        (
            "/cut",
            502,
            r#"{"error":"cut","usage":{"total_tokens":20}}"#,
        ),
    ] {
        let response = client.clone().oneshot(post(&server, at)).await.unwrap();
        assert_eq!(response.status(), status, "{at}");
        assert_eq!(response.url().path(), at, "{at}: the URL stays");
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert!(!content_type.is_empty(), "{at}: the headers stay");
        assert_eq!(
            response.text().await.unwrap(),
            body,
            "{at}: the body passes unchanged"
        );
    }
    // A body never read keeps its estimate: 30 + 40 + 0 + 20 + 100 used.
    let unread = client
        .clone()
        .oneshot(post(&server, "/json"))
        .await
        .unwrap();
    drop(unread);
    assert_eq!(left(&tokens), 1000 - 190);
}

/// Calls racing on one quota, each read in pieces: each settles to what it used, exactly.
#[tokio::test]
async fn racing_calls_each_settle_to_what_they_used() {
    let server = upstream().await;
    let (tokens, client) = client();
    let calls = (0..8).map(|i| {
        let client = client.clone();
        let request = post(&server, if i % 2 == 0 { "/json" } else { "/sse" });
        tokio::spawn(async move {
            let mut response = client.oneshot(request).await.unwrap();
            while response.chunk().await.unwrap().is_some() {}
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
    assert_eq!(left(&tokens), 1000 - 4 * 30 - 4 * 40);
}

/// A dependency answering `status` with `content_type` and a body of `pieces`, the last of
/// which is an error when `fails`: a `reqwest::Response` built from an `http` one, as a mock
/// client service would give it.
fn answering(
    status: u16,
    content_type: &'static str,
    pieces: Vec<Vec<u8>>,
    fails: bool,
) -> impl Service<reqwest::Request, Response = reqwest::Response, Error = BoxError, Future: Send> + Clone
{
    tower::service_fn(move |_: reqwest::Request| {
        let mut frames: Vec<Result<http_body::Frame<bytes::Bytes>, std::io::Error>> = pieces
            .iter()
            .map(|piece| Ok(http_body::Frame::data(bytes::Bytes::from(piece.clone()))))
            .collect();
        if fails {
            frames.push(Err(std::io::Error::other("the connection was cut")));
        }
        let stream = http_body_util::StreamBody::new(futures::stream::iter(frames));
        let body = reqwest::Body::wrap(stream);
        let response = http::Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(body)
            .unwrap();
        async move { Ok::<_, BoxError>(reqwest::Response::from(response)) }
    })
}

/// The event stream of [`EVENTS`] cut into pieces at `cuts` (byte offsets, any order).
fn cut(text: &str, cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
    at.extend([0, text.len()]);
    at.sort_unstable();
    at.dedup();
    at.windows(2)
        .map(|w| text.as_bytes()[w[0]..w[1]].to_vec())
        .collect()
}

/// Reads `frames` frames of the call's body (all of them with `usize::MAX`), then drops it;
/// returns whether the body ended or failed on the way.
async fn read_then_drop(
    service: impl Service<reqwest::Request, Response = reqwest::Response, Error = BoxError>,
    frames: usize,
) -> bool {
    let request = reqwest::Request::new(
        reqwest::Method::POST,
        "http://127.0.0.1:9/".parse().unwrap(),
    );
    let mut response = service.oneshot(request).await.unwrap();
    for _ in 0..frames {
        match response.chunk().await {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return true,
        }
    }
    false
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever pieces the body comes in, wherever the caller stops reading (or the body
    /// fails), the call settles to the usage if it went by, to zero for an error answer that
    /// said none, and otherwise keeps its estimate of 100: never more, never less.
    #[test]
    fn a_call_settles_to_what_went_by_whatever_the_pieces_and_the_stop(
        cuts in proptest::collection::vec(0usize..200, 0..12),
        stop in 0usize..16,
        fails: bool,
        error: bool,
    ) {
        let pieces = cut(EVENTS, &cuts);
        let (tokens, _) = client();
        let status = if error { 503 } else { 200 };
        let service = ClientQuotaLayer::new("llm", tokens.clone())
            .cost(100)
            .settle_by(BodyUsage::json(["usage", "total_tokens"]).unwrap())
            .layer(answering(status, "text/event-stream", pieces.clone(), fails));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(read_then_drop(service, stop));
        // The usage went by with the byte that ends its number.
        let usage_end = EVENTS.find("40}").unwrap() + 3;
        let read: usize = pieces.iter().take(stop).map(Vec::len).sum();
        let expected = if read >= usage_end { 40 } else if error { 0 } else { 100 };
        proptest::prop_assert_eq!(left(&tokens), 1000 - expected, "read {} of {:?}", read, pieces);
    }
}
