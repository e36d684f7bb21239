//! A circuit breaker's events and metrics (feature `metrics`): one `tracing` event per
//! transition, and the calls by outcome and the state as a recorder sees them.

use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::breaker::BreakerState;

use crate::breaker::{answering, builder, refused, through};
use crate::common::process::TargetEvents;
use crate::common::recorded::{counter, gauge, series};

#[test]
fn each_transition_is_an_event_and_the_metrics_follow_the_calls() {
    let events = TargetEvents::new("tower_bulwark::breaker");
    let _guard = crate::common::process::thread_subscriber(events.clone());
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = crate::common::paused_runtime();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let clock = ManualClock::new();
            let breaker = builder("events", &clock, 4).build().unwrap();
            let (client, _) = answering(&breaker);
            for status in [200, 503, 503, 503] {
                through(&client, status).await;
            }
            refused(&client).await;
            clock.advance(Duration::from_secs(1));
            through(&client, 200).await;
            through(&client, 200).await;
            assert_eq!(breaker.state(), BreakerState::Closed);
        })
    });
    let events: Vec<String> = (events.seen().into_iter())
        .map(|(level, fields)| format!("{level}{fields}"))
        .collect();
    assert_eq!(events.len(), 3, "{events:#?}");
    assert!(events[0].starts_with("WARN message=circuit breaker opened breaker=\"events\" from=\"closed\" to=\"open\" calls=4 failure_rate=0.75 slow_call_rate=0.0 open_for=1s until=1s"), "{}", events[0]);
    assert!(events[1].starts_with("INFO message=circuit breaker is half-open breaker=\"events\" from=\"open\" to=\"half-open\""), "{}", events[1]);
    assert!(
        events[2].contains("to=\"closed\" calls=2 failure_rate=0.0"),
        "{}",
        events[2]
    );

    let all = series(&snapshotter);
    let calls = |outcome| {
        let labels = [("name", "events"), ("outcome", outcome)];
        counter(&all, "bulwark_breaker_calls_total", &labels)
    };
    let counted = ["failure", "refused", "slow", "success"].map(calls);
    assert_eq!(counted, [3, 1, 0, 3]);
    let state = gauge(&all, "bulwark_breaker_state", &[("name", "events")]);
    assert_eq!(state, 0.0, "closed again");
}
