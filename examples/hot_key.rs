//! One global quota in Redis for every instance of a service, on a key far too hot for one
//! round trip per request: leases of the quota.
//!
//! ```sh
//! cargo run --release --features redis --example hot_key
//! ADDR=127.0.0.1:3005 cargo run --release --features redis --example hot_key  # a second copy
//! ```
//!
//! Serves `GET /` on `ADDR` (default 127.0.0.1:3004) under one global policy: a GCRA
//! `RedisRateLimiter` at `REDIS_URL` (default redis://127.0.0.1:6379) of `QUOTA` requests a
//! second (default 5000) with a burst of a tenth of that. Each instance leases shares of the
//! quota and admits from them without a round trip, unless `LEASES=off`. A refusal is the
//! usual 429. Copies on other ports that share the Redis share the quota, exactly. While Redis
//! cannot answer, each copy decides with a local limiter of the quota (the default fail mode,
//! `local`), or refuses with `FAIL_MODE=closed`, once the shares held are spent.
//!
//! On Ctrl-C (or SIGTERM) it prints what it admitted and what its leases did:
//! `RESULT admitted=N refused=M local_decisions=L leases=T unused_permits=U`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
use tower_bulwark::redis::{Lease, RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::{BoxError, Quota};

/// What one instance admitted and refused.
#[derive(Clone, Default)]
pub struct Counts(Arc<[AtomicU64; 2]>);

impl Counts {
    /// Requests admitted and refused so far.
    pub fn read(&self) -> (u64, u64) {
        (
            self.0[0].load(Ordering::Relaxed),
            self.0[1].load(Ordering::Relaxed),
        )
    }
}

/// One instance: `GET /` under a global GCRA policy of `rate` requests a second (burst a tenth
/// of it) on a `RedisRateLimiter` at `url`, leasing shares of the quota if `leases`.
pub async fn app(
    url: &str,
    rate: u32,
    leases: bool,
) -> Result<(Router, RedisRateLimiter, Counts), BoxError> {
    let quota = Quota::per_second(rate)?.with_burst((rate / 10).max(1))?;
    let store = RedisStore::connect(url).await?;
    let mut builder = RedisRateLimiter::builder(quota, store).prefix("hot_key:");
    if std::env::var("FAIL_MODE").is_ok_and(|mode| mode == "closed") {
        // While Redis cannot answer, refuse (after the shares held are spent) rather than decide
        // with a local limiter.
        builder = builder.fail_mode(RedisFailMode::Closed(Duration::from_secs(1)));
    }
    if leases {
        builder = builder.lease(Lease::new());
    }
    let limiter = builder.build()?;
    let policy = Policy::new("global", GlobalKey, limiter.clone())?;
    let counts = Counts::default();
    let counted = counts.clone();
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(policy))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let counts = counted.clone();
            async move {
                let response: Response = next.run(request).await;
                let refused = usize::from(response.status() == 429);
                counts.0[refused].fetch_add(1, Ordering::Relaxed);
                response
            }
        }));
    Ok((app, limiter, counts))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3004".into());
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let rate: u32 = std::env::var("QUOTA").map_or(Ok(5000), |q| q.parse())?;
    let leases = std::env::var("LEASES").map_or(true, |v| v != "off");
    let (app, limiter, counts) = app(&url, rate, leases).await?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "global quota of {rate} a second (burst {}), leases {}",
        (rate / 10).max(1),
        if leases { "on" } else { "off" }
    );
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await?;
    let (admitted, refused) = counts.read();
    let leased = limiter.counts();
    println!(
        "RESULT admitted={admitted} refused={refused} local_decisions={} leases={} unused_permits={}",
        leased.lease_decisions, leased.leases_taken, leased.lease_unused_permits,
    );
    // Let a lease given back at its end reach Redis before the process goes.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
