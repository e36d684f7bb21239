//! Services that admit calls through a [`Bulkhead`].

use std::task::{Context, Poll};

use tower_service::Service;

use super::future::{BodyResponseFuture, ResponseFuture};
use super::instance::Bulkhead;
use crate::BoxError;

/// A service behind a [`Bulkhead`]; made by [`BulkheadLayer`](super::BulkheadLayer).
///
/// `poll_ready` only asks the inner service; the permit is taken in `call`. The inner service must
/// be `Clone` because a call that has to wait takes the readied service with it and starts it
/// once a permit comes (wrap a service that is not `Clone` in tower's `Buffer`).
#[derive(Clone, Debug)]
pub struct BulkheadService<S> {
    inner: S,
    bulkhead: Bulkhead,
}

impl<S> BulkheadService<S> {
    /// Wraps `inner` in `bulkhead`.
    pub fn new(inner: S, bulkhead: Bulkhead) -> Self {
        Self { inner, bulkhead }
    }

    /// The bulkhead in front of the inner service.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
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

impl<S, Req> Service<Req> for BulkheadService<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture::start(&self.bulkhead.shared, &mut self.inner, request)
    }
}

/// A service behind a [`Bulkhead`] whose permits last until the response body ends; made by
/// [`BulkheadBodyLayer`](super::BulkheadBodyLayer).
///
/// Like [`BulkheadService`], it takes the permit in `call` and needs a `Clone` inner service.
#[derive(Clone, Debug)]
pub struct BulkheadBodyService<S> {
    inner: S,
    bulkhead: Bulkhead,
}

impl<S> BulkheadBodyService<S> {
    /// Wraps `inner` in `bulkhead`.
    pub fn new(inner: S, bulkhead: Bulkhead) -> Self {
        Self { inner, bulkhead }
    }

    /// The bulkhead in front of the inner service.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
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

impl<S, Req, B> Service<Req> for BulkheadBodyService<S>
where
    S: Service<Req, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body,
{
    type Response = http::Response<super::BulkheadBody<B>>;
    type Error = BoxError;
    type Future = BodyResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        BodyResponseFuture::start(&self.bulkhead.shared, &mut self.inner, request)
    }
}
