//! The service that holds calls back as the dependency asks.

use std::task::{Context, Poll};

use tower_service::Service;

use super::dependency::Pushback;
use super::future::ResponseFuture;
use super::response::ResponseHead;
use crate::clock::{Clock, SystemClock};
use crate::BoxError;

/// A service behind a [`Pushback`]; made by [`PushbackLayer`](super::PushbackLayer).
///
/// A call is checked in `call`: sent at once when the dependency allows it, held (up to
/// `max_wait`) or refused with [`PushedBack`](super::PushedBack) otherwise. The inner service
/// must be `Clone` because a call that waits takes the readied service with it.
#[derive(Clone, Debug)]
pub struct PushbackService<S, C = SystemClock> {
    inner: S,
    pushback: Pushback<C>,
}

impl<S, C> PushbackService<S, C> {
    /// Wraps `inner` in `pushback`.
    pub fn new(inner: S, pushback: Pushback<C>) -> Self {
        Self { inner, pushback }
    }

    /// The pushback in front of the inner service.
    pub fn pushback(&self) -> &Pushback<C> {
        &self.pushback
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

impl<S, C, Req> Service<Req> for PushbackService<S, C>
where
    S: Service<Req> + Clone,
    S::Response: ResponseHead,
    S::Error: Into<BoxError>,
    C: Clock,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, C, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture::start(&self.pushback.dependency, &mut self.inner, request)
    }
}
