//! How `Pushback` reads `Retry-After` and `retry-after-ms`, attacked from its module docs:
//! decimal seconds to the nanosecond, dates against the `Date` field, the 403 rule, boundary
//! magnitudes, several lines, and the size limits of every dialect's fields. Time is a
//! `ManualClock`; nothing sleeps.

use std::time::Duration;

use super::dialects_support::*;

// ---------------------------------------------------------------------------------------------
// Retry-After.

/// "decimal ones too, `2.0`, rounded up to the nanosecond".
#[test]
fn retry_after_decimal_seconds_round_up_to_the_nanosecond() {
    let cases: &[(&str, Duration)] = &[
        ("2.0", S(2)),
        ("1.5", MS(1_500)),
        ("0.123456789", NS(123_456_789)),
        ("0.0000000001", NS(1)),
        ("1.9999999999", S(2)),
        ("1.000000000000000000000000000001", S(1) + NS(1)),
        ("0.000000000000000000000000000000", Duration::ZERO),
        ("3.000000000000000000000000000000", S(3)),
    ];
    for (value, expected) in cases {
        for status in [429, 503] {
            assert_eq!(
                held(status, &[("retry-after", value)]),
                *expected,
                "{status} Retry-After: {value}"
            );
        }
    }
}

/// Delta-seconds are `1*DIGIT`: leading zeros do not make a number longer.
#[test]
fn retry_after_leading_zeros_are_the_same_seconds() {
    let forty = format!("{}7", "0".repeat(39));
    assert_eq!(held(503, &[("retry-after", &forty)]), S(7), "{forty}");
    let with_fraction = format!("{}7.25", "0".repeat(36));
    assert_eq!(held(503, &[("retry-after", &with_fraction)]), MS(7_250));
}

/// A zero `Retry-After` on a 429 is a time: it holds nothing, not the one second of a 429
/// without one.
#[test]
fn retry_after_zero_holds_nothing() {
    for value in ["0", "0.0", "000"] {
        assert_eq!(
            held(429, &[("retry-after", value)]),
            Duration::ZERO,
            "{value}"
        );
    }
    assert_eq!(held(429, &[]), S(1), "a bare 429");
}

/// "a longer Retry-After ... is cut to it": 40 digits, past u64, with 30 digits of fraction,
/// for every `max_hold` from zero to `Duration::MAX`.
#[test]
fn retry_after_beyond_any_integer_is_cut_to_max_hold() {
    let values = [
        "9".repeat(40),
        "18446744073709551616".to_string(),
        "18446744073709551615".to_string(),
        "9223372036854775808".to_string(),
        format!("{}.{}", "9".repeat(40), "9".repeat(30)),
        "18446744073709551615.999999999999".to_string(),
    ];
    for max_hold in [Duration::ZERO, S(1), TEN_MIN, HUGE, Duration::MAX] {
        for value in &values {
            for status in [429, 503] {
                assert_cut(
                    held_with(max_hold, status, &[("retry-after", value)]),
                    max_hold,
                    &format!("{status} Retry-After: {value}, max_hold {max_hold:?}"),
                );
            }
        }
    }
}

/// HTTP-dates are read against the response's `Date`, exactly, however far it is from the
/// system clock; across a leap day; one in the past holds nothing; impossible dates are
/// ignored (a 503 has no fallback).
#[test]
fn retry_after_dates_against_the_date_field() {
    let cases: &[(&str, &str, Duration)] = &[
        (D1E9, "Sun, 09 Sep 2001 01:47:10 GMT", S(30)),
        (D1E9, D1E9, Duration::ZERO),
        (D1E9, "Sun, 09 Sep 2001 01:46:10 GMT", Duration::ZERO),
        (
            "Thu, 29 Feb 2024 23:59:30 GMT",
            "Fri, 01 Mar 2024 00:00:15 GMT",
            S(45),
        ),
        (
            "Wed, 28 Feb 2024 23:59:30 GMT",
            "Thu, 29 Feb 2024 00:00:15 GMT",
            S(45),
        ),
        (
            "Thu, 31 Dec 1998 23:59:50 GMT",
            "Fri, 01 Jan 1999 00:00:10 GMT",
            S(20),
        ),
        (D1E9, "Fri, 31 Dec 9999 23:59:59 GMT", TEN_MIN),
        (D1E9, "Wed, 31 Dec 1969 23:59:59 GMT", Duration::ZERO),
        (D1E9, "Thu, 01 Jan 1970 00:00:00 GMT", Duration::ZERO),
        (D1E9, "Fri, 30 Feb 2024 00:00:00 GMT", Duration::ZERO),
        (D1E9, "Sun, 09 Sep 2001 24:00:00 GMT", Duration::ZERO),
        (D1E9, "Sun, 09 Sep 2001 01:46:61 GMT", Duration::ZERO),
        (D1E9, "Sun, 32 Sep 2001 01:46:40 GMT", Duration::ZERO),
    ];
    for (date, retry_after, expected) in cases {
        assert_eq!(
            held(503, &[("date", date), ("retry-after", retry_after)]),
            *expected,
            "Date: {date}, Retry-After: {retry_after}"
        );
    }
}

/// Without a `Date`, or with one that does not parse, a date is read against the system time.
#[test]
fn retry_after_date_without_a_readable_date_field_uses_the_system_time() {
    let soon = http_date(now_unix() as i64 + 30);
    for date in [
        None,
        Some("yesterday"),
        Some("Sun, 31 Feb 2001 01:46:40 GMT"),
        Some(""),
    ] {
        let mut headers = vec![("retry-after", soon.as_str())];
        if let Some(date) = date {
            headers.push(("date", date));
        }
        let held = held(429, &headers);
        assert!(about(held, S(30)), "Date {date:?}: held {held:?}");
    }
}

/// `Retry-After` counts on a 429 and a 503, on a 403 only with rate-limit fields, and on no
/// other status.
#[test]
fn retry_after_only_on_429_503_and_a_rate_limited_403() {
    for status in [200, 201, 301, 400, 401, 404, 408, 500, 502, 504] {
        assert_eq!(
            held(status, &[("retry-after", "60")]),
            Duration::ZERO,
            "{status}"
        );
        assert_eq!(
            held(status, &[("retry-after-ms", "60000")]),
            Duration::ZERO,
            "{status} retry-after-ms"
        );
    }
    assert_eq!(
        held(403, &[("retry-after", "60")]),
        Duration::ZERO,
        "a bare 403"
    );
    assert_eq!(
        held(403, &[("retry-after-ms", "60000")]),
        Duration::ZERO,
        "a bare 403 with retry-after-ms"
    );
    assert_eq!(held(429, &[("retry-after", "60")]), S(60));
    assert_eq!(held(503, &[("retry-after", "60")]), S(60));
}

/// A 403 with `Retry-After` and the rate-limit fields of each documented dialect (none of them
/// spent): the `Retry-After` holds.
#[test]
fn retry_after_on_a_403_with_each_dialects_fields() {
    let families: &[&[(&str, &str)]] = &[
        &[
            ("x-ratelimit-remaining", "4999"),
            ("x-ratelimit-reset", "30"),
        ],
        &[
            ("x-ratelimit-remaining", "4999"),
            ("x-ratelimit-reset-after", "30"),
        ],
        &[("ratelimit-remaining", "59"), ("ratelimit-reset", "30")],
        &[("ratelimit", "\"default\";r=50;t=30")],
        &[
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "1s"),
        ],
        &[
            ("anthropic-ratelimit-requests-remaining", "59"),
            ("anthropic-ratelimit-requests-reset", "2001-09-09T01:47:40Z"),
            ("date", D1E9),
        ],
    ];
    for fields in families {
        let mut headers = fields.to_vec();
        headers.push(("retry-after", "60"));
        assert_eq!(held(403, &headers), S(60), "{fields:?}");
        let mut headers = fields.to_vec();
        headers.push(("retry-after", "60"));
        headers.push(("retry-after-ms", "20"));
        assert_eq!(held(403, &headers), MS(20), "retry-after-ms, {fields:?}");
    }
}

/// `retry-after-ms` counts instead of `Retry-After` when readable, to the millisecond, whether
/// it is shorter, longer or zero; alone it is a time, not the one second of a bare 429.
#[test]
fn retry_after_ms_counts_instead_when_readable() {
    let cases: &[Expected] = &[
        (
            429,
            &[("retry-after", "60"), ("retry-after-ms", "20")],
            MS(20),
        ),
        (
            503,
            &[("retry-after", "60"), ("retry-after-ms", "20")],
            MS(20),
        ),
        (
            429,
            &[("retry-after", "1"), ("retry-after-ms", "5000")],
            MS(5_000),
        ),
        (
            429,
            &[("retry-after-ms", "20"), ("retry-after", "60")],
            MS(20),
        ),
        (429, &[("retry-after-ms", "1500")], MS(1_500)),
        (429, &[("retry-after-ms", "0")], Duration::ZERO),
        (
            429,
            &[("retry-after", "60"), ("retry-after-ms", "0")],
            Duration::ZERO,
        ),
        (
            429,
            &[
                ("retry-after", D1E9),
                ("date", D1E9),
                ("retry-after-ms", "250"),
            ],
            MS(250),
        ),
        (
            503,
            &[("retry-after-ms", "000000000000000000000000000000042")],
            MS(42),
        ),
    ];
    for (status, headers, expected) in cases {
        assert_eq!(held(*status, headers), *expected, "{status} {headers:?}");
    }
}

/// A `retry-after-ms` that cannot be read leaves `Retry-After` to count.
#[test]
fn unreadable_retry_after_ms_leaves_retry_after_to_count() {
    for ms in [
        "", "abc", "-5", "+5", "1e3", "NaN", "٥", "5 ms", "0x10", "5,5", "inf",
    ] {
        let headers = [("retry-after", "7"), ("retry-after-ms", ms)];
        assert_eq!(held(503, &headers), S(7), "retry-after-ms: {ms:?}");
    }
}

/// A `retry-after-ms` beyond any integer is cut to `max_hold`.
#[test]
fn huge_retry_after_ms_is_cut_to_max_hold() {
    for ms in [
        "9".repeat(40),
        "18446744073709551616".into(),
        "18446744073709551615".into(),
    ] {
        for max_hold in [Duration::ZERO, TEN_MIN, Duration::MAX] {
            assert_cut(
                held_with(max_hold, 429, &[("retry-after-ms", &ms)]),
                max_hold,
                &format!("{ms} / {max_hold:?}"),
            );
        }
    }
}

/// "Several `Retry-After` lines are not an error: the longest counts", a date against seconds
/// too; a malformed line among them is ignored.
#[test]
fn several_retry_after_lines_the_longest_counts() {
    let cases: &[(&[&str], Duration)] = &[
        (&["5", "30", "10"], S(30)),
        (&["5", "Sun, 09 Sep 2001 01:47:10 GMT"], S(30)),
        (&["Sun, 09 Sep 2001 01:47:10 GMT", "45"], S(45)),
        (&["abc", "5"], S(5)),
        (&["5", "-100"], S(5)),
        (&["5", "9999999999999999999999"], TEN_MIN),
    ];
    for (lines, expected) in cases {
        let mut headers = vec![("date", D1E9)];
        for line in *lines {
            headers.push(("retry-after", line));
        }
        assert_eq!(held(503, &headers), *expected, "{lines:?}");
    }
}

/// A `Retry-After` of 4 096 bytes is read, and one of two lines of 2 047 (4 096 with the
/// ", " that joins them); 16 lines are read. (Over the limits: the ignored tests below.)
#[test]
fn retry_after_within_4_kib_and_16_lines_is_read() {
    let long = |bytes: usize| format!("{}9", "0".repeat(bytes - 1));
    assert_eq!(
        held(503, &[("retry-after", &long(4_096))]),
        S(9),
        "4 096 bytes"
    );
    let (a, b) = (long(2_047), long(2_047));
    assert_eq!(
        held(503, &[("retry-after", &a), ("retry-after", &b)]),
        S(9),
        "2 x 2 047"
    );
    let lines: Vec<String> = (1..=16).map(|s| s.to_string()).collect();
    let headers: Vec<(&str, &str)> = lines.iter().map(|l| ("retry-after", l.as_str())).collect();
    assert_eq!(held(503, &headers), S(16), "16 lines");
}

/// "fields ... of more than 16 lines are ignored": 17 lines of `Retry-After: 100` on a 503.
#[test]
fn retry_after_of_more_than_16_lines_is_ignored() {
    let headers = vec![("retry-after", "100"); 17];
    assert_eq!(held(503, &headers), Duration::ZERO, "17 x 100");
    let mut headers = vec![("retry-after", "1"); 16];
    headers.push(("retry-after", "100"));
    assert_eq!(held(503, &headers), Duration::ZERO, "16 x 1, then 100");
}

/// The same for `retry-after-ms`: ignored, so the `Retry-After` beside it counts.
#[test]
fn retry_after_ms_of_more_than_16_lines_is_ignored() {
    let mut headers = vec![("retry-after", "1")];
    headers.extend(std::iter::repeat_n(("retry-after-ms", "30000"), 17));
    assert_eq!(held(503, &headers), S(1));
}

/// Every quota field of 17 lines is ignored (on a 200, where nothing else holds).
#[test]
fn quota_fields_of_more_than_16_lines_are_ignored() {
    for (field, value, other, other_value) in quota_fields() {
        let mut headers = vec![("date", D1E9), (other, other_value.as_str())];
        headers.extend(std::iter::repeat_n((field, value.as_str()), 17));
        assert_eq!(held(200, &headers), Duration::ZERO, "17 lines of {field}");
        let mut headers = vec![("date", D1E9), (other, other_value.as_str())];
        headers.extend(std::iter::repeat_n((field, value.as_str()), 1));
        assert_eq!(held(200, &headers), S(30), "1 line of {field}");
    }
}

/// Each quota field with the field beside it that makes a 30 s hold, against `Date` = 10^9:
/// (field, value, other field, its value).
fn quota_fields() -> Vec<(&'static str, String, &'static str, String)> {
    let pairs: [(&str, &str, &str, &str); 8] = [
        (
            "x-ratelimit-remaining",
            "0",
            "x-ratelimit-reset-after",
            "30",
        ),
        (
            "x-ratelimit-reset-after",
            "30",
            "x-ratelimit-remaining",
            "0",
        ),
        ("ratelimit-remaining", "0", "ratelimit-reset", "30"),
        ("ratelimit-reset", "30", "ratelimit-remaining", "0"),
        (
            "x-ratelimit-remaining-requests",
            "0",
            "x-ratelimit-reset-requests",
            "30s",
        ),
        (
            "x-ratelimit-reset-tokens",
            "30s",
            "x-ratelimit-remaining-tokens",
            "0",
        ),
        (
            "anthropic-ratelimit-requests-remaining",
            "0",
            "anthropic-ratelimit-requests-reset",
            "2001-09-09T01:47:10Z",
        ),
        (
            "anthropic-ratelimit-output-tokens-reset",
            "2001-09-09T01:47:10Z",
            "anthropic-ratelimit-output-tokens-remaining",
            "0",
        ),
    ];
    let mut fields: Vec<_> = pairs
        .iter()
        .map(|(f, v, o, ov)| (*f, v.to_string(), *o, ov.to_string()))
        .collect();
    fields.push((
        "x-ratelimit-reset",
        "1000000030".into(),
        "x-ratelimit-remaining",
        "0".into(),
    ));
    fields
}

/// A value padded to `bytes` and still well-formed: leading zeros for numbers and Go
/// durations, trailing zeros of the fraction for RFC 3339 times.
fn padded(value: &str, bytes: usize) -> String {
    let pad = bytes - value.len();
    if let Some(head) = value.strip_suffix('Z') {
        format!("{head}.{}Z", "0".repeat(pad - 1))
    } else {
        format!("{}{value}", "0".repeat(pad))
    }
}

/// "fields over 4 KiB ... are ignored", in every dialect: each field padded to 4 096 bytes is
/// read, to 4 097 it is ignored.
#[test]
fn fields_over_4_kib_are_ignored_in_every_dialect() {
    let mut read_when_too_long = Vec::new();
    for (field, value, other, other_value) in quota_fields() {
        for (bytes, expected) in [
            (4_096, S(30)),
            (4_097, Duration::ZERO),
            (8_000, Duration::ZERO),
        ] {
            let long = padded(&value, bytes);
            assert_eq!(long.len(), bytes);
            let got = held(
                200,
                &[("date", D1E9), (other, &other_value), (field, &long)],
            );
            if bytes == 4_096 {
                assert_eq!(got, expected, "{field} of 4 096 bytes");
            } else if got != expected {
                read_when_too_long.push(format!("{field} of {bytes} bytes held {got:?}"));
            }
        }
    }
    let long = |bytes: usize| format!("{}9", "0".repeat(bytes - 1));
    let got = held(503, &[("retry-after", &long(4_097))]);
    if got != Duration::ZERO {
        read_when_too_long.push(format!("retry-after of 4 097 bytes held {got:?}"));
    }
    let (a, b) = (long(2_048), long(2_048));
    let got = held(503, &[("retry-after", &a), ("retry-after", &b)]);
    if got != Duration::ZERO {
        read_when_too_long.push(format!(
            "retry-after of 2 lines of 2 048 bytes held {got:?}"
        ));
    }
    let long = padded("30000", 4_097);
    let got = held(503, &[("retry-after", "1"), ("retry-after-ms", &long)]);
    if got != S(1) {
        read_when_too_long.push(format!("retry-after-ms of 4 097 bytes held {got:?}"));
    }
    assert!(read_when_too_long.is_empty(), "{read_when_too_long:#?}");
}
