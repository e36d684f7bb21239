//! Attacks on `Pushback` from what its docs promise, about what answers say: answers that arrive
//! out of order, pacing that a newer answer loosens, `held_for` against what a call meets, and
//! hostile header values. Time is a `ManualClock` or tokio's paused timer; no test sleeps to
//! pass.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::DEFAULT_MAX_HOLD;
use http::StatusCode;
use tokio::sync::oneshot;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::outbound;
use tower_bulwark::outbound::pushback::Pacing;
use tower_bulwark::BoxError;

use crate::common::response;

use super::dialects_support::held_with;
use super::hostile_support::*;

// ---------------------------------------------------------------------------------------------
// Answers out of order.

/// A 429 says "nothing left for 60 s" through `RateLimit`; the answer to a call that was on
/// its way before it, and that the server may well have written first, arrives after it and
/// says 5 left. The dependency's newest word must not be loosened by an older one.
#[tokio::test]
async fn an_older_lenient_answer_does_not_lift_an_exhausted_quota() {
    let (pushback, clock) = manual();
    let (client, calls) = scripted_client(&pushback);
    let early = start(&client).await;
    let late = start(&client).await;
    let late = answer_call(late, response(429, &[("ratelimit", r#""p";r=0;t=60"#)])).await;
    assert_eq!(late.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(pushback.held_for(), Duration::from_secs(60));
    answer_call(early, response(200, &[("ratelimit", r#""p";r=5;t=60"#)])).await;
    assert_eq!(pushback.held_for(), Duration::from_secs(60));
    assert_eq!(refused(&client), Duration::from_secs(60));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    clock.advance(Duration::from_secs(60));
    assert_eq!(pushback.held_for(), Duration::ZERO);
}

/// Both say nothing is left; the older one says for a shorter time. The exhausted window must
/// not be shortened by it.
#[tokio::test]
async fn an_older_answer_does_not_shorten_an_exhausted_window() {
    let (pushback, clock) = manual();
    let (client, calls) = scripted_client(&pushback);
    answer_out_of_order(
        &client,
        response(200, &[("ratelimit", r#""p";r=0;t=60"#)]),
        response(200, &[("ratelimit", r#""p";r=0;t=1"#)]),
    )
    .await;
    clock.advance(Duration::from_secs(1));
    assert_eq!(refused(&client), Duration::from_secs(59));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// An older answer that is stricter still counts: out of order, the stricter word wins.
#[tokio::test]
async fn an_older_stricter_answer_still_tightens() {
    let (pushback, _clock) = manual();
    let (client, _) = scripted_client(&pushback);
    answer_out_of_order(
        &client,
        response(200, &[("ratelimit", r#""p";r=50;t=60"#)]),
        response(200, &[("ratelimit", r#""p";r=0;t=30"#)]),
    )
    .await;
    assert_eq!(pushback.held_for(), Duration::from_secs(30));
}

/// What an older answer spent is part of the quota in force, not a `Retry-After`: a newer
/// answer saying the window has reset lets calls go again.
#[tokio::test]
async fn a_newer_answer_lifts_what_an_older_one_spent() {
    let (pushback, _clock) = manual();
    let (client, calls) = scripted_client(&pushback);
    answer_out_of_order(
        &client,
        response(200, &[("ratelimit", r#""p";r=50;t=60"#)]),
        response(200, &[("ratelimit", r#""p";r=0;t=30"#)]),
    )
    .await;
    assert_eq!(refused(&client), Duration::from_secs(30));
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=10;t=60"#)]));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    answer_call(start(&client).await, response(200, &[])).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// In order, a newer answer replaces the older one: a window that reset lets calls go again.
#[tokio::test]
async fn a_newer_answer_still_replaces_an_older_one() {
    let (pushback, _clock) = manual();
    let (client, _) = scripted_client(&pushback);
    answer_call(
        start(&client).await,
        response(200, &[("ratelimit", r#""p";r=0;t=60"#)]),
    )
    .await;
    assert_eq!(pushback.held_for(), Duration::from_secs(60));
    // An answer obtained elsewhere, after it, says the window has reset.
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=10;t=60"#)]));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    answer_call(start(&client).await, response(200, &[])).await;
}

/// The answer to call 0 (`r=0;t=1`) arrives after call 1's newer `r=5;t=10`. The older answer
/// may hold calls for its second, but not shrink the newer window to it: 32 callers started
/// at 601 ms, willing to wait a second, must not all reach the dependency when that second
/// ends. At most the newer answer's calls go before its window ends, and none before the older
/// answer's second has passed.
#[tokio::test(start_paused = true)]
async fn an_older_spent_answer_does_not_shrink_a_newer_window() {
    let pushback = tokio_waiting_up_to(Duration::from_secs(1));
    let start = tokio::time::Instant::now();
    let reached = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let dependency = {
        let reached = reached.clone();
        service_fn(move |()| {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            let reached = reached.clone();
            async move {
                let ratelimit = match call {
                    0 => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        r#""p";r=0;t=1"#
                    }
                    1 => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        r#""p";r=5;t=10"#
                    }
                    _ => {
                        reached.lock().unwrap().push(start.elapsed());
                        return Ok::<_, BoxError>(response(200, &[]));
                    }
                };
                Ok(response(200, &[("ratelimit", ratelimit)]))
            }
        })
    };
    let client = pushback.layer().layer(dependency);
    let call_0 = tokio::spawn(client.clone().oneshot(()));
    tokio::task::yield_now().await;
    let call_1 = tokio::spawn(client.clone().oneshot(()));
    call_1.await.unwrap().unwrap();
    call_0.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(500));

    tokio::time::sleep_until(start + Duration::from_millis(601)).await;
    let callers: Vec<_> = (0..32)
        .map(|_| tokio::spawn(client.clone().oneshot(())))
        .collect();
    let window_end = Duration::from_millis(10_100);
    for caller in callers {
        if let Err(err) = caller.await.unwrap() {
            let wait = outbound::retry_after(&*err).expect("refused by the pushback");
            assert!(
                start.elapsed() + wait >= window_end,
                "told to come back before the window ends"
            );
        }
    }
    let reached = reached.lock().unwrap().clone();
    assert!(
        reached.iter().all(|at| *at >= Duration::from_millis(1_500)),
        "{reached:?}"
    );
    assert!(
        reached.len() <= 5,
        "{} callers reached the dependency within the window of 5",
        reached.len()
    );
    // Call 0 was in flight when the newer answer came, so it may be one of the five.
    assert_eq!(reached.len(), 4);
}

/// Field by field, an older answer may only tighten: it neither lifts nor shortens, and it
/// never drops or loosens the policy that refills the windows after. Each case: the newer
/// answer, the older one arriving after it, how long the calls are counted, and the most
/// calls the dependency's words allow in that time.
#[tokio::test]
async fn an_older_answer_tightens_field_by_field() {
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        &'a [(&'a str, &'a str)],
        u64,
        usize,
    );
    let cases: [Case; 4] = [
        // Fewer left: the budget falls to the older answer's.
        (
            &[("ratelimit", r#""p";r=5;t=10"#)],
            &[("ratelimit", r#""p";r=2;t=10"#)],
            10,
            2,
        ),
        // More left, but over a longer window: the newer window does not end the older one.
        (
            &[("ratelimit", r#""p";r=2;t=10"#)],
            &[("ratelimit", r#""p";r=5;t=60"#)],
            60,
            5,
        ),
        // Fewer left, and no policy: the newer answer's policy still refills the windows after
        // (5 in the first 10 s, 5 in the next 10 s).
        (
            &[
                ("ratelimit", r#""p";r=5;t=10"#),
                ("ratelimit-policy", r#""p";q=5;w=10"#),
            ],
            &[("ratelimit", r#""p";r=1;t=10"#)],
            20,
            6,
        ),
        // More left, but a stricter policy: one call per minute after the window.
        (
            &[
                ("ratelimit", r#""p";r=5;t=10"#),
                ("ratelimit-policy", r#""p";q=100;w=10"#),
            ],
            &[
                ("ratelimit", r#""p";r=8;t=10"#),
                ("ratelimit-policy", r#""p";q=1;w=60"#),
            ],
            70,
            5,
        ),
    ];
    for (newer, older, seconds, most) in cases {
        let (pushback, clock) = manual();
        let (client, calls) = scripted_client(&pushback);
        answer_out_of_order(&client, response(200, newer), response(200, older)).await;
        let before = calls.load(Ordering::SeqCst);
        // A call every 100 ms: each either reaches the dependency or is refused at once.
        for _ in 0..seconds * 10 {
            let (_tx, rx) = oneshot::channel();
            if let Some(result) = client.clone().oneshot(rx).now_or_never_pending() {
                is_pushed_back(result).expect("refused");
            }
            clock.advance(Duration::from_millis(100));
        }
        let sent = calls.load(Ordering::SeqCst) - before;
        assert!(
            sent <= most,
            "{sent} calls in {seconds} s; {newer:?} then {older:?} allow {most}"
        );
        assert!(sent > 0, "{newer:?} then {older:?}: nothing sent");
    }
}

// ---------------------------------------------------------------------------------------------
// Pacing and `held_for`.

/// `Pacing::Spread`: "one every t / r". One call left in 60 s, then its answer says 100 left in
/// 60 s: the next call is due 600 ms later, not 60 s.
#[tokio::test]
async fn spread_follows_a_newer_looser_answer() {
    let (pushback, clock) = manual_with(Pacing::Spread);
    let (client, calls) = scripted_client(&pushback);
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=1;t=60"#)]));
    let looser = response(200, &[("ratelimit", r#""p";r=100;t=60"#)]);
    answer_call(start(&client).await, looser).await;
    assert!(pushback.held_for() <= Duration::from_millis(600));
    clock.advance(Duration::from_millis(600));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    answer_call(start(&client).await, response(200, &[])).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `held_for` is "how long from now until a call may be sent": when it says zero, a call goes.
/// After an exhausted window whose policy grants `q = 1` while one call is still in flight, the
/// next windows have nothing left for anyone while it stays in flight: the next call goes as the
/// probe, `max_hold` after the last answer.
#[tokio::test]
async fn held_for_agrees_with_what_the_next_call_meets() {
    let (pushback, clock) = manual();
    let (client, _) = scripted_client(&pushback);
    let (_slow_tx, slow) = start(&client).await;
    let exhausted = spent_for_a_second_under(r#""p";q=1;w=10"#);
    answer_call(start(&client).await, exhausted).await;
    clock.advance(Duration::from_secs(1));
    let said = pushback.held_for();
    let (_tx, rx) = oneshot::channel();
    let met = match client.clone().oneshot(rx).now_or_never_pending() {
        Some(result) => is_pushed_back(result).unwrap_or_default(),
        None => Duration::ZERO,
    };
    assert_eq!(said, met, "held_for said {said:?}, the call met {met:?}");
    assert_eq!(met, DEFAULT_MAX_HOLD - Duration::from_secs(1));
    drop(slow);
}

// ---------------------------------------------------------------------------------------------
// Hostile values.

/// Only digits, with an optional fraction (`2.0`, as Shopify writes it), are seconds: a sign,
/// hex, an exponent or a unit is not (on a 503, which has no fallback hold, it holds nothing);
/// whitespace around the number is fine.
#[test]
fn retry_after_is_decimal_seconds_only() {
    for value in [
        "+5", "-5", "0x10", "5 s", "5s", "", "٥", "1e3", ".", "5.5.5", "5,5",
    ] {
        let (pushback, _) = manual();
        let mut answer = response(503, &[]);
        answer.headers_mut().insert(
            "retry-after",
            http::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
        );
        pushback.observe(&answer);
        assert_eq!(pushback.held_for(), Duration::ZERO, "{value:?}");
    }
    assert_eq!(
        held_with(DEFAULT_MAX_HOLD, 503, &[("retry-after", " \t7 ")]),
        Duration::from_secs(7)
    );
    assert_eq!(
        held_with(DEFAULT_MAX_HOLD, 503, &[("retry-after", "5.5")]),
        Duration::from_millis(5_500)
    );
}

/// RFC 9110 asks recipients to read the obsolete RFC 850 and asctime forms of an HTTP-date.
#[test]
fn retry_after_dates_in_obsolete_formats_are_read() {
    for value in [
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
    ] {
        let answered = [
            ("date", "Sun, 06 Nov 1994 08:49:07 GMT"),
            ("retry-after", value),
        ];
        let held = held_with(DEFAULT_MAX_HOLD, 429, &answered);
        assert_eq!(held, Duration::from_secs(30), "{value:?}");
    }
}

/// A `Date` that lies, far in the past or the future, moves a Retry-After date at most to
/// `max_hold` or to nothing, never past `max_hold`.
#[test]
fn a_lying_date_field_holds_no_longer_than_max_hold() {
    let soon = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
    for date in [
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "not a date",
    ] {
        let held = held_with(
            DEFAULT_MAX_HOLD,
            429,
            &[("date", date), ("retry-after", soon.as_str())],
        );
        assert!(held <= DEFAULT_MAX_HOLD, "{date}");
    }
    assert_eq!(
        held_with(
            DEFAULT_MAX_HOLD,
            429,
            &[
                ("date", "Thu, 01 Jan 1970 00:00:00 GMT"),
                ("retry-after", soon.as_str()),
            ]
        ),
        DEFAULT_MAX_HOLD
    );
}

/// `t=0`, `w=0`, `r` above `q`, a repeated parameter (the last one counts, RFC 9651).
#[test]
fn degenerate_ratelimit_values() {
    let cases: [(&str, &str, Duration); 6] = [
        (r#""p";r=0;t=0"#, "", Duration::ZERO),
        (r#""p";r=0"#, r#""p";q=5;w=0"#, Duration::ZERO),
        (r#""p";r=50;t=10"#, r#""p";q=5;w=10"#, Duration::ZERO),
        (r#""p";r=0;r=5;t=10"#, "", Duration::ZERO),
        (r#""p";r=5;r=0;t=10"#, "", Duration::from_secs(10)),
        (r#""p";r=0;t=-5"#, "", Duration::from_secs(1)),
    ];
    for (ratelimit, policy, held) in cases {
        let (pushback, _) = manual();
        let mut headers = vec![("ratelimit", ratelimit)];
        if !policy.is_empty() {
            headers.push(("ratelimit-policy", policy));
        }
        pushback.observe(&response(200, &headers));
        assert_eq!(pushback.held_for(), held, "{ratelimit} / {policy}");
    }
}

/// Around the seconds / Unix-time boundary of `X-RateLimit-Reset`.
#[test]
fn x_ratelimit_reset_around_the_boundary() {
    assert_eq!(
        held_with(
            DEFAULT_MAX_HOLD,
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "999999999"),
            ]
        ),
        DEFAULT_MAX_HOLD
    );
    assert_eq!(
        held_with(
            DEFAULT_MAX_HOLD,
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1000000000"),
            ]
        ),
        Duration::ZERO
    );
    // Against the server's own Date: 2001-09-09T01:46:40Z is 1 000 000 000.
    assert_eq!(
        held_with(
            DEFAULT_MAX_HOLD,
            200,
            &[
                ("date", "Sun, 09 Sep 2001 01:46:40 GMT"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1000000045"),
            ]
        ),
        Duration::from_secs(45)
    );
}
