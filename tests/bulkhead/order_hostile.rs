//! Attacks on the bulkheads' documented promises through the public API: arrival order (and,
//! ignored, across a lowered limit, which is not promised), the limit, exactly-once release,
//! the snapshot and `max_wait`.
//!
//! Deterministic scenarios poll by hand under paused time; a random model (proptest) of calls,
//! polls, ends, drops, resizes and time checks every step against a plain FIFO model; storms on
//! a multi-thread runtime check the limit and the release with atomic counters.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use proptest::prelude::*;
use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::{
    Bulkhead, BulkheadBuilder, BulkheadFull, BulkheadService, CallFinished, CallPermitted,
    ResponseFuture,
};
use tower_bulwark::BoxError;

use crate::common::process::quiet_panics_starting_with;
use crate::common::{paused_runtime, poll_once, Rng};

const PANIC_MESSAGE: &str = "attack_order: planned panic";

// ---------------------------------------------------------------------------------------------
// A gated inner service (after `behaviour.rs`), which also counts the calls inside it.

enum Gate {
    Ok,
    Err,
    Panic,
}

#[derive(Clone, Default)]
struct Gated {
    state: Arc<Mutex<GatedState>>,
    /// Inner calls started and neither completed nor dropped.
    live: Arc<AtomicUsize>,
}

#[derive(Default)]
struct GatedState {
    started: Vec<u32>,
    gates: HashMap<u32, oneshot::Sender<Gate>>,
    /// Calls whose `call` panics.
    panic_on_call: Vec<u32>,
}

/// Counts one live inner call; lowered when the inner future completes or is dropped.
struct Live(Arc<AtomicUsize>, bool);

impl Live {
    fn done(&mut self) {
        if !self.1 {
            self.1 = true;
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.done();
    }
}

impl Gated {
    fn started(&self) -> Vec<u32> {
        self.state.lock().unwrap().started.clone()
    }

    fn has_started(&self, id: u32) -> bool {
        self.state.lock().unwrap().started.contains(&id)
    }

    fn open(&self, id: u32, gate: Gate) {
        let tx = self
            .state
            .lock()
            .unwrap()
            .gates
            .remove(&id)
            .expect("call started");
        let _ = tx.send(gate);
    }

    fn finish(&self, id: u32) {
        self.open(id, Gate::Ok);
    }
}

impl Service<u32> for Gated {
    type Response = u32;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<u32, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, id: u32) -> Self::Future {
        let panics = self.state.lock().unwrap().panic_on_call.contains(&id);
        if panics {
            panic!("{PANIC_MESSAGE} in call {id}");
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.state.lock().unwrap();
            state.started.push(id);
            state.gates.insert(id, tx);
        }
        self.live.fetch_add(1, Ordering::SeqCst);
        let mut live = Live(self.live.clone(), false);
        Box::pin(async move {
            let gate = rx.await;
            live.done();
            match gate {
                Ok(Gate::Ok) => Ok(id),
                Ok(Gate::Err) => Err(io::Error::other("downstream broke")),
                Ok(Gate::Panic) => panic!("{PANIC_MESSAGE}"),
                Err(_) => Err(io::Error::other("gate dropped")),
            }
        })
    }
}

type Svc = BulkheadService<Gated>;
type Call = Pin<Box<ResponseFuture<Gated, u32>>>;

fn call(svc: &mut Svc, id: u32) -> Call {
    Box::pin(svc.call(id))
}

/// Polls once with a waker that does nothing; `Err` if the poll panicked.
fn poll_call(call: &mut Call) -> Result<Poll<Result<u32, BoxError>>, ()> {
    catch_unwind(AssertUnwindSafe(|| poll_once(call.as_mut()))).map_err(|_| ())
}

fn pending(call: &mut Call) -> bool {
    matches!(poll_call(call), Ok(Poll::Pending))
}

/// Both kinds, built with `limit`: a queue of 16 places, and a semaphore whose callers may wait.
fn kinds(limit: usize) -> [(&'static str, BulkheadBuilder); 2] {
    [
        ("queue", Bulkhead::queue("q", limit, 16)),
        (
            "semaphore",
            Bulkhead::semaphore("s", limit).max_wait(Duration::from_secs(600)),
        ),
    ]
}

/// Ends a running call with a response and drives its future to the end.
fn end(inner: &Gated, calls: &mut HashMap<u32, Call>, id: u32) {
    inner.finish(id);
    let mut fut = calls.remove(&id).unwrap();
    match poll_call(&mut fut) {
        Ok(Poll::Ready(Ok(got))) => assert_eq!(got, id),
        _ => panic!("call {id} did not end with its response"),
    }
}

fn assert_idle(bulkhead: &Bulkhead, limit: usize, what: &str) {
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.max_allowed_concurrent_calls, limit, "{what}");
    assert_eq!(snapshot.available_concurrent_calls, limit, "{what}");
    assert_eq!(snapshot.queue_depth, 0, "{what}");
    assert_eq!(snapshot.total_permitted, snapshot.total_finished, "{what}");
}

// ---------------------------------------------------------------------------------------------
// Arrival order across a lowered limit.

/// Limit 3; calls 1, 2, 3 run; 4 and 5 wait. 1 and 2 end, so 4 and then 5 are handed permits
/// (neither polled yet). The limit drops to 1. 5 is polled before 4 (both stay pending, 3 still
/// runs). 3 ends: in flight 0, limit 1, so the head of the line, 4, must start, not 5.
#[tokio::test(start_paused = true)]
#[ignore = "not promised: across a lowered limit a waiter whose permit pays the lower limit waits again behind later arrivals (bulkhead module docs); the acceptance test of admission by calls in flight"]
async fn lowered_limit_head_of_line_is_arrival_order_not_poll_order() {
    for (kind, builder) in kinds(3) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=5).map(|id| (id, call(&mut svc, id))).collect();
        assert_eq!(inner.started(), vec![1, 2, 3], "{kind}");
        end(&inner, &mut calls, 1);
        end(&inner, &mut calls, 2);
        bulkhead.set_max_concurrent_calls(1);
        assert!(pending(calls.get_mut(&5).unwrap()), "{kind}");
        assert!(pending(calls.get_mut(&4).unwrap()), "{kind}");
        assert_eq!(inner.started(), vec![1, 2, 3], "{kind}: 3 runs, limit 1");
        end(&inner, &mut calls, 3);
        for id in [5, 4] {
            assert!(pending(calls.get_mut(&id).unwrap()), "{kind}");
        }
        assert_eq!(
            inner.started(),
            vec![1, 2, 3, 4],
            "{kind}: 4 arrived before 5 and must start first"
        );
        end(&inner, &mut calls, 4);
        assert!(pending(calls.get_mut(&5).unwrap()));
        end(&inner, &mut calls, 5);
        assert_idle(&bulkhead, 1, kind);
    }
}

/// Same, with the head of the line released by a raise instead of a call ending: limit 2, 1
/// and 2 run, 3 and 4 wait; both end, 3 and 4 are handed permits; limit 0; 4 polled, then 3;
/// limit 1: 3 must start, not 4.
#[tokio::test(start_paused = true)]
#[ignore = "not promised: across a lowered limit a waiter whose permit pays the lower limit waits again behind later arrivals (bulkhead module docs); the acceptance test of admission by calls in flight"]
async fn raise_after_lowering_to_zero_starts_the_oldest_waiter() {
    for (kind, builder) in kinds(2) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=4).map(|id| (id, call(&mut svc, id))).collect();
        end(&inner, &mut calls, 1);
        end(&inner, &mut calls, 2);
        bulkhead.set_max_concurrent_calls(0);
        assert!(pending(calls.get_mut(&4).unwrap()));
        assert!(pending(calls.get_mut(&3).unwrap()));
        assert_eq!(inner.started(), vec![1, 2], "{kind}: limit 0");
        bulkhead.set_max_concurrent_calls(1);
        for id in [4, 3] {
            assert!(pending(calls.get_mut(&id).unwrap()));
        }
        assert_eq!(
            inner.started(),
            vec![1, 2, 3],
            "{kind}: 3 is the head of the line"
        );
        end(&inner, &mut calls, 3);
        assert!(pending(calls.get_mut(&4).unwrap()));
        end(&inner, &mut calls, 4);
        assert_idle(&bulkhead, 1, kind);
    }
}

/// Polling in arrival order, the head of the line keeps its place through a lowering and a
/// raise (the documented scenario, driven through a raise as well as through calls ending).
#[tokio::test(start_paused = true)]
#[ignore = "not promised: across a lowered limit a waiter whose permit pays the lower limit waits again behind later arrivals (bulkhead module docs); the acceptance test of admission by calls in flight"]
async fn head_of_line_keeps_its_place_through_lower_and_raise_when_polled_in_order() {
    for (kind, builder) in kinds(2) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=6).map(|id| (id, call(&mut svc, id))).collect();
        end(&inner, &mut calls, 1);
        bulkhead.set_max_concurrent_calls(0);
        for id in 3..=6 {
            assert!(pending(calls.get_mut(&id).unwrap()));
        }
        bulkhead.set_max_concurrent_calls(2);
        for id in 3..=6 {
            assert!(pending(calls.get_mut(&id).unwrap()));
        }
        assert_eq!(inner.started(), vec![1, 2, 3], "{kind}: 2 runs, limit 2");
        bulkhead.set_max_concurrent_calls(1);
        end(&inner, &mut calls, 2);
        for id in 4..=6 {
            assert!(pending(calls.get_mut(&id).unwrap()));
        }
        assert_eq!(inner.started(), vec![1, 2, 3], "{kind}: 3 runs, limit 1");
        for (ends, starts) in [(3, 4), (4, 5), (5, 6)] {
            end(&inner, &mut calls, ends);
            for id in (starts..=6).rev() {
                assert!(pending(calls.get_mut(&id).unwrap()));
            }
            assert_eq!(inner.started().last(), Some(&starts), "{kind}");
        }
        end(&inner, &mut calls, 6);
        assert_idle(&bulkhead, 1, kind);
    }
}

// ---------------------------------------------------------------------------------------------
// The limit.

/// Limit 2: 1 and 2 run, 3 waits. 1 ends, handing 3 a permit; limit 1; 3 is polled and waits
/// (2 runs). 2 ends: 3 may start now, but is not polled yet. The limit drops to 0. Then 3 is
/// polled: it must not start (limit 0), yet it does.
#[tokio::test(start_paused = true)]
async fn a_waiter_let_go_but_not_polled_does_not_start_beyond_a_limit_lowered_again() {
    for (kind, builder) in kinds(2) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=3).map(|id| (id, call(&mut svc, id))).collect();
        end(&inner, &mut calls, 1);
        bulkhead.set_max_concurrent_calls(1);
        assert!(pending(calls.get_mut(&3).unwrap()));
        assert_eq!(inner.started(), vec![1, 2], "{kind}");
        end(&inner, &mut calls, 2);
        bulkhead.set_max_concurrent_calls(0);
        assert!(pending(calls.get_mut(&3).unwrap()));
        assert_eq!(
            inner.started(),
            vec![1, 2],
            "{kind}: limit 0, yet call 3 reached the inner service after the limit was set"
        );
        bulkhead.set_max_concurrent_calls(1);
        assert!(pending(calls.get_mut(&3).unwrap()));
        end(&inner, &mut calls, 3);
        assert_idle(&bulkhead, 1, kind);
    }
}

/// Control: the same, but with a waiter handed a permit by tokio (not by a lowered limit) and
/// not polled: lowering to 0 keeps it out.
#[tokio::test(start_paused = true)]
async fn a_waiter_handed_a_permit_but_not_polled_does_not_start_beyond_a_lowered_limit() {
    for (kind, builder) in kinds(1) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=2).map(|id| (id, call(&mut svc, id))).collect();
        end(&inner, &mut calls, 1);
        bulkhead.set_max_concurrent_calls(0);
        assert!(pending(calls.get_mut(&2).unwrap()));
        assert_eq!(inner.started(), vec![1], "{kind}");
        assert_eq!(bulkhead.snapshot().available_concurrent_calls, 0);
        bulkhead.set_max_concurrent_calls(1);
        assert!(pending(calls.get_mut(&2).unwrap()));
        assert_eq!(inner.started(), vec![1, 2], "{kind}");
        end(&inner, &mut calls, 2);
        assert_idle(&bulkhead, 1, kind);
    }
}

// ---------------------------------------------------------------------------------------------
// A permit handed to a waiter that leaves before it is polled, while a lowered limit is owed.

/// Limit 3: 1, 2, 3 run; 4 and 5 wait. 1 and 2 end (4 and 5 handed permits, not polled).
/// Limit 1. 4 is polled (waits: 3 runs). 5 leaves without being polled. 3 ends: nothing in
/// flight, limit 1, so 4 must start. It does not; it starts only when a new call arrives.
#[tokio::test(start_paused = true)]
async fn a_waiter_leaving_with_a_permit_does_not_strand_the_head_of_the_line() {
    for (kind, builder) in kinds(3) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=5).map(|id| (id, call(&mut svc, id))).collect();
        end(&inner, &mut calls, 1);
        end(&inner, &mut calls, 2);
        bulkhead.set_max_concurrent_calls(1);
        assert!(pending(calls.get_mut(&4).unwrap()));
        drop(calls.remove(&5));
        end(&inner, &mut calls, 3);
        assert!(pending(calls.get_mut(&4).unwrap()));
        let snapshot = bulkhead.snapshot();
        assert_eq!(
            inner.started(),
            vec![1, 2, 3, 4],
            "{kind}: nothing in flight, limit 1, 4 waits (snapshot {snapshot:?})"
        );
        end(&inner, &mut calls, 4);
        assert_idle(&bulkhead, 1, kind);
    }
}

/// The same strand, with `max_wait`: the head of the line is refused at its deadline though
/// nothing was in flight for almost all of its wait.
#[tokio::test(start_paused = true)]
async fn a_stranded_head_of_line_is_refused_at_max_wait_with_capacity_free() {
    let bulkhead = Bulkhead::semaphore("s", 3)
        .max_wait(Duration::from_secs(1))
        .build();
    let inner = Gated::default();
    let mut svc = bulkhead.layer().layer(inner.clone());
    let mut calls: HashMap<u32, Call> = (1..=5).map(|id| (id, call(&mut svc, id))).collect();
    end(&inner, &mut calls, 1);
    end(&inner, &mut calls, 2);
    bulkhead.set_max_concurrent_calls(1);
    assert!(pending(calls.get_mut(&4).unwrap()));
    drop(calls.remove(&5));
    end(&inner, &mut calls, 3);
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut four = calls.remove(&4).unwrap();
    let verdict = poll_call(&mut four).unwrap();
    assert!(
        verdict.is_pending() && inner.has_started(4),
        "4 should have started; got refused: {}",
        matches!(verdict, Poll::Ready(Err(ref e)) if e.is::<BulkheadFull>())
    );
    drop(four);
    assert_idle(&bulkhead, 1, "semaphore");
}

// ---------------------------------------------------------------------------------------------
// Exactly-once release at every point a waiter can be dropped.

/// Where a waiter is when it is dropped.
#[derive(Clone, Copy, Debug)]
enum DropAt {
    /// Never polled, no permit.
    Unpolled,
    /// Polled, no permit.
    Waiting,
    /// Handed a permit by a call that ended, not polled since.
    HandedUnpolled,
    /// Handed a permit, polled after the limit was lowered: waits for the debt.
    HeldForLoweredLimit,
    /// Let go by the debt, not polled since.
    LetGoUnpolled,
    /// Started.
    Running,
}

/// For both kinds and every place, a waiter (call 3) dropped there leaves no permit behind and
/// takes none twice: the next waiter (4) starts when the limit allows, and at the end the
/// snapshot is idle.
#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_anywhere_releases_exactly_once() {
    use DropAt::*;
    for at in [
        Unpolled,
        Waiting,
        HandedUnpolled,
        HeldForLoweredLimit,
        LetGoUnpolled,
        Running,
    ] {
        for (kind, builder) in kinds(2) {
            let what = format!("{kind}, dropped {at:?}");
            let bulkhead = builder.build();
            let inner = Gated::default();
            let mut svc = bulkhead.layer().layer(inner.clone());
            let mut calls: HashMap<u32, Call> =
                (1..=4).map(|id| (id, call(&mut svc, id))).collect();
            match at {
                Unpolled => {}
                Waiting => assert!(pending(calls.get_mut(&3).unwrap())),
                HandedUnpolled => end(&inner, &mut calls, 1),
                HeldForLoweredLimit | LetGoUnpolled => {
                    end(&inner, &mut calls, 1);
                    bulkhead.set_max_concurrent_calls(1);
                    assert!(pending(calls.get_mut(&3).unwrap()));
                    if let LetGoUnpolled = at {
                        end(&inner, &mut calls, 2);
                    }
                }
                Running => {
                    end(&inner, &mut calls, 1);
                    assert!(pending(calls.get_mut(&3).unwrap()));
                    assert!(inner.has_started(3), "{what}");
                }
            }
            drop(calls.remove(&3));
            // End whatever still runs, then 4 must start.
            for id in [1, 2] {
                if calls.contains_key(&id) {
                    end(&inner, &mut calls, id);
                }
            }
            assert!(pending(calls.get_mut(&4).unwrap()), "{what}");
            assert!(inner.has_started(4), "{what}: 4 should run");
            assert!(
                !inner.started().contains(&3) || matches!(at, Running),
                "{what}"
            );
            end(&inner, &mut calls, 4);
            let limit = bulkhead.snapshot().max_allowed_concurrent_calls;
            assert_idle(&bulkhead, limit, &what);
            assert_eq!(inner.live.load(Ordering::SeqCst), 0, "{what}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// max_wait.

/// The wait is counted from the call, not from its first poll, and the refusal comes at the
/// deadline, not a tick before; a call first polled after its deadline is refused at once.
#[tokio::test(start_paused = true)]
async fn max_wait_counts_from_arrival_and_refuses_exactly_at_the_deadline() {
    for (kind, builder) in [
        (
            "semaphore",
            Bulkhead::semaphore("s", 1).max_wait(Duration::from_millis(100)),
        ),
        (
            "queue",
            Bulkhead::queue("q", 1, 4).max_wait(Duration::from_millis(100)),
        ),
    ] {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let _running = call(&mut svc, 1);
        let mut waiter = call(&mut svc, 2);
        tokio::time::advance(Duration::from_millis(60)).await;
        let mut late = call(&mut svc, 3);
        assert!(pending(&mut waiter), "{kind}: first poll at 60 ms");
        tokio::time::advance(Duration::from_millis(39)).await;
        assert!(pending(&mut waiter), "{kind}: at 99 ms");
        assert!(pending(&mut late), "{kind}: 3 at 39 ms of its wait");
        tokio::time::advance(Duration::from_millis(1)).await;
        match poll_call(&mut waiter).unwrap() {
            Poll::Ready(Err(err)) => assert!(err.is::<BulkheadFull>(), "{kind}"),
            other => panic!("{kind}: at 100 ms expected a refusal, got {other:?}"),
        }
        tokio::time::advance(Duration::from_millis(59)).await;
        assert!(pending(&mut late), "{kind}: 3 at 99 ms of its wait");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            matches!(poll_call(&mut late).unwrap(), Poll::Ready(Err(_))),
            "{kind}"
        );

        // Never polled before its deadline: refused on its first poll.
        let mut unpolled = call(&mut svc, 4);
        tokio::time::advance(Duration::from_millis(150)).await;
        match poll_call(&mut unpolled).unwrap() {
            Poll::Ready(Err(err)) => assert!(err.is::<BulkheadFull>(), "{kind}"),
            other => panic!("{kind}: expected a refusal, got {other:?}"),
        }
        assert_eq!(bulkhead.snapshot().queue_depth, 0, "{kind}");
        assert_eq!(inner.started(), vec![1], "{kind}");
    }
}

/// A waiter held for a lowered limit is refused at its deadline, not before, and gives its
/// permit back (paying the debt): the limit then holds and the bulkhead ends idle.
#[tokio::test(start_paused = true)]
async fn max_wait_is_kept_by_a_waiter_held_for_a_lowered_limit() {
    let bulkhead = Bulkhead::semaphore("s", 2)
        .max_wait(Duration::from_millis(100))
        .build();
    let inner = Gated::default();
    let mut svc = bulkhead.layer().layer(inner.clone());
    let mut calls: HashMap<u32, Call> = (1..=4).map(|id| (id, call(&mut svc, id))).collect();
    end(&inner, &mut calls, 1);
    bulkhead.set_max_concurrent_calls(1);
    assert!(pending(calls.get_mut(&3).unwrap()));
    tokio::time::advance(Duration::from_millis(99)).await;
    assert!(pending(calls.get_mut(&3).unwrap()));
    assert!(pending(calls.get_mut(&4).unwrap()));
    tokio::time::advance(Duration::from_millis(1)).await;
    for id in [3, 4] {
        let mut fut = calls.remove(&id).unwrap();
        assert!(
            matches!(poll_call(&mut fut).unwrap(), Poll::Ready(Err(ref e)) if e.is::<BulkheadFull>()),
            "{id}"
        );
    }
    // 2 still runs at limit 1: a new call is refused.
    let mut new = call(&mut svc, 5);
    assert!(pending(&mut new));
    assert_eq!(inner.started(), vec![1, 2]);
    drop(new);
    end(&inner, &mut calls, 2);
    assert_idle(&bulkhead, 1, "semaphore");
}

/// A `max_wait` longer than tokio's timer wheel (about 2.2 years) is not cut short.
#[tokio::test(start_paused = true)]
async fn a_max_wait_of_years_is_not_cut_short() {
    let year = Duration::from_secs(365 * 24 * 3600);
    let bulkhead = Bulkhead::semaphore("s", 1).max_wait(year * 5).build();
    let inner = Gated::default();
    let mut svc = bulkhead.layer().layer(inner.clone());
    let _running = call(&mut svc, 1);
    let mut waiter = call(&mut svc, 2);
    assert!(pending(&mut waiter));
    for _ in 0..4 {
        tokio::time::advance(year).await;
        assert!(pending(&mut waiter), "refused before 5 years");
    }
    tokio::time::advance(year - Duration::from_secs(1)).await;
    assert!(pending(&mut waiter), "refused before 5 years");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(
        poll_call(&mut waiter).unwrap(),
        Poll::Ready(Err(_))
    ));
}

/// A `max_wait` below tokio's millisecond tick: the refusal comes at or after the deadline.
#[tokio::test(start_paused = true)]
async fn a_sub_millisecond_max_wait_is_not_cut_short() {
    let bulkhead = Bulkhead::semaphore("s", 1)
        .max_wait(Duration::from_micros(1500))
        .build();
    let inner = Gated::default();
    let mut svc = bulkhead.layer().layer(inner.clone());
    let _running = call(&mut svc, 1);
    let start = tokio::time::Instant::now();
    let mut waiter = call(&mut svc, 2);
    assert!(pending(&mut waiter));
    loop {
        tokio::time::advance(Duration::from_micros(100)).await;
        match poll_call(&mut waiter).unwrap() {
            Poll::Pending => assert!(start.elapsed() < Duration::from_millis(10)),
            Poll::Ready(result) => {
                assert!(result.unwrap_err().is::<BulkheadFull>());
                assert!(
                    start.elapsed() >= Duration::from_micros(1500),
                    "refused after {:?}",
                    start.elapsed()
                );
                break;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Limit zero.

/// A zero limit with waiting allowed: calls queue (none starts), keep their order, are refused
/// at `max_wait`, and a raise lets the oldest in first.
#[tokio::test(start_paused = true)]
async fn limit_zero_queues_in_order_and_a_raise_admits_the_oldest() {
    for (kind, builder) in [
        (
            "semaphore",
            Bulkhead::semaphore("s", 0).max_wait(Duration::from_millis(100)),
        ),
        ("queue", Bulkhead::queue("q", 0, 3)),
    ] {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=3).map(|id| (id, call(&mut svc, id))).collect();
        for id in (1..=3).rev() {
            assert!(pending(calls.get_mut(&id).unwrap()), "{kind}");
        }
        assert_eq!(bulkhead.snapshot().queue_depth, 3, "{kind}");
        assert!(inner.started().is_empty(), "{kind}");
        bulkhead.set_max_concurrent_calls(1);
        for id in (1..=3).rev() {
            assert!(pending(calls.get_mut(&id).unwrap()), "{kind}");
        }
        assert_eq!(inner.started(), vec![1], "{kind}");
        bulkhead.set_max_concurrent_calls(0);
        end(&inner, &mut calls, 1);
        for id in (2..=3).rev() {
            assert!(pending(calls.get_mut(&id).unwrap()), "{kind}");
        }
        assert_eq!(inner.started(), vec![1], "{kind}: back at 0");
        tokio::time::advance(Duration::from_millis(100)).await;
        for id in 2..=3 {
            let mut fut = calls.remove(&id).unwrap();
            let verdict = poll_call(&mut fut).unwrap();
            if kind == "semaphore" {
                assert!(matches!(verdict, Poll::Ready(Err(_))), "{kind}");
            } else {
                assert!(verdict.is_pending(), "{kind}: no max_wait");
            }
        }
        assert_idle(&bulkhead, 0, kind);
    }
}

// ---------------------------------------------------------------------------------------------
// Minimal cases found by the random model.

/// Limit 2: 1 and 2 run; 3 and 4 wait. 1 and 2 end, handing 3 and 4 permits (neither polled
/// yet). Limit 1. 3 is polled: nothing is in flight and the limit is 1, so 3, the head of the
/// line, must start. It waits until 4, which arrived after it, has been polled.
#[tokio::test(start_paused = true)]
#[ignore = "not promised: across a lowered limit a waiter whose permit pays the lower limit waits again behind later arrivals (bulkhead module docs); the acceptance test of admission by calls in flight"]
async fn a_polled_head_of_line_starts_under_a_lowered_limit_with_nothing_in_flight() {
    for (kind, builder) in kinds(2) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=4).map(|id| (id, call(&mut svc, id))).collect();
        end(&inner, &mut calls, 1);
        end(&inner, &mut calls, 2);
        bulkhead.set_max_concurrent_calls(1);
        assert!(pending(calls.get_mut(&3).unwrap()));
        assert_eq!(
            inner.started(),
            vec![1, 2, 3],
            "{kind}: 0 in flight, limit 1, head of the line polled (snapshot {:?})",
            bulkhead.snapshot()
        );
        assert!(pending(calls.get_mut(&4).unwrap()));
        end(&inner, &mut calls, 3);
        assert!(pending(calls.get_mut(&4).unwrap()));
        end(&inner, &mut calls, 4);
        assert_idle(&bulkhead, 1, kind);
    }
}

/// Resizes alone: limit 0, call 1 waits; limit 1 (1 handed a permit), limit 0; 1 is polled
/// (waits); limit 1 (1 let go, not polled), limit 0. 1 is polled again: the limit is 0, yet it
/// starts.
#[tokio::test(start_paused = true)]
async fn resizes_alone_never_let_a_waiter_start_beyond_limit_zero() {
    for (kind, builder) in kinds(0) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut one = call(&mut svc, 1);
        bulkhead.set_max_concurrent_calls(1);
        bulkhead.set_max_concurrent_calls(0);
        assert!(pending(&mut one));
        bulkhead.set_max_concurrent_calls(1);
        bulkhead.set_max_concurrent_calls(0);
        assert!(pending(&mut one));
        assert!(inner.started().is_empty(), "{kind}: started with limit 0");
        bulkhead.set_max_concurrent_calls(1);
        assert!(pending(&mut one));
        assert_eq!(inner.started(), vec![1], "{kind}");
        let mut calls = HashMap::from([(1, one)]);
        end(&inner, &mut calls, 1);
        assert_idle(&bulkhead, 1, kind);
    }
}

/// The strand with ordinary tasks: calls 1-3 run at limit 3; tasks 4 and 5 wait. 1 and 2 end,
/// handing 4 and 5 permits; before the tasks run, the limit drops to 1 and task 5 is aborted
/// (a cancelled caller). 3 ends. Nothing is in flight, the limit is 1, task 4 is the only
/// waiter: it must start. It does not, for as long as no other call arrives.
#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_task_does_not_strand_the_head_of_the_line() {
    for (kind, builder) in kinds(3) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=3).map(|id| (id, call(&mut svc, id))).collect();
        let mut tasks = HashMap::new();
        for id in [4, 5] {
            tasks.insert(id, tokio::spawn(svc.clone().oneshot(id)));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(bulkhead.snapshot().queue_depth, 2, "{kind}");
        end(&inner, &mut calls, 1);
        end(&inner, &mut calls, 2);
        bulkhead.set_max_concurrent_calls(1);
        tasks[&5].abort();
        tokio::time::sleep(Duration::from_millis(1)).await;
        end(&inner, &mut calls, 3);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let stranded = !inner.has_started(4);
        let snapshot = bulkhead.snapshot();
        // A new call frees it.
        let late = tokio::spawn(svc.clone().oneshot(6));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(inner.has_started(4), "{kind}");
        inner.finish(4);
        tasks.remove(&4).unwrap().await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        inner.finish(6);
        late.await.unwrap().unwrap();
        assert_idle(&bulkhead, 1, kind);
        assert!(
            !stranded,
            "{kind}: task 4 waited 10 s with 0 in flight and limit 1 (snapshot {snapshot:?})"
        );
    }
}

/// Waiter tasks on a multi-thread runtime: at limit 0, tasks 1 then 2 wait; the limit goes to
/// 2 and straight back to 0, so both are handed permits and neither may start (runs where one
/// started in between are skipped). Then the limit goes to 1: the head of the line, 1, must
/// start, whichever task the runtime polled first.
#[test]
#[ignore = "not promised: across a lowered limit a waiter whose permit pays the lower limit waits again behind later arrivals (bulkhead module docs); the acceptance test of admission by calls in flight"]
fn waiter_tasks_on_threads_keep_arrival_order_across_resizes() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (mut out_of_order, mut stuck, mut skipped) = (0, 0, 0);
    const RUNS: usize = 300;
    for _ in 0..RUNS {
        runtime.block_on(async {
            let bulkhead = Bulkhead::queue("q", 0, 8).build();
            let inner = Gated::default();
            let svc = bulkhead.layer().layer(inner.clone());
            let mut tasks = Vec::new();
            for id in [1u32, 2] {
                tasks.push(tokio::spawn(svc.clone().oneshot(id)));
                while bulkhead.snapshot().queue_depth < id as usize {
                    tokio::task::yield_now().await;
                }
            }
            bulkhead.set_max_concurrent_calls(2);
            bulkhead.set_max_concurrent_calls(0);
            tokio::time::sleep(Duration::from_millis(2)).await;
            if !inner.started().is_empty() {
                skipped += 1;
            } else {
                bulkhead.set_max_concurrent_calls(1);
                let begun = std::time::Instant::now();
                while inner.started().is_empty() && begun.elapsed() < Duration::from_millis(500) {
                    tokio::task::yield_now().await;
                }
                match inner.started().first() {
                    Some(1) => {}
                    Some(_) => out_of_order += 1,
                    None => stuck += 1,
                }
            }
            bulkhead.set_max_concurrent_calls(2);
            let begun = std::time::Instant::now();
            while inner.started().len() < 2 && begun.elapsed() < Duration::from_millis(500) {
                tokio::task::yield_now().await;
            }
            for id in inner.started() {
                inner.finish(id);
            }
            for task in tasks {
                task.abort();
                let _ = task.await;
            }
        });
    }
    assert_eq!(
        (out_of_order, stuck),
        (0, 0),
        "in {RUNS} runs ({skipped} skipped): 2 started before 1 in {out_of_order}, nothing started in 500 ms in {stuck}"
    );
}

/// A waiter whose inner `call` panics when its permit comes gives the permit back, and the
/// next waiter starts; a call admitted at once whose `call` panics does too.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_inner_call_of_a_waiter_releases_its_permit() {
    quiet_panics_starting_with(PANIC_MESSAGE);
    for (kind, builder) in kinds(1) {
        let bulkhead = builder.build();
        let inner = Gated::default();
        inner.state.lock().unwrap().panic_on_call.extend([2, 4]);
        let mut svc = bulkhead.layer().layer(inner.clone());
        let mut calls: HashMap<u32, Call> = (1..=3).map(|id| (id, call(&mut svc, id))).collect();
        end(&inner, &mut calls, 1);
        let mut two = calls.remove(&2).unwrap();
        assert!(poll_call(&mut two).is_err(), "{kind}: 2's call panics");
        drop(two);
        assert!(pending(calls.get_mut(&3).unwrap()), "{kind}");
        assert_eq!(inner.started(), vec![1, 3], "{kind}");
        end(&inner, &mut calls, 3);
        let panicked = catch_unwind(AssertUnwindSafe(|| drop(svc.call(4))));
        assert!(panicked.is_err(), "{kind}");
        assert_idle(&bulkhead, 1, kind);
        assert_eq!(bulkhead.snapshot().total_permitted, 4, "{kind}");
    }
}

/// Hooks that read the snapshot and change the limit (as a controller might) neither deadlock
/// nor break the books.
#[test]
fn hooks_that_resize_and_read_the_snapshot_do_not_deadlock() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let handle: Arc<std::sync::OnceLock<Bulkhead>> = Arc::default();
        let (h1, h2, h3) = (handle.clone(), handle.clone(), handle.clone());
        let bulkhead = Bulkhead::semaphore("s", 2)
            .max_wait(Duration::from_millis(50))
            .on_call_permitted(move |_: &CallPermitted<'_>| {
                let b = h1.get().unwrap();
                let s = b.snapshot();
                assert!(s.available_concurrent_calls <= s.max_allowed_concurrent_calls);
                b.set_max_concurrent_calls(s.max_allowed_concurrent_calls.saturating_sub(1));
            })
            .on_call_finished(move |_: &CallFinished<'_>| {
                let b = h2.get().unwrap();
                let s = b.snapshot();
                b.set_max_concurrent_calls(s.max_allowed_concurrent_calls + 1);
            })
            .on_call_rejected(move |_: &tower_bulwark::bulkhead::CallRejected<'_>| {
                let b = h3.get().unwrap();
                b.set_max_concurrent_calls(2);
                let _ = b.snapshot();
            })
            .build();
        handle.set(bulkhead.clone()).unwrap();
        paused_runtime().block_on(async {
            let inner = Gated::default();
            let mut svc = bulkhead.layer().layer(inner.clone());
            let mut calls: HashMap<u32, Call> = HashMap::new();
            for id in 1..=40u32 {
                let mut fut = call(&mut svc, id);
                let _ = poll_call(&mut fut);
                calls.insert(id, fut);
                for started in inner.started() {
                    if calls.contains_key(&started) && id % 3 == 0 {
                        end(&inner, &mut calls, started);
                    }
                }
                if id % 7 == 0 {
                    tokio::time::advance(Duration::from_millis(60)).await;
                    for fut in calls.values_mut() {
                        let _ = poll_call(fut);
                    }
                }
            }
            calls.clear();
        });
        let s = bulkhead.snapshot();
        done_tx.send(s).unwrap();
    });
    let s = done_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("deadlock: hooks that resize did not finish");
    assert_eq!(
        s.available_concurrent_calls, s.max_allowed_concurrent_calls,
        "{s:?}"
    );
    assert_eq!(s.queue_depth, 0, "{s:?}");
    assert_eq!(s.total_permitted, s.total_finished, "{s:?}");
}

// ---------------------------------------------------------------------------------------------
// A random model: every step checked against a plain FIFO.

#[derive(Clone, Copy, Debug)]
enum EndHow {
    Respond,
    Fail,
    Panic,
    Drop,
}

#[derive(Clone, Debug)]
enum Op {
    Call,
    /// Polls the n-th waiter (modulo the number waiting); in forward-only runs, the first n+1.
    Poll(usize),
    /// Polls every waiter, oldest first or newest first.
    PollAll {
        newest_first: bool,
    },
    /// Ends the n-th running call.
    End(usize, EndHow),
    /// Drops the n-th waiter.
    Leave(usize),
    Resize(usize),
    Advance(u64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Polling {
    /// After every step, every waiter is polled, oldest first; no other poll.
    AfterEachOldestFirst,
    /// Explicit polls, only ever of a prefix of the line, oldest first.
    PrefixOnly,
    /// Any poll, in any order.
    Any,
}

#[derive(Clone, Debug)]
struct Setup {
    queue: bool,
    limit: usize,
    capacity: usize,
    max_wait_ms: Option<u64>,
}

fn setup() -> impl Strategy<Value = Setup> {
    prop_oneof![
        (0usize..4, prop_oneof![Just(40u64), Just(200u64)]).prop_map(|(limit, wait)| Setup {
            queue: false,
            limit,
            capacity: 0,
            max_wait_ms: Some(wait),
        }),
        (
            0usize..4,
            0usize..5,
            prop_oneof![Just(None), Just(Some(0u64)), Just(Some(60u64))]
        )
            .prop_map(|(limit, capacity, max_wait_ms)| Setup {
                queue: true,
                limit,
                capacity,
                max_wait_ms,
            }),
    ]
}

fn ops(resizes: bool) -> impl Strategy<Value = Vec<Op>> {
    let resize_weight = if resizes { 3 } else { 0 };
    let end_how = prop_oneof![
        4 => Just(EndHow::Respond),
        1 => Just(EndHow::Fail),
        1 => Just(EndHow::Panic),
        2 => Just(EndHow::Drop),
    ];
    let op = prop_oneof![
        5 => Just(Op::Call),
        3 => (0usize..6).prop_map(Op::Poll),
        2 => any::<bool>().prop_map(|newest_first| Op::PollAll { newest_first }),
        4 => ((0usize..6), end_how).prop_map(|(n, how)| Op::End(n, how)),
        2 => (0usize..6).prop_map(Op::Leave),
        resize_weight => (0usize..5).prop_map(Op::Resize),
        1 => prop_oneof![Just(10u64), Just(30u64), Just(100u64)].prop_map(Op::Advance),
    ];
    proptest::collection::vec(op, 1..60)
}

/// What the docs say, as a plain FIFO: calls in flight, the line in arrival order, the limit.
/// The waiter at place `p` may start when `p < limit - in flight`.
struct Model {
    limit: usize,
    running: Vec<u32>,
    /// (id, arrival in ms)
    line: Vec<(u32, u64)>,
    now: u64,
    started: u64,
    ended: u64,
}

impl Model {
    fn room(&self) -> usize {
        self.limit.saturating_sub(self.running.len())
    }
}

struct World {
    setup: Setup,
    bulkhead: Bulkhead,
    inner: Gated,
    svc: Svc,
    calls: HashMap<u32, Call>,
    model: Model,
    next: u32,
    permitted_hook: Arc<AtomicU64>,
    finished_hook: Arc<AtomicU64>,
    log: Vec<String>,
}

impl World {
    fn new(setup: Setup) -> Self {
        let permitted_hook = Arc::new(AtomicU64::new(0));
        let finished_hook = Arc::new(AtomicU64::new(0));
        let mut builder = if setup.queue {
            Bulkhead::queue("model", setup.limit, setup.capacity)
        } else {
            Bulkhead::semaphore("model", setup.limit)
        };
        if let Some(ms) = setup.max_wait_ms {
            builder = builder.max_wait(Duration::from_millis(ms));
        }
        let (p, f) = (permitted_hook.clone(), finished_hook.clone());
        let bulkhead = builder
            .on_call_permitted(move |_: &CallPermitted<'_>| {
                p.fetch_add(1, Ordering::SeqCst);
            })
            .on_call_finished(move |_: &CallFinished<'_>| {
                f.fetch_add(1, Ordering::SeqCst);
            })
            .build();
        let inner = Gated::default();
        let svc = bulkhead.layer().layer(inner.clone());
        World {
            model: Model {
                limit: setup.limit,
                running: Vec::new(),
                line: Vec::new(),
                now: 0,
                started: 0,
                ended: 0,
            },
            setup,
            bulkhead,
            inner,
            svc,
            calls: HashMap::new(),
            next: 1,
            permitted_hook,
            finished_hook,
            log: Vec::new(),
        }
    }

    fn may_wait(&self) -> bool {
        match (self.setup.queue, self.setup.max_wait_ms) {
            (_, Some(0)) => false,
            (false, _) => true,
            (true, _) => self.model.line.len() < self.setup.capacity,
        }
    }

    fn fail(&self, what: String) -> TestCaseError {
        TestCaseError::fail(format!(
            "{what}\n  setup {:?}\n  steps:\n    {}\n  model: limit {} running {:?} line {:?} now {}\n  snapshot {:?}\n  started {:?}",
            self.setup,
            self.log.join("\n    "),
            self.model.limit,
            self.model.running,
            self.model.line,
            self.model.now,
            self.bulkhead.snapshot(),
            self.inner.started(),
        ))
    }

    fn call(&mut self) -> Result<(), TestCaseError> {
        let id = self.next;
        self.next += 1;
        let before = self.bulkhead.snapshot();
        let mut fut = call(&mut self.svc, id);
        let after = self.bulkhead.snapshot();
        let started = self.inner.has_started(id);
        let queued = after.queue_depth == before.queue_depth + 1;
        let refused = after.total_rejected == before.total_rejected + 1;
        self.log.push(format!("call {id}"));
        let room = self.model.room();
        if started {
            if self.model.running.len() >= self.model.limit {
                return Err(self.fail(format!(
                    "LIMIT: call {id} started with {} in flight, limit {}",
                    self.model.running.len(),
                    self.model.limit
                )));
            }
            if room <= self.model.line.len() {
                return Err(self.fail(format!(
                    "FIFO: new call {id} started ahead of waiters {:?}",
                    self.model.line
                )));
            }
            self.model.running.push(id);
            self.model.started += 1;
            self.calls.insert(id, fut);
        } else if room > self.model.line.len() {
            return Err(self.fail(format!(
                "new call {id} did not start though room {room} > line {}",
                self.model.line.len()
            )));
        } else if self.may_wait() {
            if !queued {
                return Err(self.fail(format!(
                    "call {id} should wait (queued {queued} refused {refused})"
                )));
            }
            self.model.line.push((id, self.model.now));
            self.calls.insert(id, fut);
        } else {
            if !refused {
                return Err(self.fail(format!("call {id} should be refused at once")));
            }
            match poll_call(&mut fut) {
                Ok(Poll::Ready(Err(e))) if e.is::<BulkheadFull>() => {}
                _ => {
                    return Err(
                        self.fail(format!("refused call {id} did not fail with BulkheadFull"))
                    )
                }
            }
        }
        Ok(())
    }

    /// Polls the waiter at `place` in the line and checks what happened.
    fn poll_waiter(&mut self, place: usize) -> Result<(), TestCaseError> {
        let (id, arrived) = self.model.line[place];
        let fut = self.calls.get_mut(&id).unwrap();
        let verdict = poll_call(fut);
        let started = self.inner.has_started(id);
        self.log.push(format!("poll {id}"));
        let grantable = place < self.model.room();
        let expired = self
            .setup
            .max_wait_ms
            .is_some_and(|w| self.model.now >= arrived + w);
        match verdict {
            Err(()) => return Err(self.fail(format!("poll of waiter {id} panicked"))),
            Ok(Poll::Pending) if started => {
                if self.model.running.len() >= self.model.limit {
                    return Err(self.fail(format!(
                        "LIMIT: waiter {id} started with {} in flight, limit {}",
                        self.model.running.len(),
                        self.model.limit
                    )));
                }
                if !grantable {
                    return Err(self.fail(format!(
                        "FIFO: waiter {id} at place {place} started, room {}",
                        self.model.room()
                    )));
                }
                self.model.line.remove(place);
                self.model.running.push(id);
                self.model.started += 1;
            }
            Ok(Poll::Pending) => {
                if grantable {
                    return Err(self.fail(format!(
                        "FIFO: waiter {id} at place {place} did not start, room {}",
                        self.model.room()
                    )));
                }
                if expired {
                    return Err(self.fail(format!(
                        "MAX_WAIT: waiter {id} still waits {} ms after arrival",
                        self.model.now - arrived
                    )));
                }
            }
            Ok(Poll::Ready(Err(e))) if e.is::<BulkheadFull>() && !started => {
                if grantable {
                    return Err(self.fail(format!(
                        "waiter {id} at place {place} refused though room {}",
                        self.model.room()
                    )));
                }
                if !expired {
                    return Err(self.fail(format!(
                        "MAX_WAIT: waiter {id} refused after {} ms",
                        self.model.now - arrived
                    )));
                }
                self.model.line.remove(place);
                self.calls.remove(&id);
            }
            Ok(other) => {
                return Err(self.fail(format!(
                    "waiter {id}: unexpected {:?}",
                    other.map(|r| r.map_err(|e| e.to_string()))
                )))
            }
        }
        Ok(())
    }

    fn poll_all(&mut self, newest_first: bool) -> Result<(), TestCaseError> {
        let ids: Vec<u32> = self.model.line.iter().map(|(id, _)| *id).collect();
        let order: Vec<u32> = if newest_first {
            ids.into_iter().rev().collect()
        } else {
            ids
        };
        for id in order {
            if let Some(place) = self.model.line.iter().position(|(w, _)| *w == id) {
                self.poll_waiter(place)?;
            }
        }
        Ok(())
    }

    fn end(&mut self, n: usize, how: EndHow) -> Result<(), TestCaseError> {
        if self.model.running.is_empty() {
            return Ok(());
        }
        let id = self.model.running.remove(n % self.model.running.len());
        self.log.push(format!("end {id} {how:?}"));
        let mut fut = self.calls.remove(&id).unwrap();
        let verdict = match how {
            EndHow::Respond => {
                self.inner.open(id, Gate::Ok);
                matches!(poll_call(&mut fut), Ok(Poll::Ready(Ok(got))) if got == id)
            }
            EndHow::Fail => {
                self.inner.open(id, Gate::Err);
                matches!(poll_call(&mut fut), Ok(Poll::Ready(Err(e))) if e.is::<io::Error>())
            }
            EndHow::Panic => {
                self.inner.open(id, Gate::Panic);
                poll_call(&mut fut).is_err()
            }
            EndHow::Drop => true,
        };
        drop(fut);
        self.model.ended += 1;
        if !verdict {
            return Err(self.fail(format!("call {id} did not end as {how:?}")));
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let s = self.bulkhead.snapshot();
        let m = &self.model;
        let problems = [
            (
                s.max_allowed_concurrent_calls != m.limit,
                "max_allowed != limit",
            ),
            (
                s.available_concurrent_calls > s.max_allowed_concurrent_calls,
                "SNAPSHOT: available > max",
            ),
            (
                s.available_concurrent_calls > m.room(),
                "SNAPSHOT: available > limit - in flight",
            ),
            (
                m.line.is_empty() && s.available_concurrent_calls != m.room(),
                "SNAPSHOT: no waiter, available != limit - in flight",
            ),
            (
                s.queue_depth != m.line.len(),
                "SNAPSHOT: queue_depth != waiters",
            ),
            (
                s.total_permitted != m.started,
                "total_permitted != calls started",
            ),
            (s.total_finished != m.ended, "total_finished != calls ended"),
            (
                self.permitted_hook.load(Ordering::SeqCst) != m.started,
                "permitted hook count != calls started",
            ),
            (
                self.finished_hook.load(Ordering::SeqCst) != m.ended,
                "finished hook count != calls ended",
            ),
            (
                self.inner.live.load(Ordering::SeqCst) != m.running.len(),
                "live inner calls != running",
            ),
        ];
        for (bad, what) in problems {
            if bad {
                return Err(self.fail(what.to_string()));
            }
        }
        Ok(())
    }

    async fn step(&mut self, op: &Op, polling: Polling) -> Result<(), TestCaseError> {
        match *op {
            Op::Call => self.call()?,
            Op::Poll(n) if polling != Polling::AfterEachOldestFirst => {
                if !self.model.line.is_empty() {
                    if polling == Polling::PrefixOnly {
                        let k = (n % self.model.line.len()) + 1;
                        let ids: Vec<u32> =
                            self.model.line.iter().take(k).map(|(id, _)| *id).collect();
                        for id in ids {
                            if let Some(place) = self.model.line.iter().position(|(w, _)| *w == id)
                            {
                                self.poll_waiter(place)?;
                            }
                        }
                    } else {
                        self.poll_waiter(n % self.model.line.len())?;
                    }
                }
            }
            Op::PollAll { newest_first } if polling != Polling::AfterEachOldestFirst => {
                self.poll_all(newest_first && polling == Polling::Any)?
            }
            Op::Poll(_) | Op::PollAll { .. } => {}
            Op::End(n, how) => self.end(n, how)?,
            Op::Leave(n) => {
                if !self.model.line.is_empty() {
                    let (id, _) = self.model.line.remove(n % self.model.line.len());
                    self.log.push(format!("leave {id}"));
                    drop(self.calls.remove(&id));
                }
            }
            Op::Resize(n) => {
                self.log.push(format!("resize {n}"));
                self.bulkhead.set_max_concurrent_calls(n);
                self.model.limit = n;
            }
            Op::Advance(ms) => {
                self.log.push(format!("advance {ms} ms"));
                tokio::time::advance(Duration::from_millis(ms)).await;
                self.model.now += ms;
            }
        }
        if polling == Polling::AfterEachOldestFirst {
            self.poll_all(false)?;
        }
        self.check()
    }

    fn finish(mut self) -> Result<(), TestCaseError> {
        let limit = self.model.limit;
        self.calls.clear();
        self.model.ended += self.model.running.len() as u64;
        self.model.running.clear();
        self.model.line.clear();
        let s = self.bulkhead.snapshot();
        if s.available_concurrent_calls != limit || s.queue_depth != 0 {
            return Err(self.fail("END: not idle after everything was dropped".into()));
        }
        self.check()
    }
}

fn run_model(setup: Setup, ops: Vec<Op>, polling: Polling) -> Result<(), TestCaseError> {
    quiet_panics_starting_with(PANIC_MESSAGE);
    paused_runtime().block_on(async move {
        let mut world = World::new(setup);
        for op in &ops {
            world.step(op, polling).await?;
        }
        world.finish()
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// No resize: any poll order, every end and drop, time passing.
    #[test]
    fn model_fifo_limit_release_and_max_wait_without_resizes(
        setup in setup(),
        ops in ops(false),
    ) {
        run_model(setup, ops, Polling::Any)?;
    }

    /// Resizes, with every waiter polled oldest first after each step.
    #[test]
    fn model_with_resizes_polled_oldest_first_after_each_step(
        setup in setup(),
        ops in ops(true),
    ) {
        run_model(setup, ops, Polling::AfterEachOldestFirst)?;
    }

    /// Resizes, explicit polls of a prefix of the line only (never a later waiter before an
    /// earlier one), waiters left unpolled and dropped at any point.
    #[test]
    #[ignore = "not promised: across a lowered limit a waiter whose permit pays the lower limit waits again behind later arrivals (bulkhead module docs); the acceptance test of admission by calls in flight"]
    fn model_with_resizes_prefix_polls(
        setup in setup(),
        ops in ops(true),
    ) {
        run_model(setup, ops, Polling::PrefixOnly)?;
    }

    /// Resizes and polls in any order.
    #[test]
    #[ignore = "not promised: across a lowered limit a waiter whose permit pays the lower limit waits again behind later arrivals (bulkhead module docs); the acceptance test of admission by calls in flight"]
    fn model_with_resizes_any_poll_order(
        setup in setup(),
        ops in ops(true),
    ) {
        run_model(setup, ops, Polling::Any)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Storms on a multi-thread runtime.

/// The limits set, in order, with the number of the last set announced and the last returned.
struct Limits {
    values: Vec<AtomicUsize>,
    announced: AtomicUsize,
    returned: AtomicUsize,
}

impl Limits {
    /// The highest limit among the sets from `from` to the last announced.
    fn bound(&self, from: usize) -> usize {
        let to = self.announced.load(Ordering::SeqCst);
        (from..=to)
            .map(|i| self.values[i].load(Ordering::SeqCst))
            .max()
            .unwrap()
    }
}

/// A request: how long the inner call lasts (in yields) and the last set returned before the
/// call was made.
#[derive(Clone, Copy)]
struct Req {
    yields: u32,
    fail: bool,
    since_set: usize,
}

#[derive(Clone)]
struct Counting {
    live: Arc<AtomicUsize>,
    limits: Arc<Limits>,
    over: Arc<Mutex<Vec<String>>>,
}

impl Service<Req> for Counting {
    type Response = ();
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<(), io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let now = self.live.fetch_add(1, Ordering::SeqCst) + 1;
        let bound = self.limits.bound(req.since_set);
        if now > bound {
            self.over.lock().unwrap().push(format!(
                "{now} in flight, limits since the call was made at most {bound}"
            ));
        }
        let mut live = Live(self.live.clone(), false);
        Box::pin(async move {
            for _ in 0..req.yields {
                tokio::task::yield_now().await;
            }
            live.done();
            if req.fail {
                Err(io::Error::other("failed"))
            } else {
                Ok(())
            }
        })
    }
}

fn storm(builder: BulkheadBuilder, seed: u64) {
    const MAX_SETS: usize = 400_000;
    const CLIENTS: usize = 16;
    const CALLS_EACH: usize = 20_000;
    const FOR: Duration = Duration::from_millis(1500);
    let began = std::time::Instant::now();
    let permitted = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicU64::new(0));
    let (p, f) = (permitted.clone(), finished.clone());
    let bulkhead = builder
        .on_call_permitted(move |_: &CallPermitted<'_>| {
            p.fetch_add(1, Ordering::SeqCst);
        })
        .on_call_finished(move |_: &CallFinished<'_>| {
            f.fetch_add(1, Ordering::SeqCst);
        })
        .build();
    let first = bulkhead.snapshot().max_allowed_concurrent_calls;
    let limits = Arc::new(Limits {
        values: (0..=MAX_SETS + 1).map(|_| AtomicUsize::new(0)).collect(),
        announced: AtomicUsize::new(0),
        returned: AtomicUsize::new(0),
    });
    limits.values[0].store(first, Ordering::SeqCst);
    let inner = Counting {
        live: Arc::new(AtomicUsize::new(0)),
        limits: limits.clone(),
        over: Arc::new(Mutex::new(Vec::new())),
    };
    let svc = bulkhead.layer().layer(inner.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let clients_done = Arc::new(AtomicBool::new(false));
    let bad_snapshots = Arc::new(Mutex::new(Vec::new()));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();

    // Resizes from another thread while the clients run, and a snapshot reader.
    let resizer = {
        let (bulkhead, limits, done) = (bulkhead.clone(), limits.clone(), clients_done.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(seed | 1);
            let mut i = 0;
            while i < MAX_SETS && !done.load(Ordering::SeqCst) {
                i += 1;
                let limit = rng.pick(&[0, 1, 1, 2, 3, 5, 8]);
                limits.values[i].store(limit, Ordering::SeqCst);
                limits.announced.store(i, Ordering::SeqCst);
                bulkhead.set_max_concurrent_calls(limit);
                limits.returned.store(i, Ordering::SeqCst);
                for _ in 0..rng.below(2000) {
                    std::hint::spin_loop();
                }
                if rng.below(4) == 0 {
                    std::thread::yield_now();
                }
            }
            // Last: a limit of 3.
            limits.values[i + 1].store(3, Ordering::SeqCst);
            limits.announced.store(i + 1, Ordering::SeqCst);
            bulkhead.set_max_concurrent_calls(3);
            limits.returned.store(i + 1, Ordering::SeqCst);
            i
        })
    };
    let reader = {
        let (bulkhead, stop, bad) = (bulkhead.clone(), stop.clone(), bad_snapshots.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let s = bulkhead.snapshot();
                if s.available_concurrent_calls > s.max_allowed_concurrent_calls {
                    bad.lock().unwrap().push(format!("{s:?}"));
                }
                std::thread::yield_now();
            }
        })
    };

    let outcome = runtime.block_on(async {
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let svc = svc.clone();
            let limits = limits.clone();
            clients.push(tokio::spawn(async move {
                let mut rng = Rng((seed ^ (c as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
                for _ in 0..CALLS_EACH {
                    if began.elapsed() > FOR {
                        break;
                    }
                    let req = Req {
                        yields: rng.below(6) as u32,
                        fail: rng.below(5) == 0,
                        since_set: limits.returned.load(Ordering::SeqCst),
                    };
                    let cut = Duration::from_micros(rng.below(1500));
                    let call = svc.clone().oneshot(req);
                    match rng.below(3) {
                        // Cut by a timeout: dropped waiting, handed a permit or running.
                        0 => drop(tokio::time::timeout(cut, call).await),
                        // Dropped after a few polls.
                        1 => {
                            let mut call = Box::pin(call);
                            for _ in 0..rng.below(4) {
                                if futures::poll!(call.as_mut()).is_ready() {
                                    break;
                                }
                                tokio::task::yield_now().await;
                            }
                            drop(call);
                        }
                        _ => drop(tokio::time::timeout(Duration::from_millis(20), call).await),
                    }
                }
            }));
        }
        let all = futures::future::join_all(clients);
        let joined = tokio::time::timeout(Duration::from_secs(5), all).await;
        clients_done.store(true, Ordering::SeqCst);
        let sets = resizer.join().unwrap();
        let s = bulkhead.snapshot();
        eprintln!(
            "storm {seed:#x}: {sets} resizes, {} permitted, {} refused",
            s.total_permitted, s.total_rejected
        );
        if joined.is_err() {
            return Err("clients did not finish".to_string());
        }
        for j in joined.unwrap() {
            j.map_err(|e| format!("client panicked: {e}"))?;
        }
        // With the storm over and the limit at 3, calls without timeouts all get through.
        let tail: Vec<_> = (0..24)
            .map(|_| {
                let svc = svc.clone();
                let since_set = limits.returned.load(Ordering::SeqCst);
                tokio::spawn(svc.oneshot(Req {
                    yields: 2,
                    fail: false,
                    since_set,
                }))
            })
            .collect();
        let tail = tokio::time::timeout(Duration::from_secs(2), futures::future::join_all(tail))
            .await
            .map_err(|_| {
                format!(
                    "calls after the storm hang; snapshot {:?}",
                    bulkhead.snapshot()
                )
            })?;
        for t in tail {
            let result = t.map_err(|e| e.to_string())?;
            if let Err(e) = result {
                if !e.is::<BulkheadFull>() {
                    return Err(format!("tail call failed: {e}"));
                }
            }
        }
        Ok(())
    });
    stop.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    drop(runtime);
    outcome.unwrap();
    let over = inner.over.lock().unwrap();
    assert!(
        over.is_empty(),
        "limit exceeded {} times, e.g. {:?}",
        over.len(),
        &over[..over.len().min(3)]
    );
    let bad = bad_snapshots.lock().unwrap();
    assert!(
        bad.is_empty(),
        "snapshots with available > max: {:?}",
        &bad[..bad.len().min(3)]
    );
    let s = bulkhead.snapshot();
    assert_eq!(s.max_allowed_concurrent_calls, 3);
    assert_eq!(s.available_concurrent_calls, 3, "{s:?}");
    assert_eq!(s.queue_depth, 0, "{s:?}");
    assert_eq!(s.total_permitted, s.total_finished, "{s:?}");
    assert_eq!(
        permitted.load(Ordering::SeqCst),
        finished.load(Ordering::SeqCst)
    );
    assert_eq!(permitted.load(Ordering::SeqCst), s.total_permitted);
    assert_eq!(inner.live.load(Ordering::SeqCst), 0);
}

#[test]
fn resize_storm_on_a_queue_keeps_the_limit_and_releases_each_permit_once() {
    for seed in [0x5EED_0001, 0xC0FF_EE02] {
        storm(Bulkhead::queue("storm-q", 2, 8), seed);
    }
}

#[test]
fn resize_storm_on_a_semaphore_keeps_the_limit_and_releases_each_permit_once() {
    for seed in [0xBEEF_0003, 0xFACE_0004] {
        storm(
            Bulkhead::semaphore("storm-s", 2).max_wait(Duration::from_micros(800)),
            seed,
        );
    }
}
