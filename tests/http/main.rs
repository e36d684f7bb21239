//! The HTTP layers over real listeners on 127.0.0.1: end to end, forwarded addresses, clients
//! that go away, and the `plans` example.

#[path = "../common/mod.rs"]
mod common;

#[cfg(feature = "axum")]
mod disconnect;
#[cfg(feature = "axum")]
mod end_to_end;
#[cfg(feature = "axum")]
mod forwarded;
#[cfg(feature = "axum")]
mod plans_example;
