//! The body type of a rate-limited service's responses.

use bytes::Bytes;
use http::Response;
use http_body::Body;

use super::response::RateLimitBody;

/// How a [`RateLimit`](super::RateLimit) service's responses carry their bodies: the inner
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

    #[doc(hidden)]
    fn inner(body: B) -> Self::Body;

    #[doc(hidden)]
    fn answer(bytes: Bytes) -> Self::Body;

    /// The inner service's response, with its body made [`Self::Body`].
    #[doc(hidden)]
    #[inline]
    fn response(response: Response<B>) -> Response<Self::Body> {
        response.map(Self::inner)
    }
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

    #[inline]
    fn inner(body: B) -> B {
        body
    }

    #[inline]
    fn answer(bytes: Bytes) -> B {
        B::from(bytes)
    }

    #[inline]
    fn response(response: Response<B>) -> Response<B> {
        // As it is: `map` would take the response apart and build it again.
        response
    }
}

impl<B: Body<Data = Bytes>> BodyKind<B> for WrapBody {
    type Body = RateLimitBody<B>;

    #[inline]
    fn inner(body: B) -> RateLimitBody<B> {
        RateLimitBody::inner(body)
    }

    #[inline]
    fn answer(bytes: Bytes) -> RateLimitBody<B> {
        RateLimitBody::full(bytes)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::SameBody {}
    impl Sealed for super::WrapBody {}
}
