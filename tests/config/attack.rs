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
    assert!(line >= 1 && line <= lines.len(), "line {line}: {text:?}\n-> {err}");
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

/// Pairs of files that mean the same: every default written out, and equal durations spelled
/// differently. A reload from one to the other, either way, is no change.
#[test]
fn a_default_written_out_is_no_change() {
    let lim = "[rate_limiters.a]\nlimit_for_period = 10\nlimit_refresh_period = \"1h\"\n";
    let global = format!("{lim}key = \"global\"\n");
    let pairs = [
        (lim.to_owned(), format!("{lim}burst = 10\nmax_wait = \"0s\"\nalgorithm = \"gcra\"\nkey = \"peer_ip\"\nmax_keys = 1000000\nhide_keys = false\nstore = \"memory\"\n")),
        (lim.to_owned(), lim.replace("\"1h\"", "\"60m\"")),
        (lim.to_owned(), lim.replace("\"1h\"", "\"3600000ms\"")),
        (lim.to_owned(), lim.replace("\"1h\"", "\"59m60s\"")),
        (format!("{lim}key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n"), format!("{lim}key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\nforwarded_header = \"x-forwarded-for\"\n")),
        ("[pushbacks.p]\n".to_owned(), "[pushbacks.p]\nmax_wait = \"0s\"\nmax_hold = \"10m\"\npacing = \"until_spent\"\n".to_owned()),
        ("[pushbacks.p]\nmax_hold = \"10m\"\n".to_owned(), "[pushbacks.p]\nmax_hold = \"600s\"\n".to_owned()),
        (format!("{global}[client_quotas.c]\nlimiter = \"a\"\n"), format!("{global}[client_quotas.c]\nlimiter = \"a\"\ncost = 1\n")),
        (format!("{lim}[routes.r]\npolicies = [\"a\"]\n"), format!("{lim}[routes.r]\npolicies = [{{ limiter = \"a\", cost = 1, shadow = false }}]\n")),
        ("[adaptive_bulkheads.a]\n".to_owned(), "[adaptive_bulkheads.a]\nmin_limit = 1\ninitial_limit = 8\nmax_limit = 256\nalgorithm = \"aimd\"\nignore_cancelled_calls = false\n".to_owned()),
        ("[adaptive_bulkheads.a]\nmax_limit = 4\n".to_owned(), "[adaptive_bulkheads.a]\nmax_limit = 4\ninitial_limit = 4\n".to_owned()),
        ("[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = \"1s\"\n".to_owned(), "[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = \"1000ms\"\n".to_owned()),
    ];
    for (short, long) in pairs {
        for (from, to) in [(&short, &long), (&long, &short)] {
            let registry = Registry::from_toml_str(from).unwrap_or_else(|e| panic!("{from}: {e}"));
            let reloaded = registry.reload_toml_str(to);
            assert_eq!(reloaded, Ok(Reloaded::default()), "{from}\n->\n{to}");
        }
    }
}

/// Promise: a semaphore bulkhead's `max_wait` defaults to `"0s"`, and a default written out is
/// no change. Both directions of the reload are refused: `changed from None to Some(0ns)`.
#[test]
#[ignore = "defect: reloading a semaphore bulkhead with its default max_wait = \"0s\" written out is refused as a change"]
fn a_semaphore_bulkhead_s_default_max_wait_written_out_is_no_change() {
    let short = "[bulkheads.b]\nmax_concurrent_calls = 1\n";
    let long = "[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = \"0s\"\n";
    let refused: Vec<String> = [(short, long), (long, short)]
        .into_iter()
        .filter_map(|(from, to)| {
            let registry = Registry::from_toml_str(from).unwrap();
            registry.reload_toml_str(to).err().map(|e| e.to_string())
        })
        .collect();
    assert!(refused.is_empty(), "{refused:#?}");
}

/// A bulkhead shrunk under the calls it holds neither loses nor doubles a permit: the calls
/// already in keep running, new ones wait for the smaller size, and every permit comes back.
#[tokio::test]
async fn a_bulkhead_resized_under_held_calls_keeps_exact_count() {
    let file = |n: usize| format!("[bulkheads.b]\nmax_concurrent_calls = {n}\n");
    let registry = Registry::from_toml_str(&file(2)).unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let open = Arc::clone(&gate);
    let service = registry.bulkhead("b").unwrap().layer().layer(service_fn(move |()| {
        let gate = Arc::clone(&gate);
        async move {
            gate.acquire().await.unwrap().forget();
            Ok::<_, BoxError>(())
        }
    }));
    let snapshot = || registry.bulkhead("b").unwrap().snapshot();
    let hold = |n: usize| {
        (0..n)
            .map(|_| tokio::spawn(service.clone().oneshot(())))
            .collect::<Vec<_>>()
    };
    async fn settle(until: impl Fn() -> bool) {
        for _ in 0..1_000 {
            if until() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the calls never got in");
    }

    let held = hold(2);
    settle(|| snapshot().available_concurrent_calls == 0).await;
    assert_eq!(registry.reload_toml_str(&file(1)).unwrap().bulkheads, ["b"]);
    assert_eq!(snapshot().max_allowed_concurrent_calls, 1);
    assert_eq!(snapshot().available_concurrent_calls, 0);
    assert!(service.clone().oneshot(()).await.is_err(), "over the new size");
    open.add_permits(1);
    settle(|| snapshot().total_finished == 1).await;
    // One of two held calls ended: still at the new size of 1, so still nothing free.
    assert_eq!(snapshot().available_concurrent_calls, 0);
    assert!(service.clone().oneshot(()).await.is_err(), "still full");
    open.add_permits(1);
    for call in held {
        call.await.unwrap().unwrap();
    }
    assert_eq!(snapshot().available_concurrent_calls, 1);

    assert_eq!(registry.reload_toml_str(&file(3)).unwrap().bulkheads, ["b"]);
    let held = hold(3);
    settle(|| snapshot().available_concurrent_calls == 0).await;
    assert!(service.clone().oneshot(()).await.is_err(), "a fourth call");
    open.add_permits(3);
    for call in held {
        call.await.unwrap().unwrap();
    }
    let end = snapshot();
    assert_eq!((end.available_concurrent_calls, end.max_allowed_concurrent_calls), (3, 3));
    assert_eq!((end.total_permitted, end.total_rejected, end.total_finished), (5, 3, 5));
}

/// One change to a valid file: the raw material of the mutation property.
#[derive(Clone, Debug)]
enum Mutation {
    DeleteChar(usize),
    InsertChar(usize, char),
    ReplaceNumber(usize, &'static str),
    DuplicateLine(usize),
    DeleteLine(usize),
    SwapLines(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let chars = prop::sample::select(vec![
        '"', '=', '[', ']', '{', '}', ',', '.', '#', '\n', ' ', '0', '9', '-', 'é', '\\', '\'',
    ]);
    let values = prop::sample::select(vec![
        "0", "-1", "1", "4294967295", "4294967296", "9007199254740992", "1.5", "nan", "\"x\"",
        "[]", "{}", "true", "\"0s\"", "\"1152921504606846977ns\"", "\"0.5ns\"", "1979-05-27",
    ]);
    prop_oneof![
        any::<prop::sample::Index>().prop_map(|i| Mutation::DeleteChar(i.index(BASE.len()))),
        (any::<prop::sample::Index>(), chars)
            .prop_map(|(i, c)| Mutation::InsertChar(i.index(BASE.len()), c)),
        (0..64usize, values).prop_map(|(n, v)| Mutation::ReplaceNumber(n, v)),
        (0..64usize).prop_map(Mutation::DuplicateLine),
        (0..64usize).prop_map(Mutation::DeleteLine),
        (0..64usize, 0..64usize).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
    ]
}

fn apply(text: &str, mutation: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let n = lines.len();
    let at = |i: usize| {
        let mut i = i.min(text.len());
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    match *mutation {
        Mutation::DeleteChar(i) if !text.is_empty() => {
            let i = at(i).min(text.len() - 1);
            let mut out = text.to_owned();
            if out.is_char_boundary(i) && i < out.len() {
                out.remove(i);
            }
            return out;
        }
        Mutation::DeleteChar(_) => return text.to_owned(),
        Mutation::InsertChar(i, c) => {
            let mut out = text.to_owned();
            out.insert(at(i), c);
            return out;
        }
        Mutation::ReplaceNumber(k, value) => {
            // The k-th value after `=` (wrapping round) becomes `value`.
            let targets: Vec<usize> = (0..n).filter(|&i| lines[i].contains(" = ")).collect();
            if let Some(&i) = targets.get(k % targets.len().max(1)) {
                let (name, _) = lines[i].split_once(" = ").unwrap();
                lines[i] = format!("{name} = {value}");
            }
        }
        Mutation::DuplicateLine(i) => lines.insert(i % n, lines[i % n].clone()),
        Mutation::DeleteLine(i) => drop(lines.remove(i % n)),
        Mutation::SwapLines(a, b) => lines.swap(a % n, b % n),
    }
    lines.join("\n") + "\n"
}

/// Builds `text` and reloads it onto a registry of `BASE`, catching panics; every error must be
/// located, an accepted file must reload onto itself as no change, and a refused reload must
/// leave `BASE` running exactly.
fn survives(text: &str) -> Result<(), TestCaseError> {
    let outcome = std::panic::catch_unwind(|| {
        let built = Registry::from_toml_str(text);
        if let Err(err) = &built {
            assert_located(text, err);
        }
        if let Ok(registry) = &built {
            assert_eq!(registry.reload_toml_str(text), Ok(Reloaded::default()), "{text}");
        }
        let registry = Registry::from_toml_str(BASE).unwrap();
        let before = observed(&registry);
        match registry.reload_toml_str(text) {
            Err(err) => {
                assert_located(text, &err);
                assert_eq!(observed(&registry), before, "{text}\n-> {err}");
            }
            Ok(_) => assert!(built.is_ok(), "a reload accepted a file a registry refuses"),
        }
    });
    prop_assert!(outcome.is_ok(), "panicked on {:?}", text);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Hostile bytes, read as text as an operator's editor might have saved them.
    #[test]
    fn hostile_bytes_are_a_registry_or_a_located_error(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        prefix in prop::sample::select(vec!["", "[rate_limiters.api]\n", "[bulkheads.b]\n", "[routes.r]\npolicies = "]),
    ) {
        let text = format!("{prefix}{}", String::from_utf8_lossy(&bytes));
        survives(&text)?;
    }

    /// A valid file with one to four edits of the kinds an operator's typo makes.
    #[test]
    fn mutated_valid_files_are_a_registry_or_a_located_error(
        mutations in prop::collection::vec(mutation(), 1..5)
    ) {
        let text = mutations.iter().fold(BASE.to_owned(), |text, m| apply(&text, m));
        survives(&text)?;
    }
}

/// Decisions from four threads race with reloads from two (quotas back and forth, and bad files
/// among them): every decision is counted once, under whichever quota, and no reload loses a
/// key's count.
#[test]
fn reloads_racing_with_decisions_lose_and_double_nothing() {
    const FILE: &str = "[rate_limiters.count]\nlimit_for_period = 100000\nlimit_refresh_period = \"1h\"\nalgorithm = \"fixed_window\"\nkey = \"header:x-k\"\n\n[rate_limiters.log]\nlimit_for_period = 100000\nlimit_refresh_period = \"1h\"\nalgorithm = \"sliding_log\"\nkey = \"global\"\n\n[bulkheads.b]\nmax_concurrent_calls = 4\n";
    const DECISIONS: u64 = 2_000;
    let registry = Registry::from_toml_str(FILE).unwrap();
    let keys = ["k0", "k1", "k2", "k3"];
    std::thread::scope(|scope| {
        for k in keys {
            let registry = &registry;
            scope.spawn(move || {
                for _ in 0..DECISIONS {
                    assert!(next(registry, "count", &key(k)).0);
                    assert!(next(registry, "log", &ConfigKey::Global).0);
                }
            });
        }
        for reloader in 0..2 {
            let registry = &registry;
            scope.spawn(move || {
                for i in 0..100 {
                    let text = match (i + reloader) % 3 {
                        0 => FILE.replace("100000", "200000").replace("= 4\n", "= 6\n"),
                        1 => FILE.to_owned(),
                        _ => FILE.replace("= 4\n", "= 0\n"),
                    };
                    match registry.reload_toml_str(&text) {
                        Ok(reloaded) => {
                            assert!(reloaded.rate_limiters.iter().all(|n| n == "count" || n == "log"));
                        }
                        Err(err) => assert_eq!(err.path(), "bulkheads.b.max_concurrent_calls"),
                    }
                }
            });
        }
    });
    registry.reload_toml_str(FILE).unwrap();
    for k in keys {
        assert_eq!(next(&registry, "count", &key(k)), (true, 100_000, 100_000 - DECISIONS - 1));
    }
    let all = 4 * DECISIONS;
    assert_eq!(next(&registry, "log", &ConfigKey::Global), (true, 100_000, 100_000 - all - 1));
    assert_eq!(registry.rate_limiter("count").unwrap().snapshot().allowed, all + 4);
    assert_eq!(registry.rate_limiter("log").unwrap().snapshot().allowed, all + 1);
    assert_eq!(registry.bulkhead("b").unwrap().snapshot().max_allowed_concurrent_calls, 4);
}

/// Calls through a bulkhead race with reloads resizing it from 1 to 4: never more calls inside
/// than the largest size, every call permitted or refused once, every permit back at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resizes_racing_with_calls_lose_and_double_nothing() {
    let file = |n: usize| format!("[bulkheads.b]\nmax_concurrent_calls = {n}\n");
    let registry = Arc::new(Registry::from_toml_str(&file(2)).unwrap());
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let (i, m, s) = (Arc::clone(&inside), Arc::clone(&most), Arc::clone(&served));
    let service = registry.bulkhead("b").unwrap().layer().layer(service_fn(move |()| {
        let (inside, most, served) = (Arc::clone(&i), Arc::clone(&m), Arc::clone(&s));
        async move {
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            inside.fetch_sub(1, Ordering::SeqCst);
            served.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(())
        }
    }));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                let mut refused = 0usize;
                for _ in 0..50 {
                    // Each call is a task of its own: the bulkhead's future is `Send` for any lifetime.
                    if tokio::spawn(service.clone().oneshot(())).await.unwrap().is_err() {
                        refused += 1;
                    }
                }
                refused
            })
        })
        .collect();
    let resizer = {
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            for i in 0..200 {
                registry.reload_toml_str(&file(1 + i % 4)).unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let mut refused = 0;
    for caller in callers {
        refused += caller.await.unwrap();
    }
    resizer.await.unwrap();
    registry.reload_toml_str(&file(3)).unwrap();
    let end = registry.bulkhead("b").unwrap().snapshot();
    assert!(most.load(Ordering::SeqCst) <= 4, "{} inside", most.load(Ordering::SeqCst));
    assert_eq!((end.available_concurrent_calls, end.max_allowed_concurrent_calls), (3, 3));
    let served = served.load(Ordering::SeqCst) as u64;
    assert_eq!(end.total_permitted, served);
    assert_eq!(end.total_finished, served);
    assert_eq!(end.total_rejected, refused as u64);
    assert_eq!(served + refused as u64, 400);
}

/// 10 000 instances of each kind: built, reloaded unchanged, reloaded with one change and
/// refused at their last line. The times are printed (`--nocapture`) to compare sizes, never
/// asserted.
#[test]
fn ten_thousand_instances_build_reload_and_refuse() {
    let file = |n: usize, last: u32| {
        (0..n)
            .map(|i| {
                let limit = if i == n - 1 { last } else { 10 };
                format!("[rate_limiters.l{i}]\nlimit_for_period = {limit}\nlimit_refresh_period = \"1s\"\n\n[bulkheads.b{i}]\nmax_concurrent_calls = 2\n\n")
            })
            .collect::<String>()
    };
    for n in [2_500, 5_000, 10_000] {
        let text = file(n, 10);
        let start = Instant::now();
        let registry = Registry::from_toml_str(&text).unwrap();
        let built = start.elapsed();
        let start = Instant::now();
        assert_eq!(registry.reload_toml_str(&text).unwrap(), Reloaded::default());
        let unchanged = start.elapsed();
        let changed = file(n, 20);
        let start = Instant::now();
        let reloaded = registry.reload_toml_str(&changed).unwrap();
        let one = start.elapsed();
        assert_eq!(reloaded.rate_limiters, [format!("l{}", n - 1)]);
        assert_eq!(registry.rate_limiter(&format!("l{}", n - 1)).unwrap().quota().permits(), 20);
        let bad = format!("{changed}[bulkheads.last]\nmax_concurrent_calls = 0\n");
        let start = Instant::now();
        let err = Registry::from_toml_str(&bad).unwrap_err();
        let refused = start.elapsed();
        assert_eq!(err.path(), "bulkheads.last.max_concurrent_calls");
        assert_eq!(err.position(), Some((bad.lines().count(), 24)));
        let err = registry.reload_toml_str(&bad).unwrap_err();
        assert_eq!(err.position(), Some((bad.lines().count(), 24)));
        eprintln!("{n} instances: built {built:?}, unchanged reload {unchanged:?}, one change {one:?}, refused {refused:?}");
    }
}

/// Instance names of every odd sort: a bulkhead takes any name and is found by it, and the
/// health report stays valid JSON naming it; a rate limiter's name is accepted the same way or
/// refused as a policy name, never a panic.
#[test]
fn odd_instance_names_are_found_by_name_and_reported_as_valid_json() {
    let long = "n".repeat(1_000);
    let names = [
        "", " ", "a.b", "a\"b", "a\\b", "\u{1}", "\u{7f}", "é", "e\u{301}", "支払い", "a\nb",
        "\u{202e}rtl", "🦀", "}", "\u{feff}", &long,
    ];
    // A TOML basic string, every control character escaped (TOML refuses DEL raw, JSON not).
    let quoted = |name: &str| {
        let escaped: String = name
            .chars()
            .map(|c| match c {
                '"' | '\\' => format!("\\{c}"),
                c if c.is_control() => format!("\\u{:04X}", u32::from(c)),
                c => c.to_string(),
            })
            .collect();
        format!("\"{escaped}\"")
    };
    let in_json = |name: &str| serde_json::to_string(name).unwrap();
    let file: String = names
        .iter()
        .enumerate()
        .map(|(i, name)| format!("[bulkheads.{}]\nmax_concurrent_calls = {}\n", quoted(name), i + 1))
        .collect();
    let registry = Registry::from_toml_str(&file).unwrap();
    let json: serde_json::Value = serde_json::from_str(&registry.health().to_json()).unwrap();
    let text = json.to_string();
    for (i, name) in names.iter().enumerate() {
        let snapshot = registry.bulkhead(name).unwrap().snapshot();
        assert_eq!(snapshot.max_allowed_concurrent_calls, i + 1, "{name:?}");
        assert!(text.contains(&in_json(name)), "{name:?} not in the health report");
    }
    assert_eq!(registry.reload_toml_str(&file).unwrap(), Reloaded::default());
    for name in names {
        let text = format!("[rate_limiters.{}]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n", quoted(name));
        match std::panic::catch_unwind(|| Registry::from_toml_str(&text)).expect(&text) {
            Ok(registry) => {
                assert!(registry.rate_limiter(name).is_ok(), "{name:?}");
                let json: serde_json::Value = serde_json::from_str(&registry.health().to_json()).unwrap();
                assert!(json.to_string().contains(&in_json(name)), "{name:?}");
            }
            Err(err) => {
                assert!(err.path().starts_with("rate_limiters."), "{err}");
                assert!(err.message().contains("policy name"), "{err}");
                assert_located(&text, &err);
            }
        }
    }
}
