//! Behaviour of the bulkhead through its public API, one property per test.
//!
//! Futures are polled by hand (`futures::poll!`) or time is paused, so every verdict comes from
//! state and counts, never from a sleep.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures::poll;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::{
    Bulkhead, BulkheadFull, CallFinished, CallOutcome, CallPermitted, CallRejected, Rejection,
};
use tower_bulwark::BoxError;

use super::order_support::{gated, Gated};

fn boxed_call<S>(svc: &mut S, id: u32) -> Pin<Box<S::Future>>
where
    S: Service<u32>,
{
    Box::pin(svc.call(id))
}

#[tokio::test]
async fn poll_ready_takes_no_permit() {
    let bulkhead = Bulkhead::semaphore("payment", 1).build();
    let inner = Gated::default();
    let mut a = bulkhead.layer().layer(inner.clone());
    let mut b = a.clone();
    let mut c = a.clone();
    // Three handles readied, none called: nothing is taken.
    for svc in [&mut a, &mut b, &mut c] {
        ServiceExt::<u32>::ready(svc).await.unwrap();
    }
    assert_eq!(inner.state.lock().unwrap().polled_ready, 3);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    assert_eq!(bulkhead.snapshot().total_permitted, 0);

    // The one permit is taken by the first call, not by the first `poll_ready`.
    let mut call = boxed_call(&mut c, 7);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 0);
    let err = b.call(8).await.unwrap_err();
    assert!(err.is::<BulkheadFull>());
    inner.finish(7);
    assert_eq!(call.as_mut().await.unwrap(), 7);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
}

#[tokio::test]
async fn clones_and_layers_share_one_limit() {
    let bulkhead = Bulkhead::semaphore("inventory", 2).build();
    let inner = Gated::default();
    let layer = bulkhead.layer();
    let layer_clone = layer.clone();
    let mut first = layer.layer(inner.clone());
    let mut second = layer_clone.layer(inner.clone());
    let mut third = first.clone();

    let one = boxed_call(&mut first, 1);
    let two = boxed_call(&mut second, 2);
    let err = third.call(3).await.unwrap_err();
    assert!(err.is::<BulkheadFull>());
    assert_eq!(
        err.downcast_ref::<BulkheadFull>().unwrap().bulkhead(),
        "inventory"
    );
    // The refused call never reached the inner service.
    assert_eq!(inner.started(), vec![1, 2]);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 0);
    assert_eq!(first.bulkhead().snapshot(), bulkhead.snapshot());

    drop(one);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    drop(two);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.available_concurrent_calls, 2);
    assert_eq!(snapshot.max_allowed_concurrent_calls, 2);
    assert_eq!(snapshot.total_permitted, 2);
    assert_eq!(snapshot.total_rejected, 1);
    assert_eq!(snapshot.total_finished, 2);
}

#[tokio::test]
async fn refusal_is_told_apart_from_the_inner_error() {
    let (bulkhead, inner, mut svc) = gated(Bulkhead::semaphore("payment", 1));

    let mut failing = boxed_call(&mut svc, 1);
    let refused = svc.call(2).await.unwrap_err();
    assert!(refused.is::<BulkheadFull>());
    assert!(!refused.is::<io::Error>());
    assert_eq!(refused.to_string(), "bulkhead `payment` is full");

    inner.fail(1);
    let failed = failing.as_mut().await.unwrap_err();
    assert!(!failed.is::<BulkheadFull>());
    assert_eq!(
        failed.downcast_ref::<io::Error>().unwrap().to_string(),
        "downstream broke"
    );
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_above_cuts_the_call_and_returns_the_permit() {
    let finished = Arc::new(Mutex::new(Vec::new()));
    let seen = finished.clone();
    let bulkhead = Bulkhead::semaphore("payment", 1)
        .on_call_finished(move |event: &CallFinished<'_>| {
            seen.lock().unwrap().push((event.outcome, event.duration));
        })
        .build();
    let inner = Gated::default();
    let mut svc = ServiceBuilder::new()
        .timeout(Duration::from_millis(250))
        .layer(bulkhead.layer())
        .service(inner.clone());

    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>());
    assert!(!err.is::<BulkheadFull>());
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    assert_eq!(
        *finished.lock().unwrap(),
        vec![(CallOutcome::Cancelled, Duration::from_millis(250))]
    );

    // A refusal passes through the timeout layer unchanged.
    let mut held = boxed_call(&mut svc, 2);
    assert!(poll!(held.as_mut()).is_pending());
    let refused = svc.ready().await.unwrap().call(3).await.unwrap_err();
    assert!(refused.is::<BulkheadFull>());
    inner.finish(2);
    assert_eq!(held.await.unwrap(), 2);
    assert_eq!(finished.lock().unwrap()[1].0, CallOutcome::Success);
}

/// A bulkhead of one permit named `name`, and the outcome of each call it ends, in order.
fn recording_outcomes(name: &str) -> (Bulkhead, Arc<Mutex<Vec<CallOutcome>>>) {
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let seen = outcomes.clone();
    let bulkhead = Bulkhead::semaphore(name, 1)
        .on_call_finished(move |event: &CallFinished<'_>| {
            seen.lock().unwrap().push(event.outcome);
        })
        .build();
    (bulkhead, outcomes)
}

#[tokio::test]
async fn a_panicking_call_returns_its_permit() {
    let (bulkhead, outcomes) = recording_outcomes("flaky");
    let svc = bulkhead
        .layer()
        .layer(tower::service_fn(|n: u32| async move {
            tokio::task::yield_now().await;
            if n == 0 {
                panic!("inner service panicked on purpose");
            }
            Ok::<_, io::Error>(n)
        }));
    let joined = tokio::spawn(svc.clone().oneshot(0)).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    assert_eq!(svc.oneshot(5).await.unwrap(), 5);
    assert_eq!(
        *outcomes.lock().unwrap(),
        vec![CallOutcome::Panicked, CallOutcome::Success]
    );
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.total_permitted, 2);
    assert_eq!(snapshot.total_finished, 2);
}

#[tokio::test(start_paused = true)]
async fn waiters_get_permits_in_arrival_order() {
    let (bulkhead, inner, mut svc) =
        gated(Bulkhead::semaphore("payment", 1).max_wait(Duration::from_secs(60)));

    let mut running = boxed_call(&mut svc, 0);
    let mut waiters: Vec<_> = (1..=5).map(|id| boxed_call(&mut svc, id)).collect();
    for waiter in &mut waiters {
        assert!(poll!(waiter.as_mut()).is_pending());
    }
    assert_eq!(bulkhead.snapshot().queue_depth, 5);
    // Waiting calls have not reached the inner service.
    assert_eq!(inner.started(), vec![0]);

    // Polling later waiters first does not let them jump the queue.
    for waiter in waiters.iter_mut().rev() {
        assert!(poll!(waiter.as_mut()).is_pending());
    }
    assert!(poll!(running.as_mut()).is_pending());
    inner.finish(0);
    assert_eq!(running.await.unwrap(), 0);
    for id in 1..=5u32 {
        let next = id as usize - 1;
        // Poll the calls still waiting, last first: only the oldest may start.
        for waiter in waiters[next..].iter_mut().rev() {
            assert!(poll!(waiter.as_mut()).is_pending());
        }
        assert_eq!(inner.started(), (0..=id).collect::<Vec<_>>());
        inner.finish(id);
        assert_eq!(waiters[next].as_mut().await.unwrap(), id);
    }
    assert_eq!(inner.started(), vec![0, 1, 2, 3, 4, 5]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.queue_depth, 0);
    assert_eq!(snapshot.available_concurrent_calls, 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_refused_when_max_wait_elapses() {
    let rejections = Arc::new(Mutex::new(Vec::new()));
    let seen = rejections.clone();
    let bulkhead = Bulkhead::semaphore("payment", 1)
        .max_wait(Duration::from_millis(100))
        .on_call_rejected(move |event: &CallRejected<'_>| {
            seen.lock().unwrap().push(event.reason);
        })
        .build();
    let inner = Gated::default();
    let mut svc = bulkhead.layer().layer(inner.clone());

    let running = boxed_call(&mut svc, 1);
    let started = tokio::time::Instant::now();
    let err = svc.call(2).await.unwrap_err();
    assert!(err.is::<BulkheadFull>());
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(*rejections.lock().unwrap(), vec![Rejection::WaitElapsed]);
    assert_eq!(inner.started(), vec![1]);
    assert_eq!(bulkhead.snapshot().queue_depth, 0);

    // A waiter whose permit comes within `max_wait` goes ahead.
    let mut waiting = boxed_call(&mut svc, 3);
    assert!(poll!(waiting.as_mut()).is_pending());
    tokio::time::advance(Duration::from_millis(60)).await;
    assert!(poll!(waiting.as_mut()).is_pending());
    drop(running);
    assert!(poll!(waiting.as_mut()).is_pending());
    assert_eq!(inner.started(), vec![1, 3]);
    inner.finish(3);
    assert_eq!(waiting.await.unwrap(), 3);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
}

#[tokio::test]
async fn without_max_wait_a_refusal_is_immediate() {
    let rejections = Arc::new(Mutex::new(Vec::new()));
    let seen = rejections.clone();
    let bulkhead = Bulkhead::semaphore("payment", 1)
        .on_call_rejected(move |event: &CallRejected<'_>| {
            seen.lock()
                .unwrap()
                .push((event.bulkhead.to_owned(), event.reason));
        })
        .build();
    let inner = Gated::default();
    let mut svc = bulkhead.layer().layer(inner.clone());
    let _running = boxed_call(&mut svc, 1);
    let mut refused = boxed_call(&mut svc, 2);
    // Settled on the first poll: no timer, no queue.
    match poll!(refused.as_mut()) {
        Poll::Ready(Err(err)) => assert!(err.is::<BulkheadFull>()),
        other => panic!(
            "expected an immediate refusal, got {:?}",
            other.map(|r| r.is_ok())
        ),
    }
    assert_eq!(
        *rejections.lock().unwrap(),
        vec![("payment".to_owned(), Rejection::NoCapacity)]
    );
    assert_eq!(bulkhead.snapshot().queue_depth, 0);
}

#[tokio::test]
async fn queue_starts_calls_in_order_and_refuses_beyond_capacity_at_once() {
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("reports", 2, 3));

    let mut running: Vec<_> = (1..=2).map(|id| boxed_call(&mut svc, id)).collect();
    let mut queued: Vec<_> = (3..=5).map(|id| boxed_call(&mut svc, id)).collect();
    for call in queued.iter_mut() {
        assert!(poll!(call.as_mut()).is_pending());
    }
    assert_eq!(bulkhead.snapshot().queue_depth, 3);

    // Both permits and the three places taken: the sixth call is refused on its first poll.
    let mut sixth = boxed_call(&mut svc, 6);
    match poll!(sixth.as_mut()) {
        Poll::Ready(Err(err)) => assert!(err.is::<BulkheadFull>()),
        _ => panic!("a call beyond the queue must be refused at once"),
    }
    assert_eq!(inner.started(), vec![1, 2]);

    // Ending the running calls starts the queued ones in arrival order.
    inner.finish(2);
    assert_eq!(running.pop().unwrap().await.unwrap(), 2);
    for call in queued.iter_mut().rev() {
        let _ = poll!(call.as_mut());
    }
    assert_eq!(inner.started(), vec![1, 2, 3]);
    inner.finish(1);
    assert_eq!(running.pop().unwrap().await.unwrap(), 1);
    for call in queued.iter_mut().rev() {
        let _ = poll!(call.as_mut());
    }
    assert_eq!(inner.started(), vec![1, 2, 3, 4]);
    assert_eq!(bulkhead.snapshot().queue_depth, 1);

    inner.finish(3);
    assert_eq!(queued[0].as_mut().await.unwrap(), 3);
    assert!(poll!(queued[2].as_mut()).is_pending());
    assert_eq!(inner.started(), vec![1, 2, 3, 4, 5]);
    inner.finish(4);
    inner.finish(5);
    assert_eq!(queued[1].as_mut().await.unwrap(), 4);
    assert_eq!(queued[2].as_mut().await.unwrap(), 5);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.available_concurrent_calls, 2);
    assert_eq!(snapshot.queue_depth, 0);
    assert_eq!(snapshot.total_permitted, 5);
    assert_eq!(snapshot.total_rejected, 1);
    assert_eq!(snapshot.total_finished, 5);
}

#[tokio::test]
async fn a_dropped_queued_call_leaves_the_queue() {
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("reports", 1, 2));

    let running = boxed_call(&mut svc, 1);
    let mut second = boxed_call(&mut svc, 2);
    let mut third = boxed_call(&mut svc, 3);
    assert!(poll!(second.as_mut()).is_pending());
    assert!(poll!(third.as_mut()).is_pending());
    assert_eq!(bulkhead.snapshot().queue_depth, 2);

    drop(second);
    assert_eq!(bulkhead.snapshot().queue_depth, 1);
    // Its place is free again.
    let mut fourth = boxed_call(&mut svc, 4);
    assert!(poll!(fourth.as_mut()).is_pending());
    assert_eq!(bulkhead.snapshot().queue_depth, 2);

    drop(running);
    assert!(poll!(third.as_mut()).is_pending());
    assert!(poll!(fourth.as_mut()).is_pending());
    // The dropped call never started; the next in line did.
    assert_eq!(inner.started(), vec![1, 3]);

    // A waiter granted a permit and dropped before it used it passes the permit on.
    inner.finish(3);
    assert_eq!(third.await.unwrap(), 3);
    drop(fourth);
    assert_eq!(inner.started(), vec![1, 3]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.available_concurrent_calls, 1);
    assert_eq!(snapshot.queue_depth, 0);
    assert_eq!(snapshot.total_permitted, 2);
}

#[tokio::test]
async fn shrinking_never_admits_beyond_the_new_limit() {
    let (bulkhead, inner, mut svc) = gated(Bulkhead::semaphore("payment", 4));
    let mut running: HashMap<u32, _> = (1..=4).map(|id| (id, boxed_call(&mut svc, id))).collect();

    bulkhead.set_max_concurrent_calls(2);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.max_allowed_concurrent_calls, 2);
    assert_eq!(snapshot.available_concurrent_calls, 0);

    // Four in flight, limit two: nothing is admitted until only one is left.
    for (next, (finished, expect_admitted)) in (100..).zip([(1, false), (2, false), (3, true)]) {
        drop(running.remove(&finished));
        let mut call = boxed_call(&mut svc, next);
        let admitted = poll!(call.as_mut()).is_pending();
        assert_eq!(admitted, expect_admitted, "after call {finished} ended");
        if admitted {
            running.insert(next, call);
        }
    }
    // Two in flight now (4 and 102): full at the new limit.
    assert!(svc.call(200).await.unwrap_err().is::<BulkheadFull>());
    assert_eq!(inner.started(), vec![1, 2, 3, 4, 102]);

    running.clear();
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.available_concurrent_calls, 2);
    assert_eq!(snapshot.max_allowed_concurrent_calls, 2);

    // Shrinking with permits free retires them at once.
    bulkhead.set_max_concurrent_calls(1);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    // Shrinking and growing back before anything returns cancels the debt.
    let held = boxed_call(&mut svc, 300);
    bulkhead.set_max_concurrent_calls(0);
    bulkhead.set_max_concurrent_calls(1);
    assert!(svc.call(301).await.unwrap_err().is::<BulkheadFull>());
    drop(held);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
}

#[tokio::test(start_paused = true)]
async fn growing_lets_waiters_in_at_once() {
    let (bulkhead, inner, mut svc) =
        gated(Bulkhead::semaphore("payment", 1).max_wait(Duration::from_secs(10)));
    let _running = boxed_call(&mut svc, 1);
    let mut waiting: Vec<_> = (2..=4).map(|id| boxed_call(&mut svc, id)).collect();
    for call in &mut waiting {
        assert!(poll!(call.as_mut()).is_pending());
    }
    bulkhead.set_max_concurrent_calls(3);
    for call in &mut waiting {
        let _ = poll!(call.as_mut());
    }
    // Two more permits: the first two waiters started, the third still waits.
    assert_eq!(inner.started(), vec![1, 2, 3]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.queue_depth, 1);
    assert_eq!(snapshot.available_concurrent_calls, 0);
    assert_eq!(snapshot.max_allowed_concurrent_calls, 3);
}

#[tokio::test]
async fn events_run_around_the_permit() {
    // A gauge raised on `permitted` and lowered on `finished` must never read above the limit.
    let gauge = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let waited = Arc::new(Mutex::new(Vec::new()));
    let (g1, p1, w1, g2) = (gauge.clone(), peak.clone(), waited.clone(), gauge.clone());
    let bulkhead = Bulkhead::semaphore("payment", 2)
        .on_call_permitted(move |event: &CallPermitted<'_>| {
            let now = g1.fetch_add(1, Ordering::SeqCst) + 1;
            p1.fetch_max(now, Ordering::SeqCst);
            w1.lock().unwrap().push(event.waited);
        })
        .on_call_finished(move |_: &CallFinished<'_>| {
            g2.fetch_sub(1, Ordering::SeqCst);
        })
        .build();
    let inner = Gated::default();
    let mut svc = bulkhead.layer().layer(inner.clone());
    let a = boxed_call(&mut svc, 1);
    let b = boxed_call(&mut svc, 2);
    assert_eq!(gauge.load(Ordering::SeqCst), 2);
    drop(a);
    assert_eq!(gauge.load(Ordering::SeqCst), 1);
    let c = boxed_call(&mut svc, 3);
    drop((b, c));
    assert_eq!(gauge.load(Ordering::SeqCst), 0);
    assert_eq!(peak.load(Ordering::SeqCst), 2);
    assert_eq!(*waited.lock().unwrap(), vec![Duration::ZERO; 3]);
}

#[tokio::test]
async fn hooks_of_one_kind_all_run_in_the_order_they_were_added() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let record = |tag: &'static str| {
        let log = log.clone();
        move || log.lock().unwrap().push(tag)
    };
    let (p1, p2, r1, r2, f1, f2) = (
        record("permitted 1"),
        record("permitted 2"),
        record("rejected 1"),
        record("rejected 2"),
        record("finished 1"),
        record("finished 2"),
    );
    let bulkhead = Bulkhead::semaphore("payment", 1)
        .on_call_permitted(move |_: &CallPermitted<'_>| p1())
        .on_call_rejected(move |_: &CallRejected<'_>| r1())
        .on_call_finished(move |_: &CallFinished<'_>| f1())
        .on_call_permitted(move |_: &CallPermitted<'_>| p2())
        .on_call_rejected(move |_: &CallRejected<'_>| r2())
        .on_call_finished(move |_: &CallFinished<'_>| f2())
        .build();
    let mut svc = bulkhead.layer().layer(Gated::default());
    let held = boxed_call(&mut svc, 1);
    let mut refused = boxed_call(&mut svc, 2);
    assert!(matches!(poll!(&mut refused), Poll::Ready(Err(_))));
    drop(held);
    assert_eq!(
        *log.lock().unwrap(),
        [
            "permitted 1",
            "permitted 2",
            "rejected 1",
            "rejected 2",
            "finished 1",
            "finished 2"
        ]
    );
}

mod body {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Channel, Full};

    type ChannelBody = Channel<Bytes, io::Error>;

    /// A body that panics when polled.
    struct PanickingBody;

    impl http_body::Body for PanickingBody {
        type Data = Bytes;
        type Error = io::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, io::Error>>> {
            panic!("behaviour: the inner body panics");
        }
    }

    /// The inner service's own panics are `Panicked`, wherever its code panics: in `call`, and
    /// in the body while it is read (the caller's own panics are `Cancelled`: see
    /// `tests/bulkhead/attack_permits.rs`). The permit comes back each time.
    #[tokio::test]
    async fn panics_of_the_inner_call_and_of_its_body_are_reported_panicked() {
        crate::common::process::quiet_panics_starting_with("behaviour: the inner");
        let (bulkhead, outcomes) = recording_outcomes("flaky");
        let mut panics_in_call = bulkhead.layer().layer(tower::service_fn(|_: ()| {
            panic!("behaviour: the inner call panics");
            #[allow(unreachable_code)]
            std::future::ready(Ok::<(), io::Error>(()))
        }));
        let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drop(panics_in_call.call(()));
        }));
        assert!(called.is_err());
        let svc = bulkhead
            .body_layer()
            .layer(tower::service_fn(|_: ()| async {
                Ok::<_, io::Error>(http::Response::new(PanickingBody))
            }));
        let mut body = svc.oneshot(()).await.unwrap().into_body();
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let _ = http_body::Body::poll_frame(Pin::new(&mut body), &mut cx);
        }));
        assert!(read.is_err());
        drop(body);
        assert_eq!(
            *outcomes.lock().unwrap(),
            vec![CallOutcome::Panicked, CallOutcome::Panicked]
        );
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    }

    #[tokio::test]
    async fn the_body_layer_holds_the_permit_until_the_body_ends() {
        let (bulkhead, outcomes) = recording_outcomes("download");
        let senders = Arc::new(Mutex::new(Vec::new()));
        let keep = senders.clone();
        let svc = bulkhead.body_layer().layer(tower::service_fn(move |_: ()| {
            let (tx, body) = ChannelBody::new(4);
            keep.lock().unwrap().push(tx);
            async move { Ok::<_, io::Error>(http::Response::new(body)) }
        }));

        // Headers arrived, body still streaming: the permit is held.
        let response = svc.clone().oneshot(()).await.unwrap();
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 0);
        assert!(crate::common::refusal(&svc, ()).await.is::<BulkheadFull>());

        let mut tx = senders.lock().unwrap().remove(0);
        tx.send_data(Bytes::from_static(b"chunk")).await.unwrap();
        drop(tx);
        let collected = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(collected, Bytes::from_static(b"chunk"));
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);

        // A body dropped before its end gives the permit back as cancelled.
        let response = svc.clone().oneshot(()).await.unwrap();
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 0);
        drop(response);
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);

        // A failing body gives it back as a failure.
        let response = svc.clone().oneshot(()).await.unwrap();
        senders
            .lock()
            .unwrap()
            .pop()
            .unwrap()
            .abort(io::Error::other("reset"));
        let mut body = response.into_body();
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);

        assert_eq!(
            *outcomes.lock().unwrap(),
            vec![
                CallOutcome::Success,
                CallOutcome::Cancelled,
                CallOutcome::Failure
            ]
        );
    }

    #[tokio::test]
    async fn a_body_that_is_already_complete_holds_nothing() {
        let bulkhead = Bulkhead::semaphore("small", 1).build();
        let svc = bulkhead
            .body_layer()
            .layer(tower::service_fn(|_: ()| async {
                Ok::<_, io::Error>(http::Response::new(Full::new(Bytes::new())))
            }));
        let response = svc.oneshot(()).await.unwrap();
        // The response is still alive, its permit already back.
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
        drop(response);
    }

    #[tokio::test]
    async fn an_error_before_the_headers_releases_at_once() {
        let bulkhead = Bulkhead::semaphore("small", 1).build();
        let svc = bulkhead
            .body_layer()
            .layer(tower::service_fn(|_: ()| async {
                Err::<http::Response<Full<Bytes>>, _>(io::Error::other("refused"))
            }));
        let err = svc.oneshot(()).await.unwrap_err();
        assert!(err.is::<io::Error>());
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    }
}

#[test]
fn debug_output_names_the_bulkhead() {
    let bulkhead = Bulkhead::queue("reports", 3, 5).build();
    let text = format!("{bulkhead:?}");
    assert!(text.contains("reports"), "{text}");
    assert!(format!("{:?}", bulkhead.layer()).contains("reports"));
    assert_eq!(bulkhead.name(), "reports");
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.max_allowed_concurrent_calls, 3);
    assert_eq!(snapshot.available_concurrent_calls, 3);
}

#[tokio::test]
async fn a_zero_limit_refuses_until_raised() {
    let bulkhead = Bulkhead::semaphore("closed", 0).build();
    let svc = bulkhead.layer().layer(tower::service_fn(
        |n: u32| async move { Ok::<_, BoxError>(n) },
    ));
    assert!(crate::common::refusal(&svc, 1).await.is::<BulkheadFull>());
    bulkhead.set_max_concurrent_calls(1);
    assert_eq!(svc.oneshot(2).await.unwrap(), 2);
}

mod with_retry {
    use super::*;
    use std::future::{ready, Ready};
    use tower::retry::Policy;

    /// Retries failures up to `attempts` times, never a refusal by the bulkhead.
    #[derive(Clone)]
    struct RetryFailures {
        attempts: usize,
    }

    impl<Res> Policy<u32, Res, BoxError> for RetryFailures {
        type Future = Ready<()>;

        fn retry(&mut self, _: &mut u32, result: &mut Result<Res, BoxError>) -> Option<Ready<()>> {
            match result {
                Err(err) if !err.is::<BulkheadFull>() && self.attempts > 0 => {
                    self.attempts -= 1;
                    Some(ready(()))
                }
                _ => None,
            }
        }

        fn clone_request(&mut self, request: &u32) -> Option<u32> {
            Some(*request)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_attempt_takes_its_own_permit_and_refusals_are_not_retried() {
        let bulkhead = Bulkhead::semaphore("flaky", 1).build();
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let inner = tower::service_fn(move |n: u32| {
            let attempt = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                if attempt < 2 {
                    Err::<u32, BoxError>(io::Error::other("try again").into())
                } else {
                    Ok(n)
                }
            }
        });
        let client = ServiceBuilder::new()
            .retry(RetryFailures { attempts: 3 })
            .timeout(Duration::from_secs(1))
            .layer(bulkhead.layer())
            .service(inner);

        // Two failures, then a success: three attempts, three permits, all given back.
        assert_eq!(client.clone().oneshot(9).await.unwrap(), 9);
        let snapshot = bulkhead.snapshot();
        assert_eq!(snapshot.total_permitted, 3);
        assert_eq!(snapshot.total_finished, 3);
        assert_eq!(snapshot.available_concurrent_calls, 1);

        // With the only permit held elsewhere, the refusal comes back once, not retried.
        let gated = Gated::default();
        let mut holder = bulkhead.layer().layer(gated.clone());
        let held = boxed_call(&mut holder, 1);
        let err = client.oneshot(10).await.unwrap_err();
        assert!(err.is::<BulkheadFull>());
        assert_eq!(bulkhead.snapshot().total_rejected, 1);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        drop(held);
    }
}

#[tokio::test(start_paused = true)]
async fn a_queue_with_max_wait_refuses_calls_that_waited_too_long() {
    let (bulkhead, inner, mut svc) =
        gated(Bulkhead::queue("reports", 1, 4).max_wait(Duration::from_secs(1)));
    let running = boxed_call(&mut svc, 1);
    let mut late = boxed_call(&mut svc, 2);
    assert!(poll!(late.as_mut()).is_pending());
    assert_eq!(bulkhead.snapshot().queue_depth, 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    match poll!(late.as_mut()) {
        Poll::Ready(Err(err)) => assert!(err.is::<BulkheadFull>()),
        _ => panic!("the wait should have run out"),
    }
    assert_eq!(bulkhead.snapshot().queue_depth, 0);
    drop(running);
    assert_eq!(inner.started(), vec![1]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.available_concurrent_calls, 1);
    assert_eq!(snapshot.total_rejected, 1);
    assert_eq!(snapshot.total_permitted, 1);

    // Zero turns the queue off: refused at once.
    let no_queue = Bulkhead::queue("reports", 1, 4)
        .max_wait(Duration::ZERO)
        .build();
    let mut svc = no_queue.layer().layer(inner.clone());
    let _held = boxed_call(&mut svc, 3);
    let mut refused = boxed_call(&mut svc, 4);
    assert!(matches!(poll!(refused.as_mut()), Poll::Ready(Err(_))));
    assert_eq!(no_queue.snapshot().queue_depth, 0);
}

/// What the module docs say of a lowered limit, for both kinds: 2 at once, calls 3, 4 and 5
/// waiting. Call 1 ends and its permit goes to 3, which has not run yet; then the limit drops
/// to 1. When 3 is polled it does not start (2 still runs): the lowered limit took its permit
/// back, and it waits again in its place, ahead of 4 and 5 (it waited behind them when the
/// bulkhead was tokio's semaphore). From then on one call runs at a time, in arrival order,
/// every waiter starts exactly once, and everything is given back.
#[tokio::test(start_paused = true)]
async fn a_waiter_whose_permit_pays_a_lowered_limit_waits_again_in_its_place_and_the_limit_holds() {
    for kind in ["queue", "semaphore"] {
        let bulkhead = match kind {
            "queue" => Bulkhead::queue("q", 2, 8).build(),
            _ => Bulkhead::semaphore("s", 2)
                .max_wait(Duration::from_secs(60))
                .build(),
        };
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, _> = (1..=5).map(|id| (id, boxed_call(&mut svc, id))).collect();
        for id in 1..=5 {
            let _ = poll!(calls.get_mut(&id).unwrap().as_mut());
        }
        inner.finish(1);
        assert_eq!(calls.remove(&1).unwrap().await.unwrap(), 1);
        bulkhead.set_max_concurrent_calls(1);
        for id in 3..=5 {
            assert!(poll!(calls.get_mut(&id).unwrap().as_mut()).is_pending());
        }
        assert_eq!(
            inner.started(),
            vec![1, 2],
            "{kind}: the limit is 1 and 2 runs"
        );
        // 3 is first in line still.
        for (ends, starts) in [(2, 3), (3, 4), (4, 5)] {
            inner.finish(ends);
            assert_eq!(calls.remove(&ends).unwrap().await.unwrap(), ends);
            for call in calls.values_mut() {
                let _ = poll!(call.as_mut());
            }
            assert_eq!(
                inner.started().last(),
                Some(&starts),
                "{kind}: after {ends} ended"
            );
            assert_eq!(bulkhead.snapshot().available_concurrent_calls, 0, "{kind}");
        }
        inner.finish(5);
        calls.remove(&5).unwrap().await.unwrap();
        let snapshot = bulkhead.snapshot();
        assert_eq!(snapshot.available_concurrent_calls, 1, "{kind}");
        assert_eq!(snapshot.queue_depth, 0, "{kind}");
        assert_eq!(snapshot.total_permitted, 5, "{kind}");
    }
}

/// The first waiter leaves (its caller gave up) while it holds a permit that the lowered limit
/// takes back: nothing leaks, the next waiter takes its place in line, and the limit holds.
#[tokio::test]
async fn a_waiter_that_leaves_the_front_of_the_line_passes_its_place_on() {
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("q", 2, 8));
    let mut calls: HashMap<u32, _> = (1..=5).map(|id| (id, boxed_call(&mut svc, id))).collect();
    for id in 1..=5 {
        let _ = poll!(calls.get_mut(&id).unwrap().as_mut());
    }
    inner.finish(1);
    calls.remove(&1).unwrap().await.unwrap();
    bulkhead.set_max_concurrent_calls(1);
    for id in 3..=5 {
        assert!(poll!(calls.get_mut(&id).unwrap().as_mut()).is_pending());
    }
    drop(calls.remove(&3));
    inner.finish(2);
    calls.remove(&2).unwrap().await.unwrap();
    for call in calls.values_mut() {
        let _ = poll!(call.as_mut());
    }
    assert_eq!(inner.started(), vec![1, 2, 4]);
    inner.finish(4);
    calls.remove(&4).unwrap().await.unwrap();
    let _ = poll!(calls.get_mut(&5).unwrap().as_mut());
    assert_eq!(inner.started(), vec![1, 2, 4, 5]);
    inner.finish(5);
    calls.remove(&5).unwrap().await.unwrap();
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.available_concurrent_calls, 1);
    assert_eq!(snapshot.queue_depth, 0);
    assert_eq!(snapshot.total_permitted, 4);
}

/// A queue bulkhead of one permit and a queue of one: call 1 runs, call 2 waits. Call 1 ends,
/// and its permit is handed to 2, whose task has not run yet; a call 3 made right then (a
/// task that ends a call and makes the next before it yields) finds the queue empty and
/// waits. With tokio's semaphore it was refused: 2 kept its place until its task took the
/// permit.
#[tokio::test(start_paused = true)]
async fn a_waiter_handed_the_permit_leaves_the_queue_at_once() {
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("q", 1, 1));
    let mut first = boxed_call(&mut svc, 1);
    assert!(poll!(first.as_mut()).is_pending());
    let mut second = boxed_call(&mut svc, 2);
    assert_eq!(bulkhead.snapshot().queue_depth, 1);
    inner.finish(1);
    assert_eq!(first.await.unwrap(), 1);
    assert_eq!(bulkhead.snapshot().queue_depth, 0, "2 holds the permit");

    let mut third = boxed_call(&mut svc, 3);
    assert!(poll!(third.as_mut()).is_pending(), "3 waits, not refused");
    assert_eq!(bulkhead.snapshot().queue_depth, 1);
    assert_eq!(bulkhead.snapshot().total_rejected, 0);
    assert!(poll!(second.as_mut()).is_pending());
    assert_eq!(inner.started(), vec![1, 2]);
    inner.finish(2);
    assert_eq!(second.await.unwrap(), 2);
    assert!(poll!(third.as_mut()).is_pending());
    assert_eq!(inner.started(), vec![1, 2, 3]);
    inner.finish(3);
    assert_eq!(third.await.unwrap(), 3);
    let snapshot = bulkhead.snapshot();
    assert_eq!(
        (snapshot.available_concurrent_calls, snapshot.queue_depth),
        (1, 0)
    );
}
