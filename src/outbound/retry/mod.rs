//! Retries (feature `adaptive`): a call sent again when its answer was transient, as late as
//! the dependency asked, and only as often as a budget shared by every clone allows.
//!
//! A retry loop without a budget multiplies a dependency's load by its attempts exactly when
//! the dependency can least take it. A [`Retry`] retries a call only when all of these hold:
//!
//! * **it is safe to send twice**: by default its method is idempotent (GET, HEAD, OPTIONS,
//!   TRACE, PUT, DELETE) or it carries an `Idempotency-Key` header; another rule is a
//!   [`safe_to_retry`](RetryBuilder::safe_to_retry) predicate on the method and headers (a
//!   predicate rather than a request extension, since `reqwest::Request` keeps its extensions
//!   to itself). The request must also be copyable ([`RetryRequest`]): an `http::Request<B>`
//!   whose body is `Clone`, or (feature `reqwest`) a `reqwest::Request` whose body is not a
//!   stream. Any other request is sent once.
//! * **the answer is transient**: the classifier ([`HttpOverload`](crate::bulkhead::adaptive::HttpOverload)
//!   by default, the adaptive bulkhead's: 429, 503, 504, timeouts, connection failures, a
//!   trailers-only gRPC `UNAVAILABLE`, `RESOURCE_EXHAUSTED` or `DEADLINE_EXCEEDED`; any
//!   [`Classify`](crate::bulkhead::adaptive::Classify) of yours through
//!   [`layer_with`](Retry::layer_with)) judges it
//!   [`Overloaded`](crate::bulkhead::adaptive::Verdict::Overloaded), or it is an error that names
//!   when to come back ([`retry_after`](super::retry_after): a [`PushedBack`](super::PushedBack)
//!   or [`QuotaExhausted`](super::QuotaExhausted) of a layer below, a gRPC status with a delay).
//!   A refusal below that names no time, such as a [`BulkheadFull`](crate::BulkheadFull), is
//!   never retried: trying again at once would only meet it again. Nor is an open circuit
//!   breaker's [`BreakerOpen`](super::BreakerOpen), though it names one: the breaker fails
//!   calls fast on purpose, and after its time it is half-open, where all but a few probes are
//!   refused again.
//! * **the wait asked is at most [`max_wait`](RetryBuilder::max_wait)**: a retry never leaves
//!   before the answer's `Retry-After` (delta-seconds, decimal seconds or an HTTP-date),
//!   `retry-after-ms`, gRPC `RetryInfo` or `grpc-retry-pushback-ms` (feature `grpc`), the
//!   window of a quota it says is spent or the reset of its spent tokens (OpenAI's and
//!   Anthropic's token families), all read as the [pushback](super::pushback) reads them in its
//!   built-in dialects (a dialect given to a pushback is its own), a 429 naming no time asking
//!   one second; or an error's `retry_after`. When that is
//!   longer than `max_wait`, no retry is made and the call ends with the answer or error as it
//!   came; so it does when a `grpc-retry-pushback-ms` is negative or unreadable, which in
//!   gRPC's retry design (A6) says not to retry.
//!   Malformed values are ignored as the pushback ignores them; a huge one is longer than any
//!   `max_wait`; none panics.
//! * **the budget holds a retry**: each call deposits `ratio` of a retry (default 0.2, counted
//!   to the millionth in integers, so that five calls make exactly one retry), each retry
//!   withdraws one, `min_per_second` retries a second (default 3) come with no deposit. A
//!   deposit counts for `window` (default 10 s) less at most a tenth of it (the budget counts
//!   in tenths of the window), so an idle spell banks nothing; a retry counts from when it is
//!   granted, through its wait (which may be longer than the window), until at least `window`
//!   after it is sent, so that retries held by one long `Retry-After` cannot each be granted
//!   anew by the windows that pass while they wait, and leave together. The reserve
//!   with no deposit is the window's worth, there at once: after a quiet spell, failing calls
//!   may take all of it (30 retries with the defaults) in a moment. Over any stretch, retries
//!   are at most `ratio` times the calls made in it or before it (up to a window and the
//!   longest a retry waits: `max_wait` and the backoff's `cap`, as a retry spends the deposits
//!   there when it is granted, and is sent when its wait ends) plus that reserve once for each
//!   window the stretch spans: at 100 calls a second and the defaults, 23 retries a second, so
//!   attempts stay under 1.25 per call however many calls fail.
//!
//! A retry waits what was asked, then a backoff: full jitter, a random span up to
//! `base × 2^(n − 1)` before retry `n`, at most `cap` (defaults 50 ms and 1 s), so that the
//! calls one answer or hold sent back do not all return at the same instant; and a call
//! makes at most [`max_attempts`](RetryBuilder::max_attempts) attempts (default 3). A retry
//! refused by the budget or not made for a long wait ends the call with the last answer or
//! error unchanged, with an event (`debug`, target `tower_bulwark::retry`) and a count
//! (`bulwark_retry_skipped_total`, feature `metrics`). A service that fails to get ready for a
//! retry ends the call with its error, as tower's retry does.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_bulwark::clock::TokioClock;
//! use tower_bulwark::outbound::retry::Retry;
//! use tower_bulwark::BoxError;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! let calls = Arc::new(AtomicUsize::new(0));
//! let seen = calls.clone();
//! // A dependency that answers its first call with `429` and `Retry-After: 2`.
//! let dependency = service_fn(move |_: http::Request<String>| {
//!     let n = seen.fetch_add(1, Ordering::SeqCst);
//!     async move {
//!         let status = if n == 0 { 429 } else { 200 };
//!         let response = http::Response::builder().status(status).header("retry-after", "2");
//!         Ok::<_, BoxError>(response.body(())?)
//!     }
//! });
//! let partner = Retry::builder("partner").clock(TokioClock::new()).build()?;
//! let client = partner.layer().layer(dependency);
//!
//! let start = tokio::time::Instant::now();
//! let response = client.oneshot(http::Request::get("/").body(String::new())?).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! // Not a moment before the two seconds asked, then a backoff of at most 50 ms.
//! assert!(start.elapsed() >= Duration::from_secs(2));
//! assert!(start.elapsed() <= Duration::from_millis(2050));
//! # Ok(())
//! # }
//! ```
//!
//! # Cancellation
//!
//! A call deposits into the budget when it is made, once. A retry is withdrawn when it is
//! decided, before its backoff, and stays withdrawn once it is handed to the service, unless a
//! layer of the crate below refuses it before sending it (a full bulkhead, a pushback's hold):
//! then it reached nothing and is given back. A response future dropped during the backoff (or
//! while the service gets ready) gives that retry back and sends nothing more; dropped during
//! an attempt, it drops the attempt and makes no other.
//!
//! # Where it goes
//!
//! Outermost in the [outbound stack](super#the-order-of-layers): each attempt passes every
//! layer below again, so a retry waits in no queue of theirs and is refused as any call is.

mod budget;
mod builder;
mod future;
mod layer;

pub use self::builder::{idempotent, Retry, RetryBuilder};
// The configuration file spells the defaults out; a test of it checks them against these.
#[cfg(feature = "config")]
#[cfg(test)]
pub(crate) use self::builder::{
    DEFAULT_BASE, DEFAULT_CAP, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_WAIT, DEFAULT_MIN_PER_SECOND,
    DEFAULT_RATIO, DEFAULT_WINDOW, LONGEST,
};
pub(crate) use self::future::{Attempt, Skipped};
pub use self::layer::RetryRequest;
