//! The retry budget with real numbers: 100 calls a second for 30 s of tokio's paused time, 35 %
//! or 10 % of attempts failing; the exact integer budget (a ratio of 0.1 is one retry per ten
//! calls, never a little more), its window, clones racing for it, and cancellation at every
//! await of a call (the budget stays exact, no attempt follows).

use crate::common::{poll_once, Rng};
use crate::retry::{get, healthy_calls, retry, scripted};

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use tower::limit::ConcurrencyLimitLayer;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::retry::{Retry, RetryBuilder};
use tower_bulwark::BoxError;

/// What a load run saw: calls offered, attempts the dependency received, calls that succeeded.
#[derive(Debug)]
struct Run {
    calls: usize,
    attempts: usize,
    succeeded: usize,
}

/// Offers 100 calls a second for 30 s, open loop, to a dependency that answers each attempt
/// `503` with probability `failing` percent (a seeded sequence), through `partner`'s layer.
async fn offer(partner: &Retry, failing: u64) -> Run {
    let attempts = Arc::new(AtomicUsize::new(0));
    let (counted, rng) = (attempts.clone(), Arc::new(Mutex::new(Rng(0x5eed_f1a2))));
    let dependency = service_fn(move |_: Request<String>| {
        counted.fetch_add(1, Ordering::Relaxed);
        let status = if rng.lock().unwrap().below(100) < failing {
            503
        } else {
            200
        };
        async move { Ok::<_, BoxError>(Response::builder().status(status).body(())?) }
    });
    let client = partner.layer().layer(dependency);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..3000 {
        tick.tick().await;
        calls.spawn(client.clone().oneshot(get()));
    }
    let mut succeeded = 0;
    while let Some(call) = calls.join_next().await {
        succeeded += usize::from(call.unwrap().unwrap().status() == 200);
    }
    let attempts = attempts.load(Ordering::Relaxed);
    Run {
        calls: 3000,
        attempts,
        succeeded,
    }
}

/// With 35 % of attempts failing, three attempts a call would make 1.47 attempts per call; the
/// default budget (0.2 of the calls, 3 a second) holds them under 1.25, and it is the budget
/// that binds: without it (a ratio of 10) the same run makes more than 1.4. (This seed: 3 687
/// attempts with the budget, 1.23 a call; 4 440 without.)
#[tokio::test(start_paused = true)]
async fn with_35_percent_failing_attempts_stay_under_1_25_per_call() {
    let run = offer(&retry().build().unwrap(), 35).await;
    assert!(run.attempts * 100 <= run.calls * 125, "{run:?}");
    // Retries were made up to the budget: 0.2 × 3000 and the floor's 3 a second.
    assert!(run.attempts >= run.calls + 600, "{run:?}");
    let unbounded = retry()
        .budget(10.0, 3, Duration::from_secs(10))
        .build()
        .unwrap();
    let run = offer(&unbounded, 35).await;
    assert!(run.attempts * 10 > run.calls * 14, "{run:?}");
}

/// A flaky dependency (10 % of attempts fail): at least 99 % of calls succeed, with at most
/// 1.25 attempts per call.
#[tokio::test(start_paused = true)]
async fn a_flaky_dependency_is_hidden_within_1_25_attempts_per_call() {
    let run = offer(&retry().build().unwrap(), 10).await;
    assert!(run.succeeded * 100 >= run.calls * 99, "{run:?}");
    assert!(run.attempts * 100 <= run.calls * 125, "{run:?}");
}

/// The retry layer `partner` on `clock`, without backoff: a retry leaves at once, and the time
/// the test reads is the clock's alone.
pub(crate) fn frozen(clock: &ManualClock) -> RetryBuilder {
    let builder = Retry::builder("partner").clock(clock.clone());
    builder.backoff(Duration::ZERO, Duration::ZERO)
}

/// [`frozen`], with a budget of the reserve alone: `per_second` retries a second over
/// `window`, and no deposits; `attempts` at most a call.
pub(crate) fn reserve_only(
    clock: &ManualClock,
    per_second: u32,
    window: Duration,
    attempts: u32,
) -> RetryBuilder {
    let builder = frozen(clock).budget(0.0, per_second, window);
    builder.max_attempts(attempts)
}

/// A ratio of 0.1 is exactly one retry per ten calls: 29 calls give 2 retries, 30 give 3, not a
/// little more (0.1 × 30 is 3.0000000000000004 in floating point). Ten more calls, all failing,
/// deposit one more: 4 retries in all.
#[tokio::test(start_paused = true)]
async fn a_fractional_ratio_grants_exactly_its_share() {
    let clock = ManualClock::new();
    let budget = frozen(&clock).budget(0.1, 0, Duration::from_secs(10));
    let partner = budget.build().unwrap();
    let (dependency, calls) = scripted([vec![(200, vec![]); 30], vec![(503, vec![]); 20]].concat());
    let client = partner.layer().layer(dependency);
    for n in 1..=30 {
        client.clone().oneshot(get()).await.unwrap();
        assert_eq!(partner.budget_available(), n / 10, "after {n} calls");
    }
    for _ in 0..10 {
        client.clone().oneshot(get()).await.unwrap();
    }
    assert_eq!(calls.count(), 30 + 10 + 4);
    assert_eq!(partner.budget_available(), 0);
}

/// Deposits last one window: an idle spell banks nothing. The floor comes back each window.
#[tokio::test(start_paused = true)]
async fn deposits_expire_after_the_window_and_the_floor_comes_back() {
    let clock = ManualClock::new();
    let partner = frozen(&clock)
        .budget(0.2, 1, Duration::from_secs(10))
        .build()
        .unwrap();
    healthy_calls(&partner, 100).await;
    assert_eq!(partner.budget_available(), 20 + 10);
    clock.advance(Duration::from_millis(9_999));
    assert_eq!(partner.budget_available(), 30);
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        partner.budget_available(),
        10,
        "only the floor after a window"
    );
    clock.advance(Duration::from_secs(3600));
    assert_eq!(partner.budget_available(), 10);
}

/// `RetryBuilder::budget`: the reserve is "the window's worth, there at once" (30 with the
/// defaults), counted in whole retries: 3 a second over 100 ms is 0.3 of a retry, which grants
/// none alone and one once four calls have deposited 0.2 each (1.1 in all).
#[tokio::test(start_paused = true)]
async fn the_reserve_is_the_window_s_worth_at_once_counted_in_whole_retries() {
    let clock = ManualClock::new();
    assert_eq!(frozen(&clock).build().unwrap().budget_available(), 30);
    let short = |ratio| {
        let budget = frozen(&clock).budget(ratio, 3, Duration::from_millis(100));
        budget.build().unwrap()
    };
    assert_eq!(short(0.0).budget_available(), 0);
    let partner = short(0.2);
    healthy_calls(&partner, 3).await;
    assert_eq!(partner.budget_available(), 0, "0.3 + 0.6");
    healthy_calls(&partner, 1).await;
    assert_eq!(partner.budget_available(), 1, "0.3 + 0.8");
}

/// 200 calls on clones of one handle, on 4 threads, each failing and wanting a retry, race for
/// a budget of 20 retries (4 a second over 5 s, time frozen): exactly 20 retries are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clones_racing_for_a_budget_of_l_retries_get_exactly_l() {
    let clock = ManualClock::new();
    let partner = reserve_only(&clock, 4, Duration::from_secs(5), 3)
        .build()
        .unwrap();
    let (dependency, calls) = scripted(vec![(503, vec![]); 1000]);
    let mut racing = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let client = partner.clone().layer().layer(dependency.clone());
        racing.spawn(async move { client.oneshot(get()).await.unwrap() });
    }
    while let Some(call) = racing.join_next().await {
        assert_eq!(call.unwrap().status(), 503);
    }
    assert_eq!(calls.count(), 200 + 20);
    assert_eq!(partner.budget_available(), 0);
}

/// A dependency that answers its first call `503` and never answers the others, counting them.
fn first_fails_then_hangs() -> (
    impl Service<Request<String>, Response = Response<()>, Error = BoxError, Future: Send>
        + Clone
        + Send
        + 'static,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let service = service_fn(move |_: Request<String>| {
        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if !first {
                std::future::pending::<()>().await;
            }
            Ok::<_, BoxError>(Response::builder().status(503).body(())?)
        }
    });
    (service, calls)
}

/// Each call deposits one retry, and there is no floor: the budget counts whole retries.
fn one_per_call() -> Retry {
    retry()
        .budget(1.0, 0, Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The attempts the dependency counted in `calls`, and the retries `partner`'s budget holds.
fn sent_and_left(calls: &AtomicUsize, partner: &Retry) -> (usize, u64) {
    (calls.load(Ordering::SeqCst), partner.budget_available())
}

/// A call of `get()` through `client`, polled once: it waits.
fn waiting_call<S: Service<Request<String>>>(
    client: S,
) -> Pin<Box<tower::util::Oneshot<S, Request<String>>>> {
    let mut call = Box::pin(client.oneshot(get()));
    assert!(poll_once(call.as_mut()).is_pending());
    call
}

/// Drops `call`, then asserts that `partner`'s budget holds `available` at once, and that a
/// minute later the dependency has counted `attempts` in `calls`, no more.
async fn assert_dropped(
    call: impl Future,
    partner: &Retry,
    available: u64,
    calls: &AtomicUsize,
    attempts: usize,
) {
    drop(call);
    assert_eq!(partner.budget_available(), available);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(calls.load(Ordering::SeqCst), attempts);
}

/// Dropped during its first attempt: the deposit stays, nothing is withdrawn, nothing follows.
#[tokio::test(start_paused = true)]
async fn dropped_during_the_first_attempt() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let hangs = service_fn(move |_: Request<String>| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<Response<()>, BoxError>>()
    });
    let partner = one_per_call();
    let call = waiting_call(partner.layer().layer(hangs));
    assert_dropped(call, &partner, 1, &calls, 1).await;
}

/// Dropped during the backoff: the retry withdrawn for it is given back, and it is never sent.
#[tokio::test(start_paused = true)]
async fn dropped_during_the_backoff() {
    let (dependency, calls) = first_fails_then_hangs();
    let partner = one_per_call();
    let call = waiting_call(partner.layer().layer(dependency));
    assert_eq!(sent_and_left(&calls, &partner), (1, 0));
    assert_dropped(call, &partner, 1, &calls, 1).await;
}

/// Dropped during the retry: the retry was sent, so it stays withdrawn; no third attempt.
#[tokio::test(start_paused = true)]
async fn dropped_during_the_retry() {
    let (dependency, calls) = first_fails_then_hangs();
    let partner = one_per_call();
    let mut call = waiting_call(partner.layer().layer(dependency));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(poll_once(call.as_mut()).is_pending());
    assert_eq!(sent_and_left(&calls, &partner), (2, 0));
    drop(call);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(sent_and_left(&calls, &partner), (2, 0));
}

/// Dropped while the service below gets ready for the retry (a concurrency limit of one, held
/// by another call): the retry is given back, never sent.
#[tokio::test(start_paused = true)]
async fn dropped_while_the_service_gets_ready() {
    let (dependency, calls) = first_fails_then_hangs();
    let partner = one_per_call();
    let client = partner
        .layer()
        .layer(ConcurrencyLimitLayer::new(1).layer(dependency));
    let mut call = waiting_call(client.clone());
    // Another call takes the one place below and hangs there.
    let other = waiting_call(client);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(poll_once(call.as_mut()).is_pending());
    assert_eq!(sent_and_left(&calls, &partner), (2, 1));
    drop(call);
    assert_eq!(partner.budget_available(), 2);
    drop(other);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A retry that a full bulkhead below refuses before sending it reached nothing: its
/// withdrawal is given back, and the bulkhead's refusal (which names no time) ends the call.
#[tokio::test(start_paused = true)]
async fn a_retry_refused_below_before_it_was_sent_is_given_back() {
    let (dependency, calls) = first_fails_then_hangs();
    let bulkhead = tower_bulwark::bulkhead::Bulkhead::semaphore("partner", 1).build();
    let partner = one_per_call();
    let below = bulkhead.layer().layer(dependency);
    let call = waiting_call(partner.layer().layer(below.clone()));
    assert_eq!(partner.budget_available(), 0, "withdrawn for the retry");
    // Another call, straight to the bulkhead, takes its one place and hangs there.
    let _other = waiting_call(below);
    tokio::time::advance(Duration::from_secs(2)).await;
    let err = call.await.unwrap_err();
    assert!(err.is::<tower_bulwark::BulkheadFull>(), "{err}");
    assert_eq!(sent_and_left(&calls, &partner), (2, 1));
}

/// The counters: attempts by kind, and retries not made, by reason.
#[cfg(feature = "metrics")]
#[test]
fn attempts_and_retries_not_made_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        crate::common::paused_runtime().block_on(async {
            let partner = retry()
                .budget(0.0, 1, Duration::from_secs(1))
                .build()
                .unwrap();
            let (dependency, _) = scripted(vec![
                (503, vec![]),
                (503, vec![]),
                (429, vec![("retry-after", "60")]),
            ]);
            let client = partner.layer().layer(dependency);
            // The first call: its retry takes the budget's one, a second is refused.
            assert_eq!(client.clone().oneshot(get()).await.unwrap().status(), 503);
            // The second: asks for a minute, longer than `max_wait`.
            assert_eq!(client.oneshot(get()).await.unwrap().status(), 429);
        })
    });
    let mut seen: Vec<(String, u64)> = (snapshotter.snapshot().into_vec().into_iter())
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                return None;
            };
            let labels: Vec<_> = key.key().labels().map(|l| l.value().to_owned()).collect();
            Some((format!("{} {}", key.key().name(), labels.join(" ")), n))
        })
        .collect();
    seen.sort();
    let want = [
        ("bulwark_retry_attempts_total partner first", 2),
        ("bulwark_retry_attempts_total partner retry", 1),
        ("bulwark_retry_skipped_total partner budget", 1),
        ("bulwark_retry_skipped_total partner wait", 1),
    ];
    let want: Vec<_> = want.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
    assert_eq!(seen, want);
}

/// A retry not made is a `debug` event on `tower_bulwark::retry` naming the dependency and the
/// reason: the budget, or a wait longer than `max_wait` (with the wait asked).
#[test]
fn a_retry_not_made_is_a_debug_event_with_its_reason() {
    let text = crate::common::process::debug_events(|| {
        crate::common::paused_runtime().block_on(async {
            let partner = retry()
                .budget(0.0, 0, Duration::from_secs(1))
                .build()
                .unwrap();
            let (dependency, _) = scripted(vec![(503, vec![]), (429, vec![("retry-after", "60")])]);
            let client = partner.layer().layer(dependency);
            client.clone().oneshot(get()).await.unwrap();
            client.oneshot(get()).await.unwrap();
        });
    });
    let events = crate::common::process::lines_with(&text, "retry not made");
    assert_eq!(events.len(), 2, "{text}");
    for (event, reason) in events
        .iter()
        .zip(["reason=Budget", "reason=Wait asked=60s"])
    {
        assert!(event.contains("DEBUG tower_bulwark::retry"), "{event}");
        assert!(
            event.contains("dependency=\"partner\"") && event.contains(reason),
            "{event}"
        );
    }
}
