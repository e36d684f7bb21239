//! When calls to one dependency may start, by what it has said: a hold, the advertised quotas
//! (each a [`Lane`]: a budget and its window, a pacing slot), and the calls in flight. A call
//! starts only when every lane lets it.
//!
//! A refused call is told [`Schedule::free_at`], and a call made then, with nothing new heard
//! in between (no answer, no call ending, no other call starting), is admitted by
//! [`Schedule::try_start`]. The two agree by construction: `free_at` looks ahead by running the
//! rolling that `try_start` runs, on a copy of the schedule, from one end of what holds calls to
//! the next.
//!
//! The windows after the advertised one start lazily, with the first call that starts once the
//! one before has passed and no hold lasts (or an older answer that tightens it). A call
//! refused, and `held_for`, look on a copy and start none: the dependency sees neither, and a
//! window started by them would end before the dependency's. Windows anchored at
//! `window_end + k·w` would let the calls left at the end of one window and the `q` of the next
//! go within much less than `w`, which a dependency that starts its window with the first call
//! after the last one refuses. The look-ahead rolls its copy at the instant it looks at: the
//! instant at which the call it predicts makes the same roll.
//!
//! A lane's window after the advertised one gives its policy's `q` less the calls in flight, so when
//! `q` is zero or no more than the calls in flight, it gives nothing, and so does every window
//! after it until something new is heard: waiting for one would never end. The look-ahead
//! skips such windows, and the wait ends at the probe instead: `max_hold` (which already caps
//! every hold an answer sets) after the last answer or start, one call goes whatever the quota
//! says, so that its answer tells anew.

use std::time::Duration;

use super::answer::{AdvertisedQuota, Answer, Dialect, Refill, MAX_QUOTAS};
use super::builder::Pacing;
use super::tokens::TokenRecord;
use crate::clock::saturating_nanos;

// A call's lanes are one bit each of a `u32` (see `Schedule::try_start`).
const _: () = assert!(MAX_QUOTAS <= u32::BITS as usize);

/// The stricter of two refills, field by field: the fewer calls, over the longer window. A
/// refill is stricter than none (without one, calls go freely after the window).
fn stricter(a: Option<Refill>, b: Option<Refill>) -> Option<Refill> {
    (a.into_iter().chain(b)).reduce(|a, b| Refill {
        calls: a.calls.min(b.calls),
        window: a.window.max(b.window),
    })
}

/// When calls may start. Instants are nanoseconds of the pushback's clock.
#[derive(Debug, Clone, Default)]
pub(super) struct Schedule {
    pacing: Pacing,
    /// The pushback's `max_hold`: no hold an answer sets lasts longer.
    max_hold: u64,
    /// From this instant one call may start whatever the quotas say: `max_hold` after the last
    /// answer or start. Every hold and window an answer sets ends by then, so the probe only
    /// ends a wait for windows that give nothing.
    probe_at: u64,
    /// No call starts before this (a `Retry-After`). Only a later hold changes it.
    hold_until: u64,
    /// No call starts before this: an older answer said nothing was left until then. Part of
    /// the quotas in force, which a newer answer replaces.
    spent_until: u64,
    /// The quotas in force, one lane each; none while no quota is known. Between two answers
    /// that replace them, a lane keeps its place (a call's lanes are told by their places).
    lanes: Vec<Lane>,
    /// Calls started through the layer and not yet answered.
    in_flight: u64,
    /// Calls started through the layer so far: the next call's place in the order of starts.
    started: u64,
    /// The calls started when the last answer that set or tightened the quotas in force was
    /// received. An answer to one of them was sent before that answer was read, so the
    /// dependency may have counted it first: it may only tighten what is in force. Only an
    /// answer to a call started later (sent after every answer in force was received) is newer,
    /// and replaces it.
    in_force: u64,
    /// What the dependency last said of its tokens, while it lasts.
    tokens: Option<TokenRecord>,
    /// The tokens of the calls in flight.
    tokens_in_flight: u64,
}

/// One advertised quota as the schedule counts it.
#[derive(Debug, Clone)]
struct Lane {
    /// What it was advertised as: its dialect and its name. An older answer's quota of the
    /// same kind tightens it.
    kind: (Dialect, u64),
    /// Calls that may still start before `window_end`; `None` once the window has passed with
    /// no refill known (calls go freely by this quota until the next answer).
    budget: Option<u64>,
    window_end: u64,
    /// The quota of each window after `window_end`, when the dependency advertised a policy
    /// (its window read in the clock's nanoseconds when it starts).
    refill: Option<Refill>,
    /// Under [`Pacing::Spread`], the time between two calls, and the earliest next start.
    spacing: u64,
    next_slot: u64,
    /// The place of the first call counted against the budget (set when an answer sets it or
    /// its window rolls): a call placed earlier counted against another one.
    window_from: u64,
}

impl Lane {
    /// `quota`, received at `now` with `others` calls in flight that it may not have counted
    /// yet, under `pacing`, when `started` calls have started; its slot is set when it is
    /// placed.
    fn advertised(
        quota: &AdvertisedQuota,
        now: u64,
        others: u64,
        pacing: Pacing,
        started: u64,
    ) -> Self {
        let budget = quota.remaining.saturating_sub(others);
        let window = saturating_nanos(quota.window);
        Self {
            kind: (quota.dialect, quota.name),
            budget: Some(budget),
            window_end: now.saturating_add(window),
            refill: quota.refill,
            spacing: spacing(pacing, window, budget),
            next_slot: 0,
            window_from: started,
        }
    }

    /// This lane placed at `now`, after calls whose pacing let the next start at `slot`: the
    /// slot a sparser pacing set is no later than one spacing of this lane.
    fn paced_after(mut self, slot: u64, now: u64) -> Self {
        self.next_slot = match self.spacing {
            0 => 0,
            spacing => slot.min(now.saturating_add(spacing)),
        };
        self
    }

    /// Starts the window after `window_end` if it has passed: the refill, less the calls
    /// still in flight (which may land in it); with no refill known, no budget.
    fn roll(&mut self, now: u64, pacing: Pacing, in_flight: u64, started: u64) {
        if self.budget.is_some() && self.window_end <= now {
            // The next window is taken to start now, which ends it no earlier than the
            // dependency's (whose window ended at `window_end` or before).
            match self.refill {
                Some(refill) => {
                    let budget = refill.calls.saturating_sub(in_flight);
                    let window = saturating_nanos(refill.window);
                    self.budget = Some(budget);
                    self.window_from = started;
                    self.window_end = now.saturating_add(window.max(1));
                    // Under `Spread`, this window's calls are spread over it too, from its
                    // first: the slot the last window's spacing set ended with it.
                    self.spacing = spacing(pacing, window, budget);
                    self.next_slot = 0;
                }
                None => (self.budget, self.spacing) = (None, 0),
            }
        }
    }

    /// Until when this lane keeps a call at `now` from starting (no later than `now` when it
    /// lets one start); `u64::MAX` when only something new can end it. Nothing rolls before
    /// `window_end`, so each of the budget and the slot holds calls up to the instant given.
    fn held_until(&self, now: u64, in_flight: u64) -> u64 {
        let Some(budget) = self.budget else {
            return 0;
        };
        if self.window_end <= now {
            return 0;
        }
        let mut until = 0;
        if budget == 0 {
            // Every later window gives what the next one gives while nothing new is heard.
            let next_gives = self.refill.is_none_or(|refill| refill.calls > in_flight);
            until = if next_gives {
                self.window_end
            } else {
                u64::MAX
            };
        }
        if self.spacing > 0 {
            // The slot holds calls at most until the window ends, which rolls it: what holds
            // calls then is looked at then.
            until = until.max(self.next_slot.min(self.window_end));
        }
        until
    }

    /// An older answer's `quota` of the same kind tightens this lane, field by field: never
    /// more calls left, never a shorter window, never a looser refill or pacing. When it has
    /// nothing left, `spent_until` keeps its end instead, so that a window of this lane that
    /// ends later keeps its budget after it. A lane with no budget takes the quota whole.
    fn tighten(&mut self, quota: Self, spent_until: &mut u64, now: u64) {
        let Some(budget) = self.budget else {
            *self = quota.paced_after(self.next_slot, now);
            return;
        };
        match quota.budget {
            Some(0) => *spent_until = (*spent_until).max(quota.window_end),
            left => {
                self.budget = Some(budget.min(left.unwrap_or(u64::MAX)));
                self.window_end = self.window_end.max(quota.window_end);
                self.spacing = self.spacing.max(quota.spacing);
            }
        }
        self.refill = stricter(self.refill, quota.refill);
    }
}

impl Schedule {
    /// A schedule that knows nothing yet.
    pub(super) fn new(pacing: Pacing, max_hold: Duration) -> Self {
        Self {
            pacing,
            max_hold: saturating_nanos(max_hold),
            ..Self::default()
        }
    }

    /// Rolls the windows as a call at `now` finds them: a window that has passed gives way to
    /// the next one, unless a hold lasts (then the next window starts when the hold ends, as
    /// the first call after it finds it).
    fn roll(&mut self, now: u64) {
        if !self.holding(now) {
            for lane in &mut self.lanes {
                lane.roll(now, self.pacing, self.in_flight, self.started);
            }
        }
    }

    /// Whether a hold lasts at `now`: a `Retry-After`, or an older answer's spent quota.
    fn holding(&self, now: u64) -> bool {
        self.hold_until.max(self.spent_until) > now
    }

    /// Rolls the windows, and forgets what the dependency said of its tokens once it has
    /// passed, as a call at `now` finds them.
    fn settle(&mut self, now: u64) {
        self.roll(now);
        self.tokens = self.tokens.filter(|tokens| tokens.lasts(now));
    }

    /// Starts a call of `tokens` tokens now and returns its place in the order of starts,
    /// with the lanes whose budget it took a call of, one bit each by their places (a probe
    /// may start with none left), or returns the earliest instant one may start: the same
    /// instant [`free_at`](Self::free_at) gives. Only a call that starts rolls the windows.
    pub(super) fn try_start(&mut self, now: u64, tokens: u64) -> Result<(u64, u32), u64> {
        let at = self.free_at(now, tokens);
        if at > now {
            return Err(at);
        }
        self.settle(now);
        if let Some(record) = &mut self.tokens {
            record.take(tokens);
        }
        self.tokens_in_flight = self.tokens_in_flight.saturating_add(tokens);
        let mut counted = 0;
        for (index, lane) in self.lanes.iter_mut().enumerate() {
            if lane.budget.is_some_and(|budget| budget > 0) {
                counted |= 1 << index;
            }
            // A probe may start in a window with nothing left.
            lane.budget = lane.budget.map(|budget| budget.saturating_sub(1));
            lane.next_slot = now.max(lane.next_slot).saturating_add(lane.spacing);
        }
        self.in_flight = self.in_flight.saturating_add(1);
        self.probe_at = self.probe_at.max(now.saturating_add(self.max_hold));
        let place = self.started;
        self.started = self.started.saturating_add(1);
        Ok((place, counted))
    }

    /// A call of `tokens` started at `place` was refused below the layer before anything was
    /// sent: the call it took of each lane's budget goes back, where that budget is still in
    /// force, and so do its tokens.
    pub(super) fn give_back(&mut self, place: u64, counted: u32, tokens: u64) {
        for (index, lane) in self.lanes.iter_mut().enumerate() {
            if counted & (1 << index) != 0 && place >= lane.window_from {
                lane.budget = lane.budget.map(|budget| budget.saturating_add(1));
            }
        }
        if let Some(record) = &mut self.tokens {
            record.give_back(place, tokens);
        }
    }

    /// A call of `tokens` tokens started by [`try_start`](Self::try_start) has ended.
    pub(super) fn finish(&mut self, tokens: u64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.tokens_in_flight = self.tokens_in_flight.saturating_sub(tokens);
    }

    /// The tokens a call may take at `now`, as the schedule stands (`u64::MAX` when nothing
    /// is known of them).
    pub(super) fn tokens_available(&self, now: u64) -> u64 {
        self.tokens.map_or(u64::MAX, |record| record.available(now))
    }

    /// The earliest instant from `now` at which [`try_start`](Self::try_start) admits a call
    /// of `tokens` tokens, given nothing new is heard: the first instant the lanes and the
    /// tokens let one start, or the probe, whichever comes first.
    pub(super) fn free_at(&self, now: u64, tokens: u64) -> u64 {
        // From one end of what holds calls to the next, rolling a copy as a call made then
        // would: a few steps at most (a hold, the spent windows, the next windows' slots), as a
        // window that gives nothing ends the look-ahead.
        let mut ahead = self.clone();
        let mut at = now;
        loop {
            ahead.settle(at);
            let until = ahead.held_until(at, tokens);
            if until <= at {
                break;
            }
            at = until;
        }
        at.min(self.probe_at.max(now))
    }

    /// Until when the hold, a lane or the tokens keep a call of `tokens` at `now` from
    /// starting, as the schedule stands at `now` (no later than `now` when it may start);
    /// `u64::MAX` when only something new can end it. No call may start before the latest of
    /// them.
    fn held_until(&self, now: u64, tokens: u64) -> u64 {
        let mut until = self.hold_until.max(self.spent_until);
        if let Some(record) = &self.tokens {
            until = until.max(record.free_at(now, tokens));
        }
        for lane in &self.lanes {
            until = until.max(lane.held_until(now, self.in_flight));
        }
        until
    }

    /// Records an answer at `now`; `own` is the place and the tokens of the call it answers,
    /// `None` for one obtained elsewhere (taken as newer than every call started, since
    /// nothing says when it was sent).
    pub(super) fn apply(&mut self, answer: Answer, now: u64, own: Option<(u64, u64)>) {
        // Whatever this answer sets ends within `max_hold`: so does the wait for the probe.
        self.probe_at = self.probe_at.max(now.saturating_add(self.max_hold));
        if let Some(hold) = answer.hold {
            self.hold_until = self
                .hold_until
                .max(now.saturating_add(saturating_nanos(hold)));
        }
        if let Some(quota) = answer.tokens {
            let own_tokens = own.map_or(0, |(_, tokens)| tokens);
            let others = self.tokens_in_flight.saturating_sub(own_tokens);
            let record = TokenRecord::new(quota, now, others, self.started);
            // An older answer (see `in_force` below) may only leave fewer tokens.
            let older = own.is_some_and(|(place, _)| place < self.in_force);
            if !older || record.available(now) < self.tokens_available(now) {
                self.tokens = Some(record);
                if answer.quotas.is_empty() {
                    self.in_force = self.started;
                }
            }
        }
        if answer.quotas.is_empty() {
            return;
        }
        let own = own.map(|(place, _)| place);
        // Calls in flight other than this one may not have been counted in `r` yet.
        let others = self.in_flight.saturating_sub(u64::from(own.is_some()));
        let (pacing, started) = (self.pacing, self.started);
        let lanes = (answer.quotas.iter())
            .map(|quota| Lane::advertised(quota, now, others, pacing, started));
        // The slot the pacing in force set for the next call.
        let slot = self.lanes.iter().map(|lane| lane.next_slot).max();
        let slot = slot.unwrap_or(0);
        // An answer to a call sent before the quotas in force were last changed may have been
        // written first, whatever order the calls started in: it may only tighten.
        if own.is_some_and(|place| place < self.in_force) {
            for lane in lanes {
                self.tighten(lane, slot, now);
            }
        } else {
            // A newer answer's quotas replace those in force.
            self.spent_until = 0;
            self.lanes = lanes.map(|lane| lane.paced_after(slot, now)).collect();
        }
        self.in_force = self.started;
    }

    /// An older answer's quota tightens the lane of the same kind, of several the one whose
    /// window ends nearest its own (an answer may name two quotas alike, or none). One of a
    /// kind not in force is kept beside them (stricter than none), while there is room for it;
    /// else it tightens the lane with the fewest calls left (a dependency that changes its
    /// policies more than [`MAX_QUOTAS`] at a time).
    fn tighten(&mut self, quota: Lane, slot: u64, now: u64) {
        let same_kind = (self.lanes.iter().enumerate())
            .filter(|(_, lane)| lane.kind == quota.kind)
            .min_by_key(|(_, lane)| lane.window_end.abs_diff(quota.window_end))
            .map(|(index, _)| index);
        let index = match same_kind {
            Some(index) => index,
            None if self.lanes.len() < MAX_QUOTAS => {
                self.lanes.push(quota.paced_after(slot, now));
                return;
            }
            None => (0..self.lanes.len())
                .min_by_key(|&index| self.lanes[index].budget.unwrap_or(u64::MAX))
                .unwrap_or_default(),
        };
        // The lane it tightens rolls first if its window has passed (and no hold lasts): the
        // answer tells of the window in force. The other lanes start theirs with a call.
        if !self.holding(now) {
            let lane = &mut self.lanes[index];
            lane.roll(now, self.pacing, self.in_flight, self.started);
        }
        self.lanes[index].tighten(quota, &mut self.spent_until, now);
    }
}

/// The time between two calls under `pacing`, for `budget` calls within `window`.
fn spacing(pacing: Pacing, window: u64, budget: u64) -> u64 {
    match pacing {
        Pacing::Spread if budget > 0 => window / budget,
        _ => 0,
    }
}
