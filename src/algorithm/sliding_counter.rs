use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::Algorithm;
use crate::{Decision, Quota};

/// The sliding-window counter: two fixed-window counters blended into an estimate.
///
/// At `e` nanoseconds into a window of length `W`, the count in the sliding window ending now is
/// estimated as `previous · (W − e) / W + current`: the previous window's count is assumed to be
/// spread evenly over it. A request is admitted if the estimate plus its cost stays within
/// `permits`. The arithmetic is exact integer arithmetic, so `retry_after` is the exact instant at
/// which the estimate admits the request.
///
/// Error bound: each fixed window admits at most `permits`, but a sliding window of length `W` may
/// hold more than `permits` when the previous window's traffic was bunched near its end (the even
/// spread assumption is wrong then). The excess is at most `previous · e / W`, so a sliding window
/// never holds `2 · permits` or more. When traffic is spread out the estimate is close to exact.
/// A waiting caller may reserve a permit in the current or the next window; a permit further away
/// is refused even within `max_wait`. The burst setting does not apply.
#[derive(Clone, Copy, Debug)]
pub struct SlidingCounter {
    limit: u64,
    window: u64,
    epoch: u64,
}

/// The per-key state of [`SlidingCounter`]: the counts of the previous, current and next window.
#[derive(Debug, Default)]
pub struct SlidingCounterState(Mutex<Counters>);

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    pub(crate) window: u64,
    pub(crate) prev: u64,
    pub(crate) curr: u64,
    /// Reservations that fall due in the next window.
    pub(crate) next: u64,
}

impl SlidingCounter {
    fn roll(&self, c: &mut Counters, now: u64) {
        let idx = now.saturating_sub(self.epoch) / self.window;
        match idx.saturating_sub(c.window) {
            0 => {}
            1 => {
                c.prev = c.curr;
                c.curr = c.next;
                c.next = 0;
            }
            2 => {
                c.prev = c.next;
                c.curr = 0;
                c.next = 0;
            }
            _ => {
                c.prev = 0;
                c.curr = 0;
                c.next = 0;
            }
        }
        c.window = c.window.max(idx);
    }

    fn window_start(&self, idx: u64) -> u64 {
        self.epoch.saturating_add(idx.saturating_mul(self.window))
    }

    /// The earliest offset into a window with counts (`prev`, `curr`) at which `cost` fits.
    fn earliest(&self, prev: u64, curr: u64, cost: u64) -> Option<u64> {
        let room = self.limit.checked_sub(curr + cost)?;
        if prev == 0 {
            return Some(0);
        }
        let w = u128::from(self.window);
        let slack = u128::from(room) * w / u128::from(prev);
        let e = w.saturating_sub(slack) as u64;
        (e < self.window).then_some(e)
    }

    /// `prev · (W − e) / W`, rounded up: the previous window's share now.
    fn carried(&self, prev: u64, e: u64) -> u64 {
        let share = u128::from(prev) * u128::from(self.window - e);
        share.div_ceil(u128::from(self.window)) as u64
    }

    /// When the counters stop weighing on any estimate: the end of the window after the last one
    /// that holds a count; zero when all are empty.
    fn idle_from(&self, c: &Counters) -> u64 {
        let windows_left = if c.next > 0 {
            3
        } else if c.curr > 0 {
            2
        } else if c.prev > 0 {
            1
        } else {
            return 0;
        };
        self.window_start(c.window + windows_left)
    }

    fn reset_after(&self, c: &Counters, now: u64) -> Duration {
        Duration::from_nanos(self.idle_from(c).saturating_sub(now))
    }

    pub(crate) fn step(&self, c: &mut Counters, now: u64, cost: u32, max_wait: u64) -> Decision {
        self.roll(c, now);
        let cost = u64::from(cost);
        let start = self.window_start(c.window);
        let e = now - start;
        let remaining = |c: &Counters| self.limit.saturating_sub(c.curr + self.carried(c.prev, e));
        let earliest_here = self.earliest(c.prev, c.curr, cost);
        if earliest_here.is_some_and(|at| at <= e) {
            c.curr += cost;
            return Decision::allowed(self.limit, remaining(c), self.reset_after(c, now));
        }
        let in_this = earliest_here.map(|at| (start + at, 0));
        let in_next = || {
            self.earliest(c.curr, c.next, cost)
                .map(|at| (start + self.window + at, 1))
        };
        let after = || {
            let at = self.earliest(c.next, 0, cost).unwrap_or(0);
            (start + 2 * self.window + at, 2)
        };
        let (admit_at, which) = in_this.or_else(in_next).unwrap_or_else(after);
        let wait = admit_at - now;
        if wait <= max_wait && which < 2 {
            if which == 0 {
                c.curr += cost;
            } else {
                c.next += cost;
            }
            return Decision::reserved(
                self.limit,
                0,
                self.reset_after(c, now),
                Duration::from_nanos(wait),
                admit_at,
            );
        }
        Decision::refused(
            self.limit,
            remaining(c),
            Duration::from_nanos(wait),
            self.reset_after(c, now),
        )
    }
}

impl Algorithm for SlidingCounter {
    type State = SlidingCounterState;

    fn new(quota: &Quota, epoch: u64) -> Self {
        Self {
            limit: u64::from(quota.permits()),
            window: quota.period_nanos(),
            epoch,
        }
    }

    fn capacity(&self) -> u32 {
        self.limit as u32
    }

    fn decide(&self, state: &SlidingCounterState, now: u64, cost: u32, max_wait: u64) -> Decision {
        let mut c = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        self.step(&mut c, now, cost, max_wait)
    }

    fn refund(&self, state: &SlidingCounterState, now: u64, cost: u32, reserved_at: u64) {
        if reserved_at <= now {
            return;
        }
        let mut c = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        self.roll(&mut c, now);
        let idx = reserved_at.saturating_sub(self.epoch) / self.window;
        let cost = u64::from(cost);
        if idx == c.window {
            c.curr = c.curr.saturating_sub(cost);
        } else if idx == c.window + 1 {
            c.next = c.next.saturating_sub(cost);
        }
    }

    fn idle_at(&self, state: &SlidingCounterState) -> u64 {
        let c = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        self.idle_from(&c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn previous_window_weighs_in_by_its_remaining_share() {
        let q = Quota::with_period(10, Duration::from_secs(1)).unwrap();
        let sc = SlidingCounter::new(&q, 0);
        let st = SlidingCounterState::default();
        for _ in 0..10 {
            assert!(sc.decide(&st, S / 2, 1, 0).allowed);
        }
        let d = sc.decide(&st, S / 2, 1, 0);
        assert!(!d.allowed);
        // Next window: prev = 10; one more fits when 10·(W−e)/W ≤ 9, at e = W/10.
        assert_eq!(d.retry_after, Duration::from_millis(600));
        assert!(!sc.decide(&st, S + S / 10 - 1, 1, 0).allowed);
        assert!(sc.decide(&st, S + S / 10, 1, 0).allowed);
    }
}
