//! [`KeyedRateLimiter`]: one limit per key, over the bounded in-memory store.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::future::{ready, Ready};
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use super::builder::{Keyed, RateLimiterBuilder};
use super::{acquire, Acquire, Limiter, Rule};
use crate::algorithm::{settle_debt, Algorithm, Gcra, LatestReading};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, InsufficientCapacity, LimiterId};
use crate::store::memory::{same_key, MemoryStore, ShardFull};
use crate::sync::{lock, unpoisoned, Mutex};
use crate::{BoxError, Quota};

/// One limit per key, over a bounded in-memory store.
///
/// `H` hashes the keys: std's [`RandomState`] unless the builder's
/// [`hasher`](RateLimiterBuilder::hasher) says otherwise.
pub struct KeyedRateLimiter<K, A: Algorithm = Gcra, C = SystemClock, H = RandomState> {
    pub(super) inner: Arc<KeyedInner<K, A, C, H>>,
}

/// What every clone of a [`KeyedRateLimiter`] shares.
pub(super) struct KeyedInner<K, A: Algorithm, C, H> {
    /// The keys, each shard with its own handle on the current rule: a decision reads the rule
    /// under the shard lock it takes anyway, so a decision pays nothing for changes.
    pub(super) store: MemoryStore<K, A::State, Arc<Rule<A>>, H>,
    /// The current rule, for [`KeyedRateLimiter::quota`] (which the HTTP layer reads for the
    /// `RateLimit-Policy` header of every admitted response) and for the next change.
    pub(super) current: RwLock<Arc<Rule<A>>>,
    /// Held while the quota changes, so that changes apply one after the other.
    pub(super) changing: Mutex<()>,
    pub(super) clock: C,
    /// Whose decisions a refund accepts: this limiter's and its clones'.
    pub(super) id: LimiterId,
}

impl<K, A: Algorithm, C, H> KeyedInner<K, A, C, H> {
    /// The current rule, held until the guard drops (a poisoned lock is used as it is: the rule
    /// is replaced whole).
    fn current_rule(&self) -> RwLockReadGuard<'_, Arc<Rule<A>>> {
        unpoisoned(self.current.read())
    }
}

impl<K: Hash + Eq + Clone> KeyedRateLimiter<K> {
    /// A GCRA limiter per key on the system clock, holding at most a million keys.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder to choose the algorithm, the clock, the hasher and the key bound.
    pub fn builder(quota: Quota) -> RateLimiterBuilder<Keyed<K>> {
        RateLimiterBuilder::new(quota)
    }
}

impl<K, A, C, H> KeyedRateLimiter<K, A, C, H>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    C: Clock,
    H: BuildHasher + Send + Sync + 'static,
{
    /// Decides on `cost` permits for `key` with the rule of the key's shard, waiting up to the
    /// quota's `max_wait` if `wait`.
    ///
    /// A cost above one is checked against the current rule before the key is touched (so that
    /// a request that can never fit does not create a key) and again against the shard's, which
    /// is the one that decides. One permit always fits (every quota holds at least one), and
    /// skipping the current rule then keeps every thread off its lock's shared counter.
    ///
    /// The clock is read once the key's state is found, not before the lookup: reading a clock
    /// may order the processor's loads (the OS clock's `rdtsc` is fenced), so a reading taken
    /// first would hold back the loads of the table behind it, while one taken after overlaps
    /// with them. The algorithms decide as of the latest reading a key (or its shard) has
    /// seen, so where the clock is read changes no decision.
    fn decide(&self, key: &K, cost: u32, wait: bool) -> Result<Decision, InsufficientCapacity> {
        if cost > 1 {
            self.inner.current_rule().check_cost(cost)?;
        }
        self.decide_by(
            key,
            cost,
            wait,
            |rule| rule.check_cost(cost).err().map(Err),
            Ok,
        )
    }

    /// Decides on `cost` permits for `key` by the rule of its shard, which `fits` checks the
    /// cost against (`Some` answer where it does not fit, `None` where it does); `answer` wraps the
    /// decision where it does. Generic over the answer so that [`check`](Self::check), whose
    /// one permit always fits, answers the `Decision` itself: moved out of a `Result`, its 128
    /// bytes were copied twice more per check (one hot key on one thread: 20.6 M checks a second with the
    /// copies, 22.6 M without; `PAIRED=20 THREADS=1 cargo bench --bench contention -- hot_key`).
    fn decide_by<R>(
        &self,
        key: &K,
        cost: u32,
        wait: bool,
        fits: impl Fn(&Rule<A>) -> Option<R>,
        answer: impl Fn(Decision) -> R,
    ) -> R {
        let clock = &self.inner.clock;
        self.with_key(
            key,
            |rule, s, latest, hash| {
                fits(rule).unwrap_or_else(|| {
                    let max_wait = if wait { rule.quota.max_wait_nanos() } else { 0 };
                    answer(
                        rule.algorithm
                            .decide(s, latest, clock.now(), cost, max_wait)
                            .of_cost(cost)
                            .for_key(hash)
                            .made_by(self.inner.id),
                    )
                })
            },
            // A new key whose shard is full of live keys (`Overflow::RefuseNewKeys`): room
            // frees at `full.free_at`.
            |rule, full, now| {
                fits(rule).unwrap_or_else(|| {
                    let wait = Duration::from_nanos(full.free_at.saturating_sub(now));
                    let limit = u64::from(rule.algorithm.capacity());
                    answer(Decision::refused(limit, 0, wait, wait).of_cost(cost))
                })
            },
        )
    }

    /// Runs `f` on the rule and the state of `key` (made afresh if the key is new), with its
    /// shard's latest reading and the key's hash; `full` instead, where the key is new and its
    /// shard has no room (see [`MemoryStore::with`]).
    fn with_key<R>(
        &self,
        key: &K,
        f: impl FnOnce(&Arc<Rule<A>>, &A::State, &LatestReading, u64) -> R,
        full: impl FnOnce(&Arc<Rule<A>>, ShardFull, u64) -> R,
    ) -> R {
        let clock = &self.inner.clock;
        self.inner.store.with(
            key,
            || clock.now(),
            |rule, s| rule.algorithm.idle_at(s),
            |rule, s, now| rule.algorithm.eviction_rank(s, now),
            f,
            full,
        )
    }

    /// Decides on one permit for `key` now, never waiting.
    pub fn check(&self, key: &K) -> Decision {
        let fits = |_: &Rule<A>| None;
        self.decide_by(key, 1, false, fits, |decision| decision)
    }

    /// Decides on `cost` permits for `key` now, never waiting. A cost of zero takes nothing; it
    /// is admitted unless the key is over its limit (see [`Limiter::reserve`]).
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `cost` is more than the quota can ever admit at once.
    pub fn check_n(&self, key: &K, cost: u32) -> Result<Decision, InsufficientCapacity> {
        self.decide(key, cost, false)
    }

    /// Takes one permit for `key`, waiting up to the quota's `max_wait` for it; dropping the
    /// future while it waits gives the permit back. For several permits at once,
    /// [`acquire`](super::acquire) takes a cost.
    pub fn acquire<'a>(&'a self, key: &'a K) -> Acquire<'a, K, Self> {
        acquire(self, key, 1)
    }

    /// The quota it enforces now.
    pub fn quota(&self) -> Quota {
        self.inner.current_rule().quota
    }

    /// Replaces the quota for every clone of this limiter, keeping every key's state.
    ///
    /// What a key has used stays used: a key that took 9 of 10 permits and whose quota becomes
    /// 20 has 11 left, not 20 (with GCRA, where the emission interval stays the same; otherwise
    /// what a key owes is kept as time: a key that used 1 of 1 an hour owes an hour, all 100
    /// permits of 100 an hour); one whose quota drops below what it took is refused until its
    /// use falls within the new quota. Each algorithm's state carries over its own way: GCRA
    /// keeps each key's TAT, the window algorithms keep their counts (the window in progress
    /// keeps its start and, under a new period, ends one new period after it), the sliding log
    /// keeps its entries. In the window of the change a key is admitted at most the larger of
    /// the two quotas, but for one case of GCRA's: a change that lengthens the emission interval
    /// counts what a key owes, as time, in the longer interval, so it weighs fewer permits (10
    /// of 10 per 30 minutes spent, then 10 an hour: the half hour owed is 5 of the new permits,
    /// and 5 more are admitted at the instant of the change). `Metered` and the window
    /// algorithms keep the bound there.
    ///
    /// The new quota and the algorithm built for it replace the old pair together: every
    /// decision is made with one quota and its own algorithm, never a mix. A decision made
    /// while the change is under way uses the old pair or the new one; once this returns,
    /// every decision uses the new one. Decisions already made stand: an admission stays
    /// admitted, and a reservation granted under the old quota stays granted and falls due when
    /// it was told to (its permits count against the new quota as used). A refund of such a
    /// decision is made with the new algorithm, by the same rules as any other.
    /// A request whose clock reading is older than the change (read by a thread before the
    /// change, its decision begun once this has returned) is decided as of the change, under
    /// the new quota, as any reading older than one the limiter has already seen is decided as
    /// of that one. (A decision begun before, under way during the change, may be decided by
    /// the old pair as of the change's instant: as if it had been made a moment later.)
    ///
    /// ```
    /// use tower_bulwark::{KeyedRateLimiter, clock::ManualClock, Quota};
    ///
    /// let limiter = KeyedRateLimiter::<&str>::builder(Quota::per_second(10)?)
    ///     .algorithm::<tower_bulwark::algorithm::FixedWindow>()
    ///     .clock(ManualClock::new())
    ///     .build();
    /// for _ in 0..9 {
    ///     assert!(limiter.check(&"alice").allowed);
    /// }
    /// limiter.set_quota(Quota::per_second(20)?);
    /// assert_eq!(limiter.quota().permits(), 20);
    /// assert_eq!(limiter.check(&"alice").remaining, 10, "9 + this one of 20 are used");
    /// # Ok::<(), tower_bulwark::QuotaError>(())
    /// ```
    pub fn set_quota(&self, quota: Quota) {
        let _changing = lock(&self.inner.changing);
        let now = self.inner.clock.now();
        let changed = Arc::new(self.inner.current_rule().changed_to(quota, now));
        self.inner.store.set_context(&changed, now);
        *unpoisoned(self.inner.current.write()) = changed;
    }

    /// The number of keys held in memory.
    pub fn len(&self) -> usize {
        self.inner.store.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys held in memory.
    pub fn max_keys(&self) -> usize {
        self.inner.store.capacity()
    }

    /// Drops every key whose state carries no information any more. No decision changes; call it
    /// from a timer to return memory between bursts of new keys.
    pub fn retain_recent(&self) {
        let now = self.inner.clock.now();
        self.inner
            .store
            .sweep(now, |rule, s| rule.algorithm.idle_at(s));
    }
}

impl<K, A: Algorithm, C, H> Clone for KeyedRateLimiter<K, A, C, H> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, A: Algorithm, C, H> fmt::Debug for KeyedRateLimiter<K, A, C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = self.inner.current_rule();
        f.debug_struct("KeyedRateLimiter")
            .field("quota", &rule.quota)
            .field("algorithm", &rule.algorithm)
            .field("store", &self.inner.store)
            .finish()
    }
}

impl<K, A, C, H> Limiter<K> for KeyedRateLimiter<K, A, C, H>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    C: Clock,
    H: BuildHasher + Send + Sync + 'static,
{
    type Future = Ready<Result<Decision, BoxError>>;

    fn quota(&self) -> Quota {
        KeyedRateLimiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        KeyedRateLimiter::set_quota(self, quota);
        Ok(())
    }

    fn reserve(&self, key: &K, cost: u32) -> Self::Future {
        ready(self.decide(key, cost, true).map_err(Into::into))
    }

    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        Some(self.decide(key, cost, true).map_err(Into::into))
    }

    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        Limiter::settle(self, key, cost, decision, 0)
    }

    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        if !decision.allowed {
            return false;
        }
        let now = self.inner.clock.now();
        let estimate = decision.refundable(estimate);
        let settle = |rule: &Arc<Rule<A>>, s: &A::State, latest: &LatestReading, at| {
            // A decision made by another limiter, or for another key, changes nothing.
            let Some(made_at) = decision.fingerprint_by(self.inner.id) else {
                return false;
            };
            if made_at == at {
                (rule.algorithm).settle(s, latest, now, &decision, estimate, cost);
                true
            } else if same_key(made_at, at) {
                // Made on the key before it was dropped: what it took went with that state
                // (never back into this one, which never held it, so nothing is taken back),
                // and a debt lands here, as it would have on the dropped state.
                let debt = settle_debt(estimate, cost, rule.algorithm.capacity());
                if debt > 0 {
                    (rule.algorithm).charge(s, latest, now, debt);
                }
                debt > 0
            } else {
                false
            }
        };
        if cost <= estimate {
            // A key dropped since forgot the admission: nothing of it is left to give back.
            return self.inner.store.with_existing(key, settle).unwrap_or(false);
        }
        // A debt is charged even to a key dropped since (only a shard with no room for the key
        // loses it, as it refuses the key's next request).
        self.with_key(key, settle, |_, _, _| false)
    }
}
