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
use crate::bulkhead::permits::Permit;
use crate::bulkhead::CallOutcome;
use crate::BoxError;

/// What a running call holds. Fields drop in order: the sample is taken (and the limit moved)
/// before the permit is given back.
pub(super) struct RunningCall {
    pub(super) sampler: Sampler,
    pub(super) permit: Permit,
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Rejected {
            error: Option<BulkheadFull>,
        },
        // Fields drop in order: a cut call's inner future is gone before its permit frees.
        Running {
            #[pin]
            future: F,
            call: Option<RunningCall>,
        },
    }
}

pin_project! {
    /// Response future of [`AdaptiveBulkheadService`](super::AdaptiveBulkheadService): when the
    /// inner call ends it is classified into a sample, then its permit is given back; dropped
    /// before that, it gives the permit back and counts as a cancelled call.
    pub struct ResponseFuture<F, C> {
        #[pin]
        state: State<F>,
        classifier: Arc<C>,
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(super) fn rejected(error: BulkheadFull, classifier: Arc<C>) -> Self {
        Self {
            state: State::Rejected { error: Some(error) },
            classifier,
        }
    }

    pub(super) fn running(future: F, call: RunningCall, classifier: Arc<C>) -> Self {
        Self {
            state: State::Running {
                future,
                call: Some(call),
            },
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
        match this.state.project() {
            StateProj::Rejected { error } => {
                let error = error.take().expect("polled after completion");
                Poll::Ready(Err(error.into()))
            }
            StateProj::Running { future, call } => {
                let running = call.as_mut().expect("polled after completion");
                // Left in place if the inner future (or the classifier) panics, so that the call
                // is no sample even when the panic is caught above and the future dropped later.
                running.permit.outcome = CallOutcome::Panicked;
                running.sampler.in_poll = true;
                running.sampler.polled = true;
                match future.poll(cx) {
                    Poll::Pending => {
                        running.permit.outcome = CallOutcome::Cancelled;
                        running.sampler.in_poll = false;
                        Poll::Pending
                    }
                    Poll::Ready(result) => {
                        let result = result.map_err(Into::into);
                        let verdict = this.classifier.classify(result.as_ref());
                        running.permit.outcome = match result {
                            Ok(_) => CallOutcome::Success,
                            Err(_) => CallOutcome::Failure,
                        };
                        let RunningCall { sampler, permit } = call.take().expect("checked above");
                        sampler.finish(verdict);
                        drop(permit);
                        Poll::Ready(result)
                    }
                }
            }
        }
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
