//! Rate limiting algorithms: pure state transitions from (state, now, cost) to a [`Decision`].
//!
//! | algorithm | state per key | precision | refund |
//! |---|---|---|---|
//! | [`Gcra`] (default) | TAT and the key's latest reading, one 128-bit word updated by compare-and-swap | exact, smooth | yes (see [`Gcra`]'s `refund`) |
//! | [`Metered`] (for costs settled later) | settled TAT + permits held by requests in flight + latest reading | exact, smooth; settles exact | yes, exactly |
//! | [`FixedWindow`] | cycle + permits used + latest reading | exact per window, bursty at edges | the last slots taken |
//! | [`SlidingLog`] | one entry per admission time + latest reading | exact | yes, exactly |
//! | [`SlidingCounter`] | three counters + latest reading | approximate (see its docs) | yes, exactly |
//!
//! An algorithm never reads a clock and never does I/O: the limiter passes `now` in. Readings may
//! arrive out of order between threads; each algorithm decides a reading older than the latest
//! its key has seen as of that latest reading (GCRA as of the latest reading its key's state word
//! holds beside the TAT, which the readings that admit, give back or charge publish, not a
//! refusal's; the others as of the latest their key's state keeps, a refusal's too).
//! Readings beyond 2^62 ns are taken as 2^62 ns
//! (time stands still there; nothing wraps). The same transitions are implemented in Lua for the
//! Redis store, and a conformance suite holds the two to the same answers.

use crate::decision::Decision;

/// The [`Transitions`] methods of the window algorithms ([`FixedWindow`], [`SlidingCounter`],
/// [`SlidingLog`]), written once inside each one's impl. Their state is one record behind a
/// mutex (the state's field `0`), which every transition locks, deciding as of the group's
/// latest reading if it is later; the algorithm's own `step` decides on the record, and once
/// its `advance` has moved the record on to the reading, its `give_back` refunds and its
/// `take` charges. The capacity is the algorithm's `limit`. With `timeline`, also `new` for
/// an algorithm that is its `limit` and the [`Timeline`] of its windows (the fixed window and
/// the sliding counter). Names `LatestReading`, `Decision`, `Quota` and `lock` as the module it
/// is written in imports them.
macro_rules! window_transitions {
    (timeline) => {
        window_transitions!();

        fn new(quota: &Quota, epoch: u64) -> Self {
            Self {
                limit: u64::from(quota.permits()),
                timeline: Timeline::new(epoch, quota.period_nanos()),
            }
        }
    };
    () => {
        fn capacity(&self) -> u32 {
            self.limit as u32
        }

        fn decide(
            &self,
            state: &Self::State,
            latest: &LatestReading,
            now: u64,
            cost: u32,
            max_wait: u64,
        ) -> Decision {
            let now = latest.at_least(now);
            self.step(&mut lock(&state.0), now, cost, max_wait)
        }

        fn refund(
            &self,
            state: &Self::State,
            latest: &LatestReading,
            now: u64,
            cost: u32,
            decision: &Decision,
        ) {
            let now = latest.at_least(now);
            let mut record = lock(&state.0);
            let now = self.advance(&mut record, now);
            self.give_back(&mut record, now, cost, decision);
        }

        fn charge(&self, state: &Self::State, latest: &LatestReading, now: u64, cost: u32) {
            let now = latest.at_least(now);
            let mut record = lock(&state.0);
            let now = self.advance(&mut record, now);
            self.take(&mut record, now, cost);
        }
    };
}

mod concurrency;
mod fixed_window;
mod gcra;
mod metered;
mod sliding_counter;
mod sliding_log;

pub(crate) use concurrency::Concurrency;
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use metered::Metered;
pub use sliding_counter::SlidingCounter;
pub use sliding_log::SlidingLog;
// Each algorithm's state is its own: the limiters keep it, and no user names it (the loom
// models, built with `--cfg loom`, do).
#[cfg(loom)]
pub use {fixed_window::FixedWindowState, gcra::GcraState};

mod transitions;
// The transitions are the crate's; the loom models drive them directly.
#[cfg(loom)]
pub use transitions::{LatestReading, Transitions};
#[cfg(not(loom))]
pub(crate) use transitions::{LatestReading, Transitions};

/// A rate limiting algorithm, chosen by type: `.algorithm::<SlidingLog>()` on a limiter's
/// builder ([`RateLimiterBuilder::algorithm`](crate::limiter::RateLimiterBuilder::algorithm),
/// and the Redis limiter's). [`Gcra`] is the default; the table above says what each promises.
///
/// Sealed: these five are the algorithms there are. Each decides a stale clock reading as of
/// the latest its key has seen, gives back exactly what an admission recorded, and has a Lua
/// twin for Redis that a conformance suite holds to the same answers, which an algorithm from
/// outside the crate could not.
pub trait Algorithm: Transitions {}

impl<T: Transitions> Algorithm for T {}

/// How the window algorithms cut time into numbered windows: windows of `period` counted from the
/// limiter's creation, and after a change of period, the numbering carried on across it.
///
/// Window `first` is the window in progress at the latest change of period (window 0, starting
/// at the epoch, before any change). It began at `first_start` and ends at `next_start`; the
/// windows after it last `period` each. A change of period keeps the window in progress and its
/// number: it ends one new period after its own start, or at the change if that instant has
/// already passed. Instants before `first_start` all fall in the window before `first` (only
/// stale readings and old charges land there; every window before `first` has ended).
///
/// A key whose latest reading is past the change yet whose window was numbered before it (the
/// change read the clock, then lost the CPU while the key moved on; or a direct limiter's check
/// decided by the rule it had copied before the change was stored) is numbered anew when next
/// touched ([`renumber`](Self::renumber)): its counts move, as they are, to the window that
/// holds its latest reading, as the Redis scripts move theirs. A give-back goes back to the
/// window its admission was counted in only while that window's number still names it
/// ([`counted_window`](Self::counted_window)): not once a change numbered the admission's
/// instant anew (a reservation due past the change), nor once its key's counts moved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeline {
    first: u64,
    first_start: u64,
    next_start: u64,
    period: u64,
    /// How many changes the numbering went through.
    generation: u64,
    /// The longest period any of its windows had.
    longest: u64,
    /// The last window whose number the latest change kept naming the same stretch of time
    /// (the window in progress then; every window, for a change of the limit alone).
    kept_through: u64,
}

impl Timeline {
    /// Windows of `period` from `epoch`.
    pub(crate) fn new(epoch: u64, period: u64) -> Self {
        let epoch = epoch.min(crate::clock::MAX_NOW);
        Self {
            first: 0,
            first_start: epoch,
            next_start: epoch.saturating_add(period),
            period,
            generation: 0,
            longest: period,
            kept_through: u64::MAX,
        }
    }

    /// The numbering carried on at `now` with windows of `period` from then on: the window in
    /// progress keeps its number and its start and ends at `start + period`, or at `now` if that
    /// has passed. An unchanged period leaves the timeline as it is.
    pub(crate) fn with_period(&self, period: u64, now: u64) -> Self {
        if period == self.period {
            return *self;
        }
        let now = now.clamp(self.first_start, crate::clock::MAX_NOW);
        let first = self.window_of(now);
        let first_start = self.start_of(first);
        Self {
            first,
            first_start,
            next_start: first_start.saturating_add(period).max(now),
            period,
            generation: self.generation + 1,
            longest: self.longest.max(period),
            kept_through: first,
        }
    }

    /// The same windows, counted as a change all the same: what the fixed window makes of a
    /// change of its limit, which moves the slots of the cycles ahead.
    pub(crate) fn renewed(&self) -> Self {
        Self {
            generation: self.generation + 1,
            kept_through: u64::MAX,
            ..*self
        }
    }

    /// How many changes the numbering went through: what an admission is counted under
    /// ([`Decision::counted_in`]).
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The longest period any of its windows had.
    pub(crate) fn longest(&self) -> u64 {
        self.longest
    }

    /// The number this timeline gives a key's window (`window`, its latest reading `latest`):
    /// the window that holds that reading, if it is no earlier than the window in progress at
    /// the latest change (before it, both numberings agree; a key untouched since has ended its
    /// window), or `window` as it is.
    pub(crate) fn numbered(&self, window: u64, latest: u64) -> u64 {
        if latest >= self.first_start {
            self.window_of(latest)
        } else {
            window
        }
    }

    /// Numbers a key's window by this timeline ([`numbered`](Self::numbered)); its counts stay
    /// as they are. `renumbered`, one more than the reading at which the key's window last
    /// changed number this way (zero: never), is then `latest + 1`.
    pub(crate) fn renumber(&self, window: &mut u64, renumbered: &mut u64, latest: u64) {
        let numbered = self.numbered(*window, latest);
        if numbered != *window {
            (*window, *renumbered) = (numbered, latest + 1);
        }
    }

    /// The window `decision`'s permits were counted in, if its number still names them: it was
    /// counted under this numbering, or under the one before it in a window the change kept
    /// (after a change of period, no later than the one then in progress: a later one's number
    /// now names another stretch of time); the window that holds the instant they were charged
    /// at is that one; and the decision was made after its key's counts last moved
    /// (`renumbered`, see [`renumber`](Self::renumber)). After two changes, nothing names it.
    /// With the window, the numbering the admission was counted under.
    pub(crate) fn counted_window(
        &self,
        decision: &Decision,
        renumbered: u64,
    ) -> Option<(u64, u64)> {
        let (window, generation) = decision.counted_window()?;
        let kept = generation == self.generation
            || (generation + 1 == self.generation && window <= self.kept_through);
        let at = decision.charged().at;
        (kept && self.window_of(at) == window && decision.decided_at() >= renumbered)
            .then_some((window, generation))
    }

    /// The number of the window that holds instant `at`.
    pub(crate) fn window_of(&self, at: u64) -> u64 {
        if at >= self.next_start {
            self.first + 1 + (at - self.next_start) / self.period
        } else if at >= self.first_start {
            self.first
        } else {
            self.first.saturating_sub(1)
        }
    }

    /// The instant window `window` begins. Windows before `first` are reported as beginning at
    /// `first_start`: later than they did, which only keeps a key a little longer (they have
    /// all ended by then).
    pub(crate) fn start_of(&self, window: u64) -> u64 {
        if window > self.first {
            self.next_start
                .saturating_add((window - self.first - 1).saturating_mul(self.period))
        } else {
            self.first_start
        }
    }

    /// The length of window `window`, at least one nanosecond.
    pub(crate) fn length_of(&self, window: u64) -> u64 {
        self.start_of(window + 1)
            .saturating_sub(self.start_of(window))
            .max(1)
    }
}

/// The instant a reading `now` is decided as of, given the latest reading a key has seen:
/// never earlier than that (a stale reading is decided as of it), never past
/// [`MAX_NOW`](crate::clock::MAX_NOW).
fn as_of(now: u64, latest: u64) -> u64 {
    now.min(crate::clock::MAX_NOW).max(latest)
}

/// [`as_of`], and the key's latest reading moved on to it.
fn advance_latest(latest: &mut u64, now: u64) -> u64 {
    *latest = as_of(now, *latest);
    *latest
}

/// What a settle to `cost` charges of an admission of `estimate`: what it cost beyond the
/// estimate, counting no more than one request may take (`capacity`); zero for a settle to less.
/// The one rule of a settle's debt, in memory and in Redis.
pub(crate) fn settle_debt(estimate: u32, cost: u32, capacity: u32) -> u32 {
    cost.min(capacity).saturating_sub(estimate)
}

/// The instant from which a key whose permits weigh until `ends` carries no information: never
/// before its `latest` reading. The store publishes its own reading to the shard before it drops
/// keys, the floor of every key made afresh, so a stale reading that reaches the fresh key is
/// decided as of an instant no earlier than the drop; a key whose latest reading is past the
/// store's (a request decided while a sweep ran) would lose that reading, and a stale reading
/// after the drop would be decided as of an earlier instant than the kept key decides it.
/// Every algorithm's `idle_at` but `Concurrency`'s (slots know no time).
fn idle_after(latest: u64, ends: u64) -> u64 {
    latest.max(ends)
}

/// An eviction rank (the lowest goes first): the permits still weighing first; among keys that
/// hold as many, the one that took them most recently (the higher `recent`: the time until its
/// record ends, for GCRA and the sliding log) goes first, so a flood of fresh keys evicts its
/// own keys before the established clients it floods. Where the state cannot tell (counts, and
/// `Metered`'s held estimates, pass 0), and between equal ranks, the store evicts the key it
/// made last.
fn rank(permits: u64, recent: u64) -> u128 {
    (u128::from(permits) << 64) | u128::from(u64::MAX - recent)
}
