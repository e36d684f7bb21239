use std::collections::VecDeque;
use std::time::Duration;

use super::{LatestReading, Transitions};
use crate::sync::{lock, Mutex};
use crate::{decision::Decision, Quota};

/// The sliding-window log: exact, at the price of memory.
///
/// Each key keeps the times of its admitted permits (several at one instant share an entry with a
/// count). A request is admitted at the earliest instant `t` from now at which every window of
/// length `period` that contains `t` still has room for its cost, counting every entry in it,
/// reservations included. A waiting caller's reservation is recorded at that future instant, so a
/// reservation given back leaves a hole that the next caller can take.
///
/// Guarantee: in every interval of length `period`, at most `permits` are admitted (or fall due).
/// A clock reading older than the latest one the key has seen is decided as of that latest
/// reading: entries pruned for a later reading are never forgotten by an earlier one. Memory per
/// key is O(`permits`) in the worst case (times `max_wait / period` with reservations). The burst
/// setting does not apply.
///
/// A change of quota keeps the log: every admission stays at its instant and counts in every
/// window of the new period that holds it. A longer period cannot bring back entries already
/// pruned under the shorter one.
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
    /// The latest clock reading seen; earlier readings are decided as of it.
    latest: u64,
}

impl Log {
    fn insert(&mut self, at: u64, cost: u32) {
        // No entry for no permits (a request of cost zero), as the script adds none.
        if cost == 0 {
            return;
        }
        let idx = self.entries.partition_point(|&(t, _)| t <= at);
        if idx > 0 && self.entries[idx - 1].0 == at {
            // Charges of debt can pile up on one instant: an entry saturates, and the total
            // counts what it holds.
            let entry = &mut self.entries[idx - 1].1;
            let added = cost.min(u32::MAX - *entry);
            *entry += added;
            self.total += u64::from(added);
        } else {
            self.total += u64::from(cost);
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

    /// The reading `now`, clamped to the instants the arithmetic covers and to no earlier than
    /// the latest reading seen, which it then becomes; the entries that left every window pruned.
    fn advance(&self, log: &mut Log, now: u64) -> u64 {
        let now = super::advance_latest(&mut log.latest, now);
        self.prune(log, now);
        now
    }

    /// The instant the last entry leaves every window; zero with none.
    fn idle_from(&self, log: &Log) -> u64 {
        log.entries
            .back()
            .map_or(0, |&(t, _)| t.saturating_add(self.window))
    }

    fn reset_after(&self, log: &Log, now: u64) -> Duration {
        Duration::from_nanos(self.idle_from(log).saturating_sub(now))
    }

    /// The earliest instant `t ≥ now` at which a request of `cost` fits, and the count that
    /// weighs on an admission at `now` (the fullest window containing `now`).
    ///
    /// A new entry at `t` lies in the windows `(x − W, x]` for `x` in `[t, t + W)`. Their counts
    /// change only where an entry enters (`x = e`) or leaves (`x = e + W`), so the fullest is the
    /// one ending at `t` or at an entry inside `(t, t + W)`; and the earliest feasible `t` is `now`
    /// or an instant at which an entry leaves. Candidates are swept in order with two pointers and
    /// a monotone queue of the counts ending at each entry: O(entries).
    fn earliest(&self, log: &Log, now: u64, cost: u64) -> (u64, u64) {
        let w = self.window;
        let room = self.limit - cost;
        let entries = &log.entries;
        if entries.back().is_none_or(|&(t, _)| t <= now) {
            // No reservation ahead: the window ending at `t` is the fullest.
            if log.total <= room {
                return (now, log.total);
            }
            let mut left = log.total;
            for &(t, n) in entries {
                left -= u64::from(n);
                if left <= room {
                    return (t + w, log.total);
                }
            }
            unreachable!("a cost within the limit fits once every entry has left");
        }
        let n = entries.len();
        let mut prefix = Vec::with_capacity(n + 1);
        prefix.push(0u64);
        for &(_, k) in entries {
            prefix.push(prefix[prefix.len() - 1] + u64::from(k));
        }
        // ending[i]: the count of the window (e_i − W, e_i].
        let mut ending = Vec::with_capacity(n);
        let mut lo = 0;
        for (i, &(t, _)) in entries.iter().enumerate() {
            while entries[lo].0 + w <= t {
                lo += 1;
            }
            ending.push(prefix[i + 1] - prefix[lo]);
        }
        let candidates = std::iter::once(now).chain(
            entries
                .iter()
                .map(|&(t, _)| t + w)
                .filter(move |&t| t > now),
        );
        let (mut lo, mut hi, mut up) = (0, 0, 0);
        let mut ahead: VecDeque<usize> = VecDeque::new();
        let mut need_now = None;
        for t in candidates {
            while lo < n && entries[lo].0 + w <= t {
                lo += 1;
            }
            while hi < n && entries[hi].0 <= t {
                hi += 1;
            }
            while up < n && entries[up].0 < t + w {
                while ahead.back().is_some_and(|&b| ending[b] <= ending[up]) {
                    ahead.pop_back();
                }
                ahead.push_back(up);
                up += 1;
            }
            while ahead.front().is_some_and(|&f| f < hi) {
                ahead.pop_front();
            }
            let need = (prefix[hi] - prefix[lo]).max(ahead.front().map_or(0, |&f| ending[f]));
            let need_now = *need_now.get_or_insert(need);
            if need <= room {
                return (t, need_now);
            }
        }
        unreachable!("a cost within the limit fits once every entry has left");
    }

    pub(crate) fn step(&self, log: &mut Log, now: u64, cost: u32, max_wait: u64) -> Decision {
        let now = self.advance(log, now);
        if u64::from(cost) > self.limit {
            // Never fits (the limiters check this before deciding).
            let never = Duration::from_nanos(u64::MAX);
            return Decision::refused(self.limit, 0, never, self.reset_after(log, now));
        }
        let (admit_at, need_now) = self.earliest(log, now, u64::from(cost));
        let wait = admit_at - now;
        if wait == 0 {
            log.insert(now, cost);
            let remaining = self.limit - need_now - u64::from(cost);
            return Decision::allowed(self.limit, remaining, self.reset_after(log, now))
                .charged_at(now);
        }
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
            self.limit.saturating_sub(need_now),
            Duration::from_nanos(wait),
            self.reset_after(log, now),
        )
    }

    /// Removes `cost` from the entry at `reserved_at` if it is still held: exact, whether the
    /// instant is past (an admission vetoed by another policy) or future (a waiter that went
    /// away). An entry already pruned weighs on no decision any more, so there is nothing left
    /// to give back.
    fn give_back(&self, log: &mut Log, _now: u64, cost: u32, decision: &Decision) {
        let reserved_at = decision.charged().at;
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

    /// An entry of `cost` permits at `now`: every window that holds `now` counts them, past
    /// the limit if it must.
    fn take(&self, log: &mut Log, now: u64, cost: u32) {
        log.insert(now, cost);
    }
}

impl Transitions for SlidingLog {
    type State = SlidingLogState;
    window_transitions!();

    fn new(quota: &Quota, _epoch: u64) -> Self {
        Self {
            limit: u64::from(quota.permits()),
            window: quota.period_nanos(),
        }
    }

    fn idle_at(&self, state: &SlidingLogState) -> u64 {
        let log = lock(&state.0);
        super::idle_after(log.latest, self.idle_from(&log))
    }

    fn eviction_rank(&self, state: &SlidingLogState, now: u64) -> u128 {
        let log = lock(&state.0);
        let now = super::as_of(now, log.latest);
        let gone: u64 = log
            .entries
            .iter()
            .take_while(|&&(t, _)| t.saturating_add(self.window) <= now)
            .map(|&(_, n)| u64::from(n))
            .sum();
        let idle = self.idle_from(&log).saturating_sub(now);
        super::rank(log.total - gone, idle)
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
        let admitted = (0..50)
            .filter(|_| log.decide(&st, &LatestReading::default(), 7, 1, 0).allowed)
            .count();
        assert_eq!(admitted, 10);
        let d = log.decide(&st, &LatestReading::default(), 7, 1, 0);
        assert_eq!(d.retry_after, Duration::from_secs(1));
        assert!(
            log.decide(&st, &LatestReading::default(), 1_000_000_007, 1, 0)
                .allowed
        );
    }

    #[test]
    fn refund_removes_the_reservation() {
        let q = Quota::with_period(1, Duration::from_secs(1)).unwrap();
        let log = SlidingLog::new(&q, 0);
        let st = SlidingLogState::default();
        assert!(log.decide(&st, &LatestReading::default(), 0, 1, 0).allowed);
        let r = log.decide(&st, &LatestReading::default(), 0, 1, u64::MAX);
        assert_eq!(r.wait, Duration::from_secs(1));
        log.refund(&st, &LatestReading::default(), 1, 1, &r);
        let again = log.decide(&st, &LatestReading::default(), 1, 1, u64::MAX);
        assert_eq!(again.wait, Duration::from_nanos(999_999_999));
    }
}
