//! The service a [`Breaker`]'s layer makes.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::builder::Breaker;
use super::state::Ticket;
use crate::bulkhead::adaptive::future::ResponseFuture;
use crate::bulkhead::adaptive::{ClassifiedService, Classify};
use crate::BoxError;

impl<S, K, Req> Service<Req> for ClassifiedService<S, Breaker, K>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    K: Classify<S::Response>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, K, Ticket>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let classifier = Arc::clone(&self.layer.classifier);
        // Taken before the inner service is called, so a panicking `call` still frees a
        // probe's place (and counts for nothing).
        match self.layer.handle.shared.admit() {
            Ok(ticket) => ResponseFuture::running(self.inner.call(request), ticket, classifier),
            Err(refused) => ResponseFuture::refused(refused, classifier),
        }
    }
}
