//! Hostile configuration files: every error names where and what, never a panic.

use tower_bulwark::config::Registry;

const BASE: &str = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n";

/// Promise (DESIGN.md: "Bad input gets a clear error, never a panic"; README: errors "naming the
/// instance and the field"; `ConfigError::path`: "empty for an error of the whole file").
///
/// A key written twice inside one instance, or an instance defined twice, is an error of that
/// instance, yet the error is `invalid configuration: duplicate key` with an empty path: no
/// instance, no field, no line. `from_toml_str` keeps only `toml::de::Error::message()` and
/// drops its span, which is what would name the place (toml's own `Display` does).
#[test]
fn a_duplicate_key_error_names_where_it_is() {
    let cases = [
        // The same field twice in `rate_limiters.b`.
        (
            format!("{BASE}[rate_limiters.b]\nlimit_for_period = 1\nlimit_for_period = 2\nlimit_refresh_period = \"1s\"\n"),
            "limit_for_period",
        ),
        // The same instance twice.
        (format!("{BASE}{BASE}"), "api"),
        // A value without quotes in `rate_limiters.b`.
        (
            format!("{BASE}[rate_limiters.b]\nlimit_for_period = 1\nlimit_refresh_period = 1s\n"),
            "limit_refresh_period",
        ),
    ];
    for (text, culprit) in cases {
        let err = Registry::from_toml_str(&text).expect_err(&text);
        let shown = err.to_string();
        let line = text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(culprit))
            .map(|(i, _)| format!("line {}", i + 1))
            .last()
            .unwrap();
        assert!(
            shown.contains(&line),
            "the error should name {line}, where `{culprit}` is:\n{text}\n-> {shown}"
        );
    }
}

/// Held: a hostile value in every field kind is an error at that field's path, never a panic,
/// and whole files that are hostile in shape are errors too.
#[test]
fn hostile_values_are_errors_naming_the_field_never_panics() {
    let with = |extra: &str| format!("{BASE}{extra}\n");
    let field_cases: Vec<(String, &str)> = vec![
        (with("max_wait = nan"), "rate_limiters.api.max_wait"),
        (with("max_wait = inf"), "rate_limiters.api.max_wait"),
        (with("max_wait = -0.0"), "rate_limiters.api.max_wait"),
        (
            with("max_wait = 1970-01-01T00:00:00Z"),
            "rate_limiters.api.max_wait",
        ),
        (with("max_wait = \"-1s\""), "rate_limiters.api.max_wait"),
        (with("max_wait = \"+1s\""), "rate_limiters.api.max_wait"),
        (with("max_wait = \"1_000ms\""), "rate_limiters.api.max_wait"),
        (with("max_wait = \".5.s\""), "rate_limiters.api.max_wait"),
        (
            with("max_wait = \"0.0000000001s\""),
            "rate_limiters.api.max_wait",
        ),
        (
            with("max_wait = \"99999999999999999999999999999999999999999ns\""),
            "rate_limiters.api.max_wait",
        ),
        (with("max_wait = \"213504d\""), "rate_limiters.api.max_wait"),
        (
            with("max_wait = \"1\u{3bc}s\""),
            "rate_limiters.api.max_wait",
        ),
        (
            with("max_wait = \"\u{663}s\""),
            "rate_limiters.api.max_wait",
        ),
        (with("max_wait = [\"1s\"]"), "rate_limiters.api.max_wait"),
        (with("max_wait = { s = 1 }"), "rate_limiters.api.max_wait"),
        (with("burst = 0"), "rate_limiters.api.burst"),
        (
            with("burst = 9223372036854775807"),
            "rate_limiters.api.burst",
        ),
        (
            with("burst = -9223372036854775808"),
            "rate_limiters.api.burst",
        ),
        (with("max_keys = 4294967296"), "rate_limiters.api.max_keys"),
        (with("key = \"header:x y\""), "rate_limiters.api.key"),
        (with("key = \"header:\""), "rate_limiters.api.key"),
        (with("key = \"header:x\\ny\""), "rate_limiters.api.key"),
        (with("key = \"HEADER:x\""), "rate_limiters.api.key"),
        (
            with("trusted_proxies = [\"10.0.0.0/33\"]"),
            "rate_limiters.api.trusted_proxies",
        ),
        (
            with("trusted_proxies = [\"::/129\"]"),
            "rate_limiters.api.trusted_proxies",
        ),
        (
            with("trusted_proxies = [\"not an ip\"]"),
            "rate_limiters.api.trusted_proxies",
        ),
        (
            with("trusted_proxies = [1]"),
            "rate_limiters.api.trusted_proxies",
        ),
        (
            with("trusted_proxies = \"10.0.0.0/8\""),
            "rate_limiters.api.trusted_proxies",
        ),
        (with("algorithm = \"GCRA\""), "rate_limiters.api.algorithm"),
        (with("algorithm = \"\""), "rate_limiters.api.algorithm"),
        // An enum is a string: the table form serde could read is no way to write one.
        (with("algorithm = { gcra = {} }"), "rate_limiters.api.algorithm"),
        (with("algorithm = { gcra = 1 }"), "rate_limiters.api.algorithm"),
        (
            with("key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\nforwarded_header = { forwarded = {} }"),
            "rate_limiters.api.forwarded_header",
        ),
        (with("store = \"disk\""), "rate_limiters.api.store"),
        (
            with("[rate_limiters.api.nested]\nx = 1"),
            "rate_limiters.api.nested",
        ),
        (
            "[bulkheads.p]\nmax_concurrent_calls = 2147483648\n".into(),
            "bulkheads.p.max_concurrent_calls",
        ),
        (
            "[bulkheads.p]\nmax_concurrent_calls = 1\nqueue_capacity = 0\n".into(),
            "bulkheads.p.queue_capacity",
        ),
        (
            "[bulkheads.p]\nmax_concurrent_calls = 1\nmax_wait = 3\n".into(),
            "bulkheads.p.max_wait",
        ),
        (
            "[bulkheads.p]\nmax_concurrent_calls = true\n".into(),
            "bulkheads.p.max_concurrent_calls",
        ),
        ("[bulkheads]\np = 1\n".into(), "bulkheads.p"),
        ("bulkheads = 1\n".into(), "bulkheads"),
        ("[metrics]\nx = 1\n".into(), "metrics"),
    ];
    for (text, path) in field_cases {
        let result = std::panic::catch_unwind(|| Registry::from_toml_str(&text));
        let err = result
            .unwrap_or_else(|_| panic!("panicked on:\n{text}"))
            .expect_err(&text);
        assert_eq!(err.path(), path, "{text}\n-> {err}");
        assert!(!err.message().is_empty());
        // The line and column point at the field (or the instance) at fault.
        let (line, column) = err.position().expect("an error from text has a position");
        let field = path.rsplit('.').next().unwrap();
        let shown = text.lines().nth(line - 1).unwrap_or_default();
        assert!(
            shown.contains(field) && column <= shown.chars().count(),
            "{text}\n-> {err}"
        );
    }

    // Instance names that cannot be a policy name in a header are errors of the registry.
    for name in ["", "a\\nb", "\\u00e9t\\u00e9", "x\\ty", &"n".repeat(65)] {
        let text = format!(
            "[rate_limiters.\"{name}\"]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n"
        );
        let err = std::panic::catch_unwind(|| Registry::from_toml_str(&text).map(|_| ()))
            .unwrap_or_else(|_| panic!("panicked on:\n{text}"))
            .expect_err(&text);
        assert!(err.path().starts_with("rate_limiters."), "{err}");
        assert!(err.message().contains("policy name"), "{err}");
    }

    // Garbage of every shape: an error, never a panic.
    for text in [
        "\u{0}",
        "[",
        "[[rate_limiters]]\n",
        "a = \"\\u{D800}\"",
        "\u{feff}[x]",
        "=",
        "[a.b.c.d.e.f]",
    ] {
        let result = std::panic::catch_unwind(|| Registry::from_toml_str(text));
        assert!(result.expect(text).is_err(), "{text:?}");
    }
}
