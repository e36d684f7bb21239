//! The layer that puts a [`Bulkhead`] in front of a service.

use std::marker::PhantomData;

use tower_layer::Layer;

use super::handle::Bulkhead;
use super::mode::{OnBodyEnd, OnResponse};
use super::service::BulkheadService;

/// Wraps a service in a [`Bulkhead`]; `M` says when each call gives its permit back:
/// [`OnResponse`] (made by [`new`](BulkheadLayer::new) and [`Bulkhead::layer`]) or
/// [`OnBodyEnd`] (made by [`until_body_end`](BulkheadLayer::until_body_end) and
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
/// use tower_bulwark::bulkhead::{Bulkhead, BulkheadLayer};
/// use tower_bulwark::BoxError;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let reports = Bulkhead::semaphore("reports", 1).build();
/// let client = BulkheadLayer::until_body_end(reports.clone()).layer(service_fn(|_: ()| async {
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
pub struct BulkheadLayer<M = OnResponse> {
    bulkhead: Bulkhead,
    mode: PhantomData<fn() -> M>,
}

impl<M> BulkheadLayer<M> {
    fn with_mode(bulkhead: Bulkhead) -> Self {
        Self {
            bulkhead,
            mode: PhantomData,
        }
    }
}

impl BulkheadLayer {
    /// A layer for `bulkhead` whose calls give their permit back when the response future
    /// completes or is dropped.
    pub fn new(bulkhead: Bulkhead) -> Self {
        Self::with_mode(bulkhead)
    }
}

impl BulkheadLayer<OnBodyEnd> {
    /// A layer for `bulkhead` in front of a service answering `http::Response<B>`, whose calls
    /// give their permit back when the response body has been read to its end, has failed, or
    /// is dropped.
    pub fn until_body_end(bulkhead: Bulkhead) -> Self {
        Self::with_mode(bulkhead)
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
