//! How long a layer follows a call: until its answer's head ([`UntilHead`]) or until the end of
//! its body ([`UntilBodyEnd`]), the one choice a bulkhead (when its permit comes back) and a
//! pushback (whether it reads the trailers) make alike. Following the body is a
//! [`WatchedBody`]: its frames pass through untouched, each shown on its way to whatever waits
//! for the end, a bulkhead's or an overload protection's permit, a pushback's reader of
//! trailers, a client quota's settle from the body.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// How long a layer follows each call, and so what its services answer: [`UntilHead`] (the
/// default) or [`UntilBodyEnd`]. `W` is what follows the call (a bulkhead's permit, a pushback's
/// reader of trailers). Sealed: the two here are the only ones.
pub trait Until<R, W>: sealed::Sealed {
    /// The service's response type.
    type Response;

    /// Hands an answer over to the caller, with what follows the call (made by `follow`) moved
    /// into its body if the layer follows the body; dropped at once if not.
    #[doc(hidden)]
    fn respond(response: R, follow: impl FnOnce() -> W) -> Self::Response;
}

/// The layer is done with a call when its answer arrives (the response future completes, with a
/// response or an error, or is dropped); the body passes through untouched. The default: the
/// mode of [`Bulkhead::layer`](crate::bulkhead::Bulkhead::layer) and
/// [`Pushback::layer`](crate::outbound::pushback::Pushback::layer).
#[derive(Clone, Copy, Debug, Default)]
pub struct UntilHead;

/// For services that answer with an `http::Response<B>`: the layer follows the call until the
/// answer's body has been read to its end, fails, or is dropped, seeing each frame on its way;
/// an error or a dropped response future ends it at once. The mode of
/// [`Bulkhead::body_layer`](crate::bulkhead::Bulkhead::body_layer) (the permit lasts until the
/// body's end) and of
/// [`PushbackLayer::read_trailers`](crate::outbound::pushback::PushbackLayer::read_trailers) (the
/// trailers are read as the head is).
#[derive(Clone, Copy, Debug, Default)]
pub struct UntilBodyEnd;

impl<R, W> Until<R, W> for UntilHead {
    type Response = R;

    fn respond(response: R, _: impl FnOnce() -> W) -> R {
        response
    }
}

impl<B: Body, W: Watch> Until<http::Response<B>, W> for UntilBodyEnd {
    type Response = http::Response<WatchedBody<B, W>>;

    fn respond(response: http::Response<B>, follow: impl FnOnce() -> W) -> Self::Response {
        response.map(|inner| {
            let mut watch = follow();
            let watching = watch.starts(inner.is_end_stream());
            WatchedBody {
                inner,
                watch: watching.then_some(watch),
            }
        })
    }
}

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
    /// The body starts, at its end already if `ended`; says whether to watch it (by default,
    /// unless it has ended: no frame will come).
    fn starts(&mut self, ended: bool) -> bool {
        !ended
    }

    /// Before each poll of the body.
    fn polling(&mut self) {}

    /// Sees one frame polled from the body (`None` at its end; `end` when the body reports its
    /// end after it) and says whether it has seen what it waited for.
    fn seen<D: bytes::Buf, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, end: bool) -> bool;

    /// The body had no frame ready.
    fn pending(&mut self) {}
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
    impl Sealed for super::UntilHead {}
    impl Sealed for super::UntilBodyEnd {}
}
