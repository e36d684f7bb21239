//! Rate limiters configured with `store = "redis"`: one quota across instances, and the failure
//! policy from the file.
#![cfg(all(feature = "config", feature = "redis"))]

mod support;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use support::RedisServer;
use tower::ServiceExt;
use tower_bulwark::config::Registry;

fn app(registry: &Registry) -> Router {
    Router::new()
        .route("/orders", get(|| async { "ok" }))
        .route_layer(registry.rate_limit_layer("shared").unwrap())
}

async fn get_orders(app: &Router) -> StatusCode {
    let req = Request::get("/orders")
        .header("x-api-key", "tenant-7")
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

#[tokio::test]
async fn two_registries_on_one_redis_share_one_quota() {
    let Some(server) = RedisServer::start("two_registries_on_one_redis_share_one_quota") else {
        return;
    };
    let config = format!(
        r#"
        [rate_limiters.shared]
        limit_for_period = 3
        limit_refresh_period = "1h"
        algorithm = "sliding_log"
        key = "header:x-api-key"
        store = "redis"
        redis_url = "{}"
        redis_prefix = "config-test:"
        "#,
        server.url()
    );
    // Two instances of a service, each with its own registry and connection.
    let a = app(&Registry::from_toml_str(&config).unwrap());
    let b = app(&Registry::from_toml_str(&config).unwrap());
    let mut ok = 0;
    for i in 0..8 {
        let app = if i % 2 == 0 { &a } else { &b };
        if get_orders(app).await == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 3, "one quota of 3 across both instances");
    // The state lives in Redis under the configured prefix (the reply's first line counts keys).
    let keys = server.command(&["KEYS", "config-test:*{tenant-7}*"]);
    assert!(keys.starts_with('*') && keys != "*0", "{keys}");
}

#[tokio::test]
async fn the_failure_policy_from_the_file_answers_when_redis_is_down() {
    // A port where nothing listens: reserve one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = |policy: &str| {
        format!(
            r#"
            [rate_limiters.shared]
            limit_for_period = 3
            limit_refresh_period = "1h"
            key = "header:x-api-key"
            store = "redis"
            redis_url = "redis://127.0.0.1:{port}/"
            redis_timeout = "200ms"
            {policy}
            "#
        )
    };
    let open_registry =
        Registry::from_toml_str(&config("on_redis_failure = \"fail_open\"")).unwrap();
    let closed_registry =
        Registry::from_toml_str(&config("on_redis_failure = \"fail_closed\"")).unwrap();
    let open = app(&open_registry);
    let closed = app(&closed_registry);
    let local = app(&Registry::from_toml_str(&config(
        "on_redis_failure = \"local\"\nlocal_limit_for_period = 2",
    ))
    .unwrap());
    for _ in 0..4 {
        assert_eq!(get_orders(&open).await, StatusCode::OK);
        assert_eq!(get_orders(&closed).await, StatusCode::TOO_MANY_REQUESTS);
    }
    let local_ok = {
        let mut n = 0;
        for _ in 0..4 {
            if get_orders(&local).await == StatusCode::OK {
                n += 1;
            }
        }
        n
    };
    assert_eq!(local_ok, 2, "the local fallback's own quota applies");

    // Every one of those decisions was the failure policy's, and the registry says so.
    for registry in [&open_registry, &closed_registry] {
        let health = registry.health();
        assert_eq!(health.rate_limiters[0].store_failures, Some(4));
        let json: serde_json::Value = serde_json::from_str(&health.to_json()).unwrap();
        assert_eq!(json["rateLimiters"]["shared"]["storeFailures"], 4);
    }
    #[cfg(feature = "metrics")]
    {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || closed_registry.publish_gauges());
        let failures: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == "bulwark_ratelimiter_store_failures_total")
            .map(|(.., value)| value)
            .collect();
        assert_eq!(failures, vec![DebugValue::Counter(4)]);
    }
}

#[test]
fn an_in_memory_limiter_reports_no_store_failures() {
    let registry = Registry::from_toml_str(
        "[rate_limiters.local]\nlimit_for_period = 3\nlimit_refresh_period = \"1s\"\nkey = \"global\"\n",
    )
    .unwrap();
    let health = registry.health();
    assert_eq!(health.rate_limiters[0].store_failures, None);
    assert!(!health.to_json().contains("storeFailures"));
}

#[test]
fn a_redis_limiter_outside_a_runtime_is_an_error_not_a_panic() {
    let err = Registry::from_toml_str(
        "[rate_limiters.shared]\nlimit_for_period = 3\nlimit_refresh_period = \"1s\"\nstore = \"redis\"\nredis_url = \"redis://127.0.0.1:1/\"\n",
    )
    .unwrap_err();
    assert_eq!(err.path(), "rate_limiters.shared.store");
    assert!(err.message().contains("tokio runtime"), "{err}");
}
