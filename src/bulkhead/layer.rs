//! The layer that puts a [`Bulkhead`] in front of a service.

use std::marker::PhantomData;

use tower_layer::Layer;

use super::handle::Bulkhead;
use super::mode::OnResponse;
use super::service::BulkheadService;

/// Wraps a service in a [`Bulkhead`]; `M` says when each call gives its permit back:
/// [`OnResponse`] (made by [`Bulkhead::layer`]) or [`OnBodyEnd`](super::OnBodyEnd) (made by
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
pub struct BulkheadLayer<M = OnResponse> {
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
