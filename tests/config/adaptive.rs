//! Adaptive bulkheads from a TOML file: what parses (with its defaults), what is refused (always
//! naming the path of the bad value), what the registry builds (a limit that really moves, shared
//! by every layer taken for a name, in the health report), and what a reload does to them.

use std::time::Duration;

use http::Response;
use proptest::prelude::*;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::BulkheadFull;
use tower_bulwark::config::Registry;
use tower_bulwark::BoxError;

const FILE: &str = r#"
[adaptive_bulkheads.payment]
min_limit = 2
initial_limit = 4
max_limit = 32
algorithm = "gradient"
ignore_cancelled_calls = true

[adaptive_bulkheads.search]

[bulkheads.inventory]
max_concurrent_calls = 8
"#;

/// The limits each bulkhead runs with; its algorithm and `ignore_cancelled_calls` are checked
/// where they are parsed (`config::tests` in the library).
#[test]
fn sections_parse_with_their_defaults() {
    let limits = |text: &str, name: &str| {
        let registry = Registry::from_toml_str(text).unwrap();
        let limits = registry.adaptive_bulkhead(name).unwrap().limits();
        (limits.min(), limits.initial(), limits.max())
    };
    assert_eq!(limits(FILE, "payment"), (2, 4, 32));
    assert_eq!(limits(FILE, "search"), (1, 8, 256));
    // A default initial limit stays within bounds the file narrowed.
    assert_eq!(limits("[adaptive_bulkheads.a]\nmax_limit = 3\n", "a").1, 3);
    let high = limits("[adaptive_bulkheads.a]\nmin_limit = 300\n", "a");
    assert_eq!(high, (300, 300, 300));
}

#[test]
fn every_bad_value_names_its_path() {
    let cases: &[(&str, &str)] = &[
        ("min_limit = 0", "adaptive_bulkheads.p.min_limit"),
        ("min_limit = -3", "adaptive_bulkheads.p.min_limit"),
        ("min_limit = 1.5", "adaptive_bulkheads.p.min_limit"),
        ("max_limit = 4294967295", "adaptive_bulkheads.p.max_limit"),
        (
            "min_limit = 10\nmax_limit = 5",
            "adaptive_bulkheads.p.min_limit",
        ),
        (
            "initial_limit = 50\nmax_limit = 5",
            "adaptive_bulkheads.p.initial_limit",
        ),
        (
            "initial_limit = 1\nmin_limit = 5",
            "adaptive_bulkheads.p.initial_limit",
        ),
        ("algorithm = \"vegas\"", "adaptive_bulkheads.p.algorithm"),
        ("algorithm = 1", "adaptive_bulkheads.p.algorithm"),
        ("probe_every = 0", "adaptive_bulkheads.p.probe_every"),
        ("probe_every = 2.5", "adaptive_bulkheads.p.probe_every"),
        (
            "ignore_cancelled_calls = \"yes\"",
            "adaptive_bulkheads.p.ignore_cancelled_calls",
        ),
        (
            "max_concurrent_calls = 4",
            "adaptive_bulkheads.p.max_concurrent_calls",
        ),
    ];
    for (body, path) in cases {
        let text = format!("[adaptive_bulkheads.p]\n{body}\n");
        let err = Registry::from_toml_str(&text).unwrap_err();
        assert_eq!(err.path(), *path, "{body}: {err}");
    }
    // One namespace for both kinds of bulkhead: their metrics and health are keyed by name.
    let err = Registry::from_toml_str(
        "[bulkheads.p]\nmax_concurrent_calls = 2\n[adaptive_bulkheads.p]\n",
    )
    .unwrap_err();
    assert_eq!(err.path(), "adaptive_bulkheads.p");
    assert!(err.message().contains("bulkheads.p"), "{err}");
    // Not a table of instances.
    let err = Registry::from_toml_str("adaptive_bulkheads = 3\n").unwrap_err();
    assert_eq!(err.path(), "adaptive_bulkheads");
}

proptest! {
    /// Whatever the three bounds, the file is either built with them exactly or refused at the
    /// path of a bound; never a panic.
    #[test]
    fn any_bounds_are_built_exactly_or_refused_at_a_bound(
        min in -2i64..40, initial in -2i64..40, max in -2i64..40,
    ) {
        let text = format!(
            "[adaptive_bulkheads.p]\nmin_limit = {min}\ninitial_limit = {initial}\nmax_limit = {max}\n"
        );
        match Registry::from_toml_str(&text) {
            Ok(registry) => {
                prop_assert!(1 <= min && min <= initial && initial <= max);
                let bulkhead = registry.adaptive_bulkhead("p").unwrap();
                let limits = bulkhead.limits();
                prop_assert_eq!(
                    (limits.min() as i64, limits.initial() as i64, limits.max() as i64),
                    (min, initial, max)
                );
                prop_assert_eq!(bulkhead.limit() as i64, initial);
            }
            Err(err) => {
                prop_assert!(!(1 <= min && min <= initial && initial <= max), "{}", err);
                prop_assert!(err.path().starts_with("adaptive_bulkheads.p."), "{}", err);
            }
        }
    }
}

#[tokio::test]
async fn layers_of_one_name_share_one_limit_and_refuse_with_bulkhead_full() {
    let registry = Registry::from_toml_str(FILE).unwrap();
    let never = || service_fn(|_: ()| std::future::pending::<Result<Response<()>, BoxError>>());
    let mut first = ServiceBuilder::new()
        .layer(registry.adaptive_bulkhead("payment").unwrap().layer())
        .service(never());
    let mut second = ServiceBuilder::new()
        .layer(registry.adaptive_bulkhead("payment").unwrap().layer())
        .service(never());
    // Four in flight through two layers use up the one limit of four.
    let mut held = Vec::new();
    for i in 0..4 {
        let client = if i % 2 == 0 { &mut first } else { &mut second };
        held.push(client.ready().await.unwrap().call(()));
    }
    let err = second.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(err.is::<BulkheadFull>(), "{err}");
    let health = registry.health();
    let entry = health
        .bulkheads
        .iter()
        .find(|b| b.name == "payment")
        .expect("the adaptive bulkhead is in the health report");
    assert_eq!(entry.snapshot.max_allowed_concurrent_calls, 4);
    assert_eq!(entry.snapshot.available_concurrent_calls, 0);
    assert!(entry.saturated);
    assert!(health.to_json().contains("\"payment\""));
    drop(held);
    assert_eq!(
        registry
            .adaptive_bulkhead("payment")
            .unwrap()
            .snapshot()
            .available_concurrent_calls,
        4,
        "dropped calls gave their permits back"
    );
    assert_eq!(
        registry.adaptive_bulkhead("nope").unwrap_err().to_string(),
        "no adaptive bulkhead named `nope` is configured"
    );
}

/// A configured adaptive bulkhead adapts: a dependency that answers every call with 503 brings
/// its limit down from where it started (AIMD multiplies it by 0.8 once per round trip).
#[tokio::test]
async fn a_configured_limit_falls_when_the_dependency_is_overloaded() {
    let registry = Registry::from_toml_str(
        "[adaptive_bulkheads.gateway]\nmin_limit = 1\ninitial_limit = 20\nmax_limit = 20\n",
    )
    .unwrap();
    let mut client = ServiceBuilder::new()
        .layer(registry.adaptive_bulkhead("gateway").unwrap().layer())
        .service(service_fn(|_: ()| async {
            // A slow, overloaded dependency: every round trip takes a little time.
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, BoxError>(Response::builder().status(503).body(()).unwrap())
        }));
    for _ in 0..30 {
        let response = client.ready().await.unwrap().call(()).await.unwrap();
        assert_eq!(response.status(), 503);
    }
    let bulkhead = registry.adaptive_bulkhead("gateway").unwrap();
    assert!(
        bulkhead.limit() < 20,
        "30 overloaded calls left the limit at {}",
        bulkhead.limit()
    );
    assert!(bulkhead.limit() >= 1);
}

#[test]
fn a_reload_keeps_adaptive_bulkheads_and_refuses_to_change_them() {
    let registry = Registry::from_toml_str(FILE).unwrap();
    // The same file: nothing changes.
    let reloaded = registry.reload_toml_str(FILE).unwrap();
    assert!(reloaded.bulkheads.is_empty());
    // The defaults written out are the same settings.
    let written = FILE.replace(
        "[adaptive_bulkheads.search]\n",
        "[adaptive_bulkheads.search]\nmin_limit = 1\ninitial_limit = 8\nmax_limit = 256\n",
    );
    assert_eq!(
        registry.reload_toml_str(&written).unwrap(),
        Default::default()
    );
    for (from, to, path) in [
        (
            "max_limit = 32",
            "max_limit = 64",
            "adaptive_bulkheads.payment.max_limit",
        ),
        (
            "algorithm = \"gradient\"",
            "algorithm = \"aimd\"",
            "adaptive_bulkheads.payment.algorithm",
        ),
        (
            "ignore_cancelled_calls = true",
            "ignore_cancelled_calls = false",
            "adaptive_bulkheads.payment.ignore_cancelled_calls",
        ),
        (
            "[adaptive_bulkheads.search]",
            "",
            "adaptive_bulkheads.search",
        ),
    ] {
        let changed = FILE.replacen(from, to, 1);
        let err = registry.reload_toml_str(&changed).unwrap_err();
        assert_eq!(err.path(), path, "{err}");
    }
    let added = format!("{FILE}\n[adaptive_bulkheads.new]\n");
    let err = registry.reload_toml_str(&added).unwrap_err();
    assert_eq!(err.path(), "adaptive_bulkheads.new");
    // Nothing changed.
    let payment = registry.adaptive_bulkhead("payment").unwrap();
    assert_eq!(payment.limits().max(), 32);
    assert_eq!(payment.limit(), 4);
}
