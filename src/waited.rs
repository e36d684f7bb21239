//! The time a call waited in this crate's layers before it was sent (a bulkhead's queue, the
//! pushback's hold, the client quota's reservation), told to the layers above it that time the
//! dependency: a circuit breaker counts a call slow by its time after those waits, and an
//! adaptive bulkhead samples its latency so.
//!
//! A layer that waits [`record`]s the wait in the poll that ends it; a layer that times calls
//! polls its inner future [`during`] which it collects the waits recorded. The count is the
//! thread's, for the length of one poll: the call's future is polled on one thread at a time,
//! and every layer of one stack is polled inside the poll of the layer above, so the waits
//! below reach every timing layer above, each once. Written on a `thread_local` rather than a
//! value in the request: the waiting layers take any request type (a `reqwest::Request`, a
//! plain one of the user's), and a layer that moves the call to another task (tower's `Buffer`)
//! hides the waits below it, which then count in the call's time, as they did before.

use std::cell::Cell;
use std::time::Duration;

use crate::clock::saturating_nanos;

std::thread_local! {
    /// Nanoseconds waited below in the poll under way on this thread.
    static WAITED: Cell<u64> = const { Cell::new(0) };
}

/// Counts a wait of `span` that just ended in the future being polled, for the timing layers
/// above it.
pub(crate) fn record(span: Duration) {
    WAITED.with(|waited| waited.set(waited.get().saturating_add(saturating_nanos(span))));
}

/// Runs `poll` and returns what it returned with the nanoseconds waited in the layers it
/// polled, which count for the layers above too (also when `poll` panics).
#[cfg(feature = "adaptive")]
pub(crate) fn during<R>(poll: impl FnOnce() -> R) -> (R, u64) {
    /// Gives the layers above what they had and what was waited below, on every way out of
    /// `poll`.
    struct Above<'a>(&'a Cell<u64>, u64);
    impl Drop for Above<'_> {
        fn drop(&mut self) {
            self.0.set(self.1.saturating_add(self.0.get()));
        }
    }
    // One lookup of the thread's count for the whole poll: `record` below only adds to it.
    WAITED.with(|waited| {
        let _above = Above(waited, waited.replace(0));
        let result = poll();
        (result, waited.get())
    })
}
