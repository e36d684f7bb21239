//! Attacks on `Pushback`'s calls in flight: every way a call can end releases it exactly once,
//! the hold is shared by every clone under a race, and absurd durations neither overflow nor
//! send. Time is tokio's paused timer; no test sleeps to pass.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tokio::sync::oneshot;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::outbound::{Pushback, PushedBack};
use tower_bulwark::{clock::ManualClock, BoxError};

use crate::common::response;

use super::hostile_support::*;

// ---------------------------------------------------------------------------------------------
// Calls in flight end every way.

/// Every way a call can end stops it counting in flight, exactly once: answered, failed,
/// panicked in `call`, panicked in its future, dropped while running, dropped while held. Then
/// an answer saying 2 left lets exactly 2 calls go.
#[tokio::test(start_paused = true)]
async fn every_ending_releases_a_call_in_flight_exactly_once() {
    let pushback = tokio_waiting_up_to(Duration::from_secs(5));
    let calls = Arc::new(AtomicUsize::new(0));
    #[derive(Clone, Copy, Debug)]
    enum How {
        Answer,
        Fail,
        PanicInCall,
        PanicInFuture,
        Hang,
    }
    let dependency = {
        let calls = calls.clone();
        service_fn(move |how: How| {
            calls.fetch_add(1, Ordering::SeqCst);
            if let How::PanicInCall = how {
                panic!("in call");
            }
            async move {
                match how {
                    How::Answer => Ok(response(200, &[])),
                    How::Fail => Err::<Response<()>, BoxError>("broken".into()),
                    How::PanicInFuture => panic!("in future"),
                    _ => std::future::pending().await,
                }
            }
        })
    };
    let client = pushback.layer().layer(dependency);
    client.clone().oneshot(How::Answer).await.unwrap();
    client.clone().oneshot(How::Fail).await.unwrap_err();
    let mut svc = client.clone();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(svc.call(How::PanicInCall));
    }));
    assert!(caught.is_err());
    let panicked = tokio::spawn(client.clone().oneshot(How::PanicInFuture)).await;
    assert!(panicked.unwrap_err().is_panic());
    let mut hanging = Box::pin(client.clone().oneshot(How::Hang));
    assert!(futures::poll!(&mut hanging).is_pending());
    drop(hanging);
    // A hold of 2 s, within max_wait: a call waits, and is dropped while it waits.
    pushback.observe(&response(429, &[("retry-after", "2")]));
    let mut held = Box::pin(client.clone().oneshot(How::Answer));
    assert!(futures::poll!(&mut held).is_pending());
    drop(held);
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    tokio::time::advance(Duration::from_secs(2)).await;

    pushback.observe(&response(200, &[("ratelimit", r#""p";r=2;t=60"#)]));
    let mut first = Box::pin(client.clone().oneshot(How::Hang));
    assert!(futures::poll!(&mut first).is_pending());
    let mut second = Box::pin(client.clone().oneshot(How::Hang));
    assert!(futures::poll!(&mut second).is_pending());
    let err = client.clone().oneshot(How::Answer).await.unwrap_err();
    assert!(err.is::<PushedBack>(), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 7);
}

/// Answers 200, except the call numbered 20, which gets a 429 with `Retry-After: 30`; counts the
/// calls that arrive once that answer is on its way.
fn racing_dependency(
    after_429: Arc<std::sync::atomic::AtomicBool>,
    early: Arc<AtomicUsize>,
) -> impl Service<usize, Response = Response<()>, Error = BoxError, Future: Send> + Clone {
    service_fn(move |n: usize| {
        if after_429.load(Ordering::SeqCst) {
            early.fetch_add(1, Ordering::SeqCst);
        }
        let flag = after_429.clone();
        async move {
            tokio::task::yield_now().await;
            if n == 20 {
                let answer = response(429, &[("retry-after", "30")]);
                // Set after the answer is built, before the layer reads it: calls that start
                // from here on may have started before the client could know.
                flag.store(true, Ordering::SeqCst);
                return Ok::<_, BoxError>(answer);
            }
            Ok(response(200, &[]))
        }
    })
}

/// The hold is shared by every clone: 64 tasks on 64 clones, two threads, a 429 arrives while
/// they run; after it, no task reaches the dependency until the hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_clone_calls_during_a_hold_under_a_race() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner").clock(clock.clone()).build();
    let after_429 = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let early = Arc::new(AtomicUsize::new(0));
    let dependency = racing_dependency(after_429.clone(), early.clone());
    let client = pushback.layer().layer(dependency);
    let tasks: Vec<_> = (0..64)
        .map(|n| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut refused = 0;
                for i in 0..20 {
                    match client.clone().oneshot(if i == 0 { n } else { 1000 }).await {
                        Ok(_) => {}
                        Err(err) => {
                            assert!(err.is::<PushedBack>());
                            refused += 1;
                        }
                    }
                    tokio::task::yield_now().await;
                }
                refused
            })
        })
        .collect();
    let mut refused = 0;
    for task in tasks {
        refused += task.await.unwrap();
    }
    assert!(refused > 0);
    // Calls that passed the check between the flag and the layer reading the answer may
    // reach it; they are at most the tasks racing (64), never the rest of their loops.
    assert!(
        early.load(Ordering::SeqCst) <= 64,
        "{}",
        early.load(Ordering::SeqCst)
    );
    assert_eq!(pushback.held_for(), Duration::from_secs(30));
    clock.advance(Duration::from_secs(30));
    assert_eq!(pushback.held_for(), Duration::ZERO);
}

/// `Duration::MAX` for `max_wait` and `max_hold`: a 40-digit Retry-After neither overflows nor
/// panics; a call is held (it would wait), not refused nor sent.
#[tokio::test(start_paused = true)]
async fn absurd_durations_neither_overflow_nor_send() {
    let pushback =
        on_tokio_clock_with(|builder| builder.max_wait(Duration::MAX).max_hold(Duration::MAX));
    let (client, calls) = scripted_client(&pushback);
    pushback.observe(&response(
        429,
        &[("retry-after", "9999999999999999999999999999999999999999")],
    ));
    assert!(pushback.held_for() > Duration::from_secs(100 * 365 * 24 * 3600));
    let (_tx, rx) = oneshot::channel();
    let mut call = Box::pin(client.clone().oneshot(rx));
    assert!(futures::poll!(&mut call).is_pending());
    tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
    assert!(futures::poll!(&mut call).is_pending());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
