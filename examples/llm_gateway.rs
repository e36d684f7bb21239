//! An LLM gateway limited in tokens, in front of a mock OpenAI-style upstream it starts itself.
//!
//! `POST /v1/complete` takes `{"max_tokens": N, "prompt": "...", "stream": bool}` with an
//! `x-api-key` header. Each key may have `MAX_CONCURRENT` requests in flight (default 4) and use
//! `PER_KEY` tokens a minute (default 10 000, all at once on a fresh key): a request reserves
//! its `max_tokens` and is settled to the `usage.total_tokens` the upstream reports, read from
//! the JSON body or from the last event of a stream as it goes to the client, unchanged. Every
//! admitted answer's `RateLimit` field says what the key has left after this request's
//! reservation; a refusal is a `429` whose `Retry-After` and `RateLimit` count tokens, or say
//! `qu="concurrent-requests"`; a request that no wait could admit (`max_tokens` above `PER_KEY`)
//! is a `413`.
//!
//! Towards the upstream, which allows the gateway `UPSTREAM_TPM` tokens a minute in all (default
//! 60 000), a client quota reserves each call's `max_tokens` and settles it to the usage in the
//! body, and a pushback reads the upstream's `x-ratelimit-*-tokens` headers. When they cannot
//! take a call, at once or within 2 s, the gateway answers its own `503` with `Retry-After`;
//! a `503` reports no usage, so the key gets its reservation back. Both token limiters use the
//! `Metered` algorithm: a settle charges what a request used as of its admission, so nothing is
//! lost however many requests are in flight and however long they stream.
//!
//! The mock upstream uses exactly `max_tokens / 2` tokens a call, takes `STREAM_MS` over an
//! answer (default 1000), streamed or not, and answers `429` when the gateway goes over its
//! quota, a GCRA of `UPSTREAM_TPM` a minute. `GET /stats` reports what it served.
//!
//! ```sh
//! cargo run --release --all-features --example llm_gateway
//! # listening on 127.0.0.1:3003
//! curl -si -H 'x-api-key: demo' -d '{"max_tokens": 400, "prompt": "hi"}' http://127.0.0.1:3003/v1/complete
//! # 200, ratelimit: "in-flight";r=3, "tokens";r=9600;t=58 ... "usage":{...,"total_tokens":200}
//! curl -sN -H 'x-api-key: demo' -d '{"max_tokens": 400, "prompt": "hi", "stream": true}' http://127.0.0.1:3003/v1/complete
//! # five `data:` events over a second, the last with "usage":{"total_tokens":200}, then data: [DONE]
//! curl -s http://127.0.0.1:3003/stats
//! # {"upstream_429":0,"upstream_calls":2,"upstream_tokens":400}
//! ```
//!
//! `examples/llm_gateway_load.rs` drives it with many keys and reports how much of the
//! upstream's quota it served.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_bulwark::algorithm::Metered;
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::InsufficientCapacity;
use tower_bulwark::outbound::{retry_after, ClientQuotaLayer, Pushback};
use tower_bulwark::rate_limit::{KeyError, Policy, RateLimitLayer};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{BoxError, DirectRateLimiter, KeyedRateLimiter, Limiter, Quota};

/// The longest a call waits for the client quota of the upstream's tokens. Short: a waiting
/// call's turn is fixed when it is admitted, as if every call before it used its whole
/// estimate, so a long queue starts calls later than their settles would let it (in the load of
/// `llm_gateway_load.rs`, 4 s of wait served 94 % of what the upstream allows, 1 s 98 %).
const QUOTA_WAIT: Duration = Duration::from_secs(1);
/// The longest a call then waits for the upstream's own word (its answers come a little after
/// it counted, a whole `STREAM_MS` for a plain one): in all, at most 2 s before a `503`.
const PUSHBACK_WAIT: Duration = Duration::from_secs(1);
/// Content events of a streamed answer, before the one that reports the usage.
const CHUNKS: u32 = 4;

/// What the gateway is told by its environment.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where the gateway listens (`ADDR`).
    pub addr: SocketAddr,
    /// Tokens a minute per API key (`PER_KEY`), all of them at once on a fresh key.
    pub per_key: u32,
    /// Tokens a minute the upstream allows the gateway in all (`UPSTREAM_TPM`).
    pub upstream_tpm: u32,
    /// How long the upstream takes over one answer (`STREAM_MS`).
    pub stream: Duration,
    /// Requests in flight per API key (`MAX_CONCURRENT`).
    pub max_concurrent: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 3003)),
            per_key: 10_000,
            upstream_tpm: 60_000,
            stream: Duration::from_millis(1000),
            max_concurrent: 4,
        }
    }
}

impl Settings {
    /// The defaults, with each variable that is set read over its default.
    ///
    /// # Errors
    ///
    /// A message naming the variable whose value does not parse (or is zero, where a count is
    /// expected).
    pub fn from_env() -> Result<Self, BoxError> {
        let default = Self::default();
        let stream_ms = env_or("STREAM_MS", 1000, "a whole number of milliseconds")?;
        Ok(Self {
            addr: env_or("ADDR", default.addr, "an address such as 127.0.0.1:3003")?,
            per_key: count_or("PER_KEY", default.per_key)?,
            upstream_tpm: count_or("UPSTREAM_TPM", default.upstream_tpm)?,
            stream: Duration::from_millis(stream_ms),
            max_concurrent: count_or("MAX_CONCURRENT", default.max_concurrent)?,
        })
    }
}

/// The count in the variable `name` (above zero), or `default` when it is not set.
fn count_or(name: &str, default: u32) -> Result<u32, BoxError> {
    const COUNT: &str = "a whole number above 0";
    match env_or(name, default, COUNT)? {
        0 => Err(format!("{name}=0: expected {COUNT}").into()),
        count => Ok(count),
    }
}

/// The variable `name` parsed, or `default` when it is not set; an error says what was
/// `expected`.
fn env_or<T: FromStr>(name: &str, default: T, expected: &str) -> Result<T, BoxError> {
    match std::env::var(name) {
        Ok(value) => (value.trim().parse())
            .map_err(|_| format!("{name}={value:?}: expected {expected}").into()),
        Err(_) => Ok(default),
    }
}

/// The per-key token limiter: a minute's tokens at once, then an even pace; `Metered`, so that
/// the settles of requests in flight together are exact.
fn key_tokens(per_minute: u32) -> Result<impl Limiter<String> + Clone, BoxError> {
    let quota = Quota::per_minute(per_minute)?;
    Ok(KeyedRateLimiter::builder(quota)
        .algorithm::<Metered>()
        .build())
}

/// The gateway's client quota of the upstream's tokens: as the upstream counts them, with a
/// wait of up to [`QUOTA_WAIT`]; `Metered`, as the per-key limiter.
fn upstream_tokens(per_minute: u32) -> Result<impl Limiter<()> + Clone, BoxError> {
    let quota = Quota::per_minute(per_minute)?.with_max_wait(QUOTA_WAIT)?;
    Ok(DirectRateLimiter::builder(quota)
        .algorithm::<Metered>()
        .build())
}

/// A completion request, as the gateway and the upstream read it.
#[derive(Deserialize)]
struct Completion {
    max_tokens: u32,
    #[serde(default)]
    stream: bool,
}

// ---------------------------------------------------------------------------------------------
// The mock upstream.

/// What the mock upstream has done, for `GET /stats`.
#[derive(Debug, Default)]
pub struct Stats {
    tokens: AtomicU64,
    calls: AtomicU64,
    refused: AtomicU64,
}

/// The mock upstream's state: its quota of the gateway's tokens, and its counts.
#[derive(Clone)]
struct Upstream {
    quota: DirectRateLimiter,
    stream: Duration,
    stats: Arc<Stats>,
}

/// A call to the mock upstream: charged `max_tokens / 2` at once against its quota, answered
/// over `STREAM_MS` with that usage, or refused with `429` when the quota cannot take it.
async fn upstream(State(upstream): State<Upstream>, Json(call): Json<Completion>) -> Response {
    let used = call.max_tokens / 2;
    let Ok(decision) = upstream.quota.check_n(used) else {
        return (StatusCode::BAD_REQUEST, "max_tokens is over the quota").into_response();
    };
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-limit-tokens", decision.limit.into());
    headers.insert("x-ratelimit-remaining-tokens", decision.remaining.into());
    let reset = format!("{}ms", decision.reset_after.as_millis());
    let reset = HeaderValue::try_from(reset).expect("digits and `ms`");
    headers.insert("x-ratelimit-reset-tokens", reset);
    if !decision.allowed {
        upstream.stats.refused.fetch_add(1, Relaxed);
        let error = json!({"error": {"message": "rate limit reached for tokens", "code": "rate_limit_exceeded"}});
        return (StatusCode::TOO_MANY_REQUESTS, headers, Json(error)).into_response();
    }
    upstream.stats.calls.fetch_add(1, Relaxed);
    upstream.stats.tokens.fetch_add(u64::from(used), Relaxed);
    let usage = json!({"prompt_tokens": 0, "completion_tokens": used, "total_tokens": used});
    if !call.stream {
        tokio::time::sleep(upstream.stream).await;
        let answer = json!({"id": "cmpl-1", "choices": [{"text": "hello"}], "usage": usage});
        return (headers, Json(answer)).into_response();
    }
    // OpenAI's shape: content events, then one with empty choices and the usage, then [DONE].
    // The first event goes at once; the rest are spread over `STREAM_MS`.
    let step = upstream.stream / CHUNKS;
    let content = json!({"choices": [{"delta": {"content": "hello "}}]});
    let last = json!({"choices": [], "usage": usage});
    let mut events = vec![format!("data: {content}\n\n"); CHUNKS as usize];
    events.push(format!("data: {last}\n\ndata: [DONE]\n\n"));
    let events =
        futures::stream::iter(events.into_iter().enumerate()).then(move |(i, event)| async move {
            if i > 0 {
                tokio::time::sleep(step).await;
            }
            Ok::<_, Infallible>(Bytes::from(event))
        });
    headers.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    (headers, Body::from_stream(events)).into_response()
}

/// Starts the mock upstream on a free loopback port, counting in `stats`; returns its
/// completion URL.
///
/// # Errors
///
/// A zero `upstream_tpm`, or no port to bind.
pub async fn start_upstream(settings: &Settings, stats: Arc<Stats>) -> Result<String, BoxError> {
    let upstream = Upstream {
        quota: DirectRateLimiter::new(Quota::per_minute(settings.upstream_tpm)?),
        stream: settings.stream,
        stats,
    };
    let app = Router::new()
        .route("/v1/complete", post(self::upstream))
        .with_state(upstream);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/complete", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

// ---------------------------------------------------------------------------------------------
// The gateway.

/// A request's `max_tokens`, read from its body before the rate limit decides.
#[derive(Clone, Copy)]
struct MaxTokens(u32);

/// Reads `max_tokens` from the JSON body (at most 64 KiB) into the request's extensions, where
/// the token policy's cost function finds it; the body goes on unchanged.
async fn read_max_tokens(request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = to_bytes(body, 64 * 1024).await else {
        let status = StatusCode::PAYLOAD_TOO_LARGE;
        return error(status, "the body is over 64 KiB", None);
    };
    match serde_json::from_slice::<Completion>(&bytes) {
        Ok(completion) if completion.max_tokens > 0 => {
            parts.extensions.insert(MaxTokens(completion.max_tokens));
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        _ => {
            let expected = r#"expected {"max_tokens": N > 0, "prompt": "...", "stream": bool}"#;
            error(StatusCode::BAD_REQUEST, expected, None)
        }
    }
}

/// The API key of a request: its `x-api-key` header, of 1 to 128 bytes.
fn api_key(head: &RequestHead<'_>) -> Result<String, KeyError> {
    let key = head.headers.get("x-api-key").and_then(|v| v.to_str().ok());
    key.filter(|k| !k.is_empty() && k.len() <= 128)
        .map(str::to_owned)
        .ok_or_else(|| KeyError::unauthorized("the `x-api-key` header is missing"))
}

/// The client towards the upstream: its client quota, then the pushback, then reqwest.
type UpstreamClient =
    tower::util::BoxCloneSyncService<reqwest::Request, reqwest::Response, BoxError>;

/// What the gateway's handlers share.
#[derive(Clone)]
struct Gateway {
    client: UpstreamClient,
    url: reqwest::Url,
    stats: Arc<Stats>,
}

/// The call's `max_tokens`, which the gateway writes in a header of its own for the outbound
/// layers.
fn call_max_tokens(call: &reqwest::Request) -> u32 {
    let header = call.headers().get("x-max-tokens");
    header
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// Builds the upstream client: the client quota waits (up to [`QUOTA_WAIT`]) until the
/// upstream's tokens allow the call, and settles it to the usage read from the body; then the
/// pushback waits (up to [`PUSHBACK_WAIT`]) until the upstream's own answers say the call's
/// `max_tokens` are left. A call either refuses is never sent, and the quota takes nothing.
fn upstream_client(settings: &Settings) -> Result<UpstreamClient, BoxError> {
    let usage = BodyUsage::json(["usage", "total_tokens"])?;
    let quota = ClientQuotaLayer::new("upstream-tokens", upstream_tokens(settings.upstream_tpm)?)
        .cost_by(call_max_tokens)
        .settle_by(usage);
    let pushback = Pushback::builder("upstream")
        .max_wait(PUSHBACK_WAIT)
        .build();
    let pushback = pushback.layer().cost_by(call_max_tokens);
    let client = ServiceBuilder::new()
        .layer(quota)
        .layer(pushback)
        .service(reqwest::Client::new());
    Ok(UpstreamClient::new(client.map_err(BoxError::from)))
}

/// Forwards the completion to the upstream and streams its answer back unchanged; the
/// gateway's own `503` when the upstream's quota cannot take it.
async fn complete(State(gateway): State<Gateway>, request: Request) -> Response {
    let max_tokens = request.extensions().get::<MaxTokens>().map_or(1, |m| m.0);
    let Ok(body) = to_bytes(request.into_body(), 64 * 1024).await else {
        return error(StatusCode::BAD_REQUEST, "the body could not be read", None);
    };
    let mut call = reqwest::Request::new(reqwest::Method::POST, gateway.url.clone());
    let headers = call.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("x-max-tokens", max_tokens.into());
    *call.body_mut() = Some(body.into());
    match gateway.client.oneshot(call).await {
        Ok(answer) if answer.status() == StatusCode::TOO_MANY_REQUESTS => {
            let message = "the upstream refused the call (429)";
            let wait = Duration::from_secs(1);
            error(StatusCode::SERVICE_UNAVAILABLE, message, Some(wait))
        }
        Ok(answer) if !answer.status().is_success() => {
            let message = format!("the upstream answered {}", answer.status());
            error(StatusCode::BAD_GATEWAY, &message, None)
        }
        Ok(answer) => {
            // The body as it comes, streamed (the client quota reads its usage on the way); of
            // the head, only the type: the upstream's rate-limit fields are the gateway's own.
            let (parts, body) = http::Response::from(answer).into_parts();
            let mut response = Response::new(Body::new(body));
            if let Some(value) = parts.headers.get("content-type") {
                response.headers_mut().insert("content-type", value.clone());
            }
            response
        }
        Err(failure) => match retry_after(&*failure) {
            Some(wait) => {
                let message = format!("the upstream's token quota is spent: {failure}");
                error(StatusCode::SERVICE_UNAVAILABLE, &message, Some(wait))
            }
            None if failure.is::<InsufficientCapacity>() => {
                let message = "max_tokens is more than the upstream allows in a minute";
                error(StatusCode::PAYLOAD_TOO_LARGE, message, None)
            }
            None => {
                let message = format!("the upstream could not be reached: {failure}");
                error(StatusCode::BAD_GATEWAY, &message, None)
            }
        },
    }
}

/// The gateway's own error answer, OpenAI's shape; it reports no usage, so the request's
/// reservation goes back to its key. `Retry-After` in whole seconds, at least 1.
fn error(status: StatusCode, message: &str, retry_after: Option<Duration>) -> Response {
    let mut response = (status, Json(json!({"error": {"message": message}}))).into_response();
    if let Some(wait) = retry_after {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let headers = response.headers_mut();
        headers.insert("retry-after", secs.max(1).into());
    }
    response
}

/// `GET /stats`: what the upstream served.
async fn report(State(gateway): State<Gateway>) -> Json<serde_json::Value> {
    let stats = &gateway.stats;
    Json(json!({
        "upstream_tokens": stats.tokens.load(Relaxed),
        "upstream_calls": stats.calls.load(Relaxed),
        "upstream_429": stats.refused.load(Relaxed),
    }))
}

/// Starts the mock upstream and the gateway; returns the address the gateway listens on.
///
/// # Errors
///
/// A setting the crate refuses (a zero quota), or an address that cannot be bound.
pub async fn start(settings: &Settings) -> Result<SocketAddr, BoxError> {
    let stats = Arc::new(Stats::default());
    let url = start_upstream(settings, Arc::clone(&stats))
        .await?
        .parse()?;
    let gateway = Gateway {
        client: upstream_client(settings)?,
        url,
        stats,
    };

    // Per API key: requests in flight, and tokens (reserve max_tokens, settle to the usage the
    // answer reports, JSON or events by its Content-Type), in one all-or-nothing decision.
    let in_flight = Policy::concurrent("in-flight", api_key, settings.max_concurrent)?;
    let tokens = Policy::new("tokens", api_key, key_tokens(settings.per_key)?)?
        .cost_by(|request| request.extensions.get::<MaxTokens>().map_or(1, |m| m.0))
        .settle_from_body(BodyUsage::json(["usage", "total_tokens"])?);
    let limits = ServiceBuilder::new()
        .layer(middleware::from_fn(read_max_tokens))
        .layer(RateLimitLayer::new(in_flight.and(tokens)).wrap_body());
    let app = Router::new()
        .route("/v1/complete", post(complete))
        .route_layer(limits)
        .route("/stats", get(report))
        .with_state(gateway);

    let listener = tokio::net::TcpListener::bind(settings.addr).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = Settings::from_env()?;
    let addr = start(&settings).await?;
    let (in_flight, tpm) = (settings.max_concurrent, settings.per_key);
    println!("per API key: {in_flight} requests in flight, {tpm} tokens a minute");
    let (tpm, stream) = (settings.upstream_tpm, settings.stream);
    println!("upstream: {tpm} tokens a minute in all, {stream:?} an answer");
    println!("listening on {addr}");
    std::future::pending::<()>().await;
    Ok(())
}
