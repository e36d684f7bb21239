//! Attacks on the documented outbound stack (retry → breaker → pushback → client quota →
//! bulkhead → timeout → client), by a helper that had not seen the code: the breaker above the
//! layers that wait timed a call with its wait, so calls that waited and were answered at once
//! opened it as slow. A call is timed from the end of its waits below now (`outbound::breaker`,
//! "How it decides"). Tokio's paused clock drives every layer (`TokioClock`); nothing sleeps to
//! pass.

use std::time::Duration;

use http::Response;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_bulwark::algorithm::Gcra;
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::clock::TokioClock;
use tower_bulwark::outbound::breaker::{Breaker, BreakerState, Window};
use tower_bulwark::outbound::{ClientQuotaLayer, Pushback};
use tower_bulwark::{BoxError, DirectRateLimiter, Quota};

/// A limiter of `quota` on tokio's clock, whose calls wait up to 5 s for their permits.
pub(crate) fn waiting_quota(quota: Quota) -> DirectRateLimiter<Gcra, TokioClock> {
    let quota = quota.with_max_wait(Duration::from_secs(5)).unwrap();
    DirectRateLimiter::builder(quota)
        .clock(TokioClock::new())
        .build()
}

/// A breaker on tokio's clock over the last `n` calls (all `n` counted), for which a call is
/// slow past `slow_after`, opening when `slow_rate` of them are slow.
pub(crate) fn breaker(n: u32, slow_rate: f64, slow_after: Duration) -> Breaker {
    breaker_over(Window::Calls(n), n, slow_rate, slow_after)
}

/// The same over `window`, counting once `minimum` calls are in it.
pub(crate) fn breaker_over(
    window: Window,
    minimum: u32,
    slow_rate: f64,
    slow_after: Duration,
) -> Breaker {
    Breaker::builder("partner")
        .window(window)
        .minimum_calls(minimum)
        .slow_call_duration(slow_after)
        .slow_call_rate(slow_rate)
        .clock(TokioClock::new())
        .build()
        .unwrap()
}

/// Breaker docs (`outbound::breaker`, "Where it goes"): "Above the pushback, a call the
/// dependency asked to hold is refused there and never counted", and the module's first line:
/// it "counts what each call's answer says of the dependency". With the pushback's `max_wait`,
/// a held call waits in the pushback instead, and the breaker counts that wait as the
/// dependency's slowness: a dependency that answers every call at once, and only advertised a
/// spent quota for 3 s, opens the breaker.
#[tokio::test(start_paused = true)]
async fn calls_waiting_out_a_pushback_hold_are_not_slow_calls_of_the_dependency() {
    assert_eq!(
        waiting_out_a_hold(Duration::from_secs(1)).await,
        BreakerState::Closed
    );
}

/// The way round it the breaker's docs name: a `slow_call_duration` above the longest wait
/// below (here 5 s, the pushback's `max_wait`) counts none of those calls slow.
#[tokio::test(start_paused = true)]
async fn a_slow_call_duration_above_the_waits_below_counts_none_of_them_slow() {
    assert_eq!(
        waiting_out_a_hold(Duration::from_secs(5)).await,
        BreakerState::Closed
    );
}

/// Where a breaker for which a call is slow past `slow_after` stands once four calls waited
/// 3 s in the pushback for a quota the dependency said was spent, each answered at once.
async fn waiting_out_a_hold(slow_after: Duration) -> BreakerState {
    let breaker = breaker(4, 1.0, slow_after);
    let pushback = Pushback::builder("partner")
        .clock(TokioClock::new())
        .max_wait(Duration::from_secs(5))
        .build();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    // Answers at once; its first answer says the quota is spent for 3 s, then 100 per 3 s.
    let dependency = service_fn(move |_: ()| {
        let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            let mut response = Response::builder();
            if n == 0 {
                response = response
                    .header("ratelimit", r#""d";r=0;t=3"#)
                    .header("ratelimit-policy", r#""d";q=100;w=3"#);
            }
            Ok::<_, BoxError>(response.body(())?)
        }
    });
    let client = ServiceBuilder::new()
        .layer(breaker.layer())
        .layer(pushback.layer())
        .layer(Bulkhead::semaphore("partner", 16).build().layer())
        .timeout(Duration::from_secs(10))
        .service(dependency);

    client.clone().oneshot(()).await.unwrap();
    // Four calls wait out the 3 s the dependency asked for, then each is answered at once.
    let start = tokio::time::Instant::now();
    let waiting = (0..4).map(|_| client.clone().oneshot(()));
    for result in futures::future::join_all(waiting).await {
        assert_eq!(result.unwrap().status(), 200);
    }
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 5);
    // Every answer came at once, none failed: nothing says the dependency is slow.
    breaker.state()
}

/// The same for the client quota's `max_wait` (outbound module docs: "client quota before the
/// bulkhead: a call waiting for its permits holds no bulkhead permit, so the bulkhead counts
/// only calls that are really on their way"; the breaker "counts what each call's answer says
/// of the dependency"): four calls queued for a quota of one a second wait 0, 1, 2 and 3 s for
/// their own permits, are answered at once, and half of them open the breaker as slow.
#[tokio::test(start_paused = true)]
async fn calls_waiting_for_their_own_quota_are_not_slow_calls_of_the_dependency() {
    let breaker = breaker(4, 0.5, Duration::from_secs(1));
    let quota = waiting_quota(Quota::per_second(1).unwrap());
    let client = ServiceBuilder::new()
        .layer(breaker.layer())
        .layer(
            Pushback::builder("partner")
                .clock(TokioClock::new())
                .build()
                .layer(),
        )
        .layer(ClientQuotaLayer::new("partner", quota))
        .layer(Bulkhead::semaphore("partner", 16).build().layer())
        .timeout(Duration::from_secs(10))
        .service(service_fn(|_: ()| async {
            Ok::<_, BoxError>(Response::new(()))
        }));

    let start = tokio::time::Instant::now();
    let calls = (0..4).map(|_| client.clone().oneshot(()));
    for result in futures::future::join_all(calls).await {
        assert_eq!(result.unwrap().status(), 200);
    }
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    // The dependency answered each call the instant it reached it.
    assert_eq!(breaker.state(), BreakerState::Closed);
}

/// Four calls at once through a breaker (slow past 1 s, opening at half of 4 slow) over a
/// queue bulkhead of one permit, to a dependency that answers each in `answer_in`: they wait
/// 0, 1, 2 and 3 times `answer_in` in the queue.
async fn through_a_queue(
    answer_in: Duration,
    nested: bool,
) -> (BreakerState, Option<BreakerState>) {
    let outer = breaker(4, 0.5, Duration::from_secs(1));
    let inner = nested.then(|| breaker(4, 0.5, Duration::from_secs(1)));
    let client = ServiceBuilder::new()
        .layer(outer.layer())
        .option_layer(inner.as_ref().map(Breaker::layer))
        .layer(Bulkhead::queue("partner", 1, 8).build().layer())
        .service(service_fn(move |_: ()| async move {
            tokio::time::sleep(answer_in).await;
            Ok::<_, BoxError>(Response::new(()))
        }));
    let start = tokio::time::Instant::now();
    let calls = (0..4).map(|_| client.clone().oneshot(()));
    for result in futures::future::join_all(calls).await {
        assert_eq!(result.unwrap().status(), 200);
    }
    assert_eq!(start.elapsed(), answer_in * 4);
    (outer.state(), inner.map(|inner| inner.state()))
}

/// A bulkhead's queue, the third wait the breaker's docs name: calls answered in 600 ms each,
/// the last two after 1.2 s and 1.8 s in the queue, are not slow (on the old code, 2 of 4 were,
/// and the breaker opened).
#[tokio::test(start_paused = true)]
async fn calls_waiting_in_a_bulkheads_queue_are_not_slow_calls_of_the_dependency() {
    let (state, _) = through_a_queue(Duration::from_millis(600), false).await;
    assert_eq!(state, BreakerState::Closed);
}

/// The waits are taken out, not the dependency's time: calls answered in 1.5 s each are slow
/// whatever they waited first, and open the breaker.
#[tokio::test(start_paused = true)]
async fn a_call_the_dependency_is_slow_to_answer_after_a_wait_is_still_slow() {
    let (state, _) = through_a_queue(Duration::from_millis(1_500), false).await;
    assert!(matches!(state, BreakerState::Open { .. }), "{state:?}");
}

/// Two breakers, one above the other: each takes out the waits below both.
#[tokio::test(start_paused = true)]
async fn a_breaker_above_another_takes_out_the_waits_below_both() {
    let (outer, inner) = through_a_queue(Duration::from_millis(600), true).await;
    assert_eq!(
        (outer, inner),
        (BreakerState::Closed, Some(BreakerState::Closed))
    );
}
