use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use tower_service::Service;

use super::body::{BodyKind, SameBody};
use super::decide::{Conclusion, Ledger, Next};
use super::future::{Deferred, Pending, ResponseFuture};
use super::layer::Shared;
use super::policy::PolicySet;
use super::response::Outcome;
use crate::head::RequestHead;

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

    // Kept out of line: inlined into the caller (axum wraps it in a `Map` future), the response
    // future is built in a temporary and copied into place, twice, at about 90 instructions a
    // request (`benches/http_instructions.sh`); called, it is built where the caller wants it.
    #[inline(never)]
    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let RateLimit { inner, shared, .. } = self;
        let policies = &*shared.policies;
        if policies.is_empty() {
            return ResponseFuture::call(inner.call(request));
        }
        // The request is read where it lies: taking it apart into `Parts` and putting it back
        // together would move all of it twice.
        let head = RequestHead::from(&request);
        if shared.meta.is_exempt(&head) {
            return ResponseFuture::call(inner.call(request));
        }

        let mut keys = policies.no_keys();
        // Bound only once the shortcut has not returned: nothing to drop on its way out.
        let first = if policies.len() == 1 && !shared.meta.settles {
            // The common case, one policy deciding at once, takes the shortest way: no permit is
            // held until the limiter admits, and an immediate admission goes straight to the
            // inner service, so this way needs neither the ledger nor its guard. Any other answer
            // joins the general way below where it stands.
            match policies.prepare(0, &head, &mut keys) {
                Ok(0) => Some(First::Skipped),
                // Without headers nothing of an immediate admission is read, and the limiter
                // need not build it.
                Ok(_) if !shared.meta.admitted_headers => match policies.admit_now(0, &keys) {
                    Some(Ok(None)) => {
                        return ResponseFuture::call(inner.call(request));
                    }
                    Some(Ok(Some(decision))) => Some(First::Decided(Ok(decision))),
                    Some(Err(error)) => Some(First::Decided(Err(error))),
                    None => Some(First::Reserve),
                },
                // Every arm moves what it matched: nothing is left to drop afterwards.
                Ok(_) => match policies.reserve_now(0, &keys) {
                    Some(Ok(decision)) => {
                        if decision.admitted_now() {
                            let admitted = [Outcome::Admitted(decision)];
                            let headers = shared
                                .meta
                                .admitted_headers(&admitted, |i| policies.quota(i, &keys));
                            return ResponseFuture::headed(inner.call(request), headers);
                        }
                        Some(First::Decided(Ok(decision)))
                    }
                    Some(Err(error)) => Some(First::Decided(Err(error))),
                    None => Some(First::Reserve),
                },
                Err(error) => Some(First::KeyError(error)),
            }
        } else {
            None
        };

        decide(inner, shared, request, keys, first)
    }
}

/// The general way of [`RateLimit::call`]: several policies, a policy that settles after the
/// response, or any answer of the one-policy shortcut but an immediate admission. Out of line,
/// so that the shortcut keeps a small frame.
#[inline(never)]
fn decide<S, ReqBody, P, M>(
    inner: &mut S,
    shared: &Arc<Shared<P>>,
    request: Request<ReqBody>,
    keys: P::Keys,
    first: Option<First>,
) -> ResponseFuture<S, ReqBody, P, M>
where
    S: Service<Request<ReqBody>> + Clone,
    P: PolicySet,
{
    let policies = &*shared.policies;
    // Whatever happens from here (a cost function, a key extractor or a hook that panics),
    // the guard gives back the permits the request holds until it hands them over.
    let mut guard = Guard {
        shared,
        ledger: Ledger::with_keys(policies, keys),
    };
    let ledger = &mut guard.ledger;
    let mut next = None;
    match first {
        None => {}
        Some(First::Skipped) => ledger.outcomes.push(Outcome::Skipped),
        Some(First::Decided(result)) => {
            if let Some(answer) = ledger.record(shared, result) {
                return ResponseFuture::answer(answer);
            }
        }
        Some(First::Reserve) => {
            next = Some(Next::Reserve(policies.reserve(0, &ledger.keys)));
        }
        Some(First::KeyError(error)) => {
            if let Some(answer) = ledger.key_error(shared, &error) {
                return ResponseFuture::answer(answer);
            }
        }
    }

    // Ask each policy. In-memory limiters answer at once, so the whole decision is usually
    // made here and the inner service called directly; a limiter that needs I/O (Redis)
    // is polled once here and, if it has not answered, left to the response future.
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let step = match next.take() {
            Some(step) => step,
            None => ledger.drive(shared, &RequestHead::from(&request)),
        };
        match step {
            Next::Reserve(mut reserve) => match reserve.as_mut().poll(&mut cx) {
                Poll::Ready(result) => {
                    if let Some(answer) = ledger.record(shared, result) {
                        return ResponseFuture::answer(answer);
                    }
                }
                Poll::Pending => {
                    let ledger = ledger.take();
                    return defer(inner, shared, request, ledger, Deferred::Reserve(reserve));
                }
            },
            Next::Done(Conclusion::Answer(response)) => return ResponseFuture::answer(response),
            Next::Done(Conclusion::Wait(wait)) => {
                let ledger = ledger.take();
                return defer(inner, shared, request, ledger, Deferred::Wait(wait));
            }
            Next::Done(Conclusion::Admit) => {
                let headers = ledger.admitted_headers(shared);
                let settle = ledger.take().into_settle(shared);
                return ResponseFuture::call_then(inner.call(request), headers, settle);
            }
        }
    }
}

/// What the one-policy shortcut of `call` found, when it is not an immediate admission.
enum First {
    Skipped,
    Decided(Result<crate::decision::Decision, crate::BoxError>),
    Reserve,
    KeyError(super::key::KeyError),
}

/// The permits a request holds while `call` decides; dropped (by a return, or a panic in a
/// user's function), it gives back whatever is still in its ledger.
struct Guard<'a, P: PolicySet> {
    shared: &'a Shared<P>,
    ledger: Ledger<P>,
}

impl<P: PolicySet> Drop for Guard<'_, P> {
    #[inline]
    fn drop(&mut self) {
        // Usually the ledger was handed over (or holds nothing): nothing to give back.
        if self.ledger.outcomes.len() != 0 {
            self.ledger.refund_all(self.shared);
        }
    }
}

/// Leaves the rest of the decision to the response future, which will call the inner service
/// later: it takes the service that `poll_ready` made ready and leaves a clone in its place (the
/// axum and tower-http convention).
fn defer<S, ReqBody, P: PolicySet, M>(
    inner: &mut S,
    shared: &Arc<Shared<P>>,
    request: Request<ReqBody>,
    ledger: Ledger<P>,
    next: Deferred,
) -> ResponseFuture<S, ReqBody, P, M>
where
    S: Service<Request<ReqBody>> + Clone,
{
    let clone = inner.clone();
    let inner = std::mem::replace(inner, clone);
    let waited = matches!(next, Deferred::Wait(_));
    let pending = Pending::new(inner, request, Arc::clone(shared), ledger, waited);
    ResponseFuture::deferred(next, pending)
}
