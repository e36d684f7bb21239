//! Two instances of a service share one quota through Redis.
//!
//! Two axum servers run on two loopback ports, each with its own Redis connection and its own
//! `RedisRateLimiter`, as two replicas behind a load balancer would. The quota is 20 requests per
//! 10 seconds per client key (`x-api-key`). One client sends 30 requests to each instance; since
//! the budget lives in Redis, 20 are admitted in total, not 20 per instance.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --features redis --example redis_quota
//! ```
//!
//! Each instance limits with the crate's `RateLimitLayer`, keyed by the `x-api-key` header, so a
//! refused request gets the same 429, `Retry-After` and `RateLimit` headers as with the
//! in-memory limiter.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::{algorithm::SlidingLog, BoxError, Quota};

const INSTANCES: usize = 2;
const REQUESTS_PER_INSTANCE: usize = 30;

/// Starts one instance on a free loopback port and returns its address.
async fn start_instance(url: &str, quota: Quota, prefix: &str) -> Result<SocketAddr, BoxError> {
    // Each instance connects on its own, as a separate process would.
    let store = RedisStore::connect(url).await?;
    let limiter = RedisRateLimiter::builder(quota, store)
        .algorithm::<SlidingLog>()
        .prefix(prefix)
        .timeout(Duration::from_secs(1))
        // An example should say when Redis is not there rather than quietly admit everything.
        .fail_mode(RedisFailMode::Propagate)
        .build()?;
    let layer = RateLimitLayer::new(Policy::new(
        "per-key",
        HeaderKey::new("x-api-key")?,
        limiter,
    )?);
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route_layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            eprintln!("instance {addr} stopped: {err}");
        }
    });
    Ok(addr)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let quota = Quota::with_period(20, Duration::from_secs(10))?;
    // A prefix of this run's own, so that a second run within ten seconds starts afresh.
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros();
    let prefix = format!("redis_quota_example:{run}:{}:", std::process::id());

    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        let addr = start_instance(&url, quota, &prefix)
            .await
            .map_err(|err| format!("cannot start an instance on {url}: {err}"))?;
        instances.push(addr);
    }

    let client = reqwest::Client::new();
    let (mut admitted, mut refused) = (0, 0);
    for _ in 0..REQUESTS_PER_INSTANCE {
        for addr in &instances {
            let response = client
                .get(format!("http://{addr}/"))
                .header("x-api-key", "client-7")
                .send()
                .await?;
            match response.status() {
                StatusCode::OK => admitted += 1,
                StatusCode::TOO_MANY_REQUESTS => refused += 1,
                other => {
                    let body = response.text().await.unwrap_or_default();
                    return Err(format!("instance {addr} answered {other}: {body}").into());
                }
            }
        }
    }
    println!(
        "RESULT quota={} admitted={admitted} refused={refused} instances={INSTANCES}",
        quota.permits()
    );
    if admitted != quota.permits() {
        return Err(format!(
            "the instances admitted {admitted}, not the shared quota of {}",
            quota.permits()
        )
        .into());
    }
    Ok(())
}
