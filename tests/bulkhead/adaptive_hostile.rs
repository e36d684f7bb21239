//! Attacks on the adaptive bulkhead's documented promises (its module and item docs, the guide's
//! adaptive section), each test naming the promise it attacks. Time is a `ManualClock`; nothing
//! sleeps to pass.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::sync::oneshot;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::adaptive::{
    AdaptiveBulkhead, AdaptiveBulkheadBuilder, Aimd, Gradient, LimitAlgorithm, LimitChanged,
    Limits, Sample, Verdict,
};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::BoxError;

use super::adaptive_support::{
    assert_panics_were_no_samples, cancelled_after, end_all, gated, gated_calls, gated_client,
    limits, ms, on_manual_clock, recording, round_at_the_limit, with_changes, with_recorder,
    ChangeLog,
};
use crate::common::process::quiet_panics_starting_with;
use crate::common::response;

/// The builder of [`on_manual_clock`], on Gradient where `gradient` says so (AIMD, the default,
/// where not), and its clock.
fn aimd_or_gradient(
    name: &str,
    limits: Limits,
    gradient: bool,
) -> (AdaptiveBulkheadBuilder, ManualClock) {
    let (builder, clock) = on_manual_clock(name, limits);
    if gradient {
        (builder.algorithm(Gradient::default()), clock)
    } else {
        (builder, clock)
    }
}

// ---- Samples that lie: calls admitted under a higher limit ----

/// Promise (Aimd docs, guide): the limit grows only "if some call of the round was admitted with
/// the limit reached"; Gradient adds headroom only "while the limit is in use". After a backoff,
/// calls admitted under the old, higher limit (none of them at it) end in the next round with
/// more calls in flight than the new limit: that is not use of the limit, and must not grow it.
#[tokio::test]
async fn calls_admitted_under_a_higher_limit_do_not_make_the_lowered_limit_grow() {
    for gradient in [false, true] {
        let (builder, clock) = aimd_or_gradient("stale", limits(1, 10, 100), gradient);
        let (bulkhead, changes, mut client) = gated_client(builder);
        // Nine calls in flight under a limit of 10: the limit is never reached.
        let mut calls: Vec<_> = (0..9)
            .map(|_| {
                let (tx, rx) = oneshot::channel::<u16>();
                (Some(tx), Some(Box::pin(client.call(rx))))
            })
            .collect();
        let mut end = |i: usize, status: u16| {
            let (tx, call) = &mut calls[i];
            tx.take().unwrap().send(status).unwrap();
            let call = call.take().unwrap();
            async move { call.await.unwrap() }
        };
        // 10 ms: the first ends, healthy, and opens a round of 10 ms.
        clock.advance(ms(10));
        end(0, 200).await;
        // 20 ms: a 503 closes the round: the limit comes down (10 → 8 either way).
        clock.advance(ms(10));
        end(1, 503).await;
        assert_eq!(bulkhead.limit(), 8, "gradient: {gradient}");
        // The next round: the two calls admitted ninth and eighth (of 10) end healthy, at the
        // same latency. Nobody was ever admitted with the limit reached.
        clock.advance(ms(5));
        end(8, 200).await;
        clock.advance(ms(5));
        end(7, 200).await;
        assert_eq!(
            *changes.lock().unwrap(),
            [(10, 8)],
            "gradient: {gradient}: a lowered limit grew on calls admitted under the old one"
        );
        drop(calls);
        assert_eq!(
            bulkhead.snapshot().available_concurrent_calls,
            bulkhead.limit()
        );
    }
}

/// The other side of the same rule: a call admitted with the limit reached is use of the limit,
/// even when the limit has risen by the time it ends.
#[tokio::test]
async fn a_call_admitted_at_the_limit_is_use_even_after_the_limit_rose() {
    let clock = ManualClock::new();
    let (bulkhead, changes) = with_changes(
        AdaptiveBulkhead::builder("rose")
            .limits(limits(1, 2, 100))
            // Latency is not what this is about.
            .algorithm(Aimd::default().latency_tolerance(100.0).unwrap())
            .clock(clock.clone()),
    );
    let mut client = ServiceBuilder::new()
        .layer(bulkhead.layer())
        .service(gated());
    // Round 1 (0..10 ms): two calls at the limit of 2 → 3.
    let (tx1, rx1) = oneshot::channel();
    let (tx2, rx2) = oneshot::channel();
    let first = client.call(rx1);
    let second = client.call(rx2);
    clock.advance(ms(10));
    tx1.send(200).unwrap();
    first.await.unwrap();
    // A call admitted now is the second of 2 again: at the limit.
    let (tx3, rx3) = oneshot::channel();
    let third = client.call(rx3);
    clock.advance(ms(10));
    tx2.send(200).unwrap();
    second.await.unwrap();
    assert_eq!(bulkhead.limit(), 3);
    // Round 2 (20..35 ms, the mean round trip of round 1): only the third ends in it; it was
    // admitted with the limit reached.
    clock.advance(ms(15));
    tx3.send(200).unwrap();
    third.await.unwrap();
    assert_eq!(*changes.lock().unwrap(), [(2, 3), (3, 4)]);
}

// ---- Panics caught above the bulkhead ----

/// Promise (module docs, guide): "A call that panicked is no sample." A panic caught above the
/// bulkhead (`FutureExt::catch_unwind`, tower-http's `CatchPanicLayer`) leaves the response
/// future to be dropped after the unwinding: it must still be no sample, not a cancelled call
/// (an overload signal by default).
#[tokio::test]
async fn a_panic_caught_above_the_bulkhead_is_no_sample() {
    quiet_panics_starting_with("attack:");
    let (bulkhead, recorder, finished) = recording("caught");
    let service = ServiceBuilder::new()
        .layer(bulkhead.layer())
        .service(service_fn(|panic: bool| async move {
            if panic {
                panic!("attack: in the future");
            }
            Ok::<_, BoxError>(response(200, &[]))
        }));
    let caught =
        futures::FutureExt::catch_unwind(AssertUnwindSafe(service.clone().oneshot(true))).await;
    assert!(caught.is_err());

    // The same, polled by hand: the panic is caught, the future dropped later.
    let mut call = Box::pin(service.clone().call(true));
    let mut cx = Context::from_waker(Waker::noop());
    let polled = std::panic::catch_unwind(AssertUnwindSafe(|| call.as_mut().poll(&mut cx)));
    assert!(polled.is_err());
    drop(call);

    assert_panics_were_no_samples(&bulkhead, &recorder, &finished, 2);
}

/// A classifier that panics, caught above: no sample, the permit back exactly once, and the
/// call reported as panicked.
#[tokio::test]
async fn a_panicking_classifier_caught_above_is_no_sample_and_loses_no_permit() {
    quiet_panics_starting_with("attack:");
    let (bulkhead, recorder, finished) = recording("classifier");
    let service = ServiceBuilder::new()
        .layer(
            bulkhead.layer_with(|_: Result<&http::Response<()>, &BoxError>| -> Verdict {
                panic!("attack: in the classifier")
            }),
        )
        .service(service_fn(|_: ()| async {
            Ok::<_, BoxError>(response(200, &[]))
        }));
    for _ in 0..3 {
        let caught =
            futures::FutureExt::catch_unwind(AssertUnwindSafe(service.clone().oneshot(()))).await;
        assert!(caught.is_err());
    }
    assert_panics_were_no_samples(&bulkhead, &recorder, &finished, 3);
    assert_eq!(bulkhead.snapshot().total_permitted, 3);
}

// ---- Absurd instants ----

/// Promise (guide): "zero, enormous or backwards round trips and instants neither panic nor
/// freeze the limit for ages", round trips being capped at 2^40 ns "so no round lasts for ages".
/// One reading at the end of time, or a clock that steps back by a day, must not stop the
/// algorithm from deciding for longer than that cap.
#[test]
fn one_absurd_instant_does_not_freeze_the_limit() {
    let bounds = limits(1, 8, 64);
    for (name, absurd) in [
        ("end of time", Duration::MAX),
        ("a day ahead", Duration::from_secs(86_400)),
    ] {
        for gradient in [false, true] {
            let mut algorithm: Box<dyn LimitAlgorithm> = if gradient {
                Box::new(Gradient::default())
            } else {
                Box::new(Aimd::default())
            };
            let mut limit = 8;
            // One sample read from a clock gone wrong, with an ordinary round trip.
            let sample = Sample::new(absurd, ms(10), limit, limit);
            limit = bounds.clamp(algorithm.update(&sample, &bounds));
            // Then the clock is right again: an hour of calls at the limit, every 10 ms (well
            // past the 18 minutes of the cap).
            let mut at = ms(0);
            let mut moved = false;
            for _ in 0..360_000 {
                at += ms(10);
                let sample = Sample::new(at, ms(10), limit, limit);
                let next = bounds.clamp(algorithm.update(&sample, &bounds));
                moved |= next != limit;
                limit = next;
                if moved {
                    break;
                }
            }
            assert!(
                moved,
                "{name}, gradient {gradient}: the limit stayed frozen at {limit} for an hour"
            );
        }
    }
}

// ---- Limit invariants ----

/// Promise: the limit grows "only while callers are held back by it". A dependency used one call
/// at a time, for thousands of round trips, must keep its limit; so must one used at the limit
/// minus one.
#[tokio::test]
async fn a_lightly_used_dependency_never_pushes_the_limit_up() {
    for gradient in [false, true] {
        let (builder, clock) = aimd_or_gradient("light", limits(1, 4, 256), gradient);
        let (bulkhead, changes, mut client) = gated_client(builder);
        for _ in 0..2_000 {
            // Three calls of four at once, then they end.
            let calls = gated_calls(&mut client, 3);
            clock.advance(ms(7));
            end_all(calls, 200).await;
        }
        assert_eq!(bulkhead.limit(), 4, "gradient {gradient}");
        assert!(changes.lock().unwrap().is_empty());
    }
}

/// Promise: "at most one step per round". A thousand calls at the limit ending at one instant
/// (a round closing with all of them) grow the limit once; a thousand 503s at one instant cut it
/// once.
#[tokio::test]
async fn a_flood_of_samples_at_one_instant_moves_the_limit_at_most_once() {
    let (builder, clock) = on_manual_clock("flood", limits(1, 1000, 5000));
    let (bulkhead, changes, mut client) = gated_client(builder);
    for status in [200, 200, 503] {
        round_at_the_limit(&bulkhead, &mut client, &clock, status).await;
    }
    // The first flood opens a round (until 20 ms) and cannot close it; the first sample of the
    // second closes it (at the limit: + 1) and the rest are at the same instant; the first 503
    // of the third closes the next (× 0.8), the other 1000 change nothing.
    assert_eq!(*changes.lock().unwrap(), [(1000, 1001), (1001, 800)]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.total_permitted, 3001);
    assert_eq!(snapshot.available_concurrent_calls, 800);
}

// ---- Hooks, snapshot, limit ----

/// Promise: `on_limit_changed` reports each move once, in order, with from/to; hooks added
/// earlier run before later ones; the snapshot's limit equals `limit()`.
#[tokio::test]
async fn every_move_is_reported_once_in_order_by_every_hook() {
    let clock = ManualClock::new();
    let first = ChangeLog::default();
    let second = ChangeLog::default();
    let order = Arc::new(Mutex::new(Vec::new()));
    let (f, s, o1, o2) = (first.clone(), second.clone(), order.clone(), order.clone());
    let bulkhead = AdaptiveBulkhead::builder("hooks")
        .limits(limits(2, 5, 7))
        .clock(clock.clone())
        .on_limit_changed(move |e: &LimitChanged<'_>| {
            assert_eq!(e.bulkhead, "hooks");
            f.lock().unwrap().push((e.from, e.to));
            o1.lock().unwrap().push(1);
        })
        .on_limit_changed(move |e: &LimitChanged<'_>| {
            s.lock().unwrap().push((e.from, e.to));
            o2.lock().unwrap().push(2);
        })
        .build();
    let mut client = ServiceBuilder::new()
        .layer(bulkhead.layer())
        .service(service_fn(|status: u16| async move {
            Ok::<_, BoxError>(response(status, &[]))
        }));
    let mut limits_seen = vec![bulkhead.limit()];
    // 503s every 10 ms: one round each, down to min; then in-use rounds cannot happen with one
    // call at a time, so the limit stays.
    for _ in 0..8 {
        client.ready().await.unwrap().call(503).await.unwrap();
        assert_eq!(
            bulkhead.snapshot().max_allowed_concurrent_calls,
            bulkhead.limit()
        );
        if limits_seen.last() != Some(&bulkhead.limit()) {
            limits_seen.push(bulkhead.limit());
        }
        clock.advance(ms(10));
    }
    let expected: Vec<_> = limits_seen.windows(2).map(|w| (w[0], w[1])).collect();
    assert_eq!(expected, [(5, 4), (4, 3), (3, 2)]);
    assert_eq!(*first.lock().unwrap(), expected);
    assert_eq!(*second.lock().unwrap(), expected);
    assert_eq!(*order.lock().unwrap(), [1, 2, 1, 2, 1, 2]);
}

// ---- Permit exactness on many threads, the limit moving ----

/// An algorithm that moves the limit on every sample, up and down across the bounds.
struct Jumpy(usize);

impl LimitAlgorithm for Jumpy {
    fn update(&mut self, sample: &Sample, _: &Limits) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Sometimes outside the bounds on purpose: the bulkhead must clamp.
        (self.0 >> 33) % 20 + sample.limit / 100
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_permit_comes_back_whatever_ends_the_call_on_many_threads() {
    quiet_panics_starting_with("attack:");
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bulkhead = AdaptiveBulkhead::builder("threads")
        .limits(limits(2, 6, 12))
        .algorithm(Jumpy(7))
        .build();
    let probe = bulkhead.clone();
    let inner_inside = inside.clone();
    let service = ServiceBuilder::new()
        .layer(bulkhead.layer())
        .service(service_fn(move |kind: u8| {
            let inside = inner_inside.clone();
            let probe = probe.clone();
            if kind == 4 {
                panic!("attack: in call");
            }
            async move {
                let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                // Never more inside than the highest limit allowed.
                assert!(now <= 12, "{now} inside");
                assert!((2..=12).contains(&probe.limit()));
                tokio::task::yield_now().await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                match kind {
                    0 => Ok(response(200, &[])),
                    1 => Ok(response(503, &[])),
                    2 => Err(BoxError::from("boom")),
                    3 => panic!("attack: in the future"),
                    _ => {
                        std::future::pending::<()>().await;
                        unreachable!()
                    }
                }
            }
        }));
    let mut tasks = Vec::new();
    for t in 0..8u8 {
        let service = service.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..400u32 {
                let kind = ((i as u8).wrapping_mul(7).wrapping_add(t)) % 7;
                let mut service = service.clone();
                match kind {
                    5 => {
                        // Dropped after one poll, by a timeout.
                        let call = service.call(5);
                        let _ = tokio::time::timeout(Duration::from_micros(50), call).await;
                    }
                    6 => {
                        // Dropped before its first poll.
                        drop(service.call(0));
                    }
                    _ => {
                        let call = futures::FutureExt::catch_unwind(AssertUnwindSafe(async move {
                            service.call(kind).await
                        }));
                        let _ = call.await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.total_permitted, snapshot.total_finished);
    assert_eq!(snapshot.available_concurrent_calls, bulkhead.limit());
    assert_eq!(snapshot.max_allowed_concurrent_calls, bulkhead.limit());
    assert!((2..=12).contains(&bulkhead.limit()));
}

/// A clock whose next reading, once armed, stalls the reading thread until released (a thread
/// descheduled right after it read the clock).
#[derive(Default)]
struct StallingClock {
    now: std::sync::atomic::AtomicU64,
    armed: std::sync::atomic::AtomicBool,
    stalled: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl tower_bulwark::clock::Clock for StallingClock {
    fn now(&self) -> u64 {
        let value = self.now.load(std::sync::atomic::Ordering::SeqCst);
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let stalled = self.stalled.lock().unwrap().take().unwrap();
            stalled.send(()).unwrap();
            let release = self.release.lock().unwrap().take().unwrap();
            release.recv().unwrap();
        }
        value
    }
}

/// Promise (`LimitAlgorithm`): `update` runs "once per call that gave a sample, in the order the
/// calls ended". A call whose thread read the end instant and was descheduled before recording
/// must not hand the algorithm an instant older than one it has already seen (which looks like
/// a clock going back).
#[test]
fn samples_reach_the_algorithm_in_the_order_of_their_instants() {
    use std::sync::atomic::Ordering::SeqCst;
    let clock = Arc::new(StallingClock::default());
    let (stalled_tx, stalled_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    *clock.stalled.lock().unwrap() = Some(stalled_tx);
    *clock.release.lock().unwrap() = Some(release_rx);
    let (builder, recorder) = with_recorder("order");
    let bulkhead = builder.clock(clock.clone()).build();
    let mut service = ServiceBuilder::new()
        .layer(bulkhead.layer())
        .service(service_fn(|_: ()| async {
            Ok::<_, BoxError>(response(200, &[]))
        }));
    let first = service.call(());
    let second = service.call(());
    fn finish<F: Future + Send + 'static>(call: F) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut call = Box::pin(call);
            let mut cx = Context::from_waker(Waker::noop());
            assert!(call.as_mut().poll(&mut cx).is_ready());
        })
    }
    // The first call ends at 10 ms; its thread stalls right after reading the clock.
    clock.now.store(10_000_000, SeqCst);
    clock.armed.store(true, SeqCst);
    let a = finish(first);
    stalled_rx.recv().unwrap();
    // The second ends at 20 ms, while the first is stalled.
    clock.now.store(20_000_000, SeqCst);
    let b = finish(second);
    // Let the second get as far as it can (it may be held behind the first).
    for _ in 0..200 {
        if b.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    release_tx.send(()).unwrap();
    a.join().unwrap();
    b.join().unwrap();
    let instants: Vec<_> = recorder.0.lock().unwrap().iter().map(|s| s.at).collect();
    assert_eq!(instants.len(), 2);
    assert!(
        instants[0] <= instants[1],
        "the algorithm saw {instants:?}: an older instant after a newer one"
    );
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 8);
}

// ---- The classifier against a real client ----

/// A server on 127.0.0.1 that reads each request and then cuts the connection without an
/// answer: closed (`reset` false) or reset (`reset` true).
#[cfg(feature = "reqwest")]
async fn cutting_server(reset: bool) -> std::net::SocketAddr {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            if reset {
                #[allow(deprecated)]
                socket.set_linger(Some(Duration::ZERO)).unwrap();
            }
            drop(socket);
        }
    });
    addr
}

/// Promise (guide, `Verdict::Overloaded`, `HttpOverload`): "refused or cut connections are
/// overload". A `reqwest::Client` whose request the dependency cut, closed or reset, is.
#[cfg(feature = "reqwest")]
#[tokio::test]
async fn a_connection_cut_by_the_dependency_is_overload() {
    for reset in [false, true] {
        let addr = cutting_server(reset).await;
        let (builder, recorder) = with_recorder("cut");
        let bulkhead = builder.build();
        let client = ServiceBuilder::new()
            .layer(bulkhead.layer())
            .service(reqwest::Client::new());
        let request = reqwest::Request::new(
            reqwest::Method::GET,
            format!("http://{addr}/").parse().unwrap(),
        );
        let err = client.oneshot(request).await.unwrap_err();
        let mut chain = vec![err.to_string()];
        let mut source = std::error::Error::source(&*err);
        while let Some(e) = source {
            chain.push(format!("{e} ({e:?})"));
            source = e.source();
        }
        let verdicts = recorder.verdicts();
        assert_eq!(verdicts, [true], "reset {reset}: {chain:#?}");
    }
}

/// Promise (module docs, CHANGELOG: "backs off by 0.8 on 429/503/504, timeouts, connection
/// failures"): a timeout is overload. Put below the bulkhead (a per-attempt timeout:
/// bulkhead → tower's `TimeoutLayer` → client), a dependency that hangs answers with tower's
/// `Elapsed`, and must be an overload signal, as tokio's `Elapsed` is.
#[tokio::test(start_paused = true)]
async fn tower_timeout_below_the_bulkhead_is_overload() {
    let (builder, recorder) = with_recorder("timeout-below");
    let bulkhead = builder.build();
    let client = ServiceBuilder::new()
        .layer(bulkhead.layer())
        .timeout(ms(100))
        .service(service_fn(|_: ()| async {
            std::future::pending::<()>().await;
            Ok::<_, BoxError>(response(200, &[]))
        }));
    let err = client.oneshot(()).await.unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    let verdicts = recorder.verdicts();
    assert_eq!(verdicts, [true]);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 8);
}

// ---- Gradient's prose against its formula ----

/// The `Gradient` docs said "once the latency climbs `tolerance` times above its baseline the
/// limit shrinks". Their own formula (`target = limit × gradient + sqrt(limit)` while in use)
/// says otherwise: the limit settles where `limit × (1 − gradient) = sqrt(limit)`, that is at
/// `1 / (1 − gradient)²`. At 1.5 times the baseline latency (gradient 1.1 / 1.5) that is about
/// 14: a limit of 4 in use grows towards it, one of 40 shrinks towards it. The docs now say so;
/// this pins the behaviour they describe.
#[test]
fn gradient_in_use_shrinks_above_tolerance_only_once_the_limit_outweighs_its_headroom() {
    for (start, grows) in [(4, true), (40, false)] {
        let bounds = limits(1, start, 100);
        let mut gradient = Gradient::default();
        let mut limit = start;
        let mut at = ms(0);
        // Twenty rounds of 10 ms, not in use: the baseline is 10 ms, the limit holds.
        for _ in 0..=20 {
            at += ms(10);
            limit = gradient.update(&Sample::new(at, ms(10), 1, limit), &bounds);
        }
        assert_eq!(limit, start);
        // Then rounds at 1.5 times the baseline, with the limit in use.
        for _ in 0..200 {
            at += ms(10);
            limit = gradient.update(&Sample::new(at, ms(15), limit, limit), &bounds);
        }
        if grows {
            assert!(limit > start, "{start} → {limit}");
        } else {
            assert!(limit < start, "{start} → {limit}");
        }
        assert!((12..=15).contains(&limit), "{start} → {limit}");
    }
}

// ---- Metrics ----

/// Promise (the `observe` docs, "Metric names"): with `metrics`, the limit gauge follows the limit as
/// it moves, down and up, and calls are counted as for every bulkhead (a refusal as `rejected`).
#[cfg(feature = "metrics")]
#[test]
fn the_gauge_follows_every_move_and_calls_are_counted() {
    use super::adaptive_support::round_trip;
    use crate::common::recorded::{on_own_recorder, runtime};
    use metrics_util::debugging::DebugValue;

    let _ = on_own_recorder(&runtime(), |snapshotter| async move {
        // The debugging recorder's snapshot swaps every counter and gauge to zero: counters are
        // summed over the snapshots, and the gauge is read only right after a move.
        let counted = std::cell::RefCell::new(std::collections::HashMap::<String, f64>::new());
        let read = |name: &str, outcome: Option<&str>| {
            let mut gauge = None;
            for (key, .., value) in snapshotter.snapshot().into_vec() {
                let key = key.key();
                if !key
                    .labels()
                    .any(|l| l.key() == "name" && l.value() == "metered")
                {
                    continue;
                }
                let label = key
                    .labels()
                    .find(|l| l.key() == "outcome")
                    .map(|l| l.value().to_owned());
                match value {
                    DebugValue::Gauge(v) if key.name() == name => gauge = Some(v.into_inner()),
                    DebugValue::Counter(n) => {
                        let id = format!("{}/{}", key.name(), label.unwrap_or_default());
                        *counted.borrow_mut().entry(id).or_default() += n as f64;
                    }
                    _ => {}
                }
            }
            match outcome {
                Some(outcome) => counted.borrow().get(&format!("{name}/{outcome}")).copied(),
                None => gauge,
            }
        };
        let (builder, clock) = on_manual_clock("metered", limits(1, 5, 10));
        let bulkhead = builder.build();
        let mut client = ServiceBuilder::new()
            .layer(bulkhead.layer())
            .service(gated());
        let mut seen = Vec::new();
        let mut last = bulkhead.limit();
        // Down: one 503 per round trip.
        for _ in 0..3 {
            round_trip(&mut client, &clock, 503).await;
            let gauge = read("bulwark_bulkhead_max_allowed_concurrent_calls", None);
            if bulkhead.limit() != last {
                last = bulkhead.limit();
                seen.push((last, gauge));
            }
        }
        // Up: every round at the limit, until it has grown twice.
        while bulkhead.limit() < 5 {
            round_at_the_limit(&bulkhead, &mut client, &clock, 200).await;
            let gauge = read("bulwark_bulkhead_max_allowed_concurrent_calls", None);
            if bulkhead.limit() != last {
                last = bulkhead.limit();
                seen.push((last, gauge));
            }
        }
        assert_eq!(
            seen.iter().map(|(limit, _)| *limit).collect::<Vec<_>>(),
            [4, 3, 4, 5]
        );
        for (limit, gauge) in &seen {
            assert_eq!(Some(*limit as f64), *gauge, "{seen:?}");
        }
        let snapshot = bulkhead.snapshot();
        assert_eq!(
            read("bulwark_bulkhead_calls_total", Some("permitted")),
            Some(snapshot.total_permitted as f64)
        );
        assert_eq!(
            read("bulwark_bulkhead_calls_total", Some("rejected")),
            Some(snapshot.total_rejected as f64)
        );
        assert!(snapshot.total_rejected > 0);
        assert_eq!(
            read("bulwark_bulkhead_calls_total", Some("finished")),
            Some(snapshot.total_finished as f64)
        );
    });
}

/// Calls dropped before their first poll never reached the dependency: a burst of them (a caller
/// that builds futures and gives up, at startup or later) must not be read as overload. Before
/// the fix each one was an overload signal closing its own round, and ten of them took a limit
/// of 100 down to about 11.
#[tokio::test]
async fn calls_dropped_before_their_first_poll_are_no_sample() {
    let (builder, clock) = on_manual_clock("unpolled", limits(1, 100, 100));
    let (bulkhead, changes, mut client) = gated_client(builder);
    for _ in 0..10 {
        let (_gate, rx) = oneshot::channel::<u16>();
        let call = client.ready().await.unwrap().call(rx);
        clock.advance(ms(1));
        drop(call);
    }
    assert_eq!(
        bulkhead.limit(),
        100,
        "moves: {:?}",
        changes.lock().unwrap()
    );
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 100);
    // A call that was polled and then dropped (a timeout above it) still is overload.
    cancelled_after(&mut client, &clock, ms(5)).await;
    cancelled_after(&mut client, &clock, ms(10)).await;
    assert!(
        bulkhead.limit() < 100,
        "a polled, cut call is overload: {:?}",
        changes.lock().unwrap()
    );
}
