//! Pushback under hostile answers: arbitrary bytes in every field it reads, absurd numbers and
//! dates, many lines. It never panics and never holds a call longer than `max_hold`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Response};
use proptest::prelude::*;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::outbound::pushback::Pacing;
use tower_bulwark::outbound::{self, Pushback};
use tower_bulwark::{clock::ManualClock, BoxError};

const FIELDS: &[&str] = &[
    "retry-after",
    "date",
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
    "retry-after-ms",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
];

/// Values that look almost right: the shapes a broken or hostile server sends.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        "[0-9]{1,40}".prop_map(String::into_bytes),
        "-[0-9]{1,20}".prop_map(String::into_bytes),
        "[0-9]{1,10}(, ?[0-9]{1,10}){1,50}".prop_map(String::into_bytes),
        "[A-Z][a-z]{2}, [0-9]{2} [A-Z][a-z]{2} [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT"
            .prop_map(String::into_bytes),
        Just(b"Fri, 31 Dec 9999 23:59:59 GMT".to_vec()),
        Just(b"Thu, 01 Jan 1970 00:00:00 GMT".to_vec()),
        (any::<i64>(), any::<i64>(), any::<i64>())
            .prop_map(
                |(r, t, q)| format!("\"p\";r={r};t={t}, \"q\";r={t};t={q};w={r}").into_bytes()
            ),
        (0u64..1_000_000_000_000_000, 0u64..1_000_000_000_000_000)
            .prop_map(|(q, w)| format!("\"p\";q={q};w={w}").into_bytes()),
        "(\"p\";r=[0-9]{1,3}(, )?){1,200}".prop_map(String::into_bytes),
        // Decimal seconds, Unix times of every magnitude, Go durations, RFC 3339 times.
        "[0-9]{0,25}(\\.[0-9]{0,30})?".prop_map(String::into_bytes),
        "([0-9]{1,22}(\\.[0-9]{0,12})?(h|m|s|ms|us|µs|ns|x)){1,6}".prop_map(String::into_bytes),
        "[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,12})?(Z|[+-][0-9]{2}:[0-9]{2})?"
            .prop_map(String::into_bytes),
    ]
}

fn answer() -> impl Strategy<Value = (u16, Vec<(usize, Vec<u8>)>)> {
    (
        prop_oneof![Just(200u16), Just(403), Just(429), Just(503), 100u16..600],
        proptest::collection::vec((0..FIELDS.len(), value()), 0..12),
    )
}

fn build(status: u16, fields: &[(usize, Vec<u8>)]) -> Response<()> {
    let mut response = Response::new(());
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
    for (field, bytes) in fields {
        // Bytes no header value may hold are refused by `http` before any reader sees them.
        if let Ok(value) = HeaderValue::from_bytes(bytes) {
            response.headers_mut().append(FIELDS[*field], value);
        }
    }
    response
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn no_answer_panics_or_holds_beyond_max_hold(
        max_hold_ms in 0u64..3_600_000,
        spread in any::<bool>(),
        answers in proptest::collection::vec(answer(), 1..6),
        steps in proptest::collection::vec(0u64..10_000_000_000, 1..6),
    ) {
        let clock = ManualClock::new();
        let max_hold = Duration::from_millis(max_hold_ms);
        let pushback = Pushback::builder("hostile")
            .clock(clock.clone())
            .max_hold(max_hold)
            .pacing(if spread { Pacing::Spread } else { Pacing::UntilSpent })
            .build();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let client = pushback.layer().layer(service_fn(move |()| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(Response::new(())) }
        }));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for ((status, fields), step) in answers.iter().zip(steps.iter().cycle()) {
            pushback.observe(&build(*status, fields));
            prop_assert!(pushback.held_for() <= max_hold, "{:?} > {:?}", pushback.held_for(), max_hold);
            let result = runtime.block_on(client.clone().oneshot(()));
            if let Err(err) = result {
                let wait = outbound::retry_after(&*err).expect("only refusals fail");
                prop_assert!(wait <= max_hold);
            }
            clock.advance(Duration::from_nanos(*step));
        }
        // Once max_hold has passed, whatever was said last, a hold is over: only a window the
        // dependency's policy grants nothing in can hold a call, and then at most max_hold.
        clock.advance(max_hold);
        prop_assert!(pushback.held_for() <= max_hold);
    }

    /// A `Retry-After` of digits holds exactly its seconds, capped; one of anything else holds
    /// the one second of a 429 without a time, or nothing.
    #[test]
    fn retry_after_digits_are_exact_and_capped(seconds in any::<u64>(), max_hold_s in 0u64..100_000) {
        let pushback = Pushback::builder("p")
            .clock(ManualClock::new())
            .max_hold(Duration::from_secs(max_hold_s))
            .build();
        let mut response = Response::new(());
        *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
        response.headers_mut().insert("retry-after", seconds.into());
        pushback.observe(&response);
        prop_assert_eq!(pushback.held_for(), Duration::from_secs(seconds.min(max_hold_s)));
    }
}

#[test]
fn a_flood_of_lines_is_ignored_without_quadratic_work() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("p").clock(clock).build();
    let mut response = Response::new(());
    for _ in 0..10_000 {
        response
            .headers_mut()
            .append("ratelimit", HeaderValue::from_static("\"p\";r=0;t=5"));
    }
    pushback.observe(&response);
    assert_eq!(
        pushback.held_for(),
        Duration::ZERO,
        "over 16 lines: ignored"
    );
    let mut response = Response::new(());
    response.headers_mut().insert(
        "ratelimit",
        HeaderValue::from_str(&"\"p\";r=0;t=5, ".repeat(1000)).unwrap(),
    );
    pushback.observe(&response);
    assert_eq!(pushback.held_for(), Duration::ZERO, "over 4 KiB: ignored");
}

/// "Fields over 4 KiB are ignored": a field of one line up to 4 096 bytes is read, one of
/// 4 097 is not; over several lines, the ", " that joins them counts.
#[test]
fn a_ratelimit_field_is_read_up_to_exactly_4_kib() {
    let field = |bytes: usize| {
        let tail = "\";r=0;t=30";
        format!("\"{}{tail}", "n".repeat(bytes - tail.len() - 1))
    };
    for (bytes, held) in [(4_094, true), (4_095, true), (4_096, true), (4_097, false)] {
        let pushback = Pushback::builder("p").clock(ManualClock::new()).build();
        let mut response = Response::new(());
        let value = field(bytes);
        assert_eq!(value.len(), bytes);
        response
            .headers_mut()
            .insert("ratelimit", HeaderValue::from_str(&value).unwrap());
        pushback.observe(&response);
        let expected = if held {
            Duration::from_secs(30)
        } else {
            Duration::ZERO
        };
        assert_eq!(pushback.held_for(), expected, "a field of {bytes} bytes");
    }
    // Two lines of 2 047 bytes are 4 096 with the separator; of 2 048, 4 098.
    for (line, held) in [(2_047, true), (2_048, false)] {
        let pushback = Pushback::builder("p").clock(ManualClock::new()).build();
        let mut response = Response::new(());
        for _ in 0..2 {
            let value = HeaderValue::from_str(&field(line)).unwrap();
            response.headers_mut().append("ratelimit", value);
        }
        pushback.observe(&response);
        let expected = if held {
            Duration::from_secs(30)
        } else {
            Duration::ZERO
        };
        assert_eq!(pushback.held_for(), expected, "two lines of {line} bytes");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// After an answer saying `r` calls are left for `t` seconds (and a policy of `q` per `w`),
    /// however calls and time are interleaved: at most `r` start before `t` has passed, at most
    /// `q` in each of the pushback's later windows, and none while a `Retry-After` holds. With
    /// nothing left and a `Retry-After` beside it, the window ends when the `Retry-After` does,
    /// if sooner (draft-11: Retry-After takes precedence over the reset).
    #[test]
    fn never_more_calls_than_advertised(
        r in 0u64..12,
        t in 1u64..20,
        q in 0u64..12,
        w in 1u64..20,
        retry_after in proptest::option::of(0u64..30),
        spread in any::<bool>(),
        steps in proptest::collection::vec((0u64..3_000, 0usize..6), 1..60),
    ) {
        let clock = ManualClock::new();
        let pushback = Pushback::builder("p")
            .clock(clock.clone())
            .pacing(if spread { Pacing::Spread } else { Pacing::UntilSpent })
            .build();
        let client = pushback.layer().layer(service_fn(|()| async {
            Ok::<_, BoxError>(Response::new(()))
        }));
        let mut headers = vec![
            (2usize, format!("\"p\";r={r};t={t}").into_bytes()),
            (3, format!("\"p\";q={q};w={w}").into_bytes()),
        ];
        let status = match retry_after {
            Some(seconds) => {
                headers.push((0, seconds.to_string().into_bytes()));
                429
            }
            None => 200,
        };
        pushback.observe(&build(status, &headers));
        let hold_ms = retry_after.unwrap_or(0) * 1000;
        let t = match retry_after {
            Some(seconds) if r == 0 => t.min(seconds),
            _ => t,
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut elapsed_ms = 0u64;
        let mut first_window = 0u64;
        // The pushback's own windows after the first: (start, calls admitted in it).
        let mut later: Option<(u64, u64)> = None;
        for (advance, calls) in steps {
            clock.advance(Duration::from_millis(advance));
            elapsed_ms += advance;
            for _ in 0..calls {
                if runtime.block_on(client.clone().oneshot(())).is_err() {
                    continue;
                }
                prop_assert!(elapsed_ms >= hold_ms, "a call at {elapsed_ms} ms during a hold of {hold_ms} ms");
                if elapsed_ms < t * 1000 {
                    first_window += 1;
                    prop_assert!(first_window <= r, "{first_window} calls within t, r = {r}");
                } else {
                    let (start, count) = match later {
                        Some((start, count)) if elapsed_ms < start + w * 1000 => (start, count + 1),
                        _ => (elapsed_ms, 1),
                    };
                    prop_assert!(count <= q, "{count} calls in a window of {w} s, q = {q}");
                    later = Some((start, count));
                }
            }
        }
    }
}

/// An advertised quota as a test writes it: `r` calls left within `t` seconds, and perhaps a
/// policy of `q` per `w` seconds.
fn advertised() -> impl Strategy<Value = (u64, u64, Option<(u64, u64)>)> {
    (0u64..8, 1u64..20, proptest::option::of((0u64..8, 1u64..20)))
}

fn answer_of((r, t, policy): (u64, u64, Option<(u64, u64)>)) -> Response<()> {
    let mut fields = vec![(2usize, format!("\"p\";r={r};t={t}").into_bytes())];
    if let Some((q, w)) = policy {
        fields.push((3, format!("\"p\";q={q};w={w}").into_bytes()));
    }
    build(200, &fields)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Call 0 and call 1 are in flight; call 1's answer arrives first, then call 0's older one.
    /// However calls and time are interleaved after them, neither answer's word is broken:
    /// within the newer answer's `t`, at most its `r` less call 0 (in flight when it came);
    /// within the older answer's `t`, at most its `r`.
    #[test]
    fn answers_out_of_order_never_allow_more_than_either(
        newer in advertised(),
        older in advertised(),
        spread in any::<bool>(),
        steps in proptest::collection::vec((0u64..3_000, 0usize..4), 1..60),
    ) {
        let clock = ManualClock::new();
        let pushback = Pushback::builder("p")
            .clock(clock.clone())
            .pacing(if spread { Pacing::Spread } else { Pacing::UntilSpent })
            .build();
        let client = pushback.layer().layer(service_fn(
            |answer: tokio::sync::oneshot::Receiver<Response<()>>| async move {
                Ok::<_, BoxError>(answer.await?)
            },
        ));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (newer_r, newer_t, _) = newer;
        let (older_r, older_t, _) = older;
        let (mut in_newer, mut in_older) = (0u64, 0u64);
        let mut elapsed_ms = 0u64;
        runtime.block_on(async {
            let (older_tx, older_rx) = tokio::sync::oneshot::channel();
            let mut call_0 = Box::pin(client.clone().oneshot(older_rx));
            assert!(futures::poll!(&mut call_0).is_pending());
            let (newer_tx, newer_rx) = tokio::sync::oneshot::channel();
            let mut call_1 = Box::pin(client.clone().oneshot(newer_rx));
            assert!(futures::poll!(&mut call_1).is_pending());
            newer_tx.send(answer_of(newer)).unwrap();
            call_1.await.unwrap();
            older_tx.send(answer_of(older)).unwrap();
            call_0.await.unwrap();
            for (advance, calls) in steps {
                clock.advance(Duration::from_millis(advance));
                elapsed_ms += advance;
                for _ in 0..calls {
                    // The sender is dropped: a call that reaches the dependency fails there.
                    let (_, rx) = tokio::sync::oneshot::channel();
                    let err = client.clone().oneshot(rx).await.unwrap_err();
                    if err.is::<tower_bulwark::outbound::PushedBack>() {
                        continue;
                    }
                    if elapsed_ms < newer_t * 1000 {
                        in_newer += 1;
                        prop_assert!(in_newer <= newer_r.saturating_sub(1), "{in_newer} calls within the newer t, r = {newer_r}");
                    }
                    if elapsed_ms < older_t * 1000 {
                        in_older += 1;
                        prop_assert!(in_older <= older_r, "{in_older} calls within the older t, r = {older_r}");
                    }
                }
            }
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A refusal names the first instant a call can go, given nothing new is heard: a
    /// nanosecond before it a call is still refused, and told one nanosecond; at it, a call
    /// reaches the dependency. With answers arriving over time (quotas, policies whose `q` is
    /// zero or no more than the calls in flight, `Retry-After`s), calls that never end, either
    /// pacing, and a `max_hold` short enough for the probe that ends a wait for windows that
    /// give nothing to come into play.
    #[test]
    fn a_refusal_names_the_first_instant_a_call_can_go(
        max_hold_s in 1u64..40,
        spread in any::<bool>(),
        stuck in 0usize..3,
        answers in proptest::collection::vec((advertised(), proptest::option::of(0u64..30)), 1..4),
        steps in proptest::collection::vec(0u64..6_000, 1..30),
    ) {
        use futures::FutureExt;

        let clock = ManualClock::new();
        let max_hold = Duration::from_secs(max_hold_s);
        let pushback = Pushback::builder("p")
            .clock(clock.clone())
            .max_hold(max_hold)
            .pacing(if spread { Pacing::Spread } else { Pacing::UntilSpent })
            .build();
        let reached = Arc::new(AtomicUsize::new(0));
        let counted = reached.clone();
        let client = pushback.layer().layer(service_fn(
            move |answer: tokio::sync::oneshot::Receiver<Response<()>>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ok::<_, BoxError>(answer.await?) }
            },
        ));
        // Calls that never end: their senders are kept and never used.
        let mut never_ending = Vec::new();
        for _ in 0..stuck {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut call = Box::pin(client.clone().oneshot(rx));
            prop_assert!((&mut call).now_or_never().is_none());
            never_ending.push((tx, call));
        }
        // A call whose sender is dropped: refused at once (`Some(wait)`), or it reaches the
        // dependency and fails there at once (`None`).
        let call = || {
            let before = reached.load(Ordering::SeqCst);
            let (_, rx) = tokio::sync::oneshot::channel();
            let err = client.clone().oneshot(rx).now_or_never().expect("at once").unwrap_err();
            let wait = outbound::retry_after(&*err);
            assert_eq!(wait.is_none(), reached.load(Ordering::SeqCst) > before);
            wait
        };
        for (i, advance) in steps.into_iter().enumerate() {
            clock.advance(Duration::from_millis(advance));
            if let Some(&(quota, retry_after)) = answers.get(i) {
                let mut response = answer_of(quota);
                if let Some(seconds) = retry_after {
                    *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                    response.headers_mut().insert("retry-after", seconds.into());
                }
                pushback.observe(&response);
            }
            let Some(wait) = call() else { continue };
            prop_assert!(!wait.is_zero() && wait <= max_hold, "told {wait:?}");
            clock.advance(wait - Duration::from_nanos(1));
            prop_assert_eq!(call(), Some(Duration::from_nanos(1)), "told {:?}", wait);
            clock.advance(Duration::from_nanos(1));
            prop_assert_eq!(call(), None, "told {:?}, then refused", wait);
        }
        drop(never_ending);
    }
}
