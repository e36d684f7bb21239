//! The layer that puts a [`Pushback`] in front of a service.

use tower_layer::Layer;

use super::dependency::Pushback;
use super::service::PushbackService;
use crate::clock::SystemClock;

/// Wraps a service in a [`Pushback`]: calls are held back as the dependency's responses ask.
///
/// Every service this layer makes, and every clone of them, shares the pushback's one state.
#[derive(Clone, Debug)]
pub struct PushbackLayer<C = SystemClock> {
    pushback: Pushback<C>,
}

impl<C> PushbackLayer<C> {
    /// A layer for `pushback`.
    pub fn new(pushback: Pushback<C>) -> Self {
        Self { pushback }
    }

    /// The pushback this layer applies.
    pub fn pushback(&self) -> &Pushback<C> {
        &self.pushback
    }
}

impl<S, C> Layer<S> for PushbackLayer<C> {
    type Service = PushbackService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        PushbackService::new(inner, self.pushback.clone())
    }
}
