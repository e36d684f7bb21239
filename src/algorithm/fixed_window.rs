use crate::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::Algorithm;
use crate::{Decision, Quota};

/// Fixed windows with Resilience4j's cycle semantics.
///
/// Time is cut into cycles of `period` counted from the limiter's creation, and each cycle brings
/// `permits` permissions (Resilience4j's `limitForPeriod` per `limitRefreshPeriod`). Idle cycles
/// never build up more than `permits`. A caller willing to wait reserves a permission of a future
/// cycle, so the available count can go below zero: that debt is paid by the next cycles.
///
/// Guarantee: no cycle admits (or has fall due in it) more than `permits`. Its weakness is the
/// edge: `permits` at the end of one cycle and `permits` at the start of the next are `2 · permits`
/// within a short span. The burst setting does not apply.
#[derive(Clone, Copy, Debug)]
pub struct FixedWindow {
    limit: u64,
    period: u64,
    epoch: u64,
}

/// The per-key state of [`FixedWindow`]: the last cycle seen and the permissions used in it.
#[derive(Debug, Default)]
pub struct FixedWindowState(Mutex<Window>);

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) cycle: u64,
    /// Permissions taken in `cycle`; above `limit` it is debt owed by the next cycles.
    pub(crate) used: u64,
}

impl FixedWindow {
    fn cycle_of(&self, now: u64) -> u64 {
        now.saturating_sub(self.epoch) / self.period
    }

    fn cycle_start(&self, cycle: u64) -> u64 {
        self.epoch.saturating_add(cycle.saturating_mul(self.period))
    }

    fn refresh(&self, w: &mut Window, now: u64) {
        let cycle = self.cycle_of(now);
        if cycle > w.cycle {
            let granted = (cycle - w.cycle).saturating_mul(self.limit);
            w.used = w.used.saturating_sub(granted);
            w.cycle = cycle;
        }
    }

    /// Time from `now` until `cycles_needed` more cycles have started (the first at the next cycle
    /// boundary).
    fn until_cycles(&self, cycle: u64, now: u64, cycles_needed: u64) -> u64 {
        if cycles_needed == 0 {
            return 0;
        }
        self.cycle_start(cycle + cycles_needed) - now
    }

    pub(crate) fn step(&self, w: &mut Window, now: u64, cost: u32, max_wait: u64) -> Decision {
        self.refresh(w, now);
        let cost = u64::from(cost);
        let cycle = w.cycle;
        let reset = |used: u64| {
            Duration::from_nanos(self.until_cycles(cycle, now, used.div_ceil(self.limit)))
        };
        if w.used + cost <= self.limit {
            w.used += cost;
            return Decision::allowed(self.limit, self.limit - w.used, reset(w.used));
        }
        let cycles = (w.used + cost - self.limit).div_ceil(self.limit);
        let wait = self.until_cycles(cycle, now, cycles);
        if wait <= max_wait {
            w.used += cost;
            return Decision::reserved(
                self.limit,
                0,
                reset(w.used),
                Duration::from_nanos(wait),
                now + wait,
            );
        }
        Decision::refused(
            self.limit,
            self.limit.saturating_sub(w.used),
            Duration::from_nanos(wait),
            reset(w.used),
        )
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    fn new(quota: &Quota, epoch: u64) -> Self {
        Self {
            limit: u64::from(quota.permits()),
            period: quota.period_nanos(),
            epoch,
        }
    }

    fn capacity(&self) -> u32 {
        self.limit as u32
    }

    fn decide(&self, state: &FixedWindowState, now: u64, cost: u32, max_wait: u64) -> Decision {
        let mut w = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        self.step(&mut w, now, cost, max_wait)
    }

    fn refund(&self, state: &FixedWindowState, now: u64, cost: u32, reserved_at: u64) {
        let mut w = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        self.refresh(&mut w, now);
        if reserved_at > now {
            w.used = w.used.saturating_sub(u64::from(cost));
        }
    }

    fn idle_at(&self, state: &FixedWindowState) -> u64 {
        let w = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        if w.used == 0 {
            0
        } else {
            self.cycle_start(w.cycle + w.used.div_ceil(self.limit))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn resilience4j_cycles_and_debt() {
        let q = Quota::per_second(2).unwrap();
        let fw = FixedWindow::new(&q, 0);
        let st = FixedWindowState::default();
        assert!(fw.decide(&st, S / 2, 1, 0).allowed);
        assert!(fw.decide(&st, S / 2, 1, 0).allowed);
        let refused = fw.decide(&st, S / 2, 1, 0);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Duration::from_millis(500));
        // Waiting up to 2 s: two permits of the next cycle and then of the one after.
        let a = fw.decide(&st, S / 2, 2, 2 * S);
        assert_eq!(a.wait, Duration::from_millis(500));
        let b = fw.decide(&st, S / 2, 1, 2 * S);
        assert_eq!(b.wait, Duration::from_millis(1500));
        // Idle cycles never build a burst above the limit.
        let idle = FixedWindowState::default();
        fw.decide(&idle, 10 * S, 1, 0);
        let d = fw.decide(&idle, 10 * S, 1, 0);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert!(!fw.decide(&idle, 10 * S, 1, 0).allowed);
    }
}
