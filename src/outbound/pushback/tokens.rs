//! What a dependency said of its tokens (OpenAI's and Anthropic's token families), and what
//! calls took of them since: a call of N tokens (see
//! [`PushbackLayer::cost_by`](super::PushbackLayer::cost_by)) starts once N are left.

use std::time::Duration;

use crate::clock::saturating_nanos;

/// A limit of tokens as one answer states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TokenQuota {
    pub(crate) remaining: u64,
    /// The family's limit, when the answer sends it: the tokens come back at an even pace
    /// until the reset, where the limit is whole again.
    pub(crate) limit: Option<u64>,
    pub(crate) resets_in: Duration,
}

/// The tokens the schedule counts on. Instants are nanoseconds of the pushback's clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct TokenRecord {
    /// Tokens left when the answer came, less those of the other calls in flight then (the
    /// dependency may not have counted them yet).
    left: u64,
    /// Tokens taken since by calls started from place `from` on.
    taken: u64,
    from: u64,
    limit: Option<u64>,
    at: u64,
    full_at: u64,
}

impl TokenRecord {
    /// What `quota`, received at `now`, leaves when the other calls in flight hold
    /// `in_flight` tokens; calls from place `from` on count against it.
    pub(super) fn new(quota: TokenQuota, now: u64, in_flight: u64, from: u64) -> Self {
        Self {
            left: quota.remaining.saturating_sub(in_flight),
            taken: 0,
            from,
            limit: quota.limit,
            at: now,
            full_at: now.saturating_add(saturating_nanos(quota.resets_in)),
        }
    }

    /// Whether the record still says anything at `now`: past the reset, the limit is whole.
    pub(super) fn lasts(&self, now: u64) -> bool {
        now < self.full_at
    }

    /// The tokens that have come back by `now`, at an even pace over the span to the reset. A
    /// reading older than the answer (taken before another thread recorded it) finds none back.
    fn refill(&self, now: u64) -> u64 {
        match self.limit {
            Some(limit) if limit > self.left && self.full_at > self.at => {
                let span = u128::from(self.full_at - self.at);
                let elapsed = now.min(self.full_at).saturating_sub(self.at);
                let back = u128::from(limit - self.left) * u128::from(elapsed);
                u64::try_from(back / span).unwrap_or(u64::MAX)
            }
            _ => 0,
        }
    }

    /// The tokens a call may take at `now` (`now` no earlier than the answer).
    pub(super) fn available(&self, now: u64) -> u64 {
        if !self.lasts(now) {
            return u64::MAX;
        }
        (self.left.saturating_add(self.refill(now))).saturating_sub(self.taken)
    }

    /// The earliest instant from `now` at which a call of `cost` tokens may start: when enough
    /// have come back, or at the reset. A call that takes none waits while none are left.
    pub(super) fn free_at(&self, now: u64, cost: u64) -> u64 {
        let cost = cost.max(1);
        if self.available(now) >= cost {
            return now;
        }
        match self.limit {
            Some(limit) if limit > self.left => {
                // The least `t` with refill(t) ≥ need, rounded up so that `available` agrees.
                let need = u128::from(cost.saturating_add(self.taken) - self.left);
                let span = u128::from(self.full_at - self.at);
                let after = (need * span).div_ceil(u128::from(limit - self.left));
                let at = self
                    .at
                    .saturating_add(u64::try_from(after).unwrap_or(u64::MAX));
                at.clamp(now, self.full_at)
            }
            _ => self.full_at,
        }
    }

    /// A call started now (so after every call placed before `from`) took `cost` tokens.
    pub(super) fn take(&mut self, cost: u64) {
        self.taken = self.taken.saturating_add(cost);
    }

    /// A call started at place `place` was refused below, unsent: its tokens come back.
    pub(super) fn give_back(&mut self, place: u64, cost: u64) {
        if place >= self.from {
            self.taken = self.taken.saturating_sub(cost);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the answer says (a limit below what is left, none, a reset of zero, numbers
        /// near the top of u64), the instant a call is told is the first at which it fits: it
        /// fits then (or the record has lapsed), and not a nanosecond sooner.
        #[test]
        fn the_instant_a_call_is_told_is_the_first_at_which_it_fits(
            remaining in prop_oneof![0..2_000u64, Just(u64::MAX)],
            limit in prop::option::of(prop_oneof![0..20_000u64, Just(u64::MAX)]),
            resets_in in 0..20_000_000_000u64,
            at in 0..1u64 << 40,
            taken in 0..5_000u64,
            cost in 0..30_000u64,
            later in 0..20_000_000_000u64,
        ) {
            let quota = TokenQuota { remaining, limit, resets_in: Duration::from_nanos(resets_in) };
            let mut record = TokenRecord::new(quota, at, 0, 0);
            record.take(taken);
            let now = at + later;
            let free = record.free_at(now, cost);
            prop_assert!(free >= now);
            prop_assert!(!record.lasts(free) || record.available(free) >= cost);
            if free > now {
                prop_assert!(record.available(free - 1) < cost, "{free} is not the first");
            }
        }

        /// A reading older than the answer, which a thread took before another recorded the
        /// answer, sees what the answer said and nothing come back since, and a call that does
        /// not fit is told the instant a reading at the answer is told; never a panic.
        #[test]
        fn a_reading_older_than_the_answer_sees_nothing_come_back(
            remaining in 0..2_000u64,
            limit in prop::option::of(0..20_000u64),
            resets_in in 1..20_000_000_000u64,
            at in 1u64 << 30..1u64 << 40,
            earlier in 1..1u64 << 30,
            cost in 0..30_000u64,
        ) {
            let quota = TokenQuota { remaining, limit, resets_in: Duration::from_nanos(resets_in) };
            let record = TokenRecord::new(quota, at, 0, 0);
            let stale = at - earlier;
            prop_assert_eq!(record.available(stale), record.available(at));
            let told = if record.available(at) >= cost { stale } else { record.free_at(at, cost) };
            prop_assert_eq!(record.free_at(stale, cost), told);
        }
    }
}
