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
use super::head::RequestHead;
use super::layer::Shared;
use super::policy::{BoxReserve, PolicySet};
use super::response::{AdmittedHeaders, Outcome};

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
        state: State<S::Future>,
        pending: Option<Box<Pending<S, ReqBody, P>>>,
        headers: Option<AdmittedHeaders>,
        settle: Option<Box<Settle<P>>>,
        kind: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // Waiting for the decision of one policy.
        Reserve { reserve: BoxReserve },
        // Every policy admitted; the last permit falls due when the sleep ends.
        Wait { sleep: Pin<Box<Sleep>> },
        // The inner service is answering.
        Call { #[pin] future: F },
        // The layer answers itself.
        Answer { response: Option<Response<Bytes>> },
    }
}

impl<S, ReqBody, P, M> ResponseFuture<S, ReqBody, P, M>
where
    S: Service<Request<ReqBody>>,
    P: PolicySet,
{
    pub(crate) fn call(
        future: S::Future,
        headers: Option<AdmittedHeaders>,
        settle: Option<Box<Settle<P>>>,
    ) -> Self {
        Self {
            state: State::Call { future },
            pending: None,
            headers,
            settle,
            kind: PhantomData,
        }
    }

    pub(crate) fn answer(response: Response<Bytes>) -> Self {
        Self {
            state: State::Answer {
                response: Some(response),
            },
            pending: None,
            headers: None,
            settle: None,
            kind: PhantomData,
        }
    }

    /// Goes on later: `next` is the step the synchronous part of `call` could not finish.
    pub(crate) fn deferred(next: Deferred, pending: Box<Pending<S, ReqBody, P>>) -> Self {
        let state = match next {
            Deferred::Reserve(reserve) => State::Reserve { reserve },
            Deferred::Wait(wait) => State::Wait {
                sleep: Box::pin(tokio::time::sleep(wait)),
            },
        };
        Self {
            state,
            pending: Some(pending),
            headers: None,
            settle: None,
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
        let mut this = self.project();
        loop {
            let step = match this.state.as_mut().project() {
                StateProj::Call { future } => {
                    if this.settle.is_none() && this.headers.is_none() {
                        // Nothing to add: the inner answer is passed on as it is, without
                        // being moved out and back in.
                        return future.poll(cx).map(|result| result.map(M::response));
                    }
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(settle) = this.settle.take() {
                        let (parts, body) = response.into_parts();
                        settle.apply(&parts, this.headers);
                        response = Response::from_parts(parts, body);
                    }
                    if let Some(headers) = this.headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(M::response(response)));
                }
                StateProj::Answer { response } => {
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(response.map(M::answer)));
                }
                StateProj::Reserve { reserve } => {
                    let result = ready!(reserve.as_mut().poll(cx));
                    pending_mut(this.pending).advance(Some(result))
                }
                StateProj::Wait { sleep } => {
                    ready!(sleep.as_mut().poll(cx));
                    pending_mut(this.pending).advance(None)
                }
            };
            match step {
                Step::Reserve(reserve) => this.state.set(State::Reserve { reserve }),
                Step::Wait(wait) => this.state.set(State::Wait {
                    sleep: Box::pin(tokio::time::sleep(wait)),
                }),
                Step::Answer(response) => {
                    *this.pending = None;
                    this.state.set(State::Answer {
                        response: Some(response),
                    });
                }
                Step::Call => {
                    let pending = this.pending.take().expect(PENDING);
                    let (mut inner, request, headers, settle) = (*pending).into_call();
                    *this.headers = headers;
                    *this.settle = settle;
                    this.state.set(State::Call {
                        future: inner.call(request),
                    });
                }
            }
        }
    }
}

const PENDING: &str = "a ResponseFuture holds its request until it calls the inner service";

fn pending_mut<T>(pending: &mut Option<Box<T>>) -> &mut T {
    pending.as_mut().expect(PENDING)
}

impl<S, ReqBody, P, M> fmt::Debug for ResponseFuture<S, ReqBody, P, M>
where
    S: Service<Request<ReqBody>>,
    P: PolicySet,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Reserve { .. } => "reserving",
            State::Wait { .. } => "waiting",
            State::Call { .. } => "calling",
            State::Answer { .. } => "answering",
        };
        let held = self.pending.as_ref().map_or(0, |p| {
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
            .field("settles_after_response", &self.settle.is_some())
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
