//! Observability: named instances through metrics, tracing and the health report, the memory
//! the observing wrapper keeps, and recording without allocating (counted by this binary's
//! allocator).

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/counting.rs"]
mod counting;

#[cfg(all(feature = "config", feature = "metrics", feature = "axum"))]
mod attack;
#[cfg(all(feature = "metrics", feature = "adaptive"))]
mod attack_counts;
mod memory;
#[cfg(feature = "metrics")]
mod metrics_alloc;
#[cfg(all(feature = "config", feature = "metrics", feature = "axum"))]
mod named_instances;
#[cfg(all(feature = "config", feature = "axum"))]
mod orders;
#[cfg(all(feature = "config", feature = "axum"))]
mod tracing_events;
