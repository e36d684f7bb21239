//! The layer, its service and the body of its responses.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use tower_layer::Layer;
use tower_service::Service;

use super::state::{Entry, Permit, Shared};
use super::Overload;
use crate::body_end::{watch_response, AnswerBody, Watch};
use crate::head::RequestHead;

/// Puts an [`Overload`] protection in front of an HTTP service; made by [`Overload::layer`].
///
/// Every service it makes, and every clone of them, shares the protection's one limit.
#[derive(Clone, Debug)]
pub struct OverloadLayer {
    pub(super) overload: Overload,
}

impl<S> Layer<S> for OverloadLayer {
    type Service = OverloadService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OverloadService {
            inner,
            shared: Arc::clone(&self.overload.shared),
        }
    }
}

/// An HTTP service behind an [`Overload`] protection; made by [`OverloadLayer`].
///
/// `poll_ready` only asks the inner service. `call` admits, queues or sheds the request at once;
/// a shed request never reaches the inner service.
#[derive(Clone)]
pub struct OverloadService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for OverloadService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadService")
            .field("inner", &self.inner)
            .field("overload", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// The response future of an [`OverloadService`]: boxed, as it may wait in the queue before it
/// calls the inner service.
type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<OverloadBody<B>>, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for OverloadService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<OverloadBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let head = RequestHead::from(&request);
        let class = (self.shared.priority_by)(&head);
        // Whether the request is a gRPC call, answered as one (always `false` without `grpc`).
        #[cfg(feature = "grpc")]
        let grpc = crate::rate_limit::grpc::is_grpc(&head);
        #[cfg(not(feature = "grpc"))]
        let grpc = false;
        let shared = Arc::clone(&self.shared);
        let shed = move |shared: &Shared| {
            tracing::debug!(overload = %shared.name, priority = class.as_str(), "request shed");
            #[cfg(feature = "metrics")]
            shared.metrics.count(false, class);
            super::answer::shed(shared, grpc)
        };
        match shared.enter(class) {
            Entry::Admitted(permit) => Box::pin(serve(self.inner.call(request), permit)),
            Entry::Shed => Box::pin(std::future::ready(Ok(shed(&shared)))),
            Entry::Queued(waiting) => {
                // The service that was polled ready waits with the request; a clone stays.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(async move {
                    match waiting.admitted().await {
                        Some(permit) => serve(inner.call(request), permit).await,
                        None => Ok(shed(&shared)),
                    }
                })
            }
        }
    }
}

/// Runs an admitted request: its sample when the response head is ready, its permit in the body.
/// An error gives the permit back with no sample; so do a panic and a drop, by unwinding.
async fn serve<F, B, E>(called: F, permit: Permit) -> Result<Response<OverloadBody<B>>, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    let response = called.await?;
    permit.record();
    // A body already at its end ends the request now (`Watch::starts`).
    Ok(watch_response(response, Some(permit), AnswerBody::inner))
}

/// A request's permit waits for the end of its body: read to its end, failed, or dropped.
impl Watch for Permit {
    fn seen<D: bytes::Buf, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, end: bool) -> bool {
        !matches!(frame, Some(Ok(_))) || end
    }
}

/// The response body of an [`OverloadService`]: the inner service's body, holding the
/// request's permit until it ends, fails or is dropped; or the body of a shed answer.
pub type OverloadBody<B> = AnswerBody<B, Permit>;
