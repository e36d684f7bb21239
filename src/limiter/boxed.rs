//! [`BoxLimiter`]: any limiter behind one type, for limiters chosen at run time, and
//! [`BoxReserve`], the boxed future of a decision that needs I/O.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::Limiter;
use crate::{decision::Decision, BoxError, Quota};

/// The future of a decision that a limiter could not make at once (one that needs I/O, such as
/// Redis), boxed so that a layer's policies can be of any limiter type.
pub type BoxReserve = Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send>>;

/// A limiter whose decisions that need I/O come boxed, so that limiters of any type fit behind
/// one `dyn Limiter<K, Future = BoxReserve>`.
struct Boxed<L>(L);

impl<K, L: Limiter<K>> Limiter<K> for Boxed<L> {
    type Future = BoxReserve;

    fn quota(&self) -> Quota {
        self.0.quota()
    }

    fn quota_for(&self, key: &K) -> Quota {
        self.0.quota_for(key)
    }

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        self.0.set_quota(quota)
    }

    fn reserve(&self, key: &K, cost: u32) -> BoxReserve {
        Box::pin(self.0.reserve(key, cost))
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

/// Any [`Limiter`] behind one type, for limiters chosen at run time (as a configuration does):
/// a GCRA limiter in memory or a sliding log in Redis, say. Policies of different limiter types
/// chained with [`Policy::and`](crate::rate_limit::Policy::and) need no box.
///
/// A limiter that decides at once (see [`Limiter::reserve_now`]) still does so through the box;
/// one that needs I/O costs one allocation per decision for its boxed future.
pub struct BoxLimiter<K: 'static> {
    inner: Arc<dyn Limiter<K, Future = BoxReserve>>,
}

impl<K: 'static> BoxLimiter<K> {
    /// Boxes `limiter`.
    pub fn new<L: Limiter<K>>(limiter: L) -> Self {
        Self {
            inner: Arc::new(Boxed(limiter)),
        }
    }
}

impl<K: 'static> Clone for BoxLimiter<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K: 'static> fmt::Debug for BoxLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxLimiter")
            .field("quota", &self.inner.quota())
            .finish_non_exhaustive()
    }
}

impl<K: 'static> Limiter<K> for BoxLimiter<K> {
    type Future = BoxReserve;

    fn quota(&self) -> Quota {
        self.inner.quota()
    }

    fn quota_for(&self, key: &K) -> Quota {
        self.inner.quota_for(key)
    }

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        self.inner.set_quota(quota)
    }

    fn reserve(&self, key: &K, cost: u32) -> BoxReserve {
        self.inner.reserve(key, cost)
    }

    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        self.inner.reserve_now(key, cost)
    }

    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        self.inner.refund(key, cost, decision)
    }

    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        self.inner.settle(key, estimate, decision, cost)
    }
}
