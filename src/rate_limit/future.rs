use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::key::KeyExtractor;
use super::layer::{FailMode, Shared};
use super::response::{problem_response, AdmittedHeaders, Outcome, RateLimitBody, Refusal};
use crate::{BoxError, Decision, Limiter};

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit).
    ///
    /// It asks each policy in turn, waits if a policy granted a permit that falls due later, and
    /// then calls the inner service or answers for it. Dropped before the inner service is
    /// called (the client went away, or a timeout fired), it gives every permit it holds back.
    pub struct ResponseFuture<S, ReqBody, X, L>
    where
        S: Service<Request<ReqBody>>,
        X: KeyExtractor,
        L: Limiter<X::Key>,
    {
        #[pin]
        state: State<S::Future, L::Future>,
        pending: Option<Pending<S, ReqBody, X, L>>,
        headers: Option<AdmittedHeaders>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, R> {
        // Waiting for the decision of one policy.
        Reserve { #[pin] reserve: R },
        // Every policy admitted; the last permit falls due when the sleep ends.
        Wait { sleep: Pin<Box<Sleep>> },
        // The inner service is answering.
        Call { #[pin] future: F },
        // The layer answers itself.
        Answer { response: Option<Response<Bytes>> },
    }
}

impl<S, ReqBody, X, L> ResponseFuture<S, ReqBody, X, L>
where
    S: Service<Request<ReqBody>>,
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    pub(crate) fn call(future: S::Future) -> Self {
        Self {
            state: State::Call { future },
            pending: None,
            headers: None,
        }
    }

    pub(crate) fn answer(response: Response<Bytes>) -> Self {
        Self {
            state: State::Answer {
                response: Some(response),
            },
            pending: None,
            headers: None,
        }
    }

    pub(crate) fn reserve(reserve: L::Future, pending: Pending<S, ReqBody, X, L>) -> Self {
        Self {
            state: State::Reserve { reserve },
            pending: Some(pending),
            headers: None,
        }
    }
}

impl<S, ReqBody, ResBody, X, L> Future for ResponseFuture<S, ReqBody, X, L>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    type Output = Result<Response<RateLimitBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let step = match this.state.as_mut().project() {
                StateProj::Call { future } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(headers) = this.headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(RateLimitBody::inner)));
                }
                StateProj::Answer { response } => {
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(response.map(RateLimitBody::full)));
                }
                StateProj::Reserve { reserve } => {
                    let result = ready!(reserve.poll(cx));
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
                    let (mut inner, request, headers) = pending.into_call();
                    *this.headers = headers;
                    this.state.set(State::Call {
                        future: inner.call(request),
                    });
                }
            }
        }
    }
}

const PENDING: &str = "a ResponseFuture holds its request until it calls the inner service";

fn pending_mut<T>(pending: &mut Option<T>) -> &mut T {
    pending.as_mut().expect(PENDING)
}

impl<S, ReqBody, X, L> fmt::Debug for ResponseFuture<S, ReqBody, X, L>
where
    S: Service<Request<ReqBody>>,
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Reserve { .. } => "reserving",
            State::Wait { .. } => "waiting",
            State::Call { .. } => "calling",
            State::Answer { .. } => "answering",
        };
        let held = self.pending.as_ref().map_or(0, |p| p.held.admitted());
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("permits_held", &held)
            .finish()
    }
}

/// What to do next.
enum Step<R> {
    Reserve(R),
    Wait(Duration),
    Call,
    Answer(Response<Bytes>),
}

/// A request that has not reached the inner service yet, with the permits it holds.
pub(crate) struct Pending<S, ReqBody, X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    inner: S,
    parts: Parts,
    body: ReqBody,
    held: Held<X, L>,
}

impl<S, ReqBody, X, L> Pending<S, ReqBody, X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    pub(crate) fn new(
        inner: S,
        parts: Parts,
        body: ReqBody,
        shared: Arc<Shared<X, L>>,
        key: X::Key,
    ) -> Self {
        let outcomes = Vec::with_capacity(shared.limiters.len());
        Self {
            inner,
            parts,
            body,
            held: Held {
                shared,
                key,
                outcomes,
                waited: false,
            },
        }
    }

    /// Records the answer of the policy being asked (if any) and says what comes next.
    fn advance(&mut self, result: Option<Result<Decision, BoxError>>) -> Step<L::Future> {
        let held = &mut self.held;
        if let Some(result) = result {
            match result {
                Ok(decision) if decision.allowed => held.outcomes.push(Outcome::Admitted(decision)),
                Ok(decision) => held.outcomes.push(Outcome::Refused(decision)),
                Err(error) => {
                    let index = held.outcomes.len();
                    let name = &held.shared.meta.policies[index].name;
                    match held.shared.meta.on_limiter_error {
                        FailMode::Open => {
                            tracing::warn!(
                                policy = &**name,
                                error = %error,
                                "rate limit: the limiter failed; letting the request through"
                            );
                            held.outcomes.push(Outcome::Failed);
                        }
                        FailMode::Closed => {
                            tracing::warn!(
                                policy = &**name,
                                error = %error,
                                "rate limit: the limiter failed; answering 503"
                            );
                            held.refund_all();
                            return Step::Answer(problem_response(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "The rate limiter is unavailable; retry later.",
                            ));
                        }
                    }
                }
            }
        }
        if let Some(limiter) = held.shared.limiters.get(held.outcomes.len()) {
            return Step::Reserve(limiter.reserve(&held.key, super::COST));
        }
        if held
            .outcomes
            .iter()
            .any(|o| matches!(o, Outcome::Refused(_)))
        {
            let response = Refusal {
                meta: &held.shared.meta,
                request: &self.parts,
                outcomes: &held.outcomes,
            }
            .respond();
            held.refund_all();
            return Step::Answer(response);
        }
        if !held.waited {
            held.waited = true;
            let wait = held
                .outcomes
                .iter()
                .filter_map(|o| match o {
                    Outcome::Admitted(d) => Some(d.wait),
                    _ => None,
                })
                .max()
                .unwrap_or(Duration::ZERO);
            if !wait.is_zero() {
                return Step::Wait(wait);
            }
        }
        Step::Call
    }

    /// Hands the request over: the permits now belong to it and are no longer given back.
    fn into_call(self) -> (S, Request<ReqBody>, Option<AdmittedHeaders>) {
        let Pending {
            inner,
            parts,
            body,
            mut held,
        } = self;
        let headers = held.shared.meta.admitted_headers(&held.outcomes);
        held.outcomes.clear();
        (inner, Request::from_parts(parts, body), headers)
    }
}

/// The permits a pending request holds; dropped before the request is handed over, it gives
/// them back.
struct Held<X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    shared: Arc<Shared<X, L>>,
    key: X::Key,
    outcomes: Vec<Outcome>,
    waited: bool,
}

impl<X, L> Held<X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    fn admitted(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Admitted(_)))
            .count()
    }

    /// Gives back every permit held, once: the outcomes are cleared as they are refunded.
    fn refund_all(&mut self) {
        for (limiter, outcome) in self.shared.limiters.iter().zip(self.outcomes.drain(..)) {
            if let Outcome::Admitted(decision) = outcome {
                limiter.refund(&self.key, super::COST, &decision);
            }
        }
    }
}

impl<X, L> Drop for Held<X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    fn drop(&mut self) {
        self.refund_all();
    }
}
