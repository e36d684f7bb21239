//! The Redis backend, each test against its own `redis-server` (or a fake one): the store, a
//! cluster, conformance with memory, refunds, deadlines, faults, the HTTP layer, client quotas
//! and configuration.

#![cfg(feature = "redis")]

#[path = "../common/mod.rs"]
mod common;

#[cfg(all(feature = "axum", feature = "reqwest"))]
mod attack_concurrency;
mod attack_fixed_quota;
mod attack_lease_debt;
mod attack_lease_stall;
#[cfg(all(feature = "config", feature = "metrics"))]
mod attack_observe;
mod attack_outage;
mod attack_sliding_period;
mod attack_two;
mod client_quota;
mod client_quota_unreachable;
mod cluster;
mod coalesce;
mod concurrency;
#[cfg(feature = "axum")]
mod concurrency_layer;
#[cfg(feature = "config")]
mod config;
mod conformance;
#[cfg(unix)]
mod deadline;
mod faults;
#[cfg(feature = "axum")]
mod hot_key_example;
mod http_layer;
mod lease;
mod lease_hostile;
mod lease_windows;
mod metered;
#[cfg(feature = "axum")]
mod metered_layer;
mod outage;
mod refund;
mod settle;
mod stale_readings;
mod store;
