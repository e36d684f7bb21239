//! Reloading a registry from its file: changed quotas and bulkhead sizes apply in place, under
//! the layers already built; unchanged instances are not touched; anything that cannot change in
//! place, and any bad file, is refused and changes nothing.

use std::path::PathBuf;
use std::sync::LazyLock;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::config::{ConfigKey, Registry, Reloaded};
use tower_bulwark::{limiter::Decision, Limiter};

/// A registry's file: `api` at `api_limit` per `api_period`, `windows` (a fixed window) at
/// `windows_limit` an hour, the bulkhead `payment` at `payment_calls` calls; `steady` (a
/// sliding log at 5 an hour) and `inventory` (8 calls, a queue of 16) always as here.
fn registry_file(
    api_limit: u32,
    api_period: &str,
    windows_limit: u32,
    payment_calls: u32,
) -> String {
    format!(
        r#"
[rate_limiters.api]
limit_for_period = {api_limit}
limit_refresh_period = "{api_period}"
key = "global"

[rate_limiters.windows]
limit_for_period = {windows_limit}
limit_refresh_period = "1h"
algorithm = "fixed_window"
key = "global"

[rate_limiters.steady]
limit_for_period = 5
limit_refresh_period = "1h"
algorithm = "sliding_log"
key = "global"

[bulkheads.payment]
max_concurrent_calls = {payment_calls}

[bulkheads.inventory]
max_concurrent_calls = 8
queue_capacity = 16
"#
    )
}

/// The file the tests start from: `api` and `windows` at 10 an hour, `payment` at 2 calls.
static BEFORE: LazyLock<String> = LazyLock::new(|| registry_file(10, "1h", 10, 2));

/// `BEFORE` with `api` at 20 per 2 h (the same emission interval), `windows` at 20 per hour and
/// `payment` at 5 calls; `steady` and `inventory` as they were.
static AFTER: LazyLock<String> = LazyLock::new(|| registry_file(20, "2h", 20, 5));

/// A file of its own for each test, removed when dropped.
struct File(PathBuf);

impl File {
    fn new(name: &str, text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("bulwark-reload-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.0, text).unwrap();
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn decide(registry: &Registry, name: &str) -> Decision {
    registry
        .rate_limiter(name)
        .unwrap()
        .reserve_now(&ConfigKey::Global, 1)
        .expect("in memory")
        .unwrap()
}

fn admitted(registry: &Registry, name: &str, n: usize) -> usize {
    (0..n).filter(|_| decide(registry, name).allowed).count()
}

fn app(registry: &Registry) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(registry.rate_limit_layer("api").unwrap())
}

async fn call(app: &Router) -> (StatusCode, String) {
    let response = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    crate::common::status_and_policy(&response)
}

#[tokio::test]
async fn a_reload_applies_changed_quotas_in_place_and_leaves_the_rest_alone() {
    let file = File::new("applies", &BEFORE);
    let registry = Registry::from_path(&file.0).unwrap();
    // A layer built before the reload, and state in every limiter.
    let app = app(&registry);
    for _ in 0..9 {
        assert_eq!(call(&app).await.0, StatusCode::OK);
    }
    assert_eq!(admitted(&registry, "windows", 9), 9);
    assert_eq!(admitted(&registry, "steady", 3), 3);
    let steady_before = registry.rate_limiter("steady").unwrap().snapshot();

    file.write(&AFTER);
    let reloaded = registry.reload_path(&file.0).unwrap();
    let mut expected = Reloaded::default();
    expected.rate_limiters = vec!["api".to_owned(), "windows".to_owned()];
    expected.bulkheads = vec!["payment".to_owned()];
    assert_eq!(reloaded, expected);

    // The layer built before the reload decides and advertises with the new quota; 9 of 20 were
    // used, so 11 are left.
    for _ in 0..11 {
        assert_eq!(
            call(&app).await,
            (StatusCode::OK, "\"api\";q=20;w=7200".to_owned())
        );
    }
    assert_eq!(call(&app).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(admitted(&registry, "windows", 20), 11);
    // Untouched: the same counters, and the 3 it admitted still count.
    assert_eq!(
        registry.rate_limiter("steady").unwrap().snapshot(),
        steady_before
    );
    let next = decide(&registry, "steady");
    assert!(next.allowed);
    assert_eq!((next.limit, next.remaining), (5, 1));
    // Bulkheads: the changed one resized, the other as it was.
    assert_eq!(bulkhead_size(&registry, "payment"), 5);
    assert_eq!(bulkhead_size(&registry, "inventory"), 8);
    // Reloading the same file again changes nothing.
    assert_eq!(registry.reload_path(&file.0).unwrap(), Reloaded::default());
    assert!(!decide(&registry, "windows").allowed);
}

/// How many calls the bulkhead `name` of `registry` lets run at once.
fn bulkhead_size(registry: &Registry, name: &str) -> usize {
    registry
        .bulkhead(name)
        .unwrap()
        .snapshot()
        .max_allowed_concurrent_calls
}

/// Asserts that `registry` still runs `BEFORE`: every quota as it was, and the state of `api`
/// untouched: one more permit leaves `remaining`.
fn still_running_before(registry: &Registry, remaining: u64) {
    for (name, permits) in [("api", 10), ("windows", 10), ("steady", 5)] {
        assert_eq!(
            registry.rate_limiter(name).unwrap().quota().permits(),
            permits,
            "{name}"
        );
    }
    assert_eq!(bulkhead_size(registry, "payment"), 2);
    let next = decide(registry, "api");
    assert_eq!((next.limit, next.remaining), (10, remaining));
}

#[test]
fn a_bad_file_changes_nothing_and_says_where_it_is_wrong() {
    let file = File::new("bad", &BEFORE);
    let registry = Registry::from_path(&file.0).unwrap();
    assert_eq!(admitted(&registry, "api", 3), 3);

    // Not TOML: the error carries the line and column.
    file.write(&AFTER.replace("limit_for_period = 20", "limit_for_period = "));
    let err = registry.reload_path(&file.0).unwrap_err();
    assert_eq!(err.path(), "");
    assert!(err.message().contains("line 3, column"), "{err}");

    // TOML, but a value out of range.
    file.write(&AFTER.replace("max_concurrent_calls = 5", "max_concurrent_calls = 0"));
    let err = registry.reload_path(&file.0).unwrap_err();
    assert_eq!(err.path(), "bulkheads.payment.max_concurrent_calls");

    // A missing file.
    let err = registry
        .reload_path(file.0.with_extension("missing"))
        .unwrap_err();
    assert!(err.message().contains("cannot read"), "{err}");

    still_running_before(&registry, 6);
}

#[test]
fn changes_that_cannot_apply_in_place_refuse_the_whole_reload() {
    let file = File::new("refused", &BEFORE);
    let registry = Registry::from_path(&file.0).unwrap();
    assert_eq!(admitted(&registry, "api", 3), 3);
    let cases = [
        (
            AFTER.replace(
                "algorithm = \"fixed_window\"",
                "algorithm = \"sliding_counter\"",
            ),
            "rate_limiters.windows.algorithm",
        ),
        (
            AFTER.replacen("key = \"global\"", "key = \"header:x-api-key\"", 1),
            "rate_limiters.api.key",
        ),
        (
            AFTER.replace(
                "algorithm = \"sliding_log\"",
                "algorithm = \"sliding_log\"\nmax_keys = 10",
            ),
            "rate_limiters.steady.max_keys",
        ),
        (
            AFTER.replace("queue_capacity = 16", "queue_capacity = 32"),
            "bulkheads.inventory.queue_capacity",
        ),
        (
            format!(
                "{}\n[rate_limiters.new]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n",
                *AFTER
            ),
            "rate_limiters.new",
        ),
        (
            AFTER.replace(
                "[bulkheads.inventory]\nmax_concurrent_calls = 8\nqueue_capacity = 16\n",
                "",
            ),
            "bulkheads.inventory",
        ),
    ];
    for (i, (text, path)) in cases.into_iter().enumerate() {
        file.write(&text);
        let err = registry.reload_path(&file.0).unwrap_err();
        assert_eq!(err.path(), path, "{err}");
        assert!(err.message().contains("new registry"), "{err}");
        // The quota changes in the same file were not applied either.
        still_running_before(&registry, 6 - i as u64);
    }
    // The file as it was is no change at all.
    assert_eq!(
        registry.reload_toml_str(&BEFORE).unwrap(),
        Reloaded::default()
    );
}

/// A forwarded key's proxies and header are fixed, like the key: changing them is refused at
/// the field, and the running limiter keeps the proxies it trusts.
#[test]
fn a_forwarded_key_s_proxies_and_header_cannot_change_in_place() {
    let before = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1h\"\nkey = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n";
    let registry = Registry::from_toml_str(before).unwrap();
    let cases = [
        (
            before.replace("10.0.0.0/8", "0.0.0.0/0"),
            "rate_limiters.api.trusted_proxies",
            (5, 19),
        ),
        (
            format!("{before}forwarded_header = \"forwarded\"\n"),
            "rate_limiters.api.forwarded_header",
            (6, 20),
        ),
        (
            before.replace(
                "key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
                "",
            ),
            "rate_limiters.api.key",
            (1, 16),
        ),
    ];
    for (text, path, position) in cases {
        let text = text.replace("limit_for_period = 10", "limit_for_period = 20");
        let err = registry.reload_toml_str(&text).unwrap_err();
        assert_eq!(err.path(), path, "{text}\n{err}");
        assert_eq!(err.position(), Some(position), "{text}\n{err}");
        assert!(err.message().contains("new registry"), "{err}");
        assert_eq!(registry.rate_limiter("api").unwrap().quota().permits(), 10);
    }
    assert_eq!(
        registry.reload_toml_str(before).unwrap(),
        Reloaded::default()
    );
    // The default header written out is the same setting.
    let written = format!("{before}forwarded_header = \"x-forwarded-for\"\n");
    assert_eq!(
        registry.reload_toml_str(&written).unwrap(),
        Reloaded::default()
    );
}
