//! Layers that put a [`Bulkhead`] in front of a service.

use tower_layer::Layer;

use super::instance::Bulkhead;
use super::service::{BulkheadBodyService, BulkheadService};

/// Wraps a service in a [`Bulkhead`]; each permit is held until the response future completes or
/// is dropped.
///
/// Every service this layer makes, and every clone of them, shares the bulkhead's one limit.
#[derive(Clone, Debug)]
pub struct BulkheadLayer {
    bulkhead: Bulkhead,
}

impl BulkheadLayer {
    /// A layer for `bulkhead`.
    pub fn new(bulkhead: Bulkhead) -> Self {
        Self { bulkhead }
    }

    /// The bulkhead this layer applies.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = BulkheadService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BulkheadService::new(inner, self.bulkhead.clone())
    }
}

/// Wraps a service returning `http::Response<B>` in a [`Bulkhead`]; each permit is held until the
/// response body has been read to its end, has failed, or is dropped.
///
/// Every service this layer makes, and every clone of them, shares the bulkhead's one limit.
#[derive(Clone, Debug)]
pub struct BulkheadBodyLayer {
    bulkhead: Bulkhead,
}

impl BulkheadBodyLayer {
    /// A layer for `bulkhead`.
    pub fn new(bulkhead: Bulkhead) -> Self {
        Self { bulkhead }
    }

    /// The bulkhead this layer applies.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }
}

impl<S> Layer<S> for BulkheadBodyLayer {
    type Service = BulkheadBodyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BulkheadBodyService::new(inner, self.bulkhead.clone())
    }
}
