//! Bulkheads, fixed and adaptive: behaviour through the public API, hostile hooks and resizes,
//! isolation of dependencies, cancellation stress, and the `adaptive` example.

#[path = "../common/mod.rs"]
mod common;

#[cfg(all(feature = "adaptive", feature = "reqwest"))]
mod adaptive;
#[cfg(all(feature = "adaptive", feature = "reqwest", feature = "axum"))]
mod adaptive_example;
#[cfg(feature = "adaptive")]
mod adaptive_hostile;
#[cfg(feature = "adaptive")]
mod adaptive_stress;
#[cfg(feature = "adaptive")]
mod adaptive_support;
mod attack_permits;
mod behaviour;
mod hostile;
mod isolation;
mod order_hostile;
mod order_model;
mod order_storms;
mod order_support;
mod stress;
