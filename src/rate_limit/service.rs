use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::future::{Pending, ResponseFuture};
use super::key::{KeyError, KeyExtractor};
use super::layer::{FailMode, Shared};
use super::response::{problem_response, RateLimitBody};
use crate::Limiter;

/// The service made by [`RateLimitLayer`](super::RateLimitLayer): it asks every policy about each
/// request and either calls the inner service or answers for it.
///
/// Its error type is the inner service's: a refusal is a response, not an error.
pub struct RateLimit<S, X, L> {
    inner: S,
    shared: Arc<Shared<X, L>>,
}

impl<S, X, L> RateLimit<S, X, L> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<X, L>>) -> Self {
        Self { inner, shared }
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

impl<S: Clone, X, L> Clone for RateLimit<S, X, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, X, L> fmt::Debug for RateLimit<S, X, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("meta", &self.shared.meta)
            .finish_non_exhaustive()
    }
}

impl<S, X, L, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, X, L>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor,
    L: Limiter<X::Key>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, X, L>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Nothing is taken here: a permit belongs to a request, and an idle connection has none.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let Some(first) = self.shared.limiters.first() else {
            return ResponseFuture::call(self.inner.call(request));
        };
        let (parts, body) = request.into_parts();
        let key = match self.shared.extractor.extract(&parts) {
            Ok(key) => key,
            Err(error) => {
                log_key_error(&error, self.shared.meta.on_key_error);
                return match self.shared.meta.on_key_error {
                    FailMode::Open => {
                        ResponseFuture::call(self.inner.call(Request::from_parts(parts, body)))
                    }
                    FailMode::Closed => ResponseFuture::answer(key_error_response(&error)),
                };
            }
        };
        let reserve = first.reserve(&key, super::COST);
        // The inner service is called later (after the decisions, and perhaps a wait), so the
        // future takes the service that `poll_ready` made ready and leaves a clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let pending = Pending::new(inner, parts, body, Arc::clone(&self.shared), key);
        ResponseFuture::reserve(reserve, pending)
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
