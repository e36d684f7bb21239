//! Cancellation stress: thousands of calls on two worker threads, ending every way a call can
//! end, while a gauge inside the inner service checks that the limit is never exceeded.
//!
//! The verdicts are invariants (peak ≤ limit, nothing leaked, nothing released twice), so they
//! hold however the scheduler interleaves the calls.

use std::future::{pending, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::{
    Bulkhead, BulkheadBuilder, BulkheadFull, BulkheadSnapshot, CallFinished, CallOutcome,
    CallPermitted, CallRejected,
};

use tower_bulwark::BoxError;

use crate::common::process::{quiet_panics_starting_with, BOTH_CORES};

/// Calls per storm, sent by `PRODUCERS` tasks (also the adaptive bulkhead's storms).
pub(crate) const CALLS: usize = 4_800;
pub(crate) const PRODUCERS: usize = 24;
const PANIC_MESSAGE: &str = "stress: planned panic";

/// How a call ends, chosen by the request.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Complete,
    Fail,
    PanicInFuture,
    PanicInCall,
    /// Never answers: ended by aborting the caller's task.
    Dropped,
    /// Never answers: cut by the timeout layer above the bulkhead.
    Hang,
}

impl Kind {
    /// What an inner service's `call` does first: panics (with `message`) for `PanicInCall`.
    pub(crate) fn panic_in_call(self, message: &str) {
        if let Kind::PanicInCall = self {
            panic!("{message} in call");
        }
    }

    /// An inner service's future for a call of this kind, which holds `inside` (what counts the
    /// call inside the service) until it ends: after one yield it answers, fails, panics (with
    /// `message`) or never ends.
    pub(crate) fn end<T: Send + 'static>(
        self,
        inside: T,
        message: &'static str,
    ) -> Pin<Box<dyn Future<Output = Result<(), io::Error>> + Send>> {
        Box::pin(async move {
            let _inside = inside;
            tokio::task::yield_now().await;
            match self {
                Kind::Complete => Ok(()),
                Kind::Fail => Err(io::Error::other("planned failure")),
                Kind::PanicInFuture => panic!("{message} in future"),
                Kind::PanicInCall => unreachable!("panicked in call"),
                Kind::Dropped | Kind::Hang => pending().await,
            }
        })
    }
}

pub(crate) const KINDS: [Kind; 6] = [
    Kind::Complete,
    Kind::Fail,
    Kind::PanicInFuture,
    Kind::PanicInCall,
    Kind::Dropped,
    Kind::Hang,
];

/// Counts the calls inside the inner service and remembers the highest count.
#[derive(Clone, Default)]
struct Gauge {
    now: Arc<AtomicUsize>,
    entered: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

struct Inside(Gauge);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Gauge {
    fn enter(&self) -> Inside {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Inside(self.clone())
    }
}

#[derive(Clone)]
struct Inner {
    gauge: Gauge,
}

impl Service<Kind> for Inner {
    type Response = ();
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<(), io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, kind: Kind) -> Self::Future {
        kind.panic_in_call(PANIC_MESSAGE);
        kind.end(self.gauge.enter(), PANIC_MESSAGE)
    }
}

/// What the hooks saw.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) permitted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) outcomes: Mutex<Vec<CallOutcome>>,
}

fn observed(builder: BulkheadBuilder, seen: &Arc<Seen>) -> Bulkhead {
    hooked(builder, seen).build()
}

/// `builder` with hooks that count into `seen` the calls permitted, rejected and finished, and
/// each call's outcome.
pub(crate) fn hooked(builder: BulkheadBuilder, seen: &Arc<Seen>) -> BulkheadBuilder {
    let (p, r, f) = (seen.clone(), seen.clone(), seen.clone());
    builder
        .on_call_permitted(move |_: &CallPermitted<'_>| {
            p.permitted.fetch_add(1, Ordering::Relaxed);
        })
        .on_call_rejected(move |_: &CallRejected<'_>| {
            r.rejected.fetch_add(1, Ordering::Relaxed);
        })
        .on_call_finished(move |event: &CallFinished<'_>| {
            f.finished.fetch_add(1, Ordering::Relaxed);
            f.outcomes.lock().unwrap().push(event.outcome);
        })
}

/// `CALLS` calls of every kind from `PRODUCERS` producers at once, each its own clone of `svc`
/// (one limit for all of them), each making its calls one after another and dropping some while
/// they run. Returns how many were refused with `BulkheadFull`; any other error is the inner
/// service's or a timeout.
pub(crate) async fn produce<S>(svc: S) -> u64
where
    S: Service<Kind, Response = (), Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|producer| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let mut refused = 0u64;
                for i in 0..CALLS / PRODUCERS {
                    let kind = KINDS[(i + producer) % KINDS.len()];
                    let task = tokio::spawn(svc.clone().oneshot(kind));
                    if let Kind::Dropped = kind {
                        for _ in 0..(i % 3) {
                            tokio::task::yield_now().await;
                        }
                        task.abort();
                    }
                    match task.await {
                        Ok(Err(err)) if err.is::<BulkheadFull>() => refused += 1,
                        Ok(Err(err)) => assert!(
                            err.is::<io::Error>() || err.is::<tower::timeout::error::Elapsed>(),
                            "unexpected error: {err}"
                        ),
                        Ok(Ok(())) => {}
                        Err(join) => assert!(join.is_panic() || join.is_cancelled()),
                    }
                }
                refused
            })
        })
        .collect();
    let mut refused = 0;
    for producer in producers {
        refused += producer.await.unwrap();
    }
    refused
}

/// After a storm: every call permitted has finished, and the snapshot counts exactly what the
/// hooks saw (`permitted`, `finished`, `rejected`), at least the `refused` the callers met.
pub(crate) fn assert_the_hooks_agree(
    snapshot: &BulkheadSnapshot,
    [permitted, finished, rejected]: [&AtomicU64; 3],
    refused: u64,
) {
    assert_eq!(snapshot.total_permitted, snapshot.total_finished);
    assert_eq!(snapshot.total_permitted, permitted.load(Ordering::Relaxed));
    assert_eq!(snapshot.total_finished, finished.load(Ordering::Relaxed));
    assert_eq!(snapshot.total_rejected, rejected.load(Ordering::Relaxed));
    assert!(snapshot.total_rejected >= refused);
}

/// After a storm: calls ended in every way the hooks tell.
pub(crate) fn assert_every_outcome_seen(outcomes: &[CallOutcome]) {
    for outcome in [
        CallOutcome::Success,
        CallOutcome::Failure,
        CallOutcome::Panicked,
        CallOutcome::Cancelled,
    ] {
        assert!(outcomes.contains(&outcome), "{outcome:?} never seen");
    }
}

/// Runs `CALLS` calls through `bulkhead`, optionally resizing it meanwhile, and checks the
/// invariants; `limit` is the highest limit in force at any time.
async fn storm(bulkhead: Bulkhead, seen: Arc<Seen>, limit: usize, resize_to: &[usize]) {
    let _cores = BOTH_CORES.lock().await;
    quiet_panics_starting_with(PANIC_MESSAGE);
    let gauge = Gauge::default();
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_millis(3))
        .layer(bulkhead.layer())
        .service(Inner {
            gauge: gauge.clone(),
        });

    // One call of each kind alone first, so that every outcome occurs whatever the interleaving.
    for kind in KINDS {
        let entered = gauge.entered.load(Ordering::SeqCst);
        let task = tokio::spawn(svc.clone().oneshot(kind));
        if let Kind::Dropped = kind {
            while gauge.entered.load(Ordering::SeqCst) == entered {
                tokio::task::yield_now().await;
            }
            task.abort();
        }
        let _ = task.await;
    }
    assert_eq!(gauge.now.load(Ordering::SeqCst), 0);

    let resizer = {
        let bulkhead = bulkhead.clone();
        let sizes = resize_to.to_vec();
        tokio::spawn(async move {
            for size in sizes.iter().cycle().take(sizes.len() * 200) {
                bulkhead.set_max_concurrent_calls(*size);
                tokio::task::yield_now().await;
            }
        })
    };

    // Many more callers than permits, each making its calls one after another, so that permits
    // keep changing hands while calls end in every way.
    let refused = produce(svc).await;
    resizer.await.unwrap();

    let peak = gauge.peak.load(Ordering::SeqCst);
    assert!(peak <= limit, "peak {peak} above the limit {limit}");
    assert_eq!(gauge.now.load(Ordering::SeqCst), 0);

    let snapshot = bulkhead.snapshot();
    assert_eq!(
        snapshot.available_concurrent_calls, snapshot.max_allowed_concurrent_calls,
        "a permit leaked or was given back twice: {snapshot:?}"
    );
    assert_eq!(snapshot.queue_depth, 0);
    assert_the_hooks_agree(
        &snapshot,
        [&seen.permitted, &seen.finished, &seen.rejected],
        refused,
    );
    assert!(snapshot.total_permitted + snapshot.total_rejected <= (CALLS + KINDS.len()) as u64);
    let outcomes = seen.outcomes.lock().unwrap();
    assert_every_outcome_seen(&outcomes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_without_waiting() {
    let seen = Arc::new(Seen::default());
    let bulkhead = observed(Bulkhead::semaphore("stress", 8), &seen);
    storm(bulkhead, seen, 8, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_with_waiting() {
    let seen = Arc::new(Seen::default());
    let bulkhead = observed(
        Bulkhead::semaphore("stress", 8).max_wait(Duration::from_millis(1)),
        &seen,
    );
    storm(bulkhead, seen, 8, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_queue() {
    let seen = Arc::new(Seen::default());
    let bulkhead = observed(Bulkhead::queue("stress", 4, 12), &seen);
    storm(bulkhead, seen, 4, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resized_while_busy() {
    let seen = Arc::new(Seen::default());
    let bulkhead = observed(Bulkhead::queue("stress", 6, 8), &seen);
    storm(bulkhead.clone(), seen, 6, &[2, 6, 1, 4, 0, 3]).await;
    // The resizer stopped on 3.
    assert_eq!(bulkhead.snapshot().max_allowed_concurrent_calls, 3);
}

/// Every call enters the inner service with at most the limit in force when it was admitted
/// inside, itself included, while the limit jumps up and down and waiters give up or are cut:
/// a permit handed to a waiter that leaves goes back to the semaphore even while a lowered
/// limit is still owed, and must pay that debt rather than let one call too many in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_is_admitted_under_the_limit_in_force_through_resizes() {
    /// Lowers the count of calls inside when the inner call ends or is dropped.
    struct Leave(Arc<AtomicUsize>);
    impl Drop for Leave {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    let bulkhead = Bulkhead::queue("exact", 4, 16)
        .max_wait(Duration::from_millis(2))
        .build();
    // Every limit set, in order; a resize and its entry happen under the lock, so a caller that
    // reads the length before it is admitted finds the limit it was admitted under at that
    // index or after.
    let history = Arc::new(Mutex::new(vec![4usize]));
    let inside = Arc::new(AtomicUsize::new(0));
    let inner = {
        let (history, inside) = (history.clone(), inside.clone());
        tower::service_fn(move |seen: usize| {
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            let leave = Leave(inside.clone());
            let allowed = *history.lock().unwrap()[seen - 1..].iter().max().unwrap();
            assert!(now <= allowed, "{now} calls inside, limit {allowed}");
            async move {
                for _ in 0..=(seen % 4) {
                    tokio::task::yield_now().await;
                }
                drop(leave);
                Ok::<_, io::Error>(())
            }
        })
    };
    let svc = ServiceBuilder::new().layer(bulkhead.layer()).service(inner);

    let resizer = {
        let (bulkhead, history) = (bulkhead.clone(), history.clone());
        tokio::spawn(async move {
            for size in [2, 6, 1, 4, 0, 3, 5].iter().cycle().take(7_000) {
                {
                    let mut history = history.lock().unwrap();
                    bulkhead.set_max_concurrent_calls(*size);
                    history.push(*size);
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let callers: Vec<_> = (0..PRODUCERS)
        .map(|caller| {
            let (svc, history) = (svc.clone(), history.clone());
            tokio::spawn(async move {
                for i in 0..4 * CALLS / PRODUCERS {
                    let seen = history.lock().unwrap().len();
                    let call = tokio::spawn(svc.clone().oneshot(seen));
                    if (i + caller) % 5 == 0 {
                        tokio::task::yield_now().await;
                        call.abort();
                    }
                    match call.await {
                        Ok(Ok(())) => {}
                        Ok(Err(err)) => assert!(err.is::<BulkheadFull>(), "{err}"),
                        Err(join) => assert!(join.is_cancelled(), "{join}"),
                    }
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
    resizer.await.unwrap();

    assert_eq!(inside.load(Ordering::SeqCst), 0);
    let snapshot = bulkhead.snapshot();
    assert_eq!(
        snapshot.available_concurrent_calls,
        snapshot.max_allowed_concurrent_calls
    );
    assert_eq!(snapshot.queue_depth, 0);
    assert_eq!(snapshot.total_permitted, snapshot.total_finished);
}

/// "The free permits plus the calls in flight are never above the limit", read while another
/// thread resizes: with no calls at all, the limit flipping between 6 and 1 and 200 000
/// snapshots taken meanwhile, no snapshot shows more free permits than its limit (read apart,
/// one within about a thousand did).
#[test]
fn a_snapshot_taken_during_resizes_never_shows_more_free_permits_than_its_limit() {
    use std::sync::atomic::AtomicBool;

    let bulkhead = Bulkhead::semaphore("flip", 6).build();
    let done = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicUsize::new(0));
    let flipper = {
        let (bulkhead, done, flips) = (bulkhead.clone(), done.clone(), flips.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                bulkhead.set_max_concurrent_calls(1);
                bulkhead.set_max_concurrent_calls(6);
                flips.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // At least 200 000 snapshots while at least 1 000 flips happen, however the two threads
    // are scheduled (bounded, so that a flipper that never runs fails the check below).
    let mut taken = 0;
    while (taken < 200_000 || flips.load(Ordering::Relaxed) < 1_000) && taken < 50_000_000 {
        taken += 1;
        let snapshot = bulkhead.snapshot();
        let max = snapshot.max_allowed_concurrent_calls;
        assert!(
            snapshot.available_concurrent_calls <= max,
            "{} free of a limit of {max}",
            snapshot.available_concurrent_calls
        );
    }
    done.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    assert!(
        flips.load(Ordering::Relaxed) >= 1_000,
        "the limit was flipped meanwhile"
    );
}
