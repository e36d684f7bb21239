use crate::sync::{lock, Mutex};
use std::time::Duration;

use super::{LatestReading, Timeline, Transitions};
use crate::{decision::Decision, Quota};

/// Fixed windows with Resilience4j's cycle semantics.
///
/// Time is cut into cycles of `period` counted from the limiter's creation, and each cycle brings
/// `permits` permissions (Resilience4j's `limitForPeriod` per `limitRefreshPeriod`). Idle cycles
/// never build up more than `permits`. A caller willing to wait reserves a permission of a future
/// cycle, so the available count can go below zero: that debt is paid by the next cycles.
///
/// Guarantee: no cycle hands out more than its `permits`. An admission takes slots of the
/// current cycle; a reservation takes the slots left in it and the first of the next cycles', and
/// falls due when the cycle of its last slot begins, so that cycle may see, beside its own
/// `permits`, the part of a reservation drawn from the cycle before (up to `permits - 1`). Its
/// weakness is the edge: `permits` at the end of one cycle and `permits` at the start of the next
/// are `2 · permits` within a short span. The burst setting does not apply.
///
/// Across a change of quota, reservations made before it keep the cycles they fall due in: until
/// the last of them falls due, the count frees their slots no faster than the quota that slotted
/// them. A raised limit applies from the cycle that last one falls due in (before it, the key
/// admits no more than the old limit would have let it); a lowered one at once (the count,
/// reservations included, drains by it, slower than they fall due, so a cycle holds no more than
/// the larger of its reservations and the new limit); after a change of period, whose cycles need
/// not line up with the old ones, the count frees nothing until the cycle that last one falls due
/// in has ended. Without a reservation ahead, or without a change, none of this applies.
/// Known limits, all on the strict side but the first: a longer period stretches the cycle in
/// progress (see `set_quota`) over a reservation that fell due in its stretched part, which that
/// cycle then holds beside what it admitted; a limit raised and then lowered while reservations
/// stand ahead keeps the count the raise laid out, so the key can wait far longer than the
/// reservations need (minutes, in the attack that found it); and a lowered limit pays off an idle
/// key's count of an ended cycle at the new limit, so a key that was kept may wait where a key
/// dropped meanwhile would not.
///
/// A clock reading older than the latest one the key has seen is decided as of that latest
/// reading (the state keeps it), so a stale reading never lands in a cycle that has ended.
#[derive(Clone, Copy, Debug)]
pub struct FixedWindow {
    limit: u64,
    timeline: Timeline,
}

/// The per-key state of [`FixedWindow`]: the last cycle seen and the permissions used in it.
#[derive(Debug, Default)]
pub struct FixedWindowState(Mutex<Window>);

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) cycle: u64,
    /// Permissions taken in `cycle`; above `limit` it is debt owed by the next cycles.
    pub(crate) used: u64,
    /// The latest clock reading seen; earlier readings are decided as of it.
    pub(crate) latest: u64,
    /// The latest instant a reservation falls due: until then a count above the limit may hold
    /// a waiting caller's slots; afterwards what lies above it is debt.
    pub(crate) reserved_until: u64,
    /// One more than the reading at which a change of period last numbered `cycle` anew, zero
    /// for never (see [`Timeline::renumber`]).
    pub(crate) renumbered: u64,
    /// The limit and the period in force at the key's latest touch: the quota that laid out
    /// the slots of its reservations ahead (see [`FixedWindow::laid_out`]).
    pub(crate) slot_limit: u64,
    pub(crate) slot_period: u64,
}

impl FixedWindow {
    fn cycle_of(&self, now: u64) -> u64 {
        self.timeline.window_of(now)
    }

    fn cycle_start(&self, cycle: u64) -> u64 {
        self.timeline.start_of(cycle)
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
        // `cycle` is never before the cycle of `now` (the state refreshes to it), so the start is
        // ahead; saturating all the same, for a state left ahead by a change of period.
        self.cycle_start(cycle.saturating_add(cycles_needed))
            .saturating_sub(now)
    }

    /// The reading `now`, clamped to the instants the arithmetic covers and to no earlier than
    /// the latest reading seen, which it then becomes; and the state, numbered by this timeline
    /// (see [`Timeline::numbered`]), refreshed to it.
    fn advance(&self, w: &mut Window, now: u64) -> u64 {
        (self.timeline).renumber(&mut w.cycle, &mut w.renumbered, w.latest);
        w.used = self.laid_out(w, w.cycle);
        (w.slot_limit, w.slot_period) = (self.limit, self.timeline.period);
        let now = super::advance_latest(&mut w.latest, now);
        self.refresh(w, now);
        now
    }

    /// `w.used`, its cycle numbered `cycle`, with the slots of its reservations ahead laid out
    /// by this quota. They were slotted by the quota in force at the key's latest touch, which
    /// frees its `slot_limit` slots a cycle; where it has changed since and a reservation still
    /// stands ahead (the count past that limit, `reserved_until` after the latest reading), the
    /// count grows by what this quota frees more than that one until the last of them falls
    /// due, so that none of their slots is freed before: `(limit − slot_limit)` a cycle for a
    /// raised limit (nothing for a lowered one), and after a change of period, whose cycles
    /// need not line up with the old ones, all it frees, `limit` a cycle. Below 2^53, the
    /// bound of every count.
    fn laid_out(&self, w: &Window, cycle: u64) -> u64 {
        let period = self.timeline.period;
        let unchanged = w.slot_limit == self.limit && w.slot_period == period;
        if unchanged || w.used <= w.slot_limit || w.reserved_until <= w.latest {
            return w.used;
        }
        let ahead = self.cycle_of(w.reserved_until).saturating_sub(cycle);
        let per_cycle = if w.slot_period == period {
            self.limit.saturating_sub(w.slot_limit)
        } else {
            self.limit
        };
        let laid_out = w.used.saturating_add(per_cycle.saturating_mul(ahead));
        laid_out.min(Quota::MAX_PERMITS - 1).max(w.used)
    }

    pub(crate) fn step(&self, w: &mut Window, now: u64, cost: u32, max_wait: u64) -> Decision {
        let now = self.advance(w, now);
        let cost = u64::from(cost);
        let cycle = w.cycle;
        let reset = |used: u64| {
            Duration::from_nanos(self.until_cycles(cycle, now, used.div_ceil(self.limit)))
        };
        if w.used + cost <= self.limit {
            w.used += cost;
            return Decision::allowed(self.limit, self.limit - w.used, reset(w.used))
                .charged_at(now)
                .counted_in(w.cycle, self.timeline.generation());
        }
        let cycles = (w.used + cost - self.limit).div_ceil(self.limit);
        let wait = self.until_cycles(cycle, now, cycles);
        if wait <= max_wait {
            w.used += cost;
            w.reserved_until = w.reserved_until.max(now + wait);
            return Decision::reserved(
                self.limit,
                0,
                reset(w.used),
                Duration::from_nanos(wait),
                now + wait,
            )
            .counted_in(self.cycle_of(now + wait), self.timeline.generation());
        }
        Decision::refused(
            self.limit,
            self.limit.saturating_sub(w.used),
            Duration::from_nanos(wait),
            reset(w.used),
        )
    }

    /// Gives back the permits of an admission charged at `reserved_at`, as far as the count can
    /// say where they lie.
    ///
    /// The state is one count of permits taken, slot after slot, `limit` slots per cycle from
    /// the current one. A charge due in a cycle that has ended is spent: its cycle is history,
    /// and the debt carried out of it (`used_now = max(0, used_then − k·limit)`) holds only
    /// charges due later, which are still owed. A charge that the count can tell lies wholly
    /// inside the last cycle holding charges (any immediate admission while no reservation is
    /// outstanding, any reservation of one permit due in the last such cycle) is given back
    /// exactly: `used −= cost` frees slots of that cycle, where it held its own; so is any
    /// immediate admission of the current cycle while no reservation of the key is still to fall
    /// due, whatever debt a settle left past the limit (debt holds no caller's slot). Any other
    /// charge is kept (the permits are lost, never over-granted): one due in an earlier cycle
    /// lies before later ones, and a reservation of several permits may begin in the cycle
    /// before the one it falls due in, which one count cannot tell apart from one that does not;
    /// freeing the last slots for either would let a new caller fall due in a cycle that is
    /// already full. (Once such a reservation has fallen due and no other is outstanding, it is
    /// an admission of its cycle like any other, and is given back exactly.)
    fn give_back(&self, w: &mut Window, now: u64, cost: u32, decision: &Decision) {
        // Under a numbering that no longer names its cycle (a change of period since), nothing
        // comes back; nor for a reservation after a change of the limit or the period: its
        // slots lie where the limits of the cycles before it put them.
        let Some((charged, generation)) = self.timeline.counted_window(decision, w.renumbered)
        else {
            return;
        };
        if !decision.wait.is_zero() && generation != self.timeline.generation() {
            return;
        }
        if w.used == 0 || charged < w.cycle {
            return;
        }
        let cost = u64::from(cost);
        let last = w.cycle + (w.used - 1) / self.limit;
        let whole_in_last = w.used <= self.limit || cost == 1;
        // With no reservation that can be ahead, what lies past the limit is debt, which holds
        // no caller's slot: an immediate admission of this cycle comes back whole.
        let only_debt_after = decision.wait.is_zero() && w.reserved_until <= now;
        if (charged == last && whole_in_last) || (charged == w.cycle && only_debt_after) {
            w.used = w.used.saturating_sub(cost);
        }
    }

    /// The count of the cycle of `now` grows by `cost`; above the limit it is debt that the
    /// next cycles pay, as a reservation's is.
    fn take(&self, w: &mut Window, _now: u64, cost: u32) {
        w.used = w.used.saturating_add(u64::from(cost));
    }
}

impl Transitions for FixedWindow {
    type State = FixedWindowState;
    window_transitions!(timeline);

    /// Every key keeps its cycle and its count. The new limit applies from the change, to the
    /// cycle in progress too: a key that used 9 of 10 and whose limit becomes 20 has 11 left in
    /// it, and a count above a lowered limit is debt that the next cycles pay, as a reservation's
    /// is. (A key with reservations ahead lays them out anew when next touched, so that they
    /// keep the cycles they fall due in: see the guarantee above and `laid_out`.) A new period
    /// keeps the cycle in progress (its number and its start) and makes it end one new period
    /// after its start, or at the change if that instant has passed; the cycles after it last
    /// the new period. So the cycle of the change admits at most the larger of the two limits,
    /// and no cycle starts afresh because of the change.
    fn with_quota(&self, quota: &Quota, now: u64) -> Self {
        let limit = u64::from(quota.permits());
        let timeline = self.timeline.with_period(quota.period_nanos(), now);
        // A new limit under the same period is a change all the same (see `give_back`).
        let unchanged = timeline.generation() == self.timeline.generation();
        Self {
            limit,
            timeline: if limit != self.limit && unchanged {
                timeline.renewed()
            } else {
                timeline
            },
        }
    }

    fn eviction_rank(&self, state: &FixedWindowState, now: u64) -> u128 {
        // The count as of the cycle of `now`, on a copy: ranking changes no state.
        let mut w = *lock(&state.0);
        self.advance(&mut w, now);
        // Counts do not say when they were taken: among keys holding as many, the store keeps
        // the one it made first.
        super::rank(w.used, 0)
    }

    fn idle_at(&self, state: &FixedWindowState) -> u64 {
        let w = lock(&state.0);
        let ends = if w.used == 0 {
            0
        } else {
            let cycle = self.timeline.numbered(w.cycle, w.latest);
            self.cycle_start(cycle + self.laid_out(&w, cycle).div_ceil(self.limit))
        };
        super::idle_after(w.latest, ends)
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
        assert!(
            fw.decide(&st, &LatestReading::default(), S / 2, 1, 0)
                .allowed
        );
        assert!(
            fw.decide(&st, &LatestReading::default(), S / 2, 1, 0)
                .allowed
        );
        let refused = fw.decide(&st, &LatestReading::default(), S / 2, 1, 0);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Duration::from_millis(500));
        // Waiting up to 2 s: two permits of the next cycle and then of the one after.
        let a = fw.decide(&st, &LatestReading::default(), S / 2, 2, 2 * S);
        assert_eq!(a.wait, Duration::from_millis(500));
        let b = fw.decide(&st, &LatestReading::default(), S / 2, 1, 2 * S);
        assert_eq!(b.wait, Duration::from_millis(1500));
        // Idle cycles never build a burst above the limit.
        let idle = FixedWindowState::default();
        fw.decide(&idle, &LatestReading::default(), 10 * S, 1, 0);
        let d = fw.decide(&idle, &LatestReading::default(), 10 * S, 1, 0);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert!(
            !fw.decide(&idle, &LatestReading::default(), 10 * S, 1, 0)
                .allowed
        );
    }

    #[test]
    fn a_raised_limit_leaves_reservations_ahead_their_cycles() {
        let fw = FixedWindow::new(&Quota::per_second(10).unwrap(), 0);
        let (st, latest) = (FixedWindowState::default(), LatestReading::default());
        // 10 taken at 0.5 s, then 10 reserved due at 1 s and 10 at 2 s.
        for (n, wait) in [(10, 0), (20, 2 * S)] {
            for _ in 0..n {
                assert!(fw.decide(&st, &latest, S / 2, 1, wait).allowed);
            }
        }
        assert!(!fw.decide(&st, &latest, S / 2, 1, 2 * S).allowed);
        let raised = fw.with_quota(&Quota::per_second(20).unwrap(), S / 2);
        let admitted = |at| {
            (0..30)
                .filter(|_| raised.decide(&st, &latest, at, 1, 0).allowed)
                .count()
        };
        // 10 due at 1 s and at 2 s: the raise applies from 2 s, the cycle of the last.
        assert_eq!([admitted(S), admitted(2 * S), admitted(3 * S)], [0, 10, 20]);
    }
}
