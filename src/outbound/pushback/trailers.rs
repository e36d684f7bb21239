//! What a pushback reads of an answer: its head only ([`ReadHead`], the default), or its head and
//! the trailers that end its body ([`ReadTrailers`], for gRPC, whose status comes last).

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use http_body::{Body, Frame};

use super::dependency::Dependency;
use crate::bulkhead::mode::{Watch, WatchedBody};
use crate::clock::Clock;

/// What a [`PushbackService`](super::PushbackService) reads of each answer, and so what it
/// answers: [`ReadHead`] (the default) or [`ReadTrailers`].
pub trait ReadAnswer<R>: sealed::Sealed {
    /// The service's response type.
    type Response;

    /// Hands an answer over to the caller, reading its trailers on the way (with the reader
    /// `trailers` makes) if this mode does.
    #[doc(hidden)]
    fn respond(response: R, trailers: impl FnOnce() -> TrailerReader) -> Self::Response;
}

/// The answer's status and header fields are read when it arrives; its body passes through
/// untouched. The mode of [`Pushback::layer`](super::Pushback::layer).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadHead;

/// For services that answer with an `http::Response<B>`: the head is read when the answer
/// arrives, and the trailers when its body ends with them, as the head is; the mode of
/// [`PushbackLayer::read_trailers`](super::PushbackLayer::read_trailers).
///
/// gRPC sends the status of a call that has begun to answer in trailers: a dependency that
/// refuses a streaming call midway, or a server that always writes its headers first, says
/// `RESOURCE_EXHAUSTED` and its delay only there. Trailers are read like the head of an answer
/// obtained elsewhere ([`Pushback::observe`](super::Pushback::observe)): by then the call no
/// longer counts in flight.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadTrailers;

impl<R> ReadAnswer<R> for ReadHead {
    type Response = R;

    fn respond(response: R, _: impl FnOnce() -> TrailerReader) -> R {
        response
    }
}

impl<B: Body> ReadAnswer<http::Response<B>> for ReadTrailers {
    type Response = http::Response<PushbackBody<B>>;

    fn respond(
        response: http::Response<B>,
        trailers: impl FnOnce() -> TrailerReader,
    ) -> Self::Response {
        response.map(|inner| PushbackBody {
            inner,
            watch: Some(trailers()),
        })
    }
}

/// Records the trailers of one answer with its dependency.
pub(crate) type TrailerReader = Arc<dyn ObserveTrailers>;

/// A dependency, whatever its clock.
pub trait ObserveTrailers: Send + Sync {
    /// Records what `trailers` say.
    fn trailers(&self, trailers: &HeaderMap);
}

impl<C: Clock> ObserveTrailers for Dependency<C> {
    fn trailers(&self, trailers: &HeaderMap) {
        self.observe(StatusCode::OK, trailers, None);
    }
}

/// Response body of a [`PushbackService`](super::PushbackService) in the [`ReadTrailers`]
/// mode: the frames pass through untouched, and the trailers are read on their way.
pub type PushbackBody<B> = WatchedBody<B, TrailerReader>;

/// The reader waits for the answer's trailers: an answer has one trailer section, and one more
/// is not read.
impl Watch for TrailerReader {
    fn seen<D: bytes::Buf, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, _: bool) -> bool {
        let trailers = frame.and_then(|frame| frame.as_ref().ok()?.trailers_ref());
        trailers.map(|trailers| self.trailers(trailers)).is_some()
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ReadHead {}
    impl Sealed for super::ReadTrailers {}
}
