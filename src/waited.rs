//! The time a call waited in this crate's layers before it was sent (a bulkhead's queue, the
//! pushback's hold, the client quota's reservation), told to the layers above it that time the
//! dependency: a circuit breaker counts a call slow by its time less those waits, and an
//! adaptive bulkhead samples its latency so.
//!
//! A layer that waits [`record`]s the span of the wait in the poll that ends it; a layer that
//! times calls polls its inner future [`during`] which it collects the spans recorded, and
//! takes out of the call's time the part of their union that lies after the call began
//! ([`Waits`]): waits of sub-calls sent side by side (a fan-out below) overlap and count once,
//! and a wait that began before the call (a future shared by calls) counts from the call's
//! start. A wait of one branch while another is with the dependency (a hedge) is taken out all
//! the same: it cannot be told apart.
//!
//! The spans are the thread's, for the length of one poll: the call's future is polled on one
//! thread at a time, and every layer of one stack is polled inside the poll of the layer above,
//! so the waits below reach every timing layer above. Nothing is kept outside such a poll, and
//! a call that waited nowhere costs two reads of thread-local counters.
//! Written on a `thread_local` rather than a value in the request: the waiting layers take any
//! request type (a `reqwest::Request`, a plain one of the user's), and a layer that moves the
//! call to another task (tower's `Buffer`) hides the waits below it, which then count in the
//! call's time.

use std::cell::{Cell, RefCell};

use tokio::time::Instant;

/// A wait, from its start to its end on tokio's clock.
pub(crate) type Span = (Instant, Instant);

std::thread_local! {
    /// How many layers that time calls are polling on this thread, one inside the other.
    static TIMING: Cell<u32> = const { Cell::new(0) };
    /// The spans of the waits ended during the outermost such poll, in the order they ended;
    /// cleared when it returns.
    static SPANS: RefCell<Vec<Span>> = const { RefCell::new(Vec::new()) };
    /// How many spans `SPANS` holds, read without touching it (a call that waited nowhere
    /// reads only this and `TIMING`, which need no destructor).
    static RECORDED: Cell<usize> = const { Cell::new(0) };
}

/// Counts a wait that began at `since` and ended now, in the future being polled, for the
/// timing layers above it (none: nothing is kept).
pub(crate) fn record(since: Instant) {
    // `try_with`: a wait may end while the thread's locals are torn down (then none is kept).
    if TIMING.try_with(Cell::get).unwrap_or(0) == 0 {
        return;
    }
    let span = (since, Instant::now());
    if SPANS
        .try_with(|spans| spans.borrow_mut().push(span))
        .is_ok()
    {
        RECORDED.set(RECORDED.get() + 1);
    }
}

/// Runs `poll` and returns what it returned with the spans of the waits ended in the layers it
/// polled (they count for the layers above too, whose polls hold this one).
#[cfg(feature = "adaptive")]
pub(crate) fn during<R>(poll: impl FnOnce() -> R) -> (R, Vec<Span>) {
    /// Ends this layer's poll on every way out of `poll`; the outermost clears the spans.
    struct Polling(u32);
    impl Drop for Polling {
        fn drop(&mut self) {
            TIMING.set(self.0);
            if self.0 == 0 && RECORDED.replace(0) > 0 {
                SPANS.with_borrow_mut(Vec::clear);
            }
        }
    }
    let depth = TIMING.get();
    let _polling = Polling(depth);
    TIMING.set(depth + 1);
    let before = RECORDED.get();
    let result = poll();
    let after = RECORDED.get();
    let spans = if after > before {
        SPANS.with_borrow(|spans| spans[before..after].to_vec())
    } else {
        Vec::new()
    };
    (result, spans)
}

/// The waits below one call, on the clock of the layer that times it, in nanoseconds: spans
/// that do not overlap, in order (merged as they come, so that a call of many waits keeps few).
#[cfg(feature = "adaptive")]
#[derive(Debug, Default)]
pub(crate) struct Waits(Vec<(u64, u64)>);

#[cfg(feature = "adaptive")]
impl Waits {
    /// Adds `spans` (on tokio's clock) as the layer's clock reads them at `now`, from the call's
    /// start at `started` on.
    pub(crate) fn add(&mut self, spans: &[Span], started: u64, now: u64) {
        let tokio_now = Instant::now();
        let on_clock = |at: Instant| {
            let ago = crate::clock::saturating_nanos(tokio_now.saturating_duration_since(at));
            now.saturating_sub(ago).max(started)
        };
        let spans = spans
            .iter()
            .map(|&(from, to)| (on_clock(from), on_clock(to)));
        self.0.extend(spans);
        self.0.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.0.len());
        for &(from, to) in &self.0 {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        self.0 = merged;
    }

    /// The length of the union of the waits.
    pub(crate) fn total(&self) -> u64 {
        self.0.iter().map(|&(from, to)| to - from).sum()
    }
}
