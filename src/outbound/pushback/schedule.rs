//! When calls to one dependency may start, by what it has said: a hold, an advertised budget
//! and its window, the pacing slot, and the calls in flight.

use std::cmp::Reverse;

use super::answer::Answer;
use super::builder::Pacing;
use crate::clock::saturating_nanos;

/// When calls may start. Instants are nanoseconds of the pushback's clock.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    /// No call starts before this (a `Retry-After`).
    hold_until: u64,
    /// Calls that may still start before `window_end`; `None` while no quota is known.
    budget: Option<u64>,
    window_end: u64,
    /// The quota of each window after `window_end`, and the window's length, when the
    /// dependency advertised a policy.
    refill: Option<(u64, u64)>,
    /// Under [`Pacing::Spread`], the time between two calls, and the earliest next start.
    spacing: u64,
    next_slot: u64,
    /// Calls started through the layer and not yet answered.
    in_flight: u64,
    /// Calls started through the layer so far: the next call's place in the order of starts.
    started: u64,
    /// The answer whose quota is in force came after every call placed before this had
    /// started: an answer to one of those may have been written before it, and may only
    /// tighten it.
    in_force: u64,
}

impl Schedule {
    /// Starts the window after `window_end` if it has passed: the advertised quota, less the
    /// calls still in flight (which may land in it); with nothing known, no quota.
    pub(super) fn roll(&mut self, now: u64, pacing: Pacing) {
        if self.budget.is_some() && self.window_end <= now {
            self.spacing = 0;
            // The next window is taken to start now, which ends it no earlier than the
            // dependency's (whose window ended at `window_end` or before). When the calls in
            // flight spend its whole quota, calls wait for it to pass, unless their answers say
            // otherwise first.
            match self.refill {
                Some((quota, window)) => {
                    let budget = quota.saturating_sub(self.in_flight);
                    self.budget = Some(budget);
                    self.window_end = now.saturating_add(window.max(1));
                    // Under `Spread`, this window's calls are spread over it too.
                    if pacing == Pacing::Spread && budget > 0 {
                        self.spacing = window / budget;
                    }
                }
                None => self.budget = None,
            }
        }
    }

    pub(super) fn try_start(&mut self, now: u64, pacing: Pacing) -> Result<u64, u64> {
        if self.hold_until > now {
            return Err(self.hold_until);
        }
        self.roll(now, pacing);
        if self.budget == Some(0) {
            return Err(self.window_end);
        }
        if self.spacing > 0 && self.next_slot > now {
            return Err(self.next_slot);
        }
        if let Some(budget) = &mut self.budget {
            *budget -= 1;
        }
        self.next_slot = now.max(self.next_slot).saturating_add(self.spacing);
        self.in_flight = self.in_flight.saturating_add(1);
        let place = self.started;
        self.started = self.started.saturating_add(1);
        Ok(place)
    }

    /// A call started by [`try_start`](Self::try_start) has ended.
    pub(super) fn finish(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The earliest instant a call may start, without starting one.
    pub(super) fn free_at(&self, now: u64) -> u64 {
        let mut at = self.hold_until.max(now);
        if self.budget == Some(0) && self.window_end > now {
            at = at.max(self.window_end);
        }
        if self.spacing > 0 && self.budget.is_some() && self.window_end > now {
            at = at.max(self.next_slot);
        }
        at
    }

    pub(super) fn apply(&mut self, answer: Answer, now: u64, own: Option<u64>, pacing: Pacing) {
        if let Some(hold) = answer.hold {
            self.hold_until = self
                .hold_until
                .max(now.saturating_add(saturating_nanos(hold)));
        }
        if let Some(quota) = answer.quota {
            // Calls in flight other than this one may not have been counted in `r` yet.
            let others = self.in_flight.saturating_sub(u64::from(own.is_some()));
            let budget = quota.remaining.saturating_sub(others);
            let window = saturating_nanos(quota.window);
            let window_end = now.saturating_add(window);
            // An answer to a call that started before the one whose answer is in force may
            // have been written first: out of order, it counts only if it is more restrictive
            // (fewer calls left, or as few for longer), so that it never loosens a hold.
            self.roll(now, pacing);
            let stale = own.is_some_and(|place| place < self.in_force);
            if let (true, Some(current)) = (stale, self.budget) {
                if (budget, Reverse(window_end)) >= (current, Reverse(self.window_end)) {
                    return;
                }
            } else {
                self.in_force = self.in_force.max(own.unwrap_or(self.started));
            }
            self.budget = Some(budget);
            self.window_end = window_end;
            self.refill = quota
                .refill
                .map(|refill| (refill.calls, saturating_nanos(refill.window)));
            self.spacing = match pacing {
                Pacing::Spread if budget > 0 => window / budget,
                _ => 0,
            };
            if self.spacing == 0 {
                self.next_slot = 0;
            } else {
                // The slot a sparser pacing set is no later than one spacing of this answer.
                self.next_slot = self.next_slot.min(now.saturating_add(self.spacing));
            }
        }
    }
}
