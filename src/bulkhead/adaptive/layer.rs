//! The layer that puts an [`AdaptiveBulkhead`] in front of a service, and the service it makes.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

use super::classify::{Classify, HttpOverload};
use super::controller::Sampler;
use super::future::ResponseFuture;
use super::handle::AdaptiveBulkhead;
use crate::bulkhead::events::Rejection;
use crate::bulkhead::permits::Permit;
use crate::BoxError;

/// Wraps a service in an [`AdaptiveBulkhead`] (made by [`AdaptiveBulkhead::layer`] and
/// [`layer_with`](AdaptiveBulkhead::layer_with)); each permit is held until the response future
/// completes or is dropped, and each ending is judged by the classifier `C`.
///
/// Every service this layer makes, and every clone of them, shares the bulkhead's one limit.
pub struct AdaptiveBulkheadLayer<C = HttpOverload> {
    pub(super) bulkhead: AdaptiveBulkhead,
    pub(super) classifier: Arc<C>,
}

impl<C> Clone for AdaptiveBulkheadLayer<C> {
    fn clone(&self) -> Self {
        Self {
            bulkhead: self.bulkhead.clone(),
            classifier: Arc::clone(&self.classifier),
        }
    }
}

impl<C> fmt::Debug for AdaptiveBulkheadLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveBulkheadLayer")
            .field("bulkhead", &self.bulkhead)
            .finish_non_exhaustive()
    }
}

impl<S, C> Layer<S> for AdaptiveBulkheadLayer<C> {
    type Service = AdaptiveBulkheadService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveBulkheadService {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service behind an [`AdaptiveBulkhead`]; made by
/// [`AdaptiveBulkheadLayer`](super::AdaptiveBulkheadLayer).
///
/// `poll_ready` only asks the inner service; the permit is taken in `call`, and a call that
/// finds the limit reached is refused at once with [`BulkheadFull`](crate::bulkhead::BulkheadFull).
pub struct AdaptiveBulkheadService<S, C = HttpOverload> {
    inner: S,
    layer: AdaptiveBulkheadLayer<C>,
}

impl<S: Clone, C> Clone for AdaptiveBulkheadService<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for AdaptiveBulkheadService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveBulkheadService")
            .field("inner", &self.inner)
            .field("bulkhead", &self.layer.bulkhead)
            .finish_non_exhaustive()
    }
}

impl<S, C, Req> Service<Req> for AdaptiveBulkheadService<S, C>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let controller = &self.layer.bulkhead.controller;
        let permits = &controller.bulkhead.permits;
        let classifier = Arc::clone(&self.layer.classifier);
        // An adaptive bulkhead never queues: a call that finds no free permit is refused.
        let Some(permit) = permits.try_acquire() else {
            return ResponseFuture::rejected(permits.reject(Rejection::NoCapacity), classifier);
        };
        // Taken before the inner service is called, so a panicking `call` still gives the
        // permit back (and is no sample).
        let permit = Permit::granted(Arc::clone(permits), permit, Duration::ZERO);
        let call = Sampler::start(Arc::clone(controller), permit);
        let future = self.inner.call(request);
        ResponseFuture::running(future, call, classifier)
    }
}
