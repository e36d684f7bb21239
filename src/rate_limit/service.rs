//! The rate-limiting service: the decision on each request, and the call of the inner service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use tower_service::Service;

use super::body::{BodyKind, SameBody};
use super::decide::{Ledger, Progress};
use super::future::{ResponseFuture, State, WaitingRequest};
use super::set::PolicySet;
use super::settings::Limits;
use crate::head::RequestHead;

/// The service made by [`RateLimitLayer`](super::RateLimitLayer): it asks every policy about each
/// request and either calls the inner service or answers for it.
///
/// Its error type is the inner service's: a refusal is a response, not an error. `M` is how its
/// responses carry their bodies ([`BodyKind`]).
pub struct RateLimitService<S, P, M = SameBody> {
    pub(crate) inner: S,
    pub(crate) limits: Arc<Limits<P>>,
    pub(crate) kind: PhantomData<fn() -> M>,
}

impl<S: Clone, P, M> Clone for RateLimitService<S, P, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limits: Arc::clone(&self.limits),
            kind: PhantomData,
        }
    }
}

impl<S: fmt::Debug, P, M> fmt::Debug for RateLimitService<S, P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("settings", &self.limits.settings)
            .finish_non_exhaustive()
    }
}

impl<S, P, M, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S, P, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    P: PolicySet,
    M: BodyKind<ResBody>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, P, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Nothing is taken here: a permit belongs to a request, and an idle connection has none.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The request is read where it lies: taking it apart into `Parts` and putting it back
        // together would move all of it twice.
        let head = RequestHead::from(&request);
        let (headers, settlement) = if self.limits.settings.is_exempt(&head) {
            (None, None)
        } else {
            // Whatever happens from here (a cost function, a key extractor or a hook that
            // panics), the ledger gives back the permits the request holds until it is admitted.
            let mut ledger = Ledger::new(Arc::clone(&self.limits));
            // In-memory limiters decide at once, so the whole decision is usually made here and
            // the inner service called directly; a limiter that needs I/O (Redis), or a permit
            // that falls due later, leaves the rest to the response future.
            let mut progress = ledger.decide(&head);
            // A limiter that needs I/O is polled once here, so that its work is under way before
            // the response future is first polled.
            let mut cx = Context::from_waker(Waker::noop());
            while let Progress::Reserve(reserve) = &mut progress {
                match reserve.as_mut().poll(&mut cx) {
                    Poll::Ready(result) => progress = ledger.resume(result, &head),
                    Poll::Pending => break,
                }
            }
            match progress {
                Progress::Admit => ledger.admit(),
                Progress::Answer(response) => {
                    let response = Some(*response);
                    return ResponseFuture::new(State::Answering { response });
                }
                progress => {
                    // The future calls the service that `poll_ready` made ready, later, and
                    // leaves a clone in its place (the axum and tower-http convention).
                    let clone = self.inner.clone();
                    let inner = std::mem::replace(&mut self.inner, clone);
                    let waiting = Box::new(WaitingRequest {
                        inner,
                        request,
                        ledger,
                    });
                    return ResponseFuture::new(waiting.into_state(progress));
                }
            }
        };
        ResponseFuture::new(State::Calling {
            future: self.inner.call(request),
            headers,
            settlement,
        })
    }
}
