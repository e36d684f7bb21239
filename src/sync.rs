//! The atomics and the mutex of the parts that threads share without a lock of their own: the
//! bulkhead's excess of permits after a resize and the GCRA and fixed-window states.
//!
//! Built with `RUSTFLAGS="--cfg loom"`, they are [loom](https://docs.rs/loom)'s, so that its model
//! checker sees every access and explores the interleavings (the models in `loom/src/lib.rs`, run
//! by `.ci/run`); otherwise they are `std`'s, at no cost. Only model checking sets that flag:
//! loom's types panic outside a `loom::model`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;

// Either way the lock reports poisoning with `std`'s types.
pub(crate) use std::sync::PoisonError;
