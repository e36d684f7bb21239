//! Rate limiting algorithms: pure state transitions from (state, now, cost) to a [`Decision`].
//!
//! | algorithm | state per key | precision | refund of a dropped waiter |
//! |---|---|---|---|
//! | [`Gcra`] (default) | one `u64`, updated by compare-and-swap | exact, smooth | yes |
//! | [`FixedWindow`] | cycle + permits used | exact per window, bursty at edges | yes |
//! | [`SlidingLog`] | one entry per admission time | exact | yes |
//! | [`SlidingCounter`] | three counters | approximate (see its docs) | yes, within its windows |
//!
//! An algorithm never reads a clock and never does I/O: the limiter passes `now` in. The same
//! transitions are implemented in Lua for the Redis store, and a conformance suite holds the two
//! to the same answers.

use std::fmt;

use crate::{Decision, Quota};

mod fixed_window;
mod gcra;
mod sliding_counter;
mod sliding_log;

pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::Gcra;
pub use sliding_counter::{SlidingCounter, SlidingCounterState};
pub use sliding_log::{SlidingLog, SlidingLogState};

/// A rate limiting algorithm over an in-memory state of type [`State`](Self::State).
///
/// Implementations keep their state behind interior mutability (an atomic or a mutex), so that one
/// state can be shared by every clone of a limiter.
pub trait Algorithm: fmt::Debug + Send + Sync + 'static {
    /// The state kept per key; `Default` is the state of a key never seen.
    type State: Default + fmt::Debug + Send + Sync + 'static;

    /// Builds the algorithm for `quota`; `epoch` is the limiter's creation time on its clock
    /// (window algorithms count their cycles from it).
    fn new(quota: &Quota, epoch: u64) -> Self
    where
        Self: Sized;

    /// The most permits one request may ask for; more is an
    /// [`InsufficientCapacity`](crate::InsufficientCapacity) error.
    fn capacity(&self) -> u32;

    /// Decides on a request of `cost` permits at `now`, updating `state` when it is admitted.
    ///
    /// If the permits arrive within `max_wait` nanoseconds the request is admitted with a
    /// reservation ([`Decision::wait`] > 0); if later, it is refused and reserves nothing.
    fn decide(&self, state: &Self::State, now: u64, cost: u32, max_wait: u64) -> Decision;

    /// Gives back a reservation made by [`decide`](Self::decide) whose caller went away before it
    /// fell due.
    fn refund(&self, state: &Self::State, now: u64, cost: u32, reserved_at: u64);

    /// The instant from which `state` carries no information: a key idle since then behaves as a
    /// new key, so the store may drop it without changing any decision.
    fn idle_at(&self, state: &Self::State) -> u64;
}
