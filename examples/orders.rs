//! An axum server whose `GET /orders` is limited to 10 requests per second per client IP.
//!
//! ```sh
//! cargo run --example orders
//! # in another terminal: ten 200s, then 429s
//! curl -s -o /dev/null -w '%{http_code}\n' 'http://127.0.0.1:3000/orders?[1-12]'
//! # one refusal in full: Retry-After, RateLimit-Policy, RateLimit, problem+json
//! sleep 1; curl -si 'http://127.0.0.1:3000/orders?[1-11]' | tail -n 9
//! ```
//!
//! `ADDR` overrides the address (`ADDR=0.0.0.0:8080 cargo run --example orders`).

use std::net::{IpAddr, SocketAddr};

use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{KeyedRateLimiter, Quota};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let quota = Quota::per_second(10)?;
    let limiter = KeyedRateLimiter::<IpAddr>::new(quota);
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(Policy::new(
            "per-ip",
            PeerIp::new(),
            limiter,
        )?));

    let listener = TcpListener::bind(&addr).await?;
    println!(
        "listening on http://{}/orders; policy \"per-ip\": {} requests per second per client IP",
        listener.local_addr()?,
        quota.permits()
    );
    // The peer address is what `PeerIp` keys by: serve with connection info.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
