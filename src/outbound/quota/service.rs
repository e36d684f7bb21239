//! The service that takes a client-side quota's permits before each call.

use std::fmt;
use std::task::{Context, Poll};

use tower_service::Service;

use super::cost::QuotaCost;
use super::future::ResponseFuture;
use super::key::QuotaKey;
use super::layer::ClientQuotaLayer;
use crate::{BoxError, Limiter};

/// A service behind a client-side quota; made by [`ClientQuotaLayer`](super::ClientQuotaLayer).
///
/// The permits are taken in `call`, never in `poll_ready`. The inner service must be `Clone`
/// because a call that waits for its permits takes the readied service with it (a
/// `reqwest::Client` is a cheap clone).
pub struct ClientQuotaService<S, L, K, C> {
    inner: S,
    quota: ClientQuotaLayer<L, K, C>,
}

impl<S, L, K, C> ClientQuotaService<S, L, K, C> {
    pub(crate) fn new(inner: S, quota: ClientQuotaLayer<L, K, C>) -> Self {
        Self { inner, quota }
    }

    /// The limiter in front of the inner service.
    pub fn limiter(&self) -> &L {
        self.quota.limiter()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, L, K: Clone, C: Clone> Clone for ClientQuotaService<S, L, K, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            quota: self.quota.clone(),
        }
    }
}

impl<S: fmt::Debug, L: fmt::Debug, K, C> fmt::Debug for ClientQuotaService<S, L, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientQuotaService")
            .field("inner", &self.inner)
            .field("quota", &self.quota)
            .finish()
    }
}

impl<S, L, K, C, Req> Service<Req> for ClientQuotaService<S, L, K, C>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    K: QuotaKey<Req>,
    C: QuotaCost<Req>,
    L: Limiter<K::Key>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, L, K::Key, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture::start(&self.quota, &mut self.inner, request)
    }
}
