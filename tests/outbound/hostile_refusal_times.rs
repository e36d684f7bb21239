//! The times that the outbound layers' refusals carry, to the nanosecond: a `PushedBack`'s from a
//! `Retry-After`, a spent window, a policy that grants nothing and a spread slot, the longest of
//! several holds, through a retry policy, and a `QuotaExhausted`'s for a costly call. Time is a
//! `ManualClock` or tokio's paused timer; no test sleeps to pass.

use crate::common::direct_on;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Response, StatusCode};
use tokio::sync::oneshot;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_bulwark::outbound::pushback::Pacing;
use tower_bulwark::outbound::{self, ClientQuotaLayer, Pushback};
use tower_bulwark::{clock::ManualClock, BoxError, Quota};

use crate::common::response;

use super::hostile_support::*;

// ---------------------------------------------------------------------------------------------
// The times that refusals carry.

/// "How long from the refusal until a call may be sent": a nanosecond before it the call is
/// still refused, at it the call goes. For a `Retry-After`, an exhausted window, a window whose
/// policy refills, and a spread slot.
#[tokio::test]
async fn a_pushed_back_retry_after_is_exact() {
    // Each setup, its answer, and how many refusals in a row it makes (once a hold without a
    // policy has passed, calls go freely).
    type Setup<'a> = (Pacing, &'a [(&'a str, &'a str)], u16, usize);
    let setups: [Setup; 4] = [
        (Pacing::UntilSpent, &[("retry-after", "7")], 429, 1),
        (
            Pacing::UntilSpent,
            &[("ratelimit", r#""p";r=0;t=9"#)],
            200,
            1,
        ),
        (
            Pacing::UntilSpent,
            &[
                ("ratelimit", r#""p";r=1;t=3"#),
                ("ratelimit-policy", r#""p";q=1;w=5"#),
            ],
            200,
            3,
        ),
        (Pacing::Spread, &[("ratelimit", r#""p";r=4;t=10"#)], 200, 3),
    ];
    for (pacing, headers, status, rounds) in setups {
        let clock = ManualClock::new();
        let pushback = Pushback::builder("partner")
            .clock(clock.clone())
            .pacing(pacing)
            .build();
        let (client, _) = scripted_client(&pushback);
        pushback.observe(&response(status, headers));
        // Spend what may go at once.
        let mut answered = Vec::new();
        while pushback.held_for().is_zero() {
            answered.push(answer_call(start(&client).await, response(200, &[])).await);
        }
        for _ in 0..rounds {
            let wait = refused(&client);
            assert_eq!(wait, pushback.held_for(), "{headers:?}");
            clock.advance(wait - Duration::from_nanos(1));
            assert_eq!(refused(&client), Duration::from_nanos(1), "{headers:?}");
            clock.advance(Duration::from_nanos(1));
            answer_call(start(&client).await, response(200, &[])).await;
        }
    }
}

/// A policy that grants nothing (`q = 0`) gives nothing in any window: a refused call is told
/// `max_hold` from the answer, when one call goes to learn anew (the probe); while it is in
/// flight, the next call is told `max_hold` from it; its answer tells anew. To the nanosecond,
/// with a `max_hold` of 30 s.
#[tokio::test]
async fn a_policy_that_grants_nothing_holds_calls_until_a_probe_after_max_hold() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner")
        .clock(clock.clone())
        .max_hold(Duration::from_secs(30))
        .build();
    let (client, calls) = scripted_client(&pushback);
    pushback.observe(&spent_for_a_second_under(r#""p";q=0;w=10"#));
    assert_eq!(refused(&client), Duration::from_secs(30));
    clock.advance(Duration::from_secs(30) - Duration::from_nanos(1));
    assert_eq!(refused(&client), Duration::from_nanos(1));
    assert_eq!(pushback.held_for(), Duration::from_nanos(1));
    clock.advance(Duration::from_nanos(1));
    let (tx, probe) = start(&client).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(refused(&client), Duration::from_secs(30));
    clock.advance(Duration::from_secs(1));
    tx.send(response(200, &[("ratelimit", r#""p";r=2;t=10"#)]))
        .unwrap();
    probe.await.unwrap();
    for _ in 0..2 {
        answer_call(start(&client).await, response(200, &[])).await;
    }
    assert_eq!(refused(&client), Duration::from_secs(10));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// A refusal carries the time the next call can actually go, whichever of the holds ends last:
/// after a 429 with `Retry-After: 60` and `X-RateLimit-Remaining: 0` until 300 s from now, a
/// call is told 300 s, not 60 s; and the other way round.
#[tokio::test]
async fn a_refusal_carries_the_longest_of_the_holds() {
    let (pushback, clock) = manual();
    let (client, calls) = scripted_client(&pushback);
    pushback.observe(&response(
        429,
        &[
            ("retry-after", "60"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "300"),
        ],
    ));
    assert_eq!(pushback.held_for(), Duration::from_secs(300));
    assert_eq!(refused(&client), Duration::from_secs(300));
    clock.advance(Duration::from_secs(60));
    assert_eq!(refused(&client), Duration::from_secs(240));
    clock.advance(Duration::from_secs(240) - Duration::from_nanos(1));
    assert_eq!(refused(&client), Duration::from_nanos(1));
    clock.advance(Duration::from_nanos(1));
    let (tx, call) = start(&client).await;
    tx.send(response(
        429,
        &[("retry-after", "300"), ("ratelimit", r#""p";r=0;t=60"#)],
    ))
    .unwrap();
    call.await.unwrap();
    assert_eq!(refused(&client), Duration::from_secs(300));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The same through a retry policy that waits what `outbound::retry_after` says: it comes back
/// once, when the call can go, and is not refused again. A waiter whose `max_wait` covers the
/// `Retry-After` but not the spent window is refused at once with the whole time.
#[tokio::test(start_paused = true)]
async fn a_retry_policy_comes_back_once_when_the_call_can_go() {
    #[derive(Clone)]
    struct HonourRetryAfter {
        retries: Arc<AtomicUsize>,
    }

    impl<Req: Clone> tower::retry::Policy<Req, Response<()>, BoxError> for HonourRetryAfter {
        type Future = tokio::time::Sleep;

        fn retry(
            &mut self,
            _: &mut Req,
            result: &mut Result<Response<()>, BoxError>,
        ) -> Option<Self::Future> {
            let wait = match result {
                Ok(response) if response.status() == StatusCode::TOO_MANY_REQUESTS => {
                    Duration::ZERO
                }
                Ok(_) => return None,
                Err(err) => outbound::retry_after(&**err)?,
            };
            (self.retries.fetch_add(1, Ordering::SeqCst) < 5).then(|| tokio::time::sleep(wait))
        }

        fn clone_request(&mut self, request: &Req) -> Option<Req> {
            Some(request.clone())
        }
    }

    let the_429 = || {
        response(
            429,
            &[
                ("retry-after", "60"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "300"),
            ],
        )
    };
    let pushback = crate::hostile_support::on_tokio_clock();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let dependency = service_fn(move |()| {
        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
        async move { Ok::<_, BoxError>(if first { the_429() } else { response(200, &[]) }) }
    });
    let retries = Arc::new(AtomicUsize::new(0));
    let client = ServiceBuilder::new()
        .retry(HonourRetryAfter {
            retries: retries.clone(),
        })
        .layer(pushback.layer())
        .service(dependency);
    let start = tokio::time::Instant::now();
    let answer = client.oneshot(()).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(300));
    // The 429 retried at once, refused with 300 s by the pushback, then sent.
    assert_eq!(retries.load(Ordering::SeqCst), 2);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let waiting = tokio_waiting_up_to(Duration::from_secs(120));
    waiting.observe(&the_429());
    let client = waiting.layer().layer(service_fn(|()| async {
        Ok::<_, BoxError>(response(200, &[]))
    }));
    let start = tokio::time::Instant::now();
    let err = client.oneshot(()).await.unwrap_err();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "waited for a hold it could not see out"
    );
    assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(300)));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `QuotaExhausted::retry_after`: "how long from the refusal until the same call would be
/// admitted": a nanosecond before it, the same call is refused; at it, admitted. With a cost of
/// three out of a burst of five.
#[tokio::test]
async fn a_quota_exhausted_retry_after_is_exact_for_a_costly_call() {
    let clock = ManualClock::new();
    let limiter = direct_on(Quota::per_second(2).unwrap().with_burst(5).unwrap(), &clock);
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter)
        .cost(3)
        .layer(echo(calls.clone()));
    client.clone().oneshot(1).await.unwrap();
    for _ in 0..3 {
        let err = client.clone().oneshot(2).await.unwrap_err();
        let wait = outbound::retry_after(&*err).unwrap();
        assert!(wait > Duration::ZERO);
        clock.advance(wait - Duration::from_nanos(1));
        let err = client.clone().oneshot(2).await.unwrap_err();
        assert_eq!(outbound::retry_after(&*err), Some(Duration::from_nanos(1)));
        clock.advance(Duration::from_nanos(1));
        client.clone().oneshot(3).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

/// A waiter "is sent when the hold ends": when a newer answer ends it early (the dependency's
/// window reset sooner than the one the client counted), the waiter goes then, not at the time
/// the older answer gave, and calls made after it do not overtake it.
#[tokio::test(start_paused = true)]
async fn a_waiter_goes_when_a_newer_answer_ends_its_hold() {
    let pushback = tokio_waiting_up_to(Duration::from_secs(60));
    let (client, calls) = scripted_client(&pushback);
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=1;t=30"#)]));
    let (first_tx, first) = start(&client).await;
    // The quota is spent: the next call waits for the window, 30 s away.
    let (waiter_tx, waiter_rx) = oneshot::channel();
    let waiter = tokio::spawn(client.clone().oneshot(waiter_rx));
    tokio::task::yield_now().await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    // The first call's answer: the window has reset, 10 calls left.
    first_tx
        .send(response(200, &[("ratelimit", r#""p";r=10;t=30"#)]))
        .unwrap();
    first.await.unwrap();
    assert_eq!(pushback.held_for(), Duration::ZERO);
    let began = tokio::time::Instant::now();
    waiter_tx.send(response(200, &[])).unwrap();
    waiter.await.unwrap().unwrap();
    assert_eq!(began.elapsed(), Duration::ZERO, "the waiter slept on");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `Pacing::Spread`: "the calls left are spread evenly over the window: one every t / r", in
/// the windows a policy grants after the advertised one as well as in that one.
#[tokio::test]
async fn spread_paces_the_windows_a_policy_grants_too() {
    let (pushback, clock) = manual_with(Pacing::Spread);
    let (client, calls) = scripted_client(&pushback);
    pushback.observe(&spent_for_a_second_under(r#""p";q=4;w=8"#));
    assert_eq!(refused(&client), Duration::from_secs(1));
    clock.advance(Duration::from_secs(1));
    for _ in 0..4 {
        answer_call(start(&client).await, response(200, &[])).await;
        assert_eq!(refused(&client), Duration::from_secs(2));
        clock.advance(Duration::from_secs(2));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}
