//! Response futures of the bulkhead services.

use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::body::BulkheadBody;
use super::error::BulkheadFull;
use super::events::Rejection;
use super::semaphore::{Admission, Ending, Permit, Shared, Waiter};
use crate::BoxError;

/// A call waiting in the queue, with everything it needs to start once granted.
struct Queued<S, Req> {
    waiter: Waiter,
    since: Instant,
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

/// Calls the inner service under `permit`. Should `call` panic, the permit is dropped while the
/// thread unwinds and reports the panic.
#[inline]
fn run<S, Req>(service: &mut S, request: Req, permit: Permit) -> State<S, Req>
where
    S: Service<Req>,
{
    State::Running {
        future: service.call(request),
        permit: Some(permit),
    }
}

impl<S, Req> State<S, Req>
where
    S: Service<Req> + Clone,
{
    /// Admits or refuses a call; this is where the permit is taken.
    #[inline]
    fn start(shared: &Arc<Shared>, service: &mut S, request: Req) -> Self {
        match shared.admit() {
            Admission::Permitted => {
                let permit = Permit::granted(shared.clone(), std::time::Duration::ZERO);
                run(service, request, permit)
            }
            Admission::Rejected => State::Rejected {
                error: Some(shared.reject(Rejection::NoCapacity)),
            },
            Admission::Queued(ticket) => {
                // The waiter exists first, so that it leaves the queue even if `clone` panics.
                let waiter = Waiter::new(shared.clone(), ticket);
                let since = Instant::now();
                // The readied service goes with the call; this handle keeps a fresh clone,
                // which the caller readies again before its next call.
                let service = mem::replace(service, service.clone());
                State::Queued {
                    queued: Some(Queued {
                        waiter,
                        since,
                        deadline: None,
                        service,
                        request,
                    }),
                }
            }
        }
    }
}

impl<S, Req> State<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    /// Drives the call to its end. On success the permit stays in the state, marked as a
    /// success, unless `release` asks to give it back at once; on failure it is given back.
    #[inline]
    fn poll_call(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        release: bool,
    ) -> Poll<Result<S::Response, BoxError>> {
        loop {
            match self.as_mut().project() {
                StateProj::Rejected { error } => {
                    let error = error.take().expect("polled after completion");
                    return Poll::Ready(Err(error.into()));
                }
                StateProj::Queued { queued } => {
                    let entry = queued.as_mut().expect("polled after completion");
                    if entry.waiter.poll_grant(cx).is_pending() {
                        // A wait so long that its end cannot be represented (such as
                        // `Duration::MAX`) is no bound at all.
                        let Some(until) = entry
                            .waiter
                            .shared()
                            .max_wait
                            .and_then(|max_wait| entry.since.checked_add(max_wait))
                        else {
                            return Poll::Pending;
                        };
                        let deadline = entry
                            .deadline
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                        ready!(deadline.as_mut().poll(cx));
                        if !entry.waiter.give_up() {
                            let shared = entry.waiter.shared().clone();
                            *queued = None;
                            return Poll::Ready(Err(shared.reject(Rejection::WaitElapsed).into()));
                        }
                        // Granted at the last moment: the call goes ahead.
                    } else {
                        entry.waiter.take_permit();
                    }
                    let Queued {
                        waiter,
                        since,
                        mut service,
                        request,
                        ..
                    } = queued.take().expect("checked above");
                    let permit = Permit::granted(waiter.shared().clone(), since.elapsed());
                    drop(waiter);
                    let next = run(&mut service, request, permit);
                    self.set(next);
                }
                StateProj::Running { future, permit } => {
                    let held = permit.as_mut().expect("polled after completion");
                    // Left in place if the inner future panics.
                    held.outcome = Ending::Panicked;
                    return match future.poll(cx) {
                        Poll::Pending => {
                            held.outcome = Ending::Cancelled;
                            Poll::Pending
                        }
                        Poll::Ready(Ok(response)) => {
                            held.outcome = Ending::Success;
                            if release {
                                *permit = None;
                            }
                            Poll::Ready(Ok(response))
                        }
                        Poll::Ready(Err(error)) => {
                            held.outcome = Ending::Failure;
                            *permit = None;
                            Poll::Ready(Err(error.into()))
                        }
                    };
                }
            }
        }
    }
}

impl<S, Req> State<S, Req>
where
    S: Service<Req>,
{
    /// The permit of a call that has just succeeded.
    fn take_permit(self: Pin<&mut Self>) -> Option<Permit> {
        match self.project() {
            StateProj::Running { permit, .. } => permit.take(),
            _ => None,
        }
    }
}

pin_project! {
    /// Response future of [`BulkheadService`](super::BulkheadService): the permit is given back
    /// when this future completes or is dropped.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
    }
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req> + Clone,
{
    #[inline]
    pub(crate) fn start(shared: &Arc<Shared>, service: &mut S, request: Req) -> Self {
        Self {
            state: State::start(shared, service, request),
        }
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().state.poll_call(cx, true)
    }
}

impl<S, Req> fmt::Debug for ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

pin_project! {
    /// Response future of [`BulkheadBodyService`](super::BulkheadBodyService): on success the
    /// permit moves into the response body, which gives it back when it ends or is dropped.
    pub struct BodyResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
    }
}

impl<S, Req> BodyResponseFuture<S, Req>
where
    S: Service<Req> + Clone,
{
    pub(crate) fn start(shared: &Arc<Shared>, service: &mut S, request: Req) -> Self {
        Self {
            state: State::start(shared, service, request),
        }
    }
}

impl<S, Req, B> Future for BodyResponseFuture<S, Req>
where
    S: Service<Req, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body,
{
    type Output = Result<http::Response<BulkheadBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let response = ready!(state.as_mut().poll_call(cx, false))?;
        let permit = state
            .take_permit()
            .expect("a successful call holds its permit");
        Poll::Ready(Ok(response.map(|body| BulkheadBody::new(body, permit))))
    }
}

impl<S, Req> fmt::Debug for BodyResponseFuture<S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyResponseFuture").finish_non_exhaustive()
    }
}
