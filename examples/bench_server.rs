//! The hello-world server that `benches/http_wrk.sh` loads with `wrk`.
//!
//! ```sh
//! cargo run --release --example bench_server -- VARIANT [ADDR]
//! ```
//!
//! `VARIANT` is one of:
//!
//! * `none`: no limiter;
//! * `identity-layer`: no limiter, but a layer that does nothing put on with `route_layer`: what
//!   axum's layer plumbing costs by itself;
//! * `none-headers`: no limiter, but the handler itself returns the two headers that `bulwark`
//!   adds, with values of the same length: the cost of those bytes on the wire, with no limiter;
//! * `bulwark`: `RateLimitLayer` keyed by peer IP, with a quota that never refuses (default
//!   settings, so admitted responses carry the `RateLimit` headers);
//! * `bulwark-bare`: the same without headers on admitted responses;
//! * `governor`: `tower_governor` keyed by peer IP, with a quota that never refuses;
//! * `governor-headers`: the same with `use_headers()`, so admitted responses carry its
//!   `x-ratelimit-limit` and `x-ratelimit-remaining` headers (the like of `bulwark`);
//! * `bulwark-three`: three policies chained with `Policy::and`, each with its own key: per peer
//!   IP, per `Host` header (the header every `wrk` request carries) and one global budget (a
//!   `DirectRateLimiter`), default settings;
//! * `bulwark-cost-by`: `bulwark` with a cost computed from the request (`cost_by`);
//! * `bulwark-count-if`: `bulwark` counting only server errors (`count_if`), so every admitted
//!   request's permit is given back after its `200`;
//! * `bulwark-refuse` / `governor-refuse`: one request per hour, so a client under load is
//!   refused (the refusal path);
//! * `usage-plain`: the handler answers as an LLM API does, a JSON body with
//!   `usage.total_tokens` and an `x-usage-total-tokens` header, behind `bulwark` with a cost of
//!   four, never settled;
//! * `usage-settle-head`: the same, each request settled to the header (`settle_by`);
//! * `usage-settle-body`: the same, each request settled to the body's `usage.total_tokens`
//!   (`settle_from_body`, with `wrap_body`), read as the body goes out;
//! * `overload` (feature `adaptive`): the overload protection, `Overload` with its default
//!   settings (every request of the default class, the limit moved by its default AIMD);
//! * `tower-shed`: tower's fixed limit of 1000 requests in flight, shedding those over it
//!   (`load_shed` over `concurrency_limit`, its refusal answered `503`), the like of `overload`
//!   with a limit that never moves.
//!
//! The server runs on `BENCH_THREADS` tokio worker threads (default 1) and listens on `ADDR`
//! (default `127.0.0.1:3000`).

use std::net::{IpAddr, SocketAddr};

use axum::routing::get;
use axum::Router;
use http::header::HOST;
use tower_bulwark::rate_limit::{GlobalKey, HeaderKey, PeerIp, Policy, RateLimitLayer};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Quota};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

/// As many permits as a benchmark can ask for: a burst of a billion, refilled at a billion a
/// second.
const NEVER_REFUSES: u32 = 1_000_000_000;

fn app(variant: &str) -> Result<Router, Box<dyn std::error::Error>> {
    let hello = Router::new().route("/", get(|| async { "Hello, World!" }));
    let per_ip = |quota: Quota| {
        Policy::new(
            "per-ip",
            PeerIp::new(),
            KeyedRateLimiter::<IpAddr>::new(quota),
        )
    };
    let bulwark = |quota: Quota| -> Result<_, Box<dyn std::error::Error>> {
        Ok(RateLimitLayer::new(per_ip(quota)?))
    };
    let governor = |per_nanos: Option<u64>, burst: u32| {
        let mut builder = GovernorConfigBuilder::default();
        match per_nanos {
            Some(nanos) => builder.per_nanosecond(nanos),
            None => builder.per_second(3600),
        };
        let config = builder
            .burst_size(burst)
            .finish()
            .ok_or("tower_governor refused the configuration")?;
        Ok::<_, Box<dyn std::error::Error>>(GovernorLayer::new(config))
    };
    let never = Quota::per_second(NEVER_REFUSES)?;
    let hourly = Quota::per_hour(1)?;
    Ok(match variant {
        "none" => hello,
        "identity-layer" => hello.route_layer(tower::layer::util::Identity::new()),
        "none-headers" => Router::new().route(
            "/",
            get(|| async {
                (
                    [
                        ("ratelimit-policy", "\"per-ip\";q=1000000000;w=1"),
                        ("ratelimit", "\"per-ip\";r=999999999;t=1"),
                    ],
                    "Hello, World!",
                )
            }),
        ),
        "bulwark" => hello.route_layer(bulwark(never)?),
        "bulwark-bare" => hello.route_layer(bulwark(never)?.without_admitted_headers()),
        "bulwark-refuse" => hello.route_layer(bulwark(hourly)?),
        "bulwark-three" => {
            let per_host = Policy::new(
                "per-host",
                HeaderKey::new(HOST)?,
                KeyedRateLimiter::new(never),
            )?;
            let all = Policy::new("all", GlobalKey, DirectRateLimiter::new(never))?;
            hello.route_layer(RateLimitLayer::new(per_ip(never)?.and(per_host).and(all)))
        }
        "bulwark-cost-by" => {
            let policy = per_ip(never)?.cost_by(|request| {
                if request.uri.path() == "/search" {
                    5
                } else {
                    1
                }
            });
            hello.route_layer(RateLimitLayer::new(policy))
        }
        "bulwark-count-if" => {
            let policy = per_ip(never)?.count_if(|response| response.status.is_server_error());
            hello.route_layer(RateLimitLayer::new(policy))
        }
        "governor" => hello.route_layer(governor(Some(1), NEVER_REFUSES)?),
        "governor-headers" => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(NEVER_REFUSES)
                .use_headers()
                .finish()
                .ok_or("tower_governor refused the configuration")?;
            hello.route_layer(GovernorLayer::new(config))
        }
        "governor-refuse" => hello.route_layer(governor(None, 1)?),
        "usage-plain" | "usage-settle-head" | "usage-settle-body" => {
            let usage = Router::new().route(
                "/",
                get(|| async {
                    (
                        [
                            ("content-type", "application/json"),
                            ("x-usage-total-tokens", "1"),
                        ],
                        r#"{"id":"c1","usage":{"total_tokens":1}}"#,
                    )
                }),
            );
            let policy = per_ip(never)?.cost(4);
            match variant {
                "usage-plain" => usage.route_layer(RateLimitLayer::new(policy)),
                "usage-settle-head" => {
                    usage.route_layer(RateLimitLayer::new(policy.settle_by(|response| {
                        let value = response.headers.get("x-usage-total-tokens")?;
                        value.to_str().ok()?.parse().ok()
                    })))
                }
                _ => {
                    let body = BodyUsage::json(["usage", "total_tokens"])?;
                    let policy = policy.settle_from_body(body);
                    usage.route_layer(RateLimitLayer::new(policy).wrap_body())
                }
            }
        }
        #[cfg(feature = "adaptive")]
        "overload" => {
            let overload = tower_bulwark::overload::Overload::builder("bench").build();
            hello.route_layer(overload.layer())
        }
        #[cfg(not(feature = "adaptive"))]
        "overload" => return Err("the `overload` variant needs `--features adaptive`".into()),
        "tower-shed" => hello.route_layer(
            tower::ServiceBuilder::new()
                .layer(axum::error_handling::HandleErrorLayer::new(
                    |_: tower::BoxError| async { http::StatusCode::SERVICE_UNAVAILABLE },
                ))
                .load_shed()
                .concurrency_limit(1000),
        ),
        other => return Err(format!("unknown variant {other:?}").into()),
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let variant = args.next().unwrap_or_else(|| "none".to_owned());
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let threads = std::env::var("BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let app = app(&variant)?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            println!("bench_server {variant} on {}", listener.local_addr()?);
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await?;
            Ok(())
        })
}
