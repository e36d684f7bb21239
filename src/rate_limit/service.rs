use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use tower_service::Service;

use super::body::{BodyKind, SameBody};
use super::future::{conclude, record, Conclusion, Deferred, OutcomeList, Pending, ResponseFuture};
use super::key::{KeyError, KeyExtractor};
use super::layer::{FailMode, Shared};
use super::response::{problem_response, Outcome};
use crate::Limiter;

/// The service made by [`RateLimitLayer`](super::RateLimitLayer): it asks every policy about each
/// request and either calls the inner service or answers for it.
///
/// Its error type is the inner service's: a refusal is a response, not an error. `M` is how its
/// responses carry their bodies ([`BodyKind`]).
pub struct RateLimit<S, X, L, M = SameBody> {
    inner: S,
    shared: Arc<Shared<X, L>>,
    kind: PhantomData<fn() -> M>,
}

impl<S, X, L, M> RateLimit<S, X, L, M> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<X, L>>) -> Self {
        Self {
            inner,
            shared,
            kind: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, X, L, M> Clone for RateLimit<S, X, L, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            kind: PhantomData,
        }
    }
}

impl<S: fmt::Debug, X, L, M> fmt::Debug for RateLimit<S, X, L, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("meta", &self.shared.meta)
            .finish_non_exhaustive()
    }
}

impl<S, X, L, M, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, X, L, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor,
    L: Limiter<X::Key>,
    M: BodyKind<ResBody>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, X, L, M>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Nothing is taken here: a permit belongs to a request, and an idle connection has none.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        if shared.limiters.is_empty() {
            return ResponseFuture::call(self.inner.call(request), None);
        }
        let (parts, body) = request.into_parts();
        if shared.meta.is_exempt(&parts) {
            return ResponseFuture::call(self.inner.call(Request::from_parts(parts, body)), None);
        }
        let key = match shared.extractor.extract(&parts) {
            Ok(key) => key,
            Err(error) => {
                log_key_error(&error, shared.meta.on_key_error);
                return match shared.meta.on_key_error {
                    FailMode::Open => ResponseFuture::call(
                        self.inner.call(Request::from_parts(parts, body)),
                        None,
                    ),
                    FailMode::Closed => ResponseFuture::answer(key_error_response(&error)),
                };
            }
        };

        // Ask each policy. In-memory limiters answer at once, so the whole decision is usually
        // made here and the inner service called directly; a limiter that needs I/O (Redis)
        // leaves the rest to the response future.
        let mut outcomes = OutcomeList::new(shared.limiters.len());
        let mut asked = 0;
        if let [limiter] = &*shared.limiters {
            // The common case, one policy deciding at once, takes the shortest way.
            if let Some(result) = limiter.reserve_now(&key, super::COST) {
                match result {
                    Ok(decision) if decision.allowed && decision.wait.is_zero() => {
                        return self.admit(parts, body, &[Outcome::Admitted(decision)]);
                    }
                    result => {
                        if let Some(answer) = record(shared, &key, &mut outcomes, result) {
                            return ResponseFuture::answer(answer);
                        }
                        asked = 1;
                    }
                }
            }
        }
        let mut cx = Context::from_waker(Waker::noop());
        for limiter in shared.limiters[asked..].iter() {
            if let Some(result) = limiter.reserve_now(&key, super::COST) {
                if let Some(answer) = record(shared, &key, &mut outcomes, result) {
                    return ResponseFuture::answer(answer);
                }
                continue;
            }
            let mut reserve = Box::pin(limiter.reserve(&key, super::COST));
            match reserve.as_mut().poll(&mut cx) {
                Poll::Ready(result) => {
                    if let Some(answer) = record(shared, &key, &mut outcomes, result) {
                        return ResponseFuture::answer(answer);
                    }
                }
                Poll::Pending => {
                    return self.defer(parts, body, key, outcomes, Deferred::Reserve(reserve));
                }
            }
        }
        match conclude(shared, &key, &mut outcomes, &parts) {
            Conclusion::Answer(response) => ResponseFuture::answer(response),
            Conclusion::Wait(wait) => self.defer(parts, body, key, outcomes, Deferred::Wait(wait)),
            Conclusion::Admit => self.admit(parts, body, outcomes.as_slice()),
        }
    }
}

impl<S, X, L, M> RateLimit<S, X, L, M>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    /// Calls the inner service with the admitted request, the `RateLimit` headers of
    /// `outcomes` to be added to its response.
    fn admit<ReqBody>(
        &mut self,
        parts: Parts,
        body: ReqBody,
        outcomes: &[Outcome],
    ) -> ResponseFuture<S, ReqBody, X, L, M>
    where
        S: Service<Request<ReqBody>>,
    {
        let limiters = &self.shared.limiters;
        let headers = self
            .shared
            .meta
            .admitted_headers(outcomes, |i| limiters[i].quota());
        ResponseFuture::call(self.inner.call(Request::from_parts(parts, body)), headers)
    }

    /// Leaves the rest of the decision to the response future, which will call the inner
    /// service later: it takes the service that `poll_ready` made ready and leaves a clone in
    /// its place (the axum and tower-http convention).
    fn defer<ReqBody>(
        &mut self,
        parts: Parts,
        body: ReqBody,
        key: X::Key,
        outcomes: OutcomeList,
        next: Deferred<L::Future>,
    ) -> ResponseFuture<S, ReqBody, X, L, M>
    where
        S: Service<Request<ReqBody>> + Clone,
    {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let waited = matches!(next, Deferred::Wait(_));
        let pending = Pending::new(
            inner,
            parts,
            body,
            Arc::clone(&self.shared),
            key,
            outcomes,
            waited,
        );
        ResponseFuture::deferred(next, pending)
    }
}

fn log_key_error(error: &KeyError, mode: FailMode) {
    let action = match mode {
        FailMode::Open => "letting the request through unlimited",
        FailMode::Closed => "answering with an error",
    };
    if error.status().is_server_error() {
        tracing::error!(
            reason = error.reason(),
            "rate limit: no key for the request; {action}"
        );
    } else {
        tracing::debug!(
            reason = error.reason(),
            "rate limit: no key for the request; {action}"
        );
    }
}

fn key_error_response(error: &KeyError) -> Response<Bytes> {
    if error.status().is_server_error() {
        // The reason names server internals; it is in the log, not in the answer.
        problem_response(
            error.status(),
            "The server could not identify the client for rate limiting.",
        )
    } else {
        problem_response(error.status(), error.reason())
    }
}
