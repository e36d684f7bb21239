//! The layer that puts a [`Pushback`] in front of a service.

use tower_layer::Layer;

use super::dependency::Pushback;
use super::service::PushbackService;
use crate::clock::SystemClock;

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
    pushback: Pushback<C>,
}

impl<C> PushbackLayer<C> {
    /// A layer for `pushback`.
    pub fn new(pushback: Pushback<C>) -> Self {
        Self { pushback }
    }

    /// The pushback this layer applies.
    pub fn pushback(&self) -> &Pushback<C> {
        &self.pushback
    }
}

impl<S, C> Layer<S> for PushbackLayer<C> {
    type Service = PushbackService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        PushbackService::new(inner, self.pushback.clone())
    }
}
