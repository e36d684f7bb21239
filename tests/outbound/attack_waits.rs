//! Attacks, by a helper that had not seen the code, on the breaker and the adaptive bulkhead
//! timing a call without its waits below (`src/waited.rs`): sub-calls sent at once below a
//! breaker, a hedge, a future shared by calls, calls polled together in one task, waits outside
//! any breaker, cancellation, stacked breakers, a retry between, a panic caught between two
//! breakers. The first version added up the lengths of the waits, so overlapping waits (a
//! fan-out) and a wait begun before the call (a shared future) hid a slow dependency; the union
//! of the waits from the call's start is taken out now. A hedge's wait while the primary is with
//! the dependency is still taken out (kept, ignored). Tokio's paused clock drives every layer
//! (`TokioClock`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use http::Response;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::clock::TokioClock;
use tower_bulwark::outbound::breaker::{BreakerState, Window};
use tower_bulwark::outbound::{ClientQuotaLayer, Pushback};
use tower_bulwark::{BoxError, Quota};

use super::attack_breaker_waits::{breaker, breaker_over, waiting_quota};

fn is_open(state: &BreakerState) -> bool {
    matches!(state, BreakerState::Open { .. })
}

/// A dependency whose first answer (at once) says its quota is spent for 3 s (then 100 per
/// 3 s); every later answer takes `answer_in`.
fn holding_dependency(
    answer_in: Duration,
) -> impl Service<(), Response = Response<()>, Error = BoxError, Future = impl Send> + Clone {
    holding_then(move |_| (200, answer_in))
}

/// The same, answer `n` (the first is 0) being `later(n)`: a status, and the time it takes. It
/// panics in `call` when `later` does.
fn holding_then(
    later: impl Fn(usize) -> (u16, Duration) + Clone + Send + 'static,
) -> impl Service<(), Response = Response<()>, Error = BoxError, Future = impl Send> + Clone {
    let calls = Arc::new(AtomicUsize::new(0));
    service_fn(move |_: ()| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let (status, answer_in) = if n == 0 {
            (200, Duration::ZERO)
        } else {
            later(n)
        };
        async move {
            let mut response = Response::builder().status(status);
            if n == 0 {
                response = response
                    .header("ratelimit", r#""d";r=0;t=3"#)
                    .header("ratelimit-policy", r#""d";q=100;w=3"#);
            }
            tokio::time::sleep(answer_in).await;
            Ok::<_, BoxError>(response.body(())?)
        }
    })
}

/// A `waiting_pushback` over a `holding_dependency` answering in `answer_in`, its hold primed
/// (the first answer said the quota is spent for 3 s).
async fn primed(
    answer_in: Duration,
) -> impl Service<(), Response = Response<()>, Error = BoxError, Future = impl Send> + Clone {
    let below = ServiceBuilder::new()
        .layer(waiting_pushback("partner").layer())
        .service(holding_dependency(answer_in));
    below.clone().oneshot(()).await.unwrap();
    below
}

/// A service that sends each call as `fan` sub-calls at once, through a pushback, to a
/// `holding_dependency` answering in 2.5 s, and answers when all of them have; its hold is
/// primed (the first answer said the quota is spent for 3 s).
async fn fanned_out_after_a_hold(
    fan: usize,
) -> impl Service<(), Response = Response<()>, Error = BoxError, Future = impl Send> + Clone {
    let below = primed(Duration::from_millis(2_500)).await;
    service_fn(move |_: ()| {
        let subs: Vec<_> = (0..fan).map(|_| below.clone().oneshot(())).collect();
        async move {
            for result in futures::future::join_all(subs).await {
                result?;
            }
            Ok::<_, BoxError>(Response::new(()))
        }
    })
}

/// A single flight over `below`: a call made while another is in flight shares its answer
/// (the first call of the flight polls it for all).
fn single_flight<S>(
    below: S,
) -> impl Service<(), Response = Response<()>, Error = BoxError, Future = impl Send> + Clone
where
    S: Service<(), Response = Response<()>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    use futures::future::{BoxFuture, Shared};
    use std::sync::Mutex;
    type Flight = Shared<BoxFuture<'static, Result<u16, String>>>;
    let flight: Arc<Mutex<Option<Flight>>> = Arc::new(Mutex::new(None));
    service_fn(move |_: ()| {
        let shared = flight
            .lock()
            .unwrap()
            .get_or_insert_with(|| {
                below
                    .clone()
                    .oneshot(())
                    .map(|r| r.map(|r| r.status().as_u16()).map_err(|e| e.to_string()))
                    .boxed()
                    .shared()
            })
            .clone();
        async move {
            let status = shared.await.map_err(BoxError::from)?;
            Ok::<_, BoxError>(Response::builder().status(status).body(())?)
        }
    })
}

/// A pushback named `name` on tokio's clock that holds a call up to 5 s.
fn waiting_pushback(name: &str) -> Pushback<TokioClock> {
    Pushback::builder(name)
        .clock(TokioClock::new())
        .max_wait(Duration::from_secs(5))
        .build()
}

/// Breaker (slow past 2 s, opens when all 4 of 4 are slow) → a fan-out service that sends each
/// call as `fan` sub-calls at once and answers when all have answered → pushback (max_wait 5 s)
/// → a dependency that holds for 3 s, then answers each call in 2.5 s.
async fn fan_out_after_hold(fan: usize) -> (BreakerState, Duration) {
    let breaker = breaker(4, 1.0, Duration::from_secs(2));
    let client = ServiceBuilder::new()
        .layer(breaker.layer())
        .service(fanned_out_after_a_hold(fan).await);
    let start = tokio::time::Instant::now();
    let calls = (0..4).map(|_| client.clone().oneshot(()));
    for result in futures::future::join_all(calls).await {
        assert_eq!(result.unwrap().status(), 200);
    }
    (breaker.state(), start.elapsed())
}

/// Control: one sub-call each. Each call waits 3 s, then the dependency takes 2.5 s (> 2 s):
/// all 4 slow, the breaker opens.
#[tokio::test(start_paused = true)]
async fn control_one_sub_call_after_a_hold_is_slow() {
    let (state, took) = fan_out_after_hold(1).await;
    assert_eq!(took, Duration::from_millis(5_500));
    assert!(is_open(&state), "{state:?}");
}

/// The same calls, each sent as two sub-calls at once below the breaker: each call still took
/// 5.5 s, 3 s of it waiting, and was answered 2.5 s after its wait (slow). The two concurrent
/// 3 s waits count once (they were summed to 6 s and taken out of 5.5 s: no call counted slow).
#[tokio::test(start_paused = true)]
async fn concurrent_waits_below_the_breaker_are_not_summed() {
    let (state, took) = fan_out_after_hold(2).await;
    assert_eq!(took, Duration::from_millis(5_500));
    assert!(is_open(&state), "{state:?}");
}

/// A hedging service below the breaker: sends the call, and if no answer came in 1 s, sends it
/// again; the first answer wins. Client quota of 1 call per 2 s (max_wait 5 s) below it, and a
/// dependency that answers every call in 4 s. The primary is sent at once and answered at 4 s;
/// the hedge waited 1 s for its quota permit (1 s to 2 s) while the primary was with the
/// dependency. The call's answer took the dependency 4 s (> 3.5 s: slow), and no wait of the
/// winning sub-call happened.
#[tokio::test(start_paused = true)]
#[ignore = "a known limit, documented in outbound::breaker: a wait of one branch while another is with the dependency (a hedge) is taken out"]
async fn a_hedges_wait_is_not_taken_out_of_the_primarys_time() {
    let state = hedged(Duration::from_secs(2)).await;
    assert!(is_open(&state), "{state:?}");
}

/// Control: the same with a quota of 1 call per 1 s: the hedge waits nothing, both calls are
/// slow (4 s) and the breaker opens.
#[tokio::test(start_paused = true)]
async fn control_a_hedge_that_does_not_wait() {
    let state = hedged(Duration::from_secs(1)).await;
    assert!(is_open(&state), "{state:?}");
}

async fn hedged(period: Duration) -> BreakerState {
    let breaker = breaker(2, 1.0, Duration::from_millis(3_500));
    let quota = waiting_quota(Quota::with_period(1, period).unwrap());
    let below = ServiceBuilder::new()
        .layer(ClientQuotaLayer::new("partner", quota))
        .service(service_fn(|_: ()| async {
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok::<_, BoxError>(Response::new(()))
        }));
    let hedge = service_fn(move |_: ()| {
        let below = below.clone();
        async move {
            let primary = below.clone().oneshot(()).fuse();
            let hedged = async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                below.clone().oneshot(()).await
            }
            .fuse();
            futures::pin_mut!(primary, hedged);
            futures::select! {
                answer = primary => answer,
                answer = hedged => answer,
            }
        }
    });
    let client = ServiceBuilder::new().layer(breaker.layer()).service(hedge);
    for _ in 0..2 {
        // Lets the quota refill so the primary goes at once.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let start = tokio::time::Instant::now();
        client.clone().oneshot(()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(4));
    }
    breaker.state()
}

/// A single-flight (request-coalescing) layer below the breaker: calls made while one is in
/// flight share its answer. Call A is made at 0 s and waits out a 3 s hold in the pushback;
/// call B joins at 2.9 s. The dependency answers 2.5 s after the hold (slow, > 2 s). B is
/// polled first when the hold ends, and A's 3 s wait (begun before B was made) counts for B
/// from B's start only (all of it was taken out of B's 2.6 s, and B was not slow). Asserts B,
/// like A, counts slow (window of 2, rate 1.0 → open).
#[tokio::test(start_paused = true)]
async fn another_calls_wait_is_not_taken_out_of_a_coalesced_call() {
    let state = coalesced(true).await;
    assert!(is_open(&state), "{state:?}");
}

/// Control: the same with A polled first when the hold ends: A's wait is taken out of A's
/// time, both are slow (2.5 s, 2.6 s), the breaker opens.
#[tokio::test(start_paused = true)]
async fn control_coalesced_with_the_waiting_call_polled_first() {
    let state = coalesced(false).await;
    assert!(is_open(&state), "{state:?}");
}

async fn coalesced(b_first: bool) -> BreakerState {
    let breaker = breaker(2, 1.0, Duration::from_secs(2));
    let below = primed(Duration::from_millis(2_500)).await;
    let client = ServiceBuilder::new()
        .layer(breaker.layer())
        .service(single_flight(below));
    // Call A starts the flight.
    let mut a = Box::pin(client.clone().oneshot(()));
    assert!(futures::poll!(a.as_mut()).is_pending());
    tokio::time::sleep(Duration::from_millis(2_900)).await;
    let b = client.clone().oneshot(());
    let start = tokio::time::Instant::now();
    let (ra, rb) = if b_first {
        let (rb, ra) = futures::join!(b, a);
        (ra, rb)
    } else {
        futures::join!(a, b)
    };
    assert_eq!(start.elapsed(), Duration::from_millis(2_600));
    assert_eq!(
        (ra.unwrap().status().as_u16(), rb.unwrap().status().as_u16()),
        (200, 200)
    );
    breaker.state()
}

// ---- adaptive bulkhead: the same fan-out ----

#[derive(Clone, Default)]
struct Recorder(Arc<std::sync::Mutex<Vec<Duration>>>);

impl tower_bulwark::bulkhead::adaptive::LimitAlgorithm for Recorder {
    fn update(
        &mut self,
        sample: &tower_bulwark::bulkhead::adaptive::Sample,
        _: &tower_bulwark::bulkhead::adaptive::Limits,
    ) -> usize {
        self.0.lock().unwrap().push(sample.rtt);
        sample.limit
    }
}

/// Adaptive bulkhead → fan-out of 2 sub-calls → pushback (hold 3 s) → dependency answering in
/// 2.5 s. The dependency's latency is 2.5 s; the sample should say so.
#[tokio::test(start_paused = true)]
async fn adaptive_sample_of_a_fanned_out_call_after_a_hold_is_the_dependencys_latency() {
    let recorder = Recorder::default();
    let adaptive = tower_bulwark::bulkhead::adaptive::AdaptiveBulkhead::builder("partner")
        .algorithm(recorder.clone())
        .clock(TokioClock::new())
        .build();
    let client = ServiceBuilder::new()
        .layer(adaptive.layer())
        .service(fanned_out_after_a_hold(2).await);
    let start = tokio::time::Instant::now();
    client.oneshot(()).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(5_500));
    assert_eq!(
        *recorder.0.lock().unwrap(),
        vec![Duration::from_millis(2_500)]
    );
}

// ---- attacks expected to hold ----

/// One breaker, two kinds of calls polled together in one task: "held" ones wait out a 3 s
/// hold and are answered at once; "slow" ones go straight to a dependency answering in 2.5 s.
/// 2 of 4 slow at rate 0.5 opens; the held calls' waits must not hide the slow ones.
#[tokio::test(start_paused = true)]
async fn waits_of_some_calls_do_not_leak_into_others_polled_in_the_same_task() {
    let breaker = breaker(4, 0.5, Duration::from_secs(2));
    let pushback = waiting_pushback("partner");
    let held = ServiceBuilder::new()
        .layer(pushback.layer())
        .service(holding_dependency(Duration::ZERO));
    held.clone().oneshot(()).await.unwrap();
    let route = service_fn(move |slow: bool| {
        let held = held.clone();
        async move {
            if slow {
                tokio::time::sleep(Duration::from_millis(2_500)).await;
                Ok::<_, BoxError>(Response::new(()))
            } else {
                held.oneshot(()).await
            }
        }
    });
    let client = ServiceBuilder::new().layer(breaker.layer()).service(route);
    let calls = [false, true, false, true].map(|slow| client.clone().oneshot(slow));
    let mut unordered: futures::stream::FuturesUnordered<_> = calls.into_iter().collect();
    use futures::StreamExt;
    while let Some(result) = unordered.next().await {
        result.unwrap();
    }
    let state = breaker.state();
    assert!(is_open(&state), "{state:?}");
}

/// A pushback used alone (no breaker above) waits 3 s on this thread; then breaker calls the
/// dependency answers in 2.5 s without waiting are still slow.
#[tokio::test(start_paused = true)]
async fn a_wait_recorded_outside_any_breaker_does_not_reach_a_later_breaker_call() {
    let pushback = waiting_pushback("alone");
    let alone = ServiceBuilder::new()
        .layer(pushback.layer())
        .service(holding_dependency(Duration::ZERO));
    alone.clone().oneshot(()).await.unwrap();
    let breaker = breaker(2, 1.0, Duration::from_secs(2));
    let client = ServiceBuilder::new()
        .layer(breaker.layer())
        .service(service_fn(|_: ()| async {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            Ok::<_, BoxError>(Response::new(()))
        }));
    // Interleaved in one task: the lone pushback's wait ends while breaker calls are pending.
    let (a, b, c) = futures::join!(
        alone.clone().oneshot(()),
        client.clone().oneshot(()),
        client.clone().oneshot(())
    );
    a.unwrap();
    b.unwrap();
    c.unwrap();
    let state = breaker.state();
    assert!(is_open(&state), "{state:?}");
}

/// A call cut while it waits (timeout above the breaker) records nothing; the next calls, slow
/// at the dependency, are slow.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_mid_wait_leaves_nothing_for_the_next() {
    let breaker = breaker(2, 1.0, Duration::from_secs(2));
    let below = primed(Duration::from_millis(2_500)).await;
    let client = ServiceBuilder::new().layer(breaker.layer()).service(below);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), client.clone().oneshot(()))
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    client.clone().oneshot(()).await.unwrap();
    client.clone().oneshot(()).await.unwrap();
    let state = breaker.state();
    assert!(is_open(&state), "{state:?}");
}

/// Two breakers with a pushback between them and a queue below both: the outer takes out the
/// hold and the queue, the inner only the queue. Calls answered at once after 3 s held and
/// queued up to 3 × 600 ms: neither opens (slow past 1 s, rate 0.5).
#[tokio::test(start_paused = true)]
async fn stacked_breakers_with_a_wait_between_them() {
    let outer = breaker(4, 0.5, Duration::from_secs(1));
    let inner = breaker(4, 0.5, Duration::from_secs(1));
    let pushback = waiting_pushback("partner");
    let dep = holding_dependency(Duration::from_millis(600));
    let bottom = ServiceBuilder::new()
        .layer(Bulkhead::queue("partner", 1, 8).build().layer())
        .service(dep);
    let client = ServiceBuilder::new()
        .layer(outer.layer())
        .layer(pushback.layer())
        .layer(inner.layer())
        .service(bottom.clone());
    // Primes the hold through the pushback, not counted by the inner breaker (answered at once).
    client.clone().oneshot(()).await.unwrap();
    let start = tokio::time::Instant::now();
    let all = (0..4).map(|_| client.clone().oneshot(()));
    for r in futures::future::join_all(all).await {
        r.unwrap();
    }
    assert_eq!(start.elapsed(), Duration::from_millis(3_000 + 4 * 600));
    assert_eq!(
        (outer.state(), inner.state()),
        (BreakerState::Closed, BreakerState::Closed)
    );
}

/// `Window::Seconds` with waits: 4 calls held 3 s then answered at once are not slow; 4 calls
/// held then answered in 2.5 s are.
#[tokio::test(start_paused = true)]
async fn window_of_seconds_with_waits() {
    for (answer_in, open) in [
        (Duration::ZERO, false),
        (Duration::from_millis(2_500), true),
    ] {
        let breaker = breaker_over(Window::Seconds(60), 4, 1.0, Duration::from_secs(2));
        let below = primed(answer_in).await;
        let client = ServiceBuilder::new().layer(breaker.layer()).service(below);
        let all = (0..4).map(|_| client.clone().oneshot(()));
        for r in futures::future::join_all(all).await {
            r.unwrap();
        }
        let state = breaker.state();
        assert_eq!(is_open(&state), open, "{answer_in:?}: {state:?}");
    }
}

/// Adaptive bulkhead above a queue bulkhead of 2 permits under a load of 6 calls at once, the
/// dependency answering in 300 ms: every sample is 300 ms.
#[tokio::test(start_paused = true)]
async fn adaptive_above_a_queue_under_load() {
    let recorder = Recorder::default();
    let adaptive = tower_bulwark::bulkhead::adaptive::AdaptiveBulkhead::builder("partner")
        .algorithm(recorder.clone())
        .limits(tower_bulwark::bulkhead::adaptive::Limits::new(1, 10, 100).unwrap())
        .clock(TokioClock::new())
        .build();
    let client = ServiceBuilder::new()
        .layer(adaptive.layer())
        .layer(Bulkhead::queue("below", 2, 16).build().layer())
        .service(service_fn(|_: ()| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, BoxError>(Response::new(()))
        }));
    let all = (0..6).map(|_| client.clone().oneshot(()));
    for r in futures::future::join_all(all).await {
        r.unwrap();
    }
    assert_eq!(
        *recorder.0.lock().unwrap(),
        vec![Duration::from_millis(300); 6]
    );
}

/// Retries once on a `503`.
#[derive(Clone)]
struct OnceOn503(bool);

impl tower::retry::Policy<(), Response<()>, BoxError> for OnceOn503 {
    type Future = std::future::Ready<()>;
    fn retry(
        &mut self,
        _: &mut (),
        result: &mut Result<Response<()>, BoxError>,
    ) -> Option<Self::Future> {
        let again = !self.0 && matches!(result, Ok(r) if r.status() == 503);
        self.0 = true;
        again.then(|| std::future::ready(()))
    }
    fn clone_request(&mut self, _: &()) -> Option<()> {
        Some(())
    }
}

/// A retry layer between the breaker and the pushback: attempt 1 waits out a 3 s hold and is
/// answered `503` at once, attempt 2 is answered after `answer_in`. Slow past 2 s, one call
/// opens at rate 1.0: with 2.5 s the call is slow, with 0 s it is not.
#[tokio::test(start_paused = true)]
async fn a_retry_between_the_breaker_and_the_pushback() {
    for (answer_in, open) in [
        (Duration::ZERO, false),
        (Duration::from_millis(2_500), true),
    ] {
        let breaker = breaker(1, 1.0, Duration::from_secs(2));
        let pushback = waiting_pushback("partner");
        let dep = holding_then(move |n| match n {
            1 => (503, Duration::ZERO),
            _ => (200, answer_in),
        });
        let below = ServiceBuilder::new().layer(pushback.layer()).service(dep);
        below.clone().oneshot(()).await.unwrap();
        let client = ServiceBuilder::new()
            .layer(breaker.layer())
            .layer(tower::retry::RetryLayer::new(OnceOn503(false)))
            .service(below);
        let start = tokio::time::Instant::now();
        assert_eq!(client.oneshot(()).await.unwrap().status(), 200);
        assert_eq!(start.elapsed(), Duration::from_secs(3) + answer_in);
        let state = breaker.state();
        assert_eq!(is_open(&state), open, "{answer_in:?}: {state:?}");
    }
}

/// outer breaker → a layer that turns a panic into an error → inner breaker → pushback →
/// dependency whose `call` panics for the first call after the 3 s hold (in the poll in which
/// the wait ended). The two calls after it, answered in 2.5 s without waiting, are slow for
/// both breakers (2 of 2 at rate 1.0: both open).
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_poll_that_ended_a_wait_leaks_nothing() {
    let outer = breaker(2, 1.0, Duration::from_secs(2));
    let inner = breaker(2, 1.0, Duration::from_secs(2));
    let pushback = waiting_pushback("partner");
    let dep = holding_then(|n| {
        assert_ne!(n, 1, "panics in call");
        (200, Duration::from_millis(2_500))
    });
    let below = ServiceBuilder::new()
        .layer(inner.layer())
        .layer(pushback.layer())
        .service(dep);
    let catching = service_fn(move |_: ()| {
        let call = below.clone().oneshot(());
        async move {
            match std::panic::AssertUnwindSafe(call).catch_unwind().await {
                Ok(result) => result,
                Err(_) => Err::<Response<()>, BoxError>("caught a panic".into()),
            }
        }
    });
    let client = ServiceBuilder::new().layer(outer.layer()).service(catching);
    // The hold is primed through both breakers (answered at once: not slow, counted).
    client.clone().oneshot(()).await.unwrap();
    assert!(client.clone().oneshot(()).await.is_err());
    let (a, b) = futures::join!(client.clone().oneshot(()), client.clone().oneshot(()));
    a.unwrap();
    b.unwrap();
    let (o, i) = (outer.state(), inner.state());
    assert!(is_open(&o) && is_open(&i), "{o:?} {i:?}");
}

/// A single flight below the breaker: call B joins call A's flight 0.5 s into A's 3 s hold, and
/// the dependency answers at once when the hold ends. Neither call's answer was slow, yet the
/// wait is taken out only of the call whose poll ended it; the other counts 2.5 s or 3 s as the
/// dependency's (found by a second attack; documented in `outbound::breaker`).
#[tokio::test(start_paused = true)]
#[ignore = "a known limit, documented in outbound::breaker: a wait of a future that calls share is taken out of one of them only"]
async fn a_coalesced_call_answered_at_once_after_the_shared_wait_is_not_slow() {
    let breaker = breaker(2, 0.5, Duration::from_secs(2));
    let below = primed(Duration::ZERO).await;
    let client = ServiceBuilder::new()
        .layer(breaker.layer())
        .service(single_flight(below));
    let mut a = Box::pin(client.clone().oneshot(()));
    assert!(
        futures::poll!(a.as_mut()).is_pending(),
        "A starts the flight"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ra, rb) = futures::join!(a, client.clone().oneshot(()));
    ra.unwrap();
    rb.unwrap();
    assert_eq!(breaker.state(), BreakerState::Closed);
}
