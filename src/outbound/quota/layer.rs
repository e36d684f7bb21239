//! The layer that applies a client-side quota to an outbound service, and the service it makes.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::counting::{QuotaCost, QuotaKey, QuotaSettle};
use super::future::ResponseFuture;
use crate::outbound::metrics::ClientQuotaMetrics;
use crate::{BoxError, Limiter};

/// Applies a limiter to the calls of an outbound service: each call takes its cost in permits
/// before it is sent, waiting up to the quota's `max_wait` for them or failing at once with
/// [`QuotaExhausted`](super::QuotaExhausted).
///
/// The limiter is any [`Limiter`](crate::Limiter): a [`DirectRateLimiter`](crate::DirectRateLimiter)
/// for one quota in this process, a [`KeyedRateLimiter`](crate::KeyedRateLimiter) with a
/// [`key`](Self::key) per tenant, or a `RedisRateLimiter` for one quota across every instance.
/// Every service this layer makes, and every clone of them, shares it.
///
/// # Errors
///
/// The services fail with a [`BoxError`](crate::BoxError) holding one of
///
/// * [`QuotaExhausted`](super::QuotaExhausted) when the call's permits come later than the
///   quota's `max_wait`: the call spent nothing, and
///   [`outbound::retry_after`](crate::outbound::retry_after) reads when it may go again;
/// * [`InsufficientCapacity`](crate::limiter::InsufficientCapacity) for a cost the quota can
///   never grant;
/// * the limiter's own error (a Redis limiter whose store failed, under a fail mode that
///   propagates errors);
/// * the inner service's own error, passed through.
///
/// # Examples
///
/// Each call to an LLM API costs the tokens its request asks for, per tenant:
///
/// ```
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_bulwark::outbound::{ClientQuotaLayer, QuotaExhausted};
/// use tower_bulwark::{BoxError, KeyedRateLimiter, Quota};
///
/// struct Completion {
///     tenant: &'static str,
///     max_tokens: u32,
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let tokens = KeyedRateLimiter::new(Quota::per_minute(1_000)?);
/// let client = ClientQuotaLayer::new("llm", tokens)
///     .key(|request: &Completion| request.tenant)
///     .cost_by(|request: &Completion| request.max_tokens)
///     .layer(service_fn(|_: Completion| async { Ok::<_, BoxError>("done") }));
///
/// let big = |tenant| Completion { tenant, max_tokens: 800 };
/// client.clone().oneshot(big("a")).await?;
/// // Tenant `a` has 200 tokens left this minute; tenant `b` has its own thousand.
/// let err = client.clone().oneshot(big("a")).await.unwrap_err();
/// assert!(err.is::<QuotaExhausted>());
/// client.oneshot(big("b")).await?;
/// # Ok(())
/// # }
/// ```
pub struct ClientQuotaLayer<L, K = (), C = u32, U = ()> {
    pub(super) shared: Arc<Shared<L>>,
    pub(super) key: K,
    pub(super) cost: C,
    pub(super) settle: U,
}

/// What every service and call of one layer shares: the quota's name, limiter and counters.
pub(super) struct Shared<L> {
    pub(super) name: Arc<str>,
    pub(super) limiter: L,
    pub(super) metrics: ClientQuotaMetrics,
}

impl<L> ClientQuotaLayer<L> {
    /// A quota named `name` (in errors) enforced by `limiter`, one key for every call, each call
    /// costing one permit.
    pub fn new(name: impl Into<Arc<str>>, limiter: L) -> Self {
        Self {
            shared: Arc::new(Shared {
                name: name.into(),
                limiter,
                metrics: ClientQuotaMetrics::default(),
            }),
            key: (),
            cost: 1,
            settle: (),
        }
    }
}

impl<L, K, C, U> ClientQuotaLayer<L, K, C, U> {
    /// Counts each call under the key `key` chooses from the request (a closure
    /// `Fn(&Req) -> Key`, or a [`QuotaKey`]).
    pub fn key<K2>(self, key: K2) -> ClientQuotaLayer<L, K2, C, U> {
        self.map_parts(|_, cost, settle| (key, cost, settle))
    }

    /// Every call costs `permits`.
    pub fn cost(self, permits: u32) -> ClientQuotaLayer<L, K, u32, U> {
        self.cost_by(permits)
    }

    /// Each call costs what `cost` says of its request (a closure `Fn(&Req) -> u32`, or a
    /// [`QuotaCost`]).
    pub fn cost_by<C2>(self, cost: C2) -> ClientQuotaLayer<L, K, C2, U> {
        self.map_parts(|key, _, settle| (key, cost, settle))
    }

    /// Settles each call that got a response to the cost `settle` reads from it (a closure
    /// `Fn(&Resp) -> Option<u32>`, or a [`QuotaSettle`]): the tokens an LLM API reports it
    /// used, where the call reserved its request's `max_tokens`. The difference is given back
    /// or charged as debt that the next calls wait for, as [`Limiter::settle`] says (exactly,
    /// for a limiter built with [`Metered`](crate::algorithm::Metered), however many calls are
    /// in flight). `None` (nothing readable), a call that failed, and one dropped before its
    /// response keep the estimate.
    ///
    /// For a cost that only the body tells, a [`BodyUsage`](crate::usage::BodyUsage) settles a
    /// `reqwest::Client`'s call (feature `reqwest`) from the body as the caller reads it, JSON
    /// or an event stream by the answer's `Content-Type`, as an inbound policy's
    /// [`settle_from_body`](crate::rate_limit::Policy::settle_from_body) does. For any other
    /// response, with [`SettleLater`](super::SettleLater) each response carries an
    /// [`Unsettled`](super::Unsettled) in its extensions, to settle once the body has been
    /// read.
    pub fn settle_by<U2>(self, settle: U2) -> ClientQuotaLayer<L, K, C, U2> {
        self.map_parts(|key, cost, _| (key, cost, settle))
    }

    /// The layer with the same quota, and the key, cost and settle that `f` makes of this
    /// one's: the one home of the setters that change the type of one of them.
    fn map_parts<K2, C2, U2>(
        self,
        f: impl FnOnce(K, C, U) -> (K2, C2, U2),
    ) -> ClientQuotaLayer<L, K2, C2, U2> {
        let (key, cost, settle) = f(self.key, self.cost, self.settle);
        ClientQuotaLayer {
            shared: self.shared,
            key,
            cost,
            settle,
        }
    }

    /// The limiter this layer applies.
    pub fn limiter(&self) -> &L {
        &self.shared.limiter
    }
}

impl<L, K: Clone, C: Clone, U: Clone> Clone for ClientQuotaLayer<L, K, C, U> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            key: self.key.clone(),
            cost: self.cost.clone(),
            settle: self.settle.clone(),
        }
    }
}

impl<L: fmt::Debug, K, C, U> fmt::Debug for ClientQuotaLayer<L, K, C, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientQuotaLayer")
            .field("name", &self.shared.name)
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, L, K: Clone, C: Clone, U: Clone> Layer<S> for ClientQuotaLayer<L, K, C, U> {
    type Service = ClientQuotaService<S, L, K, C, U>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientQuotaService {
            inner,
            quota: self.clone(),
        }
    }
}

/// A service behind a client-side quota; made by [`ClientQuotaLayer`].
///
/// The permits are taken in `call`, never in `poll_ready`. The inner service must be `Clone`
/// because a call that waits for its permits takes the readied service with it (a
/// `reqwest::Client` is a cheap clone).
pub struct ClientQuotaService<S, L, K, C, U = ()> {
    inner: S,
    quota: ClientQuotaLayer<L, K, C, U>,
}

impl<S: Clone, L, K: Clone, C: Clone, U: Clone> Clone for ClientQuotaService<S, L, K, C, U> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            quota: self.quota.clone(),
        }
    }
}

impl<S: fmt::Debug, L: fmt::Debug, K, C, U> fmt::Debug for ClientQuotaService<S, L, K, C, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientQuotaService")
            .field("inner", &self.inner)
            .field("quota", &self.quota)
            .finish()
    }
}

impl<S, L, K, C, U, Req> Service<Req> for ClientQuotaService<S, L, K, C, U>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    K: QuotaKey<Req>,
    C: QuotaCost<Req>,
    U: QuotaSettle<S::Response> + Clone,
    L: Limiter<K::Key>,
    K::Key: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, L, K::Key, Req, U>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture::start(&self.quota, &mut self.inner, request)
    }
}
