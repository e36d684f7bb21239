//! Configuration files: what they mean, and the error each bad one produces.

use std::time::Duration;

use tower_bulwark::config::Registry;
use tower_bulwark::Limiter;

const GOOD: &str = r#"
[rate_limiters.api]
limit_for_period = 10
limit_refresh_period = "1s"
max_wait = "0s"
algorithm = "gcra"
key = "peer_ip"

[rate_limiters.partners]
limit_for_period = 1000
limit_refresh_period = "1h"
burst = 50
max_wait = "250ms"
algorithm = "sliding_log"
key = "header:x-api-key"
max_keys = 5000
hide_keys = true

[bulkheads.payment]
max_concurrent_calls = 2
max_wait = "0s"

[bulkheads.inventory]
max_concurrent_calls = 8
queue_capacity = 16
"#;

/// The quotas and sizes the registry's instances run with; the algorithm, key and the rest are
/// checked where they are parsed (`config::tests` in the library).
#[test]
fn a_good_file_means_what_it_says() {
    let registry = Registry::from_toml_str(GOOD).unwrap();
    let api = registry.rate_limiter("api").unwrap().quota();
    assert_eq!(api.permits(), 10);
    assert_eq!(api.period(), Duration::from_secs(1));
    assert_eq!(api.max_wait(), Duration::ZERO);
    let partners = registry.rate_limiter("partners").unwrap().quota();
    assert_eq!(partners.burst(), 50);
    assert_eq!(partners.period(), Duration::from_secs(3600));
    assert_eq!(partners.max_wait(), Duration::from_millis(250));
    let size = |name| {
        let snapshot = registry.bulkhead(name).unwrap().snapshot();
        snapshot.max_allowed_concurrent_calls
    };
    assert_eq!((size("payment"), size("inventory")), (2, 8));
}

#[test]
fn every_bad_file_gets_an_error_naming_where_and_what() {
    let base = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n";
    let with = |extra: &str| format!("{base}{extra}\n");
    let cases: Vec<(String, &str, &str)> =
        vec![
        (
            "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = 500\n".into(),
            "rate_limiters.api.limit_refresh_period",
            "no unit; write it with one, such as \"500ms\"",
        ),
        (
            with("max_wait = 5"),
            "rate_limiters.api.max_wait",
            "no unit",
        ),
        (
            with("max_wait = \"5 parsecs\""),
            "rate_limiters.api.max_wait",
            "unknown unit `parsecs`",
        ),
        (
            "[rate_limiters.api]\nlimit_for_period = 0\nlimit_refresh_period = \"1s\"\n".into(),
            "rate_limiters.api.limit_for_period",
            "at least 1, not 0",
        ),
        (
            "[rate_limiters.api]\nlimit_for_period = -3\nlimit_refresh_period = \"1s\"\n".into(),
            "rate_limiters.api.limit_for_period",
            "at least 1, not -3",
        ),
        (
            "[rate_limiters.api]\nlimit_for_period = 99999999999\nlimit_refresh_period = \"1s\"\n"
                .into(),
            "rate_limiters.api.limit_for_period",
            "at most 4294967295",
        ),
        (
            "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"0s\"\n".into(),
            "rate_limiters.api.limit_refresh_period",
            "longer than zero",
        ),
        (
            "[rate_limiters.api]\nlimit_refresh_period = \"1s\"\n".into(),
            "rate_limiters.api.limit_for_period",
            "is required",
        ),
        (
            "[rate_limiters.api]\nlimit_for_period = \"ten\"\nlimit_refresh_period = \"1s\"\n"
                .into(),
            "rate_limiters.api.limit_for_period",
            "string \"ten\", expected an integer",
        ),
        (
            with("limit_for_periods = 3"),
            "rate_limiters.api.limit_for_periods",
            "unknown field",
        ),
        (with("burst = 0"), "rate_limiters.api.burst", "at least 1"),
        (
            with("algorithm = \"token_bucket\""),
            "rate_limiters.api.algorithm",
            "unknown variant `token_bucket`",
        ),
        (
            with("key = \"cookie\""),
            "rate_limiters.api.key",
            "unknown key `cookie`",
        ),
        (
            with("key = \"header:bad header\""),
            "rate_limiters.api.key",
            "not a valid header name",
        ),
        (
            with("trusted_proxies = [\"10.0.0.0/33\"]"),
            "rate_limiters.api.trusted_proxies",
            "prefix is longer than the address",
        ),
        (
            with("trusted_proxies = [\"proxy.internal\"]"),
            "rate_limiters.api.trusted_proxies",
            "not an IP address",
        ),
        (
            with("key = \"global\"\ntrusted_proxies = [\"10.0.0.0/8\"]"),
            "rate_limiters.api.trusted_proxies",
            "only to key = \"forwarded_ip\"",
        ),
        (
            with("key = \"peer_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]"),
            "rate_limiters.api.trusted_proxies",
            "only to key = \"forwarded_ip\"",
        ),
        (
            with("key = \"forwarded_ip\""),
            "rate_limiters.api.trusted_proxies",
            "is required",
        ),
        (
            with("key = \"forwarded_ip\"\ntrusted_proxies = []"),
            "rate_limiters.api.trusted_proxies",
            "at least one proxy",
        ),
        (
            with("forwarded_header = \"forwarded\""),
            "rate_limiters.api.forwarded_header",
            "only to key = \"forwarded_ip\"",
        ),
        (
            with("key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\nforwarded_header = \"x-real-ip\""),
            "rate_limiters.api.forwarded_header",
            "unknown variant `x-real-ip`",
        ),
        (with("max_keys = 0"), "rate_limiters.api.max_keys", "at least 1"),
        (
            with("hide_keys = \"yes\""),
            "rate_limiters.api.hide_keys",
            "expected a boolean",
        ),
        (
            "[bulkheads.payment]\nmax_concurrent_calls = 0\n".into(),
            "bulkheads.payment.max_concurrent_calls",
            "at least 1",
        ),
        (
            "[bulkheads.payment]\nmax_wait = \"1s\"\n".into(),
            "bulkheads.payment.max_concurrent_calls",
            "is required",
        ),
        (
            "[bulkheads.payment]\nmax_concurrent_calls = 2\nmax_wait = 100\n".into(),
            "bulkheads.payment.max_wait",
            "no unit",
        ),
        (
            "[bulkheads.payment]\nmax_concurrent_calls = 2\nqueue_capacity = 0\n".into(),
            "bulkheads.payment.queue_capacity",
            "at least 1",
        ),
        (
            "[bulkheads.payment]\nmax_concurrent_calls = 2\ntimeout = \"1s\"\n".into(),
            "bulkheads.payment.timeout",
            "unknown field",
        ),
        (
            "[circuit_breakers.db]\nfailure_rate = 50\n".into(),
            "circuit_breakers",
            "unknown field `circuit_breakers`",
        ),
        (
            "rate_limiters = 3\n".into(),
            "rate_limiters",
            "table of named instances",
        ),
        (
            "[rate_limiters]\napi = 3\n".into(),
            "rate_limiters.api",
            "table of settings",
        ),
        (
            with("store = \"disk\""),
            "rate_limiters.api.store",
            "unknown variant `disk`",
        ),
        (
            with("redis_url = \"redis://127.0.0.1/\""),
            "rate_limiters.api.redis_url",
            "only to store = \"redis\"",
        ),
        ("[rate_limiters.api\n".into(), "", ""),
    ];
    for (text, path, message) in cases {
        let err = Registry::from_toml_str(&text).expect_err(&text);
        assert_eq!(err.path(), path, "{text}\n-> {err}");
        assert!(err.message().contains(message), "{text}\n-> {err}");
        assert!(err.to_string().contains(path), "{err}");
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_settings_are_checked() {
    let base = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\nstore = \"redis\"\n";
    let cases = [
        ("", "rate_limiters.api.redis_url", "is required"),
        (
            "redis_url = \"redis://127.0.0.1/\"\nredis_fail_mode = \"fallback\"",
            "rate_limiters.api.fallback_limit_for_period",
            "is required",
        ),
        (
            "redis_url = \"redis://127.0.0.1/\"\nredis_fail_mode = \"retry\"",
            "rate_limiters.api.redis_fail_mode",
            "unknown variant `retry`",
        ),
        (
            "redis_url = \"redis://127.0.0.1/\"\nfallback_limit_for_period = 3",
            "rate_limiters.api.fallback_limit_for_period",
            "only to redis_fail_mode = \"fallback\"",
        ),
        (
            "redis_url = \"redis://127.0.0.1/\"\non_redis_failure = \"fail_open\"",
            "rate_limiters.api.on_redis_failure",
            "unknown field `on_redis_failure`",
        ),
        (
            "redis_url = \"redis://127.0.0.1/\"\nlocal_limit_for_period = 3",
            "rate_limiters.api.local_limit_for_period",
            "unknown field `local_limit_for_period`",
        ),
        (
            "redis_url = \"redis://127.0.0.1/\"\nredis_timeout = 50",
            "rate_limiters.api.redis_timeout",
            "no unit",
        ),
    ];
    for (extra, path, message) in cases {
        let text = format!("{base}{extra}\n");
        let err = Registry::from_toml_str(&text).expect_err(&text);
        assert_eq!(err.path(), path, "{text}\n-> {err}");
        assert!(err.message().contains(message), "{text}\n-> {err}");
    }
    let ok = Registry::from_toml_str(&format!(
        "{base}redis_url = \"redis://127.0.0.1/\"\nredis_fail_mode = \"fallback\"\nfallback_limit_for_period = 3\nredis_timeout = \"50ms\"\n"
    ))
    .unwrap();
    // A limiter in Redis counts the decisions Redis did not give; one in memory has none.
    assert_eq!(ok.health().rate_limiters[0].store_failures, Some(0));
}

/// Every error found in TOML text carries the line and column of the value at fault (of the
/// instance, for a field that is missing), whether toml, the validation or the registry found
/// it.
#[test]
fn errors_from_text_name_the_line_and_column() {
    let limiter = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n";
    let cases = [
        // Found by the validation: a value out of range.
        (
            format!("{limiter}burst = 0\n"),
            "rate_limiters.api.burst",
            (4, 9),
        ),
        // Found by toml: a value of the wrong type, and an unknown field.
        (
            format!("{limiter}burst = \"5\"\n"),
            "rate_limiters.api.burst",
            (4, 9),
        ),
        (
            format!("{limiter}bust = 5\n"),
            "rate_limiters.api.bust",
            (4, 1),
        ),
        // A duration without a unit.
        (
            format!("{limiter}max_wait = 250\n"),
            "rate_limiters.api.max_wait",
            (4, 12),
        ),
        // A missing field: where its instance is.
        (
            "\n[bulkheads.payment]\nmax_wait = \"1s\"\n".to_owned(),
            "bulkheads.payment.max_concurrent_calls",
            (2, 12),
        ),
        // A name that points nowhere, in a list.
        (
            format!("{limiter}[routes.r]\npolicies = [\"api\", \"nope\"]\n"),
            "routes.r.policies[1]",
            (5, 20),
        ),
        // An unknown section.
        (
            "[circuit_breakers.db]\nx = 1\n".to_owned(),
            "circuit_breakers",
            (1, 2),
        ),
    ];
    for (text, path, (line, column)) in cases {
        let err = Registry::from_toml_str(&text).expect_err(&text);
        assert_eq!(err.path(), path, "{text}\n-> {err}");
        assert_eq!(err.position(), Some((line, column)), "{text}\n-> {err}");
        let shown = err.to_string();
        assert!(
            shown.contains(&format!("`{path}` (line {line}, column {column})")),
            "{shown}"
        );
    }
    // An error of building an instance (a name no header can carry) has its position too.
    let text = "\n[rate_limiters.\"a\\tb\"]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n";
    let err = Registry::from_toml_str(text).unwrap_err();
    assert_eq!(err.path(), "rate_limiters.a\tb", "{err}");
    assert_eq!(err.position(), Some((2, 16)), "{err}");
}

/// A required field left out is the field's error, placed where its instance is written,
/// however the instance is written: a `[table]`, a dotted key, an inline table, an item of a
/// list.
#[test]
fn a_missing_field_is_the_field_s_error_wherever_its_instance_is_written() {
    let limiter = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n";
    let cases = [
        (
            "\n\n[bulkheads.payment]\nmax_wait = \"1s\"\n".to_owned(),
            "bulkheads.payment.max_concurrent_calls",
            (3, 12),
        ),
        (
            "bulkheads.payment.max_wait = \"1s\"\n".to_owned(),
            "bulkheads.payment.max_concurrent_calls",
            (1, 11),
        ),
        (
            "[bulkheads]\npayment = { max_wait = \"1s\" }\n".to_owned(),
            "bulkheads.payment.max_concurrent_calls",
            (2, 1),
        ),
        (
            "[rate_limiters]\napi = {}\n".to_owned(),
            "rate_limiters.api.limit_for_period",
            (2, 1),
        ),
        (
            format!("{limiter}[routes.r]\npolicies = [\"api\", {{ cost = 2 }}]\n"),
            "routes.r.policies[1].limiter",
            (5, 20),
        ),
        (
            "[routes.r]\nexempt_networks = []\n".to_owned(),
            "routes.r.policies",
            (1, 9),
        ),
        (
            "[client_quotas.q]\ncost = 1\n[client_quotas.r]\n".to_owned(),
            "client_quotas.q.limiter",
            (1, 16),
        ),
    ];
    for (text, path, position) in cases {
        let err = Registry::from_toml_str(&text).expect_err(&text);
        assert_eq!(err.path(), path, "{text}\n-> {err}");
        assert_eq!(err.message(), "is required", "{text}\n-> {err}");
        assert_eq!(err.position(), Some(position), "{text}\n-> {err}");
    }
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let err = Registry::from_path("/nonexistent/bulwark.toml").unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/bulwark.toml"),
        "{err}"
    );
}
