//! Configuration files: what they mean, hostile input, rate limiters with routes, adaptive
//! bulkheads, circuit breakers and outbound layers from a file, and reloads.

#[path = "../common/mod.rs"]
mod common;

#[cfg(all(feature = "config", feature = "adaptive"))]
mod adaptive;
#[cfg(all(feature = "config", feature = "adaptive"))]
mod breaker;
// The attack builds one file with every kind of instance, adaptive bulkheads and routes with
// exempt networks among them.
#[cfg(all(feature = "config", feature = "adaptive", feature = "axum"))]
mod attack;
#[cfg(all(feature = "config", feature = "adaptive"))]
mod attack_equivalent;
#[cfg(all(feature = "config", feature = "adaptive"))]
mod attack_followed;
#[cfg(all(feature = "config", feature = "adaptive"))]
mod attack_limits;
#[cfg(feature = "config")]
mod files;
#[cfg(all(feature = "config", feature = "axum"))]
mod forwarded;
#[cfg(feature = "config")]
mod hostile;
#[cfg(feature = "config")]
mod outbound;
#[cfg(all(feature = "config", feature = "redis"))]
mod redis_fields;
#[cfg(feature = "config")]
mod reload;
#[cfg(feature = "config")]
mod routes;
#[cfg(feature = "config")]
mod support;
