//! Client-side quotas: the crate's limiters in front of an outbound service.
//!
//! A partner allows "5 000 calls per hour" to your whole service, however many instances it
//! runs. A [`ClientQuotaLayer`] takes each call's permits from a [`Limiter`](crate::Limiter)
//! before the call is sent: a [`DirectRateLimiter`](crate::DirectRateLimiter) for one process,
//! or a `RedisRateLimiter` (feature `redis`) so that every instance draws on one quota. It wraps
//! a `reqwest::Client` directly, or any `tower::Service`.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_bulwark::outbound::{self, ClientQuotaLayer, QuotaExhausted};
//! use tower_bulwark::{BoxError, DirectRateLimiter, clock::ManualClock, Quota};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let clock = ManualClock::new();
//! let limiter = DirectRateLimiter::builder(Quota::per_hour(5_000)?.with_burst(2)?)
//!     .clock(clock.clone())
//!     .build();
//! let partner = ClientQuotaLayer::new("partner", limiter)
//!     .layer(service_fn(|path: &'static str| async move { Ok::<_, BoxError>(path.len()) }));
//!
//! assert_eq!(partner.clone().oneshot("/a").await?, 2);
//! assert_eq!(partner.clone().oneshot("/bc").await?, 3);
//! // The burst is spent: the next permit comes in 3600 s / 5000 = 720 ms.
//! let err = partner.clone().oneshot("/d").await.unwrap_err();
//! assert!(err.is::<QuotaExhausted>());
//! assert_eq!(outbound::retry_after(&*err), Some(Duration::from_millis(720)));
//! clock.advance(Duration::from_millis(720));
//! assert_eq!(partner.oneshot("/d").await?, 2);
//! # Ok(())
//! # }
//! ```
//!
//! # What a call costs, and what a refusal costs
//!
//! * The key is `()` for every call unless [`ClientQuotaLayer::key`] chooses one from the
//!   request (a tenant, a partner account); the cost is one permit unless
//!   [`cost`](ClientQuotaLayer::cost) or [`cost_by`](ClientQuotaLayer::cost_by) says otherwise.
//! * A call whose permits are available goes at once. One whose permits come within the quota's
//!   [`max_wait`](crate::Quota::with_max_wait) reserves them and waits on tokio's timer, then
//!   goes; dropped while it waits (a timeout above it), it gives them back. One whose permits
//!   would come later fails at once with [`QuotaExhausted`], which carries `retry_after`, and
//!   spends nothing.
//! * A cost the quota can never grant fails with [`InsufficientCapacity`](crate::limiter::InsufficientCapacity);
//!   a limiter that fails (Redis down, under a fail mode that propagates errors) fails the call
//!   with its error. Neither reaches the dependency.
//! * A call that one of the crate's layers below the quota refuses before sending it (a
//!   [`BulkheadFull`](crate::BulkheadFull), a [`PushedBack`](super::PushedBack), a nested
//!   quota's [`QuotaExhausted`] or `InsufficientCapacity`, found anywhere in the error's chain of
//!   sources) reached nothing: its permits go back. Any other error keeps them, since the call
//!   may have reached the dependency; so does a call dropped once it was passed on.

#[cfg(feature = "reqwest")]
mod body;
mod counting;
mod error;
mod future;
mod layer;

pub use self::counting::{QuotaCost, QuotaKey, QuotaSettle, SettleLater, Unsettled};
pub use self::error::QuotaExhausted;
pub use self::future::ResponseFuture;
pub use self::layer::{ClientQuotaLayer, ClientQuotaService};
