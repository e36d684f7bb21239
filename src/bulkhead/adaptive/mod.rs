//! Adaptive bulkheads (feature `adaptive`): a limit of concurrent calls that follows the
//! dependency.
//!
//! A fixed limit is right for one state of a dependency only. A payment gateway that serves
//! sixteen calls at once in the morning may serve four under load in the afternoon: a limit of
//! sixteen then queues calls at the gateway (latency climbs, `503`s come back), and a limit of
//! four in the morning wastes three quarters of it. An [`AdaptiveBulkhead`] moves its limit
//! with what the calls say: down when the dependency signals overload or its latency rises above
//! its baseline, up (slowly) while the limit is what holds callers back.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, Service, ServiceExt};
//! use tower_bulwark::bulkhead::adaptive::{AdaptiveBulkhead, Limits};
//! use tower_bulwark::bulkhead::BulkheadFull;
//! use tower_bulwark::clock::ManualClock;
//! use tower_bulwark::BoxError;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let clock = ManualClock::new();
//! let payment = AdaptiveBulkhead::builder("payment")
//!     .limits(Limits::new(1, 10, 100)?)
//!     .clock(clock.clone())
//!     .build();
//! // A dependency that is overloaded: it answers every call with 503.
//! let mut client = tower::ServiceBuilder::new()
//!     .layer(payment.layer())
//!     .service(service_fn(|_: ()| async {
//!         let response = http::Response::builder().status(503).body(())?;
//!         Ok::<_, BoxError>(response)
//!     }));
//!
//! // The first call opens a round trip of 10 ms; the one that ends after it closes it.
//! client.ready().await?.call(()).await?;
//! clock.advance(Duration::from_millis(10));
//! client.ready().await?.call(()).await?;
//! // One overload signal in that round trip: the limit is multiplied by 0.8.
//! assert_eq!(payment.limit(), 8);
//! assert_eq!(payment.snapshot().max_allowed_concurrent_calls, 8);
//!
//! // A refusal is a `BulkheadFull`, as with every bulkhead.
//! let eight: Vec<_> = (0..8).map(|_| client.call(())).collect();
//! let err = client.ready().await?.call(()).await.unwrap_err();
//! assert!(err.is::<BulkheadFull>());
//! drop(eight);
//! # Ok(())
//! # }
//! ```
//!
//! # How it decides
//!
//! Each call that ends gives a [`Sample`]: its round trip on the bulkhead's [`Clock`] (less its
//! waits in this crate's layers below, such as a bulkhead's queue), the calls in flight when it
//! was admitted, and whether the [`Classify`] classifier judged its answer an
//! overload signal. A [`LimitAlgorithm`] turns samples into a limit between the [`Limits`]:
//!
//! * [`Aimd`] (the default): once per round trip, the limit is multiplied by 0.8 if a call in it
//!   signalled overload or its mean latency rose above 1.3 times the baseline, and otherwise
//!   grows by one if some call in it was admitted with the limit reached.
//! * [`Gradient`]: delay-based, after Netflix's Gradient2: the limit follows the ratio of the
//!   baseline latency to the latency now, plus a little headroom while it is in use.
//!
//! The guide's [adaptive bulkheads](crate::guide#adaptive-bulkheads) section states each rule
//! with its bounds and tests.
//!
//! # What counts as overload
//!
//! The layer's classifier decides. The default, [`HttpOverload`], takes `429`, `503` and `504`
//! and errors that are timeouts or connection failures for overload, every other response for
//! a healthy latency sample, and other errors for no sample. It reads `http::Response<B>` and,
//! with the `reqwest` feature, `reqwest::Client`'s responses and errors. Any tower-http
//! classifier can decide instead through [`FromTowerHttp`], and a closure is a classifier too:
//!
//! ```
//! use tower_bulwark::bulkhead::adaptive::{AdaptiveBulkhead, Verdict};
//! use tower_bulwark::BoxError;
//!
//! let search = AdaptiveBulkhead::builder("search").build();
//! // A dependency that answers `Err(Busy)` when it is overloaded.
//! #[derive(Debug)]
//! struct Busy;
//! impl std::fmt::Display for Busy {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str("busy")
//!     }
//! }
//! impl std::error::Error for Busy {}
//! let layer = search.layer_with(|result: Result<&String, &BoxError>| match result {
//!     Ok(_) => Verdict::Healthy,
//!     Err(err) if err.is::<Busy>() => Verdict::Overloaded,
//!     Err(_) => Verdict::Ignored,
//! });
//! # drop(layer);
//! ```
//!
//! # What holds, as with every bulkhead
//!
//! * The permit is taken in `call`, never in `poll_ready`, and given back exactly once, however
//!   the call ends: an answer, an error, a panic, or the future dropped.
//! * Every clone of the bulkhead, its layer and its services shares one limit and one algorithm.
//! * A call that finds the limit reached is refused at once with
//!   [`BulkheadFull`](crate::bulkhead::BulkheadFull); an adaptive bulkhead never queues, so a
//!   refusal is never a timeout. Its own refusals are not samples.
//! * A call is admitted only while the calls holding a permit, itself included, are at most the
//!   limit at that instant. When the limit comes down below the calls in flight, nothing new
//!   is admitted until enough of them have ended.
//! * A call dropped before its end is an overload signal by default (that is how a timeout
//!   above the bulkhead, a deadline for the whole call, reaches it; in the
//!   [outbound stack's order](crate::outbound#the-order-of-layers) the timeout is below it, and
//!   its `Elapsed` is an overload answer with its round trip), or no sample with
//!   [`ignore_cancelled_calls`](AdaptiveBulkheadBuilder::ignore_cancelled_calls); never a
//!   fast, healthy one. A call dropped before it was first polled never reached the
//!   dependency, and a call that panicked says nothing about it: neither is a sample.
//!
//! # Watching it
//!
//! [`AdaptiveBulkhead::limit`] and the snapshot's `max_allowed_concurrent_calls` show the
//! current limit; [`on_limit_changed`](AdaptiveBulkheadBuilder::on_limit_changed) reports each
//! move, with the sample that caused it. With the `metrics` feature the gauge
//! `bulwark_bulkhead_max_allowed_concurrent_calls{name}` follows the limit as it moves, and the
//! calls are counted as for every bulkhead (see
//! [the metric names](crate::observe#metric-names)).
//!
//! # Cost
//!
//! Admission takes a permit as a fixed bulkhead that never waits does. Each
//! call reads the clock twice and, when it ends with a sample, takes one mutex to run the
//! algorithm.
//!
//! [`Clock`]: crate::clock::Clock

mod classify;
mod controller;
pub(crate) mod future;
mod handle;
mod layer;
mod limit;

pub use classify::{Classify, FromTowerHttp, HttpOverload, OverloadClass, Verdict};
pub use controller::LimitChanged;
pub use future::ResponseFuture;
pub use handle::{AdaptiveBulkhead, AdaptiveBulkheadBuilder};
pub use layer::{ClassifiedLayer, ClassifiedService};
#[cfg(feature = "config")]
pub(crate) use limit::DEFAULT_LIMITS;
pub use limit::{Aimd, Gradient, LimitAlgorithm, Limits, Sample};
