//! When calls to one dependency may start, by what it has said: a hold, an advertised budget
//! and its window, the pacing slot, and the calls in flight.

use super::answer::{AdvertisedQuota, Answer};
use super::builder::Pacing;
use crate::clock::saturating_nanos;

/// The quota of every window after the advertised one, in the clock's nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Refill {
    calls: u64,
    window: u64,
}

impl Refill {
    /// The stricter of two refills, field by field: the fewer calls, over the longer window.
    /// A refill is stricter than none (without one, calls go freely after the window).
    fn stricter(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(Self {
                calls: a.calls.min(b.calls),
                window: a.window.max(b.window),
            }),
            (a, b) => a.or(b),
        }
    }
}

/// When calls may start. Instants are nanoseconds of the pushback's clock.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    /// No call starts before this (a `Retry-After`). Only a later hold changes it.
    hold_until: u64,
    /// No call starts before this: an older answer said nothing was left until then. Part of
    /// the quota in force, which a newer answer replaces.
    spent_until: u64,
    /// Calls that may still start before `window_end`; `None` while no quota is known.
    budget: Option<u64>,
    window_end: u64,
    /// The quota of each window after `window_end`, when the dependency advertised a policy.
    refill: Option<Refill>,
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
    fn roll(&mut self, now: u64, pacing: Pacing) {
        if self.budget.is_some() && self.window_end <= now {
            self.spacing = 0;
            // The next window is taken to start now, which ends it no earlier than the
            // dependency's (whose window ended at `window_end` or before). When the calls in
            // flight spend its whole quota, calls wait for it to pass, unless their answers say
            // otherwise first.
            match self.refill {
                Some(refill) => {
                    let budget = refill.calls.saturating_sub(self.in_flight);
                    self.budget = Some(budget);
                    self.window_end = now.saturating_add(refill.window.max(1));
                    // Under `Spread`, this window's calls are spread over it too.
                    if pacing == Pacing::Spread && budget > 0 {
                        self.spacing = refill.window / budget;
                    }
                }
                None => self.budget = None,
            }
        }
    }

    /// The earliest instant a call may start, as a call would find it: a window that has
    /// passed gives way to the next one first, unless a hold lasts (then the next window starts
    /// when the hold ends, as the first call after it finds it).
    pub(super) fn next_start(&mut self, now: u64, pacing: Pacing) -> u64 {
        if self.hold_until.max(self.spent_until) <= now {
            self.roll(now, pacing);
        }
        self.free_at(now)
    }

    /// Starts a call now and returns its place in the order of starts, or returns the earliest
    /// instant one may start: the same instant [`next_start`](Self::next_start) gives, whichever
    /// of the hold, the spent quota or the pacing ends last.
    pub(super) fn try_start(&mut self, now: u64, pacing: Pacing) -> Result<u64, u64> {
        let at = self.next_start(now, pacing);
        if at > now {
            return Err(at);
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
        let mut at = self.hold_until.max(self.spent_until).max(now);
        if self.budget == Some(0) && self.window_end > now {
            at = at.max(self.window_end);
        }
        if self.spacing > 0 && self.budget.is_some() && self.window_end > now {
            at = at.max(self.next_slot);
        }
        at
    }

    /// Records an answer at `now`; `own` is the place of the call it answers, `None` for one
    /// obtained elsewhere (taken as newer than every call started).
    pub(super) fn apply(&mut self, answer: Answer, now: u64, own: Option<u64>, pacing: Pacing) {
        if let Some(hold) = answer.hold {
            self.hold_until = self
                .hold_until
                .max(now.saturating_add(saturating_nanos(hold)));
        }
        let Some(quota) = answer.quota else {
            return;
        };
        self.roll(now, pacing);
        // Calls in flight other than this one may not have been counted in `r` yet.
        let others = self.in_flight.saturating_sub(u64::from(own.is_some()));
        let advertised = Advertised {
            budget: quota.remaining.saturating_sub(others),
            window: saturating_nanos(quota.window),
            window_end: now.saturating_add(saturating_nanos(quota.window)),
            refill: refill_of(&quota),
        };
        // An answer to a call that started before the one whose answer is in force may have
        // been written first: out of order, it may only tighten what is in force.
        if own.is_some_and(|place| place < self.in_force) {
            self.tighten(&advertised, now, pacing);
        } else {
            self.in_force = self.in_force.max(own.unwrap_or(self.started));
            self.replace(&advertised, now, pacing);
        }
    }

    /// A newer answer's quota replaces the one in force.
    fn replace(&mut self, advertised: &Advertised, now: u64, pacing: Pacing) {
        self.spent_until = 0;
        self.budget = Some(advertised.budget);
        self.window_end = advertised.window_end;
        self.refill = advertised.refill;
        self.spacing = advertised.spacing(pacing);
        if self.spacing == 0 {
            self.next_slot = 0;
        } else {
            // The slot a sparser pacing set is no later than one spacing of this answer.
            self.next_slot = self.next_slot.min(now.saturating_add(self.spacing));
        }
    }

    /// An older answer's quota tightens the one in force, field by field: never more calls
    /// left, never a shorter window, never a looser refill or pacing.
    fn tighten(&mut self, advertised: &Advertised, now: u64, pacing: Pacing) {
        let Some(budget) = self.budget else {
            // No quota in force: any is stricter than none. What an older answer spent stays.
            let spent_until = self.spent_until;
            self.replace(advertised, now, pacing);
            self.spent_until = spent_until;
            return;
        };
        if advertised.budget == 0 {
            // Nothing left until its window ends, and then the quota in force as it stands:
            // kept as an instant of its own, so that a window in force that ends later keeps
            // its budget after it.
            self.spent_until = self.spent_until.max(advertised.window_end);
        } else {
            self.budget = Some(budget.min(advertised.budget));
            self.window_end = self.window_end.max(advertised.window_end);
            self.spacing = self.spacing.max(advertised.spacing(pacing));
        }
        self.refill = Refill::stricter(self.refill, advertised.refill);
    }
}

/// An advertised quota as the schedule counts it: the calls left to this client (less those
/// in flight), in the clock's nanoseconds.
struct Advertised {
    budget: u64,
    window: u64,
    window_end: u64,
    refill: Option<Refill>,
}

impl Advertised {
    /// The time between two calls under `pacing`.
    fn spacing(&self, pacing: Pacing) -> u64 {
        match pacing {
            Pacing::Spread if self.budget > 0 => self.window / self.budget,
            _ => 0,
        }
    }
}

fn refill_of(quota: &AdvertisedQuota) -> Option<Refill> {
    quota.refill.map(|refill| Refill {
        calls: refill.calls,
        window: saturating_nanos(refill.window),
    })
}
