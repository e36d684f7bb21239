//! The configuration module attacked from outside, through its documented promises only: no
//! panic on any input, every error located (a path with its line and column, or a TOML syntax
//! error with its position), boundary values accepted or refused at their field, a default
//! written out is no change, a reload applies quotas and bulkhead sizes in place keeping every
//! key's state, and a refused reload changes nothing that any later decision could see.

#[path = "attack_reload.rs"]
mod attack_reload;
mod hostile;
mod load;
mod reload;
mod values;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use proptest::prelude::*;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::config::{ConfigError, ConfigKey, Registry, Reloaded};
use tower_bulwark::{BoxError, Limiter};

/// One instance of every kind, with state-bearing limiters of two algorithms.
const BASE: &str = r#"
[rate_limiters.api]
limit_for_period = 10
limit_refresh_period = "1h"
key = "header:x-k"

[rate_limiters.window]
limit_for_period = 100
limit_refresh_period = "1h"
algorithm = "fixed_window"
key = "global"

[bulkheads.b]
max_concurrent_calls = 2

[bulkheads.q]
max_concurrent_calls = 3
queue_capacity = 4

[pushbacks.p]
max_wait = "1s"

[client_quotas.c]
limiter = "window"
cost = 2

[adaptive_bulkheads.a]
min_limit = 2
max_limit = 16

[routes.r]
policies = ["api", { limiter = "window", cost = 1 }]
exempt_networks = ["10.0.0.0/8"]
"#;

/// Asserts that `err`, from `text`, is located: a path whose position is a real place in the
/// text, or (empty path) a TOML syntax error that still has a position.
fn assert_located(text: &str, err: &ConfigError) {
    assert!(!err.message().is_empty(), "{text:?}\n-> {err}");
    let Some((line, column)) = err.position() else {
        // Only what the text does not hold (an instance a reload would remove) has no place.
        let instance = err.path().split('.').count() == 2;
        assert!(
            instance && !text.contains(&format!("[{}]", err.path())),
            "no position for an error from text: {text:?}\n-> {err}"
        );
        return;
    };
    let lines: Vec<&str> = text.split('\n').collect();
    assert!(
        line >= 1 && line <= lines.len(),
        "line {line}: {text:?}\n-> {err}"
    );
    // A lone carriage return is an error placed just after it, so it counts as a character.
    let shown = lines[line - 1];
    assert!(
        column >= 1 && column <= shown.chars().count() + 1,
        "column {column} of {shown:?}\n-> {err}"
    );
}

/// Asserts that `text` is refused at `path`, on the line that names the path's last segment (or
/// its instance, for a field that is missing).
fn assert_refused_at(text: &str, path: &str) {
    let result = std::panic::catch_unwind(|| Registry::from_toml_str(text).map(|_| ()));
    let err = result
        .unwrap_or_else(|_| panic!("panicked on {text:?}"))
        .expect_err(text);
    assert_eq!(err.path(), path, "{text}\n-> {err}");
    assert_located(text, &err);
    let (line, _) = err.position().unwrap();
    let field = path.rsplit('.').next().unwrap();
    let field = field.split('[').next().unwrap();
    let instance = path.split('.').nth(1).unwrap_or(field);
    let shown = text.lines().nth(line - 1).unwrap();
    assert!(
        shown.contains(field) || shown.starts_with('[') && shown.contains(instance),
        "line {line} does not name `{field}`: {text}\n-> {err}"
    );
}

fn limiter(fields: &str) -> String {
    format!("[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n{fields}\n")
}

fn key(name: &'static str) -> ConfigKey {
    ConfigKey::Header(HeaderValue::from_static(name))
}

/// The next decision of rate limiter `name` for `key`, as a client sees it.
fn next(registry: &Registry, name: &str, key: &ConfigKey) -> (bool, u64, u64) {
    let decision = registry
        .rate_limiter(name)
        .unwrap()
        .reserve_now(key, 1)
        .expect("in memory")
        .unwrap();
    (decision.allowed, decision.limit, decision.remaining)
}

/// What a later call could see of a registry built from `BASE`, without deciding anything.
fn observed(registry: &Registry) -> String {
    let quotas = ["api", "window"].map(|name| registry.rate_limiter(name).unwrap().quota());
    let adaptive = registry.adaptive_bulkhead("a").unwrap().limits();
    format!("{quotas:?} {adaptive:?} {}", registry.health().to_json())
}

/// `BASE` with both quotas doubled and bulkhead `b` at 5 calls: what a refused reload must not
/// apply.
fn with_quota_changes(text: &str) -> String {
    text.replace("limit_for_period = 10", "limit_for_period = 20")
        .replace("max_concurrent_calls = 2\n", "max_concurrent_calls = 5\n")
}

/// Yields until `until` holds, for calls spawned on the runtime to get where they are going.
async fn settle(until: impl Fn() -> bool) {
    for _ in 0..1_000 {
        if until() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the calls never got in");
}
