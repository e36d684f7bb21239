//! A response body that holds its call's permit until the body ends.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::events::CallOutcome;
use super::permits::Permit;

pin_project! {
    /// Response body of a [`BulkheadService`](super::BulkheadService) in the
    /// [`OnBodyEnd`](super::OnBodyEnd) mode.
    ///
    /// It gives the permit back when the inner body reports its end, fails, or is dropped,
    /// whichever comes first; the frames themselves pass through untouched.
    pub struct BulkheadBody<B> {
        #[pin]
        inner: B,
        permit: Option<Permit>,
    }
}

impl<B: Body> BulkheadBody<B> {
    pub(crate) fn new(inner: B, mut permit: Permit) -> Self {
        let permit = if inner.is_end_stream() {
            permit.outcome = CallOutcome::Success;
            drop(permit);
            None
        } else {
            permit.outcome = CallOutcome::Cancelled;
            Some(permit)
        };
        Self { inner, permit }
    }
}

impl<B: Body> Body for BulkheadBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let ended = match &frame {
            None => Some(CallOutcome::Success),
            Some(Err(_)) => Some(CallOutcome::Failure),
            Some(Ok(_)) if this.inner.is_end_stream() => Some(CallOutcome::Success),
            Some(Ok(_)) => None,
        };
        if let Some(outcome) = ended {
            if let Some(mut permit) = this.permit.take() {
                permit.outcome = outcome;
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

impl<B> fmt::Debug for BulkheadBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadBody")
            .field("holds_permit", &self.permit.is_some())
            .finish_non_exhaustive()
    }
}
