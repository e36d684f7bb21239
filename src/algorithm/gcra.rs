use crate::sync::{AtomicU128, Ordering};
use std::time::Duration;

use super::{LatestReading, Transitions};
use crate::clock::MAX_NOW;
use crate::{decision::Decision, Quota};

/// The Generic Cell Rate Algorithm: the default.
///
/// The state of a key is one number, its *theoretical arrival time* (TAT): the instant at which the
/// key's bucket would be full again. A request of cost `n` at `now` moves the TAT to
/// `max(TAT, now) + n·T` (T is the emission interval, `period / permits`) and is admitted if that
/// new TAT lies no more than `burst·T` ahead of `now`. A key whose TAT is in the past is
/// indistinguishable from a new key, which is what makes eviction free.
///
/// Guarantee: over any span of length `S`, a key is admitted at most `burst + S / T` permits.
///
/// Clock readings that arrive out of order (a thread read the clock, then lost the race to one
/// that read it later) are decided as of the latest reading the key has seen, kept beside its
/// TAT so that one compare-and-swap changes both: a stale reading
/// neither admits more nor less than a fresh one.
///
/// A change of quota keeps each key's TAT as it is: the instant its bucket is full again does
/// not move. With an unchanged emission interval (only the burst changes, or permits and period
/// scale together) the permits a key has used carry over exactly: 9 of 10 used leaves 11 of 20.
/// When the interval changes, what a key owes carries over as time: the TAT's lead over now is
/// counted in the new interval. A longer interval so makes a debt weigh fewer permits: a key
/// that spent 10 of 10 per 30 minutes owes half an hour, 5 permits of 10 an hour, and is
/// admitted 5 more at the change, more than either quota admits at once (the one exception to
/// the bound [`set_quota`](crate::KeyedRateLimiter::set_quota) states). A refund after the
/// change, of a decision made before it, gives back `cost` intervals, each the shorter of the
/// old and the new (never moving the TAT before the latest reading): no more time than the
/// decision took, nor more than its permits weigh now.
#[derive(Clone, Copy, Debug)]
pub struct Gcra {
    interval: u64,
    /// `burst · interval`: how far ahead of now the TAT may run.
    horizon: u64,
    burst: u32,
}

/// The top bit of a key's state word, beside its TAT: set while the TAT lies past the horizon
/// and a reservation made since the key was last within its burst may hold a waiting caller's
/// slot there. Clear past the horizon, what lies there is a settle's debt, which a give-back may
/// lower. One bit of the word the key has anyway: telling the two apart costs no memory.
const WAITER: u64 = 1 << 63;

/// The latest TAT the word holds beside [`WAITER`]: 2^63 − 1 ns, some 292 years, past the
/// 2^62 ns at which time stands still.
pub(super) const MAX_TAT: u64 = WAITER - 1;

/// The per-key state of [`Gcra`]: the theoretical arrival time and, beside it in one 128-bit
/// word, the latest clock reading the key has seen, so that an admission changes both with one
/// compare-and-swap (see [`LatestReading`] for why the reading is kept at all).
#[derive(Debug, Default)]
pub struct GcraState {
    /// The TAT and [`WAITER`] (low half), the key's latest reading (high half): see [`joined`].
    both: AtomicU128,
}

impl GcraState {
    /// The theoretical arrival time: the instant at which the key's bucket is full again.
    pub fn tat(&self) -> u64 {
        self.load().0 & MAX_TAT
    }

    /// The word (the TAT and [`WAITER`]) and the key's latest reading.
    fn load(&self) -> (u64, u64) {
        split(self.both.load(Ordering::Acquire))
    }

    /// The word and the reading to decide as of, `floor` under the key's (see [`Loaded`]).
    fn loaded(&self, floor: &LatestReading) -> Loaded {
        Loaded::of(self.both.load(Ordering::Acquire), floor)
    }

    /// Replaces the word of `loaded` by `new`, decided at `now` or its reading, whichever is
    /// later. Otherwise answers the word and the reading to decide on again: someone changed
    /// them meanwhile.
    fn replace(
        &self,
        loaded: Loaded,
        new: u64,
        now: u64,
        floor: &LatestReading,
    ) -> Result<(), Loaded> {
        let new = joined(new, now.max(loaded.seen));
        self.both
            .compare_exchange_weak(loaded.both, new, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
            .map_err(|both| Loaded::of(both, floor))
    }

    /// Changes the word to what `change` makes of it and of the latest reading (the later of
    /// `now`, the key's and the floor), unless `change` answers `None`; the reading is kept
    /// either way.
    fn update(
        &self,
        now: u64,
        floor: &LatestReading,
        mut change: impl FnMut(u64, u64) -> Option<u64>,
    ) {
        let floor = floor.get();
        let _ = self
            .both
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |both| {
                let (current, seen) = split(both);
                let reading = seen.max(now).max(floor);
                match change(current, reading) {
                    Some(new) => Some(joined(new, reading)),
                    None => (reading > seen).then(|| joined(current, reading)),
                }
            });
    }
}

/// The word for `tat`, with [`WAITER`] if `waiter` and the TAT lies past `horizon` from `now`.
fn word(tat: u64, waiter: bool, now: u64, horizon: u64) -> u64 {
    if waiter && tat.saturating_sub(horizon) > now {
        tat | WAITER
    } else {
        tat
    }
}

/// The 128-bit word of a GCRA word (low half) and a latest reading (high half).
fn joined(word: u64, reading: u64) -> u128 {
    u128::from(word) | (u128::from(reading) << 64)
}

/// The GCRA word and the latest reading that `both` holds (see [`joined`]).
fn split(both: u128) -> (u64, u64) {
    (both as u64, (both >> 64) as u64)
}

/// A key's word and the reading it is decided as of, as one load found them: the key's own
/// reading or the floor under it, the shard's (the store publishes its reading there before it
/// drops keys, so a key made afresh is decided as of no earlier an instant). `both` is the
/// whole 128-bit word, which a compare-and-swap expects.
#[derive(Clone, Copy)]
struct Loaded {
    word: u64,
    seen: u64,
    both: u128,
}

impl Loaded {
    fn of(both: u128, floor: &LatestReading) -> Self {
        let (word, reading) = split(both);
        Self {
            word,
            seen: reading.max(floor.get()),
            both,
        }
    }
}

impl Gcra {
    /// The emission interval `T`: the nanoseconds one permit weighs.
    pub(super) fn interval(&self) -> u64 {
        self.interval
    }

    /// The TAT after `cost` permits charged at `at` on a key whose TAT is `tat`.
    pub(super) fn charged(&self, tat: u64, at: u64, cost: u32) -> u64 {
        let weight = self.interval.saturating_mul(u64::from(cost));
        tat.max(at).saturating_add(weight).min(MAX_TAT)
    }

    /// What the algorithm decides on a key whose TAT is `tat` at `now`, and the new TAT when
    /// admitted.
    pub(super) fn verdict(
        &self,
        tat: u64,
        now: u64,
        cost: u32,
        max_wait: u64,
    ) -> (Verdict, Option<u64>) {
        let base = tat.max(now);
        let new_tat = self.charged(tat, now, cost);
        let allow_at = new_tat.saturating_sub(self.horizon);
        if allow_at <= now {
            return (Verdict::Admitted { now, new_tat }, Some(new_tat));
        }
        let wait = allow_at - now;
        if wait <= max_wait {
            return (
                Verdict::Reserved {
                    now,
                    new_tat,
                    allow_at,
                },
                Some(new_tat),
            );
        }
        (
            Verdict::Refused {
                now,
                base,
                allow_at,
            },
            None,
        )
    }

    /// The decision that tells a client what `verdict` means.
    pub(super) fn decision(&self, verdict: Verdict) -> Decision {
        let limit = u64::from(self.burst);
        match verdict {
            Verdict::Admitted { now, new_tat } => {
                let remaining = (now + self.horizon - new_tat) / self.interval;
                let reset = Duration::from_nanos(new_tat - now);
                Decision::allowed(limit, remaining, reset)
                    .charged_at(now)
                    .leaving(new_tat, self.interval)
            }
            Verdict::Reserved {
                now,
                new_tat,
                allow_at,
            } => {
                let reset = Duration::from_nanos(new_tat - now);
                let wait = Duration::from_nanos(allow_at - now);
                Decision::reserved(limit, 0, reset, wait, allow_at).leaving(new_tat, self.interval)
            }
            Verdict::Refused {
                now,
                base,
                allow_at,
            } => {
                let remaining = (now + self.horizon).saturating_sub(base) / self.interval;
                Decision::refused(
                    limit,
                    remaining,
                    Duration::from_nanos(allow_at - now),
                    Duration::from_nanos(base - now),
                )
            }
        }
    }
}

/// What [`Gcra`] decided on one request, as of `now`.
#[derive(Clone, Copy)]
pub(super) enum Verdict {
    /// Admitted at once; the key's TAT becomes `new_tat`.
    Admitted { now: u64, new_tat: u64 },
    /// Admitted from `allow_at`; the key's TAT becomes `new_tat`.
    Reserved {
        now: u64,
        new_tat: u64,
        allow_at: u64,
    },
    /// Refused: the key's TAT stays `base` (or `now`, whichever is later), and the request
    /// could be admitted from `allow_at`.
    Refused { now: u64, base: u64, allow_at: u64 },
}

impl Transitions for Gcra {
    type State = GcraState;

    fn new(quota: &Quota, _epoch: u64) -> Self {
        let interval = quota.emission_interval_nanos();
        Self {
            interval,
            horizon: interval * u64::from(quota.burst()),
            burst: quota.burst(),
        }
    }

    fn capacity(&self) -> u32 {
        self.burst
    }

    /// Moves the key's TAT by compare-and-swap when the request is admitted, having published
    /// the reading it decided at.
    fn decide(
        &self,
        state: &GcraState,
        latest: &LatestReading,
        now: u64,
        cost: u32,
        max_wait: u64,
    ) -> Decision {
        let now = now.min(MAX_NOW);
        let mut loaded = state.loaded(latest);
        let verdict = loop {
            let (current, at) = (loaded.word, now.max(loaded.seen));
            let (verdict, new_tat) = self.verdict(current & MAX_TAT, at, cost, max_wait);
            let Some(new_tat) = new_tat else {
                break verdict;
            };
            // A reservation marks the key; an admission within the burst clears the mark.
            let reserved = matches!(verdict, Verdict::Reserved { .. });
            let new = word(new_tat, reserved || current & WAITER != 0, at, self.horizon);
            match state.replace(loaded, new, now, latest) {
                Ok(()) => break verdict,
                Err(again) => loaded = again,
            }
        };
        self.decision(verdict)
    }

    /// Gives back what `decision` took, as far as the key's state can say where it lies; never
    /// more.
    ///
    /// * The decision is still the key's latest admission (the key's TAT is the one it left,
    ///   and no give-back of the key's shard has moved a TAT back since the decision was made,
    ///   which could have let later admissions bring it back to that value): the TAT goes back
    ///   by `cost · T`, never below the latest reading (time that has passed is spent; the
    ///   latest reading is the key's [`LatestReading`], which other keys of its shard may have
    ///   moved on). Exact: the key decides as if the request had never been made.
    /// * Not known to be the latest (a later admission or a settle's debt moved the TAT on, or
    ///   a give-back of this kind moved a TAT of the shard back at or after the decision's
    ///   reading), this decision was immediate, and no waiting caller holds a slot ahead of
    ///   the latest reading: none is past the
    ///   horizon (the TAT is within `burst · T` of the latest reading), or no reservation was
    ///   made on the key since it was last within its burst (the state word's top bit says so),
    ///   so what lies past the horizon is debt. The TAT goes back by `cost · T` less the time
    ///   elapsed between this decision and the latest reading. What the request added to the
    ///   TAT is at least that much (idle time since can only have absorbed part of it), so the
    ///   key never decides more generously than if the request had never been made; at the
    ///   same instant it is exact. This is what keeps a shared key (a tenant, a route) from
    ///   being drained by requests another policy refuses, or settles to less, while other
    ///   requests are admitted in between.
    /// * Otherwise (a reservation made since the key was last within its burst may still hold
    ///   a slot past the horizon): nothing. Moving the TAT back would hand the next caller a
    ///   slot that a waiter already holds (two permits due at once with a burst of one), so the
    ///   permits stay spent, until the key is within its burst again.
    fn refund(
        &self,
        state: &GcraState,
        latest: &LatestReading,
        now: u64,
        cost: u32,
        decision: &Decision,
    ) {
        let now = now.min(MAX_NOW);
        let charged = decision.charged();
        let left = charged.tat;
        if left == 0 {
            // Not a GCRA admission: only the reading is published.
            state.update(now, latest, |_, _| None);
            return;
        }
        // Never more time per permit than the decision charged: after a change of quota that
        // lengthened the interval, a permit weighs more than it took.
        let give = (self.interval.min(charged.per_permit)).saturating_mul(u64::from(cost));
        let immediate = decision.wait.is_zero();
        let decided_at = decision.decided_at();
        state.update(now, latest, |current, reading| {
            let (tat, waiter) = (current & MAX_TAT, current & WAITER != 0);
            if tat <= reading {
                // Nothing ahead of the latest reading: nothing to give back.
                return None;
            }
            let back = if tat == left && !latest.moved_back_since(decided_at) {
                give
            } else if immediate && (tat.saturating_sub(self.horizon) <= reading || !waiter) {
                let back = give.saturating_sub(reading.saturating_sub(charged.at));
                if back > 0 {
                    // Before the TAT moves: whoever sees it moved sees this too.
                    latest.moved_back(reading);
                }
                back
            } else {
                0
            };
            let tat = tat.saturating_sub(back).max(reading);
            (back > 0).then(|| word(tat, waiter, reading, self.horizon))
        });
    }

    /// The TAT moves to `max(TAT, now) + cost · T`, past the burst if it must.
    fn charge(&self, state: &GcraState, latest: &LatestReading, now: u64, cost: u32) {
        let now = now.min(MAX_NOW);
        // The reading goes into the word with the TAT, as a decision's does.
        state.update(now, latest, |current, now| {
            let tat = self.charged(current & MAX_TAT, now, cost);
            Some(word(tat, current & WAITER != 0, now, self.horizon))
        });
    }

    /// The permits the key still holds (`TAT − now` in intervals, rounded up), then, among keys
    /// holding as many, the one that took them earliest is kept longest.
    fn eviction_rank(&self, state: &GcraState, now: u64) -> u128 {
        let ahead = state.tat().saturating_sub(now);
        super::rank(ahead.div_ceil(self.interval), ahead)
    }

    fn idle_at(&self, state: &GcraState) -> u64 {
        // Past the TAT the bucket is full.
        let (word, reading) = state.load();
        super::idle_after(reading, word & MAX_TAT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(permits: u32, period_ms: u64, burst: u32) -> Gcra {
        let q = Quota::with_period(permits, Duration::from_millis(period_ms))
            .unwrap()
            .with_burst(burst)
            .unwrap();
        Gcra::new(&q, 0)
    }

    #[test]
    fn ten_per_second_then_refusal_then_recovery() {
        let g = gcra(10, 1000, 10);
        let (s, l) = (GcraState::default(), LatestReading::default());
        for i in 0..10 {
            let d = g.decide(&s, &l, 0, 1, 0);
            assert!(d.allowed, "check {i}");
            assert_eq!(d.remaining, 9 - i);
        }
        let d = g.decide(&s, &l, 0, 1, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(100));
        assert_eq!(d.reset_after, Duration::from_secs(1));
        assert_eq!(d.remaining, 0);
        assert!(g.decide(&s, &l, 100_000_000, 1, 0).allowed);
    }

    #[test]
    fn reservation_and_refund() {
        let g = gcra(1, 1000, 1);
        let (s, l) = (GcraState::default(), LatestReading::default());
        assert!(g.decide(&s, &l, 0, 1, 0).allowed);
        let d = g.decide(&s, &l, 0, 1, 2_000_000_000);
        assert!(d.allowed);
        assert_eq!(d.wait, Duration::from_secs(1));
        g.refund(&s, &l, 10, 1, &d);
        // After the refund, the next caller gets the same slot, not a later one.
        let again = g.decide(&s, &l, 10, 1, 2_000_000_000);
        assert_eq!(again.wait, Duration::from_nanos(1_000_000_000 - 10));
    }
}
