//! Quotas that depend on the key: [`Tiers`], one limiter per plan, chosen per request.

use std::fmt;
use std::sync::Arc;

use crate::limiter::BoxReserve;
use crate::{decision::Decision, BoxError, Limiter, Quota};

/// A limiter whose quota depends on the key: each key is decided by the limiter of its tier (an
/// API key's plan, a tenant's contract), chosen at decision time by a function of the key, and
/// the rate-limit headers of a response advertise that tier's quota.
///
/// ```
/// use http::HeaderValue;
/// use tower_bulwark::{KeyedRateLimiter, Limiter, Quota, tiers::Tiers};
///
/// let plans = Tiers::new(
///     |key: &HeaderValue| {
///         if key.as_bytes().starts_with(b"pro-") { "pro" } else { "free" }
///     },
///     "free",
///     KeyedRateLimiter::new(Quota::per_day(20)?),
/// )
/// .tier("pro", KeyedRateLimiter::new(Quota::per_day(10_000)?));
///
/// let pro = HeaderValue::from_static("pro-42");
/// assert_eq!(plans.quota_for(&pro).permits(), 10_000);
/// assert_eq!(plans.quota_for(&HeaderValue::from_static("free-7")).permits(), 20);
/// # Ok::<(), tower_bulwark::QuotaError>(())
/// ```
///
/// Each tier keeps its own state: a key that moves to another tier (an upgrade) starts there
/// afresh, and finds its old state if it moves back before that state is forgotten. A decision
/// remembers the tier that made it, so a refund goes back to that tier even if the key has moved
/// since; each tier is its own limiter, so a decision of one tier (or of another limiter) that
/// reaches another tier gives nothing back there. A function that names no tier of the set makes the decision an [`UnknownTier`] error
/// (the layer answers `503` by default): send unknown plans to a tier of your choice in the
/// function instead. Tiers of tiers are not supported (a decision remembers one tier).
pub struct Tiers<K, T, L> {
    select: Arc<dyn Fn(&K) -> T + Send + Sync>,
    tiers: Vec<(T, L)>,
}

impl<K, T, L> Tiers<K, T, L>
where
    T: PartialEq + fmt::Debug,
{
    /// Tiers chosen by `select`, starting with `tier` decided by `limiter`; its quota is the one
    /// [`Limiter::quota`] reports (the quota of a request without a key).
    pub fn new(select: impl Fn(&K) -> T + Send + Sync + 'static, tier: T, limiter: L) -> Self {
        Self {
            select: Arc::new(select),
            tiers: vec![(tier, limiter)],
        }
    }

    /// Adds `tier`, decided by `limiter`. A tier named twice keeps its first limiter.
    pub fn tier(mut self, tier: T, limiter: L) -> Self {
        if !self.tiers.iter().any(|(t, _)| *t == tier) {
            self.tiers.push((tier, limiter));
        }
        self
    }

    /// The limiter of `tier`, if there is one.
    pub fn get(&self, tier: &T) -> Option<&L> {
        self.tiers.iter().find(|(t, _)| t == tier).map(|(_, l)| l)
    }

    /// The index of `key`'s tier, or the error that it names none.
    fn index(&self, key: &K) -> Result<usize, UnknownTier> {
        let tier = (self.select)(key);
        self.tiers
            .iter()
            .position(|(t, _)| *t == tier)
            .ok_or_else(|| UnknownTier {
                tier: format!("{tier:?}"),
            })
    }
}

impl<K, T: Clone, L: Clone> Clone for Tiers<K, T, L> {
    fn clone(&self) -> Self {
        Self {
            select: Arc::clone(&self.select),
            tiers: self.tiers.clone(),
        }
    }
}

impl<K, T: fmt::Debug, L: Limiter<K>> fmt::Debug for Tiers<K, T, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.tiers.iter().map(|(t, l)| (t, l.quota())))
            .finish()
    }
}

impl<K, T, L> Limiter<K> for Tiers<K, T, L>
where
    K: 'static,
    T: PartialEq + fmt::Debug + Send + Sync + 'static,
    L: Limiter<K>,
{
    /// Boxed: the decisions of limiters that need I/O, where an allocation is small beside the
    /// round trip; the others are made at once by `reserve_now`.
    type Future = BoxReserve;

    fn quota(&self) -> Quota {
        self.tiers[0].1.quota()
    }

    fn quota_for(&self, key: &K) -> Quota {
        self.index(key)
            .map_or_else(|_| self.quota(), |i| self.tiers[i].1.quota_for(key))
    }

    fn reserve(&self, key: &K, cost: u32) -> Self::Future {
        let tier = self
            .index(key)
            .map(|i| (i, self.tiers[i].1.reserve(key, cost)));
        Box::pin(async move {
            let (i, decision) = tier?;
            decision.await.map(|d| d.in_tier(i))
        })
    }

    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        match self.index(key) {
            Ok(i) => self.tiers[i]
                .1
                .reserve_now(key, cost)
                .map(|result| result.map(|d| d.in_tier(i))),
            Err(error) => Some(Err(error.into())),
        }
    }

    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        (self.tiers.get(decision.tier())).is_some_and(|(_, l)| l.refund(key, cost, decision))
    }

    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        let tier = self.tiers.get(decision.tier());
        tier.is_some_and(|(_, l)| l.settle(key, estimate, decision, cost))
    }
}

/// A key whose tier function named a tier that the [`Tiers`] does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownTier {
    tier: String,
}

impl fmt::Display for UnknownTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the key's tier {} has no limiter", self.tier)
    }
}

impl std::error::Error for UnknownTier {}
