//! The layer that retries a dependency's calls, its service, and [`RetryRequest`], what it
//! needs of a request.

use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, Method};
use tower_service::Service;

use super::builder::Retry;
use super::future::{serve, Attempt};
use crate::bulkhead::adaptive::{ClassifiedService, Classify};
use crate::head::ResponseHead;
use crate::BoxError;

/// A request the retry layer can judge and send again.
///
/// Implemented for `http::Request<B>` with a `Clone` body (`String`, `Bytes`, `Full<Bytes>`)
/// and, with the `reqwest` feature, for `reqwest::Request` (whose body clones unless it is a
/// stream).
pub trait RetryRequest: Sized {
    /// The request's method.
    fn method(&self) -> &Method;
    /// The request's headers.
    fn headers(&self) -> &HeaderMap;
    /// A copy to send again, or `None` when the request cannot be copied (a streamed body):
    /// then it is sent once.
    fn try_clone(&self) -> Option<Self>;
}

impl<B: Clone> RetryRequest for http::Request<B> {
    fn method(&self) -> &Method {
        self.method()
    }
    fn headers(&self) -> &HeaderMap {
        self.headers()
    }
    fn try_clone(&self) -> Option<Self> {
        Some(self.clone())
    }
}

#[cfg(feature = "reqwest")]
impl RetryRequest for reqwest::Request {
    fn method(&self) -> &Method {
        self.method()
    }
    fn headers(&self) -> &HeaderMap {
        self.headers()
    }
    fn try_clone(&self) -> Option<Self> {
        self.try_clone()
    }
}

impl<S, K, Req> Service<Req> for ClassifiedService<S, Retry, K>
where
    Req: RetryRequest + Send + 'static,
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: ResponseHead + Send + 'static,
    S::Error: Into<BoxError>,
    K: Classify<S::Response>,
{
    type Response = S::Response;
    type Error = BoxError;
    /// The first attempt, then each backoff and retry.
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let shared = Arc::clone(&self.layer.handle.shared);
        // The readied service goes with the call; this handle keeps a clone.
        let clone = self.inner.clone();
        let mut service = mem::replace(&mut self.inner, clone);
        let spare = (shared.max_attempts > 1
            && (shared.safe_to_retry)(request.method(), request.headers()))
        .then(|| request.try_clone())
        .flatten();
        shared.budget.deposit();
        shared.metrics.attempt(&shared.name, Attempt::First);
        let first = service.call(request);
        let classifier = Arc::clone(&self.layer.classifier);
        Box::pin(serve(first, service, spare, shared, classifier))
    }
}
