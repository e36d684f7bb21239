//! The response future of [`RateLimit`](super::RateLimit).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::body::{BodyKind, SameBody};
use super::decide::{Conclusion, Ledger, Next, Settle};
use super::layer::Shared;
use super::policy::{BoxReserve, PolicySet};
use super::response::{AdmittedHeaders, Outcome};
use crate::head::RequestHead;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit).
    ///
    /// When every limiter decides at once (the in-memory ones always do) the decision is made in
    /// `call` and this future only drives the inner service or carries the answer. Otherwise it
    /// asks the remaining policies, waits if a policy granted a permit that falls due later, and
    /// then calls the inner service or answers for it. Dropped before the inner service is
    /// called (the client went away, or a timeout fired), it gives every permit it holds back.
    pub struct ResponseFuture<S, ReqBody, P, M = SameBody>
    where
        S: Service<Request<ReqBody>>,
        P: PolicySet,
    {
        #[pin]
        state: State<S::Future, Box<Pending<S, ReqBody, P>>, P>,
        kind: PhantomData<fn() -> M>,
    }
}

pin_project! {
    // One enum, so that the common case (the inner service's answer passed on untouched) is
    // one variant to poll and to drop, with nothing beside it to look at.
    #[project = StateProj]
    enum State<F, Q, P>
    where
        P: PolicySet,
    {
        // The inner service is answering; its response is passed on as it is.
        Call { #[pin] future: F },
        // The inner service is answering; its response gets headers.
        Headed { #[pin] future: F, headers: Option<AdmittedHeaders> },
        // The inner service is answering; its response gets headers, or settles permits.
        CallThen {
            #[pin]
            future: F,
            headers: Option<AdmittedHeaders>,
            settle: Option<Box<Settle<P>>>,
        },
        // Waiting for the decision of one policy.
        Reserve { reserve: BoxReserve, pending: Option<Q> },
        // Every policy admitted; the last permit falls due when the sleep ends.
        Wait { sleep: Pin<Box<Sleep>>, pending: Option<Q> },
        // The layer answers itself.
        Answer { response: Option<Response<Bytes>> },
    }
}

impl<S, ReqBody, P, M> ResponseFuture<S, ReqBody, P, M>
where
    S: Service<Request<ReqBody>>,
    P: PolicySet,
{
    /// The inner service's answer, passed on as it is.
    #[inline]
    pub(crate) fn call(future: S::Future) -> Self {
        Self {
            state: State::Call { future },
            kind: PhantomData,
        }
    }

    /// The inner service's answer, with `headers` added and `settle` applied to it.
    pub(crate) fn call_then(
        future: S::Future,
        headers: Option<AdmittedHeaders>,
        settle: Option<Box<Settle<P>>>,
    ) -> Self {
        Self {
            state: State::CallThen {
                future,
                headers,
                settle,
            },
            kind: PhantomData,
        }
    }

    /// The inner service's answer, with `headers` added.
    pub(crate) fn headed(future: S::Future, headers: Option<AdmittedHeaders>) -> Self {
        Self {
            state: State::Headed { future, headers },
            kind: PhantomData,
        }
    }

    pub(crate) fn answer(response: Response<Bytes>) -> Self {
        Self {
            state: State::Answer {
                response: Some(response),
            },
            kind: PhantomData,
        }
    }

    /// Goes on later: `next` is the step the synchronous part of `call` could not finish.
    pub(crate) fn deferred(next: Deferred, pending: Box<Pending<S, ReqBody, P>>) -> Self {
        let pending = Some(pending);
        let state = match next {
            Deferred::Reserve(reserve) => State::Reserve { reserve, pending },
            Deferred::Wait(wait) => State::Wait {
                sleep: Box::pin(tokio::time::sleep(wait)),
                pending,
            },
        };
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
        // The common state first, on its own: the others are handled out of line, so that
        // polling an untouched answer needs no more than a small frame.
        let mut this = self.project();
        if let StateProj::Call { future } = this.state.as_mut().project() {
            return future.poll(cx).map(|result| result.map(M::response));
        }
        poll_other::<S, ReqBody, ResBody, P, M>(this.state, cx)
    }
}

/// [`ResponseFuture::poll`] in every state but [`State::Call`].
#[inline(never)]
#[allow(clippy::type_complexity)]
fn poll_other<S, ReqBody, ResBody, P, M>(
    mut state: Pin<&mut State<S::Future, Box<Pending<S, ReqBody, P>>, P>>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<M::Body>, S::Error>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    P: PolicySet,
    M: BodyKind<ResBody>,
{
    loop {
        let step = match state.as_mut().project() {
            StateProj::Call { future } => {
                return future.poll(cx).map(|result| result.map(M::response));
            }
            StateProj::Headed { future, headers } => {
                return future
                    .poll(cx)
                    .map_ok(|response| M::response(with_headers(response, headers)));
            }
            StateProj::CallThen {
                future,
                headers,
                settle,
            } => {
                // Mapped where it lies, so the response is not moved out and back in.
                return future.poll(cx).map_ok(|mut response| {
                    if let Some(settle) = settle.take() {
                        let (parts, body) = response.into_parts();
                        settle.apply(&parts, headers);
                        response = Response::from_parts(parts, body);
                    }
                    M::response(with_headers(response, headers))
                });
            }
            StateProj::Answer { response } => {
                let response = response
                    .take()
                    .expect("ResponseFuture polled after completion");
                return Poll::Ready(Ok(response.map(M::answer)));
            }
            StateProj::Reserve { reserve, pending } => {
                let result = ready!(reserve.as_mut().poll(cx));
                pending.as_mut().expect(PENDING).advance(Some(result))
            }
            StateProj::Wait { sleep, pending } => {
                ready!(sleep.as_mut().poll(cx));
                pending.as_mut().expect(PENDING).advance(None)
            }
        };
        // Every step comes from a state that holds the pending request.
        let pending = match state.as_mut().project() {
            StateProj::Reserve { pending, .. } | StateProj::Wait { pending, .. } => {
                pending.take().expect(PENDING)
            }
            _ => unreachable!("{PENDING}"),
        };
        let next = match step {
            Step::Reserve(reserve) => State::Reserve {
                reserve,
                pending: Some(pending),
            },
            Step::Wait(wait) => State::Wait {
                sleep: Box::pin(tokio::time::sleep(wait)),
                pending: Some(pending),
            },
            Step::Answer(response) => {
                // The request and its permits go (given back) before the answer is sent.
                drop(pending);
                State::Answer {
                    response: Some(response),
                }
            }
            Step::Call => {
                let (mut inner, request, headers, settle) = (*pending).into_call();
                State::CallThen {
                    future: inner.call(request),
                    headers,
                    settle,
                }
            }
        };
        state.set(next);
    }
}

/// `response` with the rate-limit headers added, if there are any (taken: added once).
#[inline(always)]
fn with_headers<B>(
    mut response: Response<B>,
    headers: &mut Option<AdmittedHeaders>,
) -> Response<B> {
    if let Some(headers) = headers.take() {
        headers.apply(response.headers_mut());
    }
    response
}

const PENDING: &str = "a ResponseFuture holds its request until it calls the inner service";

impl<S, ReqBody, P, M> fmt::Debug for ResponseFuture<S, ReqBody, P, M>
where
    S: Service<Request<ReqBody>>,
    P: PolicySet,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (state, pending, settles) = match &self.state {
            State::Call { .. } | State::Headed { .. } => ("calling", None, false),
            State::CallThen { settle, .. } => ("calling", None, settle.is_some()),
            State::Reserve { pending, .. } => ("reserving", pending.as_ref(), false),
            State::Wait { pending, .. } => ("waiting", pending.as_ref(), false),
            State::Answer { .. } => ("answering", None, false),
        };
        let held = pending.map_or(0, |p| {
            p.held
                .ledger
                .outcomes
                .as_slice()
                .iter()
                .filter(|o| matches!(o, Outcome::Admitted(_)))
                .count()
        });
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("permits_held", &held)
            .field("settles_after_response", &settles)
            .finish()
    }
}

/// What the synchronous part of `call` leaves to the future.
pub(crate) enum Deferred {
    /// A policy that has not decided yet.
    Reserve(BoxReserve),
    /// Every policy admitted; wait this long for the last permit.
    Wait(Duration),
}

/// What the future does next.
enum Step {
    Reserve(BoxReserve),
    Wait(Duration),
    Call,
    Answer(Response<Bytes>),
}

/// A request that has not reached the inner service yet, with the permits it holds.
pub(crate) struct Pending<S, ReqBody, P: PolicySet> {
    inner: S,
    request: Request<ReqBody>,
    held: Held<P>,
}

impl<S, ReqBody, P: PolicySet> Pending<S, ReqBody, P> {
    /// `waited` says whether every policy has decided and the wait, if any, is under way.
    pub(crate) fn new(
        inner: S,
        request: Request<ReqBody>,
        shared: Arc<Shared<P>>,
        ledger: Ledger<P>,
        waited: bool,
    ) -> Box<Self> {
        Box::new(Self {
            inner,
            request,
            held: Held {
                shared,
                ledger,
                waited,
            },
        })
    }

    /// Records the answer of the policy being asked (if any) and says what comes next.
    fn advance(
        &mut self,
        result: Option<Result<crate::decision::Decision, crate::BoxError>>,
    ) -> Step {
        let held = &mut self.held;
        if let Some(result) = result {
            if let Some(answer) = held.ledger.record(&held.shared, result) {
                return Step::Answer(answer);
            }
        } else if held.waited {
            return Step::Call;
        }
        match held
            .ledger
            .drive(&held.shared, &RequestHead::from(&self.request))
        {
            Next::Reserve(reserve) => Step::Reserve(reserve),
            Next::Done(Conclusion::Answer(response)) => Step::Answer(response),
            Next::Done(Conclusion::Wait(wait)) => {
                held.waited = true;
                Step::Wait(wait)
            }
            Next::Done(Conclusion::Admit) => Step::Call,
        }
    }

    /// Hands the request over: the permits now belong to it and are no longer given back on
    /// drop (those of policies that count by outcome are settled after the response).
    #[allow(clippy::type_complexity)]
    fn into_call(
        self,
    ) -> (
        S,
        Request<ReqBody>,
        Option<AdmittedHeaders>,
        Option<Box<Settle<P>>>,
    ) {
        let Pending {
            inner,
            request,
            held,
        } = self;
        let (shared, ledger) = held.hand_over();
        let headers = ledger.admitted_headers(&shared);
        let settle = ledger.into_settle(&shared);
        (inner, request, headers, settle)
    }
}

/// The permits a pending request holds; dropped before the request is handed over, it gives
/// them back.
struct Held<P: PolicySet> {
    shared: Arc<Shared<P>>,
    ledger: Ledger<P>,
    waited: bool,
}

impl<P: PolicySet> Held<P> {
    /// Takes the ledger out, so that dropping what is left gives nothing back.
    fn hand_over(mut self) -> (Arc<Shared<P>>, Ledger<P>) {
        (Arc::clone(&self.shared), self.ledger.take())
    }
}

impl<P: PolicySet> Drop for Held<P> {
    fn drop(&mut self) {
        let shared = Arc::clone(&self.shared);
        self.ledger.refund_all(&shared);
    }
}
