//! Bulkheads: a separate limit of concurrent calls for each downstream dependency.
//!
//! A slow dependency ties up every caller that waits on it. Without a limit, a payment gateway
//! that starts answering in two seconds instead of twenty milliseconds soon holds all of a
//! service's tasks and connections, and the inventory calls that would have answered at once
//! queue behind it. A bulkhead gives each dependency its own budget of calls in flight: when the
//! payment budget is spent, further payment calls fail at once with [`BulkheadFull`], and the
//! inventory budget is untouched.
//!
//! # Building one
//!
//! Make one [`Bulkhead`] per dependency, with a name, and wrap that dependency's client in its
//! layer. Every clone of the layer, the service and the [`Bulkhead`] handle shares one limit.
//!
//! ```
//! use tower::{service_fn, Service, ServiceExt};
//! use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull};
//! use tower_bulwark::BoxError;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let payment = Bulkhead::semaphore("payment", 2).build();
//! let mut client = tower::ServiceBuilder::new()
//!     .layer(payment.layer())
//!     .service(service_fn(|amount: u32| async move { Ok::<_, BoxError>(amount) }));
//!
//! // The permit is taken in `call`: two calls in flight use up the bulkhead...
//! let first = client.ready().await?.call(10);
//! let second = client.ready().await?.call(20);
//! // ...so a third is refused at once, without reaching the inner service.
//! let err = client.ready().await?.call(30).await.unwrap_err();
//! assert!(err.is::<BulkheadFull>());
//! assert_eq!(err.to_string(), "bulkhead `payment` is full");
//!
//! assert_eq!(first.await?, 10);
//! assert_eq!(second.await?, 20);
//! assert_eq!(payment.snapshot().available_concurrent_calls, 2);
//! # Ok(())
//! # }
//! ```
//!
//! # Two kinds
//!
//! * [`Bulkhead::semaphore`] — at most `max_concurrent_calls` at once. By default a call that
//!   finds no free permit is refused at once. With [`max_wait`](BulkheadBuilder::max_wait) it
//!   may wait that long; waiters get permits in arrival order, and one still waiting at the
//!   deadline is refused.
//! * [`Bulkhead::queue`] — the async counterpart of Resilience4j's `ThreadPoolBulkhead`: at most
//!   `max_concurrent_calls` at once plus at most `queue_capacity` waiting. A call beyond both is
//!   refused at once; queued calls start in arrival order, and a queued call that is dropped
//!   (its caller gave up, a timeout fired) leaves the queue at once. A waiting call has not yet
//!   reached the inner service: it is started only when its permit comes.
//!
//! Arrival order holds across changes of the limit too. A waiter handed a permit leaves the
//! queue at once, before its task runs, so a new call finds its place free. When
//! [`set_max_concurrent_calls`](Bulkhead::set_max_concurrent_calls) lowers the limit, it takes
//! back the free permits first, then those handed to waiters that have not started (who wait
//! again in their place, ahead of later arrivals), and the rest as the calls in flight end.
//! The limit itself is never exceeded.
//!
//! # When a call ends
//!
//! A permit is taken when the service is *called*, never in `poll_ready`, so a client that is
//! ready but idle (a keep-alive connection, a readied service in a pool) holds nothing. It is
//! given back exactly once, when the call ends:
//!
//! * in the [`UntilHead`](crate::head::UntilHead) mode ([`Bulkhead::layer`]), when the response future completes —
//!   with a response or with an error — or is dropped before that (a timeout above it, a
//!   `select!` that lost, a cancelled task), or when the inner service panics while being
//!   called or polled;
//! * in the [`UntilBodyEnd`](crate::head::UntilBodyEnd) mode ([`Bulkhead::body_layer`]), for services that answer with an
//!   `http::Response<B>`, when the response body has been read to its end (its last frame,
//!   its trailers, or the bytes its `Content-Length` announced), fails, or is dropped. Use it
//!   when the expensive part of a call is the body.
//!
//! **With reqwest.** `reqwest::Client` is a `tower::Service<reqwest::Request>` whose future
//! completes as soon as the response *headers* have arrived; the body is streamed afterwards, by
//! `bytes()`, `text()` or `json()`. Behind [`Bulkhead::layer`], a reqwest call therefore ends —
//! and gives its permit back — when the headers arrive, and reading the body is not counted. To
//! count it, turn the response into an `http::Response<reqwest::Body>` and use
//! [`Bulkhead::body_layer`]; the permit then lasts until the body has been read or dropped:
//!
//! ```
//! use tower::ServiceBuilder;
//! use tower_bulwark::bulkhead::Bulkhead;
//!
//! let payment = Bulkhead::semaphore("payment", 2).build();
//! let client = ServiceBuilder::new()
//!     .layer(payment.body_layer())
//!     .map_response(|response: reqwest::Response| http::Response::<reqwest::Body>::from(response))
//!     .service(reqwest::Client::new());
//! # drop(client);
//! ```
//!
//! # Telling a refusal from a timeout and from the dependency's own error
//!
//! The services fail with [`BoxError`](crate::BoxError). A refusal holds a [`BulkheadFull`]; a
//! timeout from tower's `TimeoutLayer` holds `tower::timeout::error::Elapsed`; anything else came
//! from the inner service and keeps its own type:
//!
//! ```
//! use tower_bulwark::bulkhead::BulkheadFull;
//! use tower_bulwark::BoxError;
//!
//! fn describe(err: &BoxError) -> &'static str {
//!     if err.is::<BulkheadFull>() {
//!         "refused by the bulkhead: the dependency is busy, shed or degrade"
//!     } else if err.is::<tower::timeout::error::Elapsed>() {
//!         "timed out: the call was cut and its permit given back"
//!     } else if err.is::<std::io::Error>() {
//!         "the dependency itself failed"
//!     } else {
//!         "something else"
//!     }
//! }
//! # let err: BoxError = std::io::Error::other("reset").into();
//! # assert_eq!(describe(&err), "the dependency itself failed");
//! ```
//!
//! # With timeouts and retries
//!
//! Put the bulkhead *inside* the timeout and the timeout inside the retry:
//! `retry → timeout → bulkhead → client`. Then the timeout covers both the wait for a permit and
//! the call, and cutting the call gives the permit back; each attempt of the retry takes its own
//! permit and none is held while the retry backs off. Do not retry a [`BulkheadFull`] at once:
//! the bulkhead refused because the dependency is already saturated. (The whole
//! [outbound stack](crate::outbound#the-order-of-layers) puts the timeout below the bulkhead
//! instead, to bound each attempt at the dependency; the wait for a permit is then bounded by
//! the bulkhead's own `max_wait`.)
//!
//! ```
//! use std::future;
//! use std::time::Duration;
//! use tower::retry::Policy;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull};
//! use tower_bulwark::BoxError;
//!
//! /// Retries failures up to `attempts` times, but never a refusal by the bulkhead.
//! #[derive(Clone)]
//! struct RetryFailures {
//!     attempts: usize,
//! }
//!
//! impl<Req: Clone, Res> Policy<Req, Res, BoxError> for RetryFailures {
//!     type Future = future::Ready<()>;
//!
//!     fn retry(&mut self, _: &mut Req, result: &mut Result<Res, BoxError>) -> Option<Self::Future> {
//!         match result {
//!             Err(err) if !err.is::<BulkheadFull>() && self.attempts > 0 => {
//!                 self.attempts -= 1;
//!                 Some(future::ready(()))
//!             }
//!             _ => None,
//!         }
//!     }
//!
//!     fn clone_request(&mut self, req: &Req) -> Option<Req> {
//!         Some(req.clone())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let inventory = Bulkhead::semaphore("inventory", 8)
//!     .max_wait(Duration::from_millis(50))
//!     .build();
//! let client = ServiceBuilder::new()
//!     .retry(RetryFailures { attempts: 2 })
//!     .timeout(Duration::from_secs(1))
//!     .layer(inventory.layer())
//!     .service(service_fn(|sku: &'static str| async move { Ok::<_, BoxError>(sku.len()) }));
//! assert_eq!(client.oneshot("A-1").await?, 3);
//! # Ok(())
//! # }
//! ```
//!
//! # Watching it
//!
//! [`Bulkhead::snapshot`] returns the free permits, the limit, the queue depth and the running
//! totals of permitted, rejected and finished calls. Hooks on the builder —
//! [`on_call_permitted`](BulkheadBuilder::on_call_permitted),
//! [`on_call_rejected`](BulkheadBuilder::on_call_rejected) and
//! [`on_call_finished`](BulkheadBuilder::on_call_finished) — report each call as it happens; see
//! [`events`] for their order.
//!
//! # Changing the limit
//!
//! [`Bulkhead::set_max_concurrent_calls`] changes the limit while calls are in flight and never
//! blocks. Raising it lets waiters in at once. Lowering it below the calls in flight admits
//! nothing new until enough of them have ended: their permits are retired as they come back.
//!
//! # Cost
//!
//! A call takes its permit under the bulkhead's lock and gives it back under it, where tower's
//! `ConcurrencyLimit` takes one from tokio's semaphore (which locks to give it back). Besides,
//! each call counts itself as permitted and as finished on two shared counters; the hooks that
//! were not set cost a branch, and the clock is read only when `on_call_finished` is set. A call
//! that waits keeps its place in the bulkhead's queue, not boxed.

#[cfg(feature = "adaptive")]
#[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
pub mod adaptive;
mod error;
pub mod events;
mod future;
mod handle;
mod layer;
#[cfg(feature = "metrics")]
mod metrics;
mod permits;
#[cfg(feature = "config")]
pub(crate) use permits::MAX_CONCURRENT_CALLS;

pub use error::BulkheadFull;
pub use events::{
    BulkheadSnapshot, CallFinished, CallOutcome, CallPermitted, CallRejected, Rejection,
};
pub use future::ResponseFuture;
pub use handle::{Bulkhead, BulkheadBuilder};
pub use layer::{BulkheadLayer, BulkheadService};
pub use permits::BulkheadBody;
