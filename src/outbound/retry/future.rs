//! One call through the retry layer: its attempts, the backoffs between them, and what each
//! retry takes of the budget.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use tower_service::Service;

use super::builder::Shared;
use super::layer::RetryRequest;
use crate::bulkhead::adaptive::{Classify, Verdict};
use crate::head::ResponseHead;
use crate::outbound::pushback::answer;
use crate::outbound::{chain, never_sent, retry_after, BreakerOpen};
use crate::BoxError;

/// The kind of an attempt, counted under the `kind` label.
#[derive(Clone, Copy)]
pub(crate) enum Attempt {
    First,
    Retry,
}

/// Why a retry was not made, counted under the `reason` label.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Skipped {
    /// The budget held no retry.
    Budget,
    /// The answer or refusal asked for a longer wait than `max_wait`.
    Wait,
}

/// A retry the budget granted and not sent yet: cancelled if it is dropped unsent (the call's
/// future dropped during the backoff, or the service failing to get ready).
struct Withdrawal<'a> {
    shared: &'a Shared,
    pending: bool,
}

impl Withdrawal<'_> {
    /// The retry is on its way: it is withdrawn now, and stays so unless a layer below refuses
    /// it unsent. The epoch it was withdrawn at.
    fn sent(mut self) -> u64 {
        self.pending = false;
        self.shared.budget.send()
    }
}

impl Drop for Withdrawal<'_> {
    fn drop(&mut self) {
        if self.pending {
            self.shared.budget.cancel();
        }
    }
}

/// The wait a retry of `result` needs at least, if `result` is transient: an answer `K` judges
/// [`Verdict::Overloaded`], waiting what the answer asks (`Retry-After`, a spent quota or its
/// spent tokens, a gRPC pushback: read as the pushback reads them in its built-in dialects,
/// uncapped; unless a gRPC pushback says not to retry); an error that names a time to come
/// back ([`retry_after`]: the crate's refusals below, a gRPC status with a delay), waiting
/// that; or another error `K` judges overloaded, waiting nothing. A refusal below that names no
/// time (a full bulkhead), or an open breaker's, is never retried.
fn transient<Res, K>(
    shared: &Shared,
    classifier: &K,
    result: &Result<Res, BoxError>,
) -> Option<Duration>
where
    Res: ResponseHead,
    K: Classify<Res>,
{
    match result {
        // An open breaker fails calls fast on purpose; after its time it is half-open, where
        // all but a few probes are refused again.
        Err(error) if chain(&**error).any(|e| e.is::<BreakerOpen>()) => None,
        // A gRPC status that says not to retry, as an answer's pushback does below, whatever
        // delay its details name.
        #[cfg(feature = "grpc")]
        Err(error) if chain(&**error).any(forbids_retry_status) => None,
        // A gRPC pushback that says not to retry is read only where a retry is in question.
        Ok(response) => (classifier.classify(Ok(response)) == Verdict::Overloaded
            && !forbids_retry(response.headers()))
        .then(|| answer::wait(&shared.name, response.status(), response.headers())),
        Err(error) => retry_after(&**error).or_else(|| {
            let overloaded = classifier.classify(Err(error)) == Verdict::Overloaded;
            (overloaded && !never_sent(&**error)).then_some(Duration::ZERO)
        }),
    }
}

/// Whether the answer says not to retry: a `grpc-retry-pushback-ms` that is not a count of
/// milliseconds (negative, or unreadable), as gRPC's retry design (A6) reads it.
fn forbids_retry(headers: &http::HeaderMap) -> bool {
    crate::head::pushback_millis(headers) == Some(None)
}

/// [`forbids_retry`] of a `tonic::Status` (its metadata are the headers it came with).
#[cfg(feature = "grpc")]
fn forbids_retry_status(error: &(dyn std::error::Error + 'static)) -> bool {
    let status = error.downcast_ref::<tonic::Status>();
    status.is_some_and(|status| forbids_retry(status.metadata().as_ref()))
}

/// The call: `first`, the first attempt, already sent; then, while `spare` holds a copy of the
/// request and the result is transient, a retry on `service` after the backoff, if the wait
/// asked is within `max_wait` and the budget grants it.
///
/// Cancellation: the first attempt's deposit was made when the call was, and stays. A retry is
/// granted by the budget before its backoff (pending until sent) and withdrawn when it is
/// handed to the service, and stays so unless a layer below refuses it unsent; dropped before
/// that (during the backoff, or while the service gets ready), it is cancelled and nothing more
/// is sent. Dropped during an
/// attempt, the attempt is dropped with it and no other is made.
pub(super) async fn serve<S, K, Req>(
    first: S::Future,
    mut service: S,
    mut spare: Option<Req>,
    shared: Arc<Shared>,
    classifier: Arc<K>,
) -> Result<S::Response, BoxError>
where
    Req: RetryRequest,
    S: Service<Req>,
    S::Response: ResponseHead,
    S::Error: Into<BoxError>,
    K: Classify<S::Response>,
{
    let mut result = first.await.map_err(Into::into);
    let mut retries = 0;
    while let Some(request) = spare.take() {
        let Some(asked) = transient(&shared, &*classifier, &result) else {
            break;
        };
        if asked > shared.max_wait {
            skipped(&shared, Skipped::Wait, asked);
            break;
        }
        if !shared.budget.grant() {
            skipped(&shared, Skipped::Budget, asked);
            break;
        }
        let withdrawal = Withdrawal {
            shared: &shared,
            pending: true,
        };
        // The answer retried is let go before the retry waits: its body may hold what the retry
        // needs below (a bulkhead's permit held until the body ends), and no one reads it.
        drop(result);
        retries += 1;
        let backoff = shared.backoff(retries);
        // The backoff after what was asked, not within it: calls held by one answer (a 429 for
        // every caller, a pushback's hold) then come back spread over the backoff, not at once.
        tokio::time::sleep(asked.saturating_add(backoff)).await;
        // A service that fails to get ready ends the call with its error, as tower's retry
        // does; the retry, unsent, goes back.
        poll_fn(|cx| service.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        if retries + 1 < shared.max_attempts {
            spare = request.try_clone();
        }
        let attempt = service.call(request);
        let epoch = withdrawal.sent();
        shared.metrics.attempt(&shared.name, Attempt::Retry);
        result = attempt.await.map_err(Into::into);
        // Refused below before it was sent (a full bulkhead, a hold): it reached nothing.
        if matches!(&result, Err(error) if never_sent(&**error)) {
            shared.budget.give_back(epoch);
        }
    }
    result
}

/// A retry not made for `reason`, `asked` being what the answer asked to wait: an event and a
/// count.
fn skipped(shared: &Shared, reason: Skipped, asked: Duration) {
    shared.metrics.skipped(&shared.name, reason);
    tracing::debug!(
        target: "tower_bulwark::retry",
        dependency = &*shared.name,
        ?reason,
        ?asked,
        max_wait = ?shared.max_wait,
        "retry not made; the last answer stands",
    );
}
