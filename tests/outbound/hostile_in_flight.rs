//! Attacks on `Pushback`'s calls in flight: every way a call can end releases it exactly once,
//! the hold is shared by every clone under a race, and absurd durations neither overflow nor
//! send. Time is tokio's paused timer; no test sleeps to pass.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
/// calls that arrive once the layer has read that answer (`read` is set by the task that made
/// the call, when its answer has come back through the layer).
fn racing_dependency(
    read: Arc<AtomicBool>,
    late: Arc<AtomicUsize>,
) -> impl Service<usize, Response = Response<()>, Error = BoxError, Future: Send> + Clone {
    service_fn(move |n: usize| {
        if read.load(Ordering::SeqCst) {
            late.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            tokio::task::yield_now().await;
            if n == 20 {
                return Ok::<_, BoxError>(response(429, &[("retry-after", "30")]));
            }
            Ok(response(200, &[]))
        }
    })
}

/// The hold is shared by every clone: 64 tasks on 64 clones, two threads, a 429 arrives while
/// they run; once the layer has read it, no task reaches the dependency until the hold ends,
/// but for one call that the other thread may have let go just before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_clone_calls_during_a_hold_under_a_race() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner").clock(clock.clone()).build();
    let read = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicUsize::new(0));
    let dependency = racing_dependency(read.clone(), late.clone());
    let client = pushback.layer().layer(dependency);
    let tasks: Vec<_> = (0..64)
        .map(|n| {
            let client = client.clone();
            let read = read.clone();
            tokio::spawn(async move {
                let mut refused = 0;
                for i in 0..20 {
                    let number = if i == 0 { n } else { 1000 };
                    match client.clone().oneshot(number).await {
                        Ok(answer) => {
                            if answer.status() == 429 {
                                read.store(true, Ordering::SeqCst);
                            }
                        }
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
    // A call the other thread had let go before the answer was read may still reach the
    // dependency after; no more (before the answer was read, a preempted thread can let any
    // number through, which says nothing of the hold).
    let late = late.load(Ordering::SeqCst);
    assert!(
        late <= 1,
        "{late} calls reached the dependency after the 429 was read"
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
