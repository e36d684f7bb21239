//! The Redis backend, each test against its own `redis-server` (or a fake one): the store, a
//! cluster, conformance with memory, refunds, deadlines, faults, the HTTP layer, client quotas
//! and configuration.

#[path = "../common/mod.rs"]
mod common;

#[cfg(feature = "redis")]
mod client_quota;
#[cfg(feature = "redis")]
mod client_quota_unreachable;
#[cfg(feature = "redis")]
mod cluster;
#[cfg(feature = "redis")]
mod coalesce;
#[cfg(feature = "redis")]
mod concurrency;
#[cfg(all(feature = "redis", feature = "axum"))]
mod concurrency_layer;
#[cfg(all(feature = "config", feature = "redis"))]
mod config;
#[cfg(feature = "redis")]
mod conformance;
#[cfg(all(feature = "redis", unix))]
mod deadline;
#[cfg(feature = "redis")]
mod faults;
#[cfg(all(feature = "redis", feature = "axum"))]
mod hot_key_example;
#[cfg(feature = "redis")]
mod http_layer;
#[cfg(feature = "redis")]
mod lease;
#[cfg(feature = "redis")]
mod lease_hostile;
#[cfg(feature = "redis")]
mod lease_windows;
#[cfg(feature = "redis")]
mod metered;
#[cfg(all(feature = "redis", feature = "axum"))]
mod metered_layer;
#[cfg(feature = "redis")]
mod outage;
#[cfg(feature = "redis")]
mod refund;
#[cfg(feature = "redis")]
mod settle;
#[cfg(feature = "redis")]
mod store;
