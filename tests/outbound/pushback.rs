//! Pushback: what each header makes it hold, to the nanosecond on a manual clock, and the layer
//! under concurrency on tokio's paused timer. No test sleeps to pass.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::DEFAULT_MAX_HOLD;
use http::{HeaderMap, Response, StatusCode};
use tokio::sync::Notify;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::outbound::pushback::Pacing;
use tower_bulwark::outbound::{self, Pushback, PushedBack};
use tower_bulwark::{clock::ManualClock, BoxError, BulkheadFull};

use super::hostile_support::{
    manual_with, on_tokio_clock, on_tokio_clock_with, tokio_waiting_up_to,
};
use crate::common::response;

fn manual(name: &str) -> (Pushback<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let pushback = Pushback::builder(name).clock(clock.clone()).build();
    (pushback, clock)
}

/// A dependency that answers 200 without any header, counting its calls.
fn plain_dependency(
    calls: Arc<AtomicUsize>,
) -> impl Service<(), Response = Response<()>, Error = BoxError, Future: Send> + Clone {
    service_fn(move |()| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, BoxError>(response(200, &[])) }
    })
}

fn http_date(at: SystemTime) -> String {
    httpdate::fmt_http_date(at)
}

/// A fixed server time, on a whole second (HTTP-dates have no fractions).
fn server_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000)
}

#[test]
fn retry_after_in_seconds_holds_exactly_that_long() {
    let (pushback, clock) = manual("partner");
    pushback.observe(&response(429, &[("retry-after", "30")]));
    assert_eq!(pushback.held_for(), Duration::from_secs(30));
    clock.advance(Duration::from_nanos(29_999_999_999));
    assert_eq!(pushback.held_for(), Duration::from_nanos(1));
    clock.advance(Duration::from_nanos(1));
    assert_eq!(pushback.held_for(), Duration::ZERO);
}

#[test]
fn retry_after_counts_only_on_429_and_503() {
    for status in [200, 301, 400, 500, 502] {
        let (pushback, _) = manual("partner");
        pushback.observe(&response(status, &[("retry-after", "30")]));
        assert_eq!(pushback.held_for(), Duration::ZERO, "status {status}");
    }
    let (pushback, _) = manual("partner");
    pushback.observe(&response(503, &[("retry-after", "7")]));
    assert_eq!(pushback.held_for(), Duration::from_secs(7));
}

#[test]
fn retry_after_as_a_date_is_read_against_the_servers_date() {
    let (pushback, _) = manual("partner");
    let date = server_now();
    pushback.observe(&response(
        429,
        &[
            ("date", &http_date(date)),
            ("retry-after", &http_date(date + Duration::from_secs(90))),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::from_secs(90));
}

#[test]
fn retry_after_as_a_date_without_a_date_field_is_read_against_the_system_time() {
    let (pushback, _) = manual("partner");
    let at = SystemTime::now() + Duration::from_secs(120);
    pushback.observe(&response(503, &[("retry-after", &http_date(at))]));
    let held = pushback.held_for();
    // The date has whole seconds; the system time moves on while the test runs.
    assert!(
        held > Duration::from_secs(115) && held <= Duration::from_secs(121),
        "{held:?}"
    );
}

#[test]
fn a_retry_after_date_in_the_past_holds_nothing_beyond_the_fallback() {
    let (pushback, _) = manual("partner");
    let date = server_now();
    pushback.observe(&response(
        503,
        &[
            ("date", &http_date(date)),
            ("retry-after", &http_date(date - Duration::from_secs(3600))),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::ZERO);
    // On a 429 a date in the past is "now": nothing more than what the 429 itself holds.
    let (pushback, _) = manual("partner");
    pushback.observe(&response(
        429,
        &[
            ("date", &http_date(date)),
            ("retry-after", "Thu, 01 Jan 1970 00:00:00 GMT"),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::ZERO);
}

#[test]
fn a_far_future_retry_after_is_capped_at_max_hold() {
    let date = server_now();
    for value in [
        "Fri, 31 Dec 9999 23:59:59 GMT".to_owned(),
        "99999999999999999999999999999999".to_owned(),
        u64::MAX.to_string(),
        http_date(date + Duration::from_secs(601)),
    ] {
        let (pushback, _) = manual("partner");
        pushback.observe(&response(
            429,
            &[("date", &http_date(date)), ("retry-after", &value)],
        ));
        assert_eq!(pushback.held_for(), DEFAULT_MAX_HOLD, "{value}");
    }
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner")
        .clock(clock)
        .max_hold(Duration::from_secs(5))
        .build();
    pushback.observe(&response(429, &[("retry-after", "86400")]));
    assert_eq!(pushback.held_for(), Duration::from_secs(5));
}

#[test]
fn malformed_retry_after_values_hold_only_the_fallback_second_on_a_429() {
    for value in ["-5", "1.5.0", "5, 10", "0x10", "ten", "", "+3", "5 s"] {
        let (pushback, _) = manual("partner");
        pushback.observe(&response(429, &[("retry-after", value)]));
        assert_eq!(pushback.held_for(), Duration::from_secs(1), "{value:?}");
        let (pushback, _) = manual("partner");
        pushback.observe(&response(503, &[("retry-after", value)]));
        assert_eq!(pushback.held_for(), Duration::ZERO, "{value:?}");
    }
}

#[test]
fn of_several_retry_after_lines_the_longest_counts() {
    let (pushback, _) = manual("partner");
    let mut r = response(429, &[]);
    for value in ["3", "junk", "12", "7"] {
        r.headers_mut()
            .append("retry-after", value.parse().unwrap());
    }
    pushback.observe(&r);
    assert_eq!(pushback.held_for(), Duration::from_secs(12));
}

#[test]
fn ratelimit_with_several_policies_honours_the_most_restrictive() {
    // One policy has nothing left for 20 s; another has plenty for an hour.
    let (pushback, clock) = manual("partner");
    pushback.observe(&response(
        200,
        &[
            (
                "ratelimit-policy",
                r#""hour";q=1000;w=3600, "burst";q=10;w=20"#,
            ),
            ("ratelimit", r#""hour";r=900;t=3000, "burst";r=0;t=20"#),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::from_secs(20));
    clock.advance(Duration::from_secs(20));
    assert_eq!(pushback.held_for(), Duration::ZERO);

    // Two exhausted policies: the longer window counts.
    let (pushback, _) = manual("partner");
    pushback.observe(&response(
        200,
        &[("ratelimit", r#""a";r=0;t=5, "b";r=0;t=50, "c";r=3;t=1"#)],
    ));
    assert_eq!(pushback.held_for(), Duration::from_secs(50));
}

#[tokio::test]
async fn the_fewest_remaining_calls_are_spent_then_held_for_their_window() {
    let (pushback, clock) = manual("partner");
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(plain_dependency(calls.clone()));
    pushback.observe(&response(
        200,
        &[("ratelimit", r#""a";r=5;t=10, "b";r=2;t=60"#)],
    ));
    client.clone().oneshot(()).await.unwrap();
    client.clone().oneshot(()).await.unwrap();
    let err = client.clone().oneshot(()).await.unwrap_err();
    let pushed = err.downcast_ref::<PushedBack>().expect("held back");
    assert_eq!(pushed.retry_after(), Duration::from_secs(60));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    clock.advance(Duration::from_secs(60));
    // No policy told the quota after the window: calls go until the next answer.
    client.clone().oneshot(()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn after_the_window_the_policy_quota_is_granted_again() {
    let (pushback, clock) = manual("partner");
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(plain_dependency(calls.clone()));
    pushback.observe(&response(
        200,
        &[
            ("ratelimit-policy", r#""p";q=3;w=10"#),
            ("ratelimit", r#""p";r=0;t=4"#),
        ],
    ));
    assert!(crate::common::refusal(&client, ()).await.is::<PushedBack>());
    clock.advance(Duration::from_secs(4));
    for window in 0..3 {
        for _ in 0..3 {
            client.clone().oneshot(()).await.unwrap();
        }
        let err = client.clone().oneshot(()).await.unwrap_err();
        assert_eq!(
            outbound::retry_after(&*err),
            Some(Duration::from_secs(10)),
            "window {window}"
        );
        clock.advance(Duration::from_secs(10));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 9);
}

#[test]
fn a_missing_t_takes_the_policys_w() {
    let (pushback, _) = manual("partner");
    pushback.observe(&response(
        200,
        &[
            ("ratelimit-policy", r#""p";q=3;w=25"#),
            ("ratelimit", r#""p";r=0"#),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::from_secs(25));
}

#[test]
fn x_ratelimit_reset_below_a_billion_is_seconds_from_now() {
    let (pushback, _) = manual("partner");
    pushback.observe(&response(
        200,
        &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "30")],
    ));
    assert_eq!(pushback.held_for(), Duration::from_secs(30));
    // The largest delta: 31.7 years, capped.
    let (pushback, _) = manual("partner");
    pushback.observe(&response(
        200,
        &[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "999999999"),
        ],
    ));
    assert_eq!(pushback.held_for(), DEFAULT_MAX_HOLD);
}

#[test]
fn x_ratelimit_reset_from_a_billion_is_a_unix_time() {
    let date = server_now();
    let unix = date
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (pushback, _) = manual("partner");
    pushback.observe(&response(
        200,
        &[
            ("date", &http_date(date)),
            ("x-ratelimit-limit", "60"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &(unix + 45).to_string()),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::from_secs(45));
    // Exactly a billion is September 2001: long past, no hold.
    let (pushback, _) = manual("partner");
    pushback.observe(&response(
        200,
        &[
            ("date", &http_date(date)),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1000000000"),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::ZERO);
}

#[tokio::test]
async fn calls_in_flight_are_counted_against_the_advertised_remainder() {
    let (pushback, _) = manual("partner");
    let release = Arc::new(Notify::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let dependency = {
        let release = release.clone();
        let calls = calls.clone();
        service_fn(move |()| {
            calls.fetch_add(1, Ordering::SeqCst);
            let release = release.clone();
            async move {
                release.notified().await;
                Ok::<_, BoxError>(response(200, &[]))
            }
        })
    };
    let client = pushback.layer().layer(dependency);
    let mut in_flight = Vec::new();
    for _ in 0..3 {
        let mut call = Box::pin(client.clone().oneshot(()));
        // Poll once so that the call starts and waits at the dependency.
        assert!(futures::poll!(&mut call).is_pending());
        in_flight.push(call);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // An answer (from elsewhere) says 4 left: the 3 in flight may not be counted in it yet.
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=4;t=10"#)]));
    let mut fourth = Box::pin(client.clone().oneshot(()));
    assert!(futures::poll!(&mut fourth).is_pending());
    let err = client.clone().oneshot(()).await.unwrap_err();
    assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(10)));
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    drop(in_flight);
    drop(fourth);
}

#[tokio::test]
async fn spread_pacing_spaces_the_calls_left_over_the_window() {
    let (pushback, clock) = manual_with(Pacing::Spread);
    let calls = Arc::new(AtomicUsize::new(0));
    let client = pushback.layer().layer(plain_dependency(calls.clone()));
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=4;t=8"#)]));
    for _ in 0..4 {
        client.clone().oneshot(()).await.unwrap();
        let err = client.clone().oneshot(()).await.unwrap_err();
        assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(2)));
        clock.advance(Duration::from_secs(2));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn the_error_names_the_dependency_and_is_neither_a_timeout_nor_bulkhead_full() {
    let (pushback, clock) = manual("payments");
    let client = pushback
        .layer()
        .layer(plain_dependency(Arc::new(AtomicUsize::new(0))));
    pushback.observe(&response(429, &[("retry-after", "3")]));
    clock.advance(Duration::from_millis(500));
    let err = client.oneshot(()).await.unwrap_err();
    assert!(err.is::<PushedBack>());
    assert!(!err.is::<BulkheadFull>());
    assert!(!err.is::<tower::timeout::error::Elapsed>());
    let pushed = err.downcast_ref::<PushedBack>().unwrap();
    assert_eq!(pushed.dependency(), "payments");
    assert_eq!(pushed.retry_after(), Duration::from_millis(2500));
    assert_eq!(
        err.to_string(),
        "dependency `payments` asked for no calls for another 2.5s"
    );
    let timeout: BoxError = Box::new(tower::timeout::error::Elapsed::new());
    assert_eq!(outbound::retry_after(&*timeout), None);
}

/// A mock dependency on tokio's clock: answers its first call with a 429 and `Retry-After: 2`,
/// then 200s, and records when each call arrived.
fn recording_dependency(
    arrivals: Arc<Mutex<Vec<tokio::time::Instant>>>,
) -> impl Service<(), Response = Response<()>, Error = BoxError, Future: Send> + Clone {
    service_fn(move |()| {
        let mut arrivals = arrivals.lock().unwrap();
        arrivals.push(tokio::time::Instant::now());
        let first = arrivals.len() == 1;
        async move {
            Ok::<_, BoxError>(if first {
                response(429, &[("retry-after", "2")])
            } else {
                response(200, &[])
            })
        }
    })
}

#[tokio::test(start_paused = true)]
async fn after_a_429_no_task_reaches_the_dependency_before_the_hold_ends() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let pushback = tokio_waiting_up_to(Duration::from_secs(5));
    let client = pushback
        .layer()
        .layer(recording_dependency(arrivals.clone()));
    let start = tokio::time::Instant::now();
    let first = client.clone().oneshot(()).await.unwrap();
    assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);

    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 20)).await;
                client.oneshot(()).await
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let arrivals = arrivals.lock().unwrap();
    assert_eq!(arrivals.len(), 65);
    let early = arrivals[1..]
        .iter()
        .filter(|at| at.duration_since(start) < Duration::from_secs(2))
        .count();
    assert_eq!(
        early, 0,
        "calls reached the dependency before Retry-After passed"
    );
}

#[tokio::test(start_paused = true)]
async fn after_a_429_without_max_wait_every_task_fails_at_once() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let pushback = on_tokio_clock();
    let client = pushback
        .layer()
        .layer(recording_dependency(arrivals.clone()));
    client.clone().oneshot(()).await.unwrap();
    let tasks: Vec<_> = (0..64)
        .map(|_| tokio::spawn(client.clone().oneshot(())))
        .collect();
    let start = tokio::time::Instant::now();
    for task in tasks {
        let err = task.await.unwrap().unwrap_err();
        assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(2)));
    }
    assert_eq!(start.elapsed(), Duration::ZERO, "nothing waited");
    assert_eq!(arrivals.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hold_longer_than_max_wait_is_refused_at_once_and_a_dropped_waiter_reaches_nothing() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let pushback = tokio_waiting_up_to(Duration::from_secs(1));
    let client = pushback
        .layer()
        .layer(recording_dependency(arrivals.clone()));
    client.clone().oneshot(()).await.unwrap();
    let start = tokio::time::Instant::now();
    let err = client.clone().oneshot(()).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(2)));

    // Within max_wait after a second: it waits; a timeout cuts it and nothing is sent.
    tokio::time::advance(Duration::from_millis(1500)).await;
    let cut = tokio::time::timeout(Duration::from_millis(100), client.clone().oneshot(())).await;
    assert!(cut.is_err());
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(arrivals.lock().unwrap().len(), 1);
    assert_eq!(pushback.held_for(), Duration::ZERO);
}

#[test]
fn the_headers_of_an_http_parts_are_read_too() {
    let (pushback, _) = manual("partner");
    let (parts, ()) = response(429, &[("retry-after", "4")]).into_parts();
    pushback.observe(&parts);
    assert_eq!(pushback.held_for(), Duration::from_secs(4));
    let _: &HeaderMap = &parts.headers;
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_hold_is_extended_past_max_wait_is_refused_when_it_wakes() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let pushback = tokio_waiting_up_to(Duration::from_secs(3));
    let client = pushback
        .layer()
        .layer(recording_dependency(arrivals.clone()));
    client.clone().oneshot(()).await.unwrap(); // 429, Retry-After: 2
    let start = tokio::time::Instant::now();
    let waiter = tokio::spawn(client.clone().oneshot(()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Another answer asks for five more seconds: past the waiter's max_wait.
    pushback.observe(&response(429, &[("retry-after", "5")]));
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "refused when it woke"
    );
    assert_eq!(
        outbound::retry_after(&*err),
        Some(Duration::from_millis(3500))
    );
    assert_eq!(arrivals.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unbounded_max_wait_and_max_hold_neither_overflow_nor_panic() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let pushback =
        on_tokio_clock_with(|builder| builder.max_wait(Duration::MAX).max_hold(Duration::MAX));
    let client = pushback
        .layer()
        .layer(recording_dependency(arrivals.clone()));
    client.clone().oneshot(()).await.unwrap();
    pushback.observe(&response(429, &[("retry-after", "18446744073709551615")]));
    let waiter = tokio::spawn(client.clone().oneshot(()));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!waiter.is_finished(), "still waiting, as asked");
    waiter.abort();
    assert_eq!(arrivals.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn spread_waiters_reach_the_dependency_exactly_t_over_r_apart() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let recorded = arrivals.clone();
    let dependency = service_fn(move |()| {
        recorded.lock().unwrap().push(tokio::time::Instant::now());
        async { Ok::<_, BoxError>(response(200, &[])) }
    });
    let pushback = on_tokio_clock_with(|builder| {
        builder
            .pacing(Pacing::Spread)
            .max_wait(Duration::from_secs(10))
    });
    let client = pushback.layer().layer(dependency);
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=4;t=8"#)]));
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..5)
        .map(|_| tokio::spawn(client.clone().oneshot(())))
        .collect();
    let mut refused = 0;
    for task in tasks {
        if let Err(err) = task.await.unwrap() {
            // The fifth: nothing left in the window, which ends at 8 s, within max_wait, but
            // the budget is spent: it waits for the window and then goes freely.
            refused += usize::from(err.is::<PushedBack>());
        }
    }
    let offsets: Vec<_> = arrivals
        .lock()
        .unwrap()
        .iter()
        .map(|at| at.duration_since(start))
        .collect();
    assert_eq!(refused, 0);
    assert_eq!(
        offsets,
        [0, 2, 4, 6, 8].map(Duration::from_secs).to_vec(),
        "spaced t/r apart, the fifth after the window"
    );
}

#[tokio::test]
async fn the_dependencys_own_errors_pass_through_and_stop_counting_in_flight() {
    let (pushback, _) = manual("partner");
    let client = pushback.layer().layer(service_fn(|()| async {
        Err::<Response<()>, BoxError>("connection refused".into())
    }));
    // Two left, and nothing in flight after each failure: both calls go, the third is held.
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=2;t=10"#)]));
    for _ in 0..2 {
        let err = client.clone().oneshot(()).await.unwrap_err();
        assert_eq!(err.to_string(), "connection refused");
        assert_eq!(outbound::retry_after(&*err), None);
    }
    assert!(crate::common::refusal(&client, ()).await.is::<PushedBack>());
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=1;t=10"#)]));
    assert_eq!(
        client.oneshot(()).await.unwrap_err().to_string(),
        "connection refused",
        "nothing in flight was left counted"
    );
}

/// A call the pushback let go that a layer below refused before sending it (a full bulkhead)
/// reached nothing: the advertised budget it took goes back. Two calls left for a minute; one
/// holds the bulkhead's only slot, twenty more are refused by the bulkhead; once the first
/// ends, one more call goes, and only then is the budget spent.
#[tokio::test]
async fn a_call_refused_below_the_pushback_gives_its_budget_back() {
    use tokio::sync::oneshot;
    use tower_bulwark::bulkhead::Bulkhead;

    let (pushback, _clock) = manual("partner");
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=2;t=60"#)]));
    let bulkhead = Bulkhead::semaphore("partner", 1).build();
    let sent = Arc::new(AtomicUsize::new(0));
    let inner = {
        let sent = sent.clone();
        service_fn(move |gate: Option<oneshot::Receiver<()>>| {
            sent.fetch_add(1, Ordering::SeqCst);
            async move {
                if let Some(gate) = gate {
                    gate.await.ok();
                }
                Ok::<_, BoxError>(response(200, &[]))
            }
        })
    };
    let client = pushback.layer().layer(bulkhead.layer().layer(inner));
    let (open, gate) = oneshot::channel();
    let mut first = Box::pin(client.clone().oneshot(Some(gate)));
    assert!(crate::common::poll_once(first.as_mut()).is_pending());
    crate::common::assert_bulkhead_full(&client, || None, 20).await;
    open.send(()).unwrap();
    first.await.unwrap();
    client.clone().oneshot(None).await.unwrap();
    let err = client.clone().oneshot(None).await.unwrap_err();
    assert!(err.is::<PushedBack>(), "the budget of two is spent: {err}");
    assert_eq!(sent.load(Ordering::SeqCst), 2);
}
