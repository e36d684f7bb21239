//! How long a layer follows a call: until its answer's head ([`UntilHead`]) or until the end of
//! its body ([`UntilBodyEnd`]), the one choice a bulkhead (when its permit comes back) and a
//! pushback (whether it reads the trailers) make alike. Following the body is a
//! [`WatchedBody`]: its frames pass through untouched, each shown on its way to whatever waits
//! for the end, a bulkhead's or an overload protection's permit, a pushback's reader of
//! trailers, a settle from the body ([`Reads`], inbound and outbound). A layer that answers some
//! requests itself (the rate limit's refusals, the overload protection's shed answers) answers
//! with an [`AnswerBody`]: the inner service's body, watched, or its own bytes.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::io::IoSlice;

use bytes::{Buf, Bytes};
use http::header::CONTENT_LENGTH;
use http::HeaderMap;
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
        watch_response(response, Some(follow()), |body| body)
    }
}

pin_project! {
    /// A response body whose frames pass through untouched, each shown on its way to the
    /// [`Watch`] `W` until it has seen what it waits for; `W` is dropped then.
    ///
    /// The body has ended, for `W`, when it says so (`is_end_stream`), with a trailers frame
    /// (the last there can be), or once it has carried the bytes its head announced
    /// (`Content-Length`, or an exact size hint): hyper stops polling a body at either of the
    /// last two and drops it, which would otherwise read as a body left before its end.
    pub struct WatchedBody<B, W> {
        #[pin]
        inner: B,
        watch: Option<W>,
        // The data bytes left before the end the head announced, if it did.
        left: Option<u64>,
    }
}

impl<B: Body, W: Watch> WatchedBody<B, W> {
    /// `inner`, shown to `watch` (if any) as it passes, the body of an answer whose head has
    /// the fields `headers`. A body ended already (empty) is not watched, if `watch` says so
    /// ([`Watch::starts`]).
    pub(crate) fn new(inner: B, watch: Option<W>, headers: &HeaderMap) -> Self {
        let announced =
            (headers.get(CONTENT_LENGTH)).and_then(|length| length.to_str().ok()?.parse().ok());
        let left = announced.or(inner.size_hint().exact());
        let ended = inner.is_end_stream() || left == Some(0);
        let watch = watch.and_then(|mut watch| watch.starts(ended).then_some(watch));
        Self { inner, watch, left }
    }
}

/// `response`, its body shown to `watch` (if any) as it passes, from its head's fields
/// ([`WatchedBody::new`]), and wrapped by `wrap`: the one way a layer follows an answer's body.
pub(crate) fn watch_response<B: Body, W: Watch, T>(
    response: http::Response<B>,
    watch: Option<W>,
    wrap: impl FnOnce(WatchedBody<B, W>) -> T,
) -> http::Response<T> {
    let (head, inner) = response.into_parts();
    let body = wrap(WatchedBody::new(inner, watch, &head.headers));
    http::Response::from_parts(head, body)
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
    fn seen<D: Buf, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, end: bool) -> bool;

    /// The body had no frame ready.
    fn pending(&mut self) {}
}

/// What reads a body's bytes as they pass, and acts when dropped (at the body's end, its
/// failure, or when the body is dropped): a settle from the body, inbound and outbound.
pub trait Reads: Send {
    /// Reads the next bytes of the body.
    fn feed(&mut self, bytes: &[u8]);
}

impl<R: Reads + ?Sized> Reads for Box<R> {
    fn feed(&mut self, bytes: &[u8]) {
        (**self).feed(bytes);
    }
}

/// A reader waits for the end of the body, or its failure, reading each data frame.
impl<R: Reads> Watch for R {
    fn seen<D: Buf, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, end: bool) -> bool {
        let Some(Ok(frame)) = frame else {
            return true;
        };
        if let Some(data) = frame.data_ref() {
            // A frame's bytes, in up to 16 pieces: every body read so carries `Bytes`, one.
            let mut pieces = [IoSlice::new(&[]); 16];
            let count = data.chunks_vectored(&mut pieces);
            for piece in &pieces[..count] {
                self.feed(piece);
            }
        }
        end
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
            let mut end = this.inner.is_end_stream();
            if let Some(Ok(frame)) = &frame {
                end |= frame.is_trailers();
                if let (Some(left), Some(data)) = (this.left.as_mut(), frame.data_ref()) {
                    *left = left.saturating_sub(data.remaining() as u64);
                    end |= *left == 0;
                }
            }
            if watch.seen(frame.as_ref(), end) {
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

pin_project! {
    /// The response body of a layer that answers some requests itself: the inner service's body,
    /// shown to `W` as it passes ([`WatchedBody`]), or the bytes of an answer the layer made.
    pub struct AnswerBody<B, W> {
        #[pin]
        content: Content<B, W>,
    }
}

pin_project! {
    // Whose bytes the body carries.
    #[project = ContentProj]
    enum Content<B, W> {
        Inner { #[pin] body: WatchedBody<B, W> },
        Own { data: Option<Bytes> },
    }
}

impl<B, W> AnswerBody<B, W> {
    /// The inner service's body, as a layer follows it ([`watch_response`]).
    pub(crate) fn inner(body: WatchedBody<B, W>) -> Self {
        Self {
            content: Content::Inner { body },
        }
    }
}

impl<B, W> From<Bytes> for AnswerBody<B, W> {
    /// The body of an answer the layer made itself.
    fn from(bytes: Bytes) -> Self {
        let data = (!bytes.is_empty()).then_some(bytes);
        Self {
            content: Content::Own { data },
        }
    }
}

impl<B: Body<Data = Bytes>, W: Watch> Body for AnswerBody<B, W> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().content.project() {
            ContentProj::Inner { body } => body.poll_frame(cx),
            ContentProj::Own { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.content {
            Content::Inner { body } => body.is_end_stream(),
            Content::Own { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.content {
            Content::Inner { body } => body.size_hint(),
            Content::Own { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B, W> fmt::Debug for AnswerBody<B, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.content {
            Content::Inner { body } => f.debug_tuple("AnswerBody::Inner").field(body).finish(),
            Content::Own { data } => f
                .debug_struct("AnswerBody::Own")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::UntilHead {}
    impl Sealed for super::UntilBodyEnd {}
}
