//! The response future of the adaptive bulkhead service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::classify::Classify;
use super::controller::Sampler;
use crate::bulkhead::error::BulkheadFull;
use crate::bulkhead::CallOutcome;
use crate::BoxError;

pin_project! {
    /// Response future of a [`ClassifiedService`](super::ClassifiedService) behind an adaptive
    /// bulkhead: when the inner call ends it is classified into a sample, then its permit is
    /// given back; dropped before that, it gives the permit back and counts as a cancelled call.
    pub struct ResponseFuture<F, C> {
        // Fields drop in order: a cut call's inner future is gone before its permit frees.
        // Both `None` for a refused call, which holds its error until polled.
        #[pin]
        future: Option<F>,
        call: Option<Sampler>,
        refused: Option<BulkheadFull>,
        classifier: Arc<C>,
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(super) fn rejected(error: BulkheadFull, classifier: Arc<C>) -> Self {
        Self {
            future: None,
            call: None,
            refused: Some(error),
            classifier,
        }
    }

    pub(super) fn running(future: F, call: Sampler, classifier: Arc<C>) -> Self {
        Self {
            future: Some(future),
            call: Some(call),
            refused: None,
            classifier,
        }
    }
}

impl<F, C, T, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    C: Classify<T>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (Some(future), Some(running)) = (this.future.as_pin_mut(), this.call.as_mut()) else {
            let refused = this.refused.take().expect("polled after completion");
            return Poll::Ready(Err(refused.into()));
        };
        // Left in place if the inner future (or the classifier) panics, so that the call is no
        // sample even when the panic is caught above and the future dropped later.
        running.permit.outcome = CallOutcome::Panicked;
        running.polled = true;
        let Poll::Ready(result) = future.poll(cx) else {
            running.permit.outcome = CallOutcome::Cancelled;
            return Poll::Pending;
        };
        let result = result.map_err(Into::into);
        let verdict = this.classifier.classify(result.as_ref());
        running.permit.outcome = match result {
            Ok(_) => CallOutcome::Success,
            Err(_) => CallOutcome::Failure,
        };
        this.call.take().expect("checked above").finish(verdict);
        Poll::Ready(result)
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
