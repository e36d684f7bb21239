//! Events and hooks: what a bulkhead reports as calls come and go.
//!
//! A hook is a closure that takes the event:
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use tower_bulwark::bulkhead::{Bulkhead, CallFinished, CallRejected};
//!
//! let refused = Arc::new(AtomicU64::new(0));
//! let counter = refused.clone();
//! let bulkhead = Bulkhead::semaphore("payment", 2)
//!     .on_call_rejected(move |_: &CallRejected<'_>| {
//!         counter.fetch_add(1, Ordering::Relaxed);
//!     })
//!     .on_call_finished(|event: &CallFinished<'_>| {
//!         println!("{} call took {:?}", event.bulkhead, event.duration);
//!     })
//!     .build();
//! # drop(bulkhead);
//! ```
//!
//! Hooks run on the caller's task, synchronously, and must be quick and must not panic. Their
//! order is fixed: `on_call_permitted` runs after the permit is taken and `on_call_finished` runs
//! before it is given back, so a gauge raised by the first and lowered by the second never reads
//! more than the limit.

use std::fmt;
use std::time::Duration;

/// How a permitted call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CallOutcome {
    /// The inner service answered with `Ok` (and, when the body is held, the body was read to its
    /// end: its last frame, its trailers, or the bytes its `Content-Length` announced, after
    /// which hyper drops a body without polling it again).
    Success,
    /// The inner service answered with `Err` (or the held body failed).
    Failure,
    /// The inner service panicked while it was being called or polled.
    Panicked,
    /// The call was dropped before it ended, for example by a timeout layer above the bulkhead,
    /// or the held body was dropped before its end.
    Cancelled,
}

/// Why a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rejection {
    /// No permit was free and the call could not wait: waiting is off, or the queue was full.
    NoCapacity,
    /// The call waited the whole `max_wait` without getting a permit.
    WaitElapsed,
}

/// A call got a permit and is about to reach the inner service.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct CallPermitted<'a> {
    /// The name of the bulkhead.
    pub bulkhead: &'a str,
    /// How long the call waited for its permit (zero when one was free at once).
    pub waited: Duration,
}

/// A call was refused with [`BulkheadFull`](super::BulkheadFull).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct CallRejected<'a> {
    /// The name of the bulkhead.
    pub bulkhead: &'a str,
    /// Why the call was refused.
    pub reason: Rejection,
}

/// A permitted call ended and is about to give its permit back.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct CallFinished<'a> {
    /// The name of the bulkhead.
    pub bulkhead: &'a str,
    /// How long the permit was held, from the moment it was granted.
    pub duration: Duration,
    /// How the call ended.
    pub outcome: CallOutcome,
}

/// Hook run when a call gets a permit, after the permit is taken.
pub(crate) type OnCallPermitted = Box<dyn Fn(&CallPermitted<'_>) + Send + Sync>;
/// Hook run when a call is refused.
pub(crate) type OnCallRejected = Box<dyn Fn(&CallRejected<'_>) + Send + Sync>;
/// Hook run when a permitted call ends, before its permit is given back.
pub(crate) type OnCallFinished = Box<dyn Fn(&CallFinished<'_>) + Send + Sync>;

/// The hooks of one bulkhead, each kind run in the order it was added; the kinds left out cost
/// a branch and nothing else.
#[derive(Default)]
pub(crate) struct Hooks {
    pub(crate) permitted: Vec<OnCallPermitted>,
    pub(crate) rejected: Vec<OnCallRejected>,
    pub(crate) finished: Vec<OnCallFinished>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("on_call_permitted", &self.permitted.len())
            .field("on_call_rejected", &self.rejected.len())
            .field("on_call_finished", &self.finished.len())
            .finish()
    }
}

/// A view of a bulkhead's state and counters.
///
/// The figures are read one after the other, so while calls come and go they may come from
/// instants a few nanoseconds apart, but they add up: `total_finished` is never above
/// `total_permitted`, and the free permits plus the calls in flight (`total_permitted -
/// total_finished`) are never above the limit, but for calls still in flight from before the
/// limit was lowered below them. While no call is in flight, `total_permitted` equals
/// `total_finished` and every permit is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BulkheadSnapshot {
    /// Permits free right now.
    pub available_concurrent_calls: usize,
    /// The current limit of concurrent calls.
    pub max_allowed_concurrent_calls: usize,
    /// Calls waiting for a permit.
    pub queue_depth: usize,
    /// Calls permitted since the bulkhead was built.
    pub total_permitted: u64,
    /// Calls refused since the bulkhead was built.
    pub total_rejected: u64,
    /// Permitted calls that have ended since the bulkhead was built.
    pub total_finished: u64,
}
