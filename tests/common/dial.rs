//! A clock whose reading the test dials, backwards too, for stale and out-of-order readings
//! (a `ManualClock` only moves forward: a set backwards is ignored, so a "stale" reading set
//! through it reaches a limiter as the latest one).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tower_bulwark::clock::Clock;

/// A clock whose reading the test dials, backwards too: stale and out-of-order readings; a
/// thread that set a reading of its own ([`read_here`]) reads that one instead.
#[derive(Clone, Default)]
pub struct Dial(Arc<AtomicU64>);

thread_local! {
    /// A reading of this thread's own, which a [`Dial`] hands out instead of its shared one.
    static MINE: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Makes this thread's readings of any [`Dial`] `at` (none: the dial's shared one).
pub fn read_here(at: Option<u64>) {
    MINE.with(|m| m.set(at));
}

impl Dial {
    pub fn at(n: u64) -> Self {
        let dial = Self::default();
        dial.set(n);
        dial
    }

    /// Reads `n` ns from now on, earlier than the last reading or not.
    pub fn set(&self, n: u64) {
        self.0.store(n, Ordering::SeqCst);
    }
}

impl Clock for Dial {
    fn now(&self) -> u64 {
        MINE.with(Cell::get)
            .unwrap_or_else(|| self.0.load(Ordering::SeqCst))
    }
}
