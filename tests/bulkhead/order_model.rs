//! The bulkheads against a plain FIFO model: random calls, polls, ends, drops, resizes and time,
//! every step checked against what the docs promise.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use proptest::prelude::*;
use tower::Layer;
use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull};

use crate::common::paused_runtime;
use crate::common::process::quiet_panics_starting_with;

use super::order_support::*;

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

    /// The waiters handed a permit: the first `room` of the line, which start when polled.
    fn handed(&self) -> usize {
        self.room().min(self.line.len())
    }

    /// The waiters still waiting: a waiter handed a permit has left the queue, though it starts
    /// only when polled.
    fn queued(&self) -> usize {
        self.line.len() - self.handed()
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
        let bulkhead = counting_calls(builder, &permitted_hook, &finished_hook);
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
            (true, _) => self.model.queued() < self.setup.capacity,
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

    /// Whether the wait of the waiter at `place` has ended, and the millisecond its timer may
    /// take after it.
    fn ended(&self, place: usize) -> bool {
        let (_, arrived) = self.model.line[place];
        self.setup
            .max_wait_ms
            .is_some_and(|w| self.model.now > arrived + w)
    }

    /// The waiter at `place`, its wait ended and its future not polled since, is shed: it
    /// leaves the line and, polled, is refused.
    fn shed(&mut self, place: usize) -> Result<(), TestCaseError> {
        let (id, _) = self.model.line.remove(place);
        self.log.push(format!("(shed {id})"));
        let mut fut = self.calls.remove(&id).unwrap();
        match poll_call(&mut fut) {
            Ok(Poll::Ready(Err(e))) if e.is::<BulkheadFull>() => Ok(()),
            _ => Err(self.fail(format!("shed waiter {id} was not refused"))),
        }
    }

    /// Permits came back: those that would go to waiters whose wait has ended (the waiters
    /// from `from`, the handed ones before) pass them, which are shed.
    fn shed_passed(&mut self, from: usize) -> Result<(), TestCaseError> {
        let mut place = from;
        while place < self.model.handed() {
            if self.ended(place) {
                self.shed(place)?;
            } else {
                place += 1;
            }
        }
        Ok(())
    }

    fn call(&mut self) -> Result<(), TestCaseError> {
        // A full queue sheds the waiters at its front whose wait has ended.
        let capacity = self.setup.queue.then_some(self.setup.capacity);
        while capacity.is_some_and(|c| self.model.queued() >= c)
            && self.model.handed() < self.model.line.len()
            && self.ended(self.model.handed())
        {
            self.shed(self.model.handed())?;
        }
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
        let handed = self.model.handed();
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
        self.shed_passed(handed)
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
                s.queue_depth != m.queued(),
                "SNAPSHOT: queue_depth != waiters not handed a permit",
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
                    let handed = self.model.handed();
                    let place = n % self.model.line.len();
                    let (id, _) = self.model.line.remove(place);
                    self.log.push(format!("leave {id}"));
                    drop(self.calls.remove(&id));
                    // A waiter handed a permit passes it on as a call that ends does.
                    if place < handed {
                        self.shed_passed(handed - 1)?;
                    }
                }
            }
            Op::Resize(n) => {
                self.log.push(format!("resize {n}"));
                let handed = self.model.handed();
                self.bulkhead.set_max_concurrent_calls(n);
                self.model.limit = n;
                self.shed_passed(handed)?;
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

    /// Resizes, with explicit polls: of a prefix of the line only (never a later waiter before
    /// an earlier one), waiters left unpolled and dropped at any point; then the same steps
    /// with polls in any order.
    #[test]
    fn model_with_resizes_prefix_polls_then_any_poll_order(
        setup in setup(),
        ops in ops(true),
    ) {
        run_model(setup.clone(), ops.clone(), Polling::PrefixOnly)?;
        run_model(setup, ops, Polling::Any)?;
    }
}
