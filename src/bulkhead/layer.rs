//! The layer that puts a [`Bulkhead`] in front of a service, and the service it makes.

use std::marker::PhantomData;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::handle::Bulkhead;
use super::permits::Permit;
use crate::head::{Until, UntilHead};
use crate::BoxError;

/// Wraps a service in a [`Bulkhead`]; `M` says when each call gives its permit back:
/// [`UntilHead`] (made by [`Bulkhead::layer`]) or [`UntilBodyEnd`](crate::head::UntilBodyEnd) (made by
/// [`Bulkhead::body_layer`]).
///
/// Every service this layer makes, and every clone of them, shares the bulkhead's one limit.
///
/// # Errors
///
/// Its services fail with [`BoxError`](crate::BoxError), holding a
/// [`BulkheadFull`](super::BulkheadFull) when the bulkhead refused the call, or the inner
/// service's error.
///
/// # Examples
///
/// The permit of a call whose body is streamed lasts until the body has been read:
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_bulwark::bulkhead::Bulkhead;
/// use tower_bulwark::BoxError;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let reports = Bulkhead::semaphore("reports", 1).build();
/// let client = reports.body_layer().layer(service_fn(|_: ()| async {
///     Ok::<_, BoxError>(http::Response::new(Full::new(Bytes::from_static(b"report"))))
/// }));
/// let response = client.oneshot(()).await?;
/// assert_eq!(reports.snapshot().available_concurrent_calls, 0);
/// let body = response.into_body().collect().await?.to_bytes();
/// assert_eq!(body, "report");
/// assert_eq!(reports.snapshot().available_concurrent_calls, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct BulkheadLayer<M = UntilHead> {
    bulkhead: Bulkhead,
    mode: PhantomData<fn() -> M>,
}

impl<M> BulkheadLayer<M> {
    /// A layer for `bulkhead` in the mode `M`.
    pub(super) fn with_mode(bulkhead: Bulkhead) -> Self {
        Self {
            bulkhead,
            mode: PhantomData,
        }
    }
}

impl<S, M> Layer<S> for BulkheadLayer<M> {
    type Service = BulkheadService<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        BulkheadService {
            inner,
            bulkhead: self.bulkhead.clone(),
            mode: PhantomData,
        }
    }
}

/// A service behind a [`Bulkhead`]; made by [`BulkheadLayer`](super::BulkheadLayer). `M` says
/// when each call gives its permit back ([`Until`]).
///
/// `poll_ready` only asks the inner service; the permit is taken in `call`. The inner service must
/// be `Clone` because a call that has to wait takes the readied service with it and starts it
/// once a permit comes (wrap a service that is not `Clone` in tower's `Buffer`).
#[derive(Clone, Debug)]
pub struct BulkheadService<S, M = UntilHead> {
    inner: S,
    bulkhead: Bulkhead,
    mode: PhantomData<fn() -> M>,
}

impl<S, M> BulkheadService<S, M> {
    /// The bulkhead in front of the inner service.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }
}

impl<S, M, Req> Service<Req> for BulkheadService<S, M>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    M: Until<S::Response, Permit>,
{
    type Response = M::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture::start(&self.bulkhead.permits, &mut self.inner, request)
    }
}
