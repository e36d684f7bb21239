//! The permit accounting shared by every clone of one bulkhead.
//!
//! One atomic 64-bit word, `state`, holds the hot data: bit 0 is the `SLOW` flag, bits 1 to 31
//! count free permits, and bits 32 to 63 count finished calls (modulo 2^32). While nobody waits
//! and nothing is owed, taking a permit is one compare-and-swap, and giving it back — counting the
//! call as finished in the same stroke — is another, with no lock. Everything else — waiters,
//! shrinking ("debt"), resizing, and the finished count's wrap-around — happens under a mutex,
//! which raises `SLOW` while it matters.
//!
//! Invariant: when `SLOW` is set, the free count in `state` is zero and every change of `state`
//! goes through the mutex. The mutex holder takes the free permits out of `state` (`drain`),
//! decides where each goes (debt first, then waiters in arrival order, then back to `state`), and
//! writes the free count back (`settle`), clearing `SLOW` only when no waiter is queued and no
//! debt is owed. Since a fast-path caller only changes `state` while `SLOW` is clear, nothing
//! races the holder. For the same reason a call that finds no free permit is refused at once only
//! if `SLOW` was clear: while it is set, the holder may have the free permits in hand, so the call
//! asks under the mutex (a resize racing a call must not refuse it with permits free).
//!
//! Every permit is in exactly one place: free, granted to a waiter that has not taken it up yet,
//! or held by a call; and free + granted + held = max + debt. So the permitted total needs no
//! counter of its own: it is the finished total plus the calls holding a permit, both read from
//! one load of `state` under the mutex.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use super::error::BulkheadFull;
use super::events::{
    BulkheadSnapshot, CallFinished, CallOutcome, CallPermitted, CallRejected, Hooks, Rejection,
};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering, PoisonError};

const SLOW: u64 = 1;
/// One free permit.
const ONE: u64 = 2;
/// `SLOW` and the free count.
const FREE_BITS: u64 = (1 << 32) - 1;
/// One finished call.
const FINISHED_ONE: u64 = 1 << 32;
/// The finished count just before it wraps around.
const FINISHED_LAST: u64 = u32::MAX as u64;

/// The largest limit a bulkhead accepts (2^31 - 1); larger values are lowered to it.
pub const MAX_CONCURRENT_CALLS: usize = (u32::MAX >> 1) as usize;

#[inline]
fn free_in(state: u64) -> usize {
    ((state & FREE_BITS) / ONE) as usize
}

/// What `admit` decided for a new call.
pub(crate) enum Admission {
    /// A permit was taken.
    Permitted,
    /// No permit and no room to wait.
    Rejected,
    /// The call waits in the queue under this ticket.
    Queued(u64),
}

struct Slow {
    /// Waiting calls by ticket; the smallest ticket is served first. A ticket removed by `settle`
    /// has been granted a permit; its waiter learns it by not finding itself here.
    waiters: BTreeMap<u64, Option<Waker>>,
    next_ticket: u64,
    /// Permits to retire when they come back, after the limit was lowered below the calls in
    /// flight.
    debt: usize,
    max: usize,
    /// Permits handed to waiters that have not taken them up yet.
    granted: usize,
    /// How many times the 32-bit finished count in `state` has wrapped around.
    finished_wraps: u64,
}

pub(crate) struct Shared {
    state: AtomicU64,
    rejected: AtomicU64,
    slow: Mutex<Slow>,
    pub(crate) name: Arc<str>,
    /// `None`: wait as long as it takes.
    pub(crate) max_wait: Option<Duration>,
    /// `None`: no bound on the number of waiters.
    queue_capacity: Option<usize>,
    may_wait: bool,
    hooks: Hooks,
    /// Origin of the call timings, in nanoseconds.
    epoch: Instant,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bulkhead")
            .field("name", &self.name)
            .field("max_wait", &self.max_wait)
            .field("queue_capacity", &self.queue_capacity)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl Shared {
    pub(crate) fn new(
        name: Arc<str>,
        max: usize,
        max_wait: Option<Duration>,
        queue_capacity: Option<usize>,
        hooks: Hooks,
    ) -> Self {
        let max = max.min(MAX_CONCURRENT_CALLS);
        let may_wait = max_wait != Some(Duration::ZERO) && queue_capacity != Some(0);
        Self {
            state: AtomicU64::new(max as u64 * ONE),
            rejected: AtomicU64::new(0),
            slow: Mutex::new(Slow {
                waiters: BTreeMap::new(),
                next_ticket: 0,
                debt: 0,
                max,
                granted: 0,
                finished_wraps: 0,
            }),
            name,
            max_wait,
            queue_capacity,
            may_wait,
            hooks,
            epoch: Instant::now(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slow> {
        // Nothing under the lock calls user code (wakers are woken after it is released), so a
        // poisoned lock still guards consistent data.
        self.slow.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Under the lock: takes the free permits out of `state` and raises `SLOW`, keeping the
    /// finished count.
    fn drain(&self) -> usize {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            let raised = (s & !FREE_BITS) | SLOW;
            match self
                .state
                .compare_exchange_weak(s, raised, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return free_in(s),
                Err(actual) => s = actual,
            }
        }
    }

    /// Under the lock, after `drain`: pays the debt, serves waiters in order, and publishes the
    /// rest. Returns the wakers of the waiters served, to wake once the lock is released.
    #[must_use = "the served waiters must be woken"]
    fn settle(&self, slow: &mut Slow, mut permits: usize) -> Wakers {
        let pay = permits.min(slow.debt);
        slow.debt -= pay;
        permits -= pay;
        let mut wakers = Wakers::default();
        while permits > 0 {
            match slow.waiters.pop_first() {
                Some((_, waker)) => {
                    permits -= 1;
                    slow.granted += 1;
                    wakers.push(waker);
                }
                None => break,
            }
        }
        // `SLOW` is set, so the finished count cannot move under us.
        let finished = self.state.load(Ordering::Relaxed) & !FREE_BITS;
        if slow.waiters.is_empty() && slow.debt == 0 {
            self.state
                .store(finished | (permits as u64 * ONE), Ordering::Release);
        } else {
            debug_assert_eq!(permits, 0);
            self.state.store(finished | SLOW, Ordering::Release);
        }
        wakers
    }

    /// Takes a free permit from `state`; without one, returns the state in which there was none.
    #[inline]
    fn try_acquire_fast(&self) -> Result<(), u64> {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            // `SLOW` alone or no free permit: not here.
            if s & FREE_BITS < ONE {
                return Err(s);
            }
            match self
                .state
                .compare_exchange_weak(s, s - ONE, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(actual) => s = actual,
            }
        }
    }

    /// Decides a new call: a permit now, a place in the queue, or a refusal.
    #[inline]
    pub(crate) fn admit(&self) -> Admission {
        match self.try_acquire_fast() {
            Ok(()) => Admission::Permitted,
            // With `SLOW` clear, `state` held every free permit, and there was none.
            Err(s) if !self.may_wait && s & SLOW == 0 => Admission::Rejected,
            // With `SLOW` set, the lock holder may have the free permits in hand (`drain`).
            Err(_) => self.admit_slow(),
        }
    }

    #[cold]
    fn admit_slow(&self) -> Admission {
        let mut slow = self.lock();
        let mut permits = self.drain();
        let pay = permits.min(slow.debt);
        slow.debt -= pay;
        permits -= pay;
        let admission = if permits > 0 && slow.waiters.is_empty() {
            permits -= 1;
            Admission::Permitted
        } else if self.may_wait
            && self
                .queue_capacity
                .is_none_or(|capacity| slow.waiters.len() < capacity)
        {
            let ticket = slow.next_ticket;
            slow.next_ticket += 1;
            slow.waiters.insert(ticket, None);
            Admission::Queued(ticket)
        } else {
            Admission::Rejected
        };
        let wakers = self.settle(&mut slow, permits);
        drop(slow);
        wakers.wake();
        admission
    }

    /// Whether the waiter holding `ticket` has been granted a permit; registers the waker if not.
    /// On `Ready` the call has taken the permit up and holds it.
    pub(crate) fn poll_grant(&self, ticket: u64, cx: &mut Context<'_>) -> Poll<()> {
        let mut slow = self.lock();
        match slow.waiters.get_mut(&ticket) {
            Some(slot) => {
                match slot {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    _ => *slot = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            None => {
                slow.granted -= 1;
                Poll::Ready(())
            }
        }
    }

    /// Takes the waiter holding `ticket` out of the queue. Returns `true` when it had been
    /// granted a permit already; the call then holds it if `keep`, and otherwise it is passed on
    /// unused (not counted as permitted or finished).
    pub(crate) fn leave_queue(&self, ticket: u64, keep: bool) -> bool {
        let mut slow = self.lock();
        let granted = slow.waiters.remove(&ticket).is_none();
        if granted {
            slow.granted -= 1;
            if keep {
                return true;
            }
        }
        // Either the queue may be empty now, and `settle` clears `SLOW` if nothing else holds
        // it; or an unused permit goes on to the next in line.
        let permits = self.drain() + usize::from(granted);
        let wakers = self.settle(&mut slow, permits);
        drop(slow);
        wakers.wake();
        granted
    }

    /// Gives back a held permit and counts its call as finished.
    #[inline]
    fn release(&self) {
        let mut s = self.state.load(Ordering::Relaxed);
        // The wrap-around of the finished count goes through the lock, where the snapshot can
        // see it together with `finished_wraps`.
        while s & SLOW == 0 && s >> 32 != FINISHED_LAST {
            match self.state.compare_exchange_weak(
                s,
                s + ONE + FINISHED_ONE,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => s = actual,
            }
        }
        self.release_slow();
    }

    #[cold]
    fn release_slow(&self) {
        let mut slow = self.lock();
        let permits = self.drain();
        // `SLOW` is set now: nobody else moves `state`.
        let s = self.state.load(Ordering::Relaxed);
        if s >> 32 == FINISHED_LAST {
            slow.finished_wraps += 1;
        }
        self.state
            .store(s.wrapping_add(FINISHED_ONE), Ordering::Relaxed);
        let wakers = self.settle(&mut slow, permits + 1);
        drop(slow);
        wakers.wake();
    }

    /// Changes the limit. Raising it frees permits at once (to waiters first); lowering it retires
    /// free permits at once and the rest as calls in flight give theirs back.
    pub(crate) fn resize(&self, max: usize) {
        let max = max.min(MAX_CONCURRENT_CALLS);
        let mut slow = self.lock();
        let mut permits = self.drain();
        let old = slow.max;
        slow.max = max;
        if max >= old {
            let extra = max - old;
            let forgiven = extra.min(slow.debt);
            slow.debt -= forgiven;
            permits += extra - forgiven;
        } else {
            slow.debt += old - max;
        }
        let wakers = self.settle(&mut slow, permits);
        drop(slow);
        wakers.wake();
    }

    fn nanos_since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn snapshot(&self) -> BulkheadSnapshot {
        let slow = self.lock();
        // One load gives the free permits and the finished count of the same instant; what the
        // lock guards cannot move meanwhile.
        let s = self.state.load(Ordering::Acquire);
        let available = free_in(s);
        let finished = (slow.finished_wraps << 32) | (s >> 32);
        let in_place = available + slow.granted;
        debug_assert!(
            in_place <= slow.max + slow.debt,
            "a permit was counted twice"
        );
        let held = (slow.max + slow.debt).saturating_sub(in_place);
        BulkheadSnapshot {
            available_concurrent_calls: available,
            max_allowed_concurrent_calls: slow.max,
            queue_depth: slow.waiters.len(),
            total_permitted: finished + held as u64,
            total_rejected: self.rejected.load(Ordering::Relaxed),
            total_finished: finished,
        }
    }

    /// Counts a refusal, runs the hook and makes the error.
    pub(crate) fn reject(&self, reason: Rejection) -> BulkheadFull {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        if let Some(hook) = &self.hooks.rejected {
            hook.on_call_rejected(&CallRejected {
                bulkhead: &self.name,
                reason,
            });
        }
        BulkheadFull::new(self.name.clone())
    }
}

/// Wakers of waiters just granted a permit; one is the common case and needs no allocation.
#[derive(Default)]
struct Wakers {
    first: Option<Waker>,
    rest: Vec<Waker>,
}

impl Wakers {
    fn push(&mut self, waker: Option<Waker>) {
        // A waiter not polled yet has no waker: it finds its grant on its first poll.
        let Some(waker) = waker else { return };
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.rest.push(waker);
        }
    }

    fn wake(self) {
        self.first
            .into_iter()
            .chain(self.rest)
            .for_each(Waker::wake);
    }
}

/// How a call holding a permit stands; `CallOutcome` in a whole machine word, so that writing
/// it and then moving the permit does not stall the store buffer on the hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Ending {
    Success,
    Failure,
    Panicked,
    Cancelled,
}

/// A permit owned by one call; dropping it ends the call and gives the permit back, exactly once.
pub(crate) struct Permit {
    shared: Arc<Shared>,
    /// Nanoseconds from the bulkhead's epoch to the grant; zero when nobody asked for timings.
    /// A whole word rather than an `Option<Instant>`, so that building and moving the permit
    /// stays cheap.
    started: u64,
    /// What the drop reports; the owner updates it as the call moves on. A permit left at
    /// `Cancelled` and dropped while the thread unwinds reports `Panicked`.
    pub(crate) outcome: Ending,
}

impl Permit {
    /// Wraps a permit just taken from `shared` and runs `on_call_permitted`.
    #[inline]
    pub(crate) fn granted(shared: Arc<Shared>, waited: Duration) -> Self {
        let started = match shared.hooks.finished {
            Some(_) => shared.nanos_since_epoch(),
            None => 0,
        };
        let permit = Self {
            shared,
            started,
            outcome: Ending::Cancelled,
        };
        // The permit exists before the hook runs, so a panicking hook still gives it back.
        if let Some(hook) = &permit.shared.hooks.permitted {
            hook.on_call_permitted(&CallPermitted {
                bulkhead: &permit.shared.name,
                waited,
            });
        }
        permit
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        struct GiveBack<'a>(&'a Shared);
        impl Drop for GiveBack<'_> {
            #[inline]
            fn drop(&mut self) {
                self.0.release();
            }
        }
        // Given back even if the hook panics.
        let shared = &*self.shared;
        let _give_back = GiveBack(shared);
        if let Some(hook) = &shared.hooks.finished {
            let duration =
                Duration::from_nanos(shared.nanos_since_epoch().saturating_sub(self.started));
            let outcome = match self.outcome {
                Ending::Success => CallOutcome::Success,
                Ending::Failure => CallOutcome::Failure,
                Ending::Panicked => CallOutcome::Panicked,
                Ending::Cancelled if std::thread::panicking() => CallOutcome::Panicked,
                Ending::Cancelled => CallOutcome::Cancelled,
            };
            hook.on_call_finished(&CallFinished {
                bulkhead: &shared.name,
                duration,
                outcome,
            });
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("bulkhead", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// A place in a bulkhead's queue; dropping it leaves the queue (and passes on a permit granted
/// but not used).
pub(crate) struct Waiter {
    shared: Arc<Shared>,
    ticket: u64,
    queued: bool,
}

impl Waiter {
    pub(crate) fn new(shared: Arc<Shared>, ticket: u64) -> Self {
        Self {
            shared,
            ticket,
            queued: true,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// `Ready` once a permit has been granted; the caller must then call `take_permit`.
    pub(crate) fn poll_grant(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.shared.poll_grant(self.ticket, cx)
    }

    /// Marks the granted permit as taken over by the call.
    pub(crate) fn take_permit(&mut self) {
        self.queued = false;
    }

    /// Leaves the queue after `max_wait`; returns `true` when a permit had been granted just
    /// before, which the call then takes over instead.
    pub(crate) fn give_up(&mut self) -> bool {
        self.queued = false;
        self.shared.leave_queue(self.ticket, true)
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.queued {
            self.shared.leave_queue(self.ticket, false);
        }
    }
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("bulkhead", &self.shared.name)
            .field("ticket", &self.ticket)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulkhead(max: usize) -> Arc<Shared> {
        Arc::new(Shared::new(
            "test".into(),
            max,
            Some(Duration::ZERO),
            None,
            Hooks::default(),
        ))
    }

    #[test]
    fn the_finished_count_carries_over_its_32_bits() {
        let shared = bulkhead(2);
        // Start three calls short of the wrap-around, as if 2^32 - 3 calls had finished.
        shared
            .state
            .fetch_add((FINISHED_LAST - 2) << 32, Ordering::Relaxed);
        let start = shared.snapshot().total_finished;
        assert_eq!(start, FINISHED_LAST - 2);
        let mut last = shared.snapshot();
        for i in 1..=6u64 {
            assert!(matches!(shared.admit(), Admission::Permitted));
            let permit = Permit::granted(shared.clone(), Duration::ZERO);
            let during = shared.snapshot();
            assert_eq!(during.total_permitted, start + i);
            assert_eq!(during.total_finished, start + i - 1);
            drop(permit);
            let after = shared.snapshot();
            assert_eq!(after.total_finished, start + i);
            assert_eq!(after.total_permitted, start + i);
            assert_eq!(after.available_concurrent_calls, 2);
            assert!(after.total_finished > last.total_finished);
            last = after;
        }
        assert_eq!(shared.lock().finished_wraps, 1);
        // Past the wrap, the fast path is back.
        assert_eq!(shared.state.load(Ordering::Relaxed) & SLOW, 0);
    }

    #[test]
    fn limits_above_the_maximum_are_lowered() {
        let shared = bulkhead(usize::MAX);
        assert_eq!(
            shared.snapshot().max_allowed_concurrent_calls,
            MAX_CONCURRENT_CALLS
        );
        assert_eq!(
            shared.snapshot().available_concurrent_calls,
            MAX_CONCURRENT_CALLS
        );
        shared.resize(usize::MAX);
        assert_eq!(
            shared.snapshot().available_concurrent_calls,
            MAX_CONCURRENT_CALLS
        );
        assert_eq!(shared.snapshot().total_permitted, 0);
    }
}

/// The permit accounting against a plain model, over random sequences of operations.
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
        /// Drops the n-th waiter; `true` keeps a permit granted meanwhile.
        Leave(usize, bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Admit),
            3 => any::<usize>().prop_map(Op::Finish),
            1 => (0usize..6).prop_map(Op::Resize),
            2 => any::<usize>().prop_map(Op::Poll),
            1 => (any::<usize>(), any::<bool>()).prop_map(|(n, keep)| Op::Leave(n, keep)),
        ]
    }

    #[derive(Default)]
    struct Model {
        max: usize,
        free: usize,
        debt: usize,
        held: usize,
        queue: VecDeque<u64>,
        granted: Vec<u64>,
        permitted: u64,
        finished: u64,
        rejected: u64,
    }

    impl Model {
        fn settle(&mut self, mut permits: usize) {
            let pay = permits.min(self.debt);
            self.debt -= pay;
            permits -= pay;
            while permits > 0 {
                let Some(ticket) = self.queue.pop_front() else {
                    break;
                };
                self.granted.push(ticket);
                permits -= 1;
            }
            self.free += permits;
        }
    }

    proptest! {
        #[test]
        fn permits_are_never_lost_created_or_reordered(
            max in 0usize..5,
            capacity in prop_oneof![Just(None), (0usize..4).prop_map(Some)],
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let shared = Arc::new(Shared::new("model".into(), max, None, capacity, Hooks::default()));
            let mut model = Model { max, free: max, ..Model::default() };
            let mut permits: Vec<Permit> = Vec::new();
            // Waiters by ticket, in arrival order.
            let mut waiting: Vec<u64> = Vec::new();
            let mut cx = Context::from_waker(Waker::noop());
            let may_wait = capacity != Some(0);

            for op in ops {
                match op {
                    Op::Admit => {
                        let expected_permit = model.free > 0;
                        match shared.admit() {
                            Admission::Permitted => {
                                prop_assert!(expected_permit);
                                model.free -= 1;
                                model.held += 1;
                                model.permitted += 1;
                                permits.push(Permit::granted(shared.clone(), Duration::ZERO));
                            }
                            Admission::Queued(ticket) => {
                                prop_assert!(!expected_permit && may_wait);
                                prop_assert!(capacity.is_none_or(|c| model.queue.len() < c));
                                model.queue.push_back(ticket);
                                waiting.push(ticket);
                            }
                            Admission::Rejected => {
                                prop_assert!(!expected_permit);
                                prop_assert!(
                                    !may_wait || capacity.is_some_and(|c| model.queue.len() >= c)
                                );
                                model.rejected += 1;
                                drop(shared.reject(Rejection::NoCapacity));
                            }
                        }
                    }
                    Op::Finish(n) => {
                        if !permits.is_empty() {
                            let mut permit = permits.swap_remove(n % permits.len());
                            permit.outcome = Ending::Success;
                            drop(permit);
                            model.held -= 1;
                            model.finished += 1;
                            model.settle(1);
                        }
                    }
                    Op::Resize(new) => {
                        shared.resize(new);
                        let old = model.max;
                        model.max = new;
                        if new >= old {
                            let forgiven = (new - old).min(model.debt);
                            model.debt -= forgiven;
                            model.settle(new - old - forgiven);
                        } else {
                            model.debt += old - new;
                            let free = std::mem::take(&mut model.free);
                            model.settle(free);
                        }
                    }
                    Op::Poll(n) => {
                        if !waiting.is_empty() {
                            let ticket = waiting[n % waiting.len()];
                            let granted = shared.poll_grant(ticket, &mut cx).is_ready();
                            prop_assert_eq!(granted, model.granted.contains(&ticket));
                            if granted {
                                waiting.retain(|t| *t != ticket);
                                model.granted.retain(|t| *t != ticket);
                                model.held += 1;
                                model.permitted += 1;
                                permits.push(Permit::granted(shared.clone(), Duration::ZERO));
                            }
                        }
                    }
                    Op::Leave(n, keep) => {
                        if !waiting.is_empty() {
                            let ticket = waiting.remove(n % waiting.len());
                            let granted = shared.leave_queue(ticket, keep);
                            prop_assert_eq!(granted, model.granted.contains(&ticket));
                            if granted {
                                model.granted.retain(|t| *t != ticket);
                                if keep {
                                    model.held += 1;
                                    model.permitted += 1;
                                    permits.push(Permit::granted(shared.clone(), Duration::ZERO));
                                } else {
                                    model.settle(1);
                                }
                            } else {
                                model.queue.retain(|t| *t != ticket);
                            }
                        }
                    }
                }
                let snapshot = shared.snapshot();
                prop_assert_eq!(snapshot.available_concurrent_calls, model.free);
                prop_assert_eq!(snapshot.max_allowed_concurrent_calls, model.max);
                prop_assert_eq!(snapshot.queue_depth, model.queue.len());
                prop_assert_eq!(snapshot.total_permitted, model.permitted);
                prop_assert_eq!(snapshot.total_finished, model.finished);
                prop_assert_eq!(snapshot.total_rejected, model.rejected);
                prop_assert_eq!(permits.len(), model.held);
                // Never more calls holding a permit than the limit, except those admitted before
                // it was lowered, which the debt covers.
                prop_assert!(model.held + model.granted.len() <= model.max + model.debt);
                if model.debt > 0 {
                    prop_assert_eq!(model.free, 0);
                }
            }
        }
    }
}
