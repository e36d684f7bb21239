use std::time::Duration;

use super::{LatestReading, Timeline, Transitions};
use crate::sync::{lock, Mutex};
use crate::{decision::Decision, Quota};

/// The sliding-window counter: two fixed-window counters blended into an estimate.
///
/// At `e` nanoseconds into a window of length `W`, the count in the sliding window ending now is
/// estimated as `⌊previous · (W − e) / W⌋ + current`: the previous window's count is assumed to be
/// spread evenly over it, and its share still inside the sliding window is rounded down. A
/// request is admitted if the estimate plus its cost stays within `permits`. The arithmetic is
/// exact integer arithmetic, so `retry_after` is the exact instant at which the estimate admits
/// the request.
///
/// Rounding the share down is what makes small limits usable: with `permits = 1`, a request
/// anywhere after the first instant of the window that follows one admission is admitted, so
/// steady traffic below the rate is never refused (rounded up, the share of one request stays 1
/// for the whole next window, and a limit of 1 admits at most every other window).
///
/// Error bound: each fixed window admits at most `permits`, but a sliding window of length `W`
/// may hold more than `permits` when the previous window's traffic was bunched near its end (the
/// even spread assumption is wrong then). At `e` into a window the excess is less than
/// `previous · e / W + 1` (the `+ 1` is the rounding), so a sliding window never holds more than
/// `2 · permits`. When traffic is spread out the estimate is close to exact.
/// A waiting caller may reserve a permit in the current or the next window; a permit further away
/// is refused even within `max_wait`. The burst setting does not apply.
///
/// A clock reading older than the latest one the key has seen is decided as of that latest
/// reading (the state keeps it): it never lands in a window that has rolled away.
#[derive(Clone, Copy, Debug)]
pub struct SlidingCounter {
    limit: u64,
    timeline: Timeline,
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
    /// The latest clock reading seen; earlier readings are decided as of it.
    pub(crate) latest: u64,
    /// One more than the reading at which a change of period last numbered `window` anew,
    /// zero for never (see [`Timeline::renumber`]).
    pub(crate) renumbered: u64,
    /// The permits of `curr` reserved (so perhaps not yet due): what reservations of it and
    /// of `next` came to, less what came back.
    pub(crate) reserved: u64,
    /// The numbering (its [`Timeline::generation`]) the counts were laid out under.
    pub(crate) generation: u64,
    /// The instant before which reservations laid out anew after a change of period may fall
    /// due (see [`SlidingCounter::lay_out`]), so that a later change holds the key as long.
    pub(crate) due_before: u64,
}

impl SlidingCounter {
    fn roll(&self, c: &mut Counters, now: u64) {
        let idx = self.timeline.window_of(now);
        match idx.saturating_sub(c.window) {
            0 => {}
            1 => (c.prev, c.curr, c.reserved, c.next) = (c.curr, c.next, c.next, 0),
            2 => (c.prev, c.curr, c.reserved, c.next) = (c.next, 0, 0, 0),
            _ => (c.prev, c.curr, c.reserved, c.next) = (0, 0, 0, 0),
        }
        c.window = c.window.max(idx);
    }

    /// The earliest offset into a window of length `window` with counts (`prev`, `curr`) at
    /// which `cost` fits: the least `e` with `⌊prev · (W − e) / W⌋ ≤ room`, that is
    /// `prev · (W − e) ≤ (room + 1) · W − 1`.
    fn earliest(&self, prev: u64, curr: u64, cost: u64, window: u64) -> Option<u64> {
        let room = self.limit.checked_sub(curr + cost)?;
        if prev == 0 {
            return Some(0);
        }
        let w = u128::from(window);
        let slack = ((u128::from(room) + 1) * w - 1) / u128::from(prev);
        let e = w.saturating_sub(slack) as u64;
        (e < window).then_some(e)
    }

    /// `⌊prev · (W − e) / W⌋`: the previous window's share `e` into a window of length `window`
    /// (an offset past its end counts as its end).
    fn carried(&self, prev: u64, e: u64, window: u64) -> u64 {
        let share = u128::from(prev) * u128::from(window.saturating_sub(e));
        (share / u128::from(window)) as u64
    }

    /// The reading `now`, clamped to the instants the arithmetic covers and to no earlier than
    /// the latest reading seen, which it then becomes; the windows, numbered by this timeline
    /// (see [`Timeline::numbered`]), rolled to it.
    fn advance(&self, c: &mut Counters, now: u64) -> u64 {
        self.lay_out(c);
        let now = super::advance_latest(&mut c.latest, now);
        self.roll(c, now);
        now
    }

    /// Numbers the key's window by this timeline. After a change of period, reservations that
    /// stood ahead fall due in windows of the old length, which the new windows need not line
    /// up with (nor keep them in the window that counted them): until the end of the new window
    /// that the last of them may fall due in (one old window after the latest reading for a
    /// reservation of the current window, two for one of the next; the old length taken as
    /// the longest there was, and no earlier than a hold before it), the key admits nothing
    /// more (that window counts as full, or as its fullest count, and weighs on the next as a
    /// previous window does; no count is lowered), and nothing admitted before comes back.
    fn lay_out(&self, c: &mut Counters) {
        let generation = self.timeline.generation();
        if c.generation == generation {
            // Laid out by this numbering already (a held window stays ahead).
            return;
        }
        (self.timeline).renumber(&mut c.window, &mut c.renumbered, c.latest);
        let old_windows_ahead = if c.next > 0 {
            2
        } else {
            u64::from(c.reserved > 0)
        };
        let reach = old_windows_ahead.saturating_mul(self.timeline.longest());
        let due_before = c.latest.saturating_add(reach).max(c.due_before);
        if due_before > c.latest {
            c.due_before = due_before;
            let last_due = self.timeline.window_of(due_before - 1).max(c.window);
            let full = c.curr.max(c.next).max(self.limit);
            let next = if last_due == c.window { c.next } else { 0 };
            (c.window, c.curr, c.next) = (last_due, full, next);
            c.renumbered = c.latest + 1;
        }
        c.generation = generation;
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
        self.timeline.start_of(c.window + windows_left)
    }

    fn reset_after(&self, c: &Counters, now: u64) -> Duration {
        Duration::from_nanos(self.idle_from(c).saturating_sub(now))
    }

    pub(crate) fn step(&self, c: &mut Counters, now: u64, cost: u32, max_wait: u64) -> Decision {
        let now = self.advance(c, now);
        let cost = u64::from(cost);
        let start = self.timeline.start_of(c.window);
        let len = self.timeline.length_of(c.window);
        // `now` is before the window the state has rolled to only while reservations laid out
        // anew after a change of period hold the key (see `lay_out`).
        let e = now.saturating_sub(start);
        let remaining = |c: &Counters| {
            self.limit
                .saturating_sub(c.curr + self.carried(c.prev, e, len))
        };
        let earliest_here = self.earliest(c.prev, c.curr, cost, len);
        if earliest_here.is_some_and(|at| start + at <= now) {
            c.curr += cost;
            return Decision::allowed(self.limit, remaining(c), self.reset_after(c, now))
                .charged_at(now)
                .counted_in(c.window, self.timeline.generation());
        }
        let in_this = earliest_here.map(|at| (start + at, 0));
        let next_start = self.timeline.start_of(c.window + 1);
        let in_next = || {
            let len = self.timeline.length_of(c.window + 1);
            self.earliest(c.curr, c.next, cost, len)
                .map(|at| (next_start + at, 1))
        };
        let after = || {
            let len = self.timeline.length_of(c.window + 2);
            let at = self.earliest(c.next, 0, cost, len).unwrap_or(0);
            (self.timeline.start_of(c.window + 2) + at, 2)
        };
        let (admit_at, which) = in_this.or_else(in_next).unwrap_or_else(after);
        let wait = admit_at - now;
        if wait <= max_wait && which < 2 {
            if which == 0 {
                c.curr += cost;
                c.reserved += cost;
            } else {
                c.next += cost;
            }
            return Decision::reserved(
                self.limit,
                0,
                self.reset_after(c, now),
                Duration::from_nanos(wait),
                admit_at,
            )
            .counted_in(c.window + which, self.timeline.generation());
        }
        Decision::refused(
            self.limit,
            remaining(c),
            Duration::from_nanos(wait),
            self.reset_after(c, now),
        )
    }

    /// Subtracts `cost` from the count of the window the admission was counted in (the
    /// previous, the current or the next): exact, whether it is past or future, since each count
    /// is a plain sum. A window older than the previous one weighs on no decision any more. The
    /// admission's instant names its window only under the numbering it was counted under: a
    /// change of period numbers instants anew (a reservation due in the next window may fall in
    /// the one in progress after it), so after one nothing comes back.
    fn give_back(&self, c: &mut Counters, _now: u64, cost: u32, decision: &Decision) {
        let Some((idx, _)) = self.timeline.counted_window(decision, c.renumbered) else {
            return;
        };
        let cost = u64::from(cost);
        let count = if idx + 1 == c.window {
            &mut c.prev
        } else if idx == c.window {
            if !decision.wait.is_zero() {
                c.reserved = c.reserved.saturating_sub(cost);
            }
            &mut c.curr
        } else if idx == c.window + 1 {
            &mut c.next
        } else {
            return;
        };
        *count = count.saturating_sub(cost);
    }

    /// The count of the window of `now` grows by `cost`, past the limit if it must. The
    /// counter is approximate: the debt weighs on the estimate as that window's own counts
    /// do, in full through the window and then as the previous window's share.
    fn take(&self, c: &mut Counters, _now: u64, cost: u32) {
        c.curr = c.curr.saturating_add(u64::from(cost));
    }
}

impl Transitions for SlidingCounter {
    type State = SlidingCounterState;
    window_transitions!(timeline);

    /// Every key keeps its counters. The new limit applies from the change, to the window in
    /// progress too (9 of 10 used leaves 11 of 20). A new period keeps the window in progress
    /// (its number and its start) and makes it end one new period after its start, or at the
    /// change if that instant has passed; the windows after it last the new period, and the
    /// previous window's share is spread over the window that follows it, whatever its length.
    /// The counts of the window of the change stay in it, so it admits at most the larger of
    /// the two limits. Reservations standing ahead at a change of period fall due in windows of
    /// the old length: their key admits nothing more until the end of the new window the last
    /// of them may fall due in, through later changes too (see `lay_out`). (In Redis, whose
    /// windows of one length always lie at the same instants, a key is held only where the
    /// length it was last written under differs, and by that length exactly.)
    fn with_quota(&self, quota: &Quota, now: u64) -> Self {
        Self {
            limit: u64::from(quota.permits()),
            timeline: self.timeline.with_period(quota.period_nanos(), now),
        }
    }

    fn eviction_rank(&self, state: &SlidingCounterState, now: u64) -> u128 {
        let mut c = *lock(&state.0);
        let now = self.advance(&mut c, now);
        let e = now.saturating_sub(self.timeline.start_of(c.window));
        let held = self.carried(c.prev, e, self.timeline.length_of(c.window)) + c.curr + c.next;
        // As the fixed window's: among keys holding as many, the store keeps the older.
        super::rank(held, 0)
    }

    fn idle_at(&self, state: &SlidingCounterState) -> u64 {
        let mut c = *lock(&state.0);
        self.lay_out(&mut c);
        super::idle_after(c.latest, self.idle_from(&c))
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
            assert!(
                sc.decide(&st, &LatestReading::default(), S / 2, 1, 0)
                    .allowed
            );
        }
        let d = sc.decide(&st, &LatestReading::default(), S / 2, 1, 0);
        assert!(!d.allowed);
        // Next window: prev = 10; one more fits when ⌊10·(W−e)/W⌋ ≤ 9, from e = 1 ns.
        assert_eq!(d.retry_after, Duration::from_nanos(S / 2 + 1));
        assert!(!sc.decide(&st, &LatestReading::default(), S, 1, 0).allowed);
        assert!(
            sc.decide(&st, &LatestReading::default(), S + 1, 1, 0)
                .allowed
        );
        // The second needs ⌊10·(W−e)/W⌋ ≤ 8, from e = W/10 + 1 ns.
        assert!(
            !sc.decide(&st, &LatestReading::default(), S + S / 10, 1, 0)
                .allowed
        );
        assert!(
            sc.decide(&st, &LatestReading::default(), S + S / 10 + 1, 1, 0)
                .allowed
        );
    }
}
