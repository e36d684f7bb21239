//! GCRA for costs settled after the answer: each admission's estimate is held aside, out of
//! what the key has left, until the request settles, and the settled cost is then charged as of
//! the admission.

use super::gcra::{Gcra, MAX_TAT};
use super::{LatestReading, Transitions};
use crate::decision::{Decision, Hold};
use crate::sync::{lock, Mutex, MutexGuard};
use crate::Quota;

/// GCRA whose settles are exact, for policies whose cost is known only from the answer (the
/// tokens an LLM API reports): settled permits plus what a key has left is what the quota
/// allows, for any number of requests in flight and however long each takes.
///
/// Under [`Gcra`] an admission moves the key's TAT by its estimate at once, and the estimate
/// drains with time like any use; a settle to less then gives back the difference less the time
/// that has passed since (unless the admission is still the key's latest), because a TAT cannot
/// tell how much of it was idle time that absorbed part of the estimate. Concurrent or long
/// requests get little back. `Metered` keeps two numbers per key instead: the TAT of what has
/// been settled, and the permits *held* by admissions not settled yet. A request is admitted as
/// GCRA admits it on a TAT of `max(TAT, now) + held · T`; its estimate is added to the held
/// permits. Its settle takes the estimate back out of them and charges what it cost, up to the
/// estimate, as of the instant it was admitted (the TAT becomes `max(TAT, admitted) + cost · T`):
/// exactly what the key would hold had the request asked for its true cost, or less generous
/// where settles of other requests came in between. A cost above the estimate is debt, charged
/// from the settle as [`Gcra`] charges it.
///
/// The held permits do not drain with time: while requests are in flight, their estimates are
/// out of the key's budget. A refusal's wait (`Retry-After`) is how long until the request fits
/// were the requests in flight to settle at once to their estimates; when they settle to less
/// it fits sooner, and while they stay in flight it may be refused again.
///
/// Every admission must end in a settle or a give-back ([`Limiter::settle`],
/// [`Limiter::refund`]): until then its estimate stays held. The crate's layers see to that,
/// whatever ends the request (an error, a panic, a dropped body or future); a caller of the
/// limiter itself must too. A key holding permits is never dropped as idle.
///
/// In Redis (`RedisRateLimiterBuilder::algorithm`, feature `redis`) the script decides and
/// settles as this does, with the same answers: each admission's hold is kept in the key under
/// an id of its own (its estimate, the instant it was charged at, when it expires), and its
/// settle names it, so settles are as exact across instances, and one whose hold is gone
/// (settled already, or expired) gives nothing back and charges only what the request cost
/// beyond its estimate. A hold never settled (its instance died) stands once
/// `RedisRateLimiterBuilder::hold_for` has passed (10 minutes by default): its estimate is
/// charged as of its admission, never more generous than its settle would have been. A key
/// keeps at most 256 holds; a decision that finds them all taken is refused, for a second at
/// least. While Redis cannot answer, the default fail mode decides and settles with an
/// in-memory `Metered`.
///
/// A change of quota keeps, as [`Gcra`] does, each key's settled TAT, and counts the held
/// permits in the new quota.
///
/// [`Limiter::settle`]: crate::Limiter::settle
/// [`Limiter::refund`]: crate::Limiter::refund
#[derive(Clone, Copy, Debug)]
pub struct Metered(Gcra);

/// The per-key state of [`Metered`]: the TAT of what has been settled, the permits held by
/// admissions in flight, and the latest clock reading seen (an earlier one is decided as of
/// it).
#[derive(Debug, Default)]
pub struct MeteredState(Mutex<Meter>);

#[derive(Debug, Default)]
struct Meter {
    tat: u64,
    held: u64,
    latest: u64,
}

impl Metered {
    /// The key's meter, locked, and the reading it decides `now` as of (the latest reading of
    /// the key and of its group, if later), which the key's latest reading becomes.
    fn enter<'a>(
        &self,
        state: &'a MeteredState,
        latest: &LatestReading,
        now: u64,
    ) -> (MutexGuard<'a, Meter>, u64) {
        let mut meter = lock(&state.0);
        let now = super::advance_latest(&mut meter.latest, latest.at_least(now));
        (meter, now)
    }

    /// The TAT GCRA decides on at `now`: the settled one, then the held permits after it.
    fn ahead(&self, meter: &Meter, now: u64) -> u64 {
        let held = self.0.interval().saturating_mul(meter.held);
        meter.tat.max(now).saturating_add(held).min(MAX_TAT)
    }
}

impl Transitions for Metered {
    type State = MeteredState;

    fn new(quota: &Quota, epoch: u64) -> Self {
        Self(Gcra::new(quota, epoch))
    }

    fn capacity(&self) -> u32 {
        self.0.capacity()
    }

    fn decide(
        &self,
        state: &MeteredState,
        latest: &LatestReading,
        now: u64,
        cost: u32,
        max_wait: u64,
    ) -> Decision {
        let (mut meter, now) = self.enter(state, latest, now);
        let (verdict, admitted) = self.0.verdict(self.ahead(&meter, now), now, cost, max_wait);
        let decision = self.0.decision(verdict);
        if admitted.is_none() {
            return decision;
        }
        meter.held += u64::from(cost);
        decision.holding(Hold::Estimate)
    }

    /// A settle to zero: the `cost` held goes back, and nothing is charged.
    fn refund(
        &self,
        state: &MeteredState,
        latest: &LatestReading,
        now: u64,
        cost: u32,
        decision: &Decision,
    ) {
        self.settle(state, latest, now, decision, cost, 0);
    }

    /// The TAT moves to `max(TAT, now) + cost · T`, past the burst if it must.
    fn charge(&self, state: &MeteredState, latest: &LatestReading, now: u64, cost: u32) {
        let (mut meter, now) = self.enter(state, latest, now);
        meter.tat = self.0.charged(meter.tat, now, cost);
    }

    /// Takes `estimate` out of the held permits and charges `cost`: up to the estimate as of the
    /// instant the admission was charged at, beyond it (up to the capacity) from `now`.
    fn settle(
        &self,
        state: &MeteredState,
        latest: &LatestReading,
        now: u64,
        decision: &Decision,
        estimate: u32,
        cost: u32,
    ) {
        let (mut meter, now) = self.enter(state, latest, now);
        meter.held = meter.held.saturating_sub(u64::from(estimate));
        let used = cost.min(estimate);
        if used > 0 {
            meter.tat = self.0.charged(meter.tat, decision.charged().at, used);
        }
        let debt = super::settle_debt(estimate, cost, self.capacity());
        if debt > 0 {
            meter.tat = self.0.charged(meter.tat, now, debt);
        }
    }

    /// Past the settled TAT, with nothing held.
    fn idle_at(&self, state: &MeteredState) -> u64 {
        let meter = lock(&state.0);
        if meter.held > 0 {
            u64::MAX
        } else {
            super::idle_after(meter.latest, meter.tat)
        }
    }

    /// The permits held and those the settled TAT still weigh.
    ///
    /// A key evicted while it holds permits (only when every key in the store holds more)
    /// forgets them, as eviction forgets; a settle that comes for it afterwards, under the same
    /// key, takes nothing out of what the key's new admissions hold (the store tells a key made
    /// anew from the one the admission was made on) and charges only what it cost beyond its
    /// estimate.
    fn eviction_rank(&self, state: &MeteredState, now: u64) -> u128 {
        let meter = lock(&state.0);
        let ahead = self.ahead(&meter, now).saturating_sub(now);
        // Held estimates never end by themselves: among keys holding as many, the store keeps
        // the older.
        super::rank(ahead.div_ceil(self.0.interval()), 0)
    }
}
