//! The response future of a [`ClassifiedService`](super::ClassifiedService) behind an adaptive
//! bulkhead or a circuit breaker: one rule for a classified call, what it reports being each
//! handle's.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::classify::{Classify, Verdict};
use crate::BoxError;

/// What an admitted call reports to its handle: an adaptive bulkhead's sample (then its permit
/// back), a breaker's ticket. Dropped without [`end`](Self::end), it reports as its handle
/// says of a call that never ended. Sealed: its path is the crate's own.
pub trait Report {
    /// Before each poll of the call's future.
    fn polling(&mut self) {}

    /// The inner service's code returned without the call's end: its `call`, or a poll of the
    /// call's future that is not ready.
    fn pending(&mut self) {}

    /// Waits of the call in the crate's layers below ended during a poll (a queue, a hold):
    /// time that is not the dependency's.
    fn waited(&mut self, spans: &[crate::waited::Span]);

    /// The call ended (`ok`: with an answer, not an error), judged `verdict`.
    fn end(self, verdict: Verdict, ok: bool);
}

/// A handle that admits calls one at a time and is told how each ended: an adaptive bulkhead,
/// a breaker. Sealed: its path is the crate's own.
pub trait Admit {
    /// What an admitted call reports to.
    type Report: Report;

    /// Admits a call, or refuses it with the error the call fails with.
    fn admit(&self) -> Result<Self::Report, BoxError>;
}

pin_project! {
    /// Response future of a [`ClassifiedService`](super::ClassifiedService) behind an adaptive
    /// bulkhead or a [`Breaker`](crate::outbound::Breaker): when the inner call ends, the
    /// classifier's verdict on it is reported (a bulkhead takes its sample, then gives the
    /// permit back; a breaker counts it). Dropped before that, an adaptive bulkhead's call gives
    /// its permit back and counts as cancelled, and a breaker's counts for nothing. A refused
    /// call fails with the refusal when polled.
    pub struct ResponseFuture<F, C, R> {
        // Fields drop in order: a cut call's inner future is gone before it reports.
        // Both `None` for a refused call, which holds its error until polled.
        #[pin]
        future: Option<F>,
        report: Option<R>,
        refused: Option<BoxError>,
        classifier: Arc<C>,
    }
}

impl<F, C, R> ResponseFuture<F, C, R> {
    /// An admitted call, its inner future reporting to its report; or a call refused before
    /// the inner service was called.
    pub(crate) fn new(admitted: Result<(F, R), BoxError>, classifier: Arc<C>) -> Self {
        let (future, report, refused) = match admitted {
            Ok((future, report)) => (Some(future), Some(report), None),
            Err(error) => (None, None, Some(error)),
        };
        Self {
            future,
            report,
            refused,
            classifier,
        }
    }
}

impl<F, C, R, T, E> Future for ResponseFuture<F, C, R>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    C: Classify<T>,
    R: Report,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (Some(future), Some(report)) = (this.future.as_pin_mut(), this.report.as_mut()) else {
            let refused = this.refused.take().expect("polled after completion");
            return Poll::Ready(Err(refused));
        };
        report.polling();
        let (poll, waited) = crate::waited::during(|| future.poll(cx));
        if !waited.is_empty() {
            report.waited(&waited);
        }
        let Poll::Ready(result) = poll else {
            report.pending();
            return Poll::Pending;
        };
        let result = result.map_err(Into::into);
        // Taken out before the classifier runs: if it panics, the report is dropped while the
        // thread unwinds, as a call that panicked.
        let report = this.report.take().expect("checked above");
        let verdict = this.classifier.classify(result.as_ref());
        report.end(verdict, result.is_ok());
        Poll::Ready(result)
    }
}

impl<F, C, R> fmt::Debug for ResponseFuture<F, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
