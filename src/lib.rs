//! Tower and axum middleware for services under pressure.
//!
//! Two jobs, and the crate root names only what they need:
//!
//! * **Limit a route** per client: a [`RateLimitLayer`] holds one or more [`Policy`]s, each a
//!   name, a key (the peer's address with `PeerIp`, an API key, a tenant, anything), a cost and
//!   a limiter with its [`Quota`]. A request is admitted only if every policy admits it; a refused
//!   one gets `429 Too Many Requests` with a `Retry-After` computed from the limiter's state, the
//!   IETF `RateLimit-Policy`/`RateLimit` headers and an RFC 9457 problem+json body, and spends
//!   nothing anywhere.
//! * **Bulkhead a client**: a [`Bulkhead`] caps the calls in flight to one dependency (any
//!   `tower::Service`, such as a `reqwest::Client`), so a slow one cannot take the capacity the
//!   others need. A call beyond the cap fails at once with [`BulkheadFull`], never a timeout.
//!
//! ```no_run
//! use std::net::{IpAddr, SocketAddr};
//!
//! use axum::{routing::get, Router};
//! use tower_bulwark::{KeyedRateLimiter, PeerIp, Policy, Quota, RateLimitLayer};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let per_ip = KeyedRateLimiter::<IpAddr>::new(Quota::per_second(10)?);
//! let app = Router::new()
//!     .route("/orders", get(|| async { "ok" }))
//!     .route_layer(RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), per_ip)?));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! ```
//! use tower::{service_fn, ServiceBuilder};
//! use tower_bulwark::{BoxError, Bulkhead};
//!
//! let payment = Bulkhead::semaphore("payment", 16).build();
//! let client = ServiceBuilder::new()
//!     .layer(payment.layer())
//!     .service(service_fn(|amount: u32| async move { Ok::<_, BoxError>(amount) }));
//! # drop(client);
//! ```
//!
//! # Where the rest lives
//!
//! * [`rate_limit`]: the layer, key extractors (forwarded addresses behind named proxies, headers),
//!   exemptions, hooks and the response futures; [`tiers`]: a quota chosen per key.
//! * [`limiter`]: the [`Limiter`] trait that a policy asks, the in-memory [`KeyedRateLimiter`]
//!   and [`DirectRateLimiter`], their [`Decision`](limiter::Decision) and the bounded key table's
//!   [`Overflow`](limiter::Overflow) setting; [`algorithm`]: GCRA (the default), fixed window,
//!   sliding log and sliding counter.
//! * `redis` (feature `redis`): the same algorithms as Lua scripts in Redis, for a quota shared
//!   by every instance, with a `RedisFailMode` for when Redis
//!   cannot answer.
//! * [`bulkhead`]: the semaphore and queue kinds, layers that hold the permit until the response
//!   or its body ends, events and snapshots; `bulkhead::adaptive` (feature `adaptive`): a limit
//!   that follows the dependency (AIMD or a delay-based gradient).
//! * [`outbound`]: the rest of the way out: [`Pushback`](outbound::Pushback) holds calls back
//!   when the dependency says so (`Retry-After`, `RateLimit` headers), and
//!   [`ClientQuotaLayer`](outbound::ClientQuotaLayer) keeps to a quota of your own for it (in
//!   memory or Redis).
//! * `overload` (feature `adaptive`): protects the service itself, one limit of requests in
//!   flight that follows its latency, shedding the least important requests first (`503`).
//! * [`clock`]: time is injected; tests move a [`ManualClock`](clock::ManualClock) by hand and
//!   never sleep. [`observe`]: metric and event names. `config` (feature `config`): named
//!   instances and routes from a TOML file, reloadable.
//! * [`guide`]: what each piece promises, and the test that proves it.
#![deny(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod algorithm;
mod body_end;
pub mod bulkhead;
pub mod clock;
#[cfg(feature = "config")]
pub mod config;
mod decision;
pub mod guide;
pub mod head;
pub mod limiter;
pub mod observe;
pub mod outbound;
#[cfg(feature = "adaptive")]
#[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
pub mod overload;
mod quota;
pub mod rate_limit;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "adaptive")]
mod setting;
mod store;
mod sync;
pub mod tiers;
pub mod usage;
mod waited;

// The crate root names the two core jobs; everything else lives in its module.
pub use bulkhead::{Bulkhead, BulkheadFull};
pub use limiter::{DirectRateLimiter, KeyedRateLimiter, Limiter};
pub use quota::{Quota, QuotaError};
#[cfg(any(feature = "axum", feature = "grpc"))]
pub use rate_limit::{ForwardedIp, PeerIp};
pub use rate_limit::{GlobalKey, HeaderKey, Policy, RateLimitLayer};
#[cfg(feature = "adaptive")]
#[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
pub use setting::SettingError;

/// The README's Rust snippets, compiled (and, unless marked `no_run`, run) as doctests, so that
/// what the README shows is what the crate does.
#[cfg(all(doctest, feature = "full"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// A boxed error, as tower uses.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
