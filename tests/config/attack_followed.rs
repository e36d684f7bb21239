//! Attacks on the limits and backoffs a file leaves out, which now follow those it writes: an
//! `[overload.NAME]`'s `min_limit`, `initial_limit`, `max_limit` (defaults 8, 16, 1000), an
//! `[adaptive_bulkheads.NAME]`'s (1, 8, 256), and a `[retries.NAME]`'s `base` and `cap` (50 ms,
//! 1 s, the cap never beyond an hour). Every subset of the fields, at the bounds, in plain,
//! inline and dotted tables; what was built is read back (the overload's bounds through reloads,
//! which must take a value written out at what it was as no change, and refuse any other).

use std::time::Duration;

use tower_bulwark::config::{ConfigError, Registry, Reloaded};

const MAX: i64 = (1 << 31) - 1;
const NAMES: [&str; 3] = ["min_limit", "initial_limit", "max_limit"];
const OVERLOAD: [i64; 3] = [8, 16, 1000];
const ADAPTIVE: [i64; 3] = [1, 8, 256];

/// The limits the docs promise for `written` (`None`: left out) over `defaults`, each default
/// brought within the values written; `None` when the file must be refused (a value out of
/// `1..=2^31-1`, or two written out of order).
fn followed(defaults: [i64; 3], written: [Option<i64>; 3]) -> Option<[i64; 3]> {
    if written.iter().flatten().any(|v| !(1..=MAX).contains(v)) {
        return None;
    }
    let w: Vec<i64> = written.iter().flatten().copied().collect();
    if w.windows(2).any(|p| p[0] > p[1]) {
        return None;
    }
    let below = |i: usize| written[i + 1..].iter().flatten().copied();
    let above = |i: usize| written[..i].iter().flatten().copied();
    let min = written[0].unwrap_or_else(|| below(0).fold(defaults[0], i64::min));
    let max = written[2].unwrap_or_else(|| above(2).fold(defaults[2], i64::max));
    let initial = written[1].unwrap_or(defaults[1].clamp(min, max));
    Some([min, initial, max])
}

/// How a section writes its fields: `[kind.x]` then lines, `[kind]` then `x = { .. }`, or
/// `[kind]` then `x.field = ..` lines.
#[derive(Clone, Copy, Debug)]
enum Form {
    Table,
    Inline,
    Dotted,
}

/// The section `kind.x` with `fields` (name and value as written) in `form`.
fn section(kind: &str, form: Form, fields: &[(&str, String)]) -> String {
    match form {
        Form::Table => {
            let body: String = fields.iter().map(|(f, v)| format!("{f} = {v}\n")).collect();
            format!("[{kind}.x]\n{body}")
        }
        Form::Inline => {
            let body: Vec<String> = fields.iter().map(|(f, v)| format!("{f} = {v}")).collect();
            format!("[{kind}]\nx = {{ {} }}\n", body.join(", "))
        }
        Form::Dotted if fields.is_empty() => format!("[{kind}.x]\n"),
        Form::Dotted => {
            let body: String = (fields.iter())
                .map(|(f, v)| format!("x.{f} = {v}\n"))
                .collect();
            format!("[{kind}]\n{body}")
        }
    }
}

/// The line and column (from 1, in characters) of the value of `field` in `text`.
fn value_at(text: &str, field: &str) -> Option<(usize, usize)> {
    let needle = format!("{field} = ");
    text.split('\n').enumerate().find_map(|(i, line)| {
        let at = line.find(&needle)? + needle.len();
        Some((i + 1, line[..at].chars().count() + 1))
    })
}

/// `err` names field `field` of `kind.x` at its value in `text` (written there); the field.
fn assert_placed(text: &str, err: &ConfigError, kind: &str) -> String {
    let prefix = format!("{kind}.x.");
    let field = (err.path().strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("not a field of {kind}.x:\n{text}\n-> {err}"));
    let at = value_at(text, field);
    assert!(
        at.is_some(),
        "names {field}, which is not written:\n{text}\n-> {err}"
    );
    assert_eq!(err.position(), at, "not at the value:\n{text}\n-> {err}");
    field.to_owned()
}

/// The limits `registry` reads back for `kind` (the overload's initial limit only).
fn read_back(registry: &Registry, kind: &str) -> [Option<i64>; 3] {
    if kind == "overload" {
        return [
            None,
            Some(registry.overload("x").unwrap().limit() as i64),
            None,
        ];
    }
    let l = registry.adaptive_bulkhead("x").unwrap().limits();
    [l.min(), l.initial(), l.max()].map(|v| Some(v as i64))
}

/// A reload of `to` onto a registry of `from` is no change, and so is the reload back.
fn assert_same_settings(from: &str, to: &str) {
    for (a, b) in [(from, to), (to, from)] {
        let registry = Registry::from_toml_str(a).unwrap_or_else(|e| panic!("{a}\n-> {e}"));
        match registry.reload_toml_str(b) {
            Ok(reloaded) => assert_eq!(reloaded, Reloaded::default(), "{a}\n=>\n{b}"),
            Err(e) => {
                panic!("a reload that writes out what ran was refused:\n{a}\n=>\n{b}\n-> {e}")
            }
        }
    }
}

/// Checks one subset of the limits of `kind` written with `written` in `form`: built with the
/// promised limits, or refused at a written field that is out of range or out of order; the
/// promised limits written out are no change, and any other value of one of them is refused
/// naming one of the fields that changed.
fn check_limits(kind: &str, defaults: [i64; 3], form: Form, written: [Option<i64>; 3]) {
    let fields: Vec<(&str, String)> = (0..3)
        .filter_map(|i| written[i].map(|v| (NAMES[i], v.to_string())))
        .collect();
    let text = section(kind, form, &fields);
    let expected = followed(defaults, written);
    let registry = match (Registry::from_toml_str(&text), expected) {
        (Ok(registry), Some(_)) => registry,
        (Ok(registry), None) => {
            panic!("built {:?}:\n{text}", read_back(&registry, kind))
        }
        (Err(err), Some(e)) => panic!("refused where {e:?} was promised:\n{text}\n-> {err}"),
        (Err(err), None) => {
            let field = assert_placed(&text, &err, kind);
            let i = NAMES.iter().position(|n| *n == field).unwrap();
            let bad = |j: usize| written[j].is_some_and(|v| !(1..=MAX).contains(&v));
            let out: Vec<usize> = (0..3).filter(|&j| bad(j)).collect();
            if out.len() == 1 {
                assert_eq!(i, out[0], "not the one out of range:\n{text}\n-> {err}");
            }
            return;
        }
    };
    let e = expected.unwrap();
    for (read, promised) in read_back(&registry, kind).into_iter().zip(e) {
        if let Some(read) = read {
            assert_eq!(read, promised, "{text}");
        }
    }
    let all: Vec<(&str, String)> = (0..3).map(|i| (NAMES[i], e[i].to_string())).collect();
    assert_same_settings(&text, &section(kind, Form::Table, &all));
    // A field written, left out: no change where what follows is what was written, else refused.
    for i in (0..3).filter(|&i| written[i].is_some()) {
        let mut fewer = written;
        fewer[i] = None;
        let after = followed(defaults, fewer).unwrap();
        let kept: Vec<_> = fields.iter().filter(|f| f.0 != NAMES[i]).cloned().collect();
        let edited = section(kind, form, &kept);
        if after == e {
            assert_same_settings(&text, &edited);
        } else {
            let err = registry.reload_toml_str(&edited).expect_err(&edited);
            assert!(
                err.path().starts_with(&format!("{kind}.x.")),
                "{edited}\n-> {err}"
            );
            assert!(err.position().is_some(), "{edited}\n-> {err}");
        }
    }
    for i in (0..3).filter(|&i| written[i].is_none()) {
        let mut one = fields.clone();
        one.push((NAMES[i], e[i].to_string()));
        assert_same_settings(&text, &section(kind, form, &one));
        // Another value of the field left out, where the others allow it: refused.
        for other in [e[i] - 1, e[i] + 1] {
            let mut changed = written;
            changed[i] = Some(other);
            let Some(after) = followed(defaults, changed) else {
                continue;
            };
            let mut edited = fields.clone();
            edited.push((NAMES[i], other.to_string()));
            let edited = section(kind, form, &edited);
            let err = registry.reload_toml_str(&edited).expect_err(&edited);
            let moved: Vec<&str> = (0..3)
                .filter(|&j| e[j] != after[j])
                .map(|j| NAMES[j])
                .collect();
            let named = err.path().strip_prefix(&format!("{kind}.x.")).unwrap_or("");
            assert!(moved.contains(&named), "{text}\n=>\n{edited}\n-> {err}");
            assert!(err.position().is_some(), "{edited}\n-> {err}");
        }
    }
}

/// Every subset of the three limits of `kind`, single fields and pairs over `values`, the three
/// together over `triples`, each in one of the three forms.
fn every_subset(kind: &str, defaults: [i64; 3]) {
    let values = [
        0,
        -1,
        1,
        2,
        7,
        8,
        9,
        16,
        17,
        255,
        256,
        257,
        999,
        1000,
        1001,
        MAX - 1,
        MAX,
    ];
    let values = [&values[..], &[MAX + 1, i64::MAX]].concat();
    let forms = [Form::Table, Form::Inline, Form::Dotted];
    let mut n = 0;
    let mut check = |written| {
        n += 1;
        check_limits(kind, defaults, forms[n % 3], written);
    };
    check([None; 3]);
    for i in 0..3 {
        for &v in &values {
            let mut w = [None; 3];
            w[i] = Some(v);
            check(w);
        }
    }
    for (i, j) in [(0, 1), (0, 2), (1, 2)] {
        for &a in &values {
            for &b in &values {
                let mut w = [None; 3];
                (w[i], w[j]) = (Some(a), Some(b));
                check(w);
            }
        }
    }
    let triples = [0, 1, 8, 16, 1000, MAX, MAX + 1];
    for &a in &triples {
        for &b in &triples {
            for &c in &triples {
                check([Some(a), Some(b), Some(c)]);
            }
        }
    }
}

/// `src/config/mod.rs`, the overload table: "`min_limit`, `initial_limit`, `max_limit` |
/// integers, `1 <= min_limit <= initial_limit <= max_limit <= 2^31 - 1` [...] | 8, 16, 1000,
/// each brought within those written (`max_limit = 4` alone makes 4, 4, 4)"; the module: "values
/// out of range are errors that name the instance and the field, with its line and column";
/// CHANGELOG (2026-12-06, later): "where it was refused at `min_limit`, a field the file did not
/// have"; and `Registry::reload_path`: "An instance whose settings are unchanged is not touched
/// at all" (a default written out is no change), while any change to an overload protection is
/// refused naming the field.
#[test]
fn overload_limits_left_out_follow_those_written_in_every_subset() {
    every_subset("overload", OVERLOAD);
}

/// The same for an adaptive bulkhead: "`min_limit` | integer ≥ 1 | 1", "`initial_limit` |
/// integer from `min_limit` to `max_limit` | 8 (within the bounds)", "`max_limit` | integer ≥
/// `min_limit`, at most 2^31 − 1 | 256, or `min_limit` or `initial_limit` if higher".
#[test]
fn adaptive_bulkhead_limits_left_out_follow_those_written_in_every_subset() {
    every_subset("adaptive_bulkheads", ADAPTIVE);
}

/// The CHANGELOG's own example and the table's: "`max_limit = 4` alone is 4, 4, 4", read back
/// through the limit it starts at and the bounds that a reload writing them out finds
/// unchanged; and a reload that removes the one field written (back to 8, 16, 1000) is refused
/// at that instance, with a position.
#[test]
fn max_limit_four_alone_is_four_four_four() {
    let alone = "[overload.x]\nmax_limit = 4\n";
    let registry = Registry::from_toml_str(alone).unwrap();
    assert_eq!(registry.overload("x").unwrap().limit(), 4);
    let written = "[overload.x]\nmin_limit = 4\ninitial_limit = 4\nmax_limit = 4\n";
    assert_same_settings(alone, written);
    let err = registry.reload_toml_str("[overload.x]\n").unwrap_err();
    assert!(err.path().starts_with("overload.x."), "{err}");
    assert!(err.position().is_some(), "{err}");
    assert_eq!(
        registry.overload("x").unwrap().limit(),
        4,
        "a refusal changes nothing"
    );
}

/// The retry `base` and `cap` promised for `written` (`None`: left out), or `None` for a file
/// that must be refused: "`base`, `cap` | durations, `base <= cap <= 1h` [...] | `"50ms"`,
/// `"1s"`, each brought within the one written".
fn backoff(base: Option<Duration>, cap: Option<Duration>) -> Option<(Duration, Duration)> {
    let hour = Duration::from_secs(3600);
    let cap = cap.unwrap_or(base.map_or(Duration::from_secs(1), |b| b.max(Duration::from_secs(1))));
    let base = base.unwrap_or(cap.min(Duration::from_millis(50)));
    (base <= cap && cap <= hour).then_some((base, cap))
}

/// A duration as the file may write it: whole nanoseconds.
fn ns(d: Duration) -> String {
    format!("\"{}ns\"", d.as_nanos())
}

/// Retries built from `text` have `base` and `cap` (as their `Debug` shows them).
fn assert_backoff(text: &str, base: Duration, cap: Duration) {
    let registry = Registry::from_toml_str(text).unwrap_or_else(|e| panic!("{text}\n-> {e}"));
    let shown = format!("{:?}", registry.retry("x").unwrap());
    let want = format!("base: {base:?}, cap: {cap:?}");
    assert!(shown.contains(&want), "{text}\n-> {shown}, not {want}");
}

/// `src/config/mod.rs`, the retries table: "`base`, `cap` | durations, `base <= cap <= 1h` |
/// `"50ms"`, `"1s"`, each brought within the one written (`cap = "10ms"` alone makes `base` 10
/// ms; `base` above `"1s"` alone makes `cap` as long, up to an hour)". Every subset at the
/// bounds, in every form: built with the promised backoff (read back, and unchanged by a reload
/// that writes it out), or refused at a field the file writes, at its value; a reload that moves
/// the followed one is refused.
#[test]
fn a_retry_backoff_left_out_follows_the_one_written() {
    let d = |s: u64, n: u32| Duration::new(s, n);
    let values = [
        d(0, 0),
        d(0, 1),
        d(0, 9_999_999),
        d(0, 50_000_000),
        d(0, 50_000_001),
        d(1, 0),
        d(1, 1),
        d(59, 0),
        d(3599, 999_999_999),
        d(3600, 0),
        d(3600, 1),
        d(7200, 0),
    ];
    let forms = [Form::Table, Form::Inline, Form::Dotted];
    let mut cases: Vec<(Option<Duration>, Option<Duration>)> = vec![(None, None)];
    for &v in &values {
        cases.extend([(Some(v), None), (None, Some(v))]);
        cases.extend(values.iter().map(|&w| (Some(v), Some(w))));
    }
    for (n, (base, cap)) in cases.into_iter().enumerate() {
        let mut fields = Vec::new();
        fields.extend(base.map(|b| ("base", ns(b))));
        fields.extend(cap.map(|c| ("cap", ns(c))));
        let text = section("retries", forms[n % 3], &fields);
        match (Registry::from_toml_str(&text), backoff(base, cap)) {
            (Ok(_), Some((b, c))) => {
                assert_backoff(&text, b, c);
                let both = [("base", ns(b)), ("cap", ns(c))];
                assert_same_settings(&text, &section("retries", Form::Table, &both));
                for field in ["base", "cap"] {
                    let (left_out, was) = if field == "base" {
                        (base.is_none(), b)
                    } else {
                        (cap.is_none(), c)
                    };
                    let other = was + Duration::from_nanos(1);
                    let (nb, nc) = if field == "base" {
                        (Some(other), cap)
                    } else {
                        (base, Some(other))
                    };
                    if !left_out || backoff(nb, nc).is_none() {
                        continue;
                    }
                    let mut edited = fields.clone();
                    edited.push((field, ns(other)));
                    let edited = section("retries", Form::Table, &edited);
                    let registry = Registry::from_toml_str(&text).unwrap();
                    let err = registry.reload_toml_str(&edited).expect_err(&edited);
                    assert!(err.path().starts_with("retries.x."), "{edited}\n-> {err}");
                    assert!(err.position().is_some(), "{edited}\n-> {err}");
                }
            }
            (Ok(r), None) => panic!("built {:?}:\n{text}", r.retry("x").unwrap()),
            (Err(err), Some(b)) => panic!("refused where {b:?} was promised:\n{text}\n-> {err}"),
            (Err(err), None) => {
                assert_placed(&text, &err, "retries");
            }
        }
    }
}

/// The table's own examples, spelled as an operator writes them: `cap = "10ms"` alone makes
/// the base 10 ms; `base` above one second alone makes the cap as long, up to an hour (`"1h"`
/// exactly, and `"59m59s"`); a base beyond the hour alone is refused at the base.
#[test]
fn the_retry_examples_of_the_table() {
    let ms = Duration::from_millis;
    let s = Duration::from_secs;
    assert_backoff("[retries.x]\ncap = \"10ms\"\n", ms(10), ms(10));
    assert_backoff("[retries.x]\nbase = \"2s\"\n", s(2), s(2));
    assert_backoff("[retries.x]\nbase = \"1h\"\n", s(3600), s(3600));
    assert_backoff("[retries.x]\nbase = \"59m59s\"\n", s(3599), s(3599));
    assert_backoff("[retries.x]\nbase = \"1m30s\"\n", s(90), s(90));
    assert_backoff(
        "[retries.x]\ncap = \"1h\"\nbase = \"1ms\"\n",
        ms(1),
        s(3600),
    );
    assert_backoff("[retries.x]\ncap = \"1ms\"\n", ms(1), ms(1));
    assert_backoff("[retries.x]\nbase = \"0s\"\n", ms(0), s(1));
    assert_backoff("[retries.x]\n", ms(50), s(1));
    for text in [
        "[retries.x]\nbase = \"1h1ns\"\n",
        "[retries.x]\nbase = \"61m\"\n",
        "[retries.x]\ncap = \"1h1ns\"\n",
        "[retries.x]\nbase = \"2s\"\ncap = \"1s\"\n",
    ] {
        let err = Registry::from_toml_str(text).expect_err(text);
        assert_placed(text, &err, "retries");
    }
}

/// The module: "A duration must carry its unit [...] values out of range are errors that name
/// the instance and the field, with its line and column"; `Registry::from_toml_str`: never
/// anything but a `ConfigError`. Durations of absurd sizes for `base` and `cap`, written alone
/// (so that the other follows them) and beside the other: refused at the field written, no
/// panic.
#[test]
fn absurd_backoff_durations_are_refused_at_their_field() {
    let absurd = [
        "\"18446744073709551615s\"",
        "\"18446744073709551616s\"",
        "\"99999999999999999999h\"",
        "\"18446744073709551615ns\"",
        "\"5124095576030431h\"",
        "\"5124095576030432h\"",
        "\"307445734561825860m\"",
        "\"9223372036854775807s1ns\"",
        "\"1h1h1h\"",
        "\"-1s\"",
        "\"\"",
        "\"0\"",
        "10",
        "1.5",
    ];
    for value in absurd {
        for field in ["base", "cap"] {
            for other in ["", "base = \"1ms\"\n", "cap = \"1h\"\n"] {
                if other.starts_with(field) {
                    continue;
                }
                let text = format!("[retries.x]\n{other}{field} = {value}\n");
                let err = Registry::from_toml_str(&text).expect_err(&text);
                let named = assert_placed(&text, &err, "retries");
                assert_eq!(named, field, "{text}\n-> {err}");
            }
        }
    }
}

/// The module: errors "name the instance and the field, with its line and column". Beside
/// limits that follow one another, another field at fault is the one named (the limits rule
/// takes no other field for its own), and a limit at fault is named beside good fields.
#[test]
fn other_fields_at_fault_beside_followed_limits_are_named() {
    let cases = [
        (
            "overload",
            "max_limit = 4\nprobe_every = 0\n",
            "probe_every",
        ),
        (
            "overload",
            "probe_every = 0\nmin_limit = 2000\n",
            "probe_every",
        ),
        (
            "overload",
            "critical_guarantee = 1.0\ninitial_limit = 5\n",
            "critical_guarantee",
        ),
        (
            "overload",
            "max_limit = 4\nqueue_capacity = 0\nmax_wait = \"1s\"\n",
            "queue_capacity",
        ),
        (
            "overload",
            "max_limit = 4\nqueue_capacity = 2\nmax_wait = \"61s\"\n",
            "max_wait",
        ),
        ("overload", "probe_every = 5\nmax_limit = 0\n", "max_limit"),
        (
            "overload",
            "critical_borrowing = 2\nmin_limit = 2147483648\n",
            "min_limit",
        ),
        (
            "adaptive_bulkheads",
            "max_limit = 4\nprobe_every = 0\n",
            "probe_every",
        ),
        (
            "adaptive_bulkheads",
            "algorithm = \"nope\"\nmin_limit = 300\n",
            "algorithm",
        ),
        (
            "adaptive_bulkheads",
            "probe_every = 3\ninitial_limit = 0\n",
            "initial_limit",
        ),
        ("retries", "cap = \"10ms\"\nwindow = \"1ms\"\n", "window"),
        (
            "retries",
            "max_attempts = 0\nbase = \"2s\"\n",
            "max_attempts",
        ),
        ("retries", "max_wait = \"1h\"\nbase = \"2h\"\n", "base"),
    ];
    for (kind, body, field) in cases {
        let text = format!("[{kind}.x]\n{body}");
        let err = Registry::from_toml_str(&text).expect_err(&text);
        assert_eq!(assert_placed(&text, &err, kind), field, "{text}\n-> {err}");
    }
}
