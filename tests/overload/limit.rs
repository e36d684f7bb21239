//! The limit under a step in latency: a service whose latency jumps from W to 3W brings the
//! limit down, and latency back at W brings it up again. Time is a manual clock, moved by W or
//! 3W while a wave of requests holding the whole limit waits at the gate.

use std::time::Duration;

use tower::ServiceExt;
use tower_bulwark::bulkhead::adaptive::{Aimd, Gradient, LimitAlgorithm, Limits};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::overload::{Overload, Priority};

use crate::support::{fixed, gated, moving_limit, request, Gated, Svc};

const W: Duration = Duration::from_millis(50);

/// One wave: as many requests as the limit admits, all answered after `latency`; returns the
/// limit after it.
async fn wave(
    overload: &Overload,
    service: &Svc,
    gated: &Gated,
    clock: &ManualClock,
    latency: Duration,
    entered: &mut tokio::sync::mpsc::UnboundedReceiver<Priority>,
) -> usize {
    let n = overload.limit();
    let calls: Vec<_> = (0..n)
        .map(|_| tokio::spawn(service.clone().oneshot(request(Priority::Critical))))
        .collect();
    for _ in 0..n {
        entered.recv().await.unwrap();
    }
    assert_eq!(overload.in_flight(), n);
    clock.advance(latency);
    gated.gate.add_permits(n);
    for call in calls {
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(overload.in_flight(), 0);
    overload.limit()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_falls_when_latency_triples_and_recovers_when_it_returns() {
    let (builder, clock) = moving_limit(fixed(10), (2, 10, 200), Gradient::default());
    let overload = builder.build();
    let (service, gated, mut entered) = gated(&overload);
    let mut at_w = 0;
    for _ in 0..30 {
        at_w = wave(&overload, &service, &gated, &clock, W, &mut entered).await;
    }
    assert!(
        at_w > 10,
        "a limit in use at the baseline latency grows: {at_w}"
    );
    let mut at_3w = at_w;
    for _ in 0..30 {
        at_3w = wave(&overload, &service, &gated, &clock, 3 * W, &mut entered).await;
    }
    assert!(
        at_3w * 2 < at_w,
        "three times the latency: from {at_w} down to {at_3w}"
    );
    let mut back = at_3w;
    for _ in 0..30 {
        back = wave(&overload, &service, &gated, &clock, W, &mut entered).await;
    }
    assert!(
        back > at_3w * 2,
        "latency back at W: from {at_3w} up to {back}"
    );
}

#[tokio::test]
async fn a_request_that_fails_gives_no_sample() {
    let clock = ManualClock::new();
    let overload = Overload::builder("api")
        .limits(Limits::new(1, 4, 8).unwrap())
        .clock(clock.clone())
        .build();
    let failing = tower::service_fn(|_: http::Request<axum::body::Body>| async {
        Err::<http::Response<axum::body::Body>, _>("broken")
    });
    let service = tower::Layer::layer(&overload.layer(), failing);
    for _ in 0..100 {
        clock.advance(W * 100);
        assert!(service
            .clone()
            .oneshot(request(Priority::Default))
            .await
            .is_err());
    }
    assert_eq!(overload.limit(), 4, "errors moved the limit");
    assert_eq!(overload.in_flight(), 0);
}

/// A flood from the start on a service that serves 8 requests at `work` and slows beyond as a
/// processor shared by all (a wave of `n` takes `work × n / 8`): each wave holds the whole limit.
/// `work` is `W` for the first `slower_after` waves and `2W` after. Returns the limit after each
/// wave.
async fn flood_from_the_start(
    algorithm: impl LimitAlgorithm,
    waves: usize,
    slower_after: usize,
) -> Vec<usize> {
    let (builder, clock) = moving_limit(fixed(16), (8, 16, 1000), algorithm);
    let overload = builder.build();
    let (service, gated, mut entered) = gated(&overload);
    let mut limits = Vec::new();
    for i in 0..waves {
        let work = if i < slower_after { W } else { 2 * W };
        let latency = work * overload.limit().max(8) as u32 / 8;
        limits.push(wave(&overload, &service, &gated, &clock, latency, &mut entered).await);
    }
    limits
}

// With a baseline of W, the limit settles where `limit × (1 - 1.1 × W / latency) = sqrt(limit)`
// and `latency = W × limit / 8`: `limit - sqrt(limit) = 8.8`, about 12.3.
#[tokio::test]
async fn a_flood_from_the_start_finds_the_no_load_latency_by_probing() {
    // The baseline learnt slowly from every round trip takes in the flood's queueing: it
    // settles at about 2.5 times the no-load latency, and the limit with it.
    let probing = Gradient::default().probe_every(100).unwrap();
    probing_finds_the_no_load_latency(probing, Gradient::default(), 40, 11..=14, 25).await;
}

/// Under a flood from the start, `probing` starts a probe at the first crowded round trip and
/// keeps the limit within `settled` from wave `from`, where `learning` (the same algorithm
/// without probes) takes the flood's queueing for its baseline and stays at `learning_at_least`
/// or above.
///
/// Its tests run on one thread, so that every run feeds the algorithm a wave's samples in the
/// same order: on two, the order varied with the threads, and once in some hundred runs the
/// limit stepped a wave below the range.
async fn probing_finds_the_no_load_latency<A: LimitAlgorithm>(
    probing: A,
    learning: A,
    from: usize,
    settled: std::ops::RangeInclusive<usize>,
    learning_at_least: usize,
) {
    let limits = flood_from_the_start(probing, 80, 80).await;
    assert_eq!(
        limits[1], 8,
        "the first crowded round trip starts a probe: {limits:?}"
    );
    assert!(
        limits[from..].iter().all(|l| settled.contains(l)),
        "settles within {settled:?}: {limits:?}"
    );
    let learning = flood_from_the_start(learning, 80, 80).await;
    assert!(
        learning[from..].iter().all(|&l| l >= learning_at_least),
        "the slow baseline: {learning:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baseline_is_measured_again_after_two_periods_without_an_uncrowded_round_trip() {
    // Twice the work from wave 40: the old baseline (W) is forgotten within two periods of 10
    // round trips, a probe measures 2W, and the limit settles as before.
    let probing = Gradient::default().probe_every(10).unwrap();
    let limits = flood_from_the_start(probing, 120, 40).await;
    assert!(
        limits[40..70].contains(&8),
        "a probe after the slowdown: {limits:?}"
    );
    assert!(
        limits[90..]
            .iter()
            .filter(|l| (11..=14).contains(*l))
            .count()
            >= 25,
        "settles near 12.3 again: {limits:?}"
    );
}

// AIMD with a tolerance of 1.1 holds the limit where the latency is about 1.1 times the
// baseline: at 8 a wave takes W and the limit grows; at 9 it takes 9/8 W, 1.125 times the
// baseline, and the limit backs off to its minimum, one wave late (a round trip closes when the
// next wave ends), so from 10.
#[tokio::test]
async fn aimd_probing_finds_the_no_load_latency_under_a_flood_from_the_start() {
    // Kept at the service's capacity; the baseline learnt slowly takes in the flood's queueing
    // from the start (16 in flight, twice the no-load latency), and the limit stays there.
    let aimd = || Aimd::default().latency_tolerance(1.1).unwrap();
    probing_finds_the_no_load_latency(aimd().probe_every(100).unwrap(), aimd(), 20, 8..=10, 14)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aimd_probing_measures_the_baseline_again_after_a_step_in_latency() {
    // Twice the work from wave 40: against the old baseline (W) every wave is slow, and the limit
    // stays at its minimum; once two periods of 10 round trips have passed without one as fast as
    // W, the baseline is 2W and the limit is held at the capacity again, as before the step.
    let aimd = Aimd::default().latency_tolerance(1.1).unwrap();
    let limits = flood_from_the_start(aimd.probe_every(10).unwrap(), 120, 40).await;
    assert!(
        limits[40..50].iter().all(|&l| l == 8),
        "the slower service at the minimum: {limits:?}"
    );
    assert!(
        limits[60..].iter().all(|l| (8..=10).contains(l)) && limits[60..].contains(&10),
        "held at the capacity on the new baseline: {limits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_ends_while_critical_requests_borrow_above_the_minimum() {
    // Waves of critical requests that fill their ceiling, three times the limit, each answered
    // after W: a probe at the minimum of 2 runs with 6 in flight, so none of its round trips is
    // uncrowded; after 10 of them the lowest stands in for the baseline, and the limit goes
    // back where it was.
    let aimd = Aimd::default().latency_tolerance(1.1).unwrap();
    let borrowing = fixed(8).critical_borrowing(3.0).unwrap();
    let (builder, clock) = moving_limit(borrowing, (2, 8, 100), aimd.probe_every(5).unwrap());
    let overload = builder.build();
    let (service, gated, mut entered) = gated(&overload);
    let mut limits = Vec::new();
    for _ in 0..40 {
        let n = overload.ceiling(Priority::Critical);
        let calls: Vec<_> = (0..n)
            .map(|_| tokio::spawn(service.clone().oneshot(request(Priority::Critical))))
            .collect();
        for _ in 0..n {
            entered.recv().await.unwrap();
        }
        clock.advance(W);
        gated.gate.add_permits(n);
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap().status(), 200);
        }
        limits.push(overload.limit());
    }
    assert!(
        limits[1..11].iter().all(|&l| l == 2),
        "a probe of 10 round trips: {limits:?}"
    );
    assert!(
        limits[11] == 8 && limits[19] > 8,
        "back where it was, and growing: {limits:?}"
    );
}
