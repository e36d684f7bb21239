//! The layer that puts a [`Pushback`] in front of a service, and the service it makes.

use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::dependency::Pushback;
use super::future::ResponseFuture;
use crate::clock::{Clock, SystemClock};
use crate::head::ResponseHead;
use crate::BoxError;

/// Wraps a service in a [`Pushback`]: calls are held back as the dependency's responses ask.
///
/// Every service this layer makes, and every clone of them, shares the pushback's one state.
/// The inner service must be `Clone` and answer with a [`ResponseHead`](crate::head::ResponseHead)
/// (an `http::Response`, a `reqwest::Response`).
///
/// # Errors
///
/// The services fail with a [`BoxError`](crate::BoxError) holding either
///
/// * [`PushedBack`](super::PushedBack) when the dependency asked for no calls until later than
///   the pushback's `max_wait`: the call reached nothing, and
///   [`outbound::retry_after`](crate::outbound::retry_after) reads when it may go again; or
/// * the inner service's own error, passed through.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use http::Response;
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_bulwark::outbound::{Pushback, PushedBack};
/// use tower_bulwark::{clock::ManualClock, BoxError};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let clock = ManualClock::new();
/// let partner = Pushback::builder("partner").clock(clock.clone()).build();
/// // A dependency that says, on every answer, that nothing is left for 5 seconds.
/// let client = partner.layer().layer(service_fn(|_: ()| async {
///     Ok::<_, BoxError>(Response::builder().header("ratelimit", r#""default";r=0;t=5"#).body(())?)
/// }));
///
/// client.clone().oneshot(()).await?;
/// let err = client.clone().oneshot(()).await.unwrap_err();
/// assert!(err.is::<PushedBack>());
/// clock.advance(Duration::from_secs(5));
/// client.oneshot(()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct PushbackLayer<C = SystemClock> {
    pub(super) pushback: Pushback<C>,
}

impl<S, C> Layer<S> for PushbackLayer<C> {
    type Service = PushbackService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        PushbackService {
            inner,
            pushback: self.pushback.clone(),
        }
    }
}

/// A service behind a [`Pushback`]; made by [`PushbackLayer`].
///
/// A call is checked in `call`: sent at once when the dependency allows it, held (up to
/// `max_wait`) or refused with [`PushedBack`](super::PushedBack) otherwise. The inner service
/// must be `Clone` because a call that waits takes the readied service with it.
#[derive(Clone, Debug)]
pub struct PushbackService<S, C = SystemClock> {
    inner: S,
    pushback: Pushback<C>,
}

impl<S, C, Req> Service<Req> for PushbackService<S, C>
where
    S: Service<Req> + Clone,
    S::Response: ResponseHead,
    S::Error: Into<BoxError>,
    C: Clock,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, C, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture::start(&self.pushback.dependency, &mut self.inner, request)
    }
}
