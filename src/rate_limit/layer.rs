use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use tower_layer::Layer;

use super::body::{SameBody, WrapBody};
use super::key::KeyExtractor;
use super::policy::Policy;
use super::response::{Meta, OnRefusal, PolicyInfo};
use super::service::RateLimit;
use crate::Limiter;

/// What the layer does with a request it cannot judge: one without a key, or one whose limiter
/// failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailMode {
    /// Answer at once with an `application/problem+json` error: the key error's status (`400` or
    /// `500`), or `503` for a failed limiter. The default.
    #[default]
    Closed,
    /// Let the request through without counting it against the policy that could not decide.
    Open,
}

/// Applies rate-limit policies to the requests of a service: see the [module docs](super).
///
/// The layer is cheap to clone, and every clone, and every service it makes, shares the same
/// limiters.
///
/// `M` is how responses carry their bodies ([`BodyKind`](super::BodyKind)): by default they keep
/// the inner service's body type, which must be made from `Bytes` (axum's `Body` is);
/// [`wrap_body`](Self::wrap_body) serves inner services of any body type.
pub struct RateLimitLayer<X, L, M = SameBody> {
    shared: Arc<Shared<X, L>>,
    kind: PhantomData<fn() -> M>,
}

impl<X, L> RateLimitLayer<X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    /// Limits requests, keyed by `extractor`, with one policy.
    pub fn new(extractor: X, policy: Policy<L>) -> Self {
        Self::with_policies(extractor, [policy])
    }

    /// Limits requests, keyed by `extractor`, with several policies: a request is admitted only
    /// if every policy admits it, and one that any policy refuses gives back what the others
    /// granted (exactly, but for the cases the [guide](crate::guide) lists, where permits stay
    /// spent rather than be over-granted). Without policies the layer admits everything and adds
    /// no headers.
    pub fn with_policies(extractor: X, policies: impl IntoIterator<Item = Policy<L>>) -> Self {
        let mut infos = Vec::new();
        let mut limiters = Vec::new();
        for policy in policies {
            infos.push(PolicyInfo::new(&policy.name, policy.limiter.quota()));
            limiters.push(policy.limiter);
        }
        Self {
            shared: Arc::new(Shared {
                extractor: Arc::new(extractor),
                limiters: limiters.into(),
                meta: Arc::new(Meta::new(infos)),
            }),
            kind: PhantomData,
        }
    }
}

impl<X, L, M> RateLimitLayer<X, L, M> {
    fn meta_mut(&mut self) -> &mut Meta {
        // Copy on write: a clone of the layer made before this call keeps its settings, and
        // both keep sharing the limiters.
        Arc::make_mut(&mut Arc::make_mut(&mut self.shared).meta)
    }

    /// Builds the response to a refused request with `hook` instead of the default 429.
    pub fn on_refusal(mut self, hook: impl OnRefusal) -> Self {
        self.meta_mut().on_refusal = Some(Arc::new(hook));
        self
    }

    /// What to do with a request whose key cannot be extracted ([`FailMode::Closed`] by
    /// default: answer with the key error's status). Either way a log line says why.
    pub fn on_key_error(mut self, mode: FailMode) -> Self {
        self.meta_mut().on_key_error = mode;
        self
    }

    /// What to do when a limiter returns an error, such as a Redis limiter that cannot reach
    /// its server ([`FailMode::Closed`] by default: answer `503`). Either way a log line says
    /// why.
    pub fn on_limiter_error(mut self, mode: FailMode) -> Self {
        self.meta_mut().on_limiter_error = mode;
        self
    }

    /// Lets requests for which `predicate` is true skip every policy: they reach the inner
    /// service uncounted, and their responses carry no rate-limit headers (health checks,
    /// internal callers). Exemptions add up: a request is exempt if any of them says so.
    ///
    /// ```
    /// use http::request::Parts;
    /// use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
    /// use tower_bulwark::{DirectRateLimiter, Quota};
    ///
    /// let layer = RateLimitLayer::new(
    ///     GlobalKey,
    ///     Policy::new("all", DirectRateLimiter::new(Quota::per_second(100)?))?,
    /// )
    /// .exempt(|parts: &Parts| parts.uri.path() == "/health");
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// The predicate sees the request as the client sent it: exempt on what a client cannot
    /// forge (the path of a route only your load balancer calls, a header your proxy sets and
    /// strips from client requests), or every client can exempt itself.
    pub fn exempt(
        mut self,
        predicate: impl Fn(&http::request::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        let meta = self.meta_mut();
        meta.exempt = Some(match meta.exempt.take() {
            Some(earlier) => {
                Arc::new(move |parts: &http::request::Parts| earlier(parts) || predicate(parts))
            }
            None => Arc::new(predicate),
        });
        self
    }

    /// Lets requests whose TCP peer lies in one of `networks` skip every policy, as
    /// [`exempt`](Self::exempt) does (internal networks, your own monitoring). The peer is the
    /// address the connection came from (axum's `ConnectInfo`), never a forwarding header: behind
    /// a proxy it is the proxy's.
    #[cfg(feature = "axum")]
    pub fn exempt_networks(self, networks: impl IntoIterator<Item = super::Cidr>) -> Self {
        let networks: Arc<[super::Cidr]> = networks.into_iter().collect();
        self.exempt(move |parts: &http::request::Parts| {
            super::key::peer_ip(parts).is_some_and(|ip| networks.iter().any(|net| net.contains(ip)))
        })
    }

    /// Sends `RateLimit-Policy` and `RateLimit` on refusals only, not on admitted responses.
    pub fn without_admitted_headers(mut self) -> Self {
        self.meta_mut().admitted_headers = false;
        self
    }

    /// Also sends the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds from now) headers, for the policy that binds.
    pub fn with_legacy_headers(mut self) -> Self {
        self.meta_mut().legacy_headers = true;
        self
    }

    /// Responses carry a [`RateLimitBody`](super::RateLimitBody) around the inner service's
    /// body ([`WrapBody`]), so the inner service may have any body type, not only one made from
    /// `Bytes`: tower-http's body wrappers, boxed bodies.
    ///
    /// Not needed under axum: a route's body is axum's `Body`, and axum boxes any other body
    /// type again on every response.
    pub fn wrap_body(self) -> RateLimitLayer<X, L, WrapBody> {
        RateLimitLayer {
            shared: self.shared,
            kind: PhantomData,
        }
    }
}

impl<X, L, M> Clone for RateLimitLayer<X, L, M> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            kind: PhantomData,
        }
    }
}

impl<X, L, M> fmt::Debug for RateLimitLayer<X, L, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("extractor", &std::any::type_name::<X>())
            .field("meta", &self.shared.meta)
            .field("body", &std::any::type_name::<M>())
            .finish_non_exhaustive()
    }
}

impl<S, X, L, M> Layer<S> for RateLimitLayer<X, L, M> {
    type Service = RateLimit<S, X, L, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.shared))
    }
}

/// What every clone of a layer and of its services shares.
pub(crate) struct Shared<X, L> {
    pub(crate) extractor: Arc<X>,
    pub(crate) limiters: Arc<[L]>,
    pub(crate) meta: Arc<Meta>,
}

impl<X, L> Clone for Shared<X, L> {
    fn clone(&self) -> Self {
        Self {
            extractor: Arc::clone(&self.extractor),
            limiters: Arc::clone(&self.limiters),
            meta: Arc::clone(&self.meta),
        }
    }
}
