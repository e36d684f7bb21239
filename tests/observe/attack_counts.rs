//! Attacks on the counts of the outbound parts while OS threads race: bulkheads (fixed, queued,
//! adaptive) and the circuit breaker. Every thread records into one recorder (each installs
//! it as its own), every call's outcome as its caller saw it is tallied, and the counters must
//! match the tallies and the gauges the state.

use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::adaptive::{AdaptiveBulkhead, Limits};
use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::breaker::{Breaker, BreakerOpen, Window};
use tower_bulwark::BoxError;

use crate::common::process::{thread_subscriber, TargetEvents};
use crate::common::recorded::{
    counter, counter_by, find, gauge, on_racing_threads, series, Series,
};

const THREADS: usize = 8;

/// Runs `call` on `THREADS` OS threads released together ([`on_racing_threads`]), each on a
/// current-thread runtime of its own with `recorder` installed: each thread's `(ok, refused)`
/// tallies, summed.
fn race<F, Fut>(recorder: &Arc<DebuggingRecorder>, call: F) -> (u64, u64)
where
    F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = (u64, u64)>,
{
    on_racing_threads(THREADS, recorder, move |t| {
        crate::common::recorded::runtime().block_on(call(t))
    })
    .into_iter()
    .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
}

/// A dependency that yields a few times before it answers, so calls overlap.
async fn dependency(_: ()) -> Result<&'static str, BoxError> {
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    Ok("done")
}

/// 25 calls at once through `service`: `(answered, refused with E)`.
async fn burst<E, S>(service: S) -> (u64, u64)
where
    E: std::error::Error + 'static,
    S: Service<()> + Clone,
    S::Error: Into<BoxError>,
{
    tally::<E, _, _, _>((0..25).map(|_| service.clone().oneshot(()))).await
}

/// `calls` run at once: `(answered, refused with E)`; any other error fails the test.
async fn tally<E, F, R, Er>(calls: impl Iterator<Item = F>) -> (u64, u64)
where
    E: std::error::Error + 'static,
    F: std::future::Future<Output = Result<R, Er>>,
    Er: Into<BoxError>,
{
    let mut tally = (0, 0);
    for result in futures::future::join_all(calls).await {
        match result.map_err(Into::into) {
            Ok(_) => tally.0 += 1,
            Err(e) if e.is::<E>() => tally.1 += 1,
            Err(e) => panic!("{e}"),
        }
    }
    tally
}

fn bulkhead_calls(all: &Series, name: &str, outcome: &str) -> u64 {
    counter_by(all, "bulwark_bulkhead_calls_total", name, "outcome")(outcome)
}

fn durations(all: &Series, name: &str) -> usize {
    match find(
        all,
        MetricKind::Histogram,
        "bulwark_bulkhead_call_duration_seconds",
        &[("name", name)],
    ) {
        Some(DebugValue::Histogram(samples)) => samples.len(),
        None => 0,
        other => panic!("{other:?}"),
    }
}

/// Eight threads of 25 calls at once through one semaphore bulkhead of 4 and one adaptive
/// bulkhead held at 4: each call permitted is counted `permitted` and `finished` once, with one
/// duration; each refusal `rejected` once; the gauges published afterwards are the idle state.
///
/// Promises: src/observe.rs:28-32: "`bulwark_bulkhead_calls_total` | counter | `name`,
/// `outcome` = `permitted` | `rejected` | `finished` | calls by outcome", "`..._available_
/// concurrent_calls` | gauge | free permits", "`bulwark_bulkhead_call_duration_seconds` |
/// histogram | how long each permitted call held its permit"; the `bulkhead::adaptive` docs:
/// "the calls are counted as for every bulkhead"; README.md:163: "with the `metrics` feature
/// every bulkhead counts its calls and their durations".
#[test]
fn attack_racing_threads_through_bulkheads_are_each_counted_once() {
    let recorder = Arc::new(DebuggingRecorder::new());
    let snapshotter = recorder.snapshotter();
    let (fixed, adaptive) = metrics::with_local_recorder(&*recorder, || {
        let fixed = Bulkhead::semaphore("race-fixed", 4).build();
        let adaptive = AdaptiveBulkhead::builder("race-adaptive")
            .limits(Limits::new(4, 4, 4).unwrap())
            .clock(ManualClock::new())
            .build();
        (fixed, adaptive)
    });
    let service = fixed.layer().layer(tower::service_fn(dependency));
    let (fixed_ok, fixed_refused) = race(&recorder, move |_| {
        burst::<BulkheadFull, _>(service.clone())
    });
    let service = adaptive
        .layer_with(|_: Result<&&'static str, &BoxError>| {
            tower_bulwark::bulkhead::adaptive::Verdict::Healthy
        })
        .layer(tower::service_fn(dependency));
    let (adaptive_ok, adaptive_refused) = race(&recorder, move |_| {
        burst::<BulkheadFull, _>(service.clone())
    });
    assert_eq!(fixed_ok + fixed_refused, (THREADS * 25) as u64);
    assert_eq!(adaptive_ok + adaptive_refused, (THREADS * 25) as u64);
    metrics::with_local_recorder(&*recorder, || {
        fixed.publish_gauges();
        adaptive.publish_gauges();
    });
    let all = series(&snapshotter);
    for (name, ok, refused) in [
        ("race-fixed", fixed_ok, fixed_refused),
        ("race-adaptive", adaptive_ok, adaptive_refused),
    ] {
        assert_eq!(
            bulkhead_calls(&all, name, "permitted"),
            ok,
            "{name}: {all:?}"
        );
        assert_eq!(
            bulkhead_calls(&all, name, "finished"),
            ok,
            "{name}: {all:?}"
        );
        assert_eq!(
            bulkhead_calls(&all, name, "rejected"),
            refused,
            "{name}: {all:?}"
        );
        assert_eq!(durations(&all, name) as u64, ok, "{name}");
        let free = gauge(
            &all,
            "bulwark_bulkhead_available_concurrent_calls",
            &[("name", name)],
        );
        assert_eq!(free, 4.0, "{name}");
        let limit = gauge(
            &all,
            "bulwark_bulkhead_max_allowed_concurrent_calls",
            &[("name", name)],
        );
        assert_eq!(limit, 4.0, "{name}");
    }
    let snapshot = fixed.snapshot();
    assert_eq!(snapshot.total_permitted, fixed_ok);
    assert_eq!(snapshot.total_rejected, fixed_refused);
    assert_eq!(snapshot.total_finished, fixed_ok);
}

/// A queue bulkhead of 2 with room for 5: ten calls held at a gate give 2 permitted, 5 queued,
/// 3 rejected; the gauges published then say 0 free and 5 queued; two waiters dropped leave 3
/// queued; once the gate opens every call that held a permit is `finished`, and the gauges are
/// the idle state again. A dropped waiter is neither permitted nor rejected.
///
/// Promises: src/observe.rs:31: "`bulwark_bulkhead_queue_depth` | gauge | calls waiting for a
/// permit"; src/observe.rs:46: "Gauges are set from each instance's state when ...
/// `publish_gauges` ... runs".
#[test]
fn attack_queue_gauges_follow_waiters_that_come_and_go() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        crate::common::recorded::runtime().block_on(async {
            let queue = Bulkhead::queue("queued", 2, 5).build();
            let gate = Arc::new(tokio::sync::Semaphore::new(0));
            let held = {
                let gate = gate.clone();
                tower::service_fn(move |_: ()| {
                    let gate = gate.clone();
                    async move {
                        gate.acquire().await.unwrap().forget();
                        Ok::<_, BoxError>("done")
                    }
                })
            };
            let service = queue.layer().layer(held);
            let mut calls: Vec<_> = (0..10)
                .map(|_| tokio::spawn(service.clone().oneshot(())))
                .collect();
            tokio::task::yield_now().await;
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
            queue.publish_gauges();
            let during = series(&snapshotter);
            let g = |name| gauge(&during, name, &[("name", "queued")]);
            assert_eq!(g("bulwark_bulkhead_available_concurrent_calls"), 0.0);
            assert_eq!(g("bulwark_bulkhead_queue_depth"), 5.0, "{during:?}");
            assert_eq!(bulkhead_calls(&during, "queued", "permitted"), 2);
            assert_eq!(bulkhead_calls(&during, "queued", "rejected"), 3);
            // The three refused calls have ended; drop two of the waiters.
            let mut refused = 0;
            let mut kept = Vec::new();
            for call in calls.drain(..) {
                if call.is_finished() {
                    let err = call.await.unwrap().unwrap_err();
                    assert!(err.is::<BulkheadFull>(), "{err}");
                    refused += 1;
                } else {
                    kept.push(call);
                }
            }
            assert_eq!(refused, 3);
            // The last two spawned are the last in the queue.
            for call in kept.drain(kept.len() - 2..) {
                call.abort();
                assert!(call.await.unwrap_err().is_cancelled());
            }
            queue.publish_gauges();
            let after_drop = series(&snapshotter);
            let g = |name| gauge(&after_drop, name, &[("name", "queued")]);
            assert_eq!(g("bulwark_bulkhead_queue_depth"), 3.0, "{after_drop:?}");
            gate.add_permits(100);
            for call in kept {
                assert_eq!(call.await.unwrap().unwrap(), "done");
            }
            queue.publish_gauges();
            let end = series(&snapshotter);
            let g = |name| gauge(&end, name, &[("name", "queued")]);
            assert_eq!(g("bulwark_bulkhead_queue_depth"), 0.0);
            assert_eq!(g("bulwark_bulkhead_available_concurrent_calls"), 2.0);
            // Counters: what was counted since the snapshot before the drops.
            let permitted = bulkhead_calls(&after_drop, "queued", "permitted")
                + bulkhead_calls(&end, "queued", "permitted");
            let finished = bulkhead_calls(&during, "queued", "finished")
                + bulkhead_calls(&after_drop, "queued", "finished")
                + bulkhead_calls(&end, "queued", "finished");
            let rejected = bulkhead_calls(&after_drop, "queued", "rejected")
                + bulkhead_calls(&end, "queued", "rejected");
            assert_eq!(permitted, 3, "the three waiters left got a permit");
            assert_eq!(finished, 5, "every permitted call finished once");
            assert_eq!(rejected, 0, "a dropped waiter is not a rejection");
            let snapshot = queue.snapshot();
            assert_eq!((snapshot.total_permitted, snapshot.total_finished), (5, 5));
        })
    });
}

/// Ten rounds of 5 calls at once through `service`: `(answered, refused with BreakerOpen)`.
async fn breaker_burst<S>(service: S) -> (u64, u64)
where
    S: Service<(), Response = http::Response<()>> + Clone,
    S::Error: Into<BoxError>,
{
    let mut tally = (0, 0);
    for _ in 0..10 {
        let calls = (0..5).map(|_| service.clone().oneshot(()));
        let (answered, refused) = self::tally::<BreakerOpen, _, _, _>(calls).await;
        tally = (tally.0 + answered, tally.1 + refused);
    }
    tally
}

/// [`breaker_burst`] on every thread of a [`race`], each thread's events to `events`.
fn race_with_events<S>(
    recorder: &Arc<DebuggingRecorder>,
    events: &TargetEvents,
    service: S,
) -> (u64, u64)
where
    S: Service<(), Response = http::Response<()>> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
{
    let events = events.clone();
    race(recorder, move |_| {
        let (service, events) = (service.clone(), events.clone());
        async move {
            let _guard = thread_subscriber(events);
            breaker_burst(service).await
        }
    })
}

/// Eight threads of calls to a dependency that answers `503` race through a closed breaker
/// (at least 20 calls, 50 %): it opens exactly once, so one `WARN` event; every `BreakerOpen`
/// a caller got is one `refused`, every call the window counted one `failure`, and none is
/// counted twice. The state gauge says open. After `open_for`, with the dependency healthy,
/// the threads race for the probes: one event for half-open and one for closed, no more.
///
/// Promises: src/observe.rs:43-44: "`bulwark_breaker_state` | gauge | ... set at each
/// transition"; "`bulwark_breaker_calls_total` | counter | `name`, `outcome` = `success` |
/// `failure` | `slow` | `refused` | calls through it: counted in its window ..., or refused
/// with `BreakerOpen`"; `outbound::breaker` docs: "Each transition is a `tracing` event on the
/// target `tower_bulwark::breaker` (`warn` when it opens, `info` otherwise) with the breaker's
/// name"; src/guide.rs:318: "each transition is one `tracing` event with the rates".
#[test]
fn attack_racing_calls_through_a_breaker_give_one_event_per_transition() {
    let recorder = Arc::new(DebuggingRecorder::new());
    let snapshotter = recorder.snapshotter();
    let events = TargetEvents::new("tower_bulwark::breaker");
    let clock = ManualClock::new();
    let breaker = Breaker::builder("raced")
        .window(Window::Calls(100))
        .minimum_calls(20)
        .half_open_calls(5)
        .open_for(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dependency = {
        let healthy = healthy.clone();
        tower::service_fn(move |_: ()| {
            let healthy = healthy.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                tokio::task::yield_now().await;
                let status = if healthy { 200 } else { 503 };
                Ok::<_, BoxError>(http::Response::builder().status(status).body(()).unwrap())
            }
        })
    };
    let service = breaker.layer().layer(dependency);
    let (answered, refused) = race_with_events(&recorder, &events, service.clone());
    assert_eq!(answered + refused, (THREADS * 50) as u64);
    let open = series(&snapshotter);
    let seen = events.seen();
    let warns = seen
        .iter()
        .filter(|(l, _)| *l == tracing::Level::WARN)
        .count();
    assert_eq!(warns, 1, "{seen:#?}");
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert!(seen[0].1.contains("raced"), "{seen:?}");
    let calls_of = |all: &Series, outcome| {
        counter_by(all, "bulwark_breaker_calls_total", "raced", "outcome")(outcome)
    };
    assert_eq!(calls_of(&open, "refused"), refused, "{open:?}");
    assert!(calls_of(&open, "failure") >= 20, "{open:?}");
    assert!(calls_of(&open, "failure") <= answered, "{open:?}");
    assert_eq!(calls_of(&open, "success"), 0, "{open:?}");
    assert_eq!(
        gauge(&open, "bulwark_breaker_state", &[("name", "raced")]),
        1.0
    );

    healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    clock.advance(Duration::from_secs(1));
    let (answered, refused) = race_with_events(&recorder, &events, service);
    assert_eq!(answered + refused, (THREADS * 50) as u64);
    let after = series(&snapshotter);
    let seen = events.seen();
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert!(
        seen[1..].iter().all(|(l, _)| *l == tracing::Level::INFO),
        "{seen:#?}"
    );
    assert_eq!(calls_of(&after, "refused"), refused, "{after:?}");
    assert!(calls_of(&after, "success") <= answered, "{after:?}");
    assert!(calls_of(&after, "success") >= 5, "{after:?}");
    assert_eq!(calls_of(&after, "failure"), 0, "{after:?}");
    assert_eq!(
        gauge(&after, "bulwark_breaker_state", &[("name", "raced")]),
        0.0
    );
}

/// A dependency that answers `200` at once.
async fn ok_answer(_: ()) -> Result<http::Response<()>, BoxError> {
    tokio::task::yield_now().await;
    Ok(http::Response::new(()))
}

/// Eight threads of 25 calls at once through one client quota of 37 an hour (nothing waits):
/// exactly 37 reach the dependency; the recorder counts 37 `admitted` and the rest `refused`,
/// as the callers saw them. Then a pushback told by a `429` to hold for a minute (no waiting):
/// every call racing through it is one `refused`, and the answer one hold, `retry_after`.
///
/// Promises: src/observe.rs:33-36: "`bulwark_pushback_calls_total` | counter | `name`,
/// `outcome` = `admitted` | `waited` | `refused`", "`bulwark_pushback_holds_total` | counter |
/// `name`, `reason` = `retry_after` | ...", "`bulwark_client_quota_calls_total` | counter |
/// `name`, `outcome` = `admitted` | `waited` | `refused` | `failed`"; src/guide.rs:341: "each
/// pushback and client quota outcome, and each reason for a hold, is counted once per event";
/// src/guide.rs:335: "N tasks racing for L permits get exactly L, and only L calls reach the
/// dependency".
#[test]
fn attack_racing_calls_through_a_client_quota_and_a_pushback_are_counted_once() {
    use tower_bulwark::outbound::{ClientQuotaLayer, Pushback, PushedBack, QuotaExhausted};
    use tower_bulwark::{KeyedRateLimiter, Quota};

    let recorder = Arc::new(DebuggingRecorder::new());
    let snapshotter = recorder.snapshotter();
    let limiter = KeyedRateLimiter::<()>::builder(Quota::per_hour(37).unwrap())
        .clock(ManualClock::new())
        .build();
    let reached = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = {
        let reached = reached.clone();
        tower::service_fn(move |call: ()| {
            reached.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            ok_answer(call)
        })
    };
    let service = ClientQuotaLayer::new("partner-quota", limiter).layer(counted);
    let (admitted, refused) = race(&recorder, move |_| {
        burst::<QuotaExhausted, _>(service.clone())
    });
    assert_eq!((admitted, refused), (37, (THREADS * 25) as u64 - 37));
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 37);

    let pushback = metrics::with_local_recorder(&*recorder, || {
        let pushback = Pushback::builder("partner-pushback")
            .clock(ManualClock::new())
            .build();
        let answer = http::Response::builder()
            .status(429)
            .header("retry-after", "60")
            .body(())
            .unwrap();
        pushback.observe(&answer);
        pushback
    });
    let service = pushback.layer().layer(tower::service_fn(ok_answer));
    let (sent, held) = race(&recorder, move |_| burst::<PushedBack, _>(service.clone()));
    assert_eq!((sent, held), (0, (THREADS * 25) as u64));
    metrics::with_local_recorder(&*recorder, || pushback.publish_gauges());
    let all = series(&snapshotter);
    let quota = counter_by(
        &all,
        "bulwark_client_quota_calls_total",
        "partner-quota",
        "outcome",
    );
    assert_eq!(
        [
            quota("admitted"),
            quota("refused"),
            quota("waited"),
            quota("failed")
        ],
        [admitted, refused, 0, 0],
        "{all:?}"
    );
    let calls = counter_by(
        &all,
        "bulwark_pushback_calls_total",
        "partner-pushback",
        "outcome",
    );
    assert_eq!(
        [calls("admitted"), calls("waited"), calls("refused")],
        [0, 0, held],
        "{all:?}"
    );
    let holds = counter(
        &all,
        "bulwark_pushback_holds_total",
        &[("name", "partner-pushback"), ("reason", "retry_after")],
    );
    assert_eq!(holds, 1, "{all:?}");
    let held_for = gauge(
        &all,
        "bulwark_pushback_held_seconds",
        &[("name", "partner-pushback")],
    );
    assert_eq!(held_for, 60.0, "{all:?}");
}

/// Eight threads of 20 GETs each through one retry layer to a dependency that always answers
/// `503`: every first attempt is counted `first`, every retry that reached the dependency
/// `retry`, and every call that ended with retries left because the budget held none is one
/// `skipped{reason=budget}`, however the threads raced for the budget.
///
/// Promises: src/observe.rs:37-38: "`bulwark_retry_attempts_total` | counter | `name`, `kind` =
/// `first` | `retry` | attempts ...: each call's first, and each retry sent";
/// "`bulwark_retry_skipped_total` | counter | `name`, `reason` = `budget` | `wait` | retries of
/// transient answers not made: the budget held none, or the answer asked for a longer wait
/// than `max_wait`; the call ended with that answer"; src/guide.rs:366: "retries not made by
/// reason are counted".
#[test]
fn attack_racing_retries_are_counted_by_kind_and_reason_once() {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use tower_bulwark::outbound::retry::Retry;

    const CALLS: usize = 20;
    let recorder = Arc::new(DebuggingRecorder::new());
    let snapshotter = recorder.snapshotter();
    let retry = Retry::builder("raced-retry")
        .max_attempts(3)
        .backoff(Duration::from_micros(1), Duration::from_micros(10))
        .budget(0.2, 3, Duration::from_secs(10))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let hits: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let dependency = {
        let hits = hits.clone();
        tower::service_fn(move |request: http::Request<()>| {
            let id = request.headers()["x-call"].to_str().unwrap().to_owned();
            *hits.lock().unwrap().entry(id).or_default() += 1;
            async move {
                tokio::task::yield_now().await;
                Ok::<_, BoxError>(http::Response::builder().status(503).body(()).unwrap())
            }
        })
    };
    let service = retry.layer().layer(dependency);
    let (answered, _) = race(&recorder, move |t| {
        let service = service.clone();
        async move {
            let calls = (0..CALLS).map(|i| {
                let request = http::Request::get("http://dependency/")
                    .header("x-call", format!("{t}-{i}"))
                    .body(())
                    .unwrap();
                service.clone().oneshot(request)
            });
            let mut answered = 0;
            for result in futures::future::join_all(calls).await {
                assert_eq!(result.unwrap().status(), 503);
                answered += 1;
            }
            (answered, 0)
        }
    });
    assert_eq!(answered, (THREADS * CALLS) as u64);
    let hits = hits.lock().unwrap();
    assert_eq!(hits.len(), THREADS * CALLS);
    let sent: u64 = hits.values().sum();
    let cut_short = hits.values().filter(|n| **n < 3).count() as u64;
    let all = series(&snapshotter);
    let attempts = counter_by(&all, "bulwark_retry_attempts_total", "raced-retry", "kind");
    let skipped = counter_by(&all, "bulwark_retry_skipped_total", "raced-retry", "reason");
    assert_eq!(attempts("first"), (THREADS * CALLS) as u64, "{all:?}");
    assert_eq!(
        attempts("retry"),
        sent - (THREADS * CALLS) as u64,
        "{all:?}"
    );
    assert_eq!(skipped("budget"), cut_short, "{all:?}");
    assert_eq!(skipped("wait"), 0, "{all:?}");
    // The budget, whoever raced: a fifth of the calls, plus 3 a second over the window of
    // 10 s ("min_per_second retries a second come with no deposit, and both expire after
    // window").
    assert!(
        attempts("retry") <= (THREADS * CALLS) as u64 / 5 + 3 * 10,
        "{all:?}"
    );
}
