//! The response future of [`RateLimitService`](super::RateLimitService).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::body::{BodyKind, SameBody};
use super::decide::{Ledger, Progress, Settlement};
use super::headers::AdmittedHeaders;
use super::set::PolicySet;
use crate::body_end::Reads;
use crate::head::RequestHead;
use crate::limiter::BoxReserve;

pin_project! {
    /// The response future of [`RateLimitService`](super::RateLimitService).
    ///
    /// When every limiter decides at once (the in-memory ones always do) the decision is made in
    /// `call` and this future drives the inner service, or carries the layer's answer. Otherwise
    /// it waits for the policies still deciding, and for a permit that falls due later, and then
    /// calls the inner service or answers for it. Dropped before the inner service is called (the
    /// client went away, or a timeout fired), it gives every permit it holds back.
    pub struct ResponseFuture<S, ReqBody, P, M = SameBody>
    where
        S: Service<Request<ReqBody>>,
        P: PolicySet,
    {
        #[pin]
        state: State<S, ReqBody, P>,
        kind: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(crate) enum State<S, ReqBody, P>
    where
        S: Service<Request<ReqBody>>,
        P: PolicySet,
    {
        // A policy whose limiter needs I/O is deciding.
        Reserving { reserve: BoxReserve, request: Option<Box<WaitingRequest<S, ReqBody, P>>> },
        // Every policy admitted; the last permit falls due when the sleep ends.
        Waiting { sleep: Pin<Box<Sleep>>, request: Option<Box<WaitingRequest<S, ReqBody, P>>> },
        // The inner service is answering; its response gets the rate-limit headers, and settles
        // what is left to settle.
        Calling {
            #[pin]
            future: S::Future,
            headers: Option<AdmittedHeaders>,
            settlement: Option<Box<Settlement<P>>>,
        },
        // The layer answers itself.
        Answering { response: Option<Response<Bytes>> },
    }
}

/// A request waiting to reach the inner service: the service that will answer it, and the
/// permits it holds (given back if it is dropped).
pub(crate) struct WaitingRequest<S, ReqBody, P: PolicySet> {
    pub(crate) inner: S,
    pub(crate) request: Request<ReqBody>,
    pub(crate) ledger: Ledger<P>,
}

impl<S, ReqBody, P> WaitingRequest<S, ReqBody, P>
where
    S: Service<Request<ReqBody>>,
    P: PolicySet,
{
    /// The state the decision's `progress` leads to.
    pub(crate) fn into_state(self: Box<Self>, progress: Progress) -> State<S, ReqBody, P> {
        match progress {
            Progress::Reserve(reserve) => State::Reserving {
                reserve,
                request: Some(self),
            },
            Progress::Wait(wait) => State::Waiting {
                sleep: Box::pin(tokio::time::sleep(wait)),
                request: Some(self),
            },
            Progress::Admit => {
                let mut waiting = *self;
                let (headers, settlement) = waiting.ledger.admit();
                State::Calling {
                    future: waiting.inner.call(waiting.request),
                    headers,
                    settlement,
                }
            }
            Progress::Answer(response) => State::Answering {
                response: Some(*response),
            },
        }
    }
}

impl<S, ReqBody, P, M> ResponseFuture<S, ReqBody, P, M>
where
    S: Service<Request<ReqBody>>,
    P: PolicySet,
{
    /// The future in `state`: where the decision in `call` stopped.
    pub(crate) fn new(state: State<S, ReqBody, P>) -> Self {
        Self {
            state,
            kind: PhantomData,
        }
    }
}

impl<S, ReqBody, ResBody, P, M> Future for ResponseFuture<S, ReqBody, P, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    P: PolicySet,
    M: BodyKind<ResBody>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Calling {
                    future,
                    headers,
                    settlement,
                } => {
                    let mut response = ready!(future.poll(cx))?;
                    let mut settling = None;
                    if let Some(settlement) = settlement.take() {
                        let (parts, body) = response.into_parts();
                        settling = settlement.apply(&parts, headers);
                        response = Response::from_parts(parts, body);
                    }
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    let settling = settling.map(|s| s as Box<dyn Reads>);
                    return Poll::Ready(Ok(M::response(response, settling)));
                }
                StateProj::Answering { response } => {
                    let response = response.take().expect(POLLED_AFTER_COMPLETION);
                    return Poll::Ready(Ok(response.map(M::answer)));
                }
                StateProj::Reserving { reserve, request } => {
                    let result = ready!(reserve.as_mut().poll(cx));
                    // Decided in place: should a key extractor or a cost function panic, the
                    // future still holds the request's permits, and gives them back when dropped.
                    let waiting = request.as_mut().expect(POLLED_AFTER_COMPLETION);
                    let head = RequestHead::from(&waiting.request);
                    let progress = waiting.ledger.resume(result, &head);
                    let waiting = request.take().expect(POLLED_AFTER_COMPLETION);
                    waiting.into_state(progress)
                }
                StateProj::Waiting { sleep, request } => {
                    ready!(sleep.as_mut().poll(cx));
                    let waiting = request.take().expect(POLLED_AFTER_COMPLETION);
                    waiting.into_state(Progress::Admit)
                }
            };
            state.set(next);
        }
    }
}

const POLLED_AFTER_COMPLETION: &str = "ResponseFuture polled after completion";

impl<S, ReqBody, P, M> fmt::Debug for ResponseFuture<S, ReqBody, P, M>
where
    S: Service<Request<ReqBody>>,
    P: PolicySet,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (state, waiting, settles) = match &self.state {
            State::Calling { settlement, .. } => ("calling", None, settlement.is_some()),
            State::Reserving { request, .. } => ("reserving", request.as_ref(), false),
            State::Waiting { request, .. } => ("waiting", request.as_ref(), false),
            State::Answering { .. } => ("answering", None, false),
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("permits_held", &waiting.map_or(0, |d| d.ledger.held()))
            .field("settles_after_response", &settles)
            .finish()
    }
}
