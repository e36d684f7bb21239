//! The opt-in queue: highest class first, then arrival order; a full queue sheds its lowest
//! waiter for a higher newcomer, else the newcomer; a waiter is shed after `max_wait` (on
//! tokio's paused clock: no real wait).

use std::time::Duration;

use futures::FutureExt;
use tower::ServiceExt;
use tower_bulwark::overload::Priority;

use crate::support::{answer_to, fixed, one_inside, request};

#[tokio::test(start_paused = true)]
async fn waiters_are_admitted_highest_class_first_then_in_arrival_order() {
    let (overload, service, gated, mut entered, first) =
        one_inside(8, Duration::from_secs(60), Priority::Default).await;
    let order = [
        Priority::Sheddable,
        Priority::Default,
        Priority::Critical,
        Priority::Default,
        Priority::Critical,
    ];
    let mut waiting = Vec::new();
    for (i, class) in order.into_iter().enumerate() {
        let request = request(class);
        let mut call = Box::pin(service.clone().oneshot(request));
        assert!((&mut call).now_or_never().is_none());
        waiting.push(tokio::spawn(
            async move { (i, call.await.map(|r| r.status())) },
        ));
    }
    tokio::task::yield_now().await;
    gated.gate.add_permits(1);
    drop(first.await.unwrap().unwrap());
    let mut served = Vec::new();
    for _ in 0..order.len() {
        served.push(entered.recv().await.unwrap());
        gated.gate.add_permits(1);
    }
    assert_eq!(
        served,
        [
            Priority::Critical,
            Priority::Critical,
            Priority::Default,
            Priority::Default,
            Priority::Sheddable
        ]
    );
    for task in waiting {
        let (_, response) = task.await.unwrap();
        assert_eq!(response.unwrap(), 200);
    }
    assert_eq!(overload.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_its_lowest_waiter_for_a_higher_newcomer_else_the_newcomer() {
    let (_overload, service, _gated, _entered, _first) =
        one_inside(2, Duration::from_secs(60), Priority::Default).await;
    let sheddable = tokio::spawn(service.clone().oneshot(request(Priority::Sheddable)));
    let default = tokio::spawn(service.clone().oneshot(request(Priority::Default)));
    tokio::task::yield_now().await;
    // Full: a sheddable newcomer ranks no higher than the lowest waiter, so it is shed.
    let newcomer = answer_to(&service, Priority::Sheddable).await;
    assert_eq!(newcomer.status(), 503);
    // A critical one takes the sheddable waiter's place; that waiter is answered at once.
    let critical = tokio::spawn(service.clone().oneshot(request(Priority::Critical)));
    let pushed_out = sheddable.await.unwrap().unwrap();
    assert_eq!(pushed_out.status(), 503);
    assert!(!default.is_finished() && !critical.is_finished());
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_shed_when_max_wait_passes() {
    let (overload, service, _gated, _entered, _first) =
        one_inside(2, Duration::from_millis(200), Priority::Default).await;
    let started = tokio::time::Instant::now();
    let response = answer_to(&service, Priority::Critical).await;
    assert_eq!(response.status(), 503);
    assert_eq!(started.elapsed(), Duration::from_millis(200));
    assert_eq!(overload.in_flight(), 1);
}

/// `OverloadBuilder::queue`: "each for at most `max_wait`", counted from when the request
/// joined the queue: a call made at 0 whose future is first polled after the one inside ends
/// at 2 s (a `Buffer`, a slow executor) is shed, not admitted a second after its wait ended,
/// and the slot it would have taken is free.
#[tokio::test(start_paused = true)]
async fn a_waiter_s_max_wait_counts_from_the_call_not_from_its_first_poll() {
    let (overload, service, gated, _entered, first) =
        one_inside(2, Duration::from_secs(1), Priority::Default).await;
    let queued = crate::support::called(&service, Priority::Default).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    gated.gate.add_permits(1);
    drop(first.await.unwrap().unwrap());
    // Admitted instead, it would wait inside for the gate: bounded, it fails.
    let answer = tokio::time::timeout(Duration::from_secs(10), queued).await;
    assert_eq!(
        answer.expect("admitted after its wait").unwrap().status(),
        503
    );
    assert_eq!(overload.in_flight(), 0);
}

#[test]
fn bad_settings_are_refused_naming_the_setting() {
    let err = fixed(1).guarantee(Priority::Critical, 1.0).unwrap_err();
    assert_eq!(err.setting(), "guarantee");
    assert!(fixed(1).guarantee(Priority::Critical, f64::NAN).is_err());
    assert!(fixed(1).guarantee(Priority::Critical, -0.1).is_err());
    assert!(fixed(1).guarantee(Priority::Sheddable, 0.1).is_err());
    let both = fixed(1)
        .guarantee(Priority::Critical, 0.6)
        .unwrap()
        .guarantee(Priority::Default, 0.4);
    assert_eq!(
        both.unwrap_err().to_string(),
        "overload: `guarantee` must be below 1 for all classes together, got 1.0"
    );
    let err = fixed(1).queue(1, Duration::from_secs(61)).unwrap_err();
    assert_eq!(err.setting(), "max_wait");
    // The value as given, not cut to whole milliseconds (which said "60000 ms" here).
    let just_over = Duration::from_secs(60) + Duration::from_micros(500);
    let err = fixed(1).queue(1, just_over).unwrap_err();
    assert_eq!(
        err.to_string(),
        "overload: `max_wait` must be at most 60 s, got 60.0005s"
    );
    for factor in [0.99, 101.0, f64::NAN, f64::INFINITY] {
        let err = fixed(1).critical_borrowing(factor).unwrap_err();
        assert_eq!(err.setting(), "critical_borrowing", "{factor}");
    }
}
