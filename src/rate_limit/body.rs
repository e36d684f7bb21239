//! The body of a rate-limited service's responses: the inner service's body type, or a
//! [`RateLimitBody`] around it.

use bytes::Bytes;
use http::Response;
use http_body::Body;

use crate::body_end::{watch_response, AnswerBody, Reads};

/// How a [`RateLimitService`](super::RateLimitService) service's responses carry their bodies: the inner
/// service's own body type ([`SameBody`], the default) or a [`RateLimitBody`] around it
/// ([`WrapBody`], from [`RateLimitLayer::wrap_body`](super::RateLimitLayer::wrap_body)).
///
/// The layer answers some requests itself (the 429, a key error, a failed limiter), so its
/// response body must be able to hold either the inner service's body or bytes of its own.
/// Sealed: the two kinds here are the only ones.
#[diagnostic::on_unimplemented(
    message = "the inner service's response body `{B}` cannot carry the rate limiter's own answers",
    label = "responses of this layer keep the inner body type `{B}`, which must be made from `Bytes`",
    note = "call `.wrap_body()` on the `RateLimitLayer` to answer with a `RateLimitBody` around any body type"
)]
pub trait BodyKind<B>: sealed::Sealed {
    /// The body type of the service's responses.
    type Body;

    /// The inner service's response, with its body made [`Self::Body`], carrying what is left
    /// to settle when the body ends.
    #[doc(hidden)]
    fn response(response: Response<B>, settling: Option<Box<dyn Reads>>) -> Response<Self::Body>;

    /// The body of an answer the layer made itself.
    #[doc(hidden)]
    fn answer(bytes: Bytes) -> Self::Body;
}

/// Responses keep the inner service's body type `B`, and the layer's own answers are made with
/// `B::from(Bytes)`. The default.
///
/// axum's `Body`, `http_body_util::Full<Bytes>` and most bodies a handler returns can be made
/// from `Bytes`. Under axum this is also the cheaper kind: a route's responses must have axum's
/// `Body`, and axum allocates a box around any other body type on every response.
#[derive(Clone, Copy, Debug, Default)]
pub struct SameBody;

/// Responses carry a [`RateLimitBody`]: the inner service's body, or the bytes of an answer the
/// layer made itself. For inner services whose body cannot be made from `Bytes` (tower-http's
/// body wrappers, boxed bodies).
#[derive(Clone, Copy, Debug, Default)]
pub struct WrapBody;

// Not looked through in error messages, so that a body type that cannot be made from `Bytes`
// gets `BodyKind`'s message (which names the fix) rather than a bare `From<Bytes>`.
#[diagnostic::do_not_recommend]
impl<B: From<Bytes>> BodyKind<B> for SameBody {
    type Body = B;

    fn response(response: Response<B>, settling: Option<Box<dyn Reads>>) -> Response<B> {
        // The layer refuses to serve body settles without `wrap_body`, so there is none here;
        // were there one, dropping it keeps the estimates.
        drop(settling);
        // As it is: `map` would take the response apart and build it again.
        response
    }

    fn answer(bytes: Bytes) -> B {
        B::from(bytes)
    }
}

impl<B: Body<Data = Bytes>> BodyKind<B> for WrapBody {
    type Body = RateLimitBody<B>;

    fn response(
        response: Response<B>,
        settling: Option<Box<dyn Reads>>,
    ) -> Response<RateLimitBody<B>> {
        watch_response(response, settling, AnswerBody::inner)
    }

    fn answer(bytes: Bytes) -> RateLimitBody<B> {
        AnswerBody::from(bytes)
    }
}

/// The response body of a rate-limited service that wraps bodies ([`WrapBody`]): the inner
/// service's body (read as it passes when the request settles its cost from the body), or the
/// body of an answer the layer made itself.
pub type RateLimitBody<B> = AnswerBody<B, Box<dyn Reads>>;

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::SameBody {}
    impl Sealed for super::WrapBody {}
}
