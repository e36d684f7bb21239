//! Refusals of named instances as `tracing` events. In a file of its own: `tracing` caches
//! per call site whether anyone listens, and tests in other threads without a subscriber would
//! race that cache.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::config::Registry;

const CONFIG: &str = r#"
[rate_limiters.api]
limit_for_period = 10
limit_refresh_period = "1h"
key = "peer_ip"

[rate_limiters.private]
limit_for_period = 1
limit_refresh_period = "1h"
key = "peer_ip"
hide_keys = true
"#;

fn router(registry: &Registry, name: &str, peer: [u8; 4]) -> Router {
    Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(registry.rate_limit_layer(name).unwrap())
        .layer(MockConnectInfo(SocketAddr::from((peer, 4000))))
}

async fn get_orders(app: &Router) -> StatusCode {
    let req = Request::get("/orders").body(Body::empty()).unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Collects what a `tracing` subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn each_refusal_is_a_debug_event_with_name_key_and_delay_unless_keys_are_hidden() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        runtime().block_on(async {
            let registry = Registry::from_toml_str(CONFIG).unwrap();
            let api = router(&registry, "api", [198, 51, 100, 23]);
            for _ in 0..11 {
                get_orders(&api).await;
            }
            let private = router(&registry, "private", [192, 0, 2, 99]);
            get_orders(&private).await;
            assert_eq!(get_orders(&private).await, StatusCode::TOO_MANY_REQUESTS);
        })
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let refusals: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("rate limit refused a request"))
        .collect();
    assert_eq!(refusals.len(), 2, "{text}");
    let api = refusals.iter().find(|l| l.contains("limiter=api")).unwrap();
    assert!(api.contains("DEBUG"), "{api}");
    assert!(api.contains("key=Ip(198.51.100.23)"), "{api}");
    // Six minutes (one permit of ten per hour) less the moments the requests took, in whole
    // milliseconds rounded up.
    let retry_ms: u64 = api
        .split("retry_after_ms=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!((359_000..=360_000).contains(&retry_ms), "{api}");
    let private = refusals
        .iter()
        .find(|l| l.contains("limiter=private"))
        .unwrap();
    assert!(
        !private.contains("192.0.2.99"),
        "a hidden key leaks: {private}"
    );
    assert!(private.contains("key=(hidden)"), "{private}");
}
