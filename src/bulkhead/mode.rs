//! When a call gives its permit back: the mode of a bulkhead's layer and services.

use http_body::Body;

use super::body::BulkheadBody;
use super::events::CallOutcome;
use super::permits::Permit;

/// When a call through a [`BulkheadService`](super::BulkheadService) gives its permit back, and
/// so what the service answers: [`OnResponse`] (the default) or [`OnBodyEnd`].
pub trait Release<R>: sealed::Sealed {
    /// The service's response type.
    type Response;

    /// Hands a successful call's response and its permit over to the caller.
    #[doc(hidden)]
    fn respond(response: R, permit: Permit) -> Self::Response;
}

/// The permit is given back when the response future completes, with a response or an error,
/// or is dropped: the mode of [`Bulkhead::layer`](super::Bulkhead::layer).
#[derive(Clone, Copy, Debug, Default)]
pub struct OnResponse;

/// For services that answer with an `http::Response<B>`: the permit moves into the response's
/// [`BulkheadBody`] and is given back when the body has been read to its end, fails, or is
/// dropped; the mode of [`Bulkhead::body_layer`](super::Bulkhead::body_layer). An error or a
/// dropped response future gives it back at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct OnBodyEnd;

impl<R> Release<R> for OnResponse {
    type Response = R;

    fn respond(response: R, mut permit: Permit) -> R {
        permit.outcome = CallOutcome::Success;
        drop(permit);
        response
    }
}

impl<B: Body> Release<http::Response<B>> for OnBodyEnd {
    type Response = http::Response<BulkheadBody<B>>;

    fn respond(response: http::Response<B>, mut permit: Permit) -> Self::Response {
        response.map(|inner| {
            // A body already at its end ends the call now.
            let ended = inner.is_end_stream();
            permit.outcome = if ended {
                CallOutcome::Success
            } else {
                CallOutcome::Cancelled
            };
            let watch = (!ended).then_some(permit);
            BulkheadBody { inner, watch }
        })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::OnResponse {}
    impl Sealed for super::OnBodyEnd {}
}
