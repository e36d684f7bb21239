//! A gateway in front of an LLM API, limited in tokens: each API key may use 10 000 tokens a
//! minute, and the upstream allows the gateway 60 000 in all.
//!
//! A request (`POST /v1/complete`, `{"max_tokens": N, "prompt": "..."}`, header `x-api-key`)
//! reserves its `max_tokens` and is settled to the tokens the upstream reports it used, read from
//! `usage.total_tokens` in the upstream's JSON body as it streams back to the client, unchanged.
//! A request that does not fit is a `429` whose `Retry-After` and `RateLimit` fields count
//! tokens. Towards the upstream, a client quota keeps to its 60 000 tokens (reserving
//! `max_tokens`, settled to its `x-usage-total-tokens`) and a `Pushback` reads its OpenAI-style
//! `x-ratelimit-*-tokens` headers.
//!
//! The mock upstream, started on loopback, uses exactly `max_tokens / 2` tokens per call.
//!
//! ```sh
//! cargo run --example llm_gateway --features reqwest
//! curl -s -H 'x-api-key: demo' -d '{"max_tokens": 400, "prompt": "hi"}' http://127.0.0.1:3003/v1/complete
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use tower::{ServiceBuilder, ServiceExt};
use tower_bulwark::outbound::{ClientQuotaLayer, Pushback};
use tower_bulwark::rate_limit::{KeyError, Policy, RateLimitLayer};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{BoxError, DirectRateLimiter, KeyedRateLimiter, Quota};

/// Tokens per minute for each API key, at the gateway.
pub const PER_KEY: u32 = 10_000;
/// Tokens per minute the upstream allows the gateway in all.
pub const UPSTREAM: u32 = 60_000;

/// What a completion asks for.
#[derive(Deserialize)]
struct Completion {
    max_tokens: u32,
}

/// A request's `max_tokens`, read from its body before the rate limit decides.
#[derive(Clone, Copy)]
struct MaxTokens(u32);

/// Reads `max_tokens` from the JSON body (at most 64 KiB) into the request's extensions, where
/// the rate limit's cost function finds it; the body goes on unchanged.
async fn read_max_tokens(request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = to_bytes(body, 64 * 1024).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "the body is over 64 KiB").into_response();
    };
    match serde_json::from_slice::<Completion>(&bytes) {
        Ok(completion) if completion.max_tokens > 0 => {
            parts.extensions.insert(MaxTokens(completion.max_tokens));
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        _ => (
            StatusCode::BAD_REQUEST,
            "expected {\"max_tokens\": N > 0, ...}",
        )
            .into_response(),
    }
}

/// The mock upstream: `max_tokens / 2` tokens per call, 60 000 a minute for everyone.
async fn upstream(
    State(tokens): State<DirectRateLimiter>,
    Json(body): Json<Completion>,
) -> Response {
    let used = body.max_tokens / 2;
    let decision = tokens
        .check_n(used.max(1))
        .unwrap_or_else(|_| tokens.check_n(UPSTREAM).unwrap());
    let reset = format!("{}ms", decision.reset_after.as_millis());
    let mut response = if decision.allowed {
        let body = serde_json::json!({
            "id": "cmpl-1",
            "choices": [{"text": "hello"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": used, "total_tokens": used},
        });
        let mut response = Json(body).into_response();
        let headers = response.headers_mut();
        headers.insert("x-usage-total-tokens", used.into());
        response
    } else {
        let mut response =
            (StatusCode::TOO_MANY_REQUESTS, "upstream: too many tokens").into_response();
        let wait = decision.retry_after_secs();
        response.headers_mut().insert("retry-after", wait.into());
        response
    };
    let headers = response.headers_mut();
    headers.insert("x-ratelimit-limit-tokens", UPSTREAM.into());
    headers.insert("x-ratelimit-remaining-tokens", decision.remaining.into());
    headers.insert(
        "x-ratelimit-reset-tokens",
        HeaderValue::from_str(&reset).unwrap(),
    );
    response
}

/// The outbound stack towards the upstream: pushback, then a client quota of its tokens.
type Upstream = tower::util::BoxCloneSyncService<reqwest::Request, reqwest::Response, BoxError>;

/// Forwards the completion to the upstream and hands its answer back unchanged.
async fn complete(State((client, url)): State<(Upstream, String)>, request: Request) -> Response {
    let max_tokens = request.extensions().get::<MaxTokens>().map_or(1, |m| m.0);
    let Ok(body) = to_bytes(request.into_body(), 64 * 1024).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let mut call = reqwest::Request::new(reqwest::Method::POST, url.parse().unwrap());
    call.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    call.headers_mut().insert("x-max-tokens", max_tokens.into());
    *call.body_mut() = Some(body.into());
    match client.oneshot(call).await {
        Ok(answer) if !answer.status().is_success() => {
            let status = answer.status();
            error(
                status,
                &format!("upstream answered {status}"),
                Duration::from_secs(1),
            )
        }
        Ok(answer) => {
            // The body as it comes, streamed; of the head, what the client needs (the
            // upstream's own rate-limit fields describe the gateway's quota, not the client's).
            let (parts, body) = http::Response::from(answer).into_parts();
            let mut response = Response::new(Body::new(body));
            *response.status_mut() = parts.status;
            for name in ["content-type", "x-usage-total-tokens"] {
                if let Some(value) = parts.headers.get(name) {
                    response.headers_mut().insert(name, value.clone());
                }
            }
            response
        }
        Err(failure) => {
            let wait = tower_bulwark::outbound::retry_after(&*failure);
            let wait = wait.unwrap_or(Duration::from_secs(1));
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("upstream: {failure}"),
                wait,
            )
        }
    }
}

/// The gateway's own error answer: an error that reports no usage costs the key nothing, so
/// the request's reservation goes back.
fn error(status: StatusCode, message: &str, retry_after: Duration) -> Response {
    let body = serde_json::json!({"error": {"message": message}});
    let mut response = (status, Json(body)).into_response();
    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert("retry-after", secs.max(1).into());
    response
}

/// Starts the mock upstream and the gateway on `addr`; returns the gateway's address.
pub async fn start(addr: SocketAddr) -> Result<SocketAddr, BoxError> {
    let upstream_tokens = DirectRateLimiter::new(Quota::per_minute(UPSTREAM)?);
    let mock = Router::new()
        .route("/v1/complete", post(upstream))
        .with_state(upstream_tokens);
    let mock_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/complete", mock_listener.local_addr()?);
    tokio::spawn(async move { axum::serve(mock_listener, mock).await });

    let usage = |answer: &reqwest::Response| -> Option<u32> {
        answer
            .headers()
            .get("x-usage-total-tokens")?
            .to_str()
            .ok()?
            .parse()
            .ok()
    };
    let max_tokens = |call: &reqwest::Request| -> u32 {
        call.headers()
            .get("x-max-tokens")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    let client: Upstream = tower::util::BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(Pushback::new("upstream").layer().cost_by(max_tokens))
            .layer(
                ClientQuotaLayer::new(
                    "upstream-tokens",
                    DirectRateLimiter::new(Quota::per_minute(UPSTREAM)?),
                )
                .cost_by(max_tokens)
                .settle_by(usage),
            )
            .service(reqwest::Client::new())
            .map_err(BoxError::from),
    );

    let api_key = |head: &tower_bulwark::head::RequestHead<'_>| {
        let key = head.headers.get("x-api-key").and_then(|v| v.to_str().ok());
        key.filter(|k| !k.is_empty() && k.len() <= 128)
            .map(str::to_owned)
            .ok_or_else(|| KeyError::unauthorized("the `x-api-key` header is missing"))
    };
    let tokens = Policy::new(
        "tokens",
        api_key,
        KeyedRateLimiter::new(Quota::per_minute(PER_KEY)?),
    )?
    .cost_by(|request| request.extensions.get::<MaxTokens>().map_or(1, |m| m.0))
    .settle_from_body(BodyUsage::json(["usage", "total_tokens"])?);
    let app = Router::new()
        .route("/v1/complete", post(complete))
        .with_state((client, url))
        .layer(
            ServiceBuilder::new()
                .layer(middleware::from_fn(read_max_tokens))
                .layer(RateLimitLayer::new(tokens).wrap_body()),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3003".into());
    let addr = start(addr.parse()?).await?;
    println!("per API key: {PER_KEY} tokens per minute (reserve max_tokens, settle to usage.total_tokens)");
    println!("upstream: {UPSTREAM} tokens per minute in all (client quota and pushback)");
    println!("listening on {addr}");
    std::future::pending::<()>().await;
    Ok(())
}
