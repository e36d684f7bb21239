//! With the `metrics` feature on, an observed limiter records every decision through handles it
//! registered once: deciding allocates nothing, admitted or refused.
#![cfg(feature = "metrics")]

mod counting;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower_bulwark::observe::{metric_names as m, Observed};
use tower_bulwark::{KeyedRateLimiter, Limiter, ManualClock, Quota};

#[test]
fn decisions_record_metrics_without_allocating() {
    const KEYS: u64 = 4;
    const PER_KEY: u64 = 1_000;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        // Time stands still: each key gets its 500 and is refused after that.
        let limiter = Observed::new(
            "api",
            KeyedRateLimiter::<u64>::builder(Quota::per_second(500).unwrap())
                .clock(ManualClock::new())
                .build(),
        );
        // The first decision registers the handles, and each key's first inserts it.
        for key in 0..KEYS {
            assert!(limiter.reserve_now(&key, 1).unwrap().unwrap().allowed);
        }
        let before = counting::allocations();
        for i in KEYS..PER_KEY * KEYS {
            limiter.reserve_now(&(i % KEYS), 1).unwrap().unwrap();
        }
        let spent = counting::allocations() - before;
        assert_eq!(
            spent,
            0,
            "{spent} allocations for {} decisions",
            PER_KEY * KEYS
        );
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let calls = |outcome: &str| {
        snapshot
            .iter()
            .find_map(|(key, _, _, value)| {
                let key = key.key();
                let wanted = key.name() == m::RATELIMITER_CALLS
                    && key
                        .labels()
                        .any(|l| l.key() == "outcome" && l.value() == outcome);
                match value {
                    DebugValue::Counter(n) if wanted => Some(*n),
                    _ => None,
                }
            })
            .unwrap_or(0)
    };
    assert_eq!(calls("allowed"), 500 * KEYS, "the metrics were recorded");
    assert_eq!(calls("limited"), (PER_KEY - 500) * KEYS);
}

/// The value of the series `name` whose labels include `label`, from a debugging snapshot.
fn series<'a>(
    snapshot: &'a [(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )],
    name: &str,
    label: (&str, &str),
) -> Option<&'a DebugValue> {
    snapshot.iter().find_map(|(key, _, _, value)| {
        let key = key.key();
        (key.name() == name
            && key
                .labels()
                .any(|l| l.key() == label.0 && l.value() == label.1))
        .then_some(value)
    })
}

/// A bulkhead built by hand (not from a config file) counts its calls too, and a call through
/// it allocates nothing for its metrics.
#[test]
fn a_bulkhead_built_by_hand_records_its_calls_without_allocating() {
    use tower::{service_fn, Service, ServiceExt};
    use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull};
    use tower_bulwark::BoxError;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let payment = Bulkhead::semaphore("payment", 1).build();
            let mut client = tower::ServiceBuilder::new()
                .layer(payment.layer())
                .service(service_fn(|n: u32| async move { Ok::<_, BoxError>(n) }));
            // The first call registers the handles.
            assert_eq!(client.ready().await.unwrap().call(1).await.unwrap(), 1);
            let calls = 1_000;
            let before = counting::allocations();
            for n in 0..calls {
                client.ready().await.unwrap().call(n).await.unwrap();
            }
            let per_call = (counting::allocations() - before) / u64::from(calls);
            // One call in flight, another refused.
            let held = client.ready().await.unwrap().call(7);
            let refused = client.ready().await.unwrap().call(8).await.unwrap_err();
            assert!(refused.is::<BulkheadFull>());
            assert_eq!(held.await.unwrap(), 7);
            payment.publish_gauges();
            assert_eq!(per_call, 0, "allocations per call through the bulkhead");
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |outcome: &str| match series(&snapshot, m::BULKHEAD_CALLS, ("outcome", outcome)) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{outcome}: {other:?}"),
    };
    assert_eq!(counter("permitted"), 1_002);
    assert_eq!(counter("finished"), 1_002);
    assert_eq!(counter("rejected"), 1);
    match series(&snapshot, m::BULKHEAD_DURATION, ("name", "payment")) {
        Some(DebugValue::Histogram(values)) => assert_eq!(values.len(), 1_002),
        other => panic!("duration: {other:?}"),
    }
    assert!(matches!(
        series(&snapshot, m::BULKHEAD_MAX, ("name", "payment")),
        Some(DebugValue::Gauge(v)) if v.into_inner() == 1.0
    ));
}
