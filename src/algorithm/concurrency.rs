//! Requests in flight per key: not a rate, a count of slots that each admitted request holds
//! until its response ends. Only [`Policy::concurrent`](crate::rate_limit::Policy::concurrent)
//! builds a limiter on it, with the hold that gives each slot back.

use std::time::Duration;

use super::{LatestReading, Transitions};
use crate::decision::{Decision, Hold};
use crate::sync::{AtomicU64, Ordering};
use crate::Quota;

/// At most `limit` slots taken per key at once (the quota's burst); time plays no part. A change
/// of quota keeps the slots taken: the new limit counts them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Concurrency {
    limit: u32,
}

/// What a refusal says to wait: a slot frees when a request in flight ends, which nothing here
/// can tell, so one second, the least `Retry-After` says.
const RETRY: Duration = Duration::from_secs(1);

/// The slots a key's requests hold.
#[derive(Debug, Default)]
pub(crate) struct InFlight(AtomicU64);

impl Transitions for Concurrency {
    type State = InFlight;

    fn new(quota: &Quota, _epoch: u64) -> Self {
        Self {
            limit: quota.burst(),
        }
    }

    fn capacity(&self) -> u32 {
        self.limit
    }

    /// Takes `cost` slots if that many are free (a request never waits for a slot).
    fn decide(
        &self,
        state: &InFlight,
        _latest: &LatestReading,
        now: u64,
        cost: u32,
        _max_wait: u64,
    ) -> Decision {
        let limit = u64::from(self.limit);
        let taken = state
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(u64::from(cost)).filter(|&n| n <= limit)
            });
        match taken {
            Ok(held) => {
                let left = limit - held - u64::from(cost);
                Decision::allowed(limit, left, Duration::ZERO)
                    .charged_at(now)
                    .holding(Hold::Slots)
            }
            // A refusal of slots says so too, for the headers (it holds nothing, and a refusal
            // gives nothing back).
            Err(held) => Decision::refused(limit, limit.saturating_sub(held), RETRY, RETRY)
                .holding(Hold::Slots),
        }
    }

    /// Frees `cost` of the slots the admission took (its token gives them back once).
    fn refund(
        &self,
        state: &InFlight,
        _latest: &LatestReading,
        _now: u64,
        cost: u32,
        _decision: &Decision,
    ) {
        let _ = state
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(u64::from(cost)))
            });
    }

    /// A slot has no debt: a request in flight holds its slots, whatever it costs.
    fn charge(&self, _: &InFlight, _: &LatestReading, _: u64, _: u32) {}

    /// A slot has no cost to settle: whatever cost is named, every slot the admission took goes
    /// back (`estimate` is all of them, see [`Decision::refundable`]).
    fn settle(
        &self,
        state: &InFlight,
        latest: &LatestReading,
        now: u64,
        decision: &Decision,
        estimate: u32,
        _cost: u32,
    ) {
        self.refund(state, latest, now, estimate, decision);
    }

    /// A key holding no slot is a fresh key; one holding any is never dropped as idle.
    fn idle_at(&self, state: &InFlight) -> u64 {
        if state.0.load(Ordering::Acquire) == 0 {
            0
        } else {
            u64::MAX
        }
    }

    /// Keys holding more slots go last.
    fn eviction_rank(&self, state: &InFlight, _now: u64) -> u128 {
        super::rank(state.0.load(Ordering::Acquire), 0)
    }
}
