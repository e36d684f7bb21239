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
//! start. Two limits: a wait of one branch while another is with the dependency (a hedge) is
//! taken out all the same, and a wait of a future shared by calls (a single flight) is taken
//! out only of the call whose poll ended it, the others counting it as the dependency's time.
//!
//! The spans are the thread's, for the length of one poll: the call's future is polled on one
//! thread at a time, and every layer of one stack is polled inside the poll of the layer above,
//! so the waits below reach every timing layer above. Nothing is kept outside such a poll, and
//! a call that waited nowhere costs two reads of thread-local counters.
//! Written on a `thread_local` rather than a value in the request: the waiting layers take any
//! request type (a `reqwest::Request`, a plain one of the user's), and a layer that moves the
//! call to another task (tower's `Buffer`) hides the waits below it, which then count in the
//! call's time; a poll that drives other futures on its thread (a `block_on` inside it) takes
//! their waits out of its call's time.

use std::cell::{Cell, RefCell};

use tokio::time::Instant;

/// A wait, from its start to its end on tokio's clock.
pub(crate) type Span = (Instant, Instant);

/// Whether a queued wait that ends at `until` is over at `now`, for a queue that wants its place
/// or its permit: a millisecond after `until`, when its timer (which tokio rounds up to the next
/// millisecond) should have taken it out. Before that, a waiter polled after `until` still
/// waits, and may be admitted. The one rule of the bulkhead's queue and the overload
/// protection's.
pub(crate) fn ended(until: Instant, now: Instant) -> bool {
    until + std::time::Duration::from_millis(1) <= now
}

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

/// The waits below one call, on the clock of the layer that times it, in nanoseconds: up to
/// [`KEPT`](Self::KEPT) spans that do not overlap, in order, merged as they come; older ones are
/// folded into a total, and a later wait counts only after the last of them (a call of many
/// waits keeps few, and a wait that reaches back into folded ones counts short, never twice).
#[cfg(feature = "adaptive")]
#[derive(Debug, Default)]
pub(crate) struct Waits {
    spans: Vec<(u64, u64)>,
    /// The length of the spans folded, all of them before `folded_until`.
    folded: u64,
    folded_until: u64,
}

#[cfg(feature = "adaptive")]
impl Waits {
    /// The spans kept apart before the oldest is folded.
    const KEPT: usize = 16;

    /// Adds `spans` (on tokio's clock) as the layer's clock reads them at `now`, from the call's
    /// start at `started` on.
    pub(crate) fn add(&mut self, spans: &[Span], started: u64, now: u64) {
        let tokio_now = Instant::now();
        let on_clock = |at: Instant| {
            let ago = crate::clock::saturating_nanos(tokio_now.saturating_duration_since(at));
            now.saturating_sub(ago).max(started)
        };
        for &(from, to) in spans {
            self.insert(on_clock(from), on_clock(to));
        }
    }

    /// Adds the span from `from` to `to`.
    fn insert(&mut self, from: u64, to: u64) {
        let (mut from, mut to) = (from.max(self.folded_until), to);
        if to <= from {
            return;
        }
        // The kept spans it touches become one with it.
        let first = self.spans.partition_point(|&(_, end)| end < from);
        let mut last = first;
        while let Some(&(start, end)) = self.spans.get(last).filter(|&&(s, _)| s <= to) {
            (from, to) = (from.min(start), to.max(end));
            last += 1;
        }
        self.spans.splice(first..last, [(from, to)]);
        if self.spans.len() > Self::KEPT {
            let (start, end) = self.spans.remove(0);
            self.folded += end - start;
            self.folded_until = end;
        }
    }

    /// The length of the union of the waits.
    pub(crate) fn total(&self) -> u64 {
        let kept: u64 = self.spans.iter().map(|&(from, to)| to - from).sum();
        self.folded + kept
    }
}

#[cfg(feature = "adaptive")]
#[cfg(test)]
mod tests {
    use super::Waits;
    use proptest::prelude::*;

    /// The length of the union of `spans`, the plain way.
    fn union(spans: &[(u64, u64)]) -> u64 {
        let mut spans = spans.to_vec();
        spans.sort_unstable();
        let (mut total, mut covered) = (0, 0);
        for (from, to) in spans {
            total += to.saturating_sub(from.max(covered));
            covered = covered.max(to);
        }
        total
    }

    proptest! {
        /// Spans that end in order (as waits are recorded): the total is never more than their
        /// union, and is their union while they reach back over at most 16 kept spans.
        #[test]
        fn the_total_is_the_union_or_less_never_more(
            steps in proptest::collection::vec((0u64..50, 0u64..400), 1..200),
        ) {
            let mut waits = Waits::default();
            let (mut spans, mut end) = (Vec::new(), 0);
            for (gap, back) in steps {
                end += gap;
                let span = (end.saturating_sub(back), end);
                spans.push(span);
                waits.insert(span.0, span.1);
                prop_assert!(waits.spans.len() <= Waits::KEPT);
                prop_assert!(waits.total() <= union(&spans));
            }
            if waits.folded == 0 {
                prop_assert_eq!(waits.total(), union(&spans));
            }
        }
    }

    /// Many waits one after the other keep 16 spans, and count whole.
    #[test]
    fn many_disjoint_waits_keep_few_spans_and_count_whole() {
        let mut waits = Waits::default();
        for i in 0..5_000 {
            waits.insert(i * 10, i * 10 + 3);
        }
        assert_eq!(waits.spans.len(), Waits::KEPT);
        assert_eq!(waits.total(), 5_000 * 3);
    }
}
