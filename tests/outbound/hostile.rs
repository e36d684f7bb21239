//! Attacks on the outbound layers from what their docs promise: answers that arrive out of
//! order, pacing that a newer answer loosens, `held_for` against what a call meets, hostile
//! header values, calls in flight ended every way, and client quotas under races, drops and
//! tower's wrappers. Time is a `ManualClock` or tokio's paused timer; no test sleeps to pass.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::{Response, StatusCode};
use tokio::sync::oneshot;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_bulwark::outbound::pushback::{Pacing, DEFAULT_MAX_HOLD};
use tower_bulwark::outbound::{self, ClientQuotaLayer, Pushback, PushedBack, QuotaExhausted};
use tower_bulwark::{
    clock::{ManualClock, TokioClock},
    limiter::InsufficientCapacity,
    BoxError, DirectRateLimiter, Quota,
};

use crate::common::response;

fn manual() -> (Pushback<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (
        Pushback::builder("partner").clock(clock.clone()).build(),
        clock,
    )
}

/// A dependency that answers each call with the response sent on the call's own channel, so
/// that a test chooses the order in which answers arrive. Counts the calls that reach it.
fn scripted(
    calls: Arc<AtomicUsize>,
) -> impl Service<
    oneshot::Receiver<Response<()>>,
    Response = Response<()>,
    Error = BoxError,
    Future: Send,
> + Clone {
    service_fn(move |answer: oneshot::Receiver<Response<()>>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(answer.await?) }
    })
}

/// Starts a call through `client` and polls it once so that it is at the dependency.
async fn start<S>(
    client: &S,
) -> (
    oneshot::Sender<Response<()>>,
    Pin<Box<impl Future<Output = Result<Response<()>, BoxError>>>>,
)
where
    S: Service<oneshot::Receiver<Response<()>>, Response = Response<()>, Error = BoxError> + Clone,
{
    let (tx, rx) = oneshot::channel();
    let mut call = Box::pin(client.clone().oneshot(rx));
    assert!(futures::poll!(&mut call).is_pending());
    (tx, call)
}

fn is_pushed_back(result: Result<Response<()>, BoxError>) -> Option<Duration> {
    let err = result.err()?;
    assert!(err.is::<PushedBack>(), "{err}");
    outbound::retry_after(&*err)
}

/// A new call through `client`, which must be refused at once: the time it is told to wait.
fn refused<S>(client: &S) -> Duration
where
    S: Service<oneshot::Receiver<Response<()>>, Response = Response<()>, Error = BoxError> + Clone,
{
    let (_tx, rx) = oneshot::channel();
    match client.clone().oneshot(rx).now_or_never_pending() {
        Some(result) => is_pushed_back(result).expect("refused"),
        None => panic!("the call reached the dependency"),
    }
}

// ---------------------------------------------------------------------------------------------
// Answers out of order.

/// A 429 says "nothing left for 60 s" through `RateLimit`; the answer to a call that was on
/// its way before it, and that the server may well have written first, arrives after it and
/// says 5 left. The dependency's newest word must not be loosened by an older one.
#[tokio::test]
async fn an_older_lenient_answer_does_not_lift_an_exhausted_quota() {
    let (pushback, clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (early_tx, early) = start(&client).await;
    let (late_tx, late) = start(&client).await;
    late_tx
        .send(response(429, &[("ratelimit", r#""p";r=0;t=60"#)]))
        .unwrap();
    assert_eq!(late.await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(pushback.held_for(), Duration::from_secs(60));
    early_tx
        .send(response(200, &[("ratelimit", r#""p";r=5;t=60"#)]))
        .unwrap();
    early.await.unwrap();
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
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (early_tx, early) = start(&client).await;
    let (late_tx, late) = start(&client).await;
    late_tx
        .send(response(200, &[("ratelimit", r#""p";r=0;t=60"#)]))
        .unwrap();
    late.await.unwrap();
    early_tx
        .send(response(200, &[("ratelimit", r#""p";r=0;t=1"#)]))
        .unwrap();
    early.await.unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(refused(&client), Duration::from_secs(59));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// An older answer that is stricter still counts: out of order, the stricter word wins.
#[tokio::test]
async fn an_older_stricter_answer_still_tightens() {
    let (pushback, _clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (early_tx, early) = start(&client).await;
    let (late_tx, late) = start(&client).await;
    late_tx
        .send(response(200, &[("ratelimit", r#""p";r=50;t=60"#)]))
        .unwrap();
    late.await.unwrap();
    early_tx
        .send(response(200, &[("ratelimit", r#""p";r=0;t=30"#)]))
        .unwrap();
    early.await.unwrap();
    assert_eq!(pushback.held_for(), Duration::from_secs(30));
}

/// What an older answer spent is part of the quota in force, not a `Retry-After`: a newer
/// answer saying the window has reset lets calls go again.
#[tokio::test]
async fn a_newer_answer_lifts_what_an_older_one_spent() {
    let (pushback, _clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (early_tx, early) = start(&client).await;
    let (late_tx, late) = start(&client).await;
    late_tx
        .send(response(200, &[("ratelimit", r#""p";r=50;t=60"#)]))
        .unwrap();
    late.await.unwrap();
    early_tx
        .send(response(200, &[("ratelimit", r#""p";r=0;t=30"#)]))
        .unwrap();
    early.await.unwrap();
    assert_eq!(refused(&client), Duration::from_secs(30));
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=10;t=60"#)]));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    let (tx, call) = start(&client).await;
    tx.send(response(200, &[])).unwrap();
    call.await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// In order, a newer answer replaces the older one: a window that reset lets calls go again.
#[tokio::test]
async fn a_newer_answer_still_replaces_an_older_one() {
    let (pushback, _clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (tx, call) = start(&client).await;
    tx.send(response(200, &[("ratelimit", r#""p";r=0;t=60"#)]))
        .unwrap();
    call.await.unwrap();
    assert_eq!(pushback.held_for(), Duration::from_secs(60));
    // An answer obtained elsewhere, after it, says the window has reset.
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=10;t=60"#)]));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    let (tx, call) = start(&client).await;
    tx.send(response(200, &[])).unwrap();
    call.await.unwrap();
}

/// The answer to call 0 (`r=0;t=1`) arrives after call 1's newer `r=5;t=10`. The older answer
/// may hold calls for its second, but not shrink the newer window to it: 32 callers started
/// at 601 ms, willing to wait a second, must not all reach the dependency when that second
/// ends. At most the newer answer's calls go before its window ends, and none before the older
/// answer's second has passed.
#[tokio::test(start_paused = true)]
async fn an_older_spent_answer_does_not_shrink_a_newer_window() {
    let pushback = Pushback::builder("partner")
        .clock(TokioClock::new())
        .max_wait(Duration::from_secs(1))
        .build();
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
        let calls = Arc::new(AtomicUsize::new(0));
        let client = pushback.layer().layer(scripted(calls.clone()));
        let (older_tx, older_call) = start(&client).await;
        let (newer_tx, newer_call) = start(&client).await;
        newer_tx.send(response(200, newer)).unwrap();
        newer_call.await.unwrap();
        older_tx.send(response(200, older)).unwrap();
        older_call.await.unwrap();
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
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner")
        .clock(clock.clone())
        .pacing(Pacing::Spread)
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=1;t=60"#)]));
    let (tx, call) = start(&client).await;
    tx.send(response(200, &[("ratelimit", r#""p";r=100;t=60"#)]))
        .unwrap();
    call.await.unwrap();
    assert!(pushback.held_for() <= Duration::from_millis(600));
    clock.advance(Duration::from_millis(600));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    let (tx, call) = start(&client).await;
    tx.send(response(200, &[])).unwrap();
    call.await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `held_for` is "how long from now until a call may be sent": when it says zero, a call goes.
/// After an exhausted window whose policy grants `q = 1` while one call is still in flight, the
/// next windows have nothing left for anyone while it stays in flight: the next call goes as the
/// probe, `max_hold` after the last answer.
#[tokio::test]
async fn held_for_agrees_with_what_the_next_call_meets() {
    let (pushback, clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    let (_slow_tx, slow) = start(&client).await;
    let (tx, call) = start(&client).await;
    tx.send(response(
        200,
        &[
            ("ratelimit-policy", r#""p";q=1;w=10"#),
            ("ratelimit", r#""p";r=0;t=1"#),
        ],
    ))
    .unwrap();
    call.await.unwrap();
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

/// Polls a future once: its output if it is ready, `None` if it is pending (a call that reached
/// the dependency).
trait NowOrNever: Future + Sized {
    fn now_or_never_pending(self) -> Option<Self::Output> {
        let mut fut = Box::pin(self);
        let waker = futures::task::noop_waker();
        match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        }
    }
}
impl<F: Future> NowOrNever for F {}

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
    let (pushback, _) = manual();
    pushback.observe(&response(503, &[("retry-after", " \t7 ")]));
    assert_eq!(pushback.held_for(), Duration::from_secs(7));
    let (pushback, _) = manual();
    pushback.observe(&response(503, &[("retry-after", "5.5")]));
    assert_eq!(pushback.held_for(), Duration::from_millis(5_500));
}

/// RFC 9110 asks recipients to read the obsolete RFC 850 and asctime forms of an HTTP-date.
#[test]
fn retry_after_dates_in_obsolete_formats_are_read() {
    for value in [
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
    ] {
        let (pushback, _) = manual();
        pushback.observe(&response(
            429,
            &[
                ("date", "Sun, 06 Nov 1994 08:49:07 GMT"),
                ("retry-after", value),
            ],
        ));
        assert_eq!(pushback.held_for(), Duration::from_secs(30), "{value:?}");
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
        let (pushback, _) = manual();
        pushback.observe(&response(
            429,
            &[("date", date), ("retry-after", soon.as_str())],
        ));
        assert!(pushback.held_for() <= DEFAULT_MAX_HOLD, "{date}");
    }
    let (pushback, _) = manual();
    pushback.observe(&response(
        429,
        &[
            ("date", "Thu, 01 Jan 1970 00:00:00 GMT"),
            ("retry-after", soon.as_str()),
        ],
    ));
    assert_eq!(pushback.held_for(), DEFAULT_MAX_HOLD);
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
    let (pushback, _) = manual();
    pushback.observe(&response(
        200,
        &[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "999999999"),
        ],
    ));
    assert_eq!(pushback.held_for(), DEFAULT_MAX_HOLD);
    let (pushback, _) = manual();
    pushback.observe(&response(
        200,
        &[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1000000000"),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    // Against the server's own Date: 2001-09-09T01:46:40Z is 1 000 000 000.
    let (pushback, _) = manual();
    pushback.observe(&response(
        200,
        &[
            ("date", "Sun, 09 Sep 2001 01:46:40 GMT"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1000000045"),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::from_secs(45));
}

// ---------------------------------------------------------------------------------------------
// Calls in flight end every way.

/// Every way a call can end stops it counting in flight, exactly once: answered, failed,
/// panicked in `call`, panicked in its future, dropped while running, dropped while held. Then
/// an answer saying 2 left lets exactly 2 calls go.
#[tokio::test(start_paused = true)]
async fn every_ending_releases_a_call_in_flight_exactly_once() {
    let pushback = Pushback::builder("partner")
        .clock(TokioClock::new())
        .max_wait(Duration::from_secs(5))
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    #[derive(Clone, Copy, Debug)]
    enum How {
        Answer,
        Fail,
        PanicInCall,
        PanicInFuture,
        Hang,
    }
    let dependency = {
        let calls = calls.clone();
        service_fn(move |how: How| {
            calls.fetch_add(1, Ordering::SeqCst);
            if let How::PanicInCall = how {
                panic!("in call");
            }
            async move {
                match how {
                    How::Answer => Ok(response(200, &[])),
                    How::Fail => Err::<Response<()>, BoxError>("broken".into()),
                    How::PanicInFuture => panic!("in future"),
                    _ => std::future::pending().await,
                }
            }
        })
    };
    let client = pushback.layer().layer(dependency);
    client.clone().oneshot(How::Answer).await.unwrap();
    client.clone().oneshot(How::Fail).await.unwrap_err();
    let mut svc = client.clone();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(svc.call(How::PanicInCall));
    }));
    assert!(caught.is_err());
    let panicked = tokio::spawn(client.clone().oneshot(How::PanicInFuture)).await;
    assert!(panicked.unwrap_err().is_panic());
    let mut hanging = Box::pin(client.clone().oneshot(How::Hang));
    assert!(futures::poll!(&mut hanging).is_pending());
    drop(hanging);
    // A hold of 2 s, within max_wait: a call waits, and is dropped while it waits.
    pushback.observe(&response(429, &[("retry-after", "2")]));
    let mut held = Box::pin(client.clone().oneshot(How::Answer));
    assert!(futures::poll!(&mut held).is_pending());
    drop(held);
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    tokio::time::advance(Duration::from_secs(2)).await;

    pushback.observe(&response(200, &[("ratelimit", r#""p";r=2;t=60"#)]));
    let mut first = Box::pin(client.clone().oneshot(How::Hang));
    assert!(futures::poll!(&mut first).is_pending());
    let mut second = Box::pin(client.clone().oneshot(How::Hang));
    assert!(futures::poll!(&mut second).is_pending());
    let err = client.clone().oneshot(How::Answer).await.unwrap_err();
    assert!(err.is::<PushedBack>(), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 7);
}

/// Answers 200, except the call numbered 20, which gets a 429 with `Retry-After: 30`; counts the
/// calls that arrive once that answer is on its way.
fn racing_dependency(
    after_429: Arc<std::sync::atomic::AtomicBool>,
    early: Arc<AtomicUsize>,
) -> impl Service<usize, Response = Response<()>, Error = BoxError, Future: Send> + Clone {
    service_fn(move |n: usize| {
        if after_429.load(Ordering::SeqCst) {
            early.fetch_add(1, Ordering::SeqCst);
        }
        let flag = after_429.clone();
        async move {
            tokio::task::yield_now().await;
            if n == 20 {
                let answer = response(429, &[("retry-after", "30")]);
                // Set after the answer is built, before the layer reads it: calls that start
                // from here on may have started before the client could know.
                flag.store(true, Ordering::SeqCst);
                return Ok::<_, BoxError>(answer);
            }
            Ok(response(200, &[]))
        }
    })
}

/// The hold is shared by every clone: 64 tasks on 64 clones, two threads, a 429 arrives while
/// they run; after it, no task reaches the dependency until the hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_clone_calls_during_a_hold_under_a_race() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner").clock(clock.clone()).build();
    let after_429 = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let early = Arc::new(AtomicUsize::new(0));
    let dependency = racing_dependency(after_429.clone(), early.clone());
    let client = pushback.layer().layer(dependency);
    let tasks: Vec<_> = (0..64)
        .map(|n| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut refused = 0;
                for i in 0..20 {
                    match client.clone().oneshot(if i == 0 { n } else { 1000 }).await {
                        Ok(_) => {}
                        Err(err) => {
                            assert!(err.is::<PushedBack>());
                            refused += 1;
                        }
                    }
                    tokio::task::yield_now().await;
                }
                refused
            })
        })
        .collect();
    let mut refused = 0;
    for task in tasks {
        refused += task.await.unwrap();
    }
    assert!(refused > 0);
    // Calls that passed the check between the flag and the layer reading the answer may
    // reach it; they are at most the tasks racing (64), never the rest of their loops.
    assert!(
        early.load(Ordering::SeqCst) <= 64,
        "{}",
        early.load(Ordering::SeqCst)
    );
    assert_eq!(pushback.held_for(), Duration::from_secs(30));
    clock.advance(Duration::from_secs(30));
    assert_eq!(pushback.held_for(), Duration::ZERO);
}

/// `Duration::MAX` for `max_wait` and `max_hold`: a 40-digit Retry-After neither overflows nor
/// panics; a call is held (it would wait), not refused nor sent.
#[tokio::test(start_paused = true)]
async fn absurd_durations_neither_overflow_nor_send() {
    let pushback = Pushback::builder("partner")
        .clock(TokioClock::new())
        .max_wait(Duration::MAX)
        .max_hold(Duration::MAX)
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    pushback.observe(&response(
        429,
        &[("retry-after", "9999999999999999999999999999999999999999")],
    ));
    assert!(pushback.held_for() > Duration::from_secs(100 * 365 * 24 * 3600));
    let (_tx, rx) = oneshot::channel();
    let mut call = Box::pin(client.clone().oneshot(rx));
    assert!(futures::poll!(&mut call).is_pending());
    tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
    assert!(futures::poll!(&mut call).is_pending());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------------------------
// Client quotas.

fn echo(
    calls: Arc<AtomicUsize>,
) -> impl Service<u32, Response = u32, Error = BoxError, Future: Send> + Clone {
    service_fn(move |n: u32| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(n) }
    })
}

/// A cost above what the quota can ever grant is an error at once, not a wait; nothing reaches
/// the dependency, and it carries no retry time (waiting would not help).
#[tokio::test(start_paused = true)]
async fn a_cost_above_capacity_fails_at_once_without_a_retry_time() {
    let quota = Quota::per_second(1)
        .unwrap()
        .with_burst(3)
        .unwrap()
        .with_max_wait(Duration::from_secs(3600))
        .unwrap();
    let limiter = DirectRateLimiter::builder(quota)
        .clock(TokioClock::new())
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter)
        .cost(4)
        .layer(echo(calls.clone()));
    let started = tokio::time::Instant::now();
    let err = client.oneshot(1).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(err.is::<InsufficientCapacity>(), "{err}");
    assert_eq!(outbound::retry_after(&*err), None);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Permits are taken in `call`: a clone readied and never called holds none; a refusal spends
/// nothing; the refusal's time is the next permit's.
#[tokio::test]
async fn a_readied_clone_never_called_holds_nothing() {
    let clock = ManualClock::new();
    let limiter = DirectRateLimiter::builder(Quota::per_second(1).unwrap())
        .clock(clock.clone())
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter).layer(echo(calls.clone()));
    for _ in 0..10 {
        let mut readied = client.clone();
        readied.ready().await.unwrap();
        drop(readied);
    }
    assert_eq!(client.clone().oneshot(1).await.unwrap(), 1);
    for _ in 0..3 {
        let err = client.clone().oneshot(2).await.unwrap_err();
        assert!(err.is::<QuotaExhausted>());
        assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(1)));
    }
    clock.advance(Duration::from_secs(1));
    assert_eq!(client.clone().oneshot(3).await.unwrap(), 3);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// N tasks on two threads racing for L permits: exactly L go, the rest are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_get_exactly_the_permits() {
    let clock = ManualClock::new();
    let limiter = DirectRateLimiter::builder(Quota::per_hour(1).unwrap().with_burst(37).unwrap())
        .clock(clock)
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter).layer(echo(calls.clone()));
    let tasks: Vec<_> = (0..200)
        .map(|n| tokio::spawn(client.clone().oneshot(n)))
        .collect();
    let mut ok = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => ok += 1,
            Err(err) => assert!(err.is::<QuotaExhausted>()),
        }
    }
    assert_eq!(ok, 37);
    assert_eq!(calls.load(Ordering::SeqCst), 37);
}

/// A wrapper error like tower's `buffer::error::ServiceError`: the refusal behind an `Arc`.
#[derive(Debug)]
struct Wrapped(Arc<BoxError>);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wrapped: {}", self.0)
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&**self.0)
    }
}

/// `retry_after` finds a refusal through tower's timeout and through a `source()` chain two
/// wrappers deep; a timeout of its own is not a refusal.
#[tokio::test(start_paused = true)]
async fn retry_after_through_tower_wrappers_and_source_chains() {
    let limiter = DirectRateLimiter::builder(Quota::per_second(2).unwrap().with_burst(1).unwrap())
        .clock(TokioClock::new())
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .layer(ClientQuotaLayer::new("partner", limiter))
        .service(echo(calls.clone()));
    client.clone().oneshot(1).await.unwrap();
    let err = client.clone().oneshot(2).await.unwrap_err();
    assert_eq!(
        outbound::retry_after(&*err),
        Some(Duration::from_millis(500))
    );
    let wrapped = Wrapped(Arc::new(Box::new(Wrapped(Arc::new(err)))));
    assert_eq!(
        outbound::retry_after(&wrapped),
        Some(Duration::from_millis(500))
    );

    let slow = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .service(service_fn(|()| {
            std::future::pending::<Result<(), BoxError>>()
        }));
    let err = slow.oneshot(()).await.unwrap_err();
    assert_eq!(outbound::retry_after(&*err), None);
}

/// A waiter dropped at its first poll, and one dropped after its timer was polled, each give
/// their reservation back exactly once: the permits after them are as if they never came.
#[tokio::test(start_paused = true)]
async fn dropped_waiters_give_back_exactly_once() {
    let quota = Quota::per_second(1)
        .unwrap()
        .with_max_wait(Duration::from_secs(10))
        .unwrap();
    let limiter = DirectRateLimiter::builder(quota)
        .clock(TokioClock::new())
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter).layer(echo(calls.clone()));
    client.clone().oneshot(0).await.unwrap();
    // Made but never polled: the permits are reserved in `call`.
    let unpolled = client.clone().oneshot(1);
    drop(unpolled);
    for _ in 0..5 {
        let mut waiting = Box::pin(client.clone().oneshot(2));
        assert!(futures::poll!(&mut waiting).is_pending());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(futures::poll!(&mut waiting).is_pending());
        drop(waiting);
    }
    // 500 ms have passed: the next permit is 500 ms away, as if no waiter had come; one more
    // second for the call after it, not less (nothing was given back twice).
    let start = tokio::time::Instant::now();
    client.clone().oneshot(3).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    client.clone().oneshot(4).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

// ---------------------------------------------------------------------------------------------
// The times that refusals carry.

/// "How long from the refusal until a call may be sent": a nanosecond before it the call is
/// still refused, at it the call goes. For a `Retry-After`, an exhausted window, a window whose
/// policy refills, and a spread slot.
#[tokio::test]
async fn a_pushed_back_retry_after_is_exact() {
    // Each setup, its answer, and how many refusals in a row it makes (once a hold without a
    // policy has passed, calls go freely).
    type Setup<'a> = (Pacing, &'a [(&'a str, &'a str)], u16, usize);
    let setups: [Setup; 4] = [
        (Pacing::UntilSpent, &[("retry-after", "7")], 429, 1),
        (
            Pacing::UntilSpent,
            &[("ratelimit", r#""p";r=0;t=9"#)],
            200,
            1,
        ),
        (
            Pacing::UntilSpent,
            &[
                ("ratelimit", r#""p";r=1;t=3"#),
                ("ratelimit-policy", r#""p";q=1;w=5"#),
            ],
            200,
            3,
        ),
        (Pacing::Spread, &[("ratelimit", r#""p";r=4;t=10"#)], 200, 3),
    ];
    for (pacing, headers, status, rounds) in setups {
        let clock = ManualClock::new();
        let pushback = Pushback::builder("partner")
            .clock(clock.clone())
            .pacing(pacing)
            .build();
        let calls = Arc::new(AtomicUsize::new(0));
        let client = pushback.layer().layer(scripted(calls.clone()));
        pushback.observe(&response(status, headers));
        // Spend what may go at once.
        let mut answered = Vec::new();
        while pushback.held_for().is_zero() {
            let (tx, call) = start(&client).await;
            tx.send(response(200, &[])).unwrap();
            answered.push(call.await.unwrap());
        }
        for _ in 0..rounds {
            let wait = refused(&client);
            assert_eq!(wait, pushback.held_for(), "{headers:?}");
            clock.advance(wait - Duration::from_nanos(1));
            assert_eq!(refused(&client), Duration::from_nanos(1), "{headers:?}");
            clock.advance(Duration::from_nanos(1));
            let (tx, call) = start(&client).await;
            tx.send(response(200, &[])).unwrap();
            call.await.unwrap();
        }
    }
}

/// A policy that grants nothing (`q = 0`) gives nothing in any window: a refused call is told
/// `max_hold` from the answer, when one call goes to learn anew (the probe); while it is in
/// flight, the next call is told `max_hold` from it; its answer tells anew. To the nanosecond,
/// with a `max_hold` of 30 s.
#[tokio::test]
async fn a_policy_that_grants_nothing_holds_calls_until_a_probe_after_max_hold() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner")
        .clock(clock.clone())
        .max_hold(Duration::from_secs(30))
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    pushback.observe(&response(
        200,
        &[
            ("ratelimit", r#""p";r=0;t=1"#),
            ("ratelimit-policy", r#""p";q=0;w=10"#),
        ],
    ));
    assert_eq!(refused(&client), Duration::from_secs(30));
    clock.advance(Duration::from_secs(30) - Duration::from_nanos(1));
    assert_eq!(refused(&client), Duration::from_nanos(1));
    assert_eq!(pushback.held_for(), Duration::from_nanos(1));
    clock.advance(Duration::from_nanos(1));
    let (tx, probe) = start(&client).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(refused(&client), Duration::from_secs(30));
    clock.advance(Duration::from_secs(1));
    tx.send(response(200, &[("ratelimit", r#""p";r=2;t=10"#)]))
        .unwrap();
    probe.await.unwrap();
    for _ in 0..2 {
        let (tx, call) = start(&client).await;
        tx.send(response(200, &[])).unwrap();
        call.await.unwrap();
    }
    assert_eq!(refused(&client), Duration::from_secs(10));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// A refusal carries the time the next call can actually go, whichever of the holds ends last:
/// after a 429 with `Retry-After: 60` and `X-RateLimit-Remaining: 0` until 300 s from now, a
/// call is told 300 s, not 60 s; and the other way round.
#[tokio::test]
async fn a_refusal_carries_the_longest_of_the_holds() {
    let (pushback, clock) = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    pushback.observe(&response(
        429,
        &[
            ("retry-after", "60"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "300"),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::from_secs(300));
    assert_eq!(refused(&client), Duration::from_secs(300));
    clock.advance(Duration::from_secs(60));
    assert_eq!(refused(&client), Duration::from_secs(240));
    clock.advance(Duration::from_secs(240) - Duration::from_nanos(1));
    assert_eq!(refused(&client), Duration::from_nanos(1));
    clock.advance(Duration::from_nanos(1));
    let (tx, call) = start(&client).await;
    tx.send(response(
        429,
        &[("retry-after", "300"), ("ratelimit", r#""p";r=0;t=60"#)],
    ))
    .unwrap();
    call.await.unwrap();
    assert_eq!(refused(&client), Duration::from_secs(300));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The same through a retry policy that waits what `outbound::retry_after` says: it comes back
/// once, when the call can go, and is not refused again. A waiter whose `max_wait` covers the
/// `Retry-After` but not the spent window is refused at once with the whole time.
#[tokio::test(start_paused = true)]
async fn a_retry_policy_comes_back_once_when_the_call_can_go() {
    #[derive(Clone)]
    struct HonourRetryAfter {
        retries: Arc<AtomicUsize>,
    }

    impl<Req: Clone> tower::retry::Policy<Req, Response<()>, BoxError> for HonourRetryAfter {
        type Future = tokio::time::Sleep;

        fn retry(
            &mut self,
            _: &mut Req,
            result: &mut Result<Response<()>, BoxError>,
        ) -> Option<Self::Future> {
            let wait = match result {
                Ok(response) if response.status() == StatusCode::TOO_MANY_REQUESTS => {
                    Duration::ZERO
                }
                Ok(_) => return None,
                Err(err) => outbound::retry_after(&**err)?,
            };
            (self.retries.fetch_add(1, Ordering::SeqCst) < 5).then(|| tokio::time::sleep(wait))
        }

        fn clone_request(&mut self, request: &Req) -> Option<Req> {
            Some(request.clone())
        }
    }

    let the_429 = || {
        response(
            429,
            &[
                ("retry-after", "60"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "300"),
            ],
        )
    };
    let pushback = Pushback::builder("partner")
        .clock(TokioClock::new())
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let dependency = service_fn(move |()| {
        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
        async move { Ok::<_, BoxError>(if first { the_429() } else { response(200, &[]) }) }
    });
    let retries = Arc::new(AtomicUsize::new(0));
    let client = ServiceBuilder::new()
        .retry(HonourRetryAfter {
            retries: retries.clone(),
        })
        .layer(pushback.layer())
        .service(dependency);
    let start = tokio::time::Instant::now();
    let answer = client.oneshot(()).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(300));
    // The 429 retried at once, refused with 300 s by the pushback, then sent.
    assert_eq!(retries.load(Ordering::SeqCst), 2);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let waiting = Pushback::builder("partner")
        .clock(TokioClock::new())
        .max_wait(Duration::from_secs(120))
        .build();
    waiting.observe(&the_429());
    let client = waiting.layer().layer(service_fn(|()| async {
        Ok::<_, BoxError>(response(200, &[]))
    }));
    let start = tokio::time::Instant::now();
    let err = client.oneshot(()).await.unwrap_err();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "waited for a hold it could not see out"
    );
    assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(300)));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `QuotaExhausted::retry_after`: "how long from the refusal until the same call would be
/// admitted": a nanosecond before it, the same call is refused; at it, admitted. With a cost of
/// three out of a burst of five.
#[tokio::test]
async fn a_quota_exhausted_retry_after_is_exact_for_a_costly_call() {
    let clock = ManualClock::new();
    let limiter = DirectRateLimiter::builder(Quota::per_second(2).unwrap().with_burst(5).unwrap())
        .clock(clock.clone())
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter)
        .cost(3)
        .layer(echo(calls.clone()));
    client.clone().oneshot(1).await.unwrap();
    for _ in 0..3 {
        let err = client.clone().oneshot(2).await.unwrap_err();
        let wait = outbound::retry_after(&*err).unwrap();
        assert!(wait > Duration::ZERO);
        clock.advance(wait - Duration::from_nanos(1));
        let err = client.clone().oneshot(2).await.unwrap_err();
        assert_eq!(outbound::retry_after(&*err), Some(Duration::from_nanos(1)));
        clock.advance(Duration::from_nanos(1));
        client.clone().oneshot(3).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

/// A waiter "is sent when the hold ends": when a newer answer ends it early (the dependency's
/// window reset sooner than the one the client counted), the waiter goes then, not at the time
/// the older answer gave, and calls made after it do not overtake it.
#[tokio::test(start_paused = true)]
async fn a_waiter_goes_when_a_newer_answer_ends_its_hold() {
    let pushback = Pushback::builder("partner")
        .clock(TokioClock::new())
        .max_wait(Duration::from_secs(60))
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=1;t=30"#)]));
    let (first_tx, first) = start(&client).await;
    // The quota is spent: the next call waits for the window, 30 s away.
    let (waiter_tx, waiter_rx) = oneshot::channel();
    let waiter = tokio::spawn(client.clone().oneshot(waiter_rx));
    tokio::task::yield_now().await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    // The first call's answer: the window has reset, 10 calls left.
    first_tx
        .send(response(200, &[("ratelimit", r#""p";r=10;t=30"#)]))
        .unwrap();
    first.await.unwrap();
    assert_eq!(pushback.held_for(), Duration::ZERO);
    let began = tokio::time::Instant::now();
    waiter_tx.send(response(200, &[])).unwrap();
    waiter.await.unwrap().unwrap();
    assert_eq!(began.elapsed(), Duration::ZERO, "the waiter slept on");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `Pacing::Spread`: "the calls left are spread evenly over the window: one every t / r", in
/// the windows a policy grants after the advertised one as well as in that one.
#[tokio::test]
async fn spread_paces_the_windows_a_policy_grants_too() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner")
        .clock(clock.clone())
        .pacing(Pacing::Spread)
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(scripted(calls.clone()));
    pushback.observe(&response(
        200,
        &[
            ("ratelimit-policy", r#""p";q=4;w=8"#),
            ("ratelimit", r#""p";r=0;t=1"#),
        ],
    ));
    assert_eq!(refused(&client), Duration::from_secs(1));
    clock.advance(Duration::from_secs(1));
    for _ in 0..4 {
        let (tx, call) = start(&client).await;
        tx.send(response(200, &[])).unwrap();
        call.await.unwrap();
        assert_eq!(refused(&client), Duration::from_secs(2));
        clock.advance(Duration::from_secs(2));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}
