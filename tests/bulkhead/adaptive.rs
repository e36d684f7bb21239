//! The adaptive bulkhead through its public API: each algorithm against figures computed by hand
//! on a manual clock, the classifier (with a real `reqwest` client against a `wiremock` server on
//! 127.0.0.1), and the bulkhead properties that must hold as for every bulkhead.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::poll;
use tokio::sync::oneshot;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::adaptive::{
    AdaptiveBulkhead, Aimd, Classify, FromTowerHttp, Gradient, HttpOverload, LimitAlgorithm,
    LimitChanged, Limits, Sample, Verdict,
};
use tower_bulwark::bulkhead::BulkheadFull;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::BoxError;

use super::adaptive_support::{
    assert_full, assert_panics_were_no_samples, cancelled_after, gated, gated_calls, limits, ms,
    on_manual_clock, recording, round_trip, with_changes, with_recorder,
};
use crate::common::dependency::answering;
use crate::common::response;

const MS: Duration = Duration::from_millis(1);

/// A limit algorithm and its bounds, fed samples as the bulkhead would feed them.
struct Fed<A> {
    algorithm: A,
    bounds: Limits,
}

impl<A: LimitAlgorithm> Fed<A> {
    fn new(algorithm: A, bounds: Limits) -> Self {
        Self { algorithm, bounds }
    }

    /// Feeds `samples` (`(at, rtt, in_flight, overloaded)`, in ms), each admitted under the
    /// limit before it, from `limit`, clamping as the bulkhead would; the limit after each.
    fn feed(&mut self, mut limit: usize, samples: &[(u64, u64, usize, bool)]) -> Vec<usize> {
        samples
            .iter()
            .map(|&(at, rtt, in_flight, overloaded)| {
                let sample = Sample::new(ms(at), ms(rtt), in_flight, limit).overloaded(overloaded);
                limit = (self.bounds).clamp(self.algorithm.update(&sample, &self.bounds));
                limit
            })
            .collect()
    }
}

// ---- AIMD, by hand ----

#[test]
fn aimd_grows_by_one_per_round_trip_and_only_while_the_limit_is_in_use() {
    let mut aimd = Fed::new(Aimd::default(), limits(1, 4, 100));
    // The first sample opens a round of its own round trip (10 ms: until 20 ms). Every sample of
    // the round was admitted at the limit, yet it grows once, when the round closes at 20 ms.
    let limits = aimd.feed(
        4,
        &[
            (10, 10, 4, false),
            (12, 10, 4, false),
            (15, 10, 4, false),
            (20, 10, 4, false),
        ],
    );
    assert_eq!(limits, [4, 4, 4, 5]);
    // Next round: 10 ms (the mean), until 30 ms. Nobody reached the limit of 5: no growth.
    let limits = aimd.feed(5, &[(25, 10, 3, false), (30, 10, 4, false)]);
    assert_eq!(limits, [5, 5]);
    // Until 40 ms: one call admitted at the limit is enough to grow, once.
    let limits = aimd.feed(
        5,
        &[(31, 10, 5, false), (35, 10, 5, false), (40, 10, 2, false)],
    );
    assert_eq!(limits, [5, 5, 6]);
}

#[test]
fn aimd_backs_off_once_per_round_trip_on_overload_and_keeps_the_fraction() {
    let mut aimd = Fed::new(Aimd::default(), limits(1, 10, 100));
    // Round 0..10 ms: two 503s in one round trip cut the limit once: 10 × 0.8 = 8.
    let got = aimd.feed(
        10,
        &[
            (0, 10, 10, false),
            (3, 1, 10, true),
            (5, 1, 10, true),
            (10, 10, 10, false),
        ],
    );
    assert_eq!(got, [10, 10, 10, 8]);
    // Round until 20 ms: one timeout → 8 × 0.8 = 6.4, shown as 6.
    let got = aimd.feed(8, &[(15, 10, 8, true), (20, 10, 8, false)]);
    assert_eq!(got, [8, 6]);
    // A healthy round at the limit: 6.4 + 1 = 7.4, shown as 7 (the fraction is kept).
    let got = aimd.feed(6, &[(25, 10, 6, false), (30, 10, 6, false)]);
    assert_eq!(got, [6, 7]);
    // And again: 8.4 → 8.
    let got = aimd.feed(7, &[(40, 10, 7, false)]);
    assert_eq!(got, [8]);
}

#[test]
fn aimd_backs_off_when_latency_rises_above_its_baseline() {
    let mut aimd = Fed::new(Aimd::default(), limits(1, 10, 100));
    // Baseline: the first round's mean, 10 ms; the limit grows to 11 (in use).
    assert_eq!(
        aimd.feed(10, &[(0, 10, 10, false), (10, 10, 10, false)]),
        [10, 11]
    );
    // 12 ms is within 1.3 × 10 ms: healthy, grows to 12. In its warm-up the baseline is the
    // plain mean of the rounds so far: 11 ms.
    assert_eq!(aimd.feed(11, &[(20, 12, 11, false)]), [12]);
    // The next round lasts min(12 ms, baseline 10 ms) and ends at 30 ms. A mean of 15 ms is
    // above 1.3 × 11 = 14.3 ms: back off, 12 × 0.8 = 9.6 → 9, with no 503 at all.
    assert_eq!(
        aimd.feed(12, &[(25, 15, 12, false), (30, 15, 12, false)]),
        [12, 9]
    );
}

#[test]
fn queueing_is_never_learnt_as_the_baseline_unless_nothing_is_left_to_shed() {
    let mut aimd = Fed::new(Aimd::default(), limits(1, 10, 100));
    // Warm-up: 16 rounds of 10 ms, not in use. Baseline 10 ms, limit 10.
    let warm: Vec<_> = (0..=16).map(|i| (i * 10, 10, 1, false)).collect();
    assert_eq!(*aimd.feed(10, &warm).last().unwrap(), 10);
    // Now every round takes 20 ms, above 1.3 × 10: back off each round, 10 × 0.8^n, while the
    // baseline stays at 10 ms. The estimate reaches the minimum in round 11 (10 × 0.8^11 = 0.86,
    // clamped to 1; shown as 1 from round 8, 10 × 0.8^8 = 1.68). From round 12 on, at the
    // minimum, the baseline learns: 20 - 10 × (15/16)^j after j rounds, and round 12 + j is slow
    // while 20 > 1.3 × that, that is for j ≤ 11. Round 24 is the first within the tolerance.
    let mut limit = 10;
    let mut shown = Vec::new();
    for round in 0..26u64 {
        limit = aimd.feed(limit, &[(180 + round * 20, 20, limit, false)])[0];
        shown.push(limit);
    }
    assert_eq!(&shown[..8], [8, 6, 5, 4, 3, 2, 2, 1]);
    assert!(shown[7..23].iter().all(|&l| l == 1), "{shown:?}");
    assert_eq!(shown[23..], [2, 3, 4]);
}

#[test]
fn aimd_stays_within_min_and_max() {
    let mut aimd = Fed::new(Aimd::default(), limits(2, 4, 5));
    let mut limit = 4;
    let mut at = 0;
    for _ in 0..20 {
        at += 10;
        limit = aimd.feed(limit, &[(at, 10, limit, false)])[0];
        assert!((2..=5).contains(&limit));
    }
    assert_eq!(limit, 5, "grows to max and no further");
    for _ in 0..20 {
        at += 10;
        limit = aimd.feed(limit, &[(at, 10, limit, true)])[0];
        assert!((2..=5).contains(&limit));
    }
    assert_eq!(limit, 2, "falls to min and no further");
    // The estimate was kept at min, not below: one healthy round brings it to 3 at once.
    at += 10;
    assert_eq!(aimd.feed(2, &[(at, 10, 2, false)]), [3]);
}

#[test]
fn absurd_round_trips_and_instants_neither_panic_nor_freeze_the_limit_for_ages() {
    for algorithm in [
        Box::new(Aimd::default()) as Box<dyn LimitAlgorithm>,
        Box::new(Gradient::default()),
    ] {
        let mut algorithm = algorithm;
        let bounds = limits(1, 8, 64);
        // A frozen clock and zero round trips: a thousand samples at one instant are one round,
        // which never closes, so the limit cannot run away.
        let mut limit = 8;
        for _ in 0..1000 {
            let sample = Sample::new(Duration::ZERO, Duration::ZERO, limit, limit);
            limit = algorithm.update(&sample, &bounds);
        }
        assert_eq!(limit, 8);
        // An enormous round trip counts as 2^40 ns (`Sample::rtt`): the round it opens ends that
        // much later, not in 584 years.
        let mut algorithm = Box::new(Aimd::default());
        let huge = Sample::new(ms(1), Duration::MAX, 8, 8);
        assert_eq!(algorithm.update(&huge, &bounds), 8);
        let after = Sample::new(ms(1) + Duration::from_nanos(1 << 40), ms(10), 8, 8);
        assert_eq!(algorithm.update(&after, &bounds), 9);
        // Instants at the end of time and going backwards: no panic, the limit stays in bounds.
        for at in [Duration::MAX, Duration::ZERO, Duration::MAX, ms(5)] {
            let sample = Sample::new(at, Duration::MAX, usize::MAX, 9).overloaded(true);
            assert!((1..=64).contains(&algorithm.update(&sample, &bounds)));
        }
    }
}

/// The largest limit a bulkhead takes, as `Limits::new` documents it.
const MAX_CONCURRENT_CALLS: usize = (1 << 31) - 1;

#[test]
fn bad_settings_are_errors_that_name_the_setting() {
    let cases = [
        (Limits::new(0, 1, 1), "min_limit"),
        (Limits::new(2, 1, 5), "initial_limit"),
        (Limits::new(2, 6, 5), "initial_limit"),
        (Limits::new(6, 6, 5), "min_limit"),
        (Limits::new(1, 1, MAX_CONCURRENT_CALLS + 1), "max_limit"),
    ];
    for (result, setting) in cases {
        let err = result.expect_err("refused");
        assert_eq!(err.setting(), setting);
        assert!(err.to_string().contains(setting), "{err}");
    }
    assert_eq!(
        Limits::new(0, 1, 1).unwrap_err().to_string(),
        "adaptive bulkhead: `min_limit` must be at least 1: a limit of zero would refuse every \
         call and never learn again, got 0"
    );
    assert!(Limits::new(1, 1, MAX_CONCURRENT_CALLS).is_ok());
    for backoff in [0.0, 1.0, -0.5, f64::NAN, 2.0] {
        assert_eq!(
            Aimd::default().backoff(backoff).unwrap_err().setting(),
            "backoff"
        );
    }
    for tolerance in [0.99, f64::INFINITY, f64::NAN, -1.0] {
        assert_eq!(
            Aimd::default()
                .latency_tolerance(tolerance)
                .unwrap_err()
                .setting(),
            "latency_tolerance"
        );
        assert_eq!(
            Gradient::default()
                .latency_tolerance(tolerance)
                .unwrap_err()
                .setting(),
            "latency_tolerance"
        );
    }
    for smoothing in [0.0, 1.01, f64::NAN] {
        assert_eq!(
            Gradient::default()
                .smoothing(smoothing)
                .unwrap_err()
                .setting(),
            "smoothing"
        );
    }
    assert!(Aimd::default()
        .backoff(0.5)
        .and_then(|a| a.latency_tolerance(1.0))
        .is_ok());
}

// ---- Gradient, by hand ----

#[test]
fn gradient_follows_the_ratio_of_baseline_to_latency() {
    let mut gradient = Fed::new(Gradient::default(), limits(1, 10, 100));
    // Round 1 (mean 10 ms, no baseline yet): gradient = min(1.1 × 10 / 10, 1) = 1, in use, so
    // target = 10 + sqrt(10) = 13.1623 and limit = 0.7 × 10 + 0.3 × 13.1623 = 10.9487 → 10.
    assert_eq!(
        gradient.feed(10, &[(0, 10, 10, false), (10, 10, 10, false)]),
        [10, 10]
    );
    // Round 2 (20 ms, twice the baseline): gradient = 1.1 × 10 / 20 = 0.55, headroom
    // sqrt(10.9487) = 3.3089, target = 6.0218 + 3.3089 = 9.3307,
    // limit = 0.7 × 10.9487 + 0.3 × 9.3307 = 10.4633 → 10. The baseline is now 15 ms.
    assert_eq!(gradient.feed(10, &[(20, 20, 10, false)]), [10]);
    // Round 3 (an overload signal): gradient 0.5 and no headroom: target = 5.2316,
    // limit = 0.7 × 10.4633 + 0.3 × 5.2316 = 8.8938 → 8.
    assert_eq!(gradient.feed(10, &[(30, 10, 10, true)]), [8]);
    // Not in use, below the baseline: gradient 1, no headroom, the limit holds at 8.89.
    assert_eq!(gradient.feed(8, &[(45, 10, 3, false)]), [8]);
    // In use again: 8.8938 × 0.7 + (8.8938 + 2.9822) × 0.3 = 9.7884 → 9.
    assert_eq!(gradient.feed(8, &[(60, 10, 8, false)]), [9]);
}

#[test]
fn gradient_grows_only_while_in_use_and_stays_within_bounds() {
    let mut gradient = Fed::new(Gradient::default(), limits(3, 4, 6));
    let mut limit = 4;
    for round in 1..=40u64 {
        limit = gradient.feed(limit, &[(round * 10, 10, 1, false)])[0];
    }
    assert_eq!(limit, 4, "no growth while nobody reaches the limit");
    for round in 41..=80u64 {
        limit = gradient.feed(limit, &[(round * 10, 10, limit, false)])[0];
        assert!((3..=6).contains(&limit));
    }
    assert_eq!(limit, 6);
    for round in 81..=120u64 {
        limit = gradient.feed(limit, &[(round * 10, 10, limit, true)])[0];
        assert!((3..=6).contains(&limit));
    }
    assert_eq!(limit, 3);
}

// ---- The classifier ----

#[derive(Debug)]
struct Wrapped(io::Error);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("wrapped")
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[tokio::test(start_paused = true)]
async fn http_overload_judges_statuses_and_errors() {
    let c = HttpOverload::default();
    for (status, verdict) in [
        (200, Verdict::Healthy),
        (404, Verdict::Healthy),
        (500, Verdict::Healthy),
        (502, Verdict::Healthy),
        (429, Verdict::Overloaded),
        (503, Verdict::Overloaded),
        (504, Verdict::Overloaded),
    ] {
        assert_eq!(c.classify(Ok(&response(status, &[]))), verdict, "{status}");
    }
    let elapsed = tokio::time::timeout(MS, std::future::pending::<()>())
        .await
        .unwrap_err();
    let errors: [(BoxError, Verdict); 7] = [
        (
            io::Error::from(io::ErrorKind::TimedOut).into(),
            Verdict::Overloaded,
        ),
        (
            io::Error::from(io::ErrorKind::ConnectionRefused).into(),
            Verdict::Overloaded,
        ),
        (
            io::Error::from(io::ErrorKind::ConnectionReset).into(),
            Verdict::Overloaded,
        ),
        (
            Wrapped(io::Error::from(io::ErrorKind::BrokenPipe)).into(),
            Verdict::Overloaded,
        ),
        (elapsed.into(), Verdict::Overloaded),
        (
            io::Error::from(io::ErrorKind::PermissionDenied).into(),
            Verdict::Ignored,
        ),
        ("some other failure".into(), Verdict::Ignored),
    ];
    for (err, verdict) in errors {
        let got = Classify::<http::Response<()>>::classify(&c, Err(&err));
        assert_eq!(got, verdict, "{err}");
    }
}

#[test]
fn any_tower_http_classifier_can_decide() {
    use tower_http::classify::{ServerErrorsAsFailures, StatusInRangeAsFailures};
    let server = FromTowerHttp(ServerErrorsAsFailures::new());
    assert_eq!(
        server.classify(Ok(&response(500, &[]))),
        Verdict::Overloaded
    );
    assert_eq!(server.classify(Ok(&response(429, &[]))), Verdict::Healthy);
    assert_eq!(server.classify(Ok(&response(200, &[]))), Verdict::Healthy);
    let range = FromTowerHttp(StatusInRangeAsFailures::new(429..=429));
    assert_eq!(range.classify(Ok(&response(429, &[]))), Verdict::Overloaded);
    assert_eq!(range.classify(Ok(&response(503, &[]))), Verdict::Healthy);
    let refused: BoxError = io::Error::from(io::ErrorKind::ConnectionRefused).into();
    assert_eq!(
        Classify::<http::Response<()>>::classify(&range, Err(&refused)),
        Verdict::Overloaded
    );
    // HttpOverload is itself a tower-http classifier, with the overload answers as failures.
    use tower_http::classify::{ClassifiedResponse, ClassifyResponse};
    assert!(matches!(
        ClassifyResponse::classify_response(HttpOverload::default(), &response(503, &[])),
        ClassifiedResponse::Ready(Err(_))
    ));
    assert!(matches!(
        ClassifyResponse::classify_response(HttpOverload::default(), &response(500, &[])),
        ClassifiedResponse::Ready(Ok(()))
    ));
}

#[tokio::test]
async fn a_real_reqwest_client_against_wiremock_is_classified() {
    use wiremock::ResponseTemplate;

    let server = answering([
        ("/ok", ResponseTemplate::new(200)),
        ("/busy", ResponseTemplate::new(503)),
        ("/slow-down", ResponseTemplate::new(429)),
        ("/broken", ResponseTemplate::new(500)),
        (
            "/hang",
            ResponseTemplate::new(200).set_delay(Duration::from_secs(30)),
        ),
    ])
    .await;
    // A port nobody listens on.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };

    let (builder, recorder) = with_recorder("wiremock");
    let bulkhead = builder.build();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(bulkhead.layer()).service(http);
    let request = |url: String| reqwest::Request::new(reqwest::Method::GET, url.parse().unwrap());

    for route in ["/ok", "/busy", "/slow-down", "/broken"] {
        let response = client
            .clone()
            .oneshot(request(format!("{}{route}", server.uri())))
            .await
            .unwrap();
        assert!(response.status().as_u16() >= 200);
    }
    // reqwest's own timeout and a refused connection are overload; both are errors.
    let timeout = client
        .clone()
        .oneshot(request(format!("{}/hang", server.uri())))
        .await
        .unwrap_err();
    assert!(!timeout.is::<BulkheadFull>());
    let refused = client
        .clone()
        .oneshot(request(format!("http://{closed}/")))
        .await
        .unwrap_err();
    assert!(!refused.is::<BulkheadFull>());
    // A malformed request is no sample.
    let bad = client
        .clone()
        .oneshot(request("http://127.0.0.1:1/".replace("http", "ftp")))
        .await
        .unwrap_err();
    assert!(!bad.is::<BulkheadFull>());

    assert_eq!(recorder.verdicts(), [false, true, true, false, true, true]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.total_permitted, 7);
    assert_eq!(snapshot.total_finished, 7);
    assert_eq!(snapshot.available_concurrent_calls, 8);
}

// ---- The bulkhead's properties ----

#[tokio::test]
async fn the_permit_is_taken_in_call_and_a_refusal_is_bulkhead_full_and_no_sample() {
    let clock = ManualClock::new();
    let (builder, recorder) = with_recorder("gate");
    let bulkhead = builder
        .limits(limits(1, 2, 10))
        .clock(clock.clone())
        .build();
    let inner = gated();
    let mut client = ServiceBuilder::new().layer(bulkhead.layer()).service(inner);
    for _ in 0..5 {
        client.ready().await.unwrap();
    }
    assert_eq!(
        bulkhead.snapshot().available_concurrent_calls,
        2,
        "poll_ready takes nothing"
    );

    let (tx1, rx1) = oneshot::channel();
    let (tx2, rx2) = oneshot::channel();
    let first = client.call(rx1);
    let second = client.call(rx2);
    let (_tx3, rx3) = oneshot::channel();
    let refused = client.call(rx3).await.unwrap_err();
    assert!(refused.is::<BulkheadFull>());
    assert_eq!(refused.to_string(), "bulkhead `gate` is full");
    assert!(!refused.is::<tokio::time::error::Elapsed>());

    clock.advance(ms(7));
    tx1.send(503).unwrap();
    tx2.send(200).unwrap();
    assert_eq!(first.await.unwrap().status(), 503);
    assert_eq!(second.await.unwrap().status(), 200);
    // Two samples, none for the refusal; each saw the clock's 7 ms and two calls in flight.
    let samples = recorder.0.lock().unwrap().clone();
    assert_eq!(samples.len(), 2);
    assert_eq!(
        samples.iter().map(|s| s.rtt).collect::<Vec<_>>(),
        [ms(7), ms(7)]
    );
    assert_eq!(samples[0].in_flight, 1);
    assert_eq!(samples[1].in_flight, 2);
    assert_eq!(recorder.verdicts(), [true, false]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.total_rejected, 1);
    assert_eq!(snapshot.available_concurrent_calls, 2);
}

#[tokio::test]
async fn two_clones_share_one_adaptive_limit() {
    let (builder, clock) = on_manual_clock("shared", limits(1, 5, 10));
    let (bulkhead, seen) = with_changes(builder);
    let inner = gated();
    let layer = bulkhead.layer();
    let mut a = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner.clone());
    let mut b = ServiceBuilder::new().layer(layer).service(inner).clone();
    let handle = bulkhead.clone();

    // Overload seen through `a` lowers the limit `b` and the handle see: one round of 503s.
    for _ in 0..2 {
        round_trip(&mut a, &clock, 503).await;
    }
    assert_eq!(handle.limit(), 4);
    assert_eq!(*seen.lock().unwrap(), [(5, 4)]);

    // Four calls in flight through `a` use up the limit for `b`.
    let gates = gated_calls(&mut a, 4);
    assert_full(&mut b).await;
    assert_eq!(handle.snapshot().available_concurrent_calls, 0);
    drop(gates);
    assert_eq!(handle.snapshot().available_concurrent_calls, 4);
}

#[tokio::test]
async fn a_cancelled_call_is_overload_by_default_and_never_a_fast_healthy_sample() {
    for ignore in [false, true] {
        let clock = ManualClock::new();
        let (builder, recorder) = with_recorder("cancel");
        let mut builder = builder.clock(clock.clone());
        if ignore {
            builder = builder.ignore_cancelled_calls();
        }
        let bulkhead = builder.build();
        let inner = gated();
        let mut client = ServiceBuilder::new().layer(bulkhead.layer()).service(inner);
        cancelled_after(&mut client, &clock, ms(3)).await;
        let samples = recorder.0.lock().unwrap().clone();
        if ignore {
            assert!(samples.is_empty());
        } else {
            assert_eq!(samples.len(), 1);
            assert!(samples[0].overloaded);
            assert_eq!(samples[0].rtt, ms(3));
        }
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 8);
        assert_eq!(bulkhead.snapshot().total_finished, 1);
    }
}

#[tokio::test]
async fn a_panicking_call_gives_its_permit_back_and_is_no_sample() {
    let (bulkhead, recorder, finished) = recording("panic");
    let in_call = ServiceBuilder::new()
        .layer(bulkhead.layer())
        .service(service_fn(|panic_in_call: bool| {
            if panic_in_call {
                panic!("in call");
            }
            async move {
                panic!("in future");
                #[allow(unreachable_code)]
                Ok::<http::Response<()>, BoxError>(response(200, &[]))
            }
        }));
    for panic_in_call in [true, false] {
        let mut service = in_call.clone();
        let outcome = std::panic::AssertUnwindSafe(async move {
            let future = service.call(panic_in_call);
            future.await
        });
        let caught = futures::FutureExt::catch_unwind(outcome).await;
        assert!(caught.is_err());
    }
    assert_panics_were_no_samples(&bulkhead, &recorder, &finished, 2);
}

#[tokio::test]
async fn lowering_the_limit_under_calls_in_flight_admits_nothing_until_they_end() {
    let (builder, clock) = on_manual_clock("shrink", limits(1, 10, 10));
    let bulkhead = builder.build();
    let inner = gated();
    let mut client = ServiceBuilder::new().layer(bulkhead.layer()).service(inner);
    // Ten calls in flight; the first two end with 503 one round trip apart, so the limit falls
    // to 8 and then 6 while eight are still in flight.
    let mut gates: Vec<_> = (0..10)
        .map(|_| {
            let (tx, rx) = oneshot::channel::<u16>();
            (Some(tx), Box::pin(client.call(rx)))
        })
        .collect();
    for (tx, call) in gates.iter_mut().take(3) {
        clock.advance(ms(10));
        tx.take().unwrap().send(503).unwrap();
        call.as_mut().await.unwrap();
    }
    assert_eq!(bulkhead.limit(), 6);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 0);
    // Seven still in flight, limit 6: refused, and still refused after one more ends.
    assert_full(&mut client).await;
    let (tx, call) = &mut gates[3];
    tx.take().unwrap().send(200).unwrap();
    call.as_mut().await.unwrap();
    assert_full(&mut client).await;
    // Once fewer than the limit are in flight, one gets in.
    let (tx, call) = &mut gates[4];
    tx.take().unwrap().send(200).unwrap();
    call.as_mut().await.unwrap();
    let (tx, rx) = oneshot::channel();
    let admitted = client.call(rx);
    tx.send(200).unwrap();
    admitted.await.unwrap();
    drop(gates);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.total_permitted, snapshot.total_finished);
    assert_eq!(snapshot.available_concurrent_calls, bulkhead.limit());
}

#[cfg(feature = "metrics")]
#[test]
fn the_limit_gauge_follows_the_limit_as_it_moves() {
    use crate::common::recorded::{gauge, on_own_recorder, runtime};

    let ((), series) = on_own_recorder(&runtime(), |_| async {
        let (builder, clock) = on_manual_clock("gauged", limits(1, 10, 10));
        let bulkhead = builder.build();
        let mut client = ServiceBuilder::new()
            .layer(bulkhead.layer())
            .service(service_fn(|status: u16| async move {
                Ok::<_, BoxError>(response(status, &[]))
            }));
        client.ready().await.unwrap().call(503).await.unwrap();
        clock.advance(ms(10));
        client.ready().await.unwrap().call(503).await.unwrap();
        assert_eq!(bulkhead.limit(), 8);
    });
    let limit = "bulwark_bulkhead_max_allowed_concurrent_calls";
    assert_eq!(gauge(&series, limit, &[("name", "gauged")]), 8.0);
}

/// An algorithm that panics on the samples it is told to, and otherwise lowers the limit by one.
struct Explosive {
    panic_on: Arc<Mutex<bool>>,
}

impl LimitAlgorithm for Explosive {
    fn update(&mut self, sample: &Sample, _: &Limits) -> usize {
        if *self.panic_on.lock().unwrap() {
            panic!("algorithm exploded");
        }
        sample.limit - 1
    }
}

#[tokio::test]
async fn a_panicking_algorithm_or_limit_hook_loses_no_permit_and_leaves_the_limit_consistent() {
    let panic_on = Arc::new(Mutex::new(false));
    let hook_panics = Arc::new(Mutex::new(false));
    let hook_flag = hook_panics.clone();
    let bulkhead = AdaptiveBulkhead::builder("explosive")
        .limits(limits(1, 5, 5))
        .algorithm(Explosive {
            panic_on: panic_on.clone(),
        })
        .on_limit_changed(move |_: &LimitChanged<'_>| {
            if *hook_flag.lock().unwrap() {
                panic!("hook exploded");
            }
        })
        .build();
    let mut client = ServiceBuilder::new()
        .layer(bulkhead.layer())
        .service(gated());
    let catch = |future| futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(future));

    // The algorithm panics as a call completes: the caller sees the panic, the permit is back,
    // the limit is unchanged.
    *panic_on.lock().unwrap() = true;
    let (tx, rx) = oneshot::channel();
    let call = client.call(rx);
    tx.send(200).unwrap();
    assert!(catch(call).await.is_err());
    assert_eq!(bulkhead.limit(), 5);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 5);

    // ... and as a cancelled call is dropped: the permit still comes back.
    let (_tx, rx) = oneshot::channel();
    let mut call = Box::pin(client.call(rx));
    assert!(poll!(call.as_mut()).is_pending());
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(call)));
    assert!(dropped.is_err());
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 5);

    // The hook panics after the limit moved: the move holds, the permit is back.
    *panic_on.lock().unwrap() = false;
    *hook_panics.lock().unwrap() = true;
    let (tx, rx) = oneshot::channel();
    let call = client.call(rx);
    tx.send(200).unwrap();
    assert!(catch(call).await.is_err());
    assert_eq!(bulkhead.limit(), 4);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.max_allowed_concurrent_calls, 4);
    assert_eq!(snapshot.available_concurrent_calls, 4);

    // Both poisoned nothing: the next call moves the limit as usual.
    *hook_panics.lock().unwrap() = false;
    let (tx, rx) = oneshot::channel();
    let call = client.call(rx);
    tx.send(200).unwrap();
    call.await.unwrap();
    assert_eq!(bulkhead.limit(), 3);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.total_permitted, 4);
    assert_eq!(snapshot.total_finished, 4);
    assert_eq!(snapshot.available_concurrent_calls, 3);
}

#[tokio::test]
async fn in_the_documented_stack_a_timeout_above_and_503s_below_are_overload() {
    use tower_bulwark::limiter::DirectRateLimiter;
    use tower_bulwark::outbound::{ClientQuotaLayer, Pushback};
    use tower_bulwark::Quota;
    use wiremock::ResponseTemplate;

    let server = answering([
        (
            "/slow",
            ResponseTemplate::new(200).set_delay(Duration::from_secs(30)),
        ),
        ("/busy", ResponseTemplate::new(503)),
        ("/ok", ResponseTemplate::new(200)),
    ])
    .await;

    // retry → timeout → pushback → client quota → adaptive bulkhead → client
    let (builder, recorder) = with_recorder("partner");
    let bulkhead = builder.build();
    let client = ServiceBuilder::new()
        .retry(NoRetry)
        .timeout(Duration::from_millis(200))
        .layer(Pushback::builder("partner").build().layer())
        .layer(ClientQuotaLayer::new(
            "partner",
            DirectRateLimiter::new(Quota::per_hour(100).unwrap()),
        ))
        .layer(bulkhead.layer())
        .service(reqwest::Client::new());
    let get = |route: &str| {
        reqwest::Request::new(
            reqwest::Method::GET,
            format!("{}{route}", server.uri()).parse().unwrap(),
        )
    };

    assert_eq!(
        client.clone().oneshot(get("/ok")).await.unwrap().status(),
        200
    );
    let cut = client.clone().oneshot(get("/slow")).await.unwrap_err();
    assert!(cut.is::<tower::timeout::error::Elapsed>(), "{cut}");
    assert!(!cut.is::<BulkheadFull>());
    assert_eq!(
        client.clone().oneshot(get("/busy")).await.unwrap().status(),
        503
    );

    // The answer is healthy; the call the timeout cut and the 503 are overload.
    assert_eq!(recorder.verdicts(), [false, true, true]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.total_permitted, 3);
    assert_eq!(snapshot.total_finished, 3);
    assert_eq!(snapshot.available_concurrent_calls, bulkhead.limit());
}

/// A retry policy that never retries: the stack's first layer, in place.
#[derive(Clone)]
struct NoRetry;

impl tower::retry::Policy<reqwest::Request, reqwest::Response, BoxError> for NoRetry {
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _: &mut reqwest::Request,
        _: &mut Result<reqwest::Response, BoxError>,
    ) -> Option<Self::Future> {
        None
    }

    fn clone_request(&mut self, request: &reqwest::Request) -> Option<reqwest::Request> {
        request.try_clone()
    }
}

/// A tower-http 0.7 classifier judges a `reqwest::Client`'s answers as they are, with no
/// adapter: `StatusInRangeAsFailures` over 500–599 takes a `500` for overload (the default
/// takes it for a healthy answer), and a `200` for a healthy one.
#[tokio::test]
async fn a_tower_http_classifier_judges_a_reqwest_client_as_it_is() {
    use tower_http::classify::StatusInRangeAsFailures;
    use wiremock::ResponseTemplate;

    let server = answering([
        ("/ok", ResponseTemplate::new(200)),
        ("/failed", ResponseTemplate::new(500)),
    ])
    .await;
    let (builder, recorder) = with_recorder("partner");
    let bulkhead = builder.build();
    let client = ServiceBuilder::new()
        .layer(bulkhead.layer_with(FromTowerHttp(StatusInRangeAsFailures::new(500..=599))))
        .service(reqwest::Client::new());
    for route in ["/ok", "/failed", "/ok"] {
        let url = format!("{}{route}", server.uri()).parse().unwrap();
        let request = reqwest::Request::new(reqwest::Method::GET, url);
        client.clone().oneshot(request).await.unwrap();
    }
    assert_eq!(recorder.verdicts(), [false, true, false]);
}

/// An adaptive bulkhead above a layer that queues samples the dependency's latency, not the
/// queue's: three calls through a queue of one permit to a dependency that answers each in
/// 100 ms wait 0, 100 and 200 ms, and each is sampled at 100 ms (100, 200 and 300 ms before
/// the waits below were taken out).
#[tokio::test(start_paused = true)]
async fn a_wait_in_a_queue_below_is_not_the_dependencys_latency() {
    let (builder, recorder) = with_recorder("sampled");
    let adaptive = builder
        .clock(tower_bulwark::clock::TokioClock::new())
        .build();
    let client = ServiceBuilder::new()
        .layer(adaptive.layer())
        .layer(
            tower_bulwark::Bulkhead::queue("below", 1, 8)
                .build()
                .layer(),
        )
        .service(service_fn(|_: ()| async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, BoxError>(response(200, &[]))
        }));
    let calls = (0..3).map(|_| client.clone().oneshot(()));
    for result in futures::future::join_all(calls).await {
        assert_eq!(result.unwrap().status(), 200);
    }
    let rtts: Vec<_> = recorder.0.lock().unwrap().iter().map(|s| s.rtt).collect();
    assert_eq!(rtts, vec![Duration::from_millis(100); 3]);
}
