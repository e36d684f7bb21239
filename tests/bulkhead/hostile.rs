//! Adversarial tests of the bulkhead: resize under load, absurd waits, panicking hooks.

use crate::common::poll_once;
use crate::order_support::assert_idle;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull, CallFinished, CallOutcome, CallPermitted};
use tower_bulwark::BoxError;

/// Promise (README, "Bulkhead"): "`set_max_concurrent_calls` changes the limit while calls are in
/// flight, never blocking and never letting a new call exceed the new limit"; a refused call is
/// one that found the bulkhead full ("A refused call fails at once with `BulkheadFull`").
///
/// Here the limit only moves between 64 and 65 while at most two calls are ever in flight, so
/// no call may be refused. A semaphore bulkhead without `max_wait` (the default) does refuse:
/// `admit` sees the `SLOW` flag that `resize` raises under its lock (free count drained to zero)
/// and, since it "may not wait", rejects without looking at the real count.
#[test]
fn a_resize_never_refuses_a_call_while_permits_are_free() {
    let bulkhead = Bulkhead::semaphore("resize", 64).build();
    let stop = Arc::new(AtomicBool::new(false));
    let resizer = {
        let bulkhead = bulkhead.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                bulkhead.set_max_concurrent_calls(64 + n % 2);
                n += 1;
            }
        })
    };
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let svc = bulkhead.layer().layer(tower::service_fn(|n: u32| {
                std::future::ready(Ok::<_, io::Error>(n))
            }));
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut refused = 0u32;
                for i in 0..300_000u32 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let mut svc = svc.clone();
                    let mut call = std::pin::pin!(svc.call(i));
                    match poll_once(call.as_mut()) {
                        Poll::Ready(Ok(n)) => assert_eq!(n, i),
                        Poll::Ready(Err(e)) => {
                            assert!(e.is::<BulkheadFull>(), "{e}");
                            refused += 1;
                            if refused >= 3 {
                                break;
                            }
                        }
                        Poll::Pending => panic!("the inner service answers at once"),
                    }
                }
                refused
            })
        })
        .collect();
    let refused: u32 = callers.into_iter().map(|c| c.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    resizer.join().unwrap();
    let snapshot = bulkhead.snapshot();
    assert_eq!(
        snapshot.available_concurrent_calls,
        snapshot.max_allowed_concurrent_calls
    );
    assert_eq!(
        refused, 0,
        "calls refused with BulkheadFull while at most 2 of 64 permits were in use ({snapshot:?})"
    );
}

/// An inner service whose calls end when the test says so.
#[derive(Clone, Default)]
struct Gated {
    gates: Arc<Mutex<Vec<oneshot::Sender<()>>>>,
}

impl Gated {
    fn open_all(&self) {
        for gate in self.gates.lock().unwrap().drain(..) {
            let _ = gate.send(());
        }
    }
}

impl Service<u32> for Gated {
    type Response = u32;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<u32, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, n: u32) -> Self::Future {
        let (tx, rx) = oneshot::channel();
        self.gates.lock().unwrap().push(tx);
        Box::pin(async move {
            let _ = rx.await;
            Ok(n)
        })
    }
}

/// Readies `svc`, calls it with `n` and polls the call once: it must still be pending.
async fn pending_call<S>(svc: &mut S, n: u32) -> Pin<Box<S::Future>>
where
    S: Service<u32>,
    S::Error: std::fmt::Debug,
{
    let mut call = Box::pin(svc.ready().await.unwrap().call(n));
    assert!(poll_once(call.as_mut()).is_pending());
    call
}

/// Promise (DESIGN.md): "Bad input gets a clear error, never a panic"; the builder's
/// `max_wait` is "How long a call may wait for a permit before it is refused" and takes any
/// `Duration`. `Duration::MAX` is the natural "wait as long as it takes" for a semaphore
/// bulkhead, yet the first call that has to wait panics inside `poll` (tokio `Instant + Duration`
/// overflows in `sleep_until(since + max_wait)`).
/// So does a wait that ends half a millisecond before the last instant the clock can tell:
/// tokio's timer rounds a deadline up by under a millisecond, which overflowed there.
#[tokio::test(start_paused = true)]
async fn a_huge_max_wait_waits_instead_of_panicking() {
    for builder in [
        Bulkhead::semaphore("forever", 1).max_wait(Duration::MAX),
        Bulkhead::queue("forever-queue", 1, 4).max_wait(Duration::MAX),
        Bulkhead::semaphore("to-the-last-instant", 1).max_wait(to_the_last_instant_less(500)),
    ] {
        let bulkhead = builder.build();
        let gated = Gated::default();
        let mut svc = bulkhead.layer().layer(gated.clone());
        let first = pending_call(&mut svc, 1).await;
        let mut second = Box::pin(svc.ready().await.unwrap().call(2));
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            poll_once(second.as_mut()).is_pending()
        }));
        assert!(
            matches!(polled, Ok(true)),
            "{}: the waiting call should be pending, not panic",
            bulkhead.name()
        );
        gated.open_all();
        assert_eq!(first.await.unwrap(), 1);
        assert!(poll_once(second.as_mut()).is_pending());
        gated.open_all();
        assert_eq!(second.await.unwrap(), 2);
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    }
}

/// The longest wait from now that the clock can still tell, less `micros` microseconds.
fn to_the_last_instant_less(micros: u64) -> Duration {
    let now = tokio::time::Instant::now();
    let (mut fits, mut overflows) = (0u128, Duration::MAX.as_nanos());
    while overflows - fits > 1 {
        let mid = fits + (overflows - fits) / 2;
        let wait = Duration::new((mid / 1_000_000_000) as u64, (mid % 1_000_000_000) as u32);
        match now.checked_add(wait) {
            Some(_) => fits = mid,
            None => overflows = mid,
        }
    }
    let last = Duration::new((fits / 1_000_000_000) as u64, (fits % 1_000_000_000) as u32);
    last - Duration::from_micros(micros)
}

/// Held: a panicking `on_call_finished` hook still gives the permit back exactly once, whether
/// the call ends in `poll` (success) or by being dropped; and a panicking `on_call_permitted`
/// hook on a call granted from the queue gives the permit back too.
#[tokio::test]
async fn panicking_hooks_give_the_permit_back_exactly_once() {
    let finished = Arc::new(AtomicUsize::new(0));
    let seen = finished.clone();
    let bulkhead = Bulkhead::semaphore("hooks", 1)
        .on_call_finished(move |_: &CallFinished<'_>| {
            seen.fetch_add(1, Ordering::SeqCst);
            panic!("finished hook panics on purpose");
        })
        .build();
    let svc = bulkhead.layer().layer(tower::service_fn(
        |n: u32| async move { Ok::<_, io::Error>(n) },
    ));
    // Ends in poll: the panic escapes poll, the permit is back.
    let joined = tokio::spawn(svc.clone().oneshot(1)).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    // Dropped while running: the panic escapes drop, the permit is back.
    let gated = Gated::default();
    let mut gsvc = bulkhead.layer().layer(gated.clone());
    let call = Box::pin(gsvc.ready().await.unwrap().call(2));
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(call)));
    assert!(dropped.is_err());
    let s = bulkhead.snapshot();
    assert_eq!(s.available_concurrent_calls, 1, "{s:?}");
    assert_eq!(s.total_permitted, 2);
    assert_eq!(s.total_finished, 2);
    assert_eq!(finished.load(Ordering::SeqCst), 2);

    // A queued call whose grant runs a panicking permitted hook.
    let armed = Arc::new(AtomicBool::new(false));
    let trigger = armed.clone();
    let bulkhead = Bulkhead::semaphore("permitted", 1)
        .max_wait(Duration::from_secs(60))
        .on_call_permitted(move |_: &CallPermitted<'_>| {
            if trigger.load(Ordering::SeqCst) {
                panic!("permitted hook panics on purpose");
            }
        })
        .build();
    let gated = Gated::default();
    let mut svc = bulkhead.layer().layer(gated.clone());
    let first = pending_call(&mut svc, 1).await;
    let mut second = pending_call(&mut svc, 2).await;
    assert_eq!(bulkhead.snapshot().queue_depth, 1);
    armed.store(true, Ordering::SeqCst);
    gated.open_all();
    assert_eq!(first.await.unwrap(), 1);
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = poll_once(second.as_mut());
    }));
    assert!(polled.is_err());
    drop(second);
    let s = bulkhead.snapshot();
    assert_eq!(s.available_concurrent_calls, 1, "{s:?}");
    assert_eq!(s.queue_depth, 0);
    assert_eq!(s.total_permitted, s.total_finished, "{s:?}");
}

/// Held: a queued call that was granted a permit but dropped before it was polled again passes
/// the permit on to the next in line (nothing leaks, nothing is counted twice), also when the
/// grant came from a resize.
#[tokio::test]
async fn a_granted_but_unpolled_waiter_passes_its_permit_on() {
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let seen = outcomes.clone();
    let bulkhead = Bulkhead::queue("q", 1, 8)
        .on_call_finished(move |e: &CallFinished<'_>| seen.lock().unwrap().push(e.outcome))
        .build();
    let gated = Gated::default();
    let mut svc = bulkhead.layer().layer(gated.clone());
    let first = pending_call(&mut svc, 1).await;
    let second = pending_call(&mut svc, 2).await;
    let mut third = pending_call(&mut svc, 3).await;
    let fourth = pending_call(&mut svc, 4).await;
    assert_eq!(bulkhead.snapshot().queue_depth, 3);
    // Raising the limit grants `second` at once; it is dropped without seeing it.
    bulkhead.set_max_concurrent_calls(2);
    drop(second);
    // Its permit went to `third`.
    assert!(poll_once(third.as_mut()).is_pending());
    assert_eq!(gated.gates.lock().unwrap().len(), 2, "first and third run");
    // The first call ends: `fourth` is granted and then dropped unpolled.
    gated.open_all();
    assert_eq!(first.await.unwrap(), 1);
    drop(fourth);
    assert_eq!(third.await.unwrap(), 3);
    assert_idle(&bulkhead, 2, "the limit raised to 2");
    assert_eq!(bulkhead.snapshot().total_permitted, 2);
    assert_eq!(
        *outcomes.lock().unwrap(),
        vec![CallOutcome::Success, CallOutcome::Success]
    );
}

/// A lowered limit holds against a permit that a waiter leaves behind: the waiter was handed
/// the permit before the limit came down and is dropped before it takes it up, so the permit
/// goes back and on to the next waiter while the lowering is still owed. That waiter must pay
/// the debt with it and keep waiting, not start a call beyond the new limit.
#[tokio::test]
async fn a_permit_left_by_a_waiter_pays_a_lowered_limit_before_the_next_waiter_starts() {
    let bulkhead = Bulkhead::queue("q", 2, 8).build();
    let gated = Gated::default();
    let mut svc = bulkhead.layer().layer(gated.clone());
    let first = Box::pin(svc.ready().await.unwrap().call(1));
    let second = pending_call(&mut svc, 2).await;
    let leaver = Box::pin(svc.ready().await.unwrap().call(3));
    let mut stayer = pending_call(&mut svc, 4).await;
    assert_eq!(gated.gates.lock().unwrap().len(), 2, "first and second run");
    assert_eq!(bulkhead.snapshot().queue_depth, 2);

    // The first call ends: its permit is handed to `leaver`, which has not seen it yet.
    let gate = gated.gates.lock().unwrap().remove(0);
    gate.send(()).unwrap();
    assert_eq!(first.await.unwrap(), 1);
    // Down to one while `second` runs: one permit is owed.
    bulkhead.set_max_concurrent_calls(1);
    // `leaver` goes, and its permit with it, on to `stayer`, which must pay the debt with it.
    drop(leaver);
    assert!(poll_once(stayer.as_mut()).is_pending());
    assert_eq!(gated.gates.lock().unwrap().len(), 1, "only second runs");
    let s = bulkhead.snapshot();
    assert_eq!(s.available_concurrent_calls, 0, "{s:?}");
    assert_eq!(s.queue_depth, 1, "{s:?}");

    // `second` ends: its permit is the one permit of the new limit, and goes to `stayer`.
    gated.open_all();
    assert_eq!(second.await.unwrap(), 2);
    assert!(poll_once(stayer.as_mut()).is_pending());
    assert_eq!(gated.gates.lock().unwrap().len(), 1, "stayer runs");
    gated.open_all();
    assert_eq!(stayer.await.unwrap(), 4);
    assert_idle(&bulkhead, 1, "the limit lowered to 1");
    assert_eq!(bulkhead.snapshot().total_permitted, 3);
}

/// Held: a refusal is a `BulkheadFull` and a timeout above the bulkhead is an `Elapsed`, also for
/// a call that was still queued when the timeout fired; never one for the other.
#[tokio::test(start_paused = true)]
async fn a_queued_call_cut_by_a_timeout_is_a_timeout_not_a_refusal() {
    let bulkhead = Bulkhead::queue("t", 1, 1).build();
    let gated = Gated::default();
    let svc = tower::ServiceBuilder::new()
        .timeout(Duration::from_millis(100))
        .layer(bulkhead.layer())
        .service(gated.clone());
    let mut first = Box::pin(svc.clone().oneshot(1));
    assert!(poll_once(first.as_mut()).is_pending());
    let queued = tokio::spawn(svc.clone().oneshot(2));
    tokio::task::yield_now().await;
    let refused = svc.clone().oneshot(3).await.unwrap_err();
    assert!(refused.is::<BulkheadFull>(), "{refused}");
    let err: BoxError = queued.await.unwrap().unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    assert!(!err.is::<BulkheadFull>());
    assert_eq!(bulkhead.snapshot().queue_depth, 0);
    drop(first);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
}
