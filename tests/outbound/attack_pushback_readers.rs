//! Attacks on the pushback's readers after their refactor (one `Reader::reset` for every
//! dialect's reset, `Reader::span` turning an instant into a span against the reference time and
//! capping either form once, the X-RateLimit reader taking Reset-After before Reset, the
//! stricter of two token refills as one reduce). Each test quotes the promise of
//! `outbound::pushback`'s module docs it attacks. Time is a `ManualClock`, or tokio's paused
//! clock behind a `TokioClock`; nothing sleeps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Response;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::clock::Clock;
use tower_bulwark::outbound::{self, Pushback};
use tower_bulwark::BoxError;

use super::dialects_support::*;
use super::hostile_support::{on_tokio_clock_with, scripted_client, start};

/// The Unix time of every answer's `Date` ([`date0`]): 2023-11-14T22:13:20Z, far enough above
/// 10^9 that a reset before it is still read as a Unix time.
const T0: i64 = 1_700_000_000;

/// [`T0`] as an HTTP-date.
fn date0() -> String {
    http_date(T0)
}

/// Header fields, owned.
type Fields = Vec<(&'static str, String)>;

fn date_in(seconds: i64) -> String {
    http_date(T0 + seconds)
}

/// [`T0`] and `seconds` as RFC 3339, as Anthropic writes its resets.
fn rfc3339_in(seconds: i64) -> String {
    rfc3339(T0 + seconds, "", 0)
}

/// A dialect's two fields: what is left, and when it comes back.
type Pair = (&'static str, &'static str);

const X_RESET: Pair = ("x-ratelimit-remaining", "x-ratelimit-reset");
const X_RESET_AFTER: Pair = ("x-ratelimit-remaining", "x-ratelimit-reset-after");
const IETF_RESET: Pair = ("ratelimit-remaining", "ratelimit-reset");
const OPENAI_REQUESTS: Pair = (
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
);
const OPENAI_TOKENS: Pair = ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens");
const ANTHROPIC_REQUESTS: Pair = (
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
);

/// Anthropic's two fields of `family` ("tokens", "output-tokens"...).
fn anthropic(family: &str) -> Pair {
    (
        leak(format!("anthropic-ratelimit-{family}-remaining")),
        leak(format!("anthropic-ratelimit-{family}-reset")),
    )
}

/// `pair`'s fields: `calls` left, back at `reset`.
fn left(pair: Pair, calls: u32, reset: impl ToString) -> Fields {
    vec![(pair.0, calls.to_string()), (pair.1, reset.to_string())]
}

/// `pair`'s fields: nothing left, back at `reset`.
fn spent(pair: Pair, reset: impl ToString) -> Fields {
    left(pair, 0, reset)
}

/// One field.
fn one(name: &'static str, value: impl ToString) -> Fields {
    vec![(name, value.to_string())]
}

/// The fields of each dialect that say "nothing left until `ahead` seconds after [`T0`]",
/// written as an instant (read against the answer's `Date`, which is [`date0`]).
fn spent_until_instant(ahead: i64) -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let unix = T0 + ahead;
    let requests_limit = one("anthropic-ratelimit-requests-limit", 50);
    vec![
        ("X-RateLimit-Reset (Unix seconds)", spent(X_RESET, unix)),
        (
            "X-RateLimit-Reset (Unix milliseconds)",
            spent(X_RESET, unix * 1000),
        ),
        ("RateLimit-Reset (Unix seconds)", spent(IETF_RESET, unix)),
        (
            "anthropic-ratelimit-requests-reset",
            [requests_limit, spent(ANTHROPIC_REQUESTS, rfc3339_in(ahead))].concat(),
        ),
        (
            "anthropic-ratelimit-tokens-reset (no limit)",
            spent(anthropic("tokens"), rfc3339_in(ahead)),
        ),
    ]
}

fn with_date(fields: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut all = vec![("date", date0())];
    all.extend(fields.iter().cloned());
    all
}

fn borrowed<'a>(fields: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    fields.iter().map(|(n, v)| (*n, v.as_str())).collect()
}

fn held_owned(max_hold: Duration, status: u16, fields: &[(&'static str, String)]) -> Duration {
    held_with(max_hold, status, &borrowed(fields))
}

/// A client through `pushback` to a dependency that answers its first call with `first()`
/// and each later one `200` with no fields; and the instants (tokio's) at which calls reached
/// the dependency.
fn answering_once<C: Clock + Clone>(
    pushback: &Pushback<C>,
    first: impl Fn() -> Response<()> + Send + Sync + 'static,
) -> (
    impl Service<(), Response = Response<()>, Error = BoxError> + Clone,
    Arc<Mutex<Vec<tokio::time::Instant>>>,
) {
    let is_first = Arc::new(AtomicBool::new(true));
    let sent_at = Arc::new(Mutex::new(Vec::new()));
    let first = Arc::new(first);
    let client = {
        let sent_at = sent_at.clone();
        pushback.layer().layer(service_fn(move |()| {
            sent_at.lock().unwrap().push(tokio::time::Instant::now());
            let r = if is_first.swap(false, Ordering::SeqCst) {
                first()
            } else {
                Response::new(())
            };
            async move { Ok::<_, BoxError>(r) }
        }))
    };
    (client, sent_at)
}

/// "A reset is a Unix time in milliseconds from 10^12, in seconds from 10^9 [...]" and "A date
/// is read against the response's own `Date` field when it has one [...]; a date in the past
/// holds nothing": a reset given as an instant is read against the answer's `Date`, whatever
/// the system time, in every dialect that writes one; the hold is exactly the span to it, and
/// nothing once it is past.
#[test]
fn resets_as_instants_are_read_against_the_date_field_in_every_dialect() {
    for ahead in [1i64, 7, 59, 599] {
        for (dialect, fields) in spent_until_instant(ahead) {
            let held = held_owned(HUGE, 200, &with_date(&fields));
            assert_eq!(held, S(ahead as u64), "{dialect}, {ahead}s after Date");
        }
    }
    for behind in [0i64, 1, 3_600, 400_000_000] {
        for (dialect, fields) in spent_until_instant(-behind) {
            let held = held_owned(HUGE, 200, &with_date(&fields));
            assert_eq!(held, Duration::ZERO, "{dialect}, {behind}s before Date");
        }
    }
}

/// "Whatever a response says, no hold is longer than `max_hold` [...]: a longer Retry-After,
/// `t` or reset is cut to it": a reset given as an instant beyond `max_hold` is cut to it like
/// a span is, for any `max_hold`, in every dialect.
#[test]
fn instants_beyond_max_hold_are_cut_to_it_in_every_dialect() {
    for max_hold in [S(1), S(30), MS(1_500), TEN_MIN] {
        for ahead in [31i64, 3_600, 86_400 * 365 * 50] {
            for (dialect, fields) in spent_until_instant(ahead) {
                let held = held_owned(max_hold, 200, &with_date(&fields));
                let expected = max_hold.min(S(ahead as u64));
                assert_eq!(
                    held, expected,
                    "{dialect}, {ahead}s ahead, max_hold {max_hold:?}"
                );
            }
        }
        // And every form of Retry-After and span.
        let spans: Vec<Fields> = vec![
            one("retry-after", 3600),
            one("retry-after", date_in(3_600)),
            one("retry-after-ms", 3600000),
            one("ratelimit", r#""default";r=0;t=3600"#),
            spent(X_RESET_AFTER, "3600.5"),
            spent(OPENAI_REQUESTS, "1h0m0s"),
        ];
        for fields in &spans {
            let held = held_owned(max_hold, 429, &with_date(fields));
            assert_eq!(held, max_hold, "{fields:?} under max_hold {max_hold:?}");
        }
    }
}

/// "Several Retry-After lines are not an error: the longest counts", and a date is read
/// against the `Date` field: lines mixing delta-seconds and dates, in either order, hold the
/// longest of them; a date in the past among them holds nothing of its own.
#[test]
fn retry_after_lines_mixing_seconds_and_dates_the_longest_counts() {
    let cases: Vec<(Vec<String>, Duration)> = vec![
        (vec!["5".into(), date_in(20)], S(20)),
        (vec![date_in(20), "5".into()], S(20)),
        (vec!["50".into(), date_in(20)], S(50)),
        (vec![date_in(20), "50".into()], S(50)),
        (vec![date_in(-20), "5".into()], S(5)),
        (vec!["5".into(), date_in(-20)], S(5)),
        (vec![date_in(7), date_in(3)], S(7)),
        (vec![date_in(3), date_in(7)], S(7)),
        (vec!["1.5".into(), date_in(1)], MS(1_500)),
        (vec![date_in(-1), date_in(-100)], Duration::ZERO),
    ];
    for (lines, expected) in cases {
        let mut fields = vec![("date", date0())];
        fields.extend(lines.iter().map(|l| ("retry-after", l.clone())));
        for status in [429, 503] {
            assert_eq!(
                held_owned(HUGE, status, &fields),
                expected,
                "{status} Retry-After lines {lines:?}"
            );
        }
    }
}

/// "Malformed values (negative, not numbers, bytes that are not text [...]) are ignored and
/// logged; none panics" and "Several Retry-After lines are not an error: the longest counts":
/// a malformed line beside a readable one leaves the readable one to count.
#[test]
fn a_malformed_retry_after_line_beside_a_readable_one_leaves_it_to_count() {
    let hostile: &[&[u8]] = &[
        b"-50",
        b"NaN",
        b"inf",
        b"1e9",
        b"0x100",
        b"99s",
        b"\xff\xfe",
        b"5,5",
        b"--1",
    ];
    for bad in hostile {
        for order in 0..2 {
            let lines: [&[u8]; 2] = if order == 0 { [bad, b"7"] } else { [b"7", bad] };
            let (pushback, _) = make(TEN_MIN);
            pushback.observe(&answer(
                503,
                &[("retry-after", lines[0]), ("retry-after", lines[1])],
            ));
            assert_eq!(pushback.held_for(), S(7), "lines {lines:?}");
        }
    }
}

/// "Whatever a response says, no hold is longer than `max_hold` [...]. Malformed values [...]
/// are ignored and logged; none panics": numbers at and past every integer bound, in every
/// field that carries a span or an instant, hold at most `max_hold` and never panic.
#[test]
fn numbers_past_every_integer_bound_hold_at_most_max_hold() {
    let huge: &[&str] = &[
        "18446744073709551615",
        "18446744073709551616",
        "340282366920938463463374607431768211456",
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615.999999999",
        "4294967296",
        "999999999999999",
    ];
    let max_hold = S(90);
    for value in huge {
        let draft_11 = format!(r#""default";r=0;t={}"#, &value[..value.len().min(15)]);
        let cases: Vec<(u16, Fields)> = vec![
            (429, one("retry-after", value)),
            (429, one("retry-after-ms", value)),
            (200, spent(X_RESET, value)),
            (200, spent(X_RESET_AFTER, value)),
            (200, spent(IETF_RESET, value)),
            (200, spent(OPENAI_REQUESTS, format!("{value}s"))),
            (200, spent(OPENAI_TOKENS, format!("{value}h"))),
            (200, one("ratelimit", draft_11)),
        ];
        for (status, fields) in cases {
            for date in [None, Some(D1E9)] {
                let mut all = fields.clone();
                if let Some(d) = date {
                    all.push(("date", d.to_string()));
                }
                let held = held_owned(max_hold, status, &all);
                assert!(held <= max_hold, "{all:?} held {held:?}");
            }
        }
    }
}

/// "A 429 with neither Retry-After nor a rate-limit field holds for one second", "a date in the
/// past holds nothing", and "A date is read against the response's own Date field when it has
/// one (so the two clocks need not agree)": a `Date` and a Retry-After date both far in the
/// future (year 9999) still give the exact span between them.
#[test]
fn dates_at_the_end_of_the_http_date_range_are_read_against_each_other() {
    let end: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    let date = http_date(end - 30);
    let cases: Vec<(Fields, Duration)> = vec![
        (one("retry-after", http_date(end)), S(30)),
        (spent(X_RESET, end), S(30)),
        (spent(ANTHROPIC_REQUESTS, rfc3339(end, "", 0)), S(30)),
    ];
    for (fields, expected) in cases {
        let mut all = vec![("date", date.clone())];
        all.extend(fields.iter().cloned());
        assert_eq!(held_owned(HUGE, 429, &all), expected, "{all:?}");
    }
}

/// "of all the quotas read, the most restrictive counts (the fewest calls left, and of those
/// the longest window)": a dialect with nothing left for a short window wins over one with a
/// call left for a long one, whichever dialects they are and in whatever order the fields come.
#[test]
fn the_fewest_calls_left_count_before_a_longer_window() {
    // (fields with 1 call left for 100 s, fields with nothing left for 5 s)
    let one_left_long: Vec<Fields> = vec![
        one("ratelimit", r#""a";r=1;t=100"#),
        left(X_RESET_AFTER, 1, 100),
        left(OPENAI_REQUESTS, 1, "1m40s"),
        left(ANTHROPIC_REQUESTS, 1, rfc3339_in(100)),
    ];
    let none_left_short: Vec<Fields> = vec![
        one("ratelimit", r#""b";r=0;t=5"#),
        spent(X_RESET_AFTER, 5),
        spent(OPENAI_REQUESTS, "5s"),
        spent(ANTHROPIC_REQUESTS, rfc3339_in(5)),
    ];
    for (i, long) in one_left_long.iter().enumerate() {
        for (j, short) in none_left_short.iter().enumerate() {
            if i == j {
                continue; // one dialect cannot say both
            }
            for order in 0..2 {
                let mut fields = vec![("date", date0())];
                if order == 0 {
                    fields.extend(long.iter().cloned());
                    fields.extend(short.iter().cloned());
                } else {
                    fields.extend(short.iter().cloned());
                    fields.extend(long.iter().cloned());
                }
                assert_eq!(held_owned(HUGE, 200, &fields), S(5), "{fields:?}");
            }
        }
    }
}

/// "of all the quotas read, the most restrictive counts (the fewest calls left, and of those
/// the longest window)" and "at most r calls start within t": with one call left in each of
/// two dialects, a call in flight spends both and calls are then held for the longer window,
/// whichever dialect says it.
#[tokio::test]
async fn of_equal_calls_left_the_longest_window_holds_once_spent() {
    let one_left = |seconds: u64| -> Vec<Fields> {
        vec![
            one("ratelimit", format!(r#""a";r=1;t={seconds}"#)),
            left(X_RESET_AFTER, 1, seconds),
            left(OPENAI_REQUESTS, 1, format!("{seconds}s")),
            left(ANTHROPIC_REQUESTS, 1, rfc3339_in(seconds as i64)),
        ]
    };
    let (short, long) = (one_left(4), one_left(40));
    for (i, s) in short.iter().enumerate() {
        for (j, l) in long.iter().enumerate() {
            if i == j {
                continue;
            }
            let mut fields = vec![("date", date0())];
            fields.extend(s.iter().cloned());
            fields.extend(l.iter().cloned());
            let (pushback, clock) = make(HUGE);
            pushback.observe(&answer_str(200, &borrowed(&fields)));
            assert_eq!(pushback.held_for(), Duration::ZERO, "{fields:?}");
            // The one call left goes and stays in flight: the longer window holds.
            let (client, calls) = scripted_client(&pushback);
            let in_flight = start(&client).await;
            assert_eq!(calls.load(Ordering::SeqCst), 1);
            assert_eq!(pushback.held_for(), S(40), "{fields:?}");
            clock.advance(S(4));
            assert_eq!(pushback.held_for(), S(36), "{fields:?}");
            drop(in_flight);
        }
    }
}

/// "each family of tokens, once spent, holds calls until its tokens come back ([...] else at
/// the reset)" and "of all the quotas read, the most restrictive counts": two spent token
/// families (no `-limit`, so all at their reset) hold calls until the later reset, whichever
/// family it is and in whatever order the fields come; requests still left change nothing.
#[test]
fn two_spent_token_families_hold_until_the_later_reset() {
    let families = ["tokens", "input-tokens", "output-tokens"];
    for a in families {
        for b in families {
            if a == b {
                continue;
            }
            for (ra, rb, expected) in [(10, 30, 30), (30, 10, 30), (0, 25, 25)] {
                let fields = [
                    one("date", date0()),
                    one("anthropic-ratelimit-requests-limit", 50),
                    left(ANTHROPIC_REQUESTS, 49, rfc3339_in(60)),
                    spent(anthropic(a), rfc3339_in(ra)),
                    spent(anthropic(b), rfc3339_in(rb)),
                ]
                .concat();
                assert_eq!(
                    held_owned(HUGE, 200, &fields),
                    S(expected),
                    "{a} at +{ra}s, {b} at +{rb}s"
                );
            }
        }
    }
    // OpenAI: tokens spent for longer than requests, and the other way round.
    for (tokens, requests, expected) in [("20s", "5s", 20), ("5s", "20s", 20), ("1m0s", "0s", 60)] {
        let fields = [
            spent(OPENAI_REQUESTS, requests),
            spent(OPENAI_TOKENS, tokens),
        ]
        .concat();
        assert_eq!(
            held_owned(HUGE, 200, &fields),
            S(expected),
            "tokens {tokens}, requests {requests}"
        );
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// "After a Retry-After, no call starts until it has passed. A quota spent on the same answer
/// comes back when the Retry-After has passed, even if its reset says later, for draft-11's
/// RateLimit [...], OpenAI's and Anthropic's families; for X-RateLimit-*, RateLimit-* and
/// dialects of the user's, the later of the two counts."
#[test]
fn a_retry_after_beside_a_spent_quota_by_dialect() {
    let longer_reset: Vec<(&str, Fields, Duration)> = vec![
        ("draft-11", one("ratelimit", r#""d";r=0;t=30"#), S(5)),
        ("OpenAI requests", spent(OPENAI_REQUESTS, "30s"), S(5)),
        ("OpenAI tokens", spent(OPENAI_TOKENS, "30s"), S(5)),
        (
            "Anthropic requests",
            spent(ANTHROPIC_REQUESTS, rfc3339_in(30)),
            S(5),
        ),
        (
            "Anthropic output tokens",
            spent(anthropic("output-tokens"), rfc3339_in(30)),
            S(5),
        ),
        ("X-RateLimit Reset-After", spent(X_RESET_AFTER, 30), S(30)),
        ("X-RateLimit Reset (Unix)", spent(X_RESET, T0 + 30), S(30)),
        ("RateLimit-Reset", spent(IETF_RESET, 30), S(30)),
    ];
    for (dialect, fields, expected) in longer_reset {
        for retry_after in ["5".to_string(), date_in(5)] {
            let mut all = with_date(&fields);
            all.push(("retry-after", retry_after.clone()));
            assert_eq!(
                held_owned(HUGE, 429, &all),
                expected,
                "{dialect} with Retry-After {retry_after}"
            );
        }
    }
}

/// `Pushback::held_for`: "How long from now until a call may be sent"; `PushedBack::retry_after`:
/// "the same time Pushback::held_for gave then"; and "unless that time comes within max_wait:
/// then it waits on tokio's timer [...] and is sent when the hold ends": for every dialect, the
/// refusal, `held_for` and the time a waiting call actually waits are the same span.
#[tokio::test(start_paused = true)]
async fn held_for_the_refusal_and_the_actual_wait_agree_in_every_dialect() {
    let cases: Vec<(u16, Fields, Duration)> = vec![
        (429, one("retry-after", 7), S(7)),
        (429, one("retry-after", 2.25), MS(2_250)),
        (429, one("retry-after", date_in(13)), S(13)),
        (429, one("retry-after-ms", 7250), MS(7_250)),
        (429, vec![], S(1)),
        (200, one("ratelimit", r#""p";r=0;t=9"#), S(9)),
        (200, spent(X_RESET_AFTER, 3.5), MS(3_500)),
        (200, spent(X_RESET, T0 + 11), S(11)),
        (200, spent(OPENAI_REQUESTS, "1m0.5s"), MS(60_500)),
        (200, spent(OPENAI_TOKENS, "20ms"), MS(20)),
        (
            200,
            spent(ANTHROPIC_REQUESTS, rfc3339(T0 + 12, ".5", 0)),
            MS(12_500),
        ),
    ];
    for (status, fields, expected) in cases {
        let all = with_date(&fields);
        let answer_once = {
            let all = all.clone();
            move || answer_str(status, &borrowed(&all))
        };
        // Refused at once (max_wait zero): the refusal says what held_for says.
        let pushback = on_tokio_clock_with(|b| b.max_hold(HUGE));
        let (client, _) = answering_once(&pushback, answer_once.clone());
        client.clone().oneshot(()).await.unwrap();
        assert_eq!(pushback.held_for(), expected, "{status} {fields:?}");
        let err = client.clone().oneshot(()).await.unwrap_err();
        assert_eq!(
            outbound::retry_after(&*err),
            Some(expected),
            "{status} {fields:?}"
        );

        // Waiting (max_wait above the hold): the call is sent exactly when the hold ends.
        let waiting = on_tokio_clock_with(|b| b.max_hold(HUGE).max_wait(S(120)));
        let (client, sent_at) = answering_once(&waiting, answer_once);
        client.clone().oneshot(()).await.unwrap();
        let told = waiting.held_for();
        assert_eq!(told, expected, "{status} {fields:?}");
        let start = tokio::time::Instant::now();
        client.clone().oneshot(()).await.unwrap();
        let sent = sent_at.lock().unwrap()[1];
        assert_eq!(
            sent - start,
            told,
            "{status} {fields:?}: held_for said {told:?}"
        );
    }
}

/// "Fields over 4 KiB or of more than 16 lines are ignored" and "the most restrictive counts":
/// an ignored field in one dialect does not hide another dialect's readable quota on the same
/// answer.
#[test]
fn an_ignored_field_does_not_hide_another_dialects_quota() {
    let long = format!("{}5", "0".repeat(5_000));
    let bad_fields: Vec<Fields> = vec![
        spent(X_RESET_AFTER, &long),
        one("ratelimit", format!(r#""a";r=0;t={long}"#)),
        (0..17)
            .map(|_| ("x-ratelimit-remaining", "0".to_string()))
            .chain([("x-ratelimit-reset-after", "50".to_string())])
            .collect(),
    ];
    for bad in bad_fields {
        let fields = [spent(OPENAI_REQUESTS, "6m0s"), bad].concat();
        assert_eq!(held_owned(HUGE, 200, &fields), S(360));
    }
}

/// `Pushback::new`: "holds of at most ten minutes"; the module: "Whatever a response says, no
/// hold is longer than `max_hold` (ten minutes by default)": a pushback built without
/// `max_hold` cuts every form of hold to ten minutes.
#[test]
fn the_default_max_hold_is_ten_minutes_in_every_form() {
    let cases: Vec<(u16, Fields)> = vec![
        (429, one("retry-after", 86400)),
        (429, one("retry-after", date_in(86_400))),
        (429, one("retry-after-ms", 86400000)),
        (200, one("ratelimit", r#""p";r=0;t=86400"#)),
        (200, spent(X_RESET, T0 + 86_400)),
        (200, spent(OPENAI_REQUESTS, "24h")),
        (200, spent(anthropic("tokens"), rfc3339_in(86_400))),
    ];
    for (status, fields) in cases {
        let clock = tower_bulwark::clock::ManualClock::new();
        let pushback = Pushback::builder("default").clock(clock).build();
        pushback.observe(&answer_str(status, &borrowed(&with_date(&fields))));
        assert_eq!(pushback.held_for(), TEN_MIN, "{status} {fields:?}");
        assert_eq!(TEN_MIN, crate::DEFAULT_MAX_HOLD);
    }
}

/// "`X-RateLimit-Remaining` with `X-RateLimit-Reset-After` or `X-RateLimit-Reset` [...]: what
/// is left until the reset: Reset-After in decimal seconds when present, else the reset as
/// below": a readable Reset-After of zero (or a fraction of a nanosecond) is present, so it
/// counts over a later Reset, in either order of the fields.
#[test]
fn a_reset_after_of_zero_is_present_and_counts_before_the_reset() {
    for reset_after in ["0", "0.0", "0.000"] {
        for reset in [(T0 + 30).to_string(), "30".to_string()] {
            for order in 0..2 {
                let mut fields = vec![
                    ("date", date0()),
                    ("x-ratelimit-remaining", "0".to_string()),
                ];
                let pair = [
                    ("x-ratelimit-reset-after", reset_after.to_string()),
                    ("x-ratelimit-reset", reset.clone()),
                ];
                if order == 0 {
                    fields.extend(pair);
                } else {
                    fields.extend(pair.into_iter().rev());
                }
                assert_eq!(held_owned(HUGE, 200, &fields), Duration::ZERO, "{fields:?}");
            }
        }
    }
}

/// `PushbackBuilder::dialect`: "The span is capped at `max_hold`; of all the quotas an answer
/// gives, the most restrictive counts", and the module: "for X-RateLimit-*, RateLimit-* and
/// dialects of the user's, the later of the two counts" (beside a Retry-After).
#[test]
fn a_users_dialect_is_capped_and_weighed_like_the_others() {
    let build = |max_hold: Duration| {
        let clock = tower_bulwark::clock::ManualClock::new();
        Pushback::builder("user")
            .clock(clock)
            .max_hold(max_hold)
            .dialect(|headers| {
                let value = headers.get("x-partner-quota")?.to_str().ok()?;
                let (left, seconds) = value.split_once('/')?;
                Some((
                    left.parse().ok()?,
                    Duration::from_secs(seconds.parse().ok()?),
                ))
            })
            .build()
    };
    type Case<'a> = (u16, Vec<(&'a str, &'a str)>, Duration, Duration);
    let cases: Vec<Case> = vec![
        (200, vec![("x-partner-quota", "0/30")], HUGE, S(30)),
        (
            200,
            vec![("x-partner-quota", "0/18446744073709551615")],
            S(45),
            S(45),
        ),
        (
            429,
            vec![("x-partner-quota", "0/30"), ("retry-after", "5")],
            HUGE,
            S(30),
        ),
        (
            429,
            vec![("x-partner-quota", "0/5"), ("retry-after", "30")],
            HUGE,
            S(30),
        ),
        (
            200,
            vec![
                ("x-partner-quota", "0/5"),
                ("ratelimit", r#""a";r=3;t=100"#),
            ],
            HUGE,
            S(5),
        ),
        (
            200,
            vec![
                ("x-partner-quota", "3/5"),
                ("ratelimit", r#""a";r=0;t=100"#),
            ],
            HUGE,
            S(100),
        ),
    ];
    for (status, fields, max_hold, expected) in cases {
        let pushback = build(max_hold);
        pushback.observe(&answer_str(status, &fields));
        assert_eq!(pushback.held_for(), expected, "{status} {fields:?}");
    }
}

/// "Another field on several lines counts where they all say the same (a proxy and the server
/// may each add it) and is ignored, logged, where they differ". `X-RateLimit-Remaining: 0` twice
/// with a reset a minute away holds that minute, as one line does; two lines that disagree say
/// nothing. The same line twice was ignored, and calls went out.
#[test]
fn a_field_repeated_alike_on_several_lines_counts_once() {
    let twice = |first: &str, second: &str| -> Fields {
        vec![
            ("x-ratelimit-remaining", first.to_string()),
            ("x-ratelimit-remaining", second.to_string()),
            ("x-ratelimit-reset-after", "60".to_string()),
        ]
    };
    assert_eq!(held_owned(TEN_MIN, 200, &twice("0", "0")), S(60));
    assert_eq!(held_owned(TEN_MIN, 200, &spent(X_RESET_AFTER, 60)), S(60));
    assert_eq!(held_owned(TEN_MIN, 200, &twice("0", "5")), Duration::ZERO);
}

/// "An answer that advertises several quotas holds calls by each of them":
/// `"burst";r=0;t=1, "day";r=2;t=3600`, a second later, lets two of twenty calls that stay in
/// flight go, as the day's quota allows (all twenty went while only the most restrictive quota
/// was kept).
#[tokio::test]
async fn several_quotas_in_one_answer_each_hold_calls() {
    let (pushback, clock) = make(TEN_MIN);
    pushback.observe(&answer(
        200,
        &[("ratelimit", &br#""burst";r=0;t=1, "day";r=2;t=3600"#[..])],
    ));
    clock.advance(S(1));
    let reached = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&reached);
    let mut client = pushback.layer().layer(service_fn(move |_: ()| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<Response<()>, BoxError>>()
    }));
    let mut in_flight = Vec::new();
    for _ in 0..20 {
        if tokio::time::timeout(S(1), client.ready()).await.is_err() {
            break;
        }
        in_flight.push(client.call(()));
    }
    assert_eq!(reached.load(Ordering::SeqCst), 2);
}
