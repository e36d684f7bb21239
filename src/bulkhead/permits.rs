//! The permits of one bulkhead, shared by every clone: the free permits, the calls waiting for
//! one in arrival order, and an excess for a limit lowered below the calls in flight, all under
//! one lock.
//!
//! A permit that comes back retires the excess if any remains, and otherwise is handed to the
//! first waiter not yet handed one (which is woken and takes it when polled), or is free. The
//! waiters handed a permit are the front of the queue; the queue's depth counts the others, so a
//! call handed a permit no longer takes a place that a new call could have. Lowering the limit
//! takes the free permits, then the permits handed to waiters that have not taken them (the
//! latest first: they wait again in their place), and owes the rest. A waiter still in the
//! queue a millisecond after its `max_wait` (its timer, which rounds the end up to one, has not
//! taken it out) is shed when a permit would go to it or its place in a full queue is wanted.
//!
//! Hand-written rather than tokio's semaphore, which this replaced: the semaphore hands a permit
//! to a waiter inside its own queue, out of sight, so a queued call kept its place in the
//! bulkhead's count until its task ran (a new call was refused though the queue had room, every
//! time for a task that ends a call and makes the next before it yields), and it cannot take a
//! handed permit back (a waiter whose permit paid a lowered limit waited again behind later
//! arrivals). The cost is of the same kind: the semaphore took its own lock for every permit
//! given back; this takes one to take a permit too.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http_body::Frame;
use tokio::time::Instant;

use super::error::BulkheadFull;
use super::events::{
    BulkheadSnapshot, CallFinished, CallOutcome, CallPermitted, CallRejected, Hooks, Rejection,
};
use super::handle::BulkheadBuilder;
use crate::body_end::{Watch, WatchedBody};
use crate::sync::{lock, AtomicU64, Mutex, MutexGuard, Ordering};

/// The largest limit a bulkhead accepts (2^31 - 1); larger values are lowered to it. The config
/// file's bound of every bulkhead's limit and queue too.
pub(crate) const MAX_CONCURRENT_CALLS: usize = (u32::MAX >> 1) as usize;

/// What [`Permits::admit`] decided for a new call.
pub(crate) enum Admission {
    Permitted(Grant),
    Queued(Waiting),
    Rejected,
}

/// What the lock guards: the limit, the free permits, the excess and the queue. Every permit is
/// free, held by a call, or handed to a waiter; they number the limit plus the excess, and none
/// is free while a waiter waits unhanded or an excess remains.
struct Count {
    max: usize,
    free: usize,
    /// Permits to retire as they come back, owed since the limit was lowered below the calls in
    /// flight.
    excess: usize,
    /// The waiters in arrival order (their numbers rise from front to back). The first
    /// `handed` were handed a permit they have not taken.
    queue: VecDeque<Waiter>,
    handed: usize,
    /// The number of the next waiter.
    next: u64,
}

/// A call in the queue.
struct Waiter {
    /// Its place in arrival order.
    number: u64,
    /// The waker of its last poll.
    waker: Option<Waker>,
    /// When its `max_wait` ends, if it can: a waiter still here a millisecond after is shed when
    /// its place or a permit is wanted.
    until: Option<Instant>,
}

impl Count {
    /// `n` permits come back: they retire the excess, then go to the waiters in order (past
    /// those whose wait has ended, shed), and the rest are free. Returns the wakers of the
    /// waiters handed one or shed, to wake once the lock is released (a waker may run code
    /// that takes it).
    fn give_back(&mut self, mut n: usize) -> Vec<Waker> {
        let retired = n.min(self.excess);
        self.excess -= retired;
        n -= retired;
        let mut wakers = Vec::new();
        let mut now = None;
        while n > 0 && self.handed < self.queue.len() {
            wakers.extend(self.shed_ended(*now.get_or_insert_with(Instant::now)));
            let Some(waiter) = self.queue.get_mut(self.handed) else {
                break;
            };
            wakers.extend(waiter.waker.take());
            self.handed += 1;
            n -= 1;
        }
        self.free += n;
        wakers
    }

    /// Sheds the waiters not handed a permit whose wait has ended, oldest first (they are the
    /// first to end), and returns their wakers.
    fn shed_ended(&mut self, now: Instant) -> Vec<Waker> {
        let mut wakers = Vec::new();
        while self.queue.get(self.handed).is_some_and(|w| w.ended(now)) {
            let shed = self.queue.remove(self.handed).expect("checked above");
            wakers.extend(shed.waker);
        }
        wakers
    }

    /// Where the waiter `number` stands in the queue, if it is there.
    fn place(&self, number: u64) -> Option<usize> {
        self.queue.binary_search_by_key(&number, |w| w.number).ok()
    }
}

impl Waiter {
    /// Whether its wait has ended ([`waited::ended`](crate::waited::ended)).
    fn ended(&self, now: Instant) -> bool {
        self.until
            .is_some_and(|until| crate::waited::ended(until, now))
    }
}

/// The permits, the counters and the settings of one bulkhead.
pub(crate) struct Permits {
    count: Mutex<Count>,
    permitted: AtomicU64,
    finished: AtomicU64,
    rejected: AtomicU64,
    pub(crate) name: Arc<str>,
    /// `None`: wait as long as it takes.
    pub(crate) max_wait: Option<Duration>,
    /// `None`: no bound on the number of waiters.
    queue_capacity: Option<usize>,
    hooks: Hooks,
}

impl fmt::Debug for Permits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bulkhead")
            .field("name", &self.name)
            .field("max_wait", &self.max_wait)
            .field("queue_capacity", &self.queue_capacity)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl Permits {
    pub(crate) fn new(builder: BulkheadBuilder) -> Self {
        let max = builder.max_concurrent_calls.min(MAX_CONCURRENT_CALLS);
        Self {
            count: Mutex::new(Count {
                max,
                free: max,
                excess: 0,
                queue: VecDeque::new(),
                handed: 0,
                next: 0,
            }),
            permitted: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            name: builder.name,
            max_wait: builder.max_wait,
            queue_capacity: builder.queue_capacity,
            hooks: builder.hooks,
        }
    }

    fn count(&self) -> MutexGuard<'_, Count> {
        lock(&self.count)
    }

    /// Takes a free permit, if there is one (an adaptive bulkhead never queues).
    #[cfg(feature = "adaptive")]
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<Grant> {
        let mut count = self.count();
        let free = count.free.checked_sub(1)?;
        count.free = free;
        drop(count);
        Some(Grant(Arc::clone(self)))
    }

    /// Decides a new call: a permit now, a place in the queue, or a refusal.
    pub(crate) fn admit(self: &Arc<Self>) -> Admission {
        let mut count = self.count();
        if let Some(free) = count.free.checked_sub(1) {
            count.free = free;
            drop(count);
            return Admission::Permitted(Grant(Arc::clone(self)));
        }
        if self.max_wait == Some(Duration::ZERO) {
            return Admission::Rejected;
        }
        let capacity = self.queue_capacity.unwrap_or(usize::MAX);
        let since = Instant::now();
        let mut shed = Vec::new();
        if count.queue.len() - count.handed >= capacity {
            shed = count.shed_ended(since);
        }
        let admission = if count.queue.len() - count.handed >= capacity {
            Admission::Rejected
        } else {
            // A wait whose end cannot be represented (`Duration::MAX`), or that ends within a
            // millisecond of the last instant (tokio's timer rounds a deadline up), is unbounded.
            let until = (self.max_wait)
                .and_then(|max_wait| since.checked_add(max_wait))
                .filter(|until| until.checked_add(Duration::from_millis(1)).is_some());
            let number = count.next;
            count.next += 1;
            count.queue.push_back(Waiter {
                number,
                waker: None,
                until,
            });
            Admission::Queued(Waiting {
                permits: Arc::clone(self),
                number,
                since,
                until,
                taken: false,
            })
        };
        drop(count);
        wake_all(shed);
        admission
    }

    /// Changes the limit. Raising it retires the excess first and gives the rest at once (to
    /// the waiters first); lowering it takes the free permits at once and owes the rest.
    pub(crate) fn resize(&self, max: usize) {
        let max = max.min(MAX_CONCURRENT_CALLS);
        let mut count = self.count();
        let mut wakers = Vec::new();
        if max >= count.max {
            let more = max - count.max;
            wakers = count.give_back(more);
        } else {
            let mut fewer = count.max - max;
            let free = fewer.min(count.free);
            count.free -= free;
            fewer -= free;
            let handed = fewer.min(count.handed);
            count.handed -= handed;
            count.excess += fewer - handed;
        }
        count.max = max;
        drop(count);
        wake_all(wakers);
    }

    /// Reads the counters so that the snapshot adds up while calls come and go: a call is
    /// counted as permitted after it holds its permit and as finished before it gives the permit
    /// back, so reading `permitted`, then the free permits, then `finished` never shows more
    /// free permits and calls in flight than the limit (`SeqCst` on the counters lets the loom
    /// models see that order). `finished` is capped at `permitted`, since a call permitted
    /// after the first read may have finished before the last.
    pub(crate) fn snapshot(&self) -> BulkheadSnapshot {
        let permitted = self.permitted.load(Ordering::SeqCst);
        let count = self.count();
        let (max, available) = (count.max, count.free);
        let queue_depth = count.queue.len() - count.handed;
        drop(count);
        let finished = self.finished.load(Ordering::SeqCst).min(permitted);
        BulkheadSnapshot {
            available_concurrent_calls: available,
            max_allowed_concurrent_calls: max,
            queue_depth,
            total_permitted: permitted,
            total_rejected: self.rejected.load(Ordering::Relaxed),
            total_finished: finished,
        }
    }

    /// Counts a refusal, runs the hook and makes the error.
    pub(crate) fn reject(&self, reason: Rejection) -> BulkheadFull {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        for hook in &self.hooks.rejected {
            hook(&CallRejected {
                bulkhead: &self.name,
                reason,
            });
        }
        BulkheadFull {
            bulkhead: self.name.clone(),
            #[cfg(feature = "grpc")]
            status: Default::default(),
        }
    }
}

/// Wakes every waker, the rest too if one panics (it would leave its waiter handed a permit
/// it is never woken to take).
fn wake_all(wakers: Vec<Waker>) {
    /// Wakes what is left when dropped, on every way out.
    struct Rest(std::vec::IntoIter<Waker>);
    impl Drop for Rest {
        fn drop(&mut self) {
            self.0.by_ref().for_each(Waker::wake);
        }
    }
    let mut rest = Rest(wakers.into_iter());
    rest.0.by_ref().for_each(Waker::wake);
}

/// One permit taken; dropped, it comes back (to the excess, the first waiter, or free).
pub(crate) struct Grant(Arc<Permits>);

impl Drop for Grant {
    fn drop(&mut self) {
        let wakers = self.0.count().give_back(1);
        wake_all(wakers);
    }
}

/// A call waiting in the queue; dropping it leaves the queue, and a permit handed to it
/// meanwhile goes on to the next in line.
pub(crate) struct Waiting {
    pub(crate) permits: Arc<Permits>,
    /// Its place in arrival order.
    number: u64,
    /// When it joined the queue (tokio's clock).
    pub(crate) since: Instant,
    /// When its `max_wait` ends, if it can.
    pub(crate) until: Option<Instant>,
    /// Its permit was taken, or it was shed: it is no longer in the queue.
    taken: bool,
}

impl Waiting {
    /// Takes the permit handed to it, or waits for one; `None` once it was shed, its wait
    /// ended.
    pub(crate) fn poll_acquire(&mut self, cx: &mut Context<'_>) -> Poll<Option<Grant>> {
        assert!(!self.taken, "polled after its permit was taken");
        let mut waker = None;
        loop {
            let mut count = self.permits.count();
            let Some(at) = count.place(self.number) else {
                self.taken = true;
                return Poll::Ready(None);
            };
            if at < count.handed {
                count.queue.remove(at);
                count.handed -= 1;
                self.taken = true;
                drop(count);
                return Poll::Ready(Some(Grant(Arc::clone(&self.permits))));
            }
            let kept = &mut count.queue[at].waker;
            if kept.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                return Poll::Pending;
            }
            // A new waker is cloned, and the one it replaces dropped, with the lock released:
            // a waker's code may take it.
            let Some(waker) = waker.take() else {
                drop(count);
                waker = Some(cx.waker().clone());
                continue;
            };
            let replaced = kept.replace(waker);
            drop(count);
            drop(replaced);
            return Poll::Pending;
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let mut count = self.permits.count();
        let Some(at) = count.place(self.number) else {
            return;
        };
        let left = count.queue.remove(at);
        let mut wakers = Vec::new();
        if at < count.handed {
            // Handed a permit and dropped before taking it: the permit comes back.
            count.handed -= 1;
            wakers = count.give_back(1);
        }
        // Wakers run and drop once the lock is released: their code may take it.
        drop(count);
        drop(left);
        wake_all(wakers);
    }
}

/// The permit of one call; dropping it ends the call and gives the permit back, exactly once.
pub struct Permit {
    grant: Grant,
    /// When the permit was granted; `None` when no `on_call_finished` hook asked for it.
    started: Option<Instant>,
    /// What the drop reports; the owner updates it as the call moves on, and sets it to
    /// `Panicked` while the inner service's code runs (a permit dropped by a panic of the
    /// caller's own code reports `Cancelled`).
    pub(crate) outcome: CallOutcome,
}

/// Response body of a [`BulkheadService`](super::BulkheadService) in the
/// [`UntilBodyEnd`](crate::head::UntilBodyEnd) mode ([`Bulkhead::body_layer`](super::Bulkhead::body_layer)).
///
/// It gives the permit back when the inner body reports its end, fails, or is dropped,
/// whichever comes first; the frames themselves pass through untouched.
pub type BulkheadBody<B> = WatchedBody<B, Permit>;

/// A call's permit waits for the end of its body: read to its end, or failed. A body dropped
/// before either gives the permit back as `Cancelled`, and one that panics while it is polled
/// as `Panicked`; a body already at its end ends the call as it starts.
impl Watch for Permit {
    fn starts(&mut self, ended: bool) -> bool {
        if !ended {
            self.outcome = CallOutcome::Cancelled;
        }
        !ended
    }

    fn polling(&mut self) {
        self.outcome = CallOutcome::Panicked;
    }

    fn seen<D: bytes::Buf, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, end: bool) -> bool {
        self.outcome = match frame {
            None => CallOutcome::Success,
            Some(Err(_)) => CallOutcome::Failure,
            Some(Ok(_)) if end => CallOutcome::Success,
            Some(Ok(_)) => CallOutcome::Cancelled,
        };
        self.outcome != CallOutcome::Cancelled
    }

    fn pending(&mut self) {
        self.outcome = CallOutcome::Cancelled;
    }
}

impl Permit {
    /// Wraps a permit just taken, counts the call as permitted and runs `on_call_permitted`.
    pub(crate) fn granted(grant: Grant, waited: Duration) -> Self {
        let permits = &grant.0;
        permits.permitted.fetch_add(1, Ordering::SeqCst);
        let started = (!permits.hooks.finished.is_empty()).then(Instant::now);
        let permit = Self {
            grant,
            started,
            outcome: CallOutcome::Cancelled,
        };
        // The permit exists before the hook runs, so a panicking hook still gives it back.
        let permits = &permit.grant.0;
        for hook in &permits.hooks.permitted {
            hook(&CallPermitted {
                bulkhead: &permits.name,
                waited,
            });
        }
        permit
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // Counted before the hooks run and the permit comes back (the field's drop, which a
        // panicking hook does not stop).
        let permits = &*self.grant.0;
        permits.finished.fetch_add(1, Ordering::SeqCst);
        if let Some(started) = self.started {
            let event = CallFinished {
                bulkhead: &permits.name,
                duration: started.elapsed(),
                outcome: self.outcome,
            };
            for hook in &permits.hooks.finished {
                hook(&event);
            }
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("bulkhead", &self.grant.0.name)
            .finish_non_exhaustive()
    }
}

/// The permits against a plain model of the design, over random sequences of operations.
#[cfg(test)]
mod model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[derive(Clone, Debug)]
    enum Op {
        Admit,
        /// Ends the n-th held call (modulo how many there are).
        Finish(usize),
        Resize(usize),
        /// Polls the n-th waiter.
        Poll(usize),
        /// Drops the n-th waiter.
        Leave(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Admit),
            3 => any::<usize>().prop_map(Op::Finish),
            1 => (0usize..6).prop_map(Op::Resize),
            2 => any::<usize>().prop_map(Op::Poll),
            1 => any::<usize>().prop_map(Op::Leave),
        ]
    }

    /// What the design says: the free permits, the waiters in arrival order (the first
    /// `handed` of them handed a permit), the excess and the calls holding a permit.
    #[derive(Default)]
    struct Model {
        max: usize,
        free: usize,
        excess: usize,
        held: usize,
        queue: VecDeque<u64>,
        handed: usize,
        permitted: u64,
        finished: u64,
        rejected: u64,
    }

    impl Model {
        /// `n` permits come back: they retire the excess, go to the first waiters, or are free.
        fn give_back(&mut self, n: usize) {
            let retired = n.min(self.excess);
            self.excess -= retired;
            let handed = (n - retired).min(self.queue.len() - self.handed);
            self.handed += handed;
            self.free += n - retired - handed;
        }
    }

    proptest! {
        #[test]
        fn permits_are_never_lost_created_or_given_beyond_the_limit(
            max in 0usize..5,
            capacity in prop_oneof![Just(None), (0usize..4).prop_map(Some)],
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            // No bound on the wait, and on the queue without a capacity.
            let builder = match capacity {
                Some(capacity) => crate::bulkhead::Bulkhead::queue("model", max, capacity),
                None => crate::bulkhead::Bulkhead::semaphore("model", max).max_wait(Duration::MAX),
            };
            let permits = Arc::new(Permits::new(builder));
            let mut model = Model { max, free: max, ..Model::default() };
            let mut held: Vec<Permit> = Vec::new();
            let mut waiting: Vec<(u64, Waiting)> = Vec::new();
            let mut next_id = 0u64;
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let may_wait = capacity != Some(0);

            for op in ops {
                match op {
                    Op::Admit => {
                        let free = model.free.checked_sub(1);
                        let queued = model.queue.len() - model.handed;
                        let room = may_wait && capacity.is_none_or(|c| queued < c);
                        match permits.admit() {
                            Admission::Permitted(grant) => {
                                prop_assert!(free.is_some());
                                model.free -= 1;
                                model.held += 1;
                                model.permitted += 1;
                                held.push(Permit::granted(grant, Duration::ZERO));
                            }
                            Admission::Queued(waiter) => {
                                // Refused or queued only when no permit is free, and queued
                                // only where the waiters still waiting leave room.
                                prop_assert!(free.is_none() && room);
                                model.queue.push_back(next_id);
                                waiting.push((next_id, waiter));
                                next_id += 1;
                            }
                            Admission::Rejected => {
                                prop_assert!(free.is_none() && !room);
                                model.rejected += 1;
                                drop(permits.reject(Rejection::NoCapacity));
                            }
                        }
                    }
                    Op::Finish(n) => {
                        if !held.is_empty() {
                            let mut permit = held.swap_remove(n % held.len());
                            permit.outcome = CallOutcome::Success;
                            drop(permit);
                            model.held -= 1;
                            model.finished += 1;
                            model.give_back(1);
                        }
                    }
                    Op::Resize(new) => {
                        permits.resize(new);
                        let old = model.max;
                        model.max = new;
                        if new >= old {
                            model.give_back(new - old);
                        } else {
                            // Each permit taken back is a free one, else one handed to the
                            // latest waiter handed one (who waits again in its place), else
                            // owed.
                            for _ in new..old {
                                if model.free > 0 {
                                    model.free -= 1;
                                } else if model.handed > 0 {
                                    model.handed -= 1;
                                } else {
                                    model.excess += 1;
                                }
                            }
                        }
                    }
                    Op::Poll(n) => {
                        if !waiting.is_empty() {
                            let i = n % waiting.len();
                            let id = waiting[i].0;
                            let ready = waiting[i].1.poll_acquire(&mut cx);
                            let at = model.queue.iter().position(|w| *w == id).unwrap();
                            let granted = at < model.handed;
                            prop_assert_eq!(ready.is_ready(), granted);
                            if let Poll::Ready(grant) = ready {
                                let grant = grant.expect("no wait ends in the model");
                                model.queue.remove(at);
                                model.handed -= 1;
                                waiting.remove(i);
                                model.held += 1;
                                model.permitted += 1;
                                held.push(Permit::granted(grant, Duration::ZERO));
                                // Admitted under the limit in force.
                                prop_assert!(model.held <= model.max);
                            }
                        }
                    }
                    Op::Leave(n) => {
                        if !waiting.is_empty() {
                            let (id, waiter) = waiting.remove(n % waiting.len());
                            drop(waiter);
                            let at = model.queue.iter().position(|w| *w == id).unwrap();
                            model.queue.remove(at);
                            if at < model.handed {
                                // A permit handed to a waiter that leaves comes back.
                                model.handed -= 1;
                                model.give_back(1);
                            }
                        }
                    }
                }
                let snapshot = permits.snapshot();
                prop_assert_eq!(snapshot.available_concurrent_calls, model.free);
                prop_assert_eq!(snapshot.max_allowed_concurrent_calls, model.max);
                prop_assert_eq!(snapshot.queue_depth, model.queue.len() - model.handed);
                prop_assert_eq!(snapshot.total_permitted, model.permitted);
                prop_assert_eq!(snapshot.total_finished, model.finished);
                prop_assert_eq!(snapshot.total_rejected, model.rejected);
                prop_assert_eq!(held.len(), model.held);
                // Every permit is in one place: free, handed to a waiter, or held; none is free
                // while a call waits unhanded or an excess remains.
                prop_assert_eq!(model.free + model.handed + model.held, model.max + model.excess);
                let all_handed = model.handed == model.queue.len();
                prop_assert!(model.free == 0 || (all_handed && model.excess == 0));
            }
            // Once every call has ended and every waiter left, the limit is free again.
            drop(waiting);
            drop(held);
            let snapshot = permits.snapshot();
            prop_assert_eq!(snapshot.available_concurrent_calls, model.max);
            prop_assert_eq!(snapshot.queue_depth, 0);
        }
    }

    #[test]
    fn limits_above_the_maximum_are_lowered() {
        let permits = Permits::new(crate::bulkhead::Bulkhead::semaphore("test", usize::MAX));
        assert_eq!(
            permits.snapshot().max_allowed_concurrent_calls,
            MAX_CONCURRENT_CALLS
        );
        permits.resize(usize::MAX);
        assert_eq!(
            permits.snapshot().available_concurrent_calls,
            MAX_CONCURRENT_CALLS
        );
    }
}
