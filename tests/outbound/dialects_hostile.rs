//! How `Pushback` reads each rate-limit dialect (`X-RateLimit-*` and the older drafts', OpenAI's,
//! Anthropic's), attacked from its module docs ("What is read", "How calls are held", "Hostile
//! answers"): exact holds computed independently of the crate for well-formed values, boundary
//! magnitudes, dates against the `Date` field, tokens against requests, and hostile bytes. Time
//! is a `ManualClock`; nothing sleeps.

use std::time::Duration;

use super::dialects_support::*;

// ---------------------------------------------------------------------------------------------
// X-RateLimit-*, RateLimit-Remaining / -Reset.

/// `X-RateLimit-Reset-After` is decimal seconds and preferred to `X-RateLimit-Reset`, whether
/// shorter or longer.
#[test]
fn x_ratelimit_reset_after_is_decimal_and_preferred() {
    let cases: &[(&[(&str, &str)], Duration)] = &[
        (&[("x-ratelimit-reset-after", "64.57")], MS(64_570)),
        (&[("x-ratelimit-reset-after", "0.000000001")], NS(1)),
        (&[("x-ratelimit-reset-after", "2")], S(2)),
        (
            &[
                ("x-ratelimit-reset-after", "5"),
                ("x-ratelimit-reset", "1000000100"),
            ],
            S(5),
        ),
        (
            &[
                ("x-ratelimit-reset-after", "200"),
                ("x-ratelimit-reset", "1000000100"),
            ],
            S(200),
        ),
        (
            &[
                ("x-ratelimit-reset", "1000000100"),
                ("x-ratelimit-reset-after", "5"),
            ],
            S(5),
        ),
        (
            &[("x-ratelimit-reset-after", "9".repeat(40).leak())],
            TEN_MIN,
        ),
    ];
    for (fields, expected) in cases {
        let mut headers = vec![("date", D1E9), ("x-ratelimit-remaining", "0")];
        headers.extend_from_slice(fields);
        assert_eq!(held(200, &headers), *expected, "{fields:?}");
    }
    // 30 digits of fraction: somewhere in the nanosecond it names.
    let value = "1.000000000000000000000000000001";
    let held = held(
        200,
        &[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset-after", value),
        ],
    );
    assert!(held == S(1) || held == S(1) + NS(1), "{value}: {held:?}");
}

/// Resets of each magnitude, exactly, against `Date` = 10^9 and a cap high enough to see the
/// value: below 10^9 seconds from now, from 10^9 a Unix time in seconds, from 10^12 one in
/// milliseconds, with or without a fraction.
#[test]
fn reset_magnitudes_exactly() {
    let cases: &[(&str, Duration)] = &[
        ("0", Duration::ZERO),
        ("30", S(30)),
        ("1.5", MS(1_500)),
        ("999999999", S(999_999_999)),
        ("999999999.5", S(999_999_999) + MS(500)),
        ("1000000000", Duration::ZERO),
        ("1000000045", S(45)),
        ("999999999999", SATURATED),
        ("1000000000000", Duration::ZERO),
        ("1000000045000", S(45)),
        ("1000000045.000", S(45)),
        ("999999999999000", SATURATED),
        ("0999999999", S(999_999_999)),
    ];
    for (reset, expected) in cases {
        for (remaining, reset_field) in [
            ("x-ratelimit-remaining", "x-ratelimit-reset"),
            ("ratelimit-remaining", "ratelimit-reset"),
        ] {
            let held = held_with(
                HUGE,
                200,
                &[("date", D1E9), (remaining, "0"), (reset_field, reset)],
            );
            if *expected == SATURATED {
                assert_cut(held, HUGE, &format!("{reset_field}: {reset}"));
            } else {
                assert_eq!(held, *expected, "{reset_field}: {reset}");
            }
        }
    }
}

/// Resets as Go durations from now, in both families of fields.
#[test]
fn resets_as_go_durations() {
    for (reset, expected) in &go_durations()[..4] {
        for (remaining, reset_field) in [
            ("x-ratelimit-remaining", "x-ratelimit-reset"),
            ("ratelimit-remaining", "ratelimit-reset"),
        ] {
            assert_eq!(
                held_with(HUGE, 200, &[(remaining, "0"), (reset_field, reset)]),
                *expected,
                "{reset_field}: {reset}"
            );
        }
    }
}

/// A Unix time in the past holds nothing; without `Date` a reset is read against the system
/// time.
#[test]
fn unix_resets_without_a_date_field() {
    let soon = (now_unix() + 90).to_string();
    let held_s = held(
        200,
        &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", &soon)],
    );
    assert!(about(held_s, S(90)), "{held_s:?}");
    let soon_ms = format!("{}500", now_unix() + 90);
    let held_ms = held(
        200,
        &[("ratelimit-remaining", "0"), ("ratelimit-reset", &soon_ms)],
    );
    assert!(about(held_ms, MS(90_500)), "{held_ms:?}");
    assert_eq!(
        held(
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1000000000")
            ]
        ),
        Duration::ZERO
    );
}

/// A `Date` far from the system clock: a Unix reset is read against it, not against the
/// system time, both in 1990s and in 2100s.
#[test]
fn unix_resets_against_a_skewed_date_field() {
    for date_unix in [1_000_000_000i64, 1_500_000_000, 4_102_444_800] {
        let date = http_date(date_unix);
        let reset = (date_unix + 77).to_string();
        let reset_ms = format!("{}000", date_unix + 77);
        assert_eq!(
            held(
                200,
                &[
                    ("date", &date),
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", &reset)
                ]
            ),
            S(77),
            "{date}"
        );
        assert_eq!(
            held(
                200,
                &[
                    ("date", &date),
                    ("ratelimit-remaining", "0"),
                    ("ratelimit-reset", &reset_ms)
                ]
            ),
            S(77),
            "{date} ms"
        );
    }
}

/// Malformed remaining or reset values hold nothing and panic nowhere.
#[test]
fn malformed_x_ratelimit_values_are_ignored() {
    let bad = [
        "", "-1", "-0.5", "+5", "NaN", "nan", "inf", "-inf", "1e3", "٥", "５", "0x10", ".", "1..5",
        "5,5", "s", "ms", "1x", "--1", "1 2",
    ];
    for value in bad {
        assert_eq!(
            held(
                200,
                &[
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset-after", value)
                ]
            ),
            Duration::ZERO,
            "reset-after {value:?}"
        );
        assert_eq!(
            held(
                200,
                &[
                    ("x-ratelimit-remaining", value),
                    ("x-ratelimit-reset", "30")
                ]
            ),
            Duration::ZERO,
            "remaining {value:?}"
        );
    }
}

/// A `Reset-After` that cannot be read is ignored: the `Reset` beside it still counts.
#[test]
fn an_unreadable_reset_after_leaves_the_reset_to_count() {
    for value in ["abc", "-5", "NaN", ""] {
        let held = held(
            200,
            &[
                ("date", D1E9),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset-after", value),
                ("x-ratelimit-reset", "1000000045"),
            ],
        );
        assert_eq!(held, S(45), "reset-after {value:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// OpenAI.

/// Go durations and the spans they write, to the nanosecond.
fn go_durations() -> Vec<(&'static str, Duration)> {
    vec![
        ("1s", S(1)),
        ("6m0s", S(360)),
        ("20ms", MS(20)),
        ("1h2m3.5s", MS(3_723_500)),
        ("0.5s", MS(500)),
        ("1m", S(60)),
        ("2h", S(7_200)),
        ("1.5h", S(5_400)),
        ("1.5m", S(90)),
        ("100us", Duration::from_micros(100)),
        ("100µs", Duration::from_micros(100)),
        ("7ns", NS(7)),
        ("1h0m0s", S(3_600)),
        ("2h45m", S(9_900)),
        ("1m30.25s", MS(90_250)),
        ("0s", Duration::ZERO),
        ("0", Duration::ZERO),
        ("1.000000001s", S(1) + NS(1)),
        ("3s500ms", MS(3_500)),
        (
            "1s1ms1us1ns",
            S(1) + MS(1) + Duration::from_micros(1) + NS(1),
        ),
    ]
}

/// Go durations, to the nanosecond, in either OpenAI family.
#[test]
fn openai_go_durations_exactly() {
    for (reset, expected) in go_durations() {
        for family in ["requests", "tokens"] {
            let remaining = format!("x-ratelimit-remaining-{family}");
            let reset_field = format!("x-ratelimit-reset-{family}");
            assert_eq!(
                held_with(HUGE, 200, &[(&remaining, "0"), (&reset_field, reset)]),
                expected,
                "{reset_field}: {reset}"
            );
        }
    }
}

/// A Go duration beyond any integer is cut to `max_hold`.
#[test]
fn openai_huge_go_durations_are_cut_to_max_hold() {
    let cases = [
        "99999999999999999999h".to_string(),
        "2562047h47m16.854775808s".to_string(),
        "9223372036854775807ns".to_string(),
        "18446744073709551616s".to_string(),
        format!("{}m", "9".repeat(40)),
        "999999999h999999999m".to_string(),
    ];
    for reset in &cases {
        for max_hold in [Duration::ZERO, TEN_MIN, Duration::MAX] {
            let held = held_with(
                max_hold,
                200,
                &[
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", reset),
                ],
            );
            if max_hold == Duration::MAX {
                assert!(held >= S(1 << 33), "{reset}: {held:?}");
            } else {
                assert_eq!(held, max_hold, "{reset} / {max_hold:?}");
            }
        }
    }
}

/// Not Go durations: a sign, no number, no unit between numbers, unknown units, other digits.
#[test]
fn openai_malformed_durations_hold_nothing() {
    let bad = [
        "", "s", "ms", "h", "-1s", "+1s", "1x", "1S", "1H", "1sec", "1 s", "1h1", "h1", "NaN",
        "NaNs", "infs", "1e3s", "١s", "１s", "1..5s", "1.5.5s", "µs", "1µ", "1m-1s", "--1s", ".s",
    ];
    for reset in bad {
        let held = held(
            200,
            &[
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", reset),
            ],
        );
        assert_eq!(held, Duration::ZERO, "{reset:?}");
    }
}

/// "the tokens hold calls once spent": tokens left never hold calls, however few; requests
/// left let that many calls go within their window, then a refusal names its end exactly.
#[test]
fn openai_tokens_against_requests() {
    let (pushback, _) = make(TEN_MIN);
    pushback.observe(&answer_str(
        200,
        &[
            ("x-ratelimit-remaining-tokens", "1"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ],
    ));
    for i in 0..50 {
        assert_eq!(call(&pushback), Ok(()), "call {i} with one token left");
    }

    let (pushback, clock) = make(TEN_MIN);
    pushback.observe(&answer_str(
        200,
        &[
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-reset-requests", "10s"),
            ("x-ratelimit-remaining-tokens", "1000"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ],
    ));
    clock.advance(S(2));
    for i in 0..3 {
        assert_eq!(call(&pushback), Ok(()), "call {i} of 3");
    }
    assert_eq!(call(&pushback), Err(S(8)));
    assert_eq!(refusal_is_exact(&pushback, &clock), Ok(true));

    let (pushback, _) = make(TEN_MIN);
    pushback.observe(&answer_str(
        200,
        &[
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-reset-requests", "10s"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ],
    ));
    assert_eq!(call(&pushback), Err(S(360)), "tokens spent");
}

// ---------------------------------------------------------------------------------------------
// Anthropic.

/// RFC 3339 resets against `Date` = 10^9 (45 s later), in every offset and with fractions.
#[test]
fn anthropic_rfc3339_resets_exactly() {
    let at = 1_000_000_045;
    let mut cases: Vec<(String, Duration)> = vec![
        (rfc3339(at, "", 0), S(45)),
        (rfc3339(at, "", 60), S(45)),
        (rfc3339(at, "", -300), S(45)),
        (rfc3339(at, "", 23 * 60 + 59), S(45)),
        (rfc3339(at, "", -(23 * 60 + 59)), S(45)),
        (rfc3339(1_000_000_000, "", 0), Duration::ZERO),
        (rfc3339(999_999_000, "", 0), Duration::ZERO),
        ("9999-12-31T23:59:59Z".into(), TEN_MIN),
        ("1969-12-31T23:59:59Z".into(), Duration::ZERO),
        ("0000-01-01T00:00:00Z".into(), Duration::ZERO),
        ("2001-09-09T01:47:25+00:00".into(), S(45)),
        ("2001-09-09T01:47:25-00:00".into(), S(45)),
    ];
    cases.push((rfc3339(at, ".000", 330), S(45)));
    for (reset, expected) in &cases {
        let held = held(
            200,
            &[
                ("date", D1E9),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", reset),
            ],
        );
        assert_eq!(held, *expected, "{reset}");
    }
}

/// RFC 3339 section 5.6: "T" and "Z" may be lower case.
#[test]
fn anthropic_rfc3339_lower_case_t_and_z() {
    for reset in [
        "2001-09-09t01:47:25z",
        "2001-09-09t01:47:25Z",
        "2001-09-09T01:47:25z",
    ] {
        let held = held(
            200,
            &[
                ("date", D1E9),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", reset),
            ],
        );
        assert_eq!(held, S(45), "{reset}");
    }
}

/// Across a leap day, against a `Date` on it.
#[test]
fn anthropic_rfc3339_across_a_leap_day() {
    let cases = [
        (
            "Thu, 29 Feb 2024 23:59:30 GMT",
            "2024-03-01T00:00:15Z",
            S(45),
        ),
        (
            "Wed, 28 Feb 2024 23:59:30 GMT",
            "2024-02-29T00:00:15Z",
            S(45),
        ),
        (
            "Wed, 28 Feb 2024 23:59:30 GMT",
            "2024-02-29T23:59:30Z",
            S(86_400),
        ),
        (
            "Tue, 28 Feb 2023 23:59:30 GMT",
            "2023-03-01T00:00:15Z",
            S(45),
        ),
        (
            "Mon, 28 Feb 2000 23:59:30 GMT",
            "2000-02-29T00:00:15Z",
            S(45),
        ),
    ];
    for (date, reset, expected) in cases {
        let held = held_with(
            HUGE,
            200,
            &[
                ("date", date),
                ("anthropic-ratelimit-tokens-remaining", "0"),
                ("anthropic-ratelimit-tokens-reset", reset),
            ],
        );
        assert_eq!(held, expected, "{date} / {reset}");
    }
}

/// Times RFC 3339 does not allow, or that do not exist, are ignored.
#[test]
fn anthropic_impossible_times_are_ignored() {
    let bad = [
        "2001-02-29T01:47:25Z",
        "2100-02-29T01:47:25Z",
        "2001-09-31T01:47:25Z",
        "2001-09-00T01:47:25Z",
        "2001-13-09T01:47:25Z",
        "2001-00-09T01:47:25Z",
        "2001-09-09T24:00:00Z",
        "2001-09-09T01:60:25Z",
        "2001-09-09T01:47:61Z",
        "2001-09-09T01:47:25+24:00",
        "2001-09-09T01:47:25+23:60",
        "2001-09-09T01:47:25",
        "2001-09-09T01:47Z",
        "2001-9-9T1:47:25Z",
        "2001-09-09T01:47:25.Z",
        "+2001-09-09T01:47:25Z",
        "2001-09-09T01:47:25ZZ",
        "2001-09-09T01:47:25+0100",
        "２００１-09-09T01:47:25Z",
        "2001-09-09T01:47:25 Z",
        "20010909T014725Z",
        "",
        "1000000045",
    ];
    for reset in bad {
        let held = held(
            200,
            &[
                ("date", D1E9),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", reset),
            ],
        );
        assert_eq!(held, Duration::ZERO, "{reset:?}");
    }
}

/// Each family of tokens holds calls only once spent; requests left let that many go.
#[test]
fn anthropic_token_families_against_requests() {
    for family in ["tokens", "input-tokens", "output-tokens"] {
        let remaining = format!("anthropic-ratelimit-{family}-remaining");
        let reset = format!("anthropic-ratelimit-{family}-reset");
        let (pushback, _) = make(TEN_MIN);
        pushback.observe(&answer_str(
            200,
            &[
                ("date", D1E9),
                (&remaining, "1"),
                (&reset, "2001-09-09T01:47:25Z"),
            ],
        ));
        for i in 0..20 {
            assert_eq!(call(&pushback), Ok(()), "{family}: call {i} with one left");
        }
        let (pushback, clock) = make(TEN_MIN);
        pushback.observe(&answer_str(
            200,
            &[
                ("date", D1E9),
                (&remaining, "0"),
                (&reset, "2001-09-09T01:47:25Z"),
            ],
        ));
        assert_eq!(call(&pushback), Err(S(45)), "{family} spent");
        assert_eq!(refusal_is_exact(&pushback, &clock), Ok(true), "{family}");
    }
    let (pushback, clock) = make(TEN_MIN);
    pushback.observe(&answer_str(
        200,
        &[
            ("date", D1E9),
            ("anthropic-ratelimit-requests-remaining", "2"),
            ("anthropic-ratelimit-requests-reset", "2001-09-09T01:46:50Z"),
            ("anthropic-ratelimit-tokens-remaining", "5000"),
            ("anthropic-ratelimit-tokens-reset", "2001-09-09T01:50:00Z"),
        ],
    ));
    assert_eq!(call(&pushback), Ok(()));
    assert_eq!(call(&pushback), Ok(()));
    assert_eq!(call(&pushback), Err(S(10)));
    assert_eq!(refusal_is_exact(&pushback, &clock), Ok(true));
}
