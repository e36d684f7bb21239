//! Named instances from `examples/bulwark.toml`, with `/metrics` and `/health`.
//!
//! ```sh
//! cargo run --features full --example observability
//! for i in $(seq 1 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3001/orders; done
//! curl -s http://127.0.0.1:3001/metrics | grep bulwark_
//! curl -s http://127.0.0.1:3001/health
//! ```
//!
//! `GET /orders` is limited by the instance `api`; `/metrics` renders the Prometheus text format
//! and `/health` a JSON report that stays `UP` while instances are saturated. No other endpoint
//! is served. `ADDR` overrides the address and `BULWARK_CONFIG` the configuration file.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::net::TcpListener;
use tower_bulwark::config::Registry;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3001".to_owned());
    let path = std::env::var("BULWARK_CONFIG")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bulwark.toml").into());
    let registry = Arc::new(Registry::from_path(&path)?);
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let metrics = {
        let registry = Arc::clone(&registry);
        move || {
            let registry = Arc::clone(&registry);
            let prometheus = prometheus.clone();
            async move {
                registry.publish_gauges();
                (
                    [(CONTENT_TYPE, "text/plain; version=0.0.4")],
                    prometheus.render(),
                )
            }
        }
    };
    let health = {
        let registry = Arc::clone(&registry);
        move || {
            let registry = Arc::clone(&registry);
            async move {
                (
                    [(CONTENT_TYPE, "application/json")],
                    registry.health().to_json(),
                )
            }
        }
    };
    let app = Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(registry.rate_limit_layer("api")?)
        .route("/metrics", get(metrics))
        .route("/health", get(health));

    let listener = TcpListener::bind(&addr).await?;
    println!(
        "listening on http://{}; /orders limited by `api` from {path}; /metrics and /health",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
