//! What the attacks on the bulkheads' order, limit and release share: a gated inner service that
//! counts the calls inside it, and the calls driven by hand.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::ops::RangeInclusive;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;
use tower::{Layer, Service};
use tower_bulwark::bulkhead::{
    Bulkhead, BulkheadBuilder, BulkheadService, CallFinished, CallPermitted, ResponseFuture,
};
use tower_bulwark::BoxError;

use crate::common::poll_once;

/// What a planned panic of the inner service says.
pub(crate) const PANIC_MESSAGE: &str = "attack_order: planned panic";

// ---------------------------------------------------------------------------------------------
// A gated inner service (also `behaviour.rs`'s), which also counts the calls inside it.

pub(crate) enum Gate {
    Ok,
    Err,
    Panic,
}

#[derive(Clone, Default)]
pub(crate) struct Gated {
    pub(crate) state: Arc<Mutex<GatedState>>,
    /// Inner calls started and neither completed nor dropped.
    pub(crate) live: Arc<AtomicUsize>,
}

#[derive(Default)]
pub(crate) struct GatedState {
    pub(crate) started: Vec<u32>,
    pub(crate) gates: HashMap<u32, oneshot::Sender<Gate>>,
    /// Calls whose `call` panics.
    pub(crate) panic_on_call: Vec<u32>,
    /// How many times `poll_ready` was called.
    pub(crate) polled_ready: usize,
}

/// Counts one live inner call; lowered when the inner future completes or is dropped.
pub(crate) struct Live(pub(crate) Arc<AtomicUsize>, pub(crate) bool);

impl Live {
    pub(crate) fn done(&mut self) {
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
    pub(crate) fn started(&self) -> Vec<u32> {
        self.state.lock().unwrap().started.clone()
    }

    pub(crate) fn has_started(&self, id: u32) -> bool {
        self.state.lock().unwrap().started.contains(&id)
    }

    pub(crate) fn open(&self, id: u32, gate: Gate) {
        let tx = self
            .state
            .lock()
            .unwrap()
            .gates
            .remove(&id)
            .expect("call started");
        let _ = tx.send(gate);
    }

    pub(crate) fn finish(&self, id: u32) {
        self.open(id, Gate::Ok);
    }

    pub(crate) fn fail(&self, id: u32) {
        self.open(id, Gate::Err);
    }
}

impl Service<u32> for Gated {
    type Response = u32;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<u32, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), io::Error>> {
        self.state.lock().unwrap().polled_ready += 1;
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

pub(crate) type Svc = BulkheadService<Gated>;
pub(crate) type Call = Pin<Box<ResponseFuture<Gated, u32>>>;

pub(crate) fn call(svc: &mut Svc, id: u32) -> Call {
    Box::pin(svc.call(id))
}

/// `builder` built around a fresh gated service: the bulkhead, the gated service, and the
/// bulkhead's service around it.
pub(crate) fn gated(builder: BulkheadBuilder) -> (Bulkhead, Gated, Svc) {
    let bulkhead = builder.build();
    let inner = Gated::default();
    let svc = bulkhead.layer().layer(inner.clone());
    (bulkhead, inner, svc)
}

/// The calls `ids` made through `svc` in that order (none polled yet), by id.
pub(crate) fn calls_of(svc: &mut Svc, ids: RangeInclusive<u32>) -> HashMap<u32, Call> {
    ids.map(|id| (id, call(svc, id))).collect()
}

/// Polls the calls `ids` in that order and asserts that each is still pending.
#[track_caller]
pub(crate) fn assert_pending(
    calls: &mut HashMap<u32, Call>,
    ids: impl IntoIterator<Item = u32>,
    what: &str,
) {
    for id in ids {
        assert!(pending(calls.get_mut(&id).unwrap()), "{what} (call {id})");
    }
}

/// Polls once with a waker that does nothing; `Err` if the poll panicked.
pub(crate) fn poll_call(call: &mut Call) -> Result<Poll<Result<u32, BoxError>>, ()> {
    catch_unwind(AssertUnwindSafe(|| poll_once(call.as_mut()))).map_err(|_| ())
}

pub(crate) fn pending(call: &mut Call) -> bool {
    matches!(poll_call(call), Ok(Poll::Pending))
}

/// Both kinds, built with `limit`: a queue of 16 places, and a semaphore whose callers may wait.
pub(crate) fn kinds(limit: usize) -> [(&'static str, BulkheadBuilder); 2] {
    [
        ("queue", Bulkhead::queue("q", limit, 16)),
        (
            "semaphore",
            Bulkhead::semaphore("s", limit).max_wait(Duration::from_secs(600)),
        ),
    ]
}

/// A bulkhead of one kind around a fresh [`Gated`] service, driven by hand: its service, and the
/// calls made through it that have not ended, by id.
pub(crate) struct Scenario {
    /// The kind, `queue` or `semaphore`, which every message names.
    pub(crate) kind: &'static str,
    pub(crate) bulkhead: Bulkhead,
    pub(crate) inner: Gated,
    pub(crate) svc: Svc,
    pub(crate) calls: HashMap<u32, Call>,
}

impl Scenario {
    /// `builder`, of the kind `kind`, built around a fresh gated service, with the calls `ids`
    /// made through it in that order (none polled yet).
    pub(crate) fn new(
        kind: &'static str,
        builder: BulkheadBuilder,
        ids: RangeInclusive<u32>,
    ) -> Self {
        let (bulkhead, inner, mut svc) = gated(builder);
        let calls = calls_of(&mut svc, ids);
        Self {
            kind,
            bulkhead,
            inner,
            svc,
            calls,
        }
    }

    /// A scenario of each of the two [`kinds`] with `limit`, the calls `ids` made in each.
    pub(crate) fn both_kinds(limit: usize, ids: RangeInclusive<u32>) -> impl Iterator<Item = Self> {
        kinds(limit)
            .into_iter()
            .map(move |(kind, builder)| Self::new(kind, builder, ids.clone()))
    }

    /// Ends the running calls `ids` in turn, each with its response ([`end`]).
    #[track_caller]
    pub(crate) fn end(&mut self, ids: impl IntoIterator<Item = u32>) {
        for id in ids {
            end(&self.inner, &mut self.calls, id);
        }
    }

    /// Sets the bulkhead's limit to `limit`.
    pub(crate) fn set_limit(&self, limit: usize) {
        self.bulkhead.set_max_concurrent_calls(limit);
    }

    /// Polls the calls `ids` in that order and asserts that each is still pending.
    #[track_caller]
    pub(crate) fn assert_pending(&mut self, ids: impl IntoIterator<Item = u32>) {
        assert_pending(&mut self.calls, ids, self.kind);
    }

    /// Sets the limit to `limit`, then polls the calls `ids` in that order, each of which must
    /// still be pending.
    #[track_caller]
    pub(crate) fn limit_then_poll(&mut self, limit: usize, ids: impl IntoIterator<Item = u32>) {
        self.set_limit(limit);
        self.assert_pending(ids);
    }

    /// Ends the running calls `ends` in turn, then polls the calls `ids` in that order, each of
    /// which must still be pending.
    #[track_caller]
    pub(crate) fn end_then_poll(
        &mut self,
        ends: impl IntoIterator<Item = u32>,
        ids: impl IntoIterator<Item = u32>,
    ) {
        self.end(ends);
        self.assert_pending(ids);
    }

    /// Asserts that the calls that reached the inner service are `ids`, in that order; `why`
    /// says what it means.
    #[track_caller]
    pub(crate) fn assert_started(&self, ids: &[u32], why: &str) {
        assert_eq!(self.inner.started(), ids, "{}: {why}", self.kind);
    }

    /// Ends the calls `ids` in turn, after each polling the later ones (each still pending, the
    /// next one starting), then asserts that the bulkhead is idle at `limit` ([`assert_idle`]).
    #[track_caller]
    pub(crate) fn end_in_turn_then_idle(&mut self, ids: &[u32], limit: usize) {
        for (i, &id) in ids.iter().enumerate() {
            self.end([id]);
            self.assert_pending(ids[i + 1..].iter().copied());
        }
        assert_idle(&self.bulkhead, limit, self.kind);
    }
}

/// Ends a running call with a response and drives its future to the end.
#[track_caller]
pub(crate) fn end(inner: &Gated, calls: &mut HashMap<u32, Call>, id: u32) {
    inner.finish(id);
    let mut fut = calls.remove(&id).unwrap();
    match poll_call(&mut fut) {
        Ok(Poll::Ready(Ok(got))) => assert_eq!(got, id),
        _ => panic!("call {id} did not end with its response"),
    }
}

/// Asserts that `bulkhead` is idle at `limit`: that limit, every permit free, nobody waiting,
/// and every call permitted finished.
#[track_caller]
pub(crate) fn assert_idle(bulkhead: &Bulkhead, limit: usize, what: &str) {
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.max_allowed_concurrent_calls, limit, "{what}");
    assert_eq!(snapshot.available_concurrent_calls, limit, "{what}");
    assert_eq!(snapshot.queue_depth, 0, "{what}");
    assert_eq!(snapshot.total_permitted, snapshot.total_finished, "{what}");
}

/// `builder` built with hooks that count the calls permitted in `permitted` and the calls
/// finished in `finished`.
pub(crate) fn counting_calls(
    builder: BulkheadBuilder,
    permitted: &Arc<AtomicU64>,
    finished: &Arc<AtomicU64>,
) -> Bulkhead {
    let (p, f) = (permitted.clone(), finished.clone());
    builder
        .on_call_permitted(move |_: &CallPermitted<'_>| {
            p.fetch_add(1, Ordering::SeqCst);
        })
        .on_call_finished(move |_: &CallFinished<'_>| {
            f.fetch_add(1, Ordering::SeqCst);
        })
        .build()
}
