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
//! start. A wait of one branch while another is with the dependency (a hedge) still counts: it
//! cannot be told apart.
//!
//! The spans are the thread's, for the length of one poll: the call's future is polled on one
//! thread at a time, and every layer of one stack is polled inside the poll of the layer above,
//! so the waits below reach every timing layer above. Nothing is kept outside such a poll.
//! Written on a `thread_local` rather than a value in the request: the waiting layers take any
//! request type (a `reqwest::Request`, a plain one of the user's), and a layer that moves the
//! call to another task (tower's `Buffer`) hides the waits below it, which then count in the
//! call's time.

use std::cell::RefCell;

use tokio::time::Instant;

/// A wait, from its start to its end on tokio's clock.
pub(crate) type Span = (Instant, Instant);

std::thread_local! {
    /// The spans of the waits ended in the poll under way on this thread; `None` outside the
    /// poll of a layer that times calls.
    static SPANS: RefCell<Option<Vec<Span>>> = const { RefCell::new(None) };
}

/// Counts a wait that began at `since` and ended now, in the future being polled, for the
/// timing layers above it.
pub(crate) fn record(since: Instant) {
    // `try_with`: a wait may end while the thread's locals are torn down (then none is kept).
    let _ = SPANS.try_with(|spans| {
        if let Some(spans) = spans.borrow_mut().as_mut() {
            spans.push((since, Instant::now()));
        }
    });
}

/// Runs `poll` and returns what it returned with the spans of the waits ended in the layers it
/// polled, which count for the layers above too (also when `poll` panics).
#[cfg(feature = "adaptive")]
pub(crate) fn during<R>(poll: impl FnOnce() -> R) -> (R, Vec<Span>) {
    /// Gives the layers above what they had and the spans recorded below, on every way out of
    /// `poll`.
    struct Above(Option<Vec<Span>>);
    impl Drop for Above {
        fn drop(&mut self) {
            SPANS.with_borrow_mut(|spans| {
                let below = spans.take().unwrap_or_default();
                *spans = self.0.take().map(|mut above| {
                    above.extend(below);
                    above
                });
            });
        }
    }
    let above = Above(SPANS.replace(Some(Vec::new())));
    let result = poll();
    let spans = SPANS.with_borrow(|spans| spans.clone().unwrap_or_default());
    drop(above);
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
