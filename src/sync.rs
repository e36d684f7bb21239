//! The atomics and the mutex of the parts that threads share without a lock of their own: the
//! bulkhead's excess of permits after a resize and the algorithms' states.
//!
//! Built with `RUSTFLAGS="--cfg loom"`, they are [loom](https://docs.rs/loom)'s, so that its model
//! checker sees every access and explores the interleavings (the models in `loom/src/lib.rs`, run
//! by `.ci/run`); otherwise they are `std`'s, at no cost. Only model checking sets that flag:
//! loom's types panic outside a `loom::model`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

// Either way the lock reports poisoning with `std`'s types.
use std::sync::PoisonError;

/// Locks `mutex`, and goes on with it even if a thread panicked while it held the lock: what
/// these locks guard is counts and instants, which a panic leaves readable (at worst one change
/// short), and a limiter or bulkhead must not fail every later call because one call panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
