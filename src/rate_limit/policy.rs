//! Named policies, and a boxed limiter for mixing limiter types on one route.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{BoxError, Decision, Limiter, Quota};

/// A limiter with the name that clients see in the `RateLimit-Policy` and `RateLimit` headers
/// and in the `violated-policies` of a refusal.
///
/// A name is one to 64 printable ASCII characters (space to `~`), so that it is a valid
/// Structured Field string and a valid JSON string without surprises.
#[derive(Clone)]
pub struct Policy<L> {
    pub(crate) name: Box<str>,
    pub(crate) limiter: L,
}

impl<L> Policy<L> {
    /// Names `limiter`; an error if the name is empty, longer than 64 characters, or not
    /// printable ASCII.
    pub fn new(name: impl Into<String>, limiter: L) -> Result<Self, PolicyError> {
        let name = name.into();
        if name.is_empty() {
            return Err(PolicyError { reason: "is empty" });
        }
        if name.len() > 64 {
            return Err(PolicyError {
                reason: "is longer than 64 characters",
            });
        }
        if !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(PolicyError {
                reason: "has a character that is not printable ASCII",
            });
        }
        Ok(Self {
            name: name.into_boxed_str(),
            limiter,
        })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<L> fmt::Debug for Policy<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A policy name that cannot be sent in a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyError {
    reason: &'static str,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid policy name: it {}", self.reason)
    }
}

impl std::error::Error for PolicyError {}

/// The future of a [`BoxLimiter`].
pub type BoxReserve = Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send>>;

trait ErasedLimiter<K>: Send + Sync + 'static {
    fn quota(&self) -> Quota;
    fn set_quota(&self, quota: Quota) -> Result<(), BoxError>;
    fn reserve(&self, key: &K, cost: u32) -> BoxReserve;
    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>>;
    fn refund(&self, key: &K, cost: u32, decision: &Decision);
}

impl<K, L: Limiter<K>> ErasedLimiter<K> for L {
    fn quota(&self) -> Quota {
        Limiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        Limiter::set_quota(self, quota)
    }

    fn reserve(&self, key: &K, cost: u32) -> BoxReserve {
        Box::pin(Limiter::reserve(self, key, cost))
    }

    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        Limiter::reserve_now(self, key, cost)
    }

    fn refund(&self, key: &K, cost: u32, decision: &Decision) {
        Limiter::refund(self, key, cost, decision)
    }
}

/// Any [`Limiter`] behind one type, so that policies of different kinds (a GCRA limiter in memory
/// and a sliding log in Redis, say) can share a route.
///
/// A limiter that decides at once (see [`Limiter::reserve_now`]) still does so through the box;
/// one that needs I/O costs one allocation per decision for its boxed future.
///
/// ```
/// use tower_bulwark::rate_limit::{BoxLimiter, Policy};
/// use tower_bulwark::{KeyedRateLimiter, Quota, SlidingLog};
///
/// let per_second = KeyedRateLimiter::<String>::new(Quota::per_second(10)?);
/// let per_day = KeyedRateLimiter::<String>::builder(Quota::per_hour(1000)?)
///     .algorithm::<SlidingLog>()
///     .build();
/// let policies = [
///     Policy::new("per-second", BoxLimiter::new(per_second))?,
///     Policy::new("per-hour", BoxLimiter::new(per_day))?,
/// ];
/// # let _ = policies;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BoxLimiter<K: 'static> {
    inner: Arc<dyn ErasedLimiter<K>>,
}

impl<K: 'static> BoxLimiter<K> {
    /// Boxes `limiter`.
    pub fn new<L: Limiter<K>>(limiter: L) -> Self {
        Self {
            inner: Arc::new(limiter),
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

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        self.inner.set_quota(quota)
    }

    fn reserve(&self, key: &K, cost: u32) -> BoxReserve {
        self.inner.reserve(key, cost)
    }

    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        self.inner.reserve_now(key, cost)
    }

    fn refund(&self, key: &K, cost: u32, decision: &Decision) {
        self.inner.refund(key, cost, decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(Policy::new("per-ip", ()).is_ok());
        assert!(Policy::new("with \"quotes\" and \\", ()).is_ok());
        assert!(Policy::new("", ()).is_err());
        assert!(Policy::new("é", ()).is_err());
        assert!(Policy::new("tab\there", ()).is_err());
        assert!(Policy::new("x".repeat(65), ()).is_err());
        let err = Policy::new("", ()).unwrap_err();
        assert_eq!(err.to_string(), "invalid policy name: it is empty");
    }
}
