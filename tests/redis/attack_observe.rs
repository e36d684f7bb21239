//! Attacks on what a configured Redis limiter reports during an outage: the store-failure
//! counter as a Prometheus scrape shows it, however often the gauges are published, and one
//! `WARN` for an outage however many decisions fail at once.

use crate::common::process::{thread_subscriber, TargetEvents};
use crate::common::redis_server::RedisServer;
use tower_bulwark::config::{ConfigKey, Registry};
use tower_bulwark::Limiter;

/// One limiter `shared` of 3 an hour per key in the Redis at `url`, closed while it is down.
fn config(url: &str) -> String {
    let closed = "redis_timeout = \"200ms\"\nredis_fail_mode = \"closed\"";
    crate::config::shared_on_redis(url, closed)
}

/// `calls` decisions of distinct keys at once; how many were admitted.
async fn decide_at_once(registry: &Registry, calls: usize) -> usize {
    let limiter = registry.rate_limiter("shared").unwrap();
    let keys: Vec<ConfigKey> = (0..calls)
        .map(|i| ConfigKey::Header(format!("tenant-{i}").parse().unwrap()))
        .collect();
    let decisions = keys.iter().map(|key| limiter.reserve(key, 1));
    futures::future::join_all(decisions)
        .await
        .into_iter()
        .filter(|d| d.as_ref().unwrap().allowed)
        .count()
}

/// The value of `bulwark_ratelimiter_store_failures_total{name="shared"}` in a scrape.
fn failures_in(scrape: &str) -> u64 {
    let series = "bulwark_ratelimiter_store_failures_total{name=\"shared\"}";
    value_in(scrape, series).unwrap_or_else(|| panic!("no store failures series in:\n{scrape}"))
}

/// Redis goes away after one decision; 20 decisions fail at once and the fail mode answers.
/// The scrape counts 20 failures, and still 20 after the gauges were published three times
/// (as before three scrapes).
///
/// Promise: src/observe.rs:23: "`bulwark_ratelimiter_store_failures_total` | counter | `name` |
/// decisions a shared store (Redis) did not give, decided by the fail mode instead";
/// src/observe.rs:46-50: "Counters and the histogram are recorded as events happen ... The
/// store failure counter and the lease counters are also brought up to date by
/// `publish_gauges`, from the Redis limiter's own counts"; README.md:669:
/// "`counts().failures` and the metric `bulwark_ratelimiter_store_failures_total` count them
/// all".
#[test]
fn attack_store_failures_are_counted_once_whatever_publishes_the_gauges() {
    let Some(mut server) = RedisServer::start("attack_store_failures_are_counted_once") else {
        return;
    };
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let runtime = crate::common::recorded::runtime();
    let registry = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let registry = Registry::from_toml_str(&config(&server.url())).unwrap();
            assert_eq!(decide_at_once(&registry, 1).await, 1);
            server.kill();
            assert_eq!(decide_at_once(&registry, 20).await, 0);
            registry
        })
    });
    let health = registry.health();
    assert_eq!(
        health.rate_limiters[0].store_failures,
        Some(20),
        "{health:?}"
    );
    let before = handle.render();
    let mut scrapes = Vec::new();
    for _ in 0..3 {
        metrics::with_local_recorder(&recorder, || registry.publish_gauges());
        scrapes.push(failures_in(&handle.render()));
    }
    assert_eq!(
        scrapes,
        [20, 20, 20],
        "before publishing: {}",
        failures_in(&before)
    );
}

/// Forty decisions of distinct keys fail at once when Redis goes away: the outage is one
/// `WARN` event, the others quieter, and `counts().failures` holds all forty.
///
/// Promise: README.md:668: "The first failure of an outage is a `WARN` event;
/// `counts().failures` and the metric `bulwark_ratelimiter_store_failures_total` count them
/// all"; src/guide.rs:212: "its first failure is one `WARN` event".
#[test]
fn attack_decisions_failing_at_once_are_one_warn_per_outage() {
    let Some(mut server) = RedisServer::start("attack_decisions_failing_at_once") else {
        return;
    };
    let events = TargetEvents::new("tower_bulwark::redis");
    let _guard = thread_subscriber(events.clone());
    let runtime = crate::common::recorded::runtime();
    runtime.block_on(async {
        let registry = Registry::from_toml_str(&config(&server.url())).unwrap();
        assert_eq!(decide_at_once(&registry, 1).await, 1);
        assert!(events.seen().is_empty(), "{:?}", events.seen());
        server.kill();
        assert_eq!(decide_at_once(&registry, 40).await, 0);
        let health = registry.health();
        assert_eq!(health.rate_limiters[0].store_failures, Some(40));
    });
    let seen = events.seen();
    assert_eq!(events.warns(), 1, "{seen:#?}");
    // The WARN names the limiter it is about (the configured instance's name or prefix).
    let warn = seen
        .iter()
        .find(|(level, _)| *level == tracing::Level::WARN)
        .unwrap();
    assert!(
        warn.1.contains("shared") || warn.1.contains("bulwark:"),
        "{warn:?}"
    );
}

/// With `hide_keys = true`, nothing a Redis limiter logs while Redis is down (the outage's
/// `WARN`, the quieter events of each failure after it) carries a client's key, nor does its
/// recovery's event.
///
/// Promise: the `config` field table: "`hide_keys` | boolean: keep client keys out of log
/// events"; README.md:529: "each refusal is a `tracing` debug event with the instance, the key
/// (unless `hide_keys = true`) and the retry delay".
///
/// (Found by this attack: the outage's `WARN` ("redis decision failed; the fail mode decides
/// until redis answers again") carried `key="bulwark:gcra:{sk-SECRET-tenant}"`, the client's
/// key in full, whatever `hide_keys` said. The Redis limiter's events now name it by its
/// prefix.)
#[test]
fn attack_a_redis_limiters_events_keep_hidden_keys_out() {
    let Some(mut server) = RedisServer::start("attack_a_redis_limiters_events_keep_hidden") else {
        return;
    };
    let text = crate::common::process::debug_events(|| {
        crate::common::recorded::runtime().block_on(async {
            let text = format!("{}hide_keys = true\n", config(&server.url()));
            let registry = Registry::from_toml_str(&text).unwrap();
            let limiter = registry.rate_limiter("shared").unwrap();
            let key = ConfigKey::Header("sk-SECRET-tenant".parse().unwrap());
            assert!(limiter.reserve(&key, 1).await.unwrap().allowed);
            server.kill();
            for _ in 0..3 {
                let decision = limiter.reserve(&key, 1).await.unwrap();
                assert!(!decision.allowed, "closed while Redis is down");
            }
            let health = registry.health();
            assert_eq!(health.rate_limiters[0].store_failures, Some(3));
        })
    });
    assert!(text.contains("WARN"), "the outage is told: {text}");
    assert!(!text.contains("SECRET"), "a hidden key leaks: {text}");
}

/// A Redis limiter that propagates its failures, observed with its keys hidden, on an HTTP
/// route keyed by `x-api-key`: while Redis is down each request gets the documented `503`, and
/// no log event of that (the layer's warn line, the limiter's own events) carries the key.
///
/// Promises: src/observe.rs:393 (`Observed::hide_keys`): "Leaves keys out of the refusal events
/// (for keys that identify people)"; the `config` field table: "`hide_keys` | boolean: keep
/// client keys out of log events"; the `rate_limit` module docs: "By default the request gets
/// `503 Service Unavailable` with a problem+json body and a warn log line".
///
/// (Found by this attack: the layer's own warn line named only the policy, but the Redis
/// limiter's `WARN` (first failure) and `DEBUG` (each failure after it) events carried
/// `key="bulwark:gcra:{sk-SECRET-tenant}"` under `Observed::hide_keys(true)`.)
#[test]
#[cfg(feature = "axum")]
fn attack_a_failing_redis_limiter_on_a_route_keeps_hidden_keys_out_of_its_503_events() {
    use tower::ServiceExt;
    use tower_bulwark::observe::Observed;
    use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
    use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};

    let Some(mut server) = RedisServer::start("attack_a_failing_redis_limiter_on_a_route") else {
        return;
    };
    let runtime = crate::common::recorded::runtime();
    let app = runtime.block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let limiter = RedisRateLimiter::builder(tower_bulwark::Quota::per_hour(3).unwrap(), store)
            .timeout(std::time::Duration::from_millis(200))
            .fail_mode(RedisFailMode::Propagate)
            .build()
            .unwrap();
        let observed = Observed::new("remote", limiter).hide_keys(true);
        let policy = Policy::new("remote", HeaderKey::new("x-api-key").unwrap(), observed).unwrap();
        axum::Router::new()
            .route("/orders", axum::routing::get(|| async { "ok" }))
            .route_layer(RateLimitLayer::new(policy))
    });
    let get = |app: &axum::Router| {
        let request = http::Request::get("/orders")
            .header("x-api-key", "sk-SECRET-tenant")
            .body(axum::body::Body::empty())
            .unwrap();
        app.clone().oneshot(request)
    };
    runtime.block_on(async {
        assert_eq!(get(&app).await.unwrap().status(), 200);
    });
    server.kill();
    let text = crate::common::process::debug_events(|| {
        runtime.block_on(async {
            for _ in 0..2 {
                assert_eq!(get(&app).await.unwrap().status(), 503);
            }
        })
    });
    assert!(text.contains("WARN"), "the failure is told: {text}");
    assert!(!text.contains("SECRET"), "a hidden key leaks: {text}");
}

/// Client keys written to end a hash tag early, or to look like another key once escaped
/// (`}`, `{`, backslashes, percent signs, bytes that are not UTF-8): each is a budget of its
/// own in Redis, one Redis key each, and every Redis key's hash tag holds the whole client key
/// (nothing of it after the tag's end).
///
/// Promises: README.md:656: "One key per client, `<prefix>{<client key>}`, a Redis Cluster hash
/// tag that no client key can end early"; README.md:91: "A key owns its bytes; no client-written
/// text can choose or share another client's key".
#[test]
#[cfg(feature = "axum")]
fn attack_client_keys_cannot_end_the_hash_tag_or_share_a_redis_key() {
    use tower::ServiceExt;
    use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
    use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};

    let Some(server) = RedisServer::start("attack_client_keys_cannot_end_the_hash_tag") else {
        return;
    };
    let values: Vec<&[u8]> = vec![
        b"a}b",
        b"a\\}b",
        b"a\\\\}b",
        b"a}}b",
        b"a{b}",
        b"{a}",
        b"a",
        b"a}",
        b"a\\",
        b"\\}",
        b"}",
        b"a%7Db",
        b"a\\x7db",
        b"a\\u007db",
        b"a\xff}b",
        b"a\xef\xbf\xbd}b",
        b"a}\xff",
    ];
    let runtime = crate::common::recorded::runtime();
    runtime.block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let limiter = RedisRateLimiter::builder(tower_bulwark::Quota::per_hour(1).unwrap(), store)
            .prefix("tag:")
            .fail_mode(RedisFailMode::Propagate)
            .build()
            .unwrap();
        let policy = Policy::new("tagged", HeaderKey::new("x-api-key").unwrap(), limiter).unwrap();
        let app = axum::Router::new()
            .route("/orders", axum::routing::get(|| async { "ok" }))
            .route_layer(RateLimitLayer::new(policy));
        let status_of = |value: &[u8]| {
            let request = http::Request::get("/orders")
                .header("x-api-key", http::HeaderValue::from_bytes(value).unwrap())
                .body(axum::body::Body::empty())
                .unwrap();
            app.clone().oneshot(request)
        };
        for value in &values {
            let status = status_of(value).await.unwrap().status();
            assert_eq!(
                status,
                200,
                "{:?} shares a budget with a key before it",
                String::from_utf8_lossy(value)
            );
        }
        // Each value's second request is refused: one budget per value, kept.
        for value in &values {
            let status = status_of(value).await.unwrap().status();
            assert_eq!(status, 429, "{:?}", String::from_utf8_lossy(value));
        }
    });
    let mut connection = redis::Client::open(server.url()).unwrap();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("tag:*")
        .query(&mut connection)
        .unwrap();
    assert_eq!(keys.len(), values.len(), "{keys:?}");
    for key in &keys {
        // The hash tag Redis Cluster reads: from the first `{` to the first `}` after it.
        let open = key.iter().position(|b| *b == b'{').expect("a hash tag");
        let close = open + 1 + key[open + 1..].iter().position(|b| *b == b'}').unwrap();
        assert_eq!(
            close,
            key.len() - 1,
            "the tag of {:?} ends before the key does",
            String::from_utf8_lossy(key)
        );
    }
}

/// The value of series `series` (name and labels, as a scrape writes them) in `scrape`.
fn value_in(scrape: &str, series: &str) -> Option<u64> {
    scrape
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A configured limiter leasing shares of a global key: 60 decisions, then the gauges
/// published three times before three scrapes. The lease counters say the same in each
/// scrape (publishing brings them up to date, it does not add them again), and the
/// admissions made from a lease are at most the decisions made.
///
/// Promise: src/observe.rs:24-26 (`bulwark_ratelimiter_lease_decisions_total`,
/// `bulwark_ratelimiter_leases_total` `outcome` = `taken` | `ended`,
/// `bulwark_ratelimiter_lease_unused_permits_total`); src/observe.rs:49: "The store failure
/// counter and the lease counters are also brought up to date by `publish_gauges`, from the
/// Redis limiter's own counts".
#[test]
fn attack_lease_counters_are_not_counted_again_by_each_publish() {
    let Some(server) = RedisServer::start("attack_lease_counters_are_not_counted_again") else {
        return;
    };
    let text = format!(
        r#"
        [rate_limiters.shared]
        limit_for_period = 1000
        limit_refresh_period = "1h"
        key = "global"
        store = "redis"
        redis_url = "{}"
        redis_leases = true
        "#,
        server.url()
    );
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let runtime = crate::common::recorded::runtime();
    let registry = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let registry = Registry::from_toml_str(&text).unwrap();
            let limiter = registry.rate_limiter("shared").unwrap();
            for _ in 0..60 {
                assert!(
                    limiter
                        .reserve(&ConfigKey::Global, 1)
                        .await
                        .unwrap()
                        .allowed
                );
            }
            registry
        })
    });
    let series = [
        "bulwark_ratelimiter_lease_decisions_total{name=\"shared\"}",
        "bulwark_ratelimiter_leases_total{name=\"shared\",outcome=\"taken\"}",
        "bulwark_ratelimiter_calls_total{name=\"shared\",outcome=\"allowed\"}",
    ];
    let mut scrapes = Vec::new();
    for _ in 0..3 {
        metrics::with_local_recorder(&recorder, || registry.publish_gauges());
        let scrape = handle.render();
        scrapes.push(series.map(|s| value_in(&scrape, s)));
    }
    assert_eq!(scrapes[0], scrapes[1], "{scrapes:?}");
    assert_eq!(scrapes[1], scrapes[2], "{scrapes:?}");
    let [decisions, taken, allowed] = scrapes[2];
    assert_eq!(allowed, Some(60), "{scrapes:?}");
    assert!(taken.unwrap_or(0) >= 1, "{scrapes:?}");
    assert!(decisions.unwrap_or(0) <= 60, "{scrapes:?}");
}
