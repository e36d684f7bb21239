//! Values at their bounds, positions in every layout, duplicate and deeply nested keys, odd
//! names and unreadable files: accepted exactly, or refused at a located place.

use super::*;

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
        assert_refused_at(
            &limiter(&format!("max_wait = {bare}")),
            "rate_limiters.api.max_wait",
        );
    }
    Registry::from_toml_str(&limiter(&format!("max_wait = \"{two_60}ns\""))).unwrap();
    Registry::from_toml_str(&limiter("max_wait = \"1.000000001s\"")).unwrap();
    // `limit_for_period` itself, at both ends.
    let lfp = |v: &str| {
        format!("[rate_limiters.api]\nlimit_for_period = {v}\nlimit_refresh_period = \"1s\"\n")
    };
    for bad in [
        "0",
        "-1",
        "4294967296",
        "9007199254740992",
        "10.0",
        "\"10\"",
        "[]",
    ] {
        assert_refused_at(&lfp(bad), "rate_limiters.api.limit_for_period");
    }
    Registry::from_toml_str(&lfp(&u32_max.to_string())).unwrap();
    // Bulkheads, pushbacks and adaptive bulkheads at their bounds.
    let cases = [
        (
            "[bulkheads.b]\nmax_concurrent_calls = 0\n",
            "bulkheads.b.max_concurrent_calls",
        ),
        (
            "[bulkheads.b]\nmax_concurrent_calls = -5\n",
            "bulkheads.b.max_concurrent_calls",
        ),
        (
            "[bulkheads.b]\nmax_concurrent_calls = 4294967295\n",
            "bulkheads.b.max_concurrent_calls",
        ),
        (
            "[bulkheads.b]\nmax_concurrent_calls = 1\nqueue_capacity = 9007199254740992\n",
            "bulkheads.b.queue_capacity",
        ),
        (
            "[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = 1\n",
            "bulkheads.b.max_wait",
        ),
        (
            "[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = \"1152921504606846977ns\"\n",
            "bulkheads.b.max_wait",
        ),
        (
            "[bulkheads.b]\nmax_concurrent_calls = 1\nqueue_capacity = 1\nmax_wait = \"18446744073709551615ns\"\n",
            "bulkheads.b.max_wait",
        ),
        ("[pushbacks.p]\nmax_hold = \"0s\"\n", "pushbacks.p.max_hold"),
        (
            "[pushbacks.p]\nmax_hold = \"1152921504606846977ns\"\n",
            "pushbacks.p.max_hold",
        ),
        (
            "[pushbacks.p]\nmax_wait = \"1152921504606846977ns\"\n",
            "pushbacks.p.max_wait",
        ),
        ("[pushbacks.p]\npacing = 1\n", "pushbacks.p.pacing"),
        (
            "[adaptive_bulkheads.a]\nmax_limit = 2147483648\n",
            "adaptive_bulkheads.a.max_limit",
        ),
        (
            "[adaptive_bulkheads.a]\nmin_limit = 0\n",
            "adaptive_bulkheads.a.min_limit",
        ),
        (
            "[adaptive_bulkheads.a]\ninitial_limit = 257\nmax_limit = 256\n",
            "adaptive_bulkheads.a.initial_limit",
        ),
    ];
    for (text, path) in cases {
        assert_refused_at(text, path);
    }
    for text in [
        "[pushbacks.p]\nmax_hold = \"1152921504606846976ns\"\nmax_wait = \"1152921504606846976ns\"\n",
        "[adaptive_bulkheads.a]\nmin_limit = 2147483647\nmax_limit = 2147483647\n",
        "[adaptive_bulkheads.a]\ninitial_limit = 257\n",
        "[bulkheads.b]\nmax_concurrent_calls = 1\n",
        "[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = \"1152921504606846976ns\"\n",
        // A bulkhead's largest limit, as `Bulkhead::semaphore` takes it (2^31 - 1), and a queue
        // as long.
        "[bulkheads.b]\nmax_concurrent_calls = 2147483647\nqueue_capacity = 2147483647\n",
    ] {
        Registry::from_toml_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
}

#[test]
fn cross_field_rules_hold_at_their_boundary() {
    // `forwarded_ip` needs proxies; proxies need `forwarded_ip`.
    assert_refused_at(
        &limiter("key = \"forwarded_ip\""),
        "rate_limiters.api.trusted_proxies",
    );
    assert_refused_at(
        &limiter("key = \"forwarded_ip\"\ntrusted_proxies = []"),
        "rate_limiters.api.trusted_proxies",
    );
    assert_refused_at(
        &limiter("trusted_proxies = [\"10.0.0.0/8\"]"),
        "rate_limiters.api.trusted_proxies",
    );
    Registry::from_toml_str(&limiter(
        "key = \"forwarded_ip\"\ntrusted_proxies = [\"::/0\"]",
    ))
    .unwrap();
    // A client quota's cost is at most the burst: the burst written, or the default
    // (`limit_for_period`); its limiter must be keyed `global`.
    let quota = |burst: &str, cost: u32| {
        limiter(&format!(
            "key = \"global\"\n{burst}\n[client_quotas.c]\nlimiter = \"api\"\ncost = {cost}"
        ))
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
    let err = registry
        .reload_toml_str(&quota("burst = 2", 3))
        .unwrap_err();
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
        let value = shown
            .find("burst")
            .map(|i| shown[i..].find('0').unwrap() + i)
            .unwrap();
        assert_eq!(
            column,
            shown[..value].chars().count() + 1,
            "{text:?}\n-> {err}"
        );
    }
    // A value inside an inline table under a unicode name.
    let text = "bulkheads.\"ééééé\" = { max_concurrent_calls = 0 }\n";
    let err = Registry::from_toml_str(text).unwrap_err();
    assert_eq!(err.path(), "bulkheads.ééééé.max_concurrent_calls");
    assert_eq!(err.position(), Some((1, 46)));
    // The second element of a multi-line array.
    let text =
        limiter("key = \"forwarded_ip\"\ntrusted_proxies = [\n  \"10.0.0.0/8\",\n  \"bad\",\n]");
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
        (
            "[bulkheads]\nb = { max_concurrent_calls = 1, max_concurrent_calls = 2 }\n".to_owned(),
            2,
        ),
        (
            "bulkheads.b.max_concurrent_calls = 1\n[bulkheads.b]\nmax_concurrent_calls = 2\n"
                .to_owned(),
            2,
        ),
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

/// Instance names of every odd sort: a bulkhead takes any name and is found by it, and the
/// health report stays valid JSON naming it; a rate limiter's name is accepted the same way or
/// refused as a policy name, never a panic.
#[test]
fn odd_instance_names_are_found_by_name_and_reported_as_valid_json() {
    let long = "n".repeat(1_000);
    let names = [
        "",
        " ",
        "a.b",
        "a\"b",
        "a\\b",
        "\u{1}",
        "\u{7f}",
        "é",
        "e\u{301}",
        "支払い",
        "a\nb",
        "\u{202e}rtl",
        "🦀",
        "}",
        "\u{feff}",
        &long,
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
        .map(|(i, name)| {
            format!(
                "[bulkheads.{}]\nmax_concurrent_calls = {}\n",
                quoted(name),
                i + 1
            )
        })
        .collect();
    let registry = Registry::from_toml_str(&file).unwrap();
    let json: serde_json::Value = serde_json::from_str(&registry.health().to_json()).unwrap();
    let text = json.to_string();
    for (i, name) in names.iter().enumerate() {
        let snapshot = registry.bulkhead(name).unwrap().snapshot();
        assert_eq!(snapshot.max_allowed_concurrent_calls, i + 1, "{name:?}");
        assert!(
            text.contains(&in_json(name)),
            "{name:?} not in the health report"
        );
    }
    assert_eq!(
        registry.reload_toml_str(&file).unwrap(),
        Reloaded::default()
    );
    for name in names {
        let text = format!(
            "[rate_limiters.{}]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n",
            quoted(name)
        );
        match std::panic::catch_unwind(|| Registry::from_toml_str(&text)).expect(&text) {
            Ok(registry) => {
                assert!(registry.rate_limiter(name).is_ok(), "{name:?}");
                let json: serde_json::Value =
                    serde_json::from_str(&registry.health().to_json()).unwrap();
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

/// Keys nested as deep as the TOML parser goes are located errors; arrays nested past its
/// depth are syntax errors with a position.
#[test]
fn deep_nesting_is_a_located_error() {
    let dotted = |n: usize| vec!["a"; n].join(".");
    let cases = [
        format!("[{}]\n", dotted(80)),
        format!("{} = 1\n", dotted(80)),
        format!(
            "[bulkheads.b]\nmax_concurrent_calls = 1\n{} = 1\n",
            dotted(80)
        ),
        format!("x = {}1{}\n", "[".repeat(100_000), "]".repeat(100_000)),
        format!("x = {}1{}\n", "{a=".repeat(100_000), "}".repeat(100_000)),
    ];
    for text in cases {
        let err = Registry::from_toml_str(&text).unwrap_err();
        assert_located(&text, &err);
    }
}

/// Promise: every error from text is a path with its position, or a TOML syntax error with its
/// position, also for a key of 81 segments or more (`a.a.….a = 1`, or as a table header), which
/// the TOML reader refuses with `recursion limit` and no place of its own: the error names the
/// key's line.
#[test]
fn a_key_nested_past_the_parser_s_depth_is_a_located_error() {
    let deep = vec!["a"; 81].join(".");
    for (text, line) in [
        (format!("[{deep}]\n"), 1),
        (format!("{deep} = 1\n"), 1),
        (
            format!("[bulkheads.b]\nmax_concurrent_calls = 1\n{deep} = 1\n[bulkheads.c]\n"),
            3,
        ),
    ] {
        let err = Registry::from_toml_str(&text).unwrap_err();
        assert_located(&text, &err);
        assert_eq!(err.position(), Some((line, 1)), "{err}");
    }
}

/// Files that cannot be read as text: an error naming no field, and a reload from one changes
/// nothing.
#[test]
fn unreadable_files_are_errors_and_change_nothing() {
    let dir = std::env::temp_dir().join(format!("bulwark-attack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = dir.join("latin1.toml");
    std::fs::write(&bytes, b"[bulkheads.b]\nmax_concurrent_calls = 5 # \xe9\n").unwrap();
    let registry = Registry::from_toml_str(BASE).unwrap();
    let before = observed(&registry);
    for path in [&dir, &bytes, &dir.join("missing.toml")] {
        let err = Registry::from_path(path).expect_err("an unreadable file is refused");
        assert!(!err.message().is_empty());
        let err = registry.reload_path(path).unwrap_err();
        assert_eq!(err.path(), "", "{err}");
    }
    assert_eq!(observed(&registry), before);
    std::fs::remove_dir_all(&dir).unwrap();
}
