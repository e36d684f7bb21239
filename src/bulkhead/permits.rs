//! The permits of one bulkhead, shared by every clone: tokio's semaphore, and an excess for a limit
//! lowered below the calls in flight.
//!
//! tokio's [`Semaphore`] gives permits in arrival order and lets us add and forget permits; what
//! it cannot do is take back a permit that a call holds. So lowering the limit forgets the free
//! permits at once and records the rest as an excess, which the permits that come back retire:
//! a permit returned while an excess remains is forgotten instead of returned, and raising the limit
//! retires the excess before it adds permits.
//!
//! The excess is a counter beside the semaphore, not under a lock with it, so a permit can reach
//! the semaphore while an excess remains (returned by a call that read no excess just before a
//! resize, or passed on by a waiter that gave up after it was granted one). That is why the
//! excess is also checked where it matters, when a permit is taken: a call that takes a permit
//! while an excess remains retires one of it and looks for another. The semaphore's permits
//! (free, granted or held) always number the limit plus the excess.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::error::BulkheadFull;
use super::events::{
    BulkheadSnapshot, CallFinished, CallOutcome, CallPermitted, CallRejected, Hooks, Rejection,
};
use super::handle::BulkheadBuilder;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

/// The largest limit a bulkhead accepts (2^31 - 1, or tokio's semaphore's own bound where that
/// is lower: 2^29 - 1 on 32-bit targets); larger values are lowered to it. The config file's
/// bound of every bulkhead's limit and queue too.
pub(crate) const MAX_CONCURRENT_CALLS: usize = {
    let ours = (u32::MAX >> 1) as usize;
    if Semaphore::MAX_PERMITS < ours {
        Semaphore::MAX_PERMITS
    } else {
        ours
    }
};

/// A wait for a permit in the semaphore's queue.
type Acquire =
    Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send + Sync>>;

/// What [`Permits::admit`] decided for a new call.
pub(crate) enum Admission {
    Permitted(OwnedSemaphorePermit),
    Queued(Waiting),
    Rejected,
}

/// The permits, the excess, the counters and the settings of one bulkhead.
pub(crate) struct Permits {
    semaphore: Arc<Semaphore>,
    /// Permits to forget as they come back, owed since the limit was lowered below the calls in
    /// flight.
    excess: AtomicU64,
    /// The limit; resizes take this lock, so that they apply one after the other.
    max: Mutex<usize>,
    /// Calls waiting for a permit.
    waiting: AtomicU64,
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
            semaphore: Arc::new(Semaphore::new(max)),
            excess: AtomicU64::new(0),
            max: Mutex::new(max),
            waiting: AtomicU64::new(0),
            permitted: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            name: builder.name,
            max_wait: builder.max_wait,
            queue_capacity: builder.queue_capacity,
            hooks: builder.hooks,
        }
    }

    /// Retires one permit of the excess with `permit` if any remains; otherwise gives the permit back.
    fn retire_excess(&self, permit: OwnedSemaphorePermit) -> Option<OwnedSemaphorePermit> {
        let owed = self
            .excess
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |excess| {
                excess.checked_sub(1)
            });
        match owed {
            Ok(_) => {
                permit.forget();
                None
            }
            Err(_) => Some(permit),
        }
    }

    /// Takes a free permit, if there is one.
    pub(crate) fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        loop {
            let permit = Arc::clone(&self.semaphore).try_acquire_owned().ok()?;
            if let Some(permit) = self.retire_excess(permit) {
                return Some(permit);
            }
        }
    }

    /// Decides a new call: a permit now, a place in the queue, or a refusal.
    pub(crate) fn admit(self: &Arc<Self>) -> Admission {
        if let Some(permit) = self.try_acquire() {
            return Admission::Permitted(permit);
        }
        let capacity = self.queue_capacity.map_or(u64::MAX, |c| c as u64);
        let has_room = self.max_wait != Some(Duration::ZERO)
            && self
                .waiting
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < capacity).then_some(n + 1)
                })
                .is_ok();
        if !has_room {
            return Admission::Rejected;
        }
        let mut waiting = Waiting {
            permits: Arc::clone(self),
            acquire: self.acquire(),
        };
        // The first poll takes the place in the semaphore's queue, so that calls wait in the
        // order they were made rather than the order they are first polled.
        match waiting.poll_acquire(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(permit) => Admission::Permitted(permit),
            Poll::Pending => Admission::Queued(waiting),
        }
    }

    fn acquire(&self) -> Acquire {
        Box::pin(Arc::clone(&self.semaphore).acquire_owned())
    }

    /// Changes the limit. Raising it retires the excess first and frees the rest at once (to waiters
    /// first); lowering it forgets the free permits at once and owes the rest.
    pub(crate) fn resize(&self, max: usize) {
        let max = max.min(MAX_CONCURRENT_CALLS);
        let mut current = lock(&self.max);
        if max >= *current {
            let more = (max - *current) as u64;
            let retired = self
                .excess
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |excess| {
                    Some(excess - excess.min(more))
                })
                .map_or(0, |excess| excess.min(more));
            self.semaphore.add_permits((more - retired) as usize);
        } else {
            let fewer = *current - max;
            let forgotten = self.semaphore.forget_permits(fewer);
            self.excess
                .fetch_add((fewer - forgotten) as u64, Ordering::AcqRel);
        }
        *current = max;
    }

    /// Reads the counters so that the snapshot adds up while calls come and go: a call is
    /// counted as permitted after it holds its permit and as finished before it gives the permit
    /// back, so reading `permitted`, then the free permits, then `finished` never shows more
    /// free permits and calls in flight than the limit (tokio's semaphore orders the permit's
    /// return after the count; `SeqCst` on the counters lets the loom models see that order).
    /// `finished` is capped at `permitted`, since a call permitted after the first read may
    /// have finished before the last.
    ///
    /// The free permits are read under the lock of the limit, which every resize holds while
    /// it changes the semaphore: read apart, a resize between the two reads showed more free
    /// permits than the limit.
    pub(crate) fn snapshot(&self) -> BulkheadSnapshot {
        let max_lock = lock(&self.max);
        let max = *max_lock;
        let permitted = self.permitted.load(Ordering::SeqCst);
        let excess = self.excess.load(Ordering::Acquire) as usize;
        let available = self.semaphore.available_permits().saturating_sub(excess);
        drop(max_lock);
        let finished = self.finished.load(Ordering::SeqCst).min(permitted);
        BulkheadSnapshot {
            available_concurrent_calls: available,
            max_allowed_concurrent_calls: max,
            queue_depth: self.waiting.load(Ordering::Relaxed) as usize,
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

/// A call waiting in the queue; dropping it leaves the queue, and a permit granted meanwhile
/// goes on to the next in line.
pub(crate) struct Waiting {
    pub(crate) permits: Arc<Permits>,
    acquire: Acquire,
}

impl Waiting {
    /// Waits for a permit. A permit that arrives while an excess remains retires it, and the call
    /// waits again, at the back of the queue.
    pub(crate) fn poll_acquire(&mut self, cx: &mut Context<'_>) -> Poll<OwnedSemaphorePermit> {
        loop {
            let Ok(permit) = ready!(self.acquire.as_mut().poll(cx)) else {
                unreachable!("the semaphore of a bulkhead is never closed")
            };
            if let Some(permit) = self.permits.retire_excess(permit) {
                return Poll::Ready(permit);
            }
            self.acquire = self.permits.acquire();
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.permits.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The permit of one call; dropping it ends the call and gives the permit back, exactly once.
pub struct Permit {
    permits: Arc<Permits>,
    permit: Option<OwnedSemaphorePermit>,
    /// When the permit was granted; `None` when no `on_call_finished` hook asked for it.
    started: Option<Instant>,
    /// What the drop reports; the owner updates it as the call moves on. A permit left at
    /// `Cancelled` and dropped while the thread unwinds reports `Panicked`.
    pub(crate) outcome: CallOutcome,
}

impl Permit {
    /// Wraps a permit just taken, counts the call as permitted and runs `on_call_permitted`.
    pub(crate) fn granted(
        permits: Arc<Permits>,
        permit: OwnedSemaphorePermit,
        waited: Duration,
    ) -> Self {
        permits.permitted.fetch_add(1, Ordering::SeqCst);
        let started = (!permits.hooks.finished.is_empty()).then(Instant::now);
        let permit = Self {
            permits,
            permit: Some(permit),
            started,
            outcome: CallOutcome::Cancelled,
        };
        // The permit exists before the hook runs, so a panicking hook still gives it back.
        for hook in &permit.permits.hooks.permitted {
            hook(&CallPermitted {
                bulkhead: &permit.permits.name,
                waited,
            });
        }
        permit
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        /// Gives the permit back even if the hook panics.
        struct GiveBack<'a>(&'a Permits, Option<OwnedSemaphorePermit>);
        impl Drop for GiveBack<'_> {
            fn drop(&mut self) {
                self.0.finished.fetch_add(1, Ordering::SeqCst);
                // Retires one permit of the excess if any remains; otherwise the permit goes back to the semaphore.
                if let Some(permit) = self.1.take() {
                    drop(self.0.retire_excess(permit));
                }
            }
        }
        let permits = &*self.permits;
        let _give_back = GiveBack(permits, self.permit.take());
        if let Some(started) = self.started {
            let event = CallFinished {
                bulkhead: &permits.name,
                duration: started.elapsed(),
                outcome: match self.outcome {
                    CallOutcome::Cancelled if std::thread::panicking() => CallOutcome::Panicked,
                    outcome => outcome,
                },
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
            .field("bulkhead", &self.permits.name)
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

    /// What the design says: the semaphore's free permits, the waiters in order (each with
    /// whether a permit was handed to it), the excess and the calls holding a permit.
    #[derive(Default)]
    struct Model {
        max: usize,
        free: usize,
        excess: usize,
        held: usize,
        queue: VecDeque<(u64, bool)>,
        permitted: u64,
        finished: u64,
        rejected: u64,
    }

    impl Model {
        /// A permit reaches the semaphore: the first waiter without one gets it, or it is free.
        fn give(&mut self) {
            match self.queue.iter_mut().find(|(_, granted)| !granted) {
                Some(waiter) => waiter.1 = true,
                None => self.free += 1,
            }
        }

        /// A call's permit comes back: it retires the excess, or reaches the semaphore.
        fn release(&mut self) {
            if self.excess > 0 {
                self.excess -= 1;
            } else {
                self.give();
            }
        }

        /// Takes free permits, retiring the excess with them, until one is left for the call.
        fn try_acquire(&mut self) -> bool {
            while self.free > 0 {
                self.free -= 1;
                if self.excess == 0 {
                    return true;
                }
                self.excess -= 1;
            }
            false
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
            let mut cx = Context::from_waker(Waker::noop());
            let may_wait = capacity != Some(0);

            for op in ops {
                match op {
                    Op::Admit => {
                        let expected_permit = model.try_acquire();
                        match permits.admit() {
                            Admission::Permitted(permit) => {
                                prop_assert!(expected_permit);
                                model.held += 1;
                                model.permitted += 1;
                                held.push(Permit::granted(permits.clone(), permit, Duration::ZERO));
                            }
                            Admission::Queued(waiter) => {
                                prop_assert!(!expected_permit && may_wait);
                                prop_assert!(capacity.is_none_or(|c| model.queue.len() < c));
                                model.queue.push_back((next_id, false));
                                waiting.push((next_id, waiter));
                                next_id += 1;
                            }
                            Admission::Rejected => {
                                prop_assert!(!expected_permit);
                                prop_assert!(
                                    !may_wait || capacity.is_some_and(|c| model.queue.len() >= c)
                                );
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
                            model.release();
                        }
                    }
                    Op::Resize(new) => {
                        permits.resize(new);
                        let old = model.max;
                        model.max = new;
                        if new >= old {
                            let retired = (new - old).min(model.excess);
                            model.excess -= retired;
                            for _ in 0..new - old - retired {
                                model.give();
                            }
                        } else {
                            let forgotten = (old - new).min(model.free);
                            model.free -= forgotten;
                            model.excess += old - new - forgotten;
                        }
                    }
                    Op::Poll(n) => {
                        if !waiting.is_empty() {
                            let i = n % waiting.len();
                            let id = waiting[i].0;
                            let at = model.queue.iter().position(|(w, _)| *w == id).unwrap();
                            let ready = waiting[i].1.poll_acquire(&mut cx);
                            if model.queue[at].1 {
                                // A permit handed over while an excess remains retires it; the call
                                // waits again, at the back.
                                model.queue.remove(at);
                                if model.excess > 0 {
                                    model.excess -= 1;
                                    model.queue.push_back((id, false));
                                    if model.try_acquire() {
                                        model.queue.pop_back();
                                    }
                                }
                            }
                            let granted = model.queue.iter().all(|(w, _)| *w != id);
                            prop_assert_eq!(ready.is_ready(), granted);
                            if let Poll::Ready(permit) = ready {
                                waiting.remove(i);
                                model.held += 1;
                                model.permitted += 1;
                                held.push(Permit::granted(permits.clone(), permit, Duration::ZERO));
                                // Admitted under the limit in force.
                                prop_assert!(model.held <= model.max);
                            }
                        }
                    }
                    Op::Leave(n) => {
                        if !waiting.is_empty() {
                            let (id, waiter) = waiting.remove(n % waiting.len());
                            drop(waiter);
                            let at = model.queue.iter().position(|(w, _)| *w == id).unwrap();
                            let (_, granted) = model.queue.remove(at).unwrap();
                            // A permit handed to a waiter that leaves goes back to the
                            // semaphore as it is, excess or not.
                            if granted {
                                model.give();
                            }
                        }
                    }
                }
                let snapshot = permits.snapshot();
                prop_assert_eq!(
                    snapshot.available_concurrent_calls,
                    model.free.saturating_sub(model.excess)
                );
                prop_assert_eq!(snapshot.max_allowed_concurrent_calls, model.max);
                prop_assert_eq!(snapshot.queue_depth, model.queue.len());
                prop_assert_eq!(snapshot.total_permitted, model.permitted);
                prop_assert_eq!(snapshot.total_finished, model.finished);
                prop_assert_eq!(snapshot.total_rejected, model.rejected);
                prop_assert_eq!(held.len(), model.held);
                // Every permit is in one place: free, handed to a waiter, or held.
                let granted = model.queue.iter().filter(|(_, g)| *g).count();
                prop_assert_eq!(model.free + granted + model.held, model.max + model.excess);
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
