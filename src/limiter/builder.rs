//! The one builder of the in-memory limiters.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

use super::direct::{DirectInner, DirectRateLimiter};
use super::keyed::{KeyedInner, KeyedRateLimiter};
use super::Rule;
use crate::algorithm::{Algorithm, Gcra};
use crate::clock::{Clock, SystemClock};
use crate::decision::LimiterId;
use crate::store::memory::{MemoryStore, Overflow};
use crate::sync::Mutex;
use crate::Quota;

/// The default bound on keys of a keyed limiter.
pub(crate) const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// What a [`RateLimiterBuilder`] builds: a [`DirectRateLimiter`], which has no keys.
#[derive(Debug, Clone, Copy)]
pub struct Direct;

/// What a [`RateLimiterBuilder`] builds: a [`KeyedRateLimiter`] with keys of type `K`.
pub struct Keyed<K>(PhantomData<fn() -> K>);

// By hand rather than derived: a marker is `Debug`, `Clone` and `Copy` whatever `K` is.
impl<K> fmt::Debug for Keyed<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keyed")
    }
}

impl<K> Clone for Keyed<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Keyed<K> {}

/// The settings of an in-memory limiter; start with [`DirectRateLimiter::builder`] or
/// [`KeyedRateLimiter::builder`] (`L` marks which, and for keys their type), and finish with
/// `build`.
///
/// `A` is the algorithm, `C` the clock and, for a keyed limiter, `H` how keys are hashed: std's
/// [`RandomState`] (SipHash under random keys, so clients cannot choose keys that collide) unless
/// [`hasher`](Self::hasher) says otherwise.
///
/// ```
/// use tower_bulwark::{algorithm::FixedWindow, clock::ManualClock, KeyedRateLimiter, Quota};
///
/// let limiter = KeyedRateLimiter::<u64>::builder(Quota::per_second(10)?)
///     .algorithm::<FixedWindow>()
///     .clock(ManualClock::new())
///     .max_keys(10_000)
///     .build();
/// assert!(limiter.check(&7).allowed);
/// # Ok::<(), tower_bulwark::QuotaError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RateLimiterBuilder<L, A = Gcra, C = SystemClock, H = RandomState> {
    quota: Quota,
    clock: C,
    hasher: H,
    max_keys: usize,
    overflow: Overflow,
    _marker: PhantomData<fn() -> (L, A)>,
}

impl<L> RateLimiterBuilder<L> {
    /// GCRA on the system clock, keys hashed by std's `RandomState`.
    pub(super) fn new(quota: Quota) -> Self {
        Self {
            quota,
            clock: SystemClock::new(),
            hasher: RandomState::new(),
            max_keys: DEFAULT_MAX_KEYS,
            overflow: Overflow::default(),
            _marker: PhantomData,
        }
    }
}

impl<L, A, C, H> RateLimiterBuilder<L, A, C, H> {
    /// Uses algorithm `A2` instead of GCRA.
    pub fn algorithm<A2: Algorithm>(self) -> RateLimiterBuilder<L, A2, C, H> {
        self.remade(|clock, hasher| (clock, hasher))
    }

    /// Reads time from `clock` (a [`ManualClock`](crate::clock::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> RateLimiterBuilder<L, A, C2, H> {
        self.remade(|_, hasher| (clock, hasher))
    }

    /// The same settings under algorithm `A2`, with the clock and the hasher that `parts` makes
    /// of this builder's.
    fn remade<A2, C2, H2>(
        self,
        parts: impl FnOnce(C, H) -> (C2, H2),
    ) -> RateLimiterBuilder<L, A2, C2, H2> {
        let (clock, hasher) = parts(self.clock, self.hasher);
        RateLimiterBuilder {
            quota: self.quota,
            clock,
            hasher,
            max_keys: self.max_keys,
            overflow: self.overflow,
            _marker: PhantomData,
        }
    }
}

impl<A: Algorithm, C: Clock> RateLimiterBuilder<Direct, A, C> {
    /// Builds the direct limiter.
    pub fn build(self) -> DirectRateLimiter<A, C> {
        let epoch = self.clock.now();
        DirectRateLimiter {
            inner: Arc::new(DirectInner {
                rule: crossbeam_utils::atomic::AtomicCell::new(Rule::new(self.quota, epoch)),
                changing: Default::default(),
                written: Default::default(),
                clock: self.clock,
                id: LimiterId::new(),
            }),
        }
    }
}

impl<K, A, C, H> RateLimiterBuilder<Keyed<K>, A, C, H>
where
    K: Hash + Eq + Clone,
    A: Algorithm,
    C: Clock,
    H: BuildHasher,
{
    /// Hashes keys with `hasher` (foldhash's or ahash's `RandomState`, for instance) instead of
    /// std's `RandomState`. Keys come from clients: a hasher without random keys lets a client
    /// choose keys that collide in one shard's table. Refunds also tell keys apart by their
    /// hash: two keys that collide under `hasher` take back each other's decisions (see
    /// [`Limiter::refund`](crate::Limiter::refund)).
    pub fn hasher<H2: BuildHasher>(self, hasher: H2) -> RateLimiterBuilder<Keyed<K>, A, C, H2> {
        self.remade(|clock, _| (clock, hasher))
    }

    /// The most keys held in memory (default one million).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// What to do when the store is full of live keys (default [`Overflow::EvictNearestIdle`]).
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.overflow = overflow;
        self
    }

    /// Builds the keyed limiter.
    pub fn build(self) -> KeyedRateLimiter<K, A, C, H> {
        let epoch = self.clock.now();
        let rule = Arc::new(Rule::new(self.quota, epoch));
        let store = MemoryStore::new(self.max_keys, self.overflow, Arc::clone(&rule), self.hasher);
        KeyedRateLimiter {
            inner: Arc::new(KeyedInner {
                store,
                current: RwLock::new(rule),
                changing: Mutex::new(()),
                clock: self.clock,
                id: LimiterId::new(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyedRateLimiter;

    #[test]
    fn a_keyed_builder_is_cloned_and_printed_whatever_its_key() {
        /// A key that is neither `Debug` nor `Copy`.
        #[derive(Hash, PartialEq, Eq, Clone)]
        struct Tenant(String);
        let builder = KeyedRateLimiter::<Tenant>::builder(Quota::per_second(1).unwrap());
        let copy = builder.clone();
        assert!(format!("{copy:?}").contains("RateLimiterBuilder"));
        let limiter = builder.build();
        assert!(limiter.check(&Tenant("a".into())).allowed);
    }
}
