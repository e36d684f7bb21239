//! Attacks on the client quota's give-backs and on the retry budget's bound over a stretch of
//! time, by a helper that had not seen the code. Time is tokio's paused clock or a
//! `ManualClock`.

use std::time::Duration;

use http::{Request, Response};
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::algorithm::Metered;
use tower_bulwark::clock::{ManualClock, TokioClock};
use tower_bulwark::outbound::retry::Retry;
use tower_bulwark::outbound::ClientQuotaLayer;
use tower_bulwark::{BoxError, DirectRateLimiter, Quota};

/// Guide, settled costs: "whatever ends a request or a call (its body read, dropped or
/// failing, the inner service failing or panicking, the future dropped, ...) its estimate is
/// settled exactly once". An inner service whose `call` panics, on a call admitted at once by a
/// `Metered` quota of 1 000 tokens a minute (estimate 300): an hour later the key must be whole.
#[tokio::test]
async fn a_panic_in_the_inner_services_call_ends_the_metered_hold() {
    let clock = ManualClock::new();
    let tokens = DirectRateLimiter::builder(Quota::per_minute(1000).unwrap())
        .algorithm::<Metered>()
        .clock(clock.clone())
        .build();
    let dependency = service_fn(|panics: bool| {
        if panics {
            panic!("the inner service's call panics");
        }
        std::future::ready(Ok::<_, BoxError>(Response::new(())))
    });
    let client = ClientQuotaLayer::new("llm", tokens.clone())
        .cost(300)
        .layer(dependency);
    let joined = tokio::spawn(client.clone().oneshot(true)).await;
    assert!(joined.unwrap_err().is_panic());
    let now = crate::common::probe(&tokens, &());
    clock.advance(Duration::from_secs(3600));
    let later = crate::common::probe(&tokens, &());
    // A call that did not panic, for comparison: settled, whole a minute later.
    client.clone().oneshot(false).await.unwrap();
    clock.advance(Duration::from_secs(3600));
    let after_a_good_call = crate::common::probe(&tokens, &());
    assert_eq!(
        later, 1000,
        "{now} tokens left just after the panic, {later} an hour later, \
         {after_a_good_call} an hour after a good call: the 300 held for good"
    );
}

/// `src/outbound/retry/mod.rs`: "Over any stretch, retries are at most `ratio` times the calls
/// made in it or before it (up to a window and the longest a retry waits: `max_wait` and the
/// backoff's `cap` ...) plus that reserve once for each window the stretch spans".
///
/// The defaults throughout (0.2, 3 a second, 10 s, `max_wait` 5 s, backoff 50 ms to 1 s). At
/// t = 0, 500 healthy calls deposit 100 retries' worth; at t = 9.5 s (those deposits still
/// count), 100 calls are answered `429` with `Retry-After: 5`: all 100 are granted a retry,
/// which all leave at 14.5 s (+ a backoff of at most 50 ms). The stretch [14.5 s, 15.5 s)
/// spans one window, and the calls of 0 s are within a window and the longest wait of it: at
/// most 0.2 × 600 + 30 = 150. (The docs bounded it by the calls of the one window before the
/// stretch, 0.2 × 100 + 30 = 50, which a retry's wait between its grant and its send breaks.)
#[tokio::test(start_paused = true)]
async fn retries_in_a_stretch_spend_deposits_from_up_to_a_window_and_a_wait_before_it() {
    let (dependency, seen) = crate::attack_retries::timed_dependency(|request, at| {
        match request.uri().path() == "/fail" && at < Duration::from_secs(14) {
            true => (429, Some(5)),
            false => (200, None),
        }
    });
    let partner = Retry::builder("partner")
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let client = partner.layer().layer(dependency);
    let call = |path: &str| {
        let uri = format!("http://partner{path}");
        client
            .clone()
            .oneshot(Request::get(uri).body(String::new()).unwrap())
    };
    for _ in 0..500 {
        assert_eq!(call("/ok").await.unwrap().status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(9500)).await;
    let mut failing = tokio::task::JoinSet::new();
    for _ in 0..100 {
        failing.spawn(call("/fail"));
    }
    while let Some(done) = failing.join_next().await {
        done.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap();
    let stretch = Duration::from_millis(14_500)..Duration::from_millis(15_500);
    let retries = seen.iter().filter(|at| stretch.contains(*at)).count();
    // The stretch less a window, `max_wait` and the backoff's cap (16 s) starts before 0: every
    // call made so far may pay for the stretch's retries.
    let first_attempts = seen.len() - retries;
    assert_eq!(first_attempts, 600);
    assert_eq!(retries, 100, "the deposits of 0 s still counted at 9.5 s");
    assert!(retries <= first_attempts / 5 + 30);
}

/// `src/outbound/retry/mod.rs` (and `RetryBuilder::budget`): a retry counts "until at least
/// `window` after it is sent". A window of 10 ms + 9 ns (in range: 10 ms to 1 h) with 100
/// retries a second (a reserve of one retry): a retry sent at 999 999 ns stops counting at
/// 11 ms, 10 000 001 ns later, less than the window, and a second retry is granted then.
#[tokio::test(start_paused = true)]
async fn a_retry_counts_for_at_least_a_window_that_is_not_a_multiple_of_ten_nanoseconds() {
    let clock = ManualClock::new();
    let window = Duration::from_nanos(10_000_009);
    let partner = Retry::builder("partner")
        .clock(clock.clone())
        .backoff(Duration::ZERO, Duration::ZERO)
        .budget(0.0, 100, window)
        .max_attempts(2)
        .build()
        .unwrap();
    let (failing, calls) = crate::retry::scripted(vec![(503, vec![]); 10]);
    let client = partner.layer().layer(failing);
    clock.set(Duration::from_nanos(999_999));
    client.clone().oneshot(crate::retry::get()).await.unwrap();
    assert_eq!(calls.count(), 2, "the reserve's one retry");
    // 10 000 001 ns after that retry was sent: within the window.
    clock.set(Duration::from_nanos(11_000_000));
    let available = partner.budget_available();
    assert_eq!(
        available, 0,
        "{available} retry available 10 000 001 ns after one was sent, within a window of \
         10 000 009 ns whose reserve is one"
    );
}
