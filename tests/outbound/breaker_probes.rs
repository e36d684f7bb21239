//! A half-open breaker's probes: exactly `half_open_calls` of many racing tasks get through; a
//! probe dropped at any point frees its place exactly once; a probe that never answers is cut
//! by the timeout below the breaker and counts as a failure.

use std::convert::identity;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http::Response;
use tokio::sync::{mpsc, oneshot};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_bulwark::clock::{ManualClock, TokioClock};
use tower_bulwark::outbound::breaker::{Breaker, BreakerOpen, BreakerState};
use tower_bulwark::BoxError;

use crate::breaker::{answering, partner_breaker, through};
use crate::common::poll_once;

/// A client whose every call is answered when the test sends its status on the call's channel
/// (a dropped sender: the dependency's own error, which is no verdict); the counter counts the
/// calls that reached the dependency.
pub(crate) type Held = BoxCloneService<oneshot::Receiver<u16>, Response<()>, BoxError>;

pub(crate) fn held(breaker: &Breaker) -> (Held, Arc<AtomicUsize>) {
    let reached = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&reached);
    let dependency = service_fn(move |answer: oneshot::Receiver<u16>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let status = answer.await?;
            Ok::<_, BoxError>(Response::builder().status(status).body(())?)
        }
    });
    (
        BoxCloneService::new(breaker.layer().layer(dependency)),
        reached,
    )
}

/// Opens `breaker` with two failures through `client`, then lets its open time pass.
pub(crate) async fn open_then_half_open(breaker: &Breaker, clock: &ManualClock) {
    let (client, _) = answering(breaker);
    through(&client, 503).await;
    through(&client, 503).await;
    assert!(matches!(breaker.state(), BreakerState::Open { .. }));
    clock.advance(Duration::from_secs(1));
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
}

/// A breaker of two calls, half-open (two probes), and a [`held`] client through it.
async fn half_open_and_held() -> (Breaker, Held, Arc<AtomicUsize>) {
    let (clock, breaker) = partner_breaker(2, identity);
    open_then_half_open(&breaker, &clock).await;
    let (client, reached) = held(&breaker);
    (breaker, client, reached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_get_exactly_the_half_open_calls() {
    const TASKS: usize = 64;
    const PROBES: u32 = 5;
    let (clock, breaker) = partner_breaker(2, |b| b.half_open_calls(PROBES));
    for round in 0..20 {
        open_then_half_open(&breaker, &clock).await;
        let (client, reached) = held(&breaker);
        // Each task says whether it was refused at once; a probe keeps its answer's sender.
        let (told, mut outcomes) = mpsc::unbounded_channel();
        let (keep, mut senders) = mpsc::unbounded_channel();
        let start = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (client, told, keep, start) =
                    (client.clone(), told.clone(), keep.clone(), start.clone());
                tokio::spawn(async move {
                    let (answer, question) = oneshot::channel();
                    start.wait().await;
                    let mut call = std::pin::pin!(client.oneshot(question));
                    match poll_once(call.as_mut()) {
                        Poll::Ready(Err(err)) => told.send(err.is::<BreakerOpen>()).unwrap(),
                        Poll::Pending => {
                            keep.send(answer).unwrap();
                            told.send(false).unwrap();
                            call.await.unwrap();
                        }
                        Poll::Ready(other) => panic!("{other:?}"),
                    }
                })
            })
            .collect();
        let mut refusals = 0;
        for _ in 0..TASKS {
            refusals += usize::from(outcomes.recv().await.unwrap());
        }
        assert_eq!(refusals, TASKS - PROBES as usize, "round {round}");
        assert_eq!(
            reached.load(Ordering::SeqCst),
            PROBES as usize,
            "round {round}"
        );
        // Every probe succeeds: closed, and the next call goes through.
        for _ in 0..PROBES {
            senders.recv().await.unwrap().send(200).unwrap();
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(breaker.state(), BreakerState::Closed, "round {round}");
    }
}

/// The future of one call through `client`, admitted or refused in `call`, not polled yet.
async fn call(
    client: &Held,
    question: oneshot::Receiver<u16>,
) -> <Held as tower::Service<oneshot::Receiver<u16>>>::Future {
    use tower::Service;
    client.clone().ready_oneshot().await.unwrap().call(question)
}

/// Whether a call through `client` now is refused at once.
async fn refused(client: &Held) -> bool {
    let (_, question) = oneshot::channel();
    let mut call = call(client, question).await;
    match poll_once(call.as_mut()) {
        Poll::Ready(Err(err)) => err.is::<BreakerOpen>(),
        _ => false,
    }
}

#[tokio::test]
async fn a_probe_dropped_at_any_point_frees_its_place_exactly_once() {
    let (breaker, client, reached) = half_open_and_held().await;

    // Two probes in flight, inside the dependency; a third call is refused.
    let (first_answer, question) = oneshot::channel();
    let mut first = call(&client, question).await;
    assert!(poll_once(first.as_mut()).is_pending());
    let (second_answer, question) = oneshot::channel();
    let mut second = call(&client, question).await;
    assert!(poll_once(second.as_mut()).is_pending());
    assert!(refused(&client).await);

    // The first dropped mid-call: one place, taken by the next call, and no more.
    drop(first);
    drop(first_answer);
    let (third_answer, question) = oneshot::channel();
    let third = call(&client, question).await;
    assert!(refused(&client).await, "the place was freed once");
    // The third dropped before its first poll: its place is free again, once.
    drop(third);
    drop(third_answer);
    let (fourth_answer, question) = oneshot::channel();
    let mut fourth = call(&client, question).await;
    assert!(poll_once(fourth.as_mut()).is_pending());
    assert!(refused(&client).await);
    assert_eq!(
        reached.load(Ordering::SeqCst),
        4,
        "the refused calls reached nothing"
    );

    // Both answer; the decision waited for two counted probes, the dropped ones not counted.
    second_answer.send(200).unwrap();
    fourth_answer.send(200).unwrap();
    assert_eq!(second.await.unwrap().status(), 200);
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    assert_eq!(fourth.await.unwrap().status(), 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test]
async fn a_probe_whose_dependency_fails_without_a_verdict_frees_its_place() {
    let (breaker, client, reached) = half_open_and_held().await;
    for _ in 0..5 {
        // The sender dropped: the dependency fails with an error that says nothing of its load.
        let (_, question) = oneshot::channel();
        client.clone().oneshot(question).await.unwrap_err();
    }
    assert_eq!(reached.load(Ordering::SeqCst), 5);
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_never_answers_is_cut_by_the_timeout_below_and_reopens_it() {
    let breaker = Breaker::builder("partner")
        .window(tower_bulwark::outbound::breaker::Window::Calls(2))
        .minimum_calls(2)
        .half_open_calls(1)
        .clock(TokioClock::new())
        .build()
        .unwrap();
    // breaker → timeout → a dependency that accepts each call and never answers.
    let client = ServiceBuilder::new()
        .layer(breaker.layer())
        .timeout(Duration::from_secs(5))
        .service(service_fn(|()| {
            std::future::pending::<Result<Response<()>, BoxError>>()
        }));
    let start = tokio::time::Instant::now();
    for _ in 0..2 {
        let cut = client.clone().oneshot(()).await.unwrap_err();
        assert!(cut.is::<tower::timeout::error::Elapsed>(), "{cut}");
    }
    assert_eq!(
        breaker.state(),
        BreakerState::Open {
            until: Duration::from_secs(11)
        }
    );
    tokio::time::sleep_until(start + Duration::from_secs(11)).await;
    let (probe, refused) = tokio::join!(client.clone().oneshot(()), async {
        tokio::task::yield_now().await;
        client.clone().oneshot(()).await
    });
    assert!(refused.unwrap_err().is::<BreakerOpen>());
    assert!(probe.unwrap_err().is::<tower::timeout::error::Elapsed>());
    assert_eq!(
        breaker.state(),
        BreakerState::Open {
            until: Duration::from_secs(17)
        }
    );
}

#[tokio::test]
async fn a_probe_that_panics_in_call_or_in_its_future_frees_its_place() {
    use futures::FutureExt;
    use std::panic::AssertUnwindSafe;
    use tower::Service;

    crate::common::process::quiet_panics_starting_with("breaker test: planned panic");
    let (clock, breaker) = partner_breaker(2, |b| b.half_open_calls(1));
    open_then_half_open(&breaker, &clock).await;
    // 1: panics in `call`; 2: panics when its future is polled; 3: answers 200.
    let dependency = service_fn(|how: u8| {
        assert!(how != 1, "breaker test: planned panic in call");
        async move {
            assert!(how != 2, "breaker test: planned panic in the future");
            Ok::<_, BoxError>(Response::new(()))
        }
    });
    let mut client = breaker.layer().layer(dependency);
    let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| client.call(1)));
    assert!(panicked.is_err());
    let panicked = AssertUnwindSafe(client.call(2)).catch_unwind().await;
    assert!(panicked.is_err());
    assert_eq!(
        breaker.state(),
        BreakerState::HalfOpen,
        "neither was counted"
    );
    client.call(3).await.unwrap();
    assert_eq!(
        breaker.state(),
        BreakerState::Closed,
        "the place was free for the third"
    );
}
