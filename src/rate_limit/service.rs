use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::request::Parts;
use http::{Request, Response};
use tower_service::Service;

use super::body::{BodyKind, SameBody};
use super::decide::{Conclusion, Ledger, Next};
use super::future::{Deferred, Pending, ResponseFuture};
use super::layer::Shared;
use super::policy::PolicySet;
use super::response::Outcome;

/// The service made by [`RateLimitLayer`](super::RateLimitLayer): it asks every policy about each
/// request and either calls the inner service or answers for it.
///
/// Its error type is the inner service's: a refusal is a response, not an error. `M` is how its
/// responses carry their bodies ([`BodyKind`]).
pub struct RateLimit<S, P, M = SameBody> {
    inner: S,
    shared: Arc<Shared<P>>,
    kind: PhantomData<fn() -> M>,
}

impl<S, P, M> RateLimit<S, P, M> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<P>>) -> Self {
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

impl<S: Clone, P, M> Clone for RateLimit<S, P, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            kind: PhantomData,
        }
    }
}

impl<S: fmt::Debug, P, M> fmt::Debug for RateLimit<S, P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("meta", &self.shared.meta)
            .finish_non_exhaustive()
    }
}

impl<S, P, M, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, P, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    P: PolicySet,
    M: BodyKind<ResBody>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, P, M>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Nothing is taken here: a permit belongs to a request, and an idle connection has none.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let policies = &*shared.policies;
        if policies.is_empty() {
            return ResponseFuture::call(self.inner.call(request), None, None);
        }
        let (parts, body) = request.into_parts();
        if shared.meta.is_exempt(&parts) {
            let request = Request::from_parts(parts, body);
            return ResponseFuture::call(self.inner.call(request), None, None);
        }

        let mut ledger = Ledger::new(policies);
        if policies.len() == 1 && !shared.meta.settles {
            // The common case, one policy deciding at once, takes the shortest way; any other
            // answer goes on the general way below.
            if let Ok(1..) = policies.prepare(0, &parts, &mut ledger.keys) {
                if let Some(result) = policies.reserve_now(0, &ledger.keys) {
                    match result {
                        Ok(decision) if decision.allowed && decision.wait.is_zero() => {
                            let admitted = [Outcome::Admitted(decision)];
                            let headers = shared
                                .meta
                                .admitted_headers(&admitted, |i| policies.quota(i, &ledger.keys));
                            let request = Request::from_parts(parts, body);
                            return ResponseFuture::call(self.inner.call(request), headers, None);
                        }
                        result => {
                            if let Some(answer) = ledger.record(shared, result) {
                                return ResponseFuture::answer(answer);
                            }
                        }
                    }
                }
            }
        }

        // Ask each policy. In-memory limiters answer at once, so the whole decision is usually
        // made here and the inner service called directly; a limiter that needs I/O (Redis)
        // is polled once here and, if it has not answered, left to the response future.
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            match ledger.drive(shared, &parts) {
                Next::Reserve(mut reserve) => match reserve.as_mut().poll(&mut cx) {
                    Poll::Ready(result) => {
                        if let Some(answer) = ledger.record(shared, result) {
                            return ResponseFuture::answer(answer);
                        }
                    }
                    Poll::Pending => {
                        return self.defer(parts, body, ledger, Deferred::Reserve(reserve));
                    }
                },
                Next::Done(Conclusion::Answer(response)) => {
                    return ResponseFuture::answer(response)
                }
                Next::Done(Conclusion::Wait(wait)) => {
                    return self.defer(parts, body, ledger, Deferred::Wait(wait))
                }
                Next::Done(Conclusion::Admit) => {
                    let headers = ledger.admitted_headers(shared);
                    let settle = ledger.into_settle(&self.shared);
                    let request = Request::from_parts(parts, body);
                    return ResponseFuture::call(self.inner.call(request), headers, settle);
                }
            }
        }
    }
}

impl<S, P: PolicySet, M> RateLimit<S, P, M> {
    /// Leaves the rest of the decision to the response future, which will call the inner
    /// service later: it takes the service that `poll_ready` made ready and leaves a clone in
    /// its place (the axum and tower-http convention).
    fn defer<ReqBody>(
        &mut self,
        parts: Parts,
        body: ReqBody,
        ledger: Ledger<P>,
        next: Deferred,
    ) -> ResponseFuture<S, ReqBody, P, M>
    where
        S: Service<Request<ReqBody>> + Clone,
    {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let waited = matches!(next, Deferred::Wait(_));
        let pending = Pending::new(inner, parts, body, Arc::clone(&self.shared), ledger, waited);
        ResponseFuture::deferred(next, pending)
    }
}
