//! What a pushback reads of an answer: its head only ([`UntilHead`], the default), or its head
//! and the trailers that end its body ([`UntilBodyEnd`], for gRPC, whose status comes last).

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use http_body::Frame;

use super::dependency::Dependency;
use crate::body_end::{Watch, WatchedBody};
use crate::clock::Clock;
#[cfg(doc)]
use crate::head::{UntilBodyEnd, UntilHead};

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

/// Response body of a [`PushbackService`](super::PushbackService) in the [`UntilBodyEnd`]
/// mode: the frames pass through untouched, and the trailers are read on their way.
pub type PushbackBody<B> = WatchedBody<B, TrailerReader>;

/// The reader waits for the answer's trailers: an answer has one trailer section, and one more
/// is not read. A body without data may still end in trailers (a trailers-only answer built
/// as a body): it is watched all the same.
impl Watch for TrailerReader {
    fn starts(&mut self, _: bool) -> bool {
        true
    }

    fn seen<D: bytes::Buf, E>(&mut self, frame: Option<&Result<Frame<D>, E>>, _: bool) -> bool {
        let trailers = frame.and_then(|frame| frame.as_ref().ok()?.trailers_ref());
        trailers.map(|trailers| self.trailers(trailers)).is_some()
    }
}
