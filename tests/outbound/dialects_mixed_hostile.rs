//! How `Pushback` reads several rate-limit dialects in one answer, and properties over hostile
//! answers of every dialect. Time is a `ManualClock`; nothing sleeps.

use std::time::Duration;

use http::{HeaderValue, Response};
use proptest::prelude::*;

use super::dialects_support::*;

// ---------------------------------------------------------------------------------------------
// Several dialects in one answer.

/// "Of all the quotas read, the most restrictive counts (the fewest calls left, and of those
/// the longest window)", and a `Retry-After` beside them: the longest hold, but where the
/// spent quota's dialect yields to `Retry-After` (draft-11, OpenAI, Anthropic), whose time
/// counts instead of a later reset.
#[test]
fn mixed_dialects_the_most_restrictive_counts() {
    let cases: &[Expected] = &[
        (
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset-after", "50"),
                ("ratelimit", "\"p\";r=0;t=5"),
            ],
            S(50),
        ),
        (
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset-after", "5"),
                ("ratelimit-remaining", "0"),
                ("ratelimit-reset", "70"),
            ],
            S(70),
        ),
        (
            200,
            &[
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ],
            S(360),
        ),
        (
            200,
            &[
                ("x-ratelimit-remaining-requests", "10"),
                ("x-ratelimit-reset-requests", "1s"),
                ("anthropic-ratelimit-output-tokens-remaining", "0"),
                (
                    "anthropic-ratelimit-output-tokens-reset",
                    "2001-09-09T01:48:40Z",
                ),
                ("date", D1E9),
            ],
            S(120),
        ),
        (
            429,
            &[
                ("retry-after", "10"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset-after", "30"),
            ],
            S(30),
        ),
        (
            429,
            &[
                ("retry-after", "90"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset-after", "30"),
            ],
            S(90),
        ),
        (
            429,
            &[
                ("retry-after", "90"),
                ("retry-after-ms", "100"),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2001-09-09T01:46:45Z"),
                ("date", D1E9),
            ],
            // Anthropic's spent requests come back when Retry-After (the precise -ms) has
            // passed, not at the later reset.
            Duration::from_millis(100),
        ),
        (
            200,
            &[
                ("x-ratelimit-remaining", "5"),
                ("x-ratelimit-reset-after", "30"),
                ("ratelimit-remaining", "0"),
                ("ratelimit-reset", "3"),
                ("anthropic-ratelimit-tokens-remaining", "100"),
                ("anthropic-ratelimit-tokens-reset", "2001-09-09T02:46:40Z"),
                ("date", D1E9),
            ],
            S(3),
        ),
    ];
    for (status, headers, expected) in cases {
        assert_eq!(held(*status, headers), *expected, "{status} {headers:?}");
    }
}

/// Two quotas with calls left: the fewest count, and then the calls are held for that quota's
/// window (the longest of those with the fewest).
#[test]
fn mixed_quotas_with_calls_left() {
    let (pushback, clock) = make(TEN_MIN);
    pushback.observe(&answer_str(
        200,
        &[
            ("x-ratelimit-remaining", "5"),
            ("x-ratelimit-reset-after", "100"),
            ("x-ratelimit-remaining-requests", "2"),
            ("x-ratelimit-reset-requests", "20s"),
            ("ratelimit-remaining", "2"),
            ("ratelimit-reset", "30"),
        ],
    ));
    assert_eq!(call(&pushback), Ok(()));
    assert_eq!(call(&pushback), Ok(()));
    assert_eq!(call(&pushback), Err(S(30)));
    assert_eq!(refusal_is_exact(&pushback, &clock), Ok(true));
}

/// A 429 with a quota that has calls left and no `Retry-After` is not a bare 429: no second's
/// hold; a 429 with nothing readable holds one second, capped by `max_hold`.
#[test]
fn a_429_with_calls_left_is_not_a_bare_429() {
    assert_eq!(
        held(
            429,
            &[
                ("x-ratelimit-remaining", "5"),
                ("x-ratelimit-reset-after", "10")
            ]
        ),
        Duration::ZERO
    );
    assert_eq!(held_with(MS(250), 429, &[]), MS(250));
    assert_eq!(held_with(Duration::ZERO, 429, &[]), Duration::ZERO);
}

// ---------------------------------------------------------------------------------------------
// Properties.

/// A well-formed value of one dialect, with the hold it must give (uncapped) and the `Date`
/// it is written against.
#[derive(Debug, Clone)]
struct Case {
    status: u16,
    headers: Vec<(String, String)>,
    expected: Duration,
}

fn fraction() -> impl Strategy<Value = String> {
    "[0-9]{0,30}"
}

fn well_formed() -> impl Strategy<Value = Case> {
    let base = 1_000_000_000i64..4_000_000_000;
    prop_oneof![
        // Retry-After, whole or decimal seconds.
        (
            prop_oneof![Just(429u16), Just(503)],
            0u64..100_000,
            proptest::option::of(fraction())
        )
            .prop_map(|(status, secs, frac)| {
                let (value, nanos) = match &frac {
                    Some(f) if !f.is_empty() => (format!("{secs}.{f}"), frac_nanos_up(f)),
                    _ => (secs.to_string(), 0),
                };
                Case {
                    status,
                    headers: vec![("retry-after".into(), value)],
                    expected: S(secs) + NS(nanos),
                }
            }),
        // Retry-After, an HTTP-date against Date.
        (base.clone(), 0i64..100_000).prop_map(|(date, ahead)| Case {
            status: 503,
            headers: vec![
                ("date".into(), http_date(date)),
                ("retry-after".into(), http_date(date + ahead)),
            ],
            expected: S(ahead as u64),
        }),
        // retry-after-ms beside a Retry-After.
        (0u64..100_000_000, 0u64..100_000).prop_map(|(ms, secs)| Case {
            status: 429,
            headers: vec![
                ("retry-after".into(), secs.to_string()),
                ("retry-after-ms".into(), ms.to_string()),
            ],
            expected: MS(ms),
        }),
        // X-RateLimit-Reset-After.
        (0u64..100_000, fraction()).prop_map(|(secs, f)| {
            let value = if f.is_empty() {
                secs.to_string()
            } else {
                format!("{secs}.{f}")
            };
            Case {
                status: 200,
                headers: vec![
                    ("x-ratelimit-remaining".into(), "0".into()),
                    ("x-ratelimit-reset-after".into(), value),
                ],
                expected: S(secs) + NS(frac_nanos_up(&f)),
            }
        }),
        // A reset as a Unix time in seconds (maybe with a fraction) or milliseconds, or as
        // seconds from now, in either family, against Date.
        (
            base.clone(),
            0u64..100_000,
            0u64..1000,
            0u8..4,
            any::<bool>()
        )
            .prop_map(|(date, ahead, ms, form, legacy)| {
                let (value, expected) = match form {
                    0 => ((date as u64 + ahead).to_string(), S(ahead)),
                    // Fractions of Unix times are `fractional_resets_hold_exactly` (a defect).
                    1 => (format!("{}.000", date as u64 + ahead), S(ahead)),
                    2 => (((date as u64 + ahead) * 1000).to_string(), S(ahead)),
                    _ => (format!("{ahead}.{ms:03}"), S(ahead) + MS(ms)),
                };
                let (remaining, reset) = if legacy {
                    ("ratelimit-remaining", "ratelimit-reset")
                } else {
                    ("x-ratelimit-remaining", "x-ratelimit-reset")
                };
                Case {
                    status: 200,
                    headers: vec![
                        ("date".into(), http_date(date)),
                        (remaining.into(), "0".into()),
                        (reset.into(), value),
                    ],
                    expected,
                }
            }),
        // OpenAI Go durations.
        (
            0u64..30,
            0u64..60,
            0u64..60,
            0u64..1000,
            0u64..1000,
            0u64..1000,
            any::<[bool; 6]>(),
            any::<bool>(),
        )
            .prop_map(|(h, m, s, ms, us, ns, parts, tokens)| {
                let mut value = String::new();
                let mut expected = Duration::ZERO;
                let units = [
                    (h, "h", S(3600)),
                    (m, "m", S(60)),
                    (s, "s", S(1)),
                    (ms, "ms", MS(1)),
                    (us, "us", Duration::from_micros(1)),
                    (ns, "ns", NS(1)),
                ];
                for (i, (n, unit, scale)) in units.into_iter().enumerate() {
                    if parts[i] {
                        value.push_str(&format!("{n}{unit}"));
                        expected += scale * n as u32;
                    }
                }
                if value.is_empty() {
                    value.push_str("0s");
                }
                let family = if tokens { "tokens" } else { "requests" };
                Case {
                    status: 200,
                    headers: vec![
                        (format!("x-ratelimit-remaining-{family}"), "0".into()),
                        (format!("x-ratelimit-reset-{family}"), value),
                    ],
                    expected,
                }
            }),
        // Anthropic RFC 3339 against Date.
        (
            base,
            0i64..100_000,
            "0{0,9}",
            -(23 * 60 + 59)..=(23 * 60 + 59i64),
            0usize..4,
        )
            .prop_map(|(date, ahead, f, offset, family)| {
                let frac = if f.is_empty() {
                    String::new()
                } else {
                    format!(".{f}")
                };
                let family = ["requests", "tokens", "input-tokens", "output-tokens"][family];
                Case {
                    status: 200,
                    headers: vec![
                        ("date".into(), http_date(date)),
                        (
                            format!("anthropic-ratelimit-{family}-remaining"),
                            "0".into(),
                        ),
                        (
                            format!("anthropic-ratelimit-{family}-reset"),
                            rfc3339(date + ahead, &frac, offset),
                        ),
                    ],
                    expected: S(ahead as u64) + NS(frac_nanos_up(&f)),
                }
            }),
    ]
}

fn to_response(status: u16, headers: &[(String, String)]) -> Response<()> {
    let pairs: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect();
    answer(status, &pairs)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Each well-formed value holds exactly what it says (decimals rounded up to the
    /// nanosecond), cut to `max_hold`, and the refusal it causes names the instant a call goes.
    #[test]
    fn well_formed_values_hold_exactly_what_they_say(case in well_formed(), max_hold_s in prop_oneof![Just(1u64 << 40), 1u64..200_000]) {
        let max_hold = S(max_hold_s);
        let (pushback, clock) = make(max_hold);
        pushback.observe(&to_response(case.status, &case.headers));
        prop_assert_eq!(pushback.held_for(), case.expected.min(max_hold), "{:?}", case);
        let refused = refusal_is_exact(&pushback, &clock);
        prop_assert!(refused.is_ok(), "{:?}: {:?}", case, refused);
    }
}

const FIELDS: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "date",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
];

/// Near-valid values: the shapes a broken or hostile server sends for these dialects.
pub(crate) fn hostile_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..48),
        "[0-9]{1,40}".prop_map(String::into_bytes),
        "-?[0-9]{0,22}\\.[0-9]{0,30}".prop_map(String::into_bytes),
        "(9{9}|1{1}0{9}|9{12}|1{1}0{12}|0{1,30})[0-9]{0,3}(\\.[0-9]{0,12})?".prop_map(String::into_bytes),
        "(-|\\+)?([0-9]{0,22}(\\.[0-9]{0,30})?(h|m|s|ms|us|µs|μs|ns|)){1,7}".prop_map(String::into_bytes),
        "[0-9]{1,5}-[0-9]{1,2}-[0-9]{1,2}[Tt ][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\\.[0-9]{0,30})?([Zz]|[+-][0-9]{2}:[0-9]{2})?"
            .prop_map(String::into_bytes),
        "(Mon|Sun|Thu|Fri), [0-9]{2} (Feb|Sep|Dec) (1969|1970|2001|2024|9999|0000) [0-9]{2}:[0-9]{2}:[0-9]{2} GMT"
            .prop_map(String::into_bytes),
        prop_oneof![
            Just("NaN"), Just("inf"), Just("-0"), Just("١٢٣"), Just("５"), Just("1e308"),
            Just("0x7fffffff"), Just("µs"), Just("1µ"), Just("24:00:00"), Just("1s1"),
            Just("9999-12-31T23:59:59.999999999999Z"), Just("1969-12-31T23:59:59Z"),
            Just("2024-02-30T00:00:00Z"), Just("2001-09-09T01:47:25+23:59"),
            Just("2562047h47m16.854775808s"), Just("18446744073709551616"),
        ]
        .prop_map(|s| s.as_bytes().to_vec()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1200))]

    /// However a response mixes hostile values of these dialects, nothing panics, no hold
    /// exceeds `max_hold`, `held_for` agrees with a refusal, and a refusal's time is when a
    /// call is admitted.
    #[test]
    fn hostile_values_never_panic_exceed_max_hold_or_misname_the_refusal(
        max_hold_ms in prop_oneof![Just(0u64), 1u64..10_000_000, Just(u64::MAX / 2)],
        status in prop_oneof![Just(200u16), Just(403), Just(429), Just(503), 100u16..600],
        fields in proptest::collection::vec((0..FIELDS.len(), hostile_value()), 0..14),
    ) {
        let max_hold = MS(max_hold_ms);
        let (pushback, clock) = make(max_hold);
        let mut response = Response::new(());
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
        for (field, bytes) in &fields {
            if let Ok(value) = HeaderValue::from_bytes(bytes) {
                response.headers_mut().append(FIELDS[*field], value);
            }
        }
        pushback.observe(&response);
        prop_assert!(pushback.held_for() <= max_hold, "{:?} > {:?}", pushback.held_for(), max_hold);
        let refused = refusal_is_exact(&pushback, &clock);
        prop_assert!(refused.is_ok(), "{:?}", refused);
    }
}

/// Go's `time.ParseDuration` takes both micro signs: U+00B5 (`µs`) and U+03BC (`μs`).
#[test]
fn openai_go_durations_with_either_micro_sign() {
    for reset in ["100\u{b5}s", "100\u{3bc}s"] {
        let held = held(
            200,
            &[
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", reset),
            ],
        );
        assert_eq!(held, Duration::from_micros(100), "{reset:?}");
    }
}

/// Fractions of resets that are instants (Unix seconds with a fraction, Unix milliseconds,
/// RFC 3339 with a fraction) hold exactly what they say against `Date`, as decimal seconds
/// from now do: not rounded up to the next whole second.
#[test]
fn fractional_resets_hold_exactly() {
    let mut wrong = Vec::new();
    let unix: &[(&str, Duration)] = &[
        ("1000000000.1", MS(100)),
        ("1000000045.5", MS(45_500)),
        ("1000000045.123456789", NS(45_123_456_789)),
        ("1000000000100", MS(100)),
        ("1000000045123", MS(45_123)),
        ("1000000045123.5", NS(45_123_500_000)),
    ];
    for (reset, expected) in unix {
        for (remaining, field) in [
            ("x-ratelimit-remaining", "x-ratelimit-reset"),
            ("ratelimit-remaining", "ratelimit-reset"),
        ] {
            let got = held(200, &[("date", D1E9), (remaining, "0"), (field, reset)]);
            if got != *expected {
                wrong.push(format!("{field}: {reset} held {got:?}, not {expected:?}"));
            }
        }
    }
    let at = 1_000_000_045;
    let rfc: Vec<(String, Duration)> = vec![
        (rfc3339(1_000_000_000, ".1", 0), MS(100)),
        (rfc3339(at, ".5", 0), MS(45_500)),
        (rfc3339(at, ".123456789", 330), NS(45_123_456_789)),
        (rfc3339(at, ".000000001", 0), S(45) + NS(1)),
    ];
    for (reset, expected) in &rfc {
        let got = held(
            200,
            &[
                ("date", D1E9),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", reset),
            ],
        );
        if got != *expected {
            wrong.push(format!(
                "anthropic reset {reset} held {got:?}, not {expected:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// "`Reset-After` in decimal seconds": seconds from now at any magnitude, like
/// `Retry-After`, not a Unix time from 10^9; and beyond `max_hold` it is cut to it.
#[test]
fn reset_after_is_seconds_from_now_at_any_magnitude() {
    let mut wrong = Vec::new();
    for (date, value, max_hold, expected) in [
        (None, "1000000000", TEN_MIN, TEN_MIN),
        (None, "1700000000.5", TEN_MIN, TEN_MIN),
        (None, "1000000000000", TEN_MIN, TEN_MIN),
        (Some(D1E9), "1000000045", TEN_MIN, TEN_MIN),
        (Some(D1E9), "1000000045", HUGE, S(1_000_000_045)),
        (Some(D1E9), "5000000000", HUGE, S(5_000_000_000)),
    ] {
        let mut headers = vec![
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset-after", value),
        ];
        if let Some(date) = date {
            headers.push(("date", date));
        }
        let got = held_with(max_hold, 200, &headers);
        if got != expected {
            wrong.push(format!(
                "Date {date:?}, Reset-After {value}: held {got:?}, not {expected:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// "below that seconds (whole or decimal)": a reset below 10^9 whose fraction has more than
/// nine digits is still seconds from now (31 years, cut to `max_hold`); one below 10^12 is
/// still Unix seconds (the year 33658, cut to `max_hold`).
#[test]
fn a_reset_just_below_a_magnitude_boundary_keeps_its_reading() {
    let mut wrong = Vec::new();
    for value in [
        "999999999.9999999999",
        "999999999.99999999999999999999",
        "999999999999.9999999999",
    ] {
        for (remaining, field) in [
            ("x-ratelimit-remaining", "x-ratelimit-reset"),
            ("ratelimit-remaining", "ratelimit-reset"),
        ] {
            for date in [None, Some(D1E9)] {
                let mut headers = vec![(remaining, "0"), (field, value)];
                if let Some(date) = date {
                    headers.push(("date", date));
                }
                let got = held(200, &headers);
                if got != TEN_MIN {
                    wrong.push(format!("{field}: {value}, Date {date:?}: held {got:?}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// "a 403 that carries rate-limit fields": fields of the documented dialects that do not, by
/// themselves, make a quota (a count without a window, GitHub's `X-RateLimit-Limit` and
/// `-Used`, a `RateLimit` item without `t`).
#[test]
fn retry_after_on_a_403_beside_any_rate_limit_field() {
    let cases: &[&[(&str, &str)]] = &[
        &[("x-ratelimit-remaining", "4999")],
        &[("x-ratelimit-limit", "5000"), ("x-ratelimit-used", "1")],
        &[("ratelimit-remaining", "5")],
        &[("x-ratelimit-remaining-requests", "5")],
        &[("ratelimit", "\"p\";r=5")],
        &[("ratelimit-policy", "\"p\";q=5;w=60")],
    ];
    let mut wrong = Vec::new();
    for fields in cases {
        let mut headers = fields.to_vec();
        headers.push(("retry-after", "60"));
        let got = held(403, &headers);
        if got != S(60) {
            wrong.push(format!("{fields:?}: held {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A remaining count beyond any integer lets calls go and panics nowhere.
#[test]
fn huge_remaining_counts_let_calls_go() {
    for remaining in [
        "9".repeat(40),
        "18446744073709551616".into(),
        "18446744073709551615".into(),
    ] {
        for (r, t, tv) in [
            ("x-ratelimit-remaining", "x-ratelimit-reset-after", "30"),
            ("ratelimit-remaining", "ratelimit-reset", "30"),
            (
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
                "30s",
            ),
            (
                "anthropic-ratelimit-requests-remaining",
                "anthropic-ratelimit-requests-reset",
                "2001-09-09T01:47:10Z",
            ),
        ] {
            let (pushback, _) = make(TEN_MIN);
            pushback.observe(&answer_str(
                200,
                &[("date", D1E9), (r, &remaining), (t, tv)],
            ));
            assert_eq!(pushback.held_for(), Duration::ZERO, "{r}: {remaining}");
            for _ in 0..10 {
                assert_eq!(call(&pushback), Ok(()), "{r}: {remaining}");
            }
        }
    }
}

/// A Retry-After HTTP-date against a `Date` far in the future of the system clock (2100).
#[test]
fn retry_after_date_against_a_date_field_in_the_future() {
    let date = 4_102_444_800i64;
    let held = held(
        429,
        &[
            ("date", &http_date(date)),
            ("retry-after", &http_date(date + 30)),
        ],
    );
    assert_eq!(held, S(30));
}

/// The reading of a reset next to each magnitude boundary, with a `Date`, exactly.
#[test]
fn resets_at_the_magnitude_boundaries() {
    let cases: &[(&str, Duration)] = &[
        ("999999999.999999999", S(999_999_999) + NS(999_999_999)),
        ("1000000000.0", Duration::ZERO),
        ("1000000000000.0", Duration::ZERO),
        ("5.000000000000000000000000000001", S(5) + NS(1)),
    ];
    for (value, expected) in cases {
        let got = held_with(
            HUGE,
            200,
            &[
                ("date", D1E9),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", value),
            ],
        );
        assert_eq!(got, *expected, "{value}");
    }
    let got = held_with(
        HUGE,
        200,
        &[
            ("date", D1E9),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "999999999999.5"),
        ],
    );
    assert_cut(got, HUGE, "999999999999.5");
}

/// An answer of `dialect` saying `r` calls are left for `t` seconds, against `Date` = 10^9.
fn requests_quota(dialect: usize, r: u64, t: u64) -> Vec<(String, String)> {
    let (rt, tt) = (r.to_string(), t.to_string());
    let mut headers = vec![("date".to_string(), D1E9.to_string())];
    let pairs: Vec<(&str, String, &str, String)> = match dialect {
        0 => vec![("x-ratelimit-remaining", rt, "x-ratelimit-reset-after", tt)],
        1 => vec![(
            "x-ratelimit-remaining",
            rt,
            "x-ratelimit-reset",
            (1_000_000_000 + t).to_string(),
        )],
        2 => vec![("ratelimit-remaining", rt, "ratelimit-reset", tt)],
        3 => vec![
            (
                "x-ratelimit-remaining-requests",
                rt,
                "x-ratelimit-reset-requests",
                format!("{t}s"),
            ),
            (
                "x-ratelimit-remaining-tokens",
                "1".into(),
                "x-ratelimit-reset-tokens",
                "1h".into(),
            ),
        ],
        _ => vec![
            (
                "anthropic-ratelimit-requests-remaining",
                rt,
                "anthropic-ratelimit-requests-reset",
                rfc3339(1_000_000_000 + t as i64, "", 0),
            ),
            (
                "anthropic-ratelimit-input-tokens-remaining",
                "1".into(),
                "anthropic-ratelimit-input-tokens-reset",
                rfc3339(1_000_003_600, "", 0),
            ),
        ],
    };
    for (a, av, b, bv) in pairs {
        headers.push((a.to_string(), av));
        headers.push((b.to_string(), bv));
    }
    headers
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Requests quotas of each dialect against an exact model: within the window, the first
    /// `r` calls go and every later one is refused with exactly the time left; after it, calls
    /// go (no policy). Tokens with something left beside them change nothing.
    #[test]
    fn requests_quotas_of_every_dialect_follow_the_exact_model(
        dialect in 0usize..5,
        r in 0u64..6,
        t in 1u64..60,
        steps in proptest::collection::vec((0u64..4_000, 0usize..4), 1..40),
    ) {
        let (pushback, clock) = make(TEN_MIN);
        let headers = requests_quota(dialect, r, t);
        pushback.observe(&to_response(200, &headers));
        let (mut elapsed, mut admitted) = (0u64, 0u64);
        for (advance, calls) in steps {
            clock.advance(MS(advance));
            elapsed += advance;
            for _ in 0..calls {
                let got = call(&pushback);
                let window = t * 1000;
                if elapsed < window && admitted >= r {
                    prop_assert_eq!(got, Err(MS(window - elapsed)), "{:?} at {} ms, {} admitted", headers, elapsed, admitted);
                } else {
                    prop_assert_eq!(got, Ok(()), "{:?} at {} ms, {} admitted", headers, elapsed, admitted);
                    admitted += 1;
                }
            }
        }
    }
}

/// A 429 with `Retry-After: 10` and two calls left for 30 s: nothing for 10 s, then two
/// calls, then refusals naming the end of the 30 s exactly, then calls go.
#[test]
fn a_retry_after_then_the_calls_a_quota_leaves() {
    for quota in [
        &[
            ("x-ratelimit-remaining", "2"),
            ("x-ratelimit-reset-after", "30"),
        ][..],
        &[
            ("x-ratelimit-remaining-requests", "2"),
            ("x-ratelimit-reset-requests", "30s"),
        ][..],
        &[
            ("date", D1E9),
            ("anthropic-ratelimit-requests-remaining", "2"),
            ("anthropic-ratelimit-requests-reset", "2001-09-09T01:47:10Z"),
        ][..],
    ] {
        let (pushback, clock) = make(TEN_MIN);
        let mut headers = quota.to_vec();
        headers.push(("retry-after", "10"));
        pushback.observe(&answer_str(429, &headers));
        assert_eq!(call(&pushback), Err(S(10)), "{quota:?}");
        clock.advance(S(10));
        assert_eq!(call(&pushback), Ok(()), "{quota:?}");
        assert_eq!(call(&pushback), Ok(()), "{quota:?}");
        assert_eq!(call(&pushback), Err(S(20)), "{quota:?}");
        assert_eq!(refusal_is_exact(&pushback, &clock), Ok(true), "{quota:?}");
        assert_eq!(call(&pushback), Ok(()), "{quota:?}");
    }
}
