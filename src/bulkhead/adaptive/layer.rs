//! The layer that puts an [`AdaptiveBulkhead`] in front of a service.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::classify::HttpOverload;
use super::handle::AdaptiveBulkhead;
use super::service::AdaptiveBulkheadService;

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
            bulkhead: self.bulkhead.clone(),
            classifier: Arc::clone(&self.classifier),
        }
    }
}
