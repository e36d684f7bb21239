//! Attacks on the configuration's limits after the refactor that wrote the limits rule
//! (`min <= initial <= max`) and the adaptive-feature refusal once for adaptive bulkheads,
//! overload, breakers and retries, and placed every error with one builder (`at`). Each test
//! quotes the `config` module's docs (or `Registry`'s, `ConfigError`'s) that it attacks: every
//! error names the field path with the line and column of the value at fault, the documented
//! bounds of each kind, and reloads that fail change nothing.

use tower_bulwark::config::{ConfigError, Registry};
use tower_bulwark::Limiter;

const MAX: i64 = (1 << 31) - 1;

/// The line and column (from 1, in characters) of the value of the first `field = ` on a line of
/// `text` (after `from_line`).
fn value_position(text: &str, field: &str) -> (usize, usize) {
    for (i, line) in text.split('\n').enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(field) {
            if let Some(after) = rest.trim_start().strip_prefix('=') {
                let value_at = line.len() - after.trim_start().len();
                return (i + 1, line[..value_at].chars().count() + 1);
            }
        }
    }
    panic!("no {field} in {text:?}");
}

/// `err` names `section.name.field` and sits at that field's value in `text`.
fn assert_at_value(text: &str, err: &ConfigError, section_name: &str, field: &str) {
    assert_eq!(
        err.path(),
        format!("{section_name}.{field}"),
        "{text}\n-> {err}"
    );
    assert_eq!(
        err.position(),
        Some(value_position(text, field)),
        "{text}\n-> {err}"
    );
}

/// The field `err` names under `prefix` (`section.name.`), from `text`.
fn field_named(err: &ConfigError, prefix: &str, text: &str) -> String {
    err.path()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{text}\n-> {err}"))
        .to_string()
}

/// `text`'s refusal, which there must be.
fn refusal(text: &str) -> ConfigError {
    Registry::from_toml_str(text).expect_err(text)
}

/// The three limits in the order `order` names them (a permutation of 0..3).
fn limits_text(header: &str, values: [i64; 3], order: [usize; 3], extra: &str) -> String {
    let names = ["min_limit", "initial_limit", "max_limit"];
    let mut text = format!("{header}\n{extra}");
    for i in order {
        text.push_str(&format!("{} = {}\n", names[i], values[i]));
    }
    text
}

const ORDERS: [[usize; 3]; 6] = [
    [0, 1, 2],
    [0, 2, 1],
    [1, 0, 2],
    [1, 2, 0],
    [2, 0, 1],
    [2, 1, 0],
];

/// Checks one kind's three limits against the documented rule `1 <= min_limit <= initial_limit
/// <= max_limit <= 2^31 - 1`, for every triple of `values` written in every order: the file
/// is built (and `built` reads its limits back) exactly when the rule holds; otherwise the
/// error names one of the limits that break it, at the line and column of its value, and a
/// limit out of range on its own is the one named.
fn every_order_and_bound(
    header: &str,
    section_name: &str,
    extra: &str,
    built: impl Fn(&Registry) -> [Option<i64>; 3],
) {
    let values = [0i64, -1, 1, 2, 16, MAX - 1, MAX, MAX + 1];
    let names = ["min_limit", "initial_limit", "max_limit"];
    for &min in &values {
        for &initial in &values {
            for &max in &values {
                let triple = [min, initial, max];
                let order = ORDERS[((min + 2 * initial + 3 * max).rem_euclid(6)) as usize];
                let text = limits_text(header, triple, order, extra);
                let in_range = |v: i64| (1..=MAX).contains(&v);
                let valid = triple.iter().all(|&v| in_range(v)) && min <= initial && initial <= max;
                match Registry::from_toml_str(&text) {
                    Ok(registry) => {
                        assert!(valid, "built:\n{text}");
                        for (read, written) in built(&registry).into_iter().zip(triple) {
                            if let Some(read) = read {
                                assert_eq!(read, written, "{text}");
                            }
                        }
                    }
                    Err(err) => {
                        assert!(!valid, "refused:\n{text}\n-> {err}");
                        let field = field_named(&err, &format!("{section_name}."), &text);
                        let i = names
                            .iter()
                            .position(|n| *n == field)
                            .unwrap_or_else(|| panic!("not a limit: {text}\n-> {err}"));
                        let out: Vec<usize> = (0..3).filter(|&j| !in_range(triple[j])).collect();
                        if out.len() == 1 {
                            assert_eq!(i, out[0], "the one out of range:\n{text}\n-> {err}");
                        } else if out.is_empty() {
                            // Named among the limits of a pair the order breaks.
                            let breaks_min_initial = min > initial && (i == 0 || i == 1);
                            let breaks_initial_max = initial > max && (i == 1 || i == 2);
                            let breaks_min_max = min > max && (i == 0 || i == 2);
                            assert!(
                                breaks_min_initial || breaks_initial_max || breaks_min_max,
                                "{text}\n-> {err}"
                            );
                        }
                        assert_at_value(&text, &err, section_name, names[i]);
                    }
                }
            }
        }
    }
}

/// The overload table: "`min_limit`, `initial_limit`, `max_limit`: integers, 1 <= min_limit <=
/// initial_limit <= max_limit <= 2^31 - 1", and the module: "zero limits and values out of
/// range are errors that name the instance and the field, with its line and column".
#[test]
fn overload_limits_in_every_order_and_at_every_bound() {
    every_order_and_bound("[overload.x]", "overload.x", "", |registry| {
        let overload = registry.overload("x").unwrap();
        // Only the initial limit can be read back; the others are checked by the rule.
        [None, Some(overload.limit() as i64), None]
    });
}

/// The adaptive bulkhead table: "`min_limit`: integer ≥ 1", "`initial_limit`: integer from
/// min_limit to max_limit", "`max_limit`: integer ≥ min_limit, at most 2^31 − 1"; errors with
/// the line and column of the value at fault.
#[test]
fn adaptive_bulkhead_limits_in_every_order_and_at_every_bound() {
    every_order_and_bound(
        "[adaptive_bulkheads.p]",
        "adaptive_bulkheads.p",
        "algorithm = \"gradient\"\n",
        |registry| {
            let limits = registry.adaptive_bulkhead("p").unwrap().limits();
            [
                Some(limits.min() as i64),
                Some(limits.initial() as i64),
                Some(limits.max() as i64),
            ]
        },
    );
}

/// Each case: the section, the fields, and the field the error names (`None`: built).
type Case = (&'static str, &'static str, Option<&'static str>);

fn check_cases(cases: &[Case]) {
    for (header, body, expected) in cases {
        check_case(header, body, *expected);
    }
}

/// Section `header` with `body` is built (`expected` is `None`), or refused at the value of
/// field `expected`.
fn check_case(header: &str, body: &str, expected: Option<&str>) {
    let text = format!("{header}\n{body}\n");
    let section_name = header.trim_matches(|c| c == '[' || c == ']');
    match (Registry::from_toml_str(&text), expected) {
        (Ok(_), None) => {}
        (Ok(_), Some(field)) => panic!("built, expected an error at {field}:\n{text}"),
        (Err(err), None) => panic!("refused:\n{text}\n-> {err}"),
        (Err(err), Some(field)) => assert_at_value(&text, &err, section_name, field),
    }
}

/// One field's values written alone: (the field, values built, values refused at the field).
type Bounds = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

/// Each value of `bounds`, alone in section `header`, is built or refused at its field.
fn check_bounds(header: &str, bounds: &[Bounds]) {
    for (field, built, refused) in bounds {
        for value in *built {
            check_case(header, &format!("{field} = {value}"), None);
        }
        for value in *refused {
            check_case(header, &format!("{field} = {value}"), Some(*field));
        }
    }
}

/// The circuit breaker table: "`window_calls`: integer from 1 to 100 000", "`window_seconds`:
/// integer from 1 to 100 000", "`minimum_calls`: integer ≥ 1, at most window_calls", "`failure_rate`,
/// `slow_call_rate`: numbers above 0, at most 1", "`slow_call_duration`: duration above zero,
/// ≤ 2^60 ns", "`open_for`: duration above zero, ≤ 2^60 ns", "`half_open_calls`: integer ≥ 1";
/// "a field left out keeps the builder's default" (window_calls 100); every error at the value.
#[test]
fn breaker_bounds_in_every_order() {
    let b = "[breakers.b]";
    let cases: &[Case] = &[
        (b, "window_calls = 1\nminimum_calls = 1", None),
        (b, "window_calls = 100000\nminimum_calls = 100000", None),
        (b, "minimum_calls = 100000\nwindow_calls = 100000", None),
        (
            b,
            "window_calls = 10\nminimum_calls = 11",
            Some("minimum_calls"),
        ),
        (
            b,
            "minimum_calls = 11\nwindow_calls = 10",
            Some("minimum_calls"),
        ),
    ];
    check_cases(cases);
    check_bounds(
        b,
        &[
            ("window_calls", &[], &["0", "100001", "-1"]),
            ("window_seconds", &["100000"], &["0", "100001"]),
            ("minimum_calls", &["100"], &["0", "101"]),
            (
                "failure_rate",
                &["1"],
                &["0", "0.0", "1.0000001", "nan", "inf", "-0.5"],
            ),
            ("slow_call_rate", &["0.000001"], &["0", "1.5"]),
            ("slow_call_duration", &["\"1ns\""], &["\"0s\""]),
            ("open_for", &["\"1ns\""], &["\"0s\"", "\"0ms\""]),
            ("half_open_calls", &["1"], &["0"]),
        ],
    );
}

/// The retries table: "`max_attempts`: integer from 1 to 10", "`base`, `cap`: durations, base <=
/// cap <= 1h", "`max_wait`: duration ≤ 1 h", "`ratio`: number from 0 to 10", "`min_per_second`:
/// integer ≥ 0", "`window`: duration from 10 ms to 1 h"; every error at the value at fault.
#[test]
fn retry_bounds_at_their_edges() {
    let r = "[retries.r]";
    check_cases(&[
        (r, "base = \"1h\"\ncap = \"1h\"", None),
        (r, "cap = \"1h\"\nbase = \"1h\"", None),
    ]);
    check_bounds(
        r,
        &[
            ("max_attempts", &["1", "10"], &["0", "11", "-1"]),
            ("cap", &["\"1h\""], &["\"1h1ns\""]),
            ("max_wait", &["\"1h\"", "\"0s\""], &["\"1h1ms\""]),
            ("ratio", &["0", "10"], &["10.000001", "-0.1", "nan", "inf"]),
            ("min_per_second", &["0"], &["-1"]),
            (
                "window",
                &["\"10ms\"", "\"1h\""],
                &["\"9ms\"", "\"9999999ns\"", "\"1h1ns\""],
            ),
        ],
    );
}

/// "`base`, `cap`: durations, base <= cap <= 1h" (defaults "50ms", "1s", each brought within
/// the one written), and `ConfigError`: "The error carries the line and column of the value at
/// fault in the TOML text": a base above the cap, both written and in either order, is refused
/// at one of the two, at its value; one of them written alone is never refused for the other,
/// which the file does not have (a base beyond the longest cap is refused at the base).
#[test]
fn a_retry_base_above_its_cap_is_refused_at_one_of_them() {
    for body in [
        "base = \"2s\"\ncap = \"1s\"",
        "cap = \"1s\"\nbase = \"2s\"",
        "base = \"1h\"\ncap = \"59m59s\"",
        "base = \"2h\"",
    ] {
        let text = format!("[retries.r]\n{body}\n");
        let err = refusal(&text);
        let field = field_named(&err, "retries.r.", &text);
        assert!(body.contains(&format!("{field} =")), "{text}\n-> {err}");
        assert_at_value(&text, &err, "retries.r", &field);
    }
    for body in ["base = \"2s\"", "cap = \"10ms\"", "base = \"1h\""] {
        let text = format!("[retries.r]\n{body}\n");
        assert!(Registry::from_toml_str(&text).is_ok(), "{text}");
    }
}

/// `ConfigError::position`: "The line and column (both from 1, the column in characters)": a
/// limit at fault in an inline table under a name of multi-byte characters is placed at its
/// value, counted in characters, for each adaptive kind.
#[test]
fn limits_in_inline_tables_under_unicode_names_are_placed_in_characters() {
    placed_in_characters(
        "overload",
        "{ min_limit = 5, initial_limit = 4, max_limit = 9 }",
    );
    placed_in_characters(
        "adaptive_bulkheads",
        "{ min_limit = 1, initial_limit = 0, max_limit = 9 }",
    );
    placed_in_characters("breakers", "{ window_calls = 3, minimum_calls = 4 }");
    placed_in_characters("retries", "{ max_attempts = 3, window = \"1ms\" }");
}

/// `table`, an instance of `section` under a name of multi-byte characters, is refused at the
/// value of the field named, counted in characters.
fn placed_in_characters(section: &str, table: &str) {
    let text = format!("[{section}]\n\"支払い-é\" = {table}\n");
    let err = refusal(&text);
    let field = field_named(&err, &format!("{section}.支払い-é."), &text);
    let line = text.split('\n').nth(1).unwrap();
    let at = line.find(&format!("{field} = ")).unwrap() + field.len() + 3;
    assert_eq!(
        err.position(),
        Some((2, line[..at].chars().count() + 1)),
        "{text}\n-> {err}"
    );
}

const RUNNING: &str = r#"
[rate_limiters.api]
limit_for_period = 10
limit_refresh_period = "1s"

[bulkheads.pool]
max_concurrent_calls = 4

[overload.x]
min_limit = 4
initial_limit = 20
max_limit = 100

[adaptive_bulkheads.a]
min_limit = 2
initial_limit = 5
max_limit = 50

[breakers.b]
window_calls = 50
minimum_calls = 10

[retries.r]
max_attempts = 4
base = "10ms"
cap = "2s"
"#;

fn state(registry: &Registry) -> (u32, usize, usize, usize) {
    (
        registry.rate_limiter("api").unwrap().quota().permits(),
        registry
            .bulkhead("pool")
            .unwrap()
            .snapshot()
            .max_allowed_concurrent_calls,
        registry.overload("x").unwrap().limit(),
        registry.adaptive_bulkhead("a").unwrap().limit(),
    )
}

/// `text` with the quota at 30 and the bulkhead at 9 calls: changes that apply in place.
fn with_quota_edits(text: &str) -> String {
    text.replace("limit_for_period = 10", "limit_for_period = 30")
        .replace("max_concurrent_calls = 4", "max_concurrent_calls = 9")
}

/// `Registry::reload_path`: "a change that cannot apply in place (any setting [...] of an
/// adaptive bulkhead, of an overload protection, whose limits move by themselves, of a circuit
/// breaker or of retries), or a bad file, is refused and changes nothing"; "a reload that changes
/// it is refused as a whole, with an error naming the instance and the field": a reload that
/// changes a quota in place and, in the same file, breaks or changes one limit of an adaptive
/// kind is refused naming that field, and the quota and bulkhead size stay as they were.
#[test]
fn a_reload_with_a_bad_or_changed_limit_changes_nothing() {
    let registry = Registry::from_toml_str(RUNNING).unwrap();
    let before = state(&registry);
    assert_eq!(before, (10, 4, 20, 5));
    // Out of range or out of order, a bad file: (the field, its value in RUNNING, its new value,
    // the start of the path refused).
    let bad = [
        ("min_limit", "4", "0", "overload.x.min_limit"),
        ("initial_limit", "20", "101", "overload.x."),
        ("max_limit", "100", "2147483648", "overload.x.max_limit"),
        ("initial_limit", "5", "1", "adaptive_bulkheads.a."),
        ("minimum_calls", "10", "51", "breakers.b.minimum_calls"),
        ("max_attempts", "4", "11", "retries.r.max_attempts"),
        ("cap", "\"2s\"", "\"1ms\"", "retries.r."),
    ];
    // Valid, but a change that cannot apply in place: (the path refused, the field's value in
    // RUNNING, its new value).
    let not_in_place = [
        ("overload.x.min_limit", "4", "5"),
        ("overload.x.initial_limit", "20", "21"),
        ("overload.x.max_limit", "100", "99"),
        ("adaptive_bulkheads.a.max_limit", "50", "51"),
        ("breakers.b.window_calls", "50", "60"),
        ("retries.r.max_attempts", "4", "5"),
    ]
    .map(|(path, old, new)| (path.rsplit('.').next().unwrap(), old, new, path));
    for (field, old, new, path) in bad.iter().chain(&not_in_place) {
        let (from, to) = (format!("{field} = {old}"), format!("{field} = {new}"));
        assert!(RUNNING.contains(&from), "{from}");
        let edited = with_quota_edits(&RUNNING.replacen(&from, &to, 1));
        let err = registry.reload_toml_str(&edited).expect_err(&to);
        assert!(
            err.path().starts_with(path),
            "{from} -> {to}: expected {path}, got {err}"
        );
        assert!(err.position().is_some(), "{from} -> {to}: {err}");
        assert_eq!(state(&registry), before, "{from} -> {to} changed something");
    }
    // And the same reload without the limit's edit applies.
    let reloaded = registry
        .reload_toml_str(&with_quota_edits(RUNNING))
        .unwrap();
    assert_eq!(reloaded.rate_limiters, vec!["api".to_string()]);
    assert_eq!(reloaded.bulkheads, vec!["pool".to_string()]);
    assert_eq!(state(&registry), (30, 9, 20, 5));
}

/// `Registry::reload_path`: "An instance whose settings are unchanged is not touched at all":
/// the adaptive kinds' limits written in another order, or their defaults written out, are no
/// change, and a quota edited beside them applies.
#[test]
fn limits_rewritten_in_another_order_are_no_change() {
    let registry = Registry::from_toml_str(RUNNING).unwrap();
    let reordered = RUNNING
        .replace(
            "min_limit = 4\ninitial_limit = 20\nmax_limit = 100",
            "max_limit = 100\nmin_limit = 4\ninitial_limit = 20",
        )
        .replace(
            "min_limit = 2\ninitial_limit = 5\nmax_limit = 50",
            "initial_limit = 5\nmax_limit = 50\nmin_limit = 2",
        )
        .replace(
            "window_calls = 50\nminimum_calls = 10",
            "minimum_calls = 10\nwindow_calls = 50",
        )
        .replace(
            "max_attempts = 4\nbase = \"10ms\"\ncap = \"2s\"",
            "cap = \"2000ms\"\nbase = \"10ms\"\nmax_attempts = 4",
        )
        .replace("limit_for_period = 10", "limit_for_period = 11");
    let reloaded = registry.reload_toml_str(&reordered).unwrap();
    assert_eq!(reloaded.rate_limiters, vec!["api".to_string()]);
    assert!(reloaded.bulkheads.is_empty());
    assert_eq!(state(&registry), (11, 4, 20, 5));
}

/// The adaptive bulkhead table: "`initial_limit`: integer from min_limit to max_limit, 8
/// (within the bounds)" and "`max_limit`: [...] 256, or min_limit if that is higher": the
/// defaults of the limits left out follow the ones written, at the bounds too.
#[test]
fn adaptive_bulkhead_defaults_follow_the_limits_written_at_the_bounds() {
    let limits = |body: &str| {
        let text = format!("[adaptive_bulkheads.p]\n{body}\n");
        let registry = Registry::from_toml_str(&text).unwrap_or_else(|e| panic!("{text}\n{e}"));
        let l = registry.adaptive_bulkhead("p").unwrap().limits();
        (l.min() as i64, l.initial() as i64, l.max() as i64)
    };
    assert_eq!(limits(&format!("min_limit = {MAX}")), (MAX, MAX, MAX));
    assert_eq!(limits(&format!("max_limit = {MAX}")), (1, 8, MAX));
    assert_eq!(limits("max_limit = 1"), (1, 1, 1));
    assert_eq!(limits("min_limit = 9"), (9, 9, 256));
    assert_eq!(limits("min_limit = 257"), (257, 257, 257));
    assert_eq!(limits("initial_limit = 256"), (1, 256, 256));
    assert_eq!(limits("initial_limit = 1"), (1, 1, 256));
    assert_eq!(
        limits(&format!("initial_limit = {MAX}\nmax_limit = {MAX}")),
        (1, MAX, MAX)
    );
}
