//! The layer that puts a [`Breaker`] in front of a service, the service it makes, and its
//! response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use super::builder::Breaker;
use super::error::BreakerOpen;
use super::state::Ticket;
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
    type Future = ResponseFuture<S::Future, K>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let classifier = Arc::clone(&self.layer.classifier);
        // Taken before the inner service is called, so a panicking `call` still frees a
        // probe's place (and counts for nothing).
        let (future, ticket, refused) = match self.layer.handle.shared.admit() {
            Ok(ticket) => (Some(self.inner.call(request)), Some(ticket), None),
            Err(refused) => (None, None, Some(refused)),
        };
        ResponseFuture {
            future,
            ticket,
            refused,
            classifier,
        }
    }
}

pin_project! {
    /// Response future of a [`ClassifiedService`] behind a [`Breaker`]: when the inner call ends, the classifier's verdict
    /// on it is counted; dropped before that, the call counts for nothing.
    pub struct ResponseFuture<F, K> {
        // Fields drop in order: a cut call's inner future is gone before its ticket reports.
        // Both `None` for a refused call, which holds its error until polled.
        #[pin]
        future: Option<F>,
        ticket: Option<Ticket>,
        refused: Option<BreakerOpen>,
        classifier: Arc<K>,
    }
}

impl<F, K, T, E> Future for ResponseFuture<F, K>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    K: Classify<T>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(future) = this.future.as_pin_mut() else {
            let refused = this.refused.take().expect("polled after completion");
            return Poll::Ready(Err(refused.into()));
        };
        let result = match future.poll(cx) {
            Poll::Ready(result) => result.map_err(Into::into),
            Poll::Pending => return Poll::Pending,
        };
        // Taken out before the classifier runs: if it panics, the call counts for nothing.
        if let Some(mut ticket) = this.ticket.take() {
            ticket.verdict = this.classifier.classify(result.as_ref());
        }
        Poll::Ready(result)
    }
}

impl<F, K> fmt::Debug for ResponseFuture<F, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
