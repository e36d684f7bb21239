//! A response body that shows its frames, on their way, to what waits for its end: a
//! bulkhead's permit ([`BulkheadBody`](super::BulkheadBody)) and a pushback's reader of
//! trailers ([`PushbackBody`](crate::outbound::pushback::PushbackBody)).

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::events::CallOutcome;
use super::permits::Permit;

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
    /// Sees one frame polled from the body (`None` at its end; `end` when the body reports its
    /// end after it) and says whether it has seen what it waited for.
    fn seen<D, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, end: bool) -> bool;
}

/// A call's permit waits for the end of its body: read to its end, or failed. A body dropped
/// before either gives the permit back as `Cancelled`.
impl Watch for Permit {
    fn seen<D, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, end: bool) -> bool {
        self.outcome = match frame {
            None => CallOutcome::Success,
            Some(Err(_)) => CallOutcome::Failure,
            Some(Ok(_)) if end => CallOutcome::Success,
            Some(Ok(_)) => return false,
        };
        true
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
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
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
