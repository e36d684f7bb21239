//! When a call gives its permit back: the mode of a bulkhead's layer and services, and the body
//! that holds the permit until its end. That body shows its frames, on their way, to whatever
//! waits for its end: a bulkhead's permit ([`BulkheadBody`]), a pushback's reader of trailers
//! ([`PushbackBody`](crate::outbound::pushback::PushbackBody)) and a client quota's settle from
//! the body.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

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

/// Response body of a [`BulkheadService`](super::BulkheadService) in the
/// [`OnBodyEnd`](super::OnBodyEnd) mode.
///
/// It gives the permit back when the inner body reports its end, fails, or is dropped,
/// whichever comes first; the frames themselves pass through untouched.
pub type BulkheadBody<B> = WatchedBody<B, Permit>;

pin_project! {
    /// A response body whose frames pass through untouched, each shown on its way to the
    /// [`Watch`] `W` until it has seen what it waits for; `W` is dropped then.
    pub struct WatchedBody<B, W> {
        #[pin]
        pub(crate) inner: B,
        pub(crate) watch: Option<W>,
    }
}

/// What a [`WatchedBody`] shows its frames to.
pub trait Watch {
    /// Before each poll of the body.
    fn polling(&mut self) {}

    /// Sees one frame polled from the body (`None` at its end; `end` when the body reports its
    /// end after it) and says whether it has seen what it waited for.
    fn seen<D: bytes::Buf, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, end: bool) -> bool;

    /// The body had no frame ready.
    fn pending(&mut self) {}
}

/// A call's permit waits for the end of its body: read to its end, or failed. A body dropped
/// before either gives the permit back as `Cancelled`, and one that panics while it is polled
/// as `Panicked`.
impl Watch for Permit {
    fn polling(&mut self) {
        self.outcome = CallOutcome::Panicked;
    }

    fn seen<D: bytes::Buf, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, end: bool) -> bool {
        self.outcome = match frame {
            None => CallOutcome::Success,
            Some(Err(_)) => CallOutcome::Failure,
            Some(Ok(_)) if end => CallOutcome::Success,
            Some(Ok(_)) => CallOutcome::Cancelled,
        };
        self.outcome != CallOutcome::Cancelled
    }

    fn pending(&mut self) {
        self.outcome = CallOutcome::Cancelled;
    }
}

impl<B: Body, W: Watch> Body for WatchedBody<B, W> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if let Some(watch) = this.watch {
            watch.polling();
        }
        let Poll::Ready(frame) = this.inner.as_mut().poll_frame(cx) else {
            if let Some(watch) = this.watch {
                watch.pending();
            }
            return Poll::Pending;
        };
        if let Some(watch) = this.watch {
            if watch.seen(frame.as_ref(), this.inner.is_end_stream()) {
                *this.watch = None;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B, W> fmt::Debug for WatchedBody<B, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedBody")
            .field("watching", &self.watch.is_some())
            .finish_non_exhaustive()
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::OnResponse {}
    impl Sealed for super::OnBodyEnd {}
}
