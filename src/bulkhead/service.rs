//! The service that admits calls through a [`Bulkhead`].

use std::marker::PhantomData;
use std::task::{Context, Poll};

use tower_service::Service;

use super::future::ResponseFuture;
use super::handle::Bulkhead;
use super::mode::{OnResponse, Release};
use crate::BoxError;

/// A service behind a [`Bulkhead`]; made by [`BulkheadLayer`](super::BulkheadLayer). `M` says
/// when each call gives its permit back ([`Release`]).
///
/// `poll_ready` only asks the inner service; the permit is taken in `call`. The inner service must
/// be `Clone` because a call that has to wait takes the readied service with it and starts it
/// once a permit comes (wrap a service that is not `Clone` in tower's `Buffer`).
#[derive(Clone, Debug)]
pub struct BulkheadService<S, M = OnResponse> {
    pub(super) inner: S,
    pub(super) bulkhead: Bulkhead,
    pub(super) mode: PhantomData<fn() -> M>,
}

impl<S, M> BulkheadService<S, M> {
    /// The bulkhead in front of the inner service.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }
}

impl<S, M, Req> Service<Req> for BulkheadService<S, M>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    M: Release<S::Response>,
{
    type Response = M::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture::start(&self.bulkhead.permits, &mut self.inner, request)
    }
}
