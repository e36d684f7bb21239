//! What every algorithm does, the crate's side of [`Algorithm`](super::Algorithm): its
//! transitions on a key's state, and the latest reading of a group of keys they decide as of.
//! Sealed: an algorithm's give-back needs what the crate's decisions record, and each has a Lua
//! twin for Redis that the conformance suite holds to the same answers.

use std::fmt;

use crate::sync::{AtomicU64, Ordering};
use crate::{decision::Decision, Quota};

/// A rate limiting algorithm over an in-memory state of type [`State`](Self::State).
///
/// Implementations keep their state behind interior mutability (an atomic or a mutex), so that one
/// state can be shared by every clone of a limiter. The algorithm itself is the parameters it
/// derives from a quota: `Copy`, as a direct limiter copies it out for each decision (a read
/// that writes nothing, where a shared pointer's count or guard is written by every check).
pub trait Transitions: Copy + fmt::Debug + Send + Sync + 'static {
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
        Self: Sized,
    {
        Self::new(quota, now)
    }

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
            let debt = super::settle_debt(estimate, cost, self.capacity());
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
    /// A key that has used its whole quota must rank above a fresh key with one request: each
    /// algorithm ranks by the permits that still weigh on its decisions first and, where its
    /// state can tell, keeps among keys holding as many the one that has held them longest;
    /// between equal ranks the store keeps the key it made first (a flood's fresh keys go before
    /// the clients they flood: forgetting either gives away as many permits).
    fn eviction_rank(&self, state: &Self::State, now: u64) -> u128;
}

/// The latest clock reading that a group of keys has seen: one per shard of a keyed limiter's
/// store, shared by every key of the shard, and one for a direct limiter's single key.
///
/// A reading older than a key's latest is decided as of it: a real reading that some thread
/// took, so the request is decided as if it had arrived at that instant (for a fresh reading, a
/// few microseconds later at most: the gap between two threads' readings), and a stale reading
/// admits neither more nor less than a fresh one. [`Gcra`](super::Gcra) keeps each key's latest reading in
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
/// to be its key's latest by the TAT it left (see [`Gcra`](super::Gcra)'s refund).
#[derive(Default)]
pub struct LatestReading {
    latest: AtomicU64,
    /// The latest reading at which a GCRA give-back moved a key's TAT back while a later
    /// admission of the key stood ([`Gcra`](super::Gcra)'s refund): from then on a TAT equal to the one an
    /// earlier admission left no longer says that admission is the key's latest (the TAT may
    /// have come back to it). Written and read only by give-backs.
    /// One more than that reading, zero for none.
    moved_back: AtomicU64,
}

impl fmt::Debug for LatestReading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatestReading")
            .field("reading", &self.get())
            .field("moved_back", &self.moved_back.load(Ordering::Relaxed))
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

    /// Publishes `now` (no later than [`MAX_NOW`](crate::clock::MAX_NOW), where the
    /// algorithms' readings stand still) if it is later than the latest reading.
    pub(crate) fn publish(&self, now: u64) {
        let now = now.min(crate::clock::MAX_NOW);
        self.latest.fetch_max(now, Ordering::AcqRel);
    }

    /// Records that a give-back at `reading` moves a key's TAT back while a later admission of
    /// the key stands; published before the TAT moves.
    pub(crate) fn moved_back(&self, reading: u64) {
        self.moved_back.fetch_max(reading + 1, Ordering::AcqRel);
    }

    /// Whether a give-back moved a key's TAT back at or after `reading` (see
    /// [`moved_back`](Self::moved_back)).
    pub(crate) fn moved_back_since(&self, reading: u64) -> bool {
        self.moved_back.load(Ordering::Acquire) > reading
    }
}
