//! Rate limiters configured with `store = "redis"`: one quota across instances, and the failure
//! policy from the file.

use crate::common::redis_server;

use crate::common::redis_server::{or_skip, RedisServer};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::config::{ConfigKey, Registry};
use tower_bulwark::Limiter;

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

/// Calls number `calls` of a tenant, even ones to `a` and odd ones to `b`: how many were
/// answered OK.
async fn ok_taking_turns(a: &Router, b: &Router, calls: std::ops::Range<usize>) -> usize {
    let mut ok = 0;
    for i in calls {
        let app = if i % 2 == 0 { a } else { b };
        if get_orders(app).await == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

#[tokio::test]
async fn two_registries_on_one_redis_share_one_quota() {
    let server = or_skip!(RedisServer::start(
        "two_registries_on_one_redis_share_one_quota"
    ));
    let extra = "algorithm = \"sliding_log\"\nredis_prefix = \"config-test:\"";
    let config = shared_on_redis(&server.url(), extra);
    // Two instances of a service, each with its own registry and connection.
    let a = app(&Registry::from_toml_str(&config).unwrap());
    let b = app(&Registry::from_toml_str(&config).unwrap());
    let ok = ok_taking_turns(&a, &b, 0..8).await;
    assert_eq!(ok, 3, "one quota of 3 across both instances");
    // The state lives in Redis under the configured prefix (the reply's first line counts keys).
    let keys = server.command(&["KEYS", "config-test:*{tenant-7}*"]);
    assert!(keys.starts_with('*') && keys != "*0", "{keys}");
}

/// A file of one rate limiter, `shared`, of 3 an hour keyed by `x-api-key`, in the Redis at
/// `url`, with the further settings `extra` (TOML lines).
pub(crate) fn shared_on_redis(url: &str, extra: &str) -> String {
    format!(
        r#"
        [rate_limiters.shared]
        limit_for_period = 3
        limit_refresh_period = "1h"
        key = "header:x-api-key"
        store = "redis"
        redis_url = "{url}"
        {extra}
        "#
    )
}

#[tokio::test]
async fn the_failure_policy_from_the_file_answers_when_redis_is_down() {
    // A port where nothing listens: reserve one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}/");
    let config =
        |policy: &str| shared_on_redis(&url, &format!("redis_timeout = \"200ms\"\n{policy}"));
    let open_registry = Registry::from_toml_str(&config("redis_fail_mode = \"open\"")).unwrap();
    let closed_registry = Registry::from_toml_str(&config("redis_fail_mode = \"closed\"")).unwrap();
    let open = app(&open_registry);
    let closed = app(&closed_registry);
    let local = app(&Registry::from_toml_str(&config(
        "redis_fail_mode = \"fallback\"\nfallback_limit_for_period = 2",
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

    // Every one of those decisions was the fail mode's, and the registry says so.
    for registry in [&open_registry, &closed_registry] {
        let health = registry.health();
        assert_eq!(health.rate_limiters[0].store_failures, Some(4));
        let json: serde_json::Value = serde_json::from_str(&health.to_json()).unwrap();
        assert_eq!(json["rateLimiters"]["shared"]["storeFailures"], 4);
    }
    #[cfg(feature = "metrics")]
    {
        use crate::common::recorded::{counter, recorded_by};
        let all = recorded_by(|| closed_registry.publish_gauges());
        let failures = "bulwark_ratelimiter_store_failures_total";
        assert_eq!(counter(&all, failures, &[("name", "shared")]), 4, "{all:?}");
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

#[tokio::test]
async fn a_reload_changes_a_redis_quota_and_leaves_the_unchanged_limiter_s_keys_as_they_were() {
    let server = or_skip!(RedisServer::start("config_redis::reload"));
    let config = |changed_permits: u32| {
        format!(
            r#"
            [rate_limiters.changed]
            limit_for_period = {changed_permits}
            limit_refresh_period = "1h"
            algorithm = "sliding_counter"
            key = "global"
            store = "redis"
            redis_url = "{url}"
            redis_prefix = "reload-changed:"

            [rate_limiters.unchanged]
            limit_for_period = 5
            limit_refresh_period = "1h"
            algorithm = "sliding_log"
            key = "global"
            store = "redis"
            redis_url = "{url}"
            redis_prefix = "reload-unchanged:"
            "#,
            url = server.url()
        )
    };
    let registry = Registry::from_toml_str(&config(10)).unwrap();
    let mut conn = server.connection().await;
    async fn admitted(registry: &Registry, name: &str, n: usize) -> usize {
        let limiter = registry.rate_limiter(name).unwrap();
        let mut count = 0;
        for _ in 0..n {
            if limiter
                .reserve(&ConfigKey::Global, 1)
                .await
                .unwrap()
                .allowed
            {
                count += 1;
            }
        }
        count
    }
    assert_eq!(admitted(&registry, "changed", 9).await, 9);
    assert_eq!(admitted(&registry, "unchanged", 3).await, 3);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("reload-unchanged:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let before = redis_server::key_state(&mut conn, &keys[0]).await;

    let reloaded = registry.reload_toml_str(&config(20)).unwrap();
    assert_eq!(reloaded.rate_limiters, vec!["changed".to_owned()]);
    assert_eq!(redis_server::key_state(&mut conn, &keys[0]).await, before);
    // 9 of 20 used in Redis: 11 left.
    assert_eq!(admitted(&registry, "changed", 20).await, 11);
    // A quota the Redis sliding counter cannot count exactly is refused, and changes nothing.
    let err = registry.reload_toml_str(&config(2_000_000)).unwrap_err();
    assert_eq!(err.path(), "rate_limiters.changed", "{err}");
    assert!(err.message().contains("too large"), "{err}");
    let changed = registry.rate_limiter("changed").unwrap();
    assert_eq!(changed.quota().permits(), 20);
    assert_eq!(redis_server::key_state(&mut conn, &keys[0]).await, before);
    assert_eq!(admitted(&registry, "unchanged", 5).await, 2);
}

/// `redis_leases = true`: two registries on one Redis lease shares of one quota and together
/// admit exactly it (three an hour); the key in Redis holds the leases. Leases with another
/// algorithm than GCRA, or their settings without `redis_leases`, are refused naming the field.
#[tokio::test]
async fn leases_from_the_file_share_one_quota_exactly() {
    let server = or_skip!(RedisServer::start(
        "leases_from_the_file_share_one_quota_exactly"
    ));
    let url = server.url();
    let config =
        |extra: &str| shared_on_redis(&url, &format!("redis_prefix = \"config-lease:\"\n{extra}"));
    let leased =
        config("redis_leases = true\nredis_lease_max_share = 2\nredis_lease_length = \"1s\"");
    let registry_a = Registry::from_toml_str(&leased).unwrap();
    let a = app(&registry_a);
    let b = app(&Registry::from_toml_str(&leased).unwrap());
    let mut ok = ok_taking_turns(&a, &b, 0..1).await;
    // The first call took a lease, which the key in Redis holds until it comes back.
    let state = server.command(&["GET", "config-lease:{tenant-7}"]);
    assert!(state.contains(';'), "no lease in {state:?}");
    ok += ok_taking_turns(&a, &b, 1..8).await;
    assert_eq!(ok, 3, "one quota of 3 across both instances");
    #[cfg(feature = "metrics")]
    {
        // `a` took a lease for each of its first two calls.
        use crate::common::recorded::{counter, find, recorded_by};
        use metrics_util::MetricKind;
        let all = recorded_by(|| registry_a.publish_gauges());
        let leases = "bulwark_ratelimiter_leases_total";
        let taken = [("name", "shared"), ("outcome", "taken")];
        assert_eq!(counter(&all, leases, &taken), 2, "{all:?}");
        for name in [
            "bulwark_ratelimiter_lease_decisions_total",
            "bulwark_ratelimiter_lease_unused_permits_total",
        ] {
            let found = find(&all, MetricKind::Counter, name, &[("name", "shared")]);
            assert!(found.is_some(), "{name}: {all:?}");
        }
    }

    for (extra, field) in [
        (
            "redis_leases = true\nalgorithm = \"sliding_log\"",
            "redis_leases",
        ),
        ("redis_lease_length = \"1s\"", "redis_lease_length"),
        ("redis_lease_max_share = 2", "redis_lease_max_share"),
        ("redis_leases = true\nredis_lease_max_share = 9", "shared"),
    ] {
        let err = Registry::from_toml_str(&config(extra))
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{extra}: {err}");
    }
}
