//! The atomics and the mutex of the parts that threads share without a lock of their own: the
//! bulkhead's excess of permits after a resize and the algorithms' states (GCRA's 128-bit word
//! among them); and [`lock`], which takes a mutex past a poisoning (the outbound layers' and
//! the adaptive bulkhead's mutexes are these too, for it; no loom model builds them), as
//! [`unpoisoned`] takes a reader-writer lock.
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

/// A 128-bit atomic: `portable-atomic`'s (one `cmpxchg16b` on x86-64), or under loom, which has
/// none, one made of loom's mutex, so that the models see every access to GCRA's word.
#[cfg(not(loom))]
pub(crate) use portable_atomic::AtomicU128;

/// Loom's stand-in for a 128-bit atomic: each operation is one critical section of a mutex,
/// which loom schedules as it does an atomic's access.
#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct AtomicU128(Mutex<u128>);

#[cfg(loom)]
impl AtomicU128 {
    pub(crate) fn load(&self, _: Ordering) -> u128 {
        *lock(&self.0)
    }

    pub(crate) fn compare_exchange_weak(
        &self,
        current: u128,
        new: u128,
        _: Ordering,
        _: Ordering,
    ) -> Result<u128, u128> {
        let mut value = lock(&self.0);
        if *value == current {
            *value = new;
            Ok(current)
        } else {
            Err(*value)
        }
    }

    pub(crate) fn fetch_update(
        &self,
        _: Ordering,
        _: Ordering,
        mut f: impl FnMut(u128) -> Option<u128>,
    ) -> Result<u128, u128> {
        let mut value = lock(&self.0);
        let before = *value;
        match f(before) {
            Some(new) => {
                *value = new;
                Ok(before)
            }
            None => Err(before),
        }
    }
}

// Either way the lock reports poisoning with `std`'s types.
use std::sync::{LockResult, PoisonError};

/// Locks `mutex`, and goes on with it even if a thread panicked while it held the lock: what
/// these locks guard is counts and instants, which a panic leaves readable (at worst one change
/// short), and a limiter or bulkhead must not fail every later call because one call panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    unpoisoned(mutex.lock())
}

/// The guard of a lock taken, poisoned or not, by the rule of [`lock`]: for the reader-writer
/// locks (std's, and the store's `ShardedLock`), whose `read` and `write` answer as `lock` does.
pub(crate) fn unpoisoned<G>(taken: LockResult<G>) -> G {
    taken.unwrap_or_else(PoisonError::into_inner)
}
