//! Circuit breakers from a TOML file (`[breakers.NAME]`): what the registry builds (a breaker
//! that opens, shared by every layer taken for its name), what is refused (every bad value,
//! naming its path), and what a reload does to them.

use http::Response;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::config::Registry;
use tower_bulwark::outbound::breaker::{BreakerOpen, BreakerState};
use tower_bulwark::BoxError;

const FILE: &str = r#"
[breakers.partner]
window_calls = 4
minimum_calls = 4
failure_rate = 0.5
slow_call_rate = 0.9
slow_call_duration = "2s"
open_for = "30s"
half_open_calls = 2

[breakers.search]
window_seconds = 10
"#;

#[tokio::test]
async fn a_configured_breaker_opens_and_every_layer_of_a_name_shares_it() {
    let registry = Registry::from_toml_str(FILE).unwrap();
    let breaker = registry.breaker("partner").unwrap();
    let down =
        || service_fn(|()| async { Ok::<_, BoxError>(Response::builder().status(503).body(())?) });
    let first = breaker.layer().layer(down());
    let second = registry.breaker("partner").unwrap().layer().layer(down());
    for _ in 0..2 {
        first.clone().oneshot(()).await.unwrap();
        second.clone().oneshot(()).await.unwrap();
    }
    assert!(matches!(breaker.state(), BreakerState::Open { .. }));
    let err = second.oneshot(()).await.unwrap_err();
    let open = err.downcast_ref::<BreakerOpen>().unwrap();
    assert_eq!(open.breaker(), "partner");
    assert!(open.retry_after() > std::time::Duration::from_secs(29));

    assert_eq!(
        registry.breaker("search").unwrap().state(),
        BreakerState::Closed
    );
    assert!(registry.breaker("nope").is_err());

    // The health report names each breaker with its state, and stays `UP`.
    let health = registry.health();
    let states: Vec<_> = (health.breakers.iter())
        .map(|b| (b.name.as_str(), b.state))
        .collect();
    assert!(matches!(
        states[..],
        [
            ("partner", BreakerState::Open { .. }),
            ("search", BreakerState::Closed)
        ]
    ));
    let json: serde_json::Value = serde_json::from_str(&health.to_json()).unwrap();
    let breakers = &json["circuitBreakers"];
    assert_eq!(breakers["partner"]["state"], "OPEN", "{json}");
    assert_eq!(breakers["partner"]["status"], "UP", "{json}");
    assert_eq!(breakers["search"]["state"], "CLOSED", "{json}");
    assert_eq!(json["status"], "UP", "{json}");
}

#[test]
fn every_bad_value_is_refused_naming_its_field() {
    let cases = [
        ("window_calls = 0", "window_calls"),
        ("window_calls = 100001", "window_calls"),
        ("window_calls = -3", "window_calls"),
        ("window_seconds = 0", "window_seconds"),
        ("window_seconds = 4294967296", "window_seconds"),
        ("window_calls = 10\nwindow_seconds = 10", "window_seconds"),
        ("minimum_calls = 0", "minimum_calls"),
        ("minimum_calls = 101", "minimum_calls"),
        ("window_calls = 10\nminimum_calls = 11", "minimum_calls"),
        ("failure_rate = nan", "failure_rate"),
        ("failure_rate = inf", "failure_rate"),
        ("failure_rate = -0.1", "failure_rate"),
        ("failure_rate = 0.0", "failure_rate"),
        ("failure_rate = 1.5", "failure_rate"),
        ("failure_rate = \"half\"", "failure_rate"),
        ("slow_call_rate = 0.0", "slow_call_rate"),
        ("slow_call_rate = 100", "slow_call_rate"),
        ("slow_call_duration = \"0s\"", "slow_call_duration"),
        ("slow_call_duration = 5", "slow_call_duration"),
        ("slow_call_duration = \"400000h\"", "slow_call_duration"),
        ("open_for = \"0ms\"", "open_for"),
        ("open_for = \"-1s\"", "open_for"),
        ("open_for = \"99999999999999999999s\"", "open_for"),
        ("half_open_calls = 0", "half_open_calls"),
        ("half_open_calls = 1.5", "half_open_calls"),
        ("limit = 3", "limit"),
    ];
    for (body, field) in cases {
        let text = format!("[breakers.partner]\n{body}\n");
        let err = Registry::from_toml_str(&text).unwrap_err();
        assert!(
            err.path().starts_with("breakers.partner") && err.to_string().contains(field),
            "{body}: {err}"
        );
    }
    let err = Registry::from_toml_str("[breakers.partner]\nfailure_rate = nan\n").unwrap_err();
    assert_eq!(err.path(), "breakers.partner.failure_rate");
    assert_eq!(
        err.message(),
        "circuit breaker: `failure_rate` must be above 0 and at most 1, got NaN"
    );
    let err = Registry::from_toml_str("[breakers]\npartner = 3\n").unwrap_err();
    assert!(err.path().starts_with("breakers"), "{err}");
    // A small count window needs no `minimum_calls`: it defaults to the window's calls.
    let registry = Registry::from_toml_str("[breakers.partner]\nwindow_calls = 5\n").unwrap();
    registry.breaker("partner").unwrap();
}

#[test]
fn a_reload_refuses_a_changed_breaker_and_keeps_an_unchanged_one() {
    let registry = Registry::from_toml_str(FILE).unwrap();
    assert!(registry.reload_toml_str(FILE).is_ok());
    let changed = FILE.replace("open_for = \"30s\"", "open_for = \"5s\"");
    let err = registry.reload_toml_str(&changed).unwrap_err();
    assert_eq!(err.path(), "breakers.partner.open_for");
    let err = registry.reload_toml_str("").unwrap_err();
    assert_eq!(err.path(), "breakers.partner");
}
