//! The layer that puts a [`Pushback`] in front of a service, and the service it makes.

use std::marker::PhantomData;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::dependency::Pushback;
use super::future::ResponseFuture;
use super::trailers::TrailerReader;
use crate::clock::{Clock, SystemClock};
use crate::head::ResponseHead;
use crate::head::{Until, UntilBodyEnd, UntilHead};
use crate::outbound::quota::QuotaCost;
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
pub struct PushbackLayer<C = SystemClock, T = u32, M = UntilHead> {
    pub(super) pushback: Pushback<C>,
    pub(super) tokens: T,
    pub(super) mode: PhantomData<fn() -> M>,
}

impl<C> PushbackLayer<C> {
    /// The cost of each call in the dependency's tokens, as a client quota's `cost_by` is (a
    /// closure `Fn(&Req) -> u32`, or a [`QuotaCost`]): its request's `max_tokens`, say. A call then
    /// starts only once the dependency's answers say that many tokens are left, or have come
    /// back (at an even pace up to the limit they advertise, or at their reset). Without it,
    /// calls take no tokens, and wait only once the dependency says none are left.
    ///
    /// The tokens a call took count until its answer tells anew: an answer replaces what is
    /// known (its own call's tokens included in what it reports), and the other calls in flight
    /// are taken off what it says is left, as their calls are for a quota of calls.
    pub fn cost_by<T>(self, tokens: T) -> PushbackLayer<C, T> {
        PushbackLayer {
            pushback: self.pushback,
            tokens,
            mode: PhantomData,
        }
    }
}

impl<C, T> PushbackLayer<C, T> {
    /// Reads each answer's trailers too, when its body ends with them, as the head is read
    /// ([`UntilBodyEnd`]): for a gRPC dependency (a tonic `Channel`), which sends the status
    /// of a call that has begun to answer, and its delay, in trailers. The services answer
    /// `http::Response<PushbackBody<B>>`.
    pub fn read_trailers(self) -> PushbackLayer<C, T, UntilBodyEnd> {
        PushbackLayer {
            pushback: self.pushback,
            tokens: self.tokens,
            mode: PhantomData,
        }
    }
}

impl<S, C, T: Clone, M> Layer<S> for PushbackLayer<C, T, M> {
    type Service = PushbackService<S, C, T, M>;

    fn layer(&self, inner: S) -> Self::Service {
        PushbackService {
            inner,
            pushback: self.pushback.clone(),
            tokens: self.tokens.clone(),
            mode: PhantomData,
        }
    }
}

/// A service behind a [`Pushback`]; made by [`PushbackLayer`].
///
/// A call is checked in `call`: sent at once when the dependency allows it, held (up to
/// `max_wait`) or refused with [`PushedBack`](super::PushedBack) otherwise. The inner service
/// must be `Clone` because a call that waits takes the readied service with it.
#[derive(Clone, Debug)]
pub struct PushbackService<S, C = SystemClock, T = u32, M = UntilHead> {
    inner: S,
    pushback: Pushback<C>,
    tokens: T,
    mode: PhantomData<fn() -> M>,
}

impl<S, C, T, M, Req> Service<Req> for PushbackService<S, C, T, M>
where
    S: Service<Req> + Clone,
    S::Response: ResponseHead,
    S::Error: Into<BoxError>,
    C: Clock,
    T: QuotaCost<Req>,
    M: Until<S::Response, TrailerReader>,
{
    type Response = M::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, C, Req, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let tokens = u64::from(self.tokens.cost(&request));
        ResponseFuture::start(&self.pushback.dependency, &mut self.inner, request, tokens)
    }
}
