//! The response future of the bulkhead service.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::error::BulkheadFull;
use super::events::{CallOutcome, Rejection};
use super::permits::{Admission, Permit, Permits, Waiting};
use crate::head::{Until, UntilHead};
use crate::BoxError;

/// A call waiting in the queue, with everything it needs to start once it has a permit.
struct Queued<S, Req> {
    waiting: Waiting,
    deadline: Option<Pin<Box<Sleep>>>,
    service: S,
    request: Req,
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Rejected {
            error: Option<BulkheadFull>,
        },
        Queued {
            queued: Option<Queued<S, Req>>,
        },
        // Fields drop in order: a cut call's inner future is gone before its permit frees.
        Running {
            #[pin]
            future: S::Future,
            permit: Option<Permit>,
        },
    }
}

pin_project! {
    /// Response future of [`BulkheadService`](super::BulkheadService): it holds the call's
    /// permit, from `call` until the call ends; what happens to the permit then is the
    /// service's mode `M`.
    pub struct ResponseFuture<S, Req, M = UntilHead>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        mode: PhantomData<fn() -> M>,
    }
}

/// Calls the inner service under `permit`. Should `call` panic, the permit is dropped while the
/// thread unwinds and reports the panic.
fn run<S: Service<Req>, Req>(service: &mut S, request: Req, mut permit: Permit) -> State<S, Req> {
    permit.outcome = CallOutcome::Panicked;
    let future = service.call(request);
    permit.outcome = CallOutcome::Cancelled;
    State::Running {
        future,
        permit: Some(permit),
    }
}

impl<S, Req, M> ResponseFuture<S, Req, M>
where
    S: Service<Req> + Clone,
{
    /// Admits, queues or refuses a call; this is where the permit is taken.
    pub(crate) fn start(permits: &Arc<Permits>, service: &mut S, request: Req) -> Self {
        let state = match permits.admit() {
            Admission::Permitted(permit) => {
                let permit = Permit::granted(permit, Duration::ZERO);
                run(service, request, permit)
            }
            Admission::Queued(waiting) => {
                // The readied service goes with the call; this handle keeps a fresh clone,
                // which the caller readies again before its next call.
                let service = mem::replace(service, service.clone());
                State::Queued {
                    queued: Some(Queued {
                        waiting,
                        deadline: None,
                        service,
                        request,
                    }),
                }
            }
            Admission::Rejected => State::Rejected {
                error: Some(permits.reject(Rejection::NoCapacity)),
            },
        };
        Self {
            state,
            mode: PhantomData,
        }
    }
}

impl<S, Req, M> Future for ResponseFuture<S, Req, M>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    M: Until<S::Response, Permit>,
{
    type Output = Result<M::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Rejected { error } => {
                    let error = error.take().expect("polled after completion");
                    return Poll::Ready(Err(error.into()));
                }
                StateProj::Queued { queued } => {
                    let entry = queued.as_mut().expect("polled after completion");
                    let permit = match entry.waiting.poll_acquire(cx) {
                        Poll::Ready(permit) => permit,
                        Poll::Pending => {
                            let Some(until) = entry.waiting.until else {
                                return Poll::Pending;
                            };
                            let deadline = entry
                                .deadline
                                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                            ready!(deadline.as_mut().poll(cx));
                            // Leaving the queue passes on a permit granted since the poll above.
                            None
                        }
                    };
                    // Its wait ended: at its deadline, or shed before it was polled again.
                    let Some(permit) = permit else {
                        let permits = Arc::clone(&entry.waiting.permits);
                        *queued = None;
                        return Poll::Ready(Err(permits.reject(Rejection::WaitElapsed).into()));
                    };
                    let Queued {
                        waiting,
                        mut service,
                        request,
                        ..
                    } = queued.take().expect("checked above");
                    let since = waiting.since;
                    drop(waiting);
                    let waited = since.elapsed();
                    crate::waited::record(since);
                    let permit = Permit::granted(permit, waited);
                    state.set(run(&mut service, request, permit));
                }
                StateProj::Running { future, permit } => {
                    let held = permit.as_mut().expect("polled after completion");
                    // Left in place if the inner future panics.
                    held.outcome = CallOutcome::Panicked;
                    return match future.poll(cx) {
                        Poll::Pending => {
                            held.outcome = CallOutcome::Cancelled;
                            Poll::Pending
                        }
                        Poll::Ready(Ok(response)) => {
                            let mut permit = permit.take().expect("checked above");
                            permit.outcome = CallOutcome::Success;
                            Poll::Ready(Ok(M::respond(response, || permit)))
                        }
                        Poll::Ready(Err(error)) => {
                            held.outcome = CallOutcome::Failure;
                            *permit = None;
                            Poll::Ready(Err(error.into()))
                        }
                    };
                }
            }
        }
    }
}

impl<S, Req, M> fmt::Debug for ResponseFuture<S, Req, M>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
