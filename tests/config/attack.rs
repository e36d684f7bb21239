//! The configuration module attacked from outside, through its documented promises only: no
//! panic on any input, every error located (a path with its line and column, or a TOML syntax
//! error with its position), boundary values accepted or refused at their field, a default
//! written out is no change, a reload applies quotas and bulkhead sizes in place keeping every
//! key's state, and a refused reload changes nothing that any later decision could see.

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
    let (line, column) = err
        .position()
        .unwrap_or_else(|| panic!("no position for an error from text: {text:?}\n-> {err}"));
    let lines: Vec<&str> = text.split('\n').collect();
    assert!(line >= 1 && line <= lines.len(), "line {line}: {text:?}\n-> {err}");
    let shown = lines[line - 1].trim_end_matches('\r');
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

#[test]
fn boundary_values_are_accepted_or_refused_at_their_field() {
    let u32_max = u32::MAX;
    let two_53 = 1u64 << 53;
    let two_60 = 1u64 << 60;
    let integers = ["burst", "max_keys"];
    for field in integers {
        let path = format!("rate_limiters.api.{field}");
        for bad in [
            "0".to_owned(),
            "-1".to_owned(),
            format!("{}", u64::from(u32_max) + 1),
            format!("{two_53}"),
            "-9223372036854775808".to_owned(),
            "1.0".to_owned(),
            "1e3".to_owned(),
            "\"10\"".to_owned(),
            "[10]".to_owned(),
            "{ n = 10 }".to_owned(),
            "true".to_owned(),
            "1970-01-01".to_owned(),
        ] {
            assert_refused_at(&limiter(&format!("{field} = {bad}")), &path);
        }
        for good in ["1", "0x10", "1_000", &u32_max.to_string()] {
            Registry::from_toml_str(&limiter(&format!("{field} = {good}")))
                .unwrap_or_else(|e| panic!("{field} = {good}: {e}"));
        }
    }
    let durations = [
        ("limit_refresh_period", "0s"),
        ("limit_refresh_period", "0"),
        ("limit_refresh_period", "500"),
        ("limit_refresh_period", "1.5ns"),
        ("limit_refresh_period", "0.1ns"),
        ("limit_refresh_period", "1.0000000001s"),
        ("max_wait", "1152921504606846977ns"),
        ("max_wait", "18446744073709551616ns"),
        ("max_wait", "-1ns"),
    ];
    for (field, bad) in durations {
        let text = limiter(&format!("{field} = \"{bad}\"")).replacen(
            "limit_refresh_period = \"1s\"\nlimit_refresh_period",
            "limit_refresh_period",
            1,
        );
        assert_refused_at(&text, &format!("rate_limiters.api.{field}"));
    }
    // A bare number (an integer or a float) where a duration goes is refused, never read in
    // some unit.
    for bare in ["500", "0", "1.5", "-1", &two_60.to_string()] {
        assert_refused_at(&limiter(&format!("max_wait = {bare}")), "rate_limiters.api.max_wait");
    }
    Registry::from_toml_str(&limiter(&format!("max_wait = \"{two_60}ns\""))).unwrap();
    Registry::from_toml_str(&limiter("max_wait = \"1.000000001s\"")).unwrap();
    // `limit_for_period` itself, at both ends.
    let lfp = |v: &str| format!("[rate_limiters.api]\nlimit_for_period = {v}\nlimit_refresh_period = \"1s\"\n");
    for bad in ["0", "-1", "4294967296", "9007199254740992", "10.0", "\"10\"", "[]"] {
        assert_refused_at(&lfp(bad), "rate_limiters.api.limit_for_period");
    }
    Registry::from_toml_str(&lfp(&u32_max.to_string())).unwrap();
    // Bulkheads, pushbacks and adaptive bulkheads at their bounds.
    let cases = [
        ("[bulkheads.b]\nmax_concurrent_calls = 0\n", "bulkheads.b.max_concurrent_calls"),
        ("[bulkheads.b]\nmax_concurrent_calls = -5\n", "bulkheads.b.max_concurrent_calls"),
        ("[bulkheads.b]\nmax_concurrent_calls = 4294967295\n", "bulkheads.b.max_concurrent_calls"),
        ("[bulkheads.b]\nmax_concurrent_calls = 1\nqueue_capacity = 9007199254740992\n", "bulkheads.b.queue_capacity"),
        ("[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = 1\n", "bulkheads.b.max_wait"),
        ("[pushbacks.p]\nmax_hold = \"0s\"\n", "pushbacks.p.max_hold"),
        ("[pushbacks.p]\nmax_hold = \"1152921504606846977ns\"\n", "pushbacks.p.max_hold"),
        ("[pushbacks.p]\nmax_wait = \"1152921504606846977ns\"\n", "pushbacks.p.max_wait"),
        ("[pushbacks.p]\npacing = 1\n", "pushbacks.p.pacing"),
        ("[adaptive_bulkheads.a]\nmax_limit = 2147483648\n", "adaptive_bulkheads.a.max_limit"),
        ("[adaptive_bulkheads.a]\nmin_limit = 0\n", "adaptive_bulkheads.a.min_limit"),
        ("[adaptive_bulkheads.a]\ninitial_limit = 257\n", "adaptive_bulkheads.a.initial_limit"),
    ];
    for (text, path) in cases {
        assert_refused_at(text, path);
    }
    for text in [
        "[pushbacks.p]\nmax_hold = \"1152921504606846976ns\"\nmax_wait = \"1152921504606846976ns\"\n",
        "[adaptive_bulkheads.a]\nmin_limit = 2147483647\nmax_limit = 2147483647\n",
        "[bulkheads.b]\nmax_concurrent_calls = 1\n",
    ] {
        Registry::from_toml_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
}

#[test]
fn cross_field_rules_hold_at_their_boundary() {
    // `forwarded_ip` needs proxies; proxies need `forwarded_ip`.
    assert_refused_at(&limiter("key = \"forwarded_ip\""), "rate_limiters.api.trusted_proxies");
    assert_refused_at(
        &limiter("key = \"forwarded_ip\"\ntrusted_proxies = []"),
        "rate_limiters.api.trusted_proxies",
    );
    assert_refused_at(
        &limiter("trusted_proxies = [\"10.0.0.0/8\"]"),
        "rate_limiters.api.trusted_proxies",
    );
    Registry::from_toml_str(&limiter("key = \"forwarded_ip\"\ntrusted_proxies = [\"::/0\"]")).unwrap();
    // A client quota's cost is at most the burst: the burst written, or the default
    // (`limit_for_period`); its limiter must be keyed `global`.
    let quota = |burst: &str, cost: u32| {
        limiter(&format!("key = \"global\"\n{burst}\n[client_quotas.c]\nlimiter = \"api\"\ncost = {cost}"))
    };
    Registry::from_toml_str(&quota("", 10)).unwrap();
    assert_refused_at(&quota("", 11), "client_quotas.c.cost");
    Registry::from_toml_str(&quota("burst = 3", 3)).unwrap();
    assert_refused_at(&quota("burst = 3", 4), "client_quotas.c.cost");
    assert_refused_at(&quota("burst = 3", u32::MAX), "client_quotas.c.cost");
    let keyed = limiter("[client_quotas.c]\nlimiter = \"api\"");
    assert_refused_at(&keyed, "client_quotas.c.limiter");
    // A reload that lowers the burst under a client quota's cost is refused there.
    let registry = Registry::from_toml_str(&quota("burst = 3", 3)).unwrap();
    let err = registry.reload_toml_str(&quota("burst = 2", 3)).unwrap_err();
    assert_eq!(err.path(), "client_quotas.c.cost", "{err}");
    assert_eq!(registry.rate_limiter("api").unwrap().quota().burst(), 3);
}

/// A position counts characters, on the line of the value, whatever the layout.
#[test]
fn positions_point_at_the_value_in_any_layout() {
    let cases = [
        // Dotted keys at the top level.
        "rate_limiters.api.limit_for_period = 1\nrate_limiters.api.limit_refresh_period = \"1s\"\nrate_limiters.api.burst = 0\n",
        // An inline table.
        "[rate_limiters]\napi = { limit_for_period = 1, limit_refresh_period = \"1s\", burst = 0 }\n",
        // Multi-byte characters before the value, on its line and above it.
        "[rate_limiters.api] # ééé\nlimit_for_period = 1 # 支払い\nlimit_refresh_period = \"1s\"\n\"burst\" = 0 # é\n",
        // CRLF line ends.
        "[rate_limiters.api]\r\nlimit_for_period = 1\r\nlimit_refresh_period = \"1s\"\r\nburst = 0\r\n",
        // A multi-line string before it.
        "[rate_limiters.api]\nkey = \"\"\"header:x\"\"\"\n'limit_for_period' = 1\nlimit_refresh_period = '''1s'''\nburst = 0\n",
    ];
    for text in cases {
        let err = Registry::from_toml_str(text).unwrap_err();
        assert_eq!(err.path(), "rate_limiters.api.burst", "{text:?}\n-> {err}");
        let (line, column) = err.position().unwrap();
        let shown = text.split('\n').nth(line - 1).unwrap();
        let value = shown.find("burst").map(|i| shown[i..].find('0').unwrap() + i).unwrap();
        assert_eq!(column, shown[..value].chars().count() + 1, "{text:?}\n-> {err}");
    }
    // A value inside an inline table under a unicode name.
    let text = "bulkheads.\"ééééé\" = { max_concurrent_calls = 0 }\n";
    let err = Registry::from_toml_str(text).unwrap_err();
    assert_eq!(err.path(), "bulkheads.ééééé.max_concurrent_calls");
    assert_eq!(err.position(), Some((1, 46)));
    // The second element of a multi-line array.
    let text = limiter("key = \"forwarded_ip\"\ntrusted_proxies = [\n  \"10.0.0.0/8\",\n  \"bad\",\n]");
    let err = Registry::from_toml_str(&text).unwrap_err();
    assert_eq!(err.path(), "rate_limiters.api.trusted_proxies");
    assert_located(&text, &err);
}

#[test]
fn duplicate_keys_in_every_form_are_errors_at_the_second() {
    let one = "[rate_limiters.api]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n";
    // Each case with the line of its second occurrence.
    let cases = [
        (format!("{one}[rate_limiters.api]\nburst = 1\n"), 4),
        (format!("{one}burst = 1\nburst = 1\n"), 5),
        (format!("{one}\"burst\" = 1\nburst = 2\n"), 5),
        (format!("{one}[rate_limiters]\napi = {{ burst = 1 }}\n"), 5),
        ("[bulkheads]\nb = { max_concurrent_calls = 1, max_concurrent_calls = 2 }\n".to_owned(), 2),
        ("bulkheads.b.max_concurrent_calls = 1\n[bulkheads.b]\nmax_concurrent_calls = 2\n".to_owned(), 2),
        ("[pushbacks.p]\n[pushbacks.p]\n".to_owned(), 2),
    ];
    for (text, line) in cases {
        let err = std::panic::catch_unwind(|| Registry::from_toml_str(&text).map(|_| ()))
            .unwrap_or_else(|_| panic!("panicked on {text:?}"))
            .expect_err(&text);
        assert_located(&text, &err);
        assert_eq!(err.position().unwrap().0, line, "{text:?}\n-> {err}");
    }
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

#[test]
fn every_refused_change_leaves_every_later_decision_as_it_was() {
    // (text in BASE, its replacement, the path refused; a path ending in `*` is a prefix).
    let cases = [
        ("key = \"header:x-k\"", "key = \"header:x-k\"\nalgorithm = \"sliding_log\"", "rate_limiters.api.algorithm"),
        ("key = \"header:x-k\"", "key = \"header:x-j\"", "rate_limiters.api.key"),
        ("key = \"header:x-k\"", "key = \"global\"", "rate_limiters.api.key"),
        ("key = \"header:x-k\"", "key = \"header:x-k\"\nmax_keys = 5", "rate_limiters.api.max_keys"),
        ("key = \"header:x-k\"", "key = \"header:x-k\"\nhide_keys = true", "rate_limiters.api.hide_keys"),
        ("queue_capacity = 4", "queue_capacity = 5", "bulkheads.q.queue_capacity"),
        ("queue_capacity = 4", "queue_capacity = 4\nmax_wait = \"1s\"", "bulkheads.q.max_wait"),
        ("max_wait = \"1s\"", "max_wait = \"2s\"", "pushbacks.p.max_wait"),
        ("max_wait = \"1s\"", "max_wait = \"1s\"\nmax_hold = \"1m\"", "pushbacks.p.max_hold"),
        ("max_wait = \"1s\"", "max_wait = \"1s\"\npacing = \"spread\"", "pushbacks.p.pacing"),
        ("cost = 2", "cost = 1", "client_quotas.c.cost"),
        ("min_limit = 2", "min_limit = 3", "adaptive_bulkheads.a.min_limit"),
        ("max_limit = 16", "max_limit = 17", "adaptive_bulkheads.a.max_limit"),
        ("max_limit = 16", "max_limit = 16\ninitial_limit = 9", "adaptive_bulkheads.a.initial_limit"),
        ("max_limit = 16", "max_limit = 16\nalgorithm = \"gradient\"", "adaptive_bulkheads.a.algorithm"),
        ("max_limit = 16", "max_limit = 16\nignore_cancelled_calls = true", "adaptive_bulkheads.a.ignore_cancelled_calls"),
        ("cost = 1 }", "cost = 2 }", "routes.r*"),
        ("[\"10.0.0.0/8\"]", "[\"10.0.0.0/9\"]", "routes.r*"),
        ("[routes.r]", "[routes.s]", "routes.*"),
        ("[pushbacks.p]", "[pushbacks.p2]", "pushbacks.*"),
        ("[bulkheads.q]\nmax_concurrent_calls = 3\nqueue_capacity = 4\n", "", "bulkheads.q"),
        // Bad files: refused just the same.
        ("min_limit = 2", "min_limit = 2\nbogus = 1", "adaptive_bulkheads.a.bogus"),
        ("\"1h\"\nalgorithm", "\"0s\"\nalgorithm", "rate_limiters.window.limit_refresh_period"),
        ("[routes.r]", "[routes.r", "*"),
    ];
    let registry = Registry::from_toml_str(BASE).unwrap();
    let twin = Registry::from_toml_str(BASE).unwrap();
    for r in [&registry, &twin] {
        for _ in 0..3 {
            next(r, "api", &key("k1"));
        }
        next(r, "window", &ConfigKey::Global);
    }
    for (from, to, path) in cases {
        assert!(BASE.contains(from), "{from}");
        let text = with_quota_changes(&BASE.replacen(from, to, 1));
        let before = observed(&registry);
        let err = registry.reload_toml_str(&text).unwrap_err();
        match path.strip_suffix('*') {
            Some(prefix) => assert!(err.path().starts_with(prefix), "{path}: {err}"),
            None => assert_eq!(err.path(), path, "{err}"),
        }
        assert_located(&text, &err);
        assert_eq!(observed(&registry), before, "{text}");
        assert_eq!(observed(&registry), observed(&twin), "{text}");
        for k in [key("k1"), key("k2")] {
            assert_eq!(next(&registry, "api", &k), next(&twin, "api", &k), "{text}");
        }
        let global = ConfigKey::Global;
        assert_eq!(next(&registry, "window", &global), next(&twin, "window", &global));
    }
    // The quota changes alone apply, and the window kept every permit it counted.
    let reloaded = registry.reload_toml_str(&with_quota_changes(BASE)).unwrap();
    assert_eq!(reloaded.rate_limiters, ["api", "window"]);
    assert_eq!(reloaded.bulkheads, ["b"]);
    let used = 2 + cases.len() as u64;
    assert_eq!(next(&registry, "window", &ConfigKey::Global), (true, 200, 200 - used));
    assert_eq!(next(&registry, "api", &key("new")), (true, 20, 19));
}

#[test]
fn each_quota_field_applies_in_place_and_every_key_keeps_its_state() {
    for algorithm in ["fixed_window", "sliding_log", "sliding_counter", "gcra"] {
        let file = format!("[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1h\"\nalgorithm = \"{algorithm}\"\nkey = \"header:x-k\"\n");
        // GCRA keeps what was used when the emission interval stays: 20 per 2 h.
        let doubled = if algorithm == "gcra" { "20\nlimit_refresh_period = \"2h\"" } else { "20\nlimit_refresh_period = \"1h\"" };
        let edits = [
            ("10\nlimit_refresh_period = \"1h\"", doubled, 20),
            ("key", "max_wait = \"1s\"\nkey", 10),
            ("key", "max_wait = \"1152921504606846976ns\"\nkey", 10),
        ];
        for (from, to, limit) in edits {
            let registry = Registry::from_toml_str(&file).unwrap();
            for k in ["k1", "k1", "k1", "k2"] {
                assert!(next(&registry, "api", &key(k)).0);
            }
            let edited = file.replacen(from, to, 1);
            let reloaded = registry.reload_toml_str(&edited).unwrap();
            assert_eq!(reloaded.rate_limiters, ["api"], "{edited}");
            assert!(reloaded.bulkheads.is_empty());
            assert_eq!(next(&registry, "api", &key("k1")), (true, limit, limit - 4), "{edited}");
            assert_eq!(next(&registry, "api", &key("k2")), (true, limit, limit - 2), "{edited}");
            assert_eq!(next(&registry, "api", &key("k3")), (true, limit, limit - 1), "{edited}");
            assert_eq!(registry.reload_toml_str(&edited).unwrap(), Reloaded::default());
        }
        // The burst and the period reach the running limiter.
        let registry = Registry::from_toml_str(&file).unwrap();
        let edited = file.replacen("key", "burst = 15\nkey", 1).replacen("\"1h\"", "\"30m\"", 1);
        assert_eq!(registry.reload_toml_str(&edited).unwrap().rate_limiters, ["api"]);
        let quota = registry.rate_limiter("api").unwrap().quota();
        assert_eq!((quota.burst(), quota.period()), (15, Duration::from_secs(1800)));
    }
}
