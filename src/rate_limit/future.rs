use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
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

use super::body::{BodyKind, SameBody};
use super::key::KeyExtractor;
use super::layer::{FailMode, Shared};
use super::response::{problem_response, AdmittedHeaders, Outcome, Refusal};
use crate::{BoxError, Decision, Limiter};

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit).
    ///
    /// When every limiter decides at once (the in-memory ones always do) the decision is made in
    /// `call` and this future only drives the inner service or carries the answer. Otherwise it
    /// asks the remaining policies, waits if a policy granted a permit that falls due later, and
    /// then calls the inner service or answers for it. Dropped before the inner service is
    /// called (the client went away, or a timeout fired), it gives every permit it holds back.
    pub struct ResponseFuture<S, ReqBody, X, L, M = SameBody>
    where
        S: Service<Request<ReqBody>>,
        X: KeyExtractor,
        L: Limiter<X::Key>,
    {
        #[pin]
        state: State<S::Future, L::Future>,
        pending: Option<Box<Pending<S, ReqBody, X, L>>>,
        headers: Option<AdmittedHeaders>,
        kind: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, R> {
        // Waiting for the decision of one policy.
        Reserve { reserve: Pin<Box<R>> },
        // Every policy admitted; the last permit falls due when the sleep ends.
        Wait { sleep: Pin<Box<Sleep>> },
        // The inner service is answering.
        Call { #[pin] future: F },
        // The layer answers itself.
        Answer { response: Option<Response<Bytes>> },
    }
}

impl<S, ReqBody, X, L, M> ResponseFuture<S, ReqBody, X, L, M>
where
    S: Service<Request<ReqBody>>,
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    pub(crate) fn call(future: S::Future, headers: Option<AdmittedHeaders>) -> Self {
        Self {
            state: State::Call { future },
            pending: None,
            headers,
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
            kind: PhantomData,
        }
    }

    /// Goes on later: `next` is the step the synchronous part of `call` could not finish.
    pub(crate) fn deferred(
        next: Deferred<L::Future>,
        pending: Box<Pending<S, ReqBody, X, L>>,
    ) -> Self {
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
            kind: PhantomData,
        }
    }
}

impl<S, ReqBody, ResBody, X, L, M> Future for ResponseFuture<S, ReqBody, X, L, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    X: KeyExtractor,
    L: Limiter<X::Key>,
    M: BodyKind<ResBody>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let step = match this.state.as_mut().project() {
                StateProj::Call { future } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(headers) = this.headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(M::inner)));
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
                    let (mut inner, request, headers) = (*pending).into_call();
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

fn pending_mut<T>(pending: &mut Option<Box<T>>) -> &mut T {
    pending.as_mut().expect(PENDING)
}

impl<S, ReqBody, X, L, M> fmt::Debug for ResponseFuture<S, ReqBody, X, L, M>
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
        let held = self.pending.as_ref().map_or(0, |p| {
            p.held
                .outcomes
                .as_slice()
                .iter()
                .filter(|o| matches!(o, Outcome::Admitted(_)))
                .count()
        });
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("permits_held", &held)
            .finish()
    }
}

/// What the synchronous part of `call` leaves to the future.
pub(crate) enum Deferred<R> {
    /// A policy that has not decided yet.
    Reserve(Pin<Box<R>>),
    /// Every policy admitted; wait this long for the last permit.
    Wait(Duration),
}

/// What the future does next.
enum Step<R> {
    Reserve(Pin<Box<R>>),
    Wait(Duration),
    Call,
    Answer(Response<Bytes>),
}

const INLINE: usize = 2;

/// Outcomes for any number of policies; the common case (up to two) does not allocate.
// Inline on purpose: it lives on the stack of `call`, and is boxed with the request when the
// decision is deferred.
#[allow(clippy::large_enum_variant)]
pub(crate) enum OutcomeList {
    Inline {
        len: usize,
        items: [Outcome; INLINE],
    },
    Heap(Vec<Outcome>),
}

impl OutcomeList {
    pub(crate) fn new(policies: usize) -> Self {
        if policies <= INLINE {
            OutcomeList::Inline {
                len: 0,
                items: [Outcome::Failed; INLINE],
            }
        } else {
            OutcomeList::Heap(Vec::with_capacity(policies))
        }
    }

    pub(crate) fn push(&mut self, outcome: Outcome) {
        match self {
            OutcomeList::Inline { len, items } if *len < INLINE => {
                items[*len] = outcome;
                *len += 1;
            }
            OutcomeList::Inline { len, items } => {
                let mut vec = items[..*len].to_vec();
                vec.push(outcome);
                *self = OutcomeList::Heap(vec);
            }
            OutcomeList::Heap(vec) => vec.push(outcome),
        }
    }

    pub(crate) fn as_slice(&self) -> &[Outcome] {
        match self {
            OutcomeList::Inline { len, items } => &items[..*len],
            OutcomeList::Heap(vec) => vec,
        }
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn clear(&mut self) {
        match self {
            OutcomeList::Inline { len, .. } => *len = 0,
            OutcomeList::Heap(vec) => vec.clear(),
        }
    }
}

/// Records one policy's answer. Returns the response to send at once when the limiter failed
/// and the layer fails closed (having given back what the other policies granted).
pub(crate) fn record<X, L>(
    shared: &Shared<X, L>,
    key: &X::Key,
    outcomes: &mut OutcomeList,
    result: Result<Decision, BoxError>,
) -> Option<Response<Bytes>>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    match result {
        Ok(decision) if decision.allowed => outcomes.push(Outcome::Admitted(decision)),
        Ok(decision) => outcomes.push(Outcome::Refused(decision)),
        Err(error) => {
            let name = &*shared.meta.policies[outcomes.len()].name;
            match shared.meta.on_limiter_error {
                FailMode::Open => {
                    tracing::warn!(
                        policy = name,
                        error = %error,
                        "rate limit: the limiter failed; letting the request through"
                    );
                    outcomes.push(Outcome::Failed);
                }
                FailMode::Closed => {
                    tracing::warn!(
                        policy = name,
                        error = %error,
                        "rate limit: the limiter failed; answering 503"
                    );
                    refund_all(shared, key, outcomes);
                    return Some(problem_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The rate limiter is unavailable; retry later.",
                    ));
                }
            }
        }
    }
    None
}

/// What every policy having decided comes to.
pub(crate) enum Conclusion {
    /// Refused: the answer (the permits granted by other policies are given back).
    Answer(Response<Bytes>),
    /// Admitted once the last permit falls due.
    Wait(Duration),
    /// Admitted now.
    Admit,
}

pub(crate) fn conclude<X, L>(
    shared: &Shared<X, L>,
    key: &X::Key,
    outcomes: &mut OutcomeList,
    parts: &Parts,
) -> Conclusion
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    let mut wait = Duration::ZERO;
    let mut refused = false;
    for outcome in outcomes.as_slice() {
        match outcome {
            Outcome::Admitted(d) => wait = wait.max(d.wait),
            Outcome::Refused(_) => refused = true,
            Outcome::Failed => {}
        }
    }
    if refused {
        let limiters = &shared.limiters;
        let response = Refusal {
            meta: &shared.meta,
            request: parts,
            outcomes: outcomes.as_slice(),
            policy_header: shared.meta.policy_header_now(|i| limiters[i].quota()),
        }
        .respond();
        refund_all(shared, key, outcomes);
        Conclusion::Answer(response)
    } else if wait.is_zero() {
        Conclusion::Admit
    } else {
        Conclusion::Wait(wait)
    }
}

/// Gives back every permit in `outcomes`, once: they are cleared.
fn refund_all<X, L>(shared: &Shared<X, L>, key: &X::Key, outcomes: &mut OutcomeList)
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    for (limiter, outcome) in shared.limiters.iter().zip(outcomes.as_slice()) {
        if let Outcome::Admitted(decision) = outcome {
            limiter.refund(key, super::COST, decision);
        }
    }
    outcomes.clear();
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
    /// `waited` says whether every policy has decided and the wait, if any, is under way.
    pub(crate) fn new(
        inner: S,
        parts: Parts,
        body: ReqBody,
        shared: Arc<Shared<X, L>>,
        key: X::Key,
        outcomes: OutcomeList,
        waited: bool,
    ) -> Box<Self> {
        Box::new(Self {
            inner,
            parts,
            body,
            held: Held {
                shared,
                key,
                outcomes,
                waited,
            },
        })
    }

    /// Records the answer of the policy being asked (if any) and says what comes next.
    fn advance(&mut self, result: Option<Result<Decision, BoxError>>) -> Step<L::Future> {
        let held = &mut self.held;
        if let Some(result) = result {
            if let Some(answer) = record(&held.shared, &held.key, &mut held.outcomes, result) {
                return Step::Answer(answer);
            }
        }
        if let Some(limiter) = held.shared.limiters.get(held.outcomes.len()) {
            return Step::Reserve(Box::pin(limiter.reserve(&held.key, super::COST)));
        }
        if held.waited {
            return Step::Call;
        }
        match conclude(&held.shared, &held.key, &mut held.outcomes, &self.parts) {
            Conclusion::Answer(response) => Step::Answer(response),
            Conclusion::Wait(wait) => {
                held.waited = true;
                Step::Wait(wait)
            }
            Conclusion::Admit => Step::Call,
        }
    }

    /// Hands the request over: the permits now belong to it and are no longer given back.
    fn into_call(self) -> (S, Request<ReqBody>, Option<AdmittedHeaders>) {
        let Pending {
            inner,
            parts,
            body,
            mut held,
        } = self;
        let limiters = &held.shared.limiters;
        let headers = held
            .shared
            .meta
            .admitted_headers(held.outcomes.as_slice(), |i| limiters[i].quota());
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
    outcomes: OutcomeList,
    waited: bool,
}

impl<X, L> Drop for Held<X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    fn drop(&mut self) {
        refund_all(&self.shared, &self.key, &mut self.outcomes);
    }
}
