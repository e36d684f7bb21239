//! Tower and axum middleware for services under pressure.
//!
//! * **Rate limiting** keeps callers from overrunning a service: [`KeyedRateLimiter`] decides per
//!   client key, with GCRA by default and fixed window, sliding log and sliding counter on
//!   request. Every refusal says exactly when to come back.
//! * **Bulkheads** keep one slow dependency from taking the capacity the others need:
//!   [`BulkheadLayer`] caps the calls in flight to each downstream service and refuses the rest
//!   at once with [`BulkheadFull`]. See the [`bulkhead`] module.
//! * **Time is injected**: every limiter reads a [`Clock`]; tests use [`ManualClock`] and never
//!   sleep.
//!
//! ```
//! use tower_bulwark::{KeyedRateLimiter, Quota};
//!
//! let limiter = KeyedRateLimiter::<String>::new(Quota::per_second(10)?);
//! let decision = limiter.check(&"203.0.113.7".to_string());
//! assert!(decision.allowed);
//! assert_eq!(decision.remaining, 9);
//! # Ok::<(), tower_bulwark::QuotaError>(())
//! ```
#![deny(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod bulkhead;
pub mod clock;
#[cfg(feature = "config")]
pub mod config;
mod decision;
pub mod guide;
pub mod limiter;
pub mod observe;
pub mod outbound;
mod quota;
pub mod rate_limit;
pub mod store;
mod sync;
pub mod tiers;

pub use algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter, SlidingLog};
pub use bulkhead::{
    Bulkhead, BulkheadBodyLayer, BulkheadFull, BulkheadLayer, BulkheadService, BulkheadSnapshot,
};
#[cfg(feature = "quanta")]
pub use clock::QuantaClock;
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use decision::{Decision, InsufficientCapacity};
pub use limiter::{acquire, DirectRateLimiter, KeyedRateLimiter, Limiter, RateLimiterBuilder};
pub use quota::{Quota, QuotaError};
#[cfg(feature = "axum")]
pub use rate_limit::PeerIp;
pub use rate_limit::{Policy, RateLimitLayer};
#[cfg(feature = "redis")]
pub use store::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
pub use store::Overflow;
pub use tiers::Tiers;

/// The README's Rust snippets, compiled (and, unless marked `no_run`, run) as doctests, so that
/// what the README shows is what the crate does.
#[cfg(all(doctest, feature = "full"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// A boxed error, as tower uses.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
