//! [`DirectRateLimiter`]: one limit for everything that shares it.

use std::fmt;
use std::future::{ready, Ready};
use std::sync::Arc;

use crossbeam_utils::atomic::AtomicCell;

use super::builder::{Direct, RateLimiterBuilder};
use super::{acquire, Acquire, Limiter, Rule};
use crate::algorithm::{Algorithm, Gcra, LatestReading};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, InsufficientCapacity, LimiterId};
use crate::sync::{lock, Mutex};
use crate::{BoxError, Quota};

/// One limit shared by every caller: a process-wide cap.
///
/// ```
/// use tower_bulwark::{DirectRateLimiter, Quota};
///
/// let limiter = DirectRateLimiter::new(Quota::per_hour(2)?);
/// assert!(limiter.check().allowed);
/// assert!(limiter.check().allowed);
/// assert!(!limiter.check().allowed);
/// # Ok::<(), tower_bulwark::QuotaError>(())
/// ```
pub struct DirectRateLimiter<A: Algorithm = Gcra, C = SystemClock> {
    pub(super) inner: Arc<DirectInner<A, C>>,
}

/// What every check of a direct limiter writes, the key's state, with its [`LatestReading`] (a
/// keyed limiter's shards have one each: GCRA's floor, which a direct limiter never raises, and
/// the mark its give-backs write), on cache lines of their own (two, as the adjacent-line
/// prefetcher pairs them), so that the fields every check only reads (the rule, the clock) are
/// not fetched again after each write by another thread. (GCRA keeps the key's latest reading
/// in its state, beside the TAT.)
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct Written<S> {
    pub(super) state: S,
    pub(super) latest: LatestReading,
}

/// What every clone of a [`DirectRateLimiter`] shares.
pub(super) struct DirectInner<A: Algorithm, C> {
    /// The quota and its algorithm. A decision copies the pair out whole and decides by its
    /// copy; [`set_quota`](DirectRateLimiter::set_quota) stores a new pair. The cell is a
    /// sequence lock: a load reads the pair and checks that no store came between, writing no
    /// shared word and no word of its own. (An `ArcSwap` writes and clears a slot of the
    /// thread's on every load, two locked instructions: BENCHMARKS.md, "On 2 vCPUs", has the
    /// checks a second with it and without, `PAIRED=20 THREADS=1,2 cargo bench --bench
    /// contention -- direct`. A lock's reader count, which every thread writes, did worse still
    /// from two threads.)
    pub(super) rule: AtomicCell<Rule<A>>,
    /// Held by a quota change from its read of the rule to its store of the next, so that a
    /// change racing another is built on the winner's.
    pub(super) changing: Mutex<()>,
    /// The key's state, which every check writes, and its latest reading.
    pub(super) written: Written<A::State>,
    pub(super) clock: C,
    /// Whose decisions a refund accepts: this limiter's and its clones'.
    pub(super) id: LimiterId,
}

impl DirectRateLimiter {
    /// A GCRA limiter on the system clock.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder to choose the algorithm and the clock.
    pub fn builder(quota: Quota) -> RateLimiterBuilder<Direct> {
        RateLimiterBuilder::new(quota)
    }
}

impl<A: Algorithm, C: Clock> DirectRateLimiter<A, C> {
    /// Decides on `cost` permits now, reserving them if they arrive within the quota's
    /// `max_wait` when `wait` is set. The cost is checked against the rule that decides.
    fn decide(&self, cost: u32, wait: bool) -> Result<Decision, InsufficientCapacity> {
        let rule = self.inner.rule.load();
        rule.check_cost(cost)?;
        Ok(self.decide_by(&rule, cost, wait))
    }

    /// Decides on `cost` permits, which `rule` admits, by `rule`. [`check`](Self::check)'s one
    /// permit always fits, so it answers this `Decision` itself: moved out of a `Result`, its
    /// 128 bytes were copied once more per check (one thread: 28.5 M checks a second with the
    /// copy, 40.8 M without; `PAIRED=20 THREADS=1 cargo bench --bench contention -- direct`).
    fn decide_by(&self, rule: &Rule<A>, cost: u32, wait: bool) -> Decision {
        let now = self.inner.clock.now();
        let max_wait = if wait { rule.quota.max_wait_nanos() } else { 0 };
        let (state, latest) = (&self.inner.written.state, &self.inner.written.latest);
        (rule.algorithm)
            .decide(state, latest, now, cost, max_wait)
            .of_cost(cost)
            .made_by(self.inner.id)
    }

    /// Decides on one permit now, never waiting.
    pub fn check(&self) -> Decision {
        self.decide_by(&self.inner.rule.load(), 1, false)
    }

    /// Decides on `cost` permits now, never waiting. A cost of zero takes nothing; it is
    /// admitted unless the limiter is over its limit (see [`Limiter::reserve`]).
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `cost` is more than the quota can ever admit at once.
    pub fn check_n(&self, cost: u32) -> Result<Decision, InsufficientCapacity> {
        self.decide(cost, false)
    }

    /// Takes one permit, waiting up to the quota's `max_wait` for it; dropping the future while
    /// it waits gives the permit back. For several permits at once, [`acquire`](super::acquire)
    /// takes a cost.
    pub fn acquire(&self) -> Acquire<'_, (), Self> {
        acquire(self, &(), 1)
    }

    /// The quota it enforces now.
    pub fn quota(&self) -> Quota {
        self.inner.rule.load().quota
    }

    /// Replaces the quota for every clone of this limiter, keeping the state: see
    /// [`KeyedRateLimiter::set_quota`](super::KeyedRateLimiter::set_quota), which works the
    /// same way for its one key.
    pub fn set_quota(&self, quota: Quota) {
        let now = self.inner.clock.now();
        // Built before it is stored (a panic leaves the old pair in place, whole), from the pair
        // it replaces, under the lock that orders changes (a poisoned one held nothing half
        // done: the store is the change's one write).
        let _changing = lock(&self.inner.changing);
        let next = self.inner.rule.load().changed_to(quota, now);
        // A reading older than the change is decided as of it (see `KeyedRateLimiter`'s).
        self.inner.written.latest.publish(now);
        self.inner.rule.store(next);
    }
}

impl<A: Algorithm, C> Clone for DirectRateLimiter<A, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<A: Algorithm, C: Clock> fmt::Debug for DirectRateLimiter<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = self.inner.rule.load();
        f.debug_struct("DirectRateLimiter")
            .field("quota", &rule.quota)
            .field("algorithm", &rule.algorithm)
            .field("state", &self.inner.written.state)
            .field("latest", &self.inner.written.latest)
            .finish()
    }
}

/// A direct limiter ignores the key: every request shares one budget.
impl<K, A: Algorithm, C: Clock> Limiter<K> for DirectRateLimiter<A, C> {
    type Future = Ready<Result<Decision, BoxError>>;

    fn quota(&self) -> Quota {
        DirectRateLimiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        DirectRateLimiter::set_quota(self, quota);
        Ok(())
    }

    fn reserve(&self, _key: &K, cost: u32) -> Self::Future {
        ready(self.decide(cost, true).map_err(Into::into))
    }

    fn reserve_now(&self, _key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        Some(self.decide(cost, true).map_err(Into::into))
    }

    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        Limiter::settle(self, key, cost, decision, 0)
    }

    fn settle(&self, _key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        let mine = decision.allowed && decision.is_from(self.inner.id, 0);
        if mine {
            let rule = self.inner.rule.load();
            let now = self.inner.clock.now();
            let (state, latest) = (&self.inner.written.state, &self.inner.written.latest);
            let estimate = decision.refundable(estimate);
            (rule.algorithm).settle(state, latest, now, &decision, estimate, cost);
        }
        mine
    }
}
