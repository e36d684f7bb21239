use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::Algorithm;
use crate::{Decision, Quota};

/// The sliding-window log: exact, at the price of memory.
///
/// Each key keeps the times of its admitted permits (several at one instant share an entry with a
/// count). A request is admitted if the permits with times in the last `period`, plus its own cost,
/// stay within `permits`. A waiting caller's reservation is recorded at the future instant it is
/// admitted.
///
/// Guarantee: in every interval of length `period`, at most `permits` are admitted. Memory per key
/// is O(`permits`) in the worst case. The burst setting does not apply.
#[derive(Clone, Copy, Debug)]
pub struct SlidingLog {
    limit: u64,
    window: u64,
}

/// The per-key state of [`SlidingLog`]: admission times with their counts, oldest first.
#[derive(Debug, Default)]
pub struct SlidingLogState(Mutex<Log>);

#[derive(Debug, Default)]
pub(crate) struct Log {
    entries: VecDeque<(u64, u32)>,
    total: u64,
}

impl Log {
    fn insert(&mut self, at: u64, cost: u32) {
        self.total += u64::from(cost);
        let idx = self.entries.partition_point(|&(t, _)| t <= at);
        if idx > 0 && self.entries[idx - 1].0 == at {
            self.entries[idx - 1].1 += cost;
        } else {
            self.entries.insert(idx, (at, cost));
        }
    }
}

impl SlidingLog {
    fn prune(&self, log: &mut Log, now: u64) {
        while let Some(&(t, n)) = log.entries.front() {
            if t.saturating_add(self.window) > now {
                break;
            }
            log.entries.pop_front();
            log.total -= u64::from(n);
        }
    }

    fn reset_after(&self, log: &Log, now: u64) -> Duration {
        let last = log
            .entries
            .back()
            .map_or(0, |&(t, _)| t.saturating_add(self.window));
        Duration::from_nanos(last.saturating_sub(now))
    }

    pub(crate) fn step(&self, log: &mut Log, now: u64, cost: u32, max_wait: u64) -> Decision {
        self.prune(log, now);
        if log.total + u64::from(cost) <= self.limit {
            log.insert(now, cost);
            return Decision::allowed(
                self.limit,
                self.limit - log.total,
                self.reset_after(log, now),
            );
        }
        // The request fits once enough of the oldest permits have left the window.
        let excess = log.total + u64::from(cost) - self.limit;
        let mut freed = 0;
        let mut admit_at = now;
        for &(t, n) in &log.entries {
            freed += u64::from(n);
            if freed >= excess {
                admit_at = t.saturating_add(self.window);
                break;
            }
        }
        let wait = admit_at.saturating_sub(now);
        if wait <= max_wait {
            log.insert(admit_at, cost);
            return Decision::reserved(
                self.limit,
                0,
                self.reset_after(log, now),
                Duration::from_nanos(wait),
                admit_at,
            );
        }
        Decision::refused(
            self.limit,
            self.limit.saturating_sub(log.total),
            Duration::from_nanos(wait),
            self.reset_after(log, now),
        )
    }
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;

    fn new(quota: &Quota, _epoch: u64) -> Self {
        Self {
            limit: u64::from(quota.permits()),
            window: quota.period_nanos(),
        }
    }

    fn capacity(&self) -> u32 {
        self.limit as u32
    }

    fn decide(&self, state: &SlidingLogState, now: u64, cost: u32, max_wait: u64) -> Decision {
        let mut log = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        self.step(&mut log, now, cost, max_wait)
    }

    fn refund(&self, state: &SlidingLogState, now: u64, cost: u32, reserved_at: u64) {
        if reserved_at <= now {
            return;
        }
        let mut log = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        let idx = log.entries.partition_point(|&(t, _)| t < reserved_at);
        if let Some(entry) = log.entries.get_mut(idx).filter(|e| e.0 == reserved_at) {
            let taken = entry.1.min(cost);
            entry.1 -= taken;
            if entry.1 == 0 {
                log.entries.remove(idx);
            }
            log.total -= u64::from(taken);
        }
    }

    fn idle_at(&self, state: &SlidingLogState) -> u64 {
        let log = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        log.entries
            .back()
            .map_or(0, |&(t, _)| t.saturating_add(self.window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_request_in_one_instant() {
        let q = Quota::with_period(10, Duration::from_secs(1)).unwrap();
        let log = SlidingLog::new(&q, 0);
        let st = SlidingLogState::default();
        let admitted = (0..50).filter(|_| log.decide(&st, 7, 1, 0).allowed).count();
        assert_eq!(admitted, 10);
        let d = log.decide(&st, 7, 1, 0);
        assert_eq!(d.retry_after, Duration::from_secs(1));
        assert!(log.decide(&st, 1_000_000_007, 1, 0).allowed);
    }

    #[test]
    fn refund_removes_the_reservation() {
        let q = Quota::with_period(1, Duration::from_secs(1)).unwrap();
        let log = SlidingLog::new(&q, 0);
        let st = SlidingLogState::default();
        assert!(log.decide(&st, 0, 1, 0).allowed);
        let r = log.decide(&st, 0, 1, u64::MAX);
        assert_eq!(r.wait, Duration::from_secs(1));
        log.refund(&st, 1, 1, r.reserved_at);
        let again = log.decide(&st, 1, 1, u64::MAX);
        assert_eq!(again.wait, Duration::from_nanos(999_999_999));
    }
}
