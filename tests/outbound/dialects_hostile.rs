//! How `Pushback` reads each rate-limit dialect, attacked from its module docs ("What is
//! read", "How calls are held", "Hostile answers"): exact holds computed independently of the
//! crate for well-formed values, boundary magnitudes, dates against the `Date` field, the 403
//! rule, `retry-after-ms`, tokens against requests, mixed dialects, size limits, and hostile
//! bytes. Time is a `ManualClock`; nothing sleeps.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use http::{HeaderValue, Response};
use proptest::prelude::*;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::{self, Pushback};
use tower_bulwark::BoxError;

// ---------------------------------------------------------------------------------------------
// Helpers.

/// A status, its fields, and the hold they should cause.
type Expected<'a> = (u16, &'a [(&'a str, &'a str)], Duration);

const TEN_MIN: Duration = Duration::from_secs(600);
/// A cap far above every exact value these tests compute, so that the value itself shows.
const HUGE: Duration = Duration::from_secs(1 << 42);
const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;
const NS: fn(u64) -> Duration = Duration::from_nanos;
/// Stands for a reset beyond 500 years (31 000 years here): checked with `assert_cut`.
const SATURATED: Duration = Duration::MAX;

/// 2001-09-09T01:46:40Z, Unix time 10^9, as an HTTP-date.
const D1E9: &str = "Sun, 09 Sep 2001 01:46:40 GMT";

fn make(max_hold: Duration) -> (Pushback<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("attack")
        .clock(clock.clone())
        .max_hold(max_hold)
        .build();
    (pushback, clock)
}

fn answer(status: u16, headers: &[(&str, &[u8])]) -> Response<()> {
    let mut response = Response::new(());
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
    for (name, value) in headers {
        let value = HeaderValue::from_bytes(value).expect("a valid header value");
        response.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value,
        );
    }
    response
}

fn answer_str(status: u16, headers: &[(&str, &str)]) -> Response<()> {
    let bytes: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    answer(status, &bytes)
}

/// How long calls are held right after one answer, with `max_hold`.
fn held_with(max_hold: Duration, status: u16, headers: &[(&str, &str)]) -> Duration {
    let (pushback, _) = make(max_hold);
    pushback.observe(&answer_str(status, headers));
    pushback.held_for()
}

fn held(status: u16, headers: &[(&str, &str)]) -> Duration {
    held_with(TEN_MIN, status, headers)
}

thread_local! {
    static RUNTIME: RefCell<tokio::runtime::Runtime> = RefCell::new(
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    );
}

/// One call through the pushback's layer to a dependency that answers `200` with no fields:
/// `Ok` when it reached the dependency, `Err(wait)` when refused.
fn call(pushback: &Pushback<ManualClock>) -> Result<(), Duration> {
    let client = pushback.layer().layer(service_fn(|()| async {
        Ok::<_, BoxError>(Response::new(()))
    }));
    RUNTIME.with(|rt| {
        let rt = rt.borrow();
        let _guard = rt.enter();
        match client.oneshot(()).now_or_never().expect("decided at once") {
            Ok(_) => Ok(()),
            Err(err) => Err(outbound::retry_after(&*err).expect("only refusals fail")),
        }
    })
}

/// Checks the refusal promise where the pushback stands: if a call is refused with `wait`,
/// `held_for` says the same, a call a nanosecond before `wait` is still refused, and a call at
/// `wait` is admitted. Returns whether the first call was refused.
fn refusal_is_exact(pushback: &Pushback<ManualClock>, clock: &ManualClock) -> Result<bool, String> {
    let held = pushback.held_for();
    match call(pushback) {
        Ok(()) => {
            if held != Duration::ZERO {
                return Err(format!("held_for said {held:?} but a call went"));
            }
            Ok(false)
        }
        Err(wait) => {
            if held != wait {
                return Err(format!("held_for {held:?} but the refusal said {wait:?}"));
            }
            if wait == Duration::ZERO {
                return Err("refused with a wait of zero".into());
            }
            clock.advance(wait - NS(1));
            match call(pushback) {
                Err(rest) if rest == NS(1) => {}
                other => return Err(format!("1 ns before {wait:?}: {other:?}")),
            }
            clock.advance(NS(1));
            if let Err(again) = call(pushback) {
                return Err(format!(
                    "refused with {wait:?}, then at it refused again with {again:?}"
                ));
            }
            Ok(true)
        }
    }
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        yoe + era * 400 + i64::from(month <= 2),
        month as u32,
        day as u32,
    )
}

/// A Unix time as an IMF-fixdate.
fn http_date(unix: i64) -> String {
    let (days, rest) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][m as usize - 1];
    format!(
        "{weekday}, {d:02} {month} {y:04} {:02}:{:02}:{:02} GMT",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

/// A Unix time as RFC 3339, written at UTC offset `offset` minutes, with `frac` (".123" or "").
fn rfc3339(unix: i64, frac: &str, offset: i64) -> String {
    let local = unix + offset * 60;
    let (days, rest) = (local.div_euclid(86_400), local.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    let zone = if offset == 0 {
        "Z".to_string()
    } else {
        let sign = if offset < 0 { '-' } else { '+' };
        format!("{sign}{:02}:{:02}", offset.abs() / 60, offset.abs() % 60)
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}{zone}",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

/// Decimal digits after a point, as nanoseconds rounded up.
fn frac_nanos_up(digits: &str) -> u64 {
    let mut nanos = 0u64;
    for (i, c) in digits.chars().enumerate() {
        let digit = c.to_digit(10).unwrap() as u64;
        if i < 9 {
            nanos = nanos * 10 + digit;
        } else if digit != 0 {
            let scale = 10u64.pow(9 - digits.len().min(9) as u32);
            return nanos * scale + 1;
        }
    }
    nanos * 10u64.pow(9 - digits.len().min(9) as u32)
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// "cut to `max_hold`": exactly `max_hold` up to 500 years; above that the hold need only be
/// at least 500 years and no more than `max_hold` (it saturates at `u64::MAX` ns, ~584 years).
fn assert_cut(held: Duration, max_hold: Duration, case: &str) {
    const CENTURIES: Duration = Duration::from_secs(500 * 365 * 86_400);
    assert!(held <= max_hold, "{case}: {held:?} > max_hold {max_hold:?}");
    if max_hold <= CENTURIES {
        assert_eq!(held, max_hold, "{case}");
    } else {
        assert!(held >= CENTURIES, "{case}: {held:?}");
    }
}

fn about(held: Duration, expected: Duration) -> bool {
    held + S(2) >= expected && held <= expected + S(1)
}

#[test]
fn helpers_agree_with_known_dates() {
    assert_eq!(http_date(1_000_000_000), D1E9);
    assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
    assert_eq!(rfc3339(1_000_000_000, "", 0), "2001-09-09T01:46:40Z");
    assert_eq!(rfc3339(1_000_000_000, "", 60), "2001-09-09T02:46:40+01:00");
    assert_eq!(http_date(1_709_164_800), "Thu, 29 Feb 2024 00:00:00 GMT");
    assert_eq!(frac_nanos_up("5"), 500_000_000);
    assert_eq!(frac_nanos_up("123456789"), 123_456_789);
    assert_eq!(frac_nanos_up("0000000001"), 1);
    assert_eq!(frac_nanos_up("1234567890000"), 123_456_789);
}

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
    let cases: &[(&str, Duration)] = &[
        ("1s", S(1)),
        ("6m0s", S(360)),
        ("20ms", MS(20)),
        ("1h2m3.5s", MS(3_723_500)),
    ];
    for (reset, expected) in cases {
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

/// Go durations, to the nanosecond, in either OpenAI family.
#[test]
fn openai_go_durations_exactly() {
    let cases: &[(&str, Duration)] = &[
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
    ];
    for (reset, expected) in cases {
        for family in ["requests", "tokens"] {
            let remaining = format!("x-ratelimit-remaining-{family}");
            let reset_field = format!("x-ratelimit-reset-{family}");
            assert_eq!(
                held_with(HUGE, 200, &[(&remaining, "0"), (&reset_field, reset)]),
                *expected,
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
