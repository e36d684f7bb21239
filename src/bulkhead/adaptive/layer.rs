//! The layer that puts an [`AdaptiveBulkhead`] in front of a service, and the service it makes;
//! [`ClassifiedLayer`] and [`ClassifiedService`], the shape they share with the retries' and the
//! circuit breaker's.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

use super::classify::{Classify, HttpOverload};
use super::controller::Sampler;
use super::future::{Admit, Report, ResponseFuture};
use super::handle::AdaptiveBulkhead;
use crate::bulkhead::events::Rejection;
use crate::bulkhead::permits::Permit;
use crate::BoxError;

/// A layer of a handle `H` (an [`AdaptiveBulkhead`], a
/// [`Retry`](crate::outbound::retry::Retry), a [`Breaker`](crate::outbound::Breaker)) and the
/// classifier `K` that judges the answers of the services it makes.
///
/// Each layer and service clones the handle, whose clones share one state (an adaptive
/// bulkhead's one limit, a retry's budget, a breaker's state); the classifier is shared behind an
/// `Arc`, so neither needs `K: Clone`. Made by each handle's `layer` (judging by
/// [`HttpOverload`]) and `layer_with` (judging by a classifier of yours).
pub struct ClassifiedLayer<H, K = HttpOverload> {
    pub(crate) handle: H,
    pub(crate) classifier: Arc<K>,
}

impl<H, K> ClassifiedLayer<H, K> {
    /// The layer of `handle`, judging answers with `classifier`.
    pub(crate) fn new(handle: H, classifier: K) -> Self {
        Self {
            handle,
            classifier: Arc::new(classifier),
        }
    }
}

impl<H: Clone, K> Clone for ClassifiedLayer<H, K> {
    fn clone(&self) -> Self {
        Self {
            handle: self.handle.clone(),
            classifier: Arc::clone(&self.classifier),
        }
    }
}

impl<H: fmt::Debug, K> fmt::Debug for ClassifiedLayer<H, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifiedLayer")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl<S, H: Clone, K> Layer<S> for ClassifiedLayer<H, K> {
    type Service = ClassifiedService<S, H, K>;

    fn layer(&self, inner: S) -> Self::Service {
        ClassifiedService {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service behind the handle `H` of a [`ClassifiedLayer`], which made it.
///
/// `poll_ready` only asks the inner service; the handle decides in `call`, and fails with a
/// [`BoxError`](crate::BoxError) holding the inner service's error or its own refusal:
///
/// - behind an [`AdaptiveBulkhead`], the permit is taken in `call` and held until the response
///   future completes or is dropped; a call that finds the limit reached is refused at once with
///   [`BulkheadFull`](crate::bulkhead::BulkheadFull);
/// - behind a [`Breaker`](crate::outbound::Breaker), a call the breaker refuses fails at once
///   with [`BreakerOpen`](crate::outbound::BreakerOpen), the inner service not called;
/// - behind a [`Retry`](crate::outbound::retry::Retry), the inner service must be `Clone`: a
///   call takes the readied service with it, to call it again for each retry once it is ready.
pub struct ClassifiedService<S, H, K = HttpOverload> {
    pub(crate) inner: S,
    pub(crate) layer: ClassifiedLayer<H, K>,
}

impl<S: Clone, H: Clone, K> Clone for ClassifiedService<S, H, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, H: fmt::Debug, K> fmt::Debug for ClassifiedService<S, H, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifiedService")
            .field("inner", &self.inner)
            .field("handle", &self.layer.handle)
            .finish_non_exhaustive()
    }
}

impl<S, H, C, Req> Service<Req> for ClassifiedService<S, H, C>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    H: Admit,
    C: Classify<S::Response>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C, H::Report>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let classifier = Arc::clone(&self.layer.classifier);
        // Admitted before the inner service is called, so a panicking `call` still gives back
        // what the admission took (and counts for nothing).
        let admitted = self.layer.handle.admit();
        let called = admitted.map(|mut report| {
            let future = self.inner.call(request);
            report.pending();
            (future, report)
        });
        ResponseFuture::new(called, classifier)
    }
}

impl Admit for AdaptiveBulkhead {
    type Report = Sampler;

    /// A permit, or at once a refusal: an adaptive bulkhead never queues.
    fn admit(&self) -> Result<Sampler, BoxError> {
        let controller = &self.controller;
        let permits = &controller.bulkhead.permits;
        let Some(permit) = permits.try_acquire() else {
            return Err(permits.reject(Rejection::NoCapacity).into());
        };
        let permit = Permit::granted(permit, Duration::ZERO);
        Ok(Sampler::start(Arc::clone(controller), permit))
    }
}
