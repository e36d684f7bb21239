//! Limiters: a quota, an algorithm, a store and a clock tied together.
//!
//! [`DirectRateLimiter`] is one limit for everything that shares it (a process-wide cap);
//! [`KeyedRateLimiter`] keeps one limit per key (client IP, API key, tenant). Both are cheap to
//! clone, and every clone shares one state.
//!
//! ```
//! use std::time::Duration;
//! use tower_bulwark::{KeyedRateLimiter, clock::ManualClock, Quota};
//!
//! let clock = ManualClock::new();
//! let limiter = KeyedRateLimiter::<&str>::builder(Quota::per_second(2)?)
//!     .clock(clock.clone())
//!     .build();
//! assert!(limiter.check(&"alice").allowed);
//! assert!(limiter.check(&"alice").allowed);
//! let refused = limiter.check(&"alice");
//! assert!(!refused.allowed);
//! assert_eq!(refused.retry_after, Duration::from_millis(500));
//! assert!(limiter.check(&"bob").allowed, "every key has its own budget");
//! clock.advance(Duration::from_millis(500));
//! assert!(limiter.check(&"alice").allowed);
//! # Ok::<(), tower_bulwark::QuotaError>(())
//! ```

use std::cell::Cell;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::hash::Hash;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;

use crate::algorithm::{Algorithm, Gcra, LatestReading};
use crate::clock::{Clock, SystemClock};
use crate::store::memory::{Full, MemoryStore};
use crate::{BoxError, Quota};

pub use super::store::memory::Overflow;
pub use crate::decision::{Decision, InsufficientCapacity};

/// Anything that decides on requests per key: the in-memory limiters, the Redis limiter, or a
/// limiter of your own. The HTTP layer is written against this trait.
pub trait Limiter<K>: Send + Sync + 'static {
    /// The future of a decision.
    type Future: Future<Output = Result<Decision, BoxError>> + Send + 'static;

    /// The quota this limiter enforces now (for the `RateLimit-Policy` header). It can change
    /// at run time (see [`set_quota`](Self::set_quota)), so it is returned by value.
    fn quota(&self) -> Quota;

    /// Replaces the quota at run time, for every clone of this limiter, keeping what each key
    /// has used: see [`KeyedRateLimiter::set_quota`] for what a change does to decisions. The
    /// default refuses with an error: a limiter of your own changes its quota only if it says
    /// how.
    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        let _ = quota;
        Err("this limiter cannot change its quota at run time".into())
    }

    /// The quota this limiter enforces for `key`, which the `RateLimit-Policy` header of a
    /// response to `key` advertises: [`quota`](Self::quota) unless the quota depends on the key
    /// (see [`Tiers`](crate::tiers::Tiers)).
    fn quota_for(&self, key: &K) -> Quota {
        let _ = key;
        self.quota()
    }

    /// Decides on `cost` permits for `key`, reserving a permit that arrives within the quota's
    /// `max_wait` (the decision's [`wait`](Decision::wait) says how long to wait before going on).
    fn reserve(&self, key: &K, cost: u32) -> Self::Future;

    /// The same decision as [`reserve`](Self::reserve), made at once when this limiter can make
    /// it without waiting for I/O; `None` means "use `reserve`". The in-memory limiters always
    /// answer here, which lets the HTTP layer decide without allocating a future. The default
    /// answers `None`.
    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        let _ = (key, cost);
        None
    }

    /// [`reserve_now`](Self::reserve_now) for a caller that reads nothing of an immediate
    /// admission: `Some(Ok(None))` when the permits were taken at once (no wait), otherwise what
    /// `reserve_now` answers. The HTTP layer's shortest path; a limiter may answer it without
    /// building the decision.
    #[doc(hidden)]
    #[inline]
    fn admit_now(&self, key: &K, cost: u32) -> Option<Result<Option<Decision>, BoxError>> {
        Some(
            self.reserve_now(key, cost)?
                .map(Decision::unless_admitted_now),
        )
    }

    /// Gives back an admitted decision whose caller went away (a dropped waiter) or that another
    /// policy vetoed. Where the algorithm cannot give it back, this does nothing.
    ///
    /// The decision is consumed: [`Decision`] is neither `Copy` nor `Clone`, so one admission is
    /// given back at most once, and the compiler says so:
    ///
    /// ```compile_fail,E0382
    /// use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};
    ///
    /// let limiter = KeyedRateLimiter::<u64>::new(Quota::per_second(1).unwrap());
    /// let decision = limiter.check(&7);
    /// limiter.refund(&7, 1, decision);
    /// limiter.refund(&7, 1, decision); // error: use of moved value
    /// ```
    ///
    /// The crate's limiters also remember which key a decision was made for: given back under
    /// another key, it gives nothing back. No more than the decision took is ever given back,
    /// whatever `cost` says.
    fn refund(&self, key: &K, cost: u32, decision: Decision);
}

pin_project! {
    /// The future of [`acquire`]: reserves, waits for the reservation to fall due, and gives it
    /// back if dropped while waiting.
    #[must_use = "futures do nothing unless polled"]
    pub struct Acquire<'a, K, L: Limiter<K>> {
        limiter: &'a L,
        key: &'a K,
        cost: u32,
        #[pin]
        state: AcquireState<L::Future>,
    }

    impl<'a, K, L: Limiter<K>> PinnedDrop for Acquire<'a, K, L> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let AcquireProj::Waiting { decision, .. } = this.state.project() {
                if let Some(decision) = decision.take() {
                    this.limiter.refund(this.key, *this.cost, decision);
                }
            }
        }
    }
}

pin_project! {
    #[project = AcquireProj]
    enum AcquireState<F> {
        Reserving { #[pin] reserve: F },
        Waiting { #[pin] sleep: Sleep, decision: Option<Decision> },
        Done,
    }
}

impl<K, L: Limiter<K>> fmt::Debug for Acquire<'_, K, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            AcquireState::Reserving { .. } => "reserving",
            AcquireState::Waiting { .. } => "waiting",
            AcquireState::Done => "done",
        };
        f.debug_struct("Acquire")
            .field("cost", &self.cost)
            .field("state", &state)
            .finish()
    }
}

impl<K, L: Limiter<K>> Future for Acquire<'_, K, L> {
    type Output = Result<Decision, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                AcquireProj::Reserving { reserve } => {
                    let decision = match ready!(reserve.poll(cx)) {
                        Ok(decision) => decision,
                        Err(err) => {
                            this.state.set(AcquireState::Done);
                            return Poll::Ready(Err(err));
                        }
                    };
                    if decision.allowed && !decision.wait.is_zero() {
                        let sleep = tokio::time::sleep(decision.wait);
                        this.state.set(AcquireState::Waiting {
                            sleep,
                            decision: Some(decision),
                        });
                    } else {
                        this.state.set(AcquireState::Done);
                        return Poll::Ready(Ok(decision));
                    }
                }
                AcquireProj::Waiting { sleep, decision } => {
                    ready!(sleep.poll(cx));
                    let decision = decision.take();
                    this.state.set(AcquireState::Done);
                    if let Some(decision) = decision {
                        return Poll::Ready(Ok(decision));
                    }
                    panic!("`Acquire` polled after completion");
                }
                AcquireProj::Done => panic!("`Acquire` polled after completion"),
            }
        }
    }
}

/// Reserves `cost` permits of `limiter` for `key` and waits until they fall due.
///
/// Resolves to the decision: admitted (after waiting, if it had to) or refused at once. If the
/// returned future is dropped while it waits, the reservation is given back.
pub fn acquire<'a, K, L: Limiter<K>>(limiter: &'a L, key: &'a K, cost: u32) -> Acquire<'a, K, L> {
    Acquire {
        limiter,
        key,
        cost,
        state: AcquireState::Reserving {
            reserve: limiter.reserve(key, cost),
        },
    }
}

/// Settings shared by the direct and the keyed limiter; start with
/// [`DirectRateLimiter::builder`] or [`KeyedRateLimiter::builder`].
#[derive(Debug, Clone)]
pub struct RateLimiterBuilder<K, A = Gcra, C = SystemClock> {
    quota: Quota,
    clock: C,
    max_keys: usize,
    overflow: Overflow,
    _marker: PhantomData<fn() -> (K, A)>,
}

/// The default bound on keys of a keyed limiter.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

impl<K, A, C> RateLimiterBuilder<K, A, C> {
    /// Uses algorithm `A2` instead of GCRA.
    pub fn algorithm<A2: Algorithm>(self) -> RateLimiterBuilder<K, A2, C> {
        RateLimiterBuilder {
            quota: self.quota,
            clock: self.clock,
            max_keys: self.max_keys,
            overflow: self.overflow,
            _marker: PhantomData,
        }
    }

    /// Reads time from `clock` (a [`ManualClock`](crate::clock::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> RateLimiterBuilder<K, A, C2> {
        RateLimiterBuilder {
            quota: self.quota,
            clock,
            max_keys: self.max_keys,
            overflow: self.overflow,
            _marker: PhantomData,
        }
    }

    /// The most keys a keyed limiter holds in memory (default [`DEFAULT_MAX_KEYS`]).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// What a keyed limiter does when it is full of live keys (default
    /// [`Overflow::EvictNearestIdle`]).
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.overflow = overflow;
        self
    }
}

impl<A: Algorithm, C: Clock> RateLimiterBuilder<(), A, C> {
    /// Builds a direct limiter.
    pub fn build(self) -> DirectRateLimiter<A, C> {
        let epoch = self.clock.now();
        DirectRateLimiter {
            inner: Arc::new(DirectInner {
                setup: RwLock::new(Setup::new(self.quota, epoch)),
                state: A::State::default(),
                latest: LatestReading::default(),
                clock: self.clock,
            }),
        }
    }
}

impl<K: Hash + Eq + Clone, A: Algorithm, C: Clock> RateLimiterBuilder<K, A, C> {
    /// Builds a keyed limiter.
    pub fn build_keyed(self) -> KeyedRateLimiter<K, A, C> {
        let epoch = self.clock.now();
        let setup = Arc::new(Setup::new(self.quota, epoch));
        KeyedRateLimiter {
            inner: Arc::new(KeyedInner {
                store: MemoryStore::new(self.max_keys, self.overflow, Arc::clone(&setup)),
                current: RwLock::new(setup),
                changing: Mutex::new(()),
                clock: self.clock,
            }),
        }
    }
}

/// A quota and the algorithm built for it: what a limiter decides with, replaced as one so that
/// no decision ever pairs one quota with another's algorithm.
#[derive(Debug)]
struct Setup<A> {
    quota: Quota,
    algorithm: A,
}

impl<A: Algorithm> Setup<A> {
    fn new(quota: Quota, epoch: u64) -> Self {
        Self {
            quota,
            algorithm: A::new(&quota, epoch),
        }
    }

    /// The setup for `quota` that carries on from this one at `now` (see
    /// [`Algorithm::with_quota`]).
    fn changed_to(&self, quota: Quota, now: u64) -> Self {
        Self {
            quota,
            algorithm: self.algorithm.with_quota(&quota, now),
        }
    }
}

/// The refusal of a new key whose shard is full of live keys (under
/// [`Overflow::RefuseNewKeys`]): room frees at `full.free_at`.
fn refused_when_full<A: Algorithm>(setup: &Setup<A>, full: Full, now: u64, cost: u32) -> Decision {
    let wait = Duration::from_nanos(full.free_at.saturating_sub(now));
    let limit = u64::from(setup.algorithm.capacity());
    Decision::refused(limit, 0, wait, wait).of_cost(cost)
}

fn check_cost<A: Algorithm>(algorithm: &A, cost: u32) -> Result<(), InsufficientCapacity> {
    let capacity = algorithm.capacity();
    if cost > capacity {
        Err(InsufficientCapacity::new(cost, capacity))
    } else {
        Ok(())
    }
}

/// One limit shared by every caller: a process-wide cap.
pub struct DirectRateLimiter<A: Algorithm = Gcra, C = SystemClock> {
    inner: Arc<DirectInner<A, C>>,
}

struct DirectInner<A: Algorithm, C> {
    /// The quota and its algorithm. A decision holds the read side while it decides, so it uses
    /// one pair throughout; [`set_quota`](DirectRateLimiter::set_quota) replaces the pair under
    /// the write side. Taking the read side uncontended is one atomic read-modify-write each
    /// way, about half of what an `ArcSwap` load costs (its thread-local debt slots), and the
    /// lock word sits next to the state the decision writes anyway.
    setup: RwLock<Setup<A>>,
    state: A::State,
    /// The latest reading of the one key (a keyed limiter has one per shard).
    latest: LatestReading,
    clock: C,
}

impl<A: Algorithm, C> DirectInner<A, C> {
    /// The quota and algorithm to decide with, held until the guard drops. A poisoned lock is
    /// used as it is: the pair is replaced whole or not at all, so a panic cannot leave it torn.
    #[inline(always)]
    fn read_setup(&self) -> RwLockReadGuard<'_, Setup<A>> {
        self.setup.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl DirectRateLimiter {
    /// A GCRA limiter on the system clock.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder to choose the algorithm and the clock.
    pub fn builder(quota: Quota) -> RateLimiterBuilder<(), Gcra, SystemClock> {
        RateLimiterBuilder {
            quota,
            clock: SystemClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            overflow: Overflow::default(),
            _marker: PhantomData,
        }
    }
}

impl<A: Algorithm, C: Clock> DirectRateLimiter<A, C> {
    /// Decides on one permit now, never waiting.
    #[inline]
    pub fn check(&self) -> Decision {
        let setup = self.inner.read_setup();
        let now = self.inner.clock.now();
        setup
            .algorithm
            .decide(&self.inner.state, &self.inner.latest, now, 1, 0)
            .of_cost(1)
    }

    /// Decides on `cost` permits now, never waiting.
    pub fn check_n(&self, cost: u32) -> Result<Decision, InsufficientCapacity> {
        let setup = self.inner.read_setup();
        check_cost(&setup.algorithm, cost)?;
        let now = self.inner.clock.now();
        Ok(setup
            .algorithm
            .decide(&self.inner.state, &self.inner.latest, now, cost, 0)
            .of_cost(cost))
    }

    /// Takes one permit, waiting up to the quota's `max_wait` for it; dropping the future while
    /// it waits gives the permit back.
    pub fn acquire(&self) -> Acquire<'_, (), Self> {
        acquire(self, &(), 1)
    }

    /// Takes `cost` permits, waiting up to the quota's `max_wait` for them. A cost above the
    /// capacity fails with [`InsufficientCapacity`].
    pub fn acquire_n(&self, cost: u32) -> Acquire<'_, (), Self> {
        acquire(self, &(), cost)
    }

    /// The quota it enforces now.
    pub fn quota(&self) -> Quota {
        self.inner.read_setup().quota
    }

    /// Replaces the quota for every clone of this limiter, keeping the state: see
    /// [`KeyedRateLimiter::set_quota`], which works the same way for its one key.
    pub fn set_quota(&self, quota: Quota) {
        let mut setup = self
            .inner
            .setup
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let now = self.inner.clock.now();
        // Built before it is stored: a panic here leaves the old pair in place, whole.
        let next = setup.changed_to(quota, now);
        *setup = next;
    }

    fn decide_now(&self, cost: u32) -> Result<Decision, BoxError> {
        let setup = self.inner.read_setup();
        check_cost(&setup.algorithm, cost)?;
        let now = self.inner.clock.now();
        let max_wait = setup.quota.max_wait_nanos();
        Ok(setup
            .algorithm
            .decide(&self.inner.state, &self.inner.latest, now, cost, max_wait)
            .of_cost(cost))
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
        let setup = self.inner.read_setup();
        f.debug_struct("DirectRateLimiter")
            .field("quota", &setup.quota)
            .field("algorithm", &setup.algorithm)
            .field("state", &self.inner.state)
            .field("latest", &self.inner.latest)
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
        ready(self.decide_now(cost))
    }

    #[inline]
    fn reserve_now(&self, _key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        Some(self.decide_now(cost))
    }

    fn refund(&self, _key: &K, cost: u32, decision: Decision) {
        if decision.allowed {
            let setup = self.inner.read_setup();
            let now = self.inner.clock.now();
            let cost = decision.refundable(cost);
            setup
                .algorithm
                .refund(&self.inner.state, &self.inner.latest, now, cost, &decision);
        }
    }
}

/// One limit per key, over a bounded in-memory store.
pub struct KeyedRateLimiter<K, A: Algorithm = Gcra, C = SystemClock> {
    inner: Arc<KeyedInner<K, A, C>>,
}

struct KeyedInner<K, A: Algorithm, C> {
    /// The keys, each shard with its own handle on the current setup: a decision reads the setup
    /// under the shard lock it takes anyway, so the hot path pays nothing for changes.
    store: MemoryStore<K, A::State, Arc<Setup<A>>>,
    /// The current setup, for [`KeyedRateLimiter::quota`] (which the HTTP layer reads for the
    /// `RateLimit-Policy` header of every admitted response) and for the next change. A read
    /// lock costs less than an `ArcSwap` load, and it is only written by a change.
    current: RwLock<Arc<Setup<A>>>,
    /// Held while the quota changes, so that changes apply one after the other.
    changing: Mutex<()>,
    clock: C,
}

impl<K, A: Algorithm, C> KeyedInner<K, A, C> {
    /// The current setup, held until the guard drops (a poisoned lock is used as it is: the
    /// setup is replaced whole).
    #[inline]
    fn current_setup(&self) -> RwLockReadGuard<'_, Arc<Setup<A>>> {
        self.current.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K: Hash + Eq + Clone> KeyedRateLimiter<K> {
    /// A GCRA limiter per key on the system clock, holding at most [`DEFAULT_MAX_KEYS`] keys.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder to choose the algorithm, the clock and the key bound.
    pub fn builder(quota: Quota) -> KeyedBuilder<K> {
        KeyedBuilder(RateLimiterBuilder {
            quota,
            clock: SystemClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            overflow: Overflow::default(),
            _marker: PhantomData,
        })
    }
}

/// The builder of a [`KeyedRateLimiter`]; see [`RateLimiterBuilder`] for the settings.
#[derive(Debug, Clone)]
pub struct KeyedBuilder<K, A = Gcra, C = SystemClock>(RateLimiterBuilder<K, A, C>);

impl<K: Hash + Eq + Clone, A: Algorithm, C: Clock> KeyedBuilder<K, A, C> {
    /// Uses algorithm `A2` instead of GCRA.
    pub fn algorithm<A2: Algorithm>(self) -> KeyedBuilder<K, A2, C> {
        KeyedBuilder(self.0.algorithm())
    }

    /// Reads time from `clock`.
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedBuilder<K, A, C2> {
        KeyedBuilder(self.0.clock(clock))
    }

    /// The most keys held in memory (default [`DEFAULT_MAX_KEYS`]).
    pub fn max_keys(self, max_keys: usize) -> Self {
        KeyedBuilder(self.0.max_keys(max_keys))
    }

    /// What to do when the store is full of live keys (default [`Overflow::EvictNearestIdle`]).
    pub fn overflow(self, overflow: Overflow) -> Self {
        KeyedBuilder(self.0.overflow(overflow))
    }

    /// Builds the limiter.
    pub fn build(self) -> KeyedRateLimiter<K, A, C> {
        self.0.build_keyed()
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, A: Algorithm, C: Clock>
    KeyedRateLimiter<K, A, C>
{
    /// Runs `decide` on the setup of `key`'s shard, the key's state (inserting the key if it is
    /// new), the shard's latest reading, the key's hash and the time; or `full` with the setup
    /// and the time if there is no room for the key.
    ///
    /// The clock is read once the key's state is found, not before the lookup. Reading
    /// `CLOCK_MONOTONIC` orders the processor's loads (the kernel's `rdtsc` is fenced), so a
    /// reading taken first holds back the loads of the table behind it, while one taken after
    /// overlaps with them. Measured on a keyed check over 100 000 keys (`CHECKS=10000000
    /// CHECK=keyed-system` on `benches/limiter.rs`): 143 ns before, 73 ns after. The
    /// algorithms decide as of the latest reading a key (or its shard) has seen, so where the
    /// clock is read changes no decision.
    #[inline(always)]
    fn with_key<R>(
        &self,
        key: &K,
        decide: impl FnOnce(&Setup<A>, &A::State, &LatestReading, u64, u64) -> R,
        full: impl FnOnce(&Setup<A>, Full, u64) -> R,
    ) -> R {
        let clock = &self.inner.clock;
        self.inner.store.with(
            key,
            || clock.now(),
            |setup, s| setup.algorithm.idle_at(s),
            |setup, s, now| setup.algorithm.eviction_rank(s, now),
            #[inline(always)]
            |setup, s, latest, hash| decide(setup, s, latest, hash, clock.now()),
            |setup, f, now| full(setup, f, now),
        )
    }

    /// Decides on `cost` permits for `key` with the setup of the key's shard, waiting up to the
    /// quota's `max_wait` if `wait`.
    ///
    /// One permit always fits (every quota has at least one). A larger cost is checked against
    /// the current setup before the key is touched (so that a request that can never fit does
    /// not create a key) and again against the shard's, which is the one that decides.
    #[inline(always)]
    fn decide(&self, key: &K, cost: u32, wait: bool) -> Result<Decision, InsufficientCapacity> {
        self.decide_with(
            key,
            cost,
            wait,
            |algorithm, s, latest, now, max_wait, hash| {
                algorithm
                    .decide(s, latest, now, cost, max_wait)
                    .of_cost(cost)
                    .for_key(hash)
            },
            |decision| decision,
        )
    }

    /// [`decide`](Self::decide) up to the algorithm: `decide` (the algorithm, the key's state and
    /// latest reading, now, the longest wait and the key's hash) decides, `full` turns the
    /// refusal of a full store into the answer.
    #[inline(always)]
    fn decide_with<R>(
        &self,
        key: &K,
        cost: u32,
        wait: bool,
        decide: impl FnOnce(&A, &A::State, &LatestReading, u64, u64, u64) -> R,
        full: impl FnOnce(Decision) -> R,
    ) -> Result<R, InsufficientCapacity> {
        if cost > 1 {
            check_cost(&self.inner.current_setup().algorithm, cost)?;
        }
        self.with_key(
            key,
            #[inline(always)]
            |setup, s, latest, hash, now| {
                if cost > 1 {
                    check_cost(&setup.algorithm, cost)?;
                }
                let max_wait = if wait {
                    setup.quota.max_wait_nanos()
                } else {
                    0
                };
                Ok(decide(&setup.algorithm, s, latest, now, max_wait, hash))
            },
            |setup, f, now| {
                if cost > 1 {
                    check_cost(&setup.algorithm, cost)?;
                }
                Ok(full(refused_when_full(setup, f, now, cost)))
            },
        )
    }

    /// [`Limiter::reserve`]'s decision: the cost checked, waiting up to the quota's `max_wait`.
    #[inline(always)]
    fn decide_checked(&self, key: &K, cost: u32) -> Result<Decision, BoxError> {
        Ok(self.decide(key, cost, true)?)
    }

    /// Decides on one permit for `key` now, never waiting.
    #[inline]
    pub fn check(&self, key: &K) -> Decision {
        self.with_key(
            key,
            #[inline(always)]
            |setup, s, latest, hash, now| {
                setup
                    .algorithm
                    .decide(s, latest, now, 1, 0)
                    .of_cost(1)
                    .for_key(hash)
            },
            |setup, full, now| refused_when_full(setup, full, now, 1),
        )
    }

    /// Decides on `cost` permits for `key` now, never waiting.
    pub fn check_n(&self, key: &K, cost: u32) -> Result<Decision, InsufficientCapacity> {
        self.decide(key, cost, false)
    }

    /// Takes one permit for `key`, waiting up to the quota's `max_wait` for it; dropping the
    /// future while it waits gives the permit back.
    pub fn acquire<'a>(&'a self, key: &'a K) -> Acquire<'a, K, Self> {
        acquire(self, key, 1)
    }

    /// Takes `cost` permits for `key`, waiting up to the quota's `max_wait` for them. A cost
    /// above the capacity fails with [`InsufficientCapacity`].
    pub fn acquire_n<'a>(&'a self, key: &'a K, cost: u32) -> Acquire<'a, K, Self> {
        acquire(self, key, cost)
    }

    /// The quota it enforces now.
    pub fn quota(&self) -> Quota {
        self.inner.current_setup().quota
    }

    /// Replaces the quota for every clone of this limiter, keeping every key's state.
    ///
    /// What a key has used stays used: a key that took 9 of 10 permits and whose quota becomes
    /// 20 has 11 left, not 20; one whose quota drops below what it took is refused until its
    /// use falls within the new quota. Each algorithm says exactly how its state carries over
    /// (see [`Algorithm::with_quota`]): GCRA keeps each key's TAT, the window algorithms keep
    /// their counts (the window in progress keeps its start and, under a new period, ends one
    /// new period after it), the sliding log keeps its entries. In the window of the change a
    /// key is admitted at most the larger of the two quotas.
    ///
    /// The new quota and the algorithm built for it replace the old pair together: every
    /// decision is made with one quota and its own algorithm, never a mix. A decision made
    /// while the change is under way uses the old pair or the new one; once this returns,
    /// every decision uses the new one. Decisions already made stand: an admission stays
    /// admitted, and a reservation granted under the old quota stays granted and falls due when
    /// it was told to (its permits count against the new quota as used). A refund of such a
    /// decision is made with the new algorithm, by the same rules as any other.
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
        let _changing = self
            .inner
            .changing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = self.inner.clock.now();
        let next = Arc::new(self.inner.current_setup().changed_to(quota, now));
        self.inner.store.set_context(&next);
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner) = next;
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
            .sweep(now, |setup, s| setup.algorithm.idle_at(s));
    }
}

impl<K, A: Algorithm, C> Clone for KeyedRateLimiter<K, A, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, A: Algorithm, C> fmt::Debug for KeyedRateLimiter<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let setup = self.inner.current_setup();
        f.debug_struct("KeyedRateLimiter")
            .field("quota", &setup.quota)
            .field("algorithm", &setup.algorithm)
            .field("store", &self.inner.store)
            .finish()
    }
}

impl<K, A, C> Limiter<K> for KeyedRateLimiter<K, A, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    C: Clock,
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
        ready(self.decide_checked(key, cost))
    }

    #[inline(always)]
    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        Some(self.decide_checked(key, cost))
    }

    #[inline(always)]
    fn admit_now(&self, key: &K, cost: u32) -> Option<Result<Option<Decision>, BoxError>> {
        // What is decided goes aside, so that an immediate admission returns through the
        // store's lock as one flag rather than as a whole (empty) decision.
        let decided = Cell::new(None);
        let admitted = self.decide_with(
            key,
            cost,
            true,
            |algorithm, s, latest, now, max_wait, hash| match algorithm
                .decide_unless_admitted_now(s, latest, now, cost, max_wait)
            {
                None => true,
                Some(decision) => {
                    decided.set(Some(decision.of_cost(cost).for_key(hash)));
                    false
                }
            },
            |decision| {
                decided.set(Some(decision));
                false
            },
        );
        Some(match admitted {
            Ok(true) => Ok(None),
            Ok(false) => Ok(decided.into_inner()),
            Err(error) => Err(error.into()),
        })
    }

    fn refund(&self, key: &K, cost: u32, decision: Decision) {
        if !decision.allowed {
            return;
        }
        let now = self.inner.clock.now();
        let cost = decision.refundable(cost);
        self.inner
            .store
            .with_existing(key, |setup, s, latest, hash| {
                // A decision made for another key gives nothing back here.
                if hash == decision.key {
                    setup.algorithm.refund(s, latest, now, cost, &decision)
                }
            });
    }
}
