//! Rate limiting algorithms: pure state transitions from (state, now, cost) to a [`Decision`].
//!
//! | algorithm | state per key | precision | refund |
//! |---|---|---|---|
//! | [`Gcra`] (default) | TAT and the key's latest reading, one 128-bit word updated by compare-and-swap (see [`LatestReading`]) | exact, smooth | yes (see [`Gcra`]'s `refund`) |
//! | [`Metered`] (for costs settled later) | settled TAT + permits held by requests in flight + latest reading | exact, smooth; settles exact | yes, exactly |
//! | [`FixedWindow`] | cycle + permits used + latest reading | exact per window, bursty at edges | the last slots taken |
//! | [`SlidingLog`] | one entry per admission time + latest reading | exact | yes, exactly |
//! | [`SlidingCounter`] | three counters + latest reading | approximate (see its docs) | yes, exactly |
//!
//! An algorithm never reads a clock and never does I/O: the limiter passes `now` in. Readings may
//! arrive out of order between threads; each algorithm decides a reading older than the latest
//! its key has seen as of that latest reading (GCRA as of the latest reading of the
//! [`LatestReading`] its key shares, which the readings that admit, give back or charge publish,
//! not a refusal's; the others as of the latest their key's state keeps, a refusal's too).
//! Readings beyond 2^62 ns are taken as 2^62 ns
//! (time stands still there; nothing wraps). The same transitions are implemented in Lua for the
//! Redis store, and a conformance suite holds the two to the same answers.

use std::fmt;

use crate::sync::{AtomicU64, Ordering};
use crate::{decision::Decision, Quota};

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

/// A rate limiting algorithm over an in-memory state of type [`State`](Self::State).
///
/// Implementations keep their state behind interior mutability (an atomic or a mutex), so that one
/// state can be shared by every clone of a limiter. The algorithm itself is the parameters it
/// derives from a quota: `Copy`, as a direct limiter copies it out for each decision (a read
/// that writes nothing, where a shared pointer's count or guard is written by every check).
pub trait Algorithm: Copy + fmt::Debug + Send + Sync + 'static {
    /// The state kept per key; `Default` is the state of a key never seen.
    type State: Default + fmt::Debug + Send + Sync + 'static;

    /// Builds the algorithm for `quota`; `epoch` is the limiter's creation time on its clock
    /// (window algorithms count their cycles from it).
    fn new(quota: &Quota, epoch: u64) -> Self
    where
        Self: Sized;

    /// The algorithm for `quota` that carries on from this one at `now`: a limiter whose quota
    /// changes at run time replaces its algorithm with this one and keeps every key's state, so
    /// each state this algorithm has left must keep its meaning under the result.
    ///
    /// Algorithms whose state holds instants (GCRA's TAT, the sliding log's admission times)
    /// need nothing more than [`new`](Self::new). Window algorithms count windows from an
    /// epoch; theirs must continue the count, so that the window in progress keeps its number
    /// (and its counts) across the change.
    fn with_quota(&self, quota: &Quota, now: u64) -> Self
    where
        Self: Sized;

    /// The most permits one request may ask for; more is an
    /// [`InsufficientCapacity`](crate::limiter::InsufficientCapacity) error.
    fn capacity(&self) -> u32;

    /// Decides on a request of `cost` permits at `now`, updating `state` when it is admitted.
    ///
    /// If the permits arrive within `max_wait` nanoseconds the request is admitted with a
    /// reservation ([`Decision::wait`] > 0); if later, it is refused and reserves nothing. A
    /// `now` older than the latest reading the key has seen is decided as of that reading.
    /// `latest` is the latest reading of the key's group (the keys of its shard, or a direct
    /// limiter's one key; see [`LatestReading`]): an algorithm may keep its latest reading
    /// there rather than in `state`.
    fn decide(
        &self,
        state: &Self::State,
        latest: &LatestReading,
        now: u64,
        cost: u32,
        max_wait: u64,
    ) -> Decision;

    /// Gives back `decision`, an admission of `cost` permits made by [`decide`](Self::decide)
    /// on this `state` and `latest`: a waiter that went away, or a request that another policy
    /// vetoed. The decision remembers (crate-privately) the instant its permits were charged
    /// (its own instant for an immediate admission, the instant it falls due for a reservation)
    /// and, for GCRA, the state it left; the state becomes, as far as the algorithm can tell,
    /// the one it would be had the request never been made, and no more than the request took
    /// is ever given back. See each algorithm for what it can give back.
    fn refund(
        &self,
        state: &Self::State,
        latest: &LatestReading,
        now: u64,
        cost: u32,
        decision: &Decision,
    );

    /// Charges `cost` permits at `now` whatever the key has left: what an admitted request
    /// turned out to cost beyond its estimate (see [`Limiter::settle`](crate::Limiter::settle)).
    /// Never refused: beyond what is left it is debt, which the key's next requests wait for as
    /// they would for permits it had used (GCRA's TAT runs past the burst, a window's count past
    /// its limit). The permits count from `now` (or the latest reading, if later), as a request
    /// of `cost` decided then would; no later admission is undone.
    fn charge(&self, state: &Self::State, latest: &LatestReading, now: u64, cost: u32);

    /// Settles `decision`, an admission of `estimate` permits (no more than it was decided
    /// on), which turned out to cost `cost`: see [`Limiter::settle`](crate::Limiter::settle).
    ///
    /// The default gives back `estimate − cost` by the rules of [`refund`](Self::refund), or
    /// charges what the request cost beyond its estimate, up to the
    /// [`capacity`](Self::capacity), by those of [`charge`](Self::charge).
    fn settle(
        &self,
        state: &Self::State,
        latest: &LatestReading,
        now: u64,
        decision: &Decision,
        estimate: u32,
        cost: u32,
    ) {
        if cost < estimate {
            self.refund(state, latest, now, estimate - cost, decision);
        } else {
            let debt = cost.min(self.capacity()).saturating_sub(estimate);
            if debt > 0 {
                self.charge(state, latest, now, debt);
            }
        }
    }

    /// The instant from which `state` carries no information: a key idle since then behaves as a
    /// new key, so the store may drop it without changing any decision. (The store publishes its
    /// own reading to the shard's [`LatestReading`] before it drops keys, so a reading older than
    /// the drop is decided as of it, as it would have been on the dropped state.)
    fn idle_at(&self, state: &Self::State) -> u64;

    /// How much forgetting `state` at `now` would give away; when the store is full of live keys
    /// it evicts the lowest ranks first.
    ///
    /// A key that has used its whole quota must rank above a fresh key with one request. The
    /// default is the time left until [`idle_at`](Self::idle_at); the crate's algorithms rank by
    /// the permits that still weigh on their decisions first and, among keys holding as many,
    /// keep the one that has held them longest (a flood's fresh keys go before the clients they
    /// flood: forgetting either gives away as many permits).
    fn eviction_rank(&self, state: &Self::State, now: u64) -> u128 {
        u128::from(self.idle_at(state).saturating_sub(now))
    }
}

/// The latest clock reading that a group of keys has seen: one per shard of a keyed limiter's
/// store, shared by every key of the shard, and one for a direct limiter's single key.
///
/// A reading older than a key's latest is decided as of it: a real reading that some thread
/// took, so the request is decided as if it had arrived at that instant (for a fresh reading, a
/// few microseconds later at most: the gap between two threads' readings), and a stale reading
/// admits neither more nor less than a fresh one. [`Gcra`] keeps each key's latest reading in
/// the key's state, beside its TAT in one 128-bit word, so that an admission changes both with
/// one compare-and-swap; the group's reading is the floor under every key's, which the store
/// raises to its own reading before it drops keys, so that a reading older than the drop that
/// reaches a key made afresh is decided as of the drop, as it would have been on the dropped
/// state. (With the reading one word per shard, which every admission of the shard's keys
/// published before changing its TAT, two lines moved a check: one hot key from 16 threads
/// made 0.47 of governor's checks a second, against 1.17 for the direct limiter, which already
/// kept one word; see BENCHMARKS.md.) The window algorithms, the sliding log and `Metered` keep
/// their latest reading in their own (locked) state, with the group's as the floor under it
/// (a key made afresh after a drop decides an older reading as of the drop), and never write
/// the group's.
///
/// Beside the reading, GCRA's give-backs keep the latest reading at which one of them moved a
/// key's TAT back under a later admission: from then on, an earlier admission is no longer told
/// to be its key's latest by the TAT it left (see [`Gcra`]'s refund).
#[derive(Default)]
pub struct LatestReading {
    latest: AtomicU64,
    /// The latest reading at which a GCRA give-back moved a key's TAT back while a later
    /// admission of the key stood ([`Gcra`]'s refund): from then on a TAT equal to the one an
    /// earlier admission left no longer says that admission is the key's latest (the TAT may
    /// have come back to it). Written and read only by give-backs.
    moved_back: Mark,
}

/// The latest of the readings recorded, or none: one more than it, zero for none.
#[derive(Default)]
struct Mark(AtomicU64);

impl Mark {
    /// Records `reading`, if it is the latest.
    fn record(&self, reading: u64) {
        self.0.fetch_max(reading + 1, Ordering::AcqRel);
    }

    /// Whether a reading at or after `reading` was recorded.
    fn since(&self, reading: u64) -> bool {
        self.0.load(Ordering::Acquire) > reading
    }
}

impl fmt::Debug for LatestReading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatestReading")
            .field("reading", &self.get())
            .field("moved_back", &self.moved_back.0.load(Ordering::Relaxed))
            .finish()
    }
}

impl LatestReading {
    /// The latest reading published (0 before any).
    pub fn get(&self) -> u64 {
        self.latest.load(Ordering::Acquire)
    }

    /// `now`, or this reading if later: the floor the store raises before it drops keys, so
    /// that a key made afresh decides a reading older than the drop as of it, as the dropped
    /// state would have.
    pub(crate) fn at_least(&self, now: u64) -> u64 {
        now.max(self.get())
    }

    /// Publishes `now` if it is later than the latest reading.
    pub(crate) fn publish(&self, now: u64) {
        self.latest.fetch_max(now, Ordering::AcqRel);
    }

    /// Records that a give-back at `reading` moves a key's TAT back while a later admission of
    /// the key stands; published before the TAT moves.
    pub(crate) fn moved_back(&self, reading: u64) {
        self.moved_back.record(reading);
    }

    /// Whether a give-back moved a key's TAT back at or after `reading` (see
    /// [`moved_back`](Self::moved_back)).
    pub(crate) fn moved_back_since(&self, reading: u64) -> bool {
        self.moved_back.since(reading)
    }
}

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
        let generation = self.generation + 1;
        let now = now.clamp(self.first_start, crate::clock::MAX_NOW);
        let first = self.window_of(now);
        let first_start = self.start_of(first);
        Self {
            first,
            first_start,
            next_start: first_start.saturating_add(period).max(now),
            period,
            generation,
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

/// An eviction rank (the lowest goes first): the permits still weighing first; among keys that
/// hold as many, the one whose record lasts longest (it took its permits most recently) goes
/// first, so a flood of fresh keys evicts its own keys before the established clients it floods.
fn rank(permits: u64, idle_in: u64) -> u128 {
    (u128::from(permits) << 64) | u128::from(u64::MAX - idle_in)
}
