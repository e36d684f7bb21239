//! A third attack on the overload protection's documented promises, by a helper that had not
//! seen the code: a waiter whose wait had ended kept its place in the queue, a waiter's timer
//! rounds to the millisecond, `Critical`'s ceiling rounded a tie the wrong way, and a request
//! admitted in `call` and dropped before its first poll was counted nowhere.

use std::time::Duration;

use futures::FutureExt;
use tower::ServiceExt;
use tower_bulwark::overload::Priority;

use crate::support::{answer_to, called, fixed, one_inside, queued, request};

/// `src/overload/builder.rs` (`queue`): "at most `capacity` wait, ... each for at most
/// `max_wait` (on tokio's clock) from its call, however late its future is first polled. A full
/// queue sheds its lowest-class waiter for a newcomer of a higher class, else the newcomer."
/// A request queued at 0 whose future is not polled yet (behind a `Buffer`, a slow executor) is
/// no longer waiting at 2 s (max_wait 1 s: it will be answered 503 whenever polled), so it holds
/// no place: the newcomer waits in the queue of one and is admitted (it was shed at once).
#[tokio::test(start_paused = true)]
async fn a_waiter_whose_wait_ended_does_not_keep_a_newcomer_out_of_the_queue() {
    let (overload, service, gated, _entered, first) =
        one_inside(1, Duration::from_secs(1), Priority::Default).await;
    let late = called(&service, Priority::Default).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let mut next = Box::pin(service.clone().oneshot(request(Priority::Default)));
    let at_once = (&mut next).now_or_never().map(|r| r.unwrap().status());
    assert_eq!(
        at_once, None,
        "the newcomer was answered at once: the queue counts a waiter whose max_wait passed"
    );
    gated.gate.add_permits(2);
    drop(first.await.unwrap().unwrap());
    assert_eq!(next.await.unwrap().status(), 200);
    assert_eq!(late.await.unwrap().status(), 503);
    assert_eq!(overload.in_flight(), 0);
}

/// `src/overload/builder.rs` (`queue`): each waits "for at most `max_wait` (on tokio's clock)
/// from its call, ... (answered at the timer's next millisecond: tokio's timer rounds a
/// deadline up to one)". With a `max_wait` of 1.5 ms, a waiter is answered at 2 ms on tokio's
/// paused clock; 1 ns waits a whole millisecond: never sooner than `max_wait`, never a
/// millisecond later.
#[tokio::test(start_paused = true)]
async fn a_waiter_is_answered_within_the_millisecond_after_max_wait() {
    for max_wait in [Duration::from_micros(1500), Duration::from_nanos(1)] {
        let (_overload, service, _gated, _entered, _first) =
            one_inside(2, max_wait, Priority::Default).await;
        let started = tokio::time::Instant::now();
        let response = answer_to(&service, Priority::Default).await;
        assert_eq!(response.status(), 503);
        let waited = started.elapsed();
        assert!(
            waited >= max_wait && waited <= max_wait + Duration::from_millis(1),
            "max_wait {max_wait:?}, answered after {waited:?}"
        );
    }
}

/// `src/overload/builder.rs` (`critical_borrowing`): "its ceiling is `factor` times the limit,
/// rounded". 2.5 times 3 is 7.5, rounded to 8, and 2.3 times 5 (11.5, which `2.3 * 5.0` gives
/// exactly in f64 too) to 12, and 1.15 times 10 to 12 (the ceiling was computed as
/// `limit - round(limit * (1 - factor))`, and `1 - 2.3` is not exact: 11).
#[test]
fn the_critical_ceiling_is_the_factor_times_the_limit_rounded() {
    for (factor, limit) in [(2.5, 3), (2.3, 5), (1.15, 10), (2.05, 10)] {
        let overload = fixed(limit).critical_borrowing(factor).unwrap().build();
        let expected = (factor * limit as f64).round() as usize;
        assert_eq!(
            overload.ceiling(Priority::Critical),
            expected,
            "{factor} times {limit}"
        );
    }
}

/// `src/observe.rs` metric names: `bulwark_overload_requests_total` counts "requests admitted (at
/// once or from the queue) and shed, by class". A request admitted in `call` (it takes a place,
/// and the inner service's `call` runs), whose future is then dropped before its first poll, is
/// counted admitted (it was counted at its first poll, so neither admitted nor shed).
#[cfg(feature = "metrics")]
#[test]
fn a_request_admitted_in_call_is_counted_even_if_dropped_before_its_first_poll() {
    use crate::common::recorded::{counter, on_own_recorder, runtime};
    let ((), after) = on_own_recorder(&runtime(), |_| async move {
        let overload = fixed(1).build();
        let (service, _gated, _entered) = crate::support::gated(&overload);
        let future = called(&service, Priority::Default).await;
        assert_eq!(overload.in_flight(), 1, "admitted in call");
        drop(future);
        assert_eq!(overload.in_flight(), 0);
    });
    let count = |outcome| {
        counter(
            &after,
            "bulwark_overload_requests_total",
            &[
                ("name", "api"),
                ("outcome", outcome),
                ("priority", "default"),
            ],
        )
    };
    assert_eq!(
        (count("admitted"), count("shed")),
        (1, 0),
        "the request is in neither counter"
    );
}

/// A waiter of 10.5 ms polled at 10.5 ms, its timer due at 11 ms (tokio rounds a deadline up
/// to the millisecond; the paused clock starts on one), still waits, as a bulkhead's waiter
/// does (one rule for both queues): it keeps its place in the full queue, a newcomer being shed,
/// and the slot freed then admits it. It was shed at 10.5 ms, its place given to the newcomer.
#[tokio::test(start_paused = true)]
async fn a_waiter_polled_after_its_wait_but_before_its_timer_still_waits() {
    let (overload, service, gated, _entered, first) =
        one_inside(1, Duration::from_micros(10_500), Priority::Default).await;
    let mut waiter = queued(&service, Priority::Default);
    tokio::time::advance(Duration::from_micros(10_500)).await;
    assert!(
        (&mut waiter).now_or_never().is_none(),
        "its timer, rounded up to 11 ms, has not fired"
    );
    let mut newcomer = Box::pin(service.clone().oneshot(request(Priority::Default)));
    let at_once = (&mut newcomer).now_or_never().map(|r| r.unwrap().status());
    assert_eq!(
        at_once.map(|s| s.as_u16()),
        Some(503),
        "the queue of one is full"
    );
    gated.gate.add_permits(2);
    drop(first.await.unwrap().unwrap());
    assert_eq!(waiter.await.unwrap().status(), 200);
    assert_eq!(overload.in_flight(), 0);
}
