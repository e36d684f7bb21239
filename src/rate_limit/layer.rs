//! The layer: its policies, and the settings its builder methods choose.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use tower_layer::Layer;

use super::body::{SameBody, WrapBody};
use super::policy::Settle;
use super::service::RateLimitService;
use super::set::PolicySet;
use super::settings::{FailMode, Limits, OnRefusal, Settings};
use crate::head::RequestHead;

/// Applies rate-limit policies to the requests of a service: see the [module docs](super).
///
/// The layer is cheap to clone, and every clone, and every service it makes, shares the same
/// limiters.
///
/// `P` is its policies ([`PolicySet`]): one [`Policy`](super::Policy), several chained with
/// [`Policy::and`](super::Policy::and), or a `Vec` of policies of one type. `M` is how responses
/// carry their bodies ([`BodyKind`](super::BodyKind)): by default they keep the inner service's
/// body type, which must be made from `Bytes` (axum's `Body` is); [`wrap_body`](Self::wrap_body)
/// serves inner services of any body type.
pub struct RateLimitLayer<P, M = SameBody> {
    policies: Arc<P>,
    settings: Arc<Settings>,
    kind: PhantomData<fn() -> M>,
}

impl<P: PolicySet> RateLimitLayer<P> {
    /// Limits requests with `policies`: a request is admitted only if every policy admits it, and
    /// one that any policy refuses gives back what the others granted (exactly, but for the cases
    /// the [guide](crate::guide) lists, where permits stay spent rather than be over-granted).
    /// Without policies (an empty `Vec`) the layer admits everything and adds no headers.
    ///
    /// # Examples
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
    /// use tower_bulwark::{KeyedRateLimiter, Quota};
    ///
    /// // Ten requests per second per client IP on `/orders`.
    /// let per_ip = Policy::new("per-ip", PeerIp::new(), KeyedRateLimiter::new(Quota::per_second(10)?))?;
    /// let app: Router = Router::new()
    ///     .route("/orders", get(|| async { "ok" }))
    ///     .route_layer(RateLimitLayer::new(per_ip));
    /// # let _ = app;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(policies: P) -> Self {
        let mut infos = Vec::with_capacity(policies.count());
        policies.describe(&mut infos);
        Self {
            policies: Arc::new(policies),
            settings: Arc::new(Settings::new(infos)),
            kind: PhantomData,
        }
    }
}

impl<P, M> RateLimitLayer<P, M> {
    fn settings_mut(&mut self) -> &mut Settings {
        // Copy on write: a clone of the layer made before this call keeps its settings, and
        // both keep sharing the limiters.
        Arc::make_mut(&mut self.settings)
    }

    /// Builds the response to a refused request with `hook` instead of the default 429.
    pub fn on_refusal(mut self, hook: impl OnRefusal) -> Self {
        self.settings_mut().on_refusal = Some(Arc::new(hook));
        self
    }

    /// What to do with a request whose key cannot be extracted ([`FailMode::Closed`] by
    /// default: answer with the key error's status). Either way a log line says why.
    pub fn key_error_mode(mut self, mode: FailMode) -> Self {
        self.settings_mut().key_error_mode = mode;
        self
    }

    /// What to do when a limiter returns an error ([`FailMode::Closed`] by default: answer
    /// `503`). Either way a log line says why. A Redis limiter that cannot reach its server
    /// returns an error only under `RedisFailMode::Propagate`; under its other fail modes
    /// (`Open`, the default, among them) it decides for itself and never gets here.
    pub fn limiter_error_mode(mut self, mode: FailMode) -> Self {
        self.settings_mut().limiter_error_mode = mode;
        self
    }

    /// Lets requests for which `predicate` is true skip every policy: they reach the inner
    /// service uncounted, and their responses carry no rate-limit headers (health checks,
    /// internal callers). Exemptions add up: a request is exempt if any of them says so.
    ///
    /// ```
    /// use tower_bulwark::head::RequestHead;
    /// use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
    /// use tower_bulwark::{DirectRateLimiter, Quota};
    ///
    /// let limiter = DirectRateLimiter::new(Quota::per_second(100)?);
    /// let layer = RateLimitLayer::new(Policy::new("all", GlobalKey, limiter)?)
    /// .exempt(|head: &RequestHead| head.uri.path() == "/health");
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// The predicate sees the request as the client sent it: exempt on what a client cannot
    /// forge (the path of a route only your load balancer calls, a header your proxy sets and
    /// strips from client requests), or every client can exempt itself.
    pub fn exempt(
        mut self,
        predicate: impl Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        let settings = self.settings_mut();
        settings.exempt = Some(match settings.exempt.take() {
            Some(earlier) => {
                Arc::new(move |head: &RequestHead<'_>| earlier(head) || predicate(head))
            }
            None => Arc::new(predicate),
        });
        self
    }

    /// Lets requests whose TCP peer lies in one of `networks` skip every policy, as
    /// [`exempt`](Self::exempt) does (internal networks, your own monitoring). The peer is the
    /// address the connection came from (axum's `ConnectInfo`, tonic's `TcpConnectInfo`), never a
    /// forwarding header: behind a proxy it is the proxy's.
    #[cfg(any(feature = "axum", feature = "grpc"))]
    pub fn exempt_networks(self, networks: impl IntoIterator<Item = super::Cidr>) -> Self {
        let networks: Arc<[super::Cidr]> = networks.into_iter().collect();
        self.exempt(move |head: &RequestHead<'_>| {
            super::key::peer_ip(head).is_ok_and(|ip| networks.iter().any(|net| net.contains(ip)))
        })
    }

    /// Sends `RateLimit-Policy` and `RateLimit` on refusals only, not on admitted responses.
    pub fn without_admitted_headers(mut self) -> Self {
        self.settings_mut().admitted_headers = false;
        self
    }

    /// Also sends the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds from now) headers, for the policy that binds.
    pub fn with_legacy_headers(mut self) -> Self {
        self.settings_mut().legacy_headers = true;
        self
    }

    /// Responses carry a [`RateLimitBody`](super::RateLimitBody) around the inner service's
    /// body ([`WrapBody`]), so the inner service may have any body type, not only one made from
    /// `Bytes`: tower-http's body wrappers, boxed bodies.
    ///
    /// Needed, under axum too, by a policy that settles from the body
    /// ([`Policy::settle_from_body`](super::Policy::settle_from_body)): the layer's body reads
    /// it as it streams by, and building the service without it panics with that advice.
    /// Otherwise not needed under axum: a route's body is axum's `Body`, and axum boxes any
    /// other body type again on every response.
    pub fn wrap_body(mut self) -> RateLimitLayer<P, WrapBody> {
        self.settings_mut().wraps_body = true;
        RateLimitLayer {
            policies: self.policies,
            settings: self.settings,
            kind: PhantomData,
        }
    }
}

impl<P, M> Clone for RateLimitLayer<P, M> {
    fn clone(&self) -> Self {
        Self {
            policies: Arc::clone(&self.policies),
            settings: Arc::clone(&self.settings),
            kind: PhantomData,
        }
    }
}

impl<P, M> fmt::Debug for RateLimitLayer<P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("settings", &self.settings)
            .field("body", &std::any::type_name::<M>())
            .finish_non_exhaustive()
    }
}

impl<S, P, M> Layer<S> for RateLimitLayer<P, M> {
    type Service = RateLimitService<S, P, M>;

    /// # Panics
    ///
    /// If a policy settles its cost from the response body
    /// ([`Policy::settle_from_body`](super::Policy::settle_from_body)) or holds its requests
    /// until the body ends ([`Policy::concurrent`](super::Policy::concurrent)) and the layer does
    /// not carry the body ([`wrap_body`](Self::wrap_body)): the policy's settles would never
    /// happen.
    fn layer(&self, inner: S) -> Self::Service {
        let settings = &self.settings;
        let waits_for_body = (settings.policies.iter())
            .find(|p| !settings.wraps_body && matches!(p.settle, Settle::ByBody(_) | Settle::Held));
        if let Some(policy) = waits_for_body {
            let what = match policy.settle {
                Settle::Held => "holds its requests' slots until the response body ends",
                _ => "settles its cost from the response body",
            };
            panic!(
                "the rate-limit policy `{}` {what}, which the layer must carry: call \
                 `.wrap_body()` on the `RateLimitLayer`",
                policy.name
            );
        }
        let limits = Limits {
            policies: Arc::clone(&self.policies),
            settings: Arc::clone(&self.settings),
        };
        RateLimitService {
            inner,
            limits: Arc::new(limits),
            kind: PhantomData,
        }
    }
}
