//! Attacks on `DirectRateLimiter` after its rework: the quota and algorithm copied out of a
//! sequence lock (crossbeam's `AtomicCell`) on every decision, `set_quota` building the next
//! pair under a mutex (reading the clock before it takes the mutex), and GCRA's word beside the
//! latest reading in one 128-bit word. Each test names the promise it attacks.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use proptest::prelude::*;
use tower_bulwark::algorithm::{Algorithm, FixedWindow, Gcra, Metered, SlidingCounter, SlidingLog};
use tower_bulwark::clock::{Clock, ManualClock, TokioClock};
use tower_bulwark::limiter::{acquire, Decision, InsufficientCapacity, Overflow};
use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Limiter, Quota};

use crate::common::process::quiet_panics_starting_with;
use crate::common::quota_ns as quota;
use crate::common::{admitted_until_refused, paused_runtime, poll_up_to, tokio_direct_with, Rng};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// The four algorithms of `for_every_algorithm!`, as plain functions.
macro_rules! four {
    ($f:ident) => {
        [
            $f::<Gcra> as fn(),
            $f::<FixedWindow>,
            $f::<SlidingLog>,
            $f::<SlidingCounter>,
        ]
    };
}

/// The four algorithms of `for_every_algorithm!`, then `Metered`, as plain functions, for
/// [`each_reporting_all`].
macro_rules! five {
    ($f:ident) => {
        [&four!($f)[..], &[$f::<Metered> as fn()]].concat()
    };
}

/// What was `taken` and what is left now add up to `quota`.
fn assert_taken_and_left_are<A: Algorithm, C: Clock>(
    limiter: &DirectRateLimiter<A, C>,
    taken: u64,
    quota: u64,
) {
    let left = drain(limiter);
    assert_eq!(
        taken + left,
        quota,
        "{}: {taken} taken, {left} left",
        name::<A>()
    );
}

/// One `#[test]` per `name: runs`, running the runs with [`each_reporting_all`].
macro_rules! attack_tests {
    ($($(#[$attr:meta])* $name:ident: $runs:expr),* $(,)?) => {
        $(
            #[test]
            $(#[$attr])*
            fn $name() {
                each_reporting_all(&$runs);
            }
        )*
    };
}

/// Runs every one of `runs` (one per algorithm), then fails with the failures of all of them:
/// one algorithm's failure does not hide another's.
pub(crate) fn each_reporting_all(runs: &[fn()]) {
    let failures: Vec<String> = runs
        .iter()
        .filter_map(|run| {
            std::panic::catch_unwind(run).err().map(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        runs.len(),
        failures.join("\n")
    );
}

/// Spins until `counter` reaches `n`: the racing threads have started.
fn wait_until(counter: &AtomicU64, n: u64) {
    while counter.load(Ordering::Relaxed) < n {
        std::thread::yield_now();
    }
}

pub(crate) fn name<A>() -> &'static str {
    let full = std::any::type_name::<A>();
    full.rsplit("::").next().unwrap_or(full)
}

pub(crate) fn direct<A: Algorithm, C: Clock>(q: Quota, clock: C) -> DirectRateLimiter<A, C> {
    DirectRateLimiter::builder(q)
        .algorithm::<A>()
        .clock(clock)
        .build()
}

/// Checks of one permit at the current reading until one is refused: how many were admitted.
pub(crate) fn drain<A: Algorithm, C: Clock>(l: &DirectRateLimiter<A, C>) -> u64 {
    admitted_until_refused(|| l.check().allowed)
}

fn capacity<A: Algorithm, C: Clock>(l: &DirectRateLimiter<A, C>) -> u32 {
    l.check_n(u32::MAX).unwrap_err().capacity()
}

pub(crate) fn refund<A: Algorithm, C: Clock>(
    l: &DirectRateLimiter<A, C>,
    cost: u32,
    d: Decision,
) -> bool {
    Limiter::<()>::refund(l, &(), cost, d)
}

pub(crate) fn settle<A: Algorithm, C: Clock>(
    l: &DirectRateLimiter<A, C>,
    estimate: u32,
    d: Decision,
    cost: u32,
) -> bool {
    Limiter::<()>::settle(l, &(), estimate, d, cost)
}

fn reserve<A: Algorithm, C: Clock>(
    l: &DirectRateLimiter<A, C>,
    cost: u32,
) -> Result<Decision, String> {
    Limiter::<()>::reserve_now(l, &(), cost)
        .expect("an in-memory limiter answers at once")
        .map_err(|e| e.to_string())
}

pub(crate) use crate::common::dial::{read_here, Dial};

/// Whether `A` is GCRA or GCRA with held estimates (whose limit is the burst).
pub(crate) fn is_gcra<A>() -> bool {
    let n = name::<A>();
    n == "Gcra" || n == "Metered"
}

/// A keyed limiter of `u32` keys holding at most `max_keys` (one shard below 2048), full under
/// `overflow`.
pub(crate) fn keyed<A: Algorithm, C: Clock>(
    q: Quota,
    clock: C,
    max_keys: usize,
    overflow: Overflow,
) -> KeyedRateLimiter<u32, A, C> {
    KeyedRateLimiter::<u32>::builder(q)
        .algorithm::<A>()
        .clock(clock)
        .max_keys(max_keys)
        .overflow(overflow)
        .build()
}

mod coarse_refunds;
mod give_backs;
mod period;
mod races;
mod readings;
mod second;

thread_local! {
    static GATED: Cell<bool> = const { Cell::new(false) };
}

/// A manual clock that, read once by a thread that armed it, holds that thread (after the
/// reading, before it returns) until the test lets it go: a preemption at the worst moment.
#[derive(Clone)]
struct GateClock {
    time: ManualClock,
    read: Arc<Barrier>,
    go: Arc<Barrier>,
}

impl GateClock {
    fn new(time: &ManualClock) -> Self {
        Self {
            time: time.clone(),
            read: Arc::new(Barrier::new(2)),
            go: Arc::new(Barrier::new(2)),
        }
    }
}

impl Clock for GateClock {
    fn now(&self) -> u64 {
        let now = self.time.now();
        if GATED.with(|g| g.replace(false)) {
            self.read.wait();
            self.go.wait();
        }
        now
    }
}

/// Runs `gated` on a thread whose first clock reading holds it; `meanwhile` runs while it is
/// held; returns what `meanwhile` returned once `gated` finished, and what `gated` did.
fn while_held<T, R: Send>(
    clock: &GateClock,
    gated: impl FnOnce() -> R + Send,
    meanwhile: impl FnOnce() -> T,
) -> (T, R) {
    std::thread::scope(|s| {
        let handle = s.spawn(move || {
            GATED.with(|g| g.set(true));
            gated()
        });
        clock.read.wait();
        let out = meanwhile();
        clock.go.wait();
        (out, handle.join().unwrap())
    })
}
