//! A limit of requests in flight per key, as a policy: [`Policy::concurrent`].

use std::future::Ready;
use std::hash::Hash;

use super::policy::{Policy, PolicyError, Settle};
use super::KeyExtractor;
use crate::algorithm::Concurrency;
use crate::decision::Decision;
use crate::{BoxError, KeyedRateLimiter, Limiter, Quota};

/// The limiter of a [`Policy::concurrent`]: at most a number of requests in flight per key,
/// each holding its slot until its response body ends or is dropped. Built only by that
/// policy, which gives every slot back exactly once.
#[derive(Clone, Debug)]
pub struct ConcurrencyLimiter<K>(KeyedRateLimiter<K, Concurrency>);

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Limiter<K> for ConcurrencyLimiter<K> {
    type Future = Ready<Result<Decision, BoxError>>;

    /// The requests in flight allowed per key, as `permits` (and burst) of a quota whose period
    /// plays no part.
    fn quota(&self) -> Quota {
        self.0.quota()
    }

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        Limiter::set_quota(&self.0, quota)
    }

    fn reserve(&self, key: &K, cost: u32) -> Self::Future {
        self.0.reserve(key, cost)
    }

    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        self.0.reserve_now(key, cost)
    }

    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        self.0.refund(key, cost, decision)
    }

    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        self.0.settle(key, estimate, decision, cost)
    }
}

impl<X> Policy<X, ConcurrencyLimiter<X::Key>>
where
    X: KeyExtractor,
    X::Key: Hash + Eq + Clone + Sync,
{
    /// At most `in_flight` requests of each key at once: an admitted request holds its slot
    /// until its response body ends, fails or is dropped, or until the inner service fails or
    /// the request is dropped before an answer; every slot goes back exactly once. A request
    /// that finds no free slot is refused at once, like any other policy's refusal (a `429`, in
    /// the same all-or-nothing decision: the other policies keep nothing), with `Retry-After:
    /// 1` (when a slot frees is not known); the headers say `qu="concurrent-requests"` and no
    /// window (draft-ietf-httpapi-ratelimit-headers-11): `"name";q=4;qu="concurrent-requests"`
    /// and `"name";r=2`. At most a million keys are held, those with nothing in flight dropped
    /// first.
    ///
    /// The layer must carry the body: call [`wrap_body`](super::RateLimitLayer::wrap_body).
    /// A concurrent policy keeps its hold: [`count_if`](Self::count_if),
    /// [`settle_by`](Self::settle_by) and [`settle_from_body`](Self::settle_from_body) leave it
    /// as it is. [`cost`](Self::cost) and [`cost_by`](Self::cost_by) choose how many slots a
    /// request takes.
    ///
    /// ```
    /// use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
    ///
    /// // Four streams at once per API key.
    /// let streams = Policy::concurrent("streams", HeaderKey::new("x-api-key")?, 4)?;
    /// let layer = RateLimitLayer::new(streams).wrap_body();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PolicyError`] for a bad name (as [`Policy::new`]) or an `in_flight` of zero.
    pub fn concurrent(
        name: impl Into<String>,
        key: X,
        in_flight: u32,
    ) -> Result<Self, PolicyError> {
        let quota = Quota::per_second(in_flight)
            .map_err(|_| PolicyError::new("in_flight", "must be at least 1"))?;
        let limiter = KeyedRateLimiter::builder(quota)
            .algorithm::<Concurrency>()
            .build();
        let mut policy = Policy::new(name, key, ConcurrencyLimiter(limiter))?;
        policy.settle = Settle::Held;
        Ok(policy)
    }
}
