//! Policies: a name, a key, a cost and a limiter; and the sets of policies a layer holds.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::head::RequestHead;

use super::key::{KeyError, KeyExtractor};
use super::response::PolicyInfo;
use crate::{decision::Decision, BoxError, Limiter, Quota};

/// One rate limit on a route: a name that clients see, a [`KeyExtractor`] that says whom a
/// request counts against, a [`Limiter`] that decides, and what a request costs.
///
/// ```
/// use std::net::IpAddr;
///
/// use http::header::HeaderName;
/// use tower_bulwark::rate_limit::{HeaderKey, PeerIp, Policy, RateLimitLayer};
/// use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Quota};
///
/// // Ten per second per client IP, a thousand per day per API key, 500 per second in all:
/// // three keys, three limiters, one all-or-nothing decision.
/// let per_ip = Policy::new("per-ip", PeerIp::new(), KeyedRateLimiter::new(Quota::per_second(10)?))?;
/// let per_key = Policy::new(
///     "per-key",
///     HeaderKey::new(HeaderName::from_static("x-api-key")),
///     KeyedRateLimiter::new(Quota::per_day(1000)?),
/// )?
/// // A search costs five permits of this policy, anything else one.
/// .cost_by(|request| if request.uri.path() == "/search" { 5 } else { 1 });
/// let all = Policy::global("all", DirectRateLimiter::new(Quota::per_second(500)?))?;
/// let layer = RateLimitLayer::new(per_ip.and(per_key).and(all));
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A name is one to 64 printable ASCII characters (space to `~`), so that it is a valid
/// Structured Field string and a valid JSON string without surprises.
pub struct Policy<X, L> {
    pub(crate) name: Box<str>,
    pub(crate) key: X,
    pub(crate) limiter: L,
    pub(crate) cost: Cost,
    pub(crate) count_if: Option<Arc<CountIf>>,
    pub(crate) shadow: Shadow,
}

/// What one request costs a policy.
#[derive(Clone)]
pub(crate) enum Cost {
    Fixed(u32),
    By(Arc<dyn Fn(&RequestHead<'_>) -> u32 + Send + Sync>),
}

/// Whether a response counts against a policy.
pub(crate) type CountIf = dyn Fn(&http::response::Parts) -> bool + Send + Sync;

/// Whether a policy may refuse, and whether a shadow policy is advertised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shadow {
    /// The policy refuses what it does not admit.
    Off,
    /// The policy never refuses; it is left out of the rate-limit headers.
    Silent,
    /// The policy never refuses, but the headers describe it as if it did.
    Advertised,
}

impl<X: KeyExtractor, L: Limiter<X::Key>> Policy<X, L> {
    /// A policy named `name` that keys requests with `key` and decides with `limiter`; each
    /// request costs one permit. An error if the name is empty, longer than 64 characters, or not
    /// printable ASCII.
    pub fn new(name: impl Into<String>, key: X, limiter: L) -> Result<Self, PolicyError> {
        let name = name.into();
        check_name(&name)?;
        Ok(Self {
            name: name.into_boxed_str(),
            key,
            limiter,
            cost: Cost::Fixed(1),
            count_if: None,
            shadow: Shadow::Off,
        })
    }
}

impl<L: Limiter<()>> Policy<super::GlobalKey, L> {
    /// A policy that puts every request in one budget ([`GlobalKey`](super::GlobalKey)): a cap
    /// on the whole route.
    pub fn global(name: impl Into<String>, limiter: L) -> Result<Self, PolicyError> {
        Self::new(name, super::GlobalKey, limiter)
    }
}

impl<X, L> Policy<X, L> {
    /// Every request costs `permits` (one by default). A cost of zero leaves the policy out of
    /// the request's decision and its headers.
    ///
    /// A cost above what the limiter can ever hold at once (its burst) is refused with a `429`
    /// that says the request can never be admitted, without a `Retry-After`.
    pub fn cost(mut self, permits: u32) -> Self {
        self.cost = Cost::Fixed(permits);
        self
    }

    /// Each request costs what `cost` says from its head: the path, the method, a header, or
    /// axum's `MatchedPath` in the extensions. Zero leaves the policy out, as for
    /// [`cost`](Self::cost).
    ///
    /// ```
    /// use axum::extract::MatchedPath;
    /// use tower_bulwark::rate_limit::{PeerIp, Policy};
    /// use tower_bulwark::{KeyedRateLimiter, Quota};
    ///
    /// let policy = Policy::new("per-ip", PeerIp::new(), KeyedRateLimiter::new(Quota::per_second(10)?))?
    ///     .cost_by(|request| {
    ///         match request.extensions.get::<MatchedPath>().map(MatchedPath::as_str) {
    ///             Some("/search") => 5,
    ///             _ => 1,
    ///         }
    ///     });
    /// # let _ = policy;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// axum puts `MatchedPath` in the extensions before a `route_layer` runs, not before a
    /// `Router::layer`.
    pub fn cost_by(
        mut self,
        cost: impl Fn(&RequestHead<'_>) -> u32 + Send + Sync + 'static,
    ) -> Self {
        self.cost = Cost::By(Arc::new(cost));
        self
    }

    /// Counts only requests whose response matches `counts` (a failed login, a server error):
    /// the permit is taken before the request goes on, so a client already over the limit is
    /// refused before the inner service runs, and it is given back when the response turns out
    /// not to count.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_bulwark::rate_limit::{PeerIp, Policy};
    /// use tower_bulwark::{KeyedRateLimiter, Quota};
    ///
    /// // Five failed logins per minute per client IP; successful ones never count.
    /// let failures = Policy::new("login-failures", PeerIp::new(), KeyedRateLimiter::new(Quota::per_minute(5)?))?
    ///     .count_if(|response| response.status == StatusCode::UNAUTHORIZED);
    /// # let _ = failures;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// A request counts unless a response proves otherwise: when the inner service fails
    /// instead of answering, or the response future is dropped before the response (the client
    /// went away), its permit stays spent. A policy that counts by outcome keeps the request's key
    /// until the response: one allocation per admitted request.
    pub fn count_if(
        mut self,
        counts: impl Fn(&http::response::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.count_if = Some(Arc::new(counts));
        self
    }

    /// Shadow mode: the policy decides and counts as usual, but never refuses a request, and is
    /// left out of the rate-limit headers. A request it would have refused goes on (if the other
    /// policies admit it), with an `info` log line and, with the `metrics` feature, the counter
    /// `bulwark_ratelimit_shadow_refusals_total`: a new limit can be watched before it is
    /// enforced. A shadow policy never makes a request wait, and a failure of its limiter never
    /// answers `503`.
    pub fn shadow(mut self) -> Self {
        self.shadow = Shadow::Silent;
        self
    }

    /// Shadow mode, as [`shadow`](Self::shadow), but with the policy in the rate-limit headers
    /// as if it were enforced, so clients can adapt before it is.
    pub fn shadow_advertised(mut self) -> Self {
        self.shadow = Shadow::Advertised;
        self
    }

    /// This policy and then `next` (a policy or a chain of them), for one layer: a request is
    /// admitted only if all of them admit it. Each keeps its own key, cost and limiter types.
    pub fn and<Q>(self, next: Q) -> Chain<Self, Q> {
        Chain::new(self, next)
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key extractor.
    pub fn key(&self) -> &X {
        &self.key
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<X: Clone, L: Clone> Clone for Policy<X, L> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            key: self.key.clone(),
            limiter: self.limiter.clone(),
            cost: self.cost.clone(),
            count_if: self.count_if.clone(),
            shadow: self.shadow,
        }
    }
}

impl<X, L> fmt::Debug for Policy<X, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Policy");
        s.field("name", &self.name)
            .field("key", &std::any::type_name::<X>());
        match &self.cost {
            Cost::Fixed(permits) => s.field("cost", permits),
            Cost::By(_) => s.field("cost", &"by request"),
        };
        s.field(
            "counts",
            &if self.count_if.is_some() { "if" } else { "all" },
        )
        .field("shadow", &self.shadow)
        .finish_non_exhaustive()
    }
}

pub(crate) fn check_name(name: &str) -> Result<(), PolicyError> {
    let reason = if name.is_empty() {
        "is empty"
    } else if name.len() > 64 {
        "is longer than 64 characters"
    } else if !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        "has a character that is not printable ASCII"
    } else {
        return Ok(());
    };
    Err(PolicyError { reason })
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

/// The future of a decision that a limiter could not make at once (one that needs I/O, such as
/// Redis), boxed so that a layer's policies can be of any limiter type.
pub type BoxReserve = Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send>>;

/// The policies of one layer: one [`Policy`], several chained with
/// [`Policy::and`] (each with its own key and limiter
/// types), or a `Vec` of policies of one type (built at run time, as from a configuration).
///
/// Sealed: its methods are the layer's business.
pub trait PolicySet: sealed::Sealed + Send + Sync + 'static {
    /// The keys of one request, one slot per policy.
    #[doc(hidden)]
    type Keys: Default + Send + 'static;

    /// How many policies.
    #[doc(hidden)]
    fn len(&self) -> usize;

    /// Whether there are none (an empty `Vec`).
    #[doc(hidden)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How each policy is described to clients, in order.
    #[doc(hidden)]
    fn describe(&self, out: &mut Vec<PolicyInfo>);

    /// No key yet.
    #[doc(hidden)]
    fn no_keys(&self) -> Self::Keys;

    /// Finds policy `i`'s key and cost for the request (a cost of zero means the policy sits
    /// this request out).
    #[doc(hidden)]
    fn prepare(
        &self,
        i: usize,
        head: &RequestHead<'_>,
        keys: &mut Self::Keys,
    ) -> Result<u32, KeyError>;

    /// Policy `i`'s decision at once, if its limiter can make it so.
    #[doc(hidden)]
    fn reserve_now(&self, i: usize, keys: &Self::Keys) -> Option<Result<Decision, BoxError>>;

    /// Policy `i`'s [`Limiter::admit_now`](crate::Limiter::admit_now): `Some(Ok(None))` for
    /// permits taken at once, otherwise its decision at once, if its limiter can make it so.
    #[doc(hidden)]
    #[inline]
    fn admit_now(&self, i: usize, keys: &Self::Keys) -> Option<Result<Option<Decision>, BoxError>> {
        Some(
            self.reserve_now(i, keys)?
                .map(Decision::unless_admitted_now),
        )
    }

    /// Policy `i`'s decision, later.
    #[doc(hidden)]
    fn reserve(&self, i: usize, keys: &Self::Keys) -> BoxReserve;

    /// The cost policy `i` found for the request (zero if it found none).
    #[doc(hidden)]
    fn cost(&self, i: usize, keys: &Self::Keys) -> u32;

    /// Gives policy `i`'s admission back.
    #[doc(hidden)]
    fn refund(&self, i: usize, keys: &Self::Keys, decision: Decision);

    /// Whether `response` counts against policy `i`.
    #[doc(hidden)]
    fn counts(&self, i: usize, response: &http::response::Parts) -> bool;

    /// Policy `i`'s quota for the key it found (the quota its headers advertise), or its
    /// limiter's quota if it found none.
    #[doc(hidden)]
    fn quota(&self, i: usize, keys: &Self::Keys) -> Quota;
}

/// Two sets of policies, asked in order: the type that [`Policy::and`] builds.
#[derive(Clone, Debug)]
pub struct Chain<A, B> {
    first: A,
    second: B,
}

impl<A, B> Chain<A, B> {
    fn new(first: A, second: B) -> Self {
        Self { first, second }
    }

    /// These policies and then `next`.
    pub fn and<Q>(self, next: Q) -> Chain<Self, Q> {
        Chain::new(self, next)
    }
}

mod sealed {
    pub trait Sealed {}
    impl<X, L> Sealed for super::Policy<X, L> {}
    impl<A, B> Sealed for super::Chain<A, B> {}
    impl<X, L> Sealed for Vec<super::Policy<X, L>> {}
}

/// What one policy keeps of one request: its key and the cost it was asked for.
type Slot<K> = Option<(K, u32)>;

fn slot<K>(slot: &Slot<K>) -> (&K, u32) {
    let (key, cost) = slot
        .as_ref()
        .expect("a policy is asked to decide only once its key is found");
    (key, *cost)
}

impl<X, L> Policy<X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new(
            &self.name,
            self.limiter.quota(),
            self.shadow,
            self.count_if.is_some(),
        )
    }

    #[inline]
    fn prepare_one(
        &self,
        head: &RequestHead<'_>,
        slot: &mut Slot<X::Key>,
    ) -> Result<u32, KeyError> {
        let cost = match &self.cost {
            Cost::Fixed(permits) => *permits,
            Cost::By(cost) => cost(head),
        };
        if cost == 0 {
            return Ok(0);
        }
        *slot = Some((self.key.extract(head)?, cost));
        Ok(cost)
    }
}

impl<X, L> PolicySet for Policy<X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    type Keys = Slot<X::Key>;

    #[inline]
    fn len(&self) -> usize {
        1
    }

    fn describe(&self, out: &mut Vec<PolicyInfo>) {
        out.push(self.info());
    }

    #[inline]
    fn no_keys(&self) -> Self::Keys {
        None
    }

    #[inline]
    fn prepare(
        &self,
        _: usize,
        head: &RequestHead<'_>,
        keys: &mut Self::Keys,
    ) -> Result<u32, KeyError> {
        self.prepare_one(head, keys)
    }

    #[inline]
    fn reserve_now(&self, _: usize, keys: &Self::Keys) -> Option<Result<Decision, BoxError>> {
        let (key, cost) = slot(keys);
        self.limiter.reserve_now(key, cost)
    }

    #[inline]
    fn admit_now(&self, _: usize, keys: &Self::Keys) -> Option<Result<Option<Decision>, BoxError>> {
        let (key, cost) = slot(keys);
        self.limiter.admit_now(key, cost)
    }

    fn reserve(&self, _: usize, keys: &Self::Keys) -> BoxReserve {
        let (key, cost) = slot(keys);
        Box::pin(self.limiter.reserve(key, cost))
    }

    #[inline]
    fn cost(&self, _: usize, keys: &Self::Keys) -> u32 {
        keys.as_ref().map_or(0, |(_, cost)| *cost)
    }

    fn refund(&self, _: usize, keys: &Self::Keys, decision: Decision) {
        let (key, cost) = slot(keys);
        self.limiter.refund(key, cost, decision);
    }

    fn counts(&self, _: usize, response: &http::response::Parts) -> bool {
        self.count_if.as_ref().is_none_or(|counts| counts(response))
    }

    #[inline]
    fn quota(&self, _: usize, keys: &Self::Keys) -> Quota {
        match keys {
            Some((key, _)) => self.limiter.quota_for(key),
            None => self.limiter.quota(),
        }
    }
}

impl<A: PolicySet, B: PolicySet> PolicySet for Chain<A, B> {
    type Keys = (A::Keys, B::Keys);

    #[inline]
    fn len(&self) -> usize {
        self.first.len() + self.second.len()
    }

    fn describe(&self, out: &mut Vec<PolicyInfo>) {
        self.first.describe(out);
        self.second.describe(out);
    }

    #[inline]
    fn no_keys(&self) -> Self::Keys {
        (self.first.no_keys(), self.second.no_keys())
    }

    #[inline]
    fn prepare(
        &self,
        i: usize,
        head: &RequestHead<'_>,
        keys: &mut Self::Keys,
    ) -> Result<u32, KeyError> {
        match i.checked_sub(self.first.len()) {
            None => self.first.prepare(i, head, &mut keys.0),
            Some(j) => self.second.prepare(j, head, &mut keys.1),
        }
    }

    #[inline]
    fn reserve_now(&self, i: usize, keys: &Self::Keys) -> Option<Result<Decision, BoxError>> {
        match i.checked_sub(self.first.len()) {
            None => self.first.reserve_now(i, &keys.0),
            Some(j) => self.second.reserve_now(j, &keys.1),
        }
    }

    fn reserve(&self, i: usize, keys: &Self::Keys) -> BoxReserve {
        match i.checked_sub(self.first.len()) {
            None => self.first.reserve(i, &keys.0),
            Some(j) => self.second.reserve(j, &keys.1),
        }
    }

    fn cost(&self, i: usize, keys: &Self::Keys) -> u32 {
        match i.checked_sub(self.first.len()) {
            None => self.first.cost(i, &keys.0),
            Some(j) => self.second.cost(j, &keys.1),
        }
    }

    fn refund(&self, i: usize, keys: &Self::Keys, decision: Decision) {
        match i.checked_sub(self.first.len()) {
            None => self.first.refund(i, &keys.0, decision),
            Some(j) => self.second.refund(j, &keys.1, decision),
        }
    }

    fn counts(&self, i: usize, response: &http::response::Parts) -> bool {
        match i.checked_sub(self.first.len()) {
            None => self.first.counts(i, response),
            Some(j) => self.second.counts(j, response),
        }
    }

    #[inline]
    fn quota(&self, i: usize, keys: &Self::Keys) -> Quota {
        match i.checked_sub(self.first.len()) {
            None => self.first.quota(i, &keys.0),
            Some(j) => self.second.quota(j, &keys.1),
        }
    }
}

/// Policies of one type, as many as a configuration names. Each request keeps its keys in one
/// allocation; chain policies with [`Policy::and`] where
/// their number is known when the code is written.
impl<X, L> PolicySet for Vec<Policy<X, L>>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    type Keys = Vec<Slot<X::Key>>;

    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn describe(&self, out: &mut Vec<PolicyInfo>) {
        out.extend(self.iter().map(Policy::info));
    }

    fn no_keys(&self) -> Self::Keys {
        (0..Vec::len(self)).map(|_| None).collect()
    }

    fn prepare(
        &self,
        i: usize,
        head: &RequestHead<'_>,
        keys: &mut Self::Keys,
    ) -> Result<u32, KeyError> {
        self[i].prepare_one(head, &mut keys[i])
    }

    fn reserve_now(&self, i: usize, keys: &Self::Keys) -> Option<Result<Decision, BoxError>> {
        self[i].reserve_now(0, &keys[i])
    }

    fn reserve(&self, i: usize, keys: &Self::Keys) -> BoxReserve {
        self[i].reserve(0, &keys[i])
    }

    fn cost(&self, i: usize, keys: &Self::Keys) -> u32 {
        PolicySet::cost(&self[i], 0, &keys[i])
    }

    fn refund(&self, i: usize, keys: &Self::Keys, decision: Decision) {
        self[i].refund(0, &keys[i], decision);
    }

    fn counts(&self, i: usize, response: &http::response::Parts) -> bool {
        self[i].counts(0, response)
    }

    fn quota(&self, i: usize, keys: &Self::Keys) -> Quota {
        self[i].quota(0, &keys[i])
    }
}

trait ErasedLimiter<K>: Send + Sync + 'static {
    fn quota(&self) -> Quota;
    fn quota_for(&self, key: &K) -> Quota;
    fn set_quota(&self, quota: Quota) -> Result<(), BoxError>;
    fn reserve(&self, key: &K, cost: u32) -> BoxReserve;
    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>>;
    fn refund(&self, key: &K, cost: u32, decision: Decision);
}

impl<K, L: Limiter<K>> ErasedLimiter<K> for L {
    fn quota(&self) -> Quota {
        Limiter::quota(self)
    }

    fn quota_for(&self, key: &K) -> Quota {
        Limiter::quota_for(self, key)
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

    fn refund(&self, key: &K, cost: u32, decision: Decision) {
        Limiter::refund(self, key, cost, decision)
    }
}

/// Any [`Limiter`] behind one type, for limiters chosen at run time (as a configuration does):
/// a GCRA limiter in memory or a sliding log in Redis, say. Policies of different limiter types
/// chained with [`Policy::and`] need no box.
///
/// A limiter that decides at once (see [`Limiter::reserve_now`]) still does so through the box;
/// one that needs I/O costs one allocation per decision for its boxed future.
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

    fn refund(&self, key: &K, cost: u32, decision: Decision) {
        self.inner.refund(key, cost, decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("per-ip").is_ok());
        assert!(check_name("with \"quotes\" and \\").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("é").is_err());
        assert!(check_name("tab\there").is_err());
        assert!(check_name(&"x".repeat(65)).is_err());
        assert!(check_name(&"x".repeat(64)).is_ok());
        let err = check_name("").unwrap_err();
        assert_eq!(err.to_string(), "invalid policy name: it is empty");
    }
}
