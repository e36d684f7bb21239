//! What a limiter answers.

use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Quota;

/// The answer to one request for permits: admitted or not, and the state that a client should be
/// told about.
///
/// Every algorithm and every store answers with this same type, so the HTTP layer computes its
/// `Retry-After` and `RateLimit` headers the same way whatever sits underneath.
///
/// An admission is also the right to give its permits back ([`Limiter::refund`]), once: a
/// decision is neither `Copy` nor `Clone`, and a refund consumes it. Read the fields you need
/// before giving it back.
///
/// [`Limiter::refund`]: crate::Limiter::refund
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request is admitted (possibly after [`wait`](Self::wait)).
    pub allowed: bool,
    /// The most permits the limiter can hold: the burst for GCRA, the per-window limit otherwise.
    pub limit: u64,
    /// Permits left after this decision.
    pub remaining: u64,
    /// For a refusal, the exact time until the same request could be admitted; never zero when
    /// refused. Zero when admitted.
    pub retry_after: Duration,
    /// The time until the limiter is back to its full limit for this key, if nothing else arrives.
    pub reset_after: Duration,
    /// For an admission that holds a reservation, how long the caller must wait before it
    /// proceeds. Zero for an immediate admission and for a refusal.
    pub wait: Duration,
    /// What giving this admission back needs, and no client does.
    pub(crate) admission: Admission,
}

/// What a give-back (a refund, or a settle) of an admission needs: who made it, for which key,
/// of how many permits, and what it took, by who took it. The crate's own: a decision built by
/// hand carries an empty one, which no limiter takes back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Admission {
    /// The limiter and key the decision charged, so that a refund elsewhere gives nothing back.
    pub(crate) origin: Origin,
    /// The permits this decision was asked for (set by the crate's limiters), so that a refund
    /// never gives back more than the admission took, whatever cost its caller names.
    pub(crate) cost: u32,
    /// For a decision of a [`Tiers`](crate::tiers::Tiers) limiter, the index of the tier that
    /// made it, so that a refund goes back to that tier. Zero otherwise; `u16::MAX` for a tier
    /// past the 65 534th, which no refund reaches. Two bytes, not four, keep a decision within
    /// 128 bytes, which a return moves inline where 136 took a call to `memcpy` (fewer
    /// instructions a check: BENCHMARKS.md, "Instructions per check").
    pub(crate) tier: u16,
    /// What the admission took, and from what.
    pub(crate) taken: Taken,
    /// What the admission holds until it is settled or given back, if anything: the crate's
    /// layers then end the hold whatever ends the request.
    pub(crate) hold: Hold,
}

/// What an admission holds until the crate's layers end it, whatever ends the request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Nothing: permits taken are spent (or given back by whoever asks).
    #[default]
    Nothing,
    /// Its estimate ([`Metered`](crate::algorithm::Metered)), settled to the cost read from
    /// the answer, or to the estimate where none was read.
    Estimate,
    /// Slots of requests in flight (a concurrency limiter's), given back whole when the
    /// response body ends or is dropped, whichever policy the limiter serves: a slot has no
    /// cost to settle. A refusal of slots says so too (it holds nothing), so that the headers
    /// advertise the limit as slots whichever policy the limiter serves.
    Slots,
}

/// What an admission took, one variant per place a give-back goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Nothing: a refusal, or a decision built by hand.
    #[default]
    Nothing,
    /// Permits of the limiter's own state, in memory or in a Redis script.
    State(Charged),
    /// Permits of a Redis limiter's fail mode, while Redis could not decide: a give-back goes to
    /// its local limiter (as `State`), never to Redis.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    RedisFailMode(Charged),
    /// Permits of a share of a Redis limiter's key leased to this instance: a give-back goes to
    /// that lease's share while it lasts.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    RedisLease {
        /// The lease the permits came from.
        lease: u64,
    },
    /// What a Redis key holds for an admission under an id until it is settled or given back
    /// (a [`Metered`](crate::algorithm::Metered) estimate, a concurrent policy's slots),
    /// renewed while its instance lives: a settle or give-back names the hold.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    RedisHold {
        /// The hold's id in the key's state.
        hold: u64,
    },
}

/// Where in its state an admission's permits were charged: what the algorithm's refund reads
/// to give back exactly what the admission took.
///
/// Two are equal when they charged the same instant at the same rate and, for GCRA, left the
/// same TAT: a window algorithm's numbering is its store's own count (memory from the
/// limiter's creation and its changes of period, a Redis script its key's renumberings), as a
/// key's fingerprint is (see [`Origin`]).
#[derive(Clone, Copy, Debug, Default, Eq)]
pub(crate) struct Charged {
    /// The instant (limiter clock, nanoseconds, or a Redis script's ticks) at which the permits
    /// were charged: for an immediate admission, the instant the decision was made as of (the
    /// clock reading, or the latest reading of the key, or for GCRA of its shard, if that was
    /// later); for a reservation, the instant it falls due.
    pub(crate) at: u64,
    /// For GCRA, the TAT the admission left the key with: a refund gives back only while the
    /// key's TAT is still this one, that is while this admission is the key's latest. For the
    /// window algorithms in memory, one more than the number of the window its permits were
    /// counted in ([`Decision::counted_in`]); for the sliding counter in Redis, one more than the
    /// numbering of the key's windows (see `sliding_counter.lua`). A give-back under another
    /// numbering gives nothing back. Zero for the sliding log.
    pub(crate) tat: u64,
    /// For GCRA, the emission interval each permit was charged at: a refund gives back no more
    /// time per permit, even after a change of quota lengthened the interval. For a window
    /// algorithm in memory, [`COUNTED_UNDER`] beside the number of changes of period the
    /// numbering of windows went through before the admission ([`Decision::counted_in`]). Zero
    /// otherwise.
    pub(crate) per_permit: u64,
}

/// The top bit of [`Charged::per_permit`], which no emission interval reaches (a quota's spans
/// stay below 2^62 ns): set, the rest is the numbering a window algorithm's admission was
/// counted under. One word of the charge tells both, which keeps a decision within 128 bytes.
const COUNTED_UNDER: u64 = 1 << 63;

impl Charged {
    /// Whether GCRA (or Metered, in memory) made this charge: only it charges at a per-permit
    /// interval.
    pub(crate) fn by_gcra(&self) -> bool {
        self.per_permit != 0 && self.per_permit & COUNTED_UNDER == 0
    }
}

impl PartialEq for Charged {
    /// Equal when they charged the same instant, and for GCRA at the same rate, leaving the same
    /// TAT.
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
            && self.by_gcra() == other.by_gcra()
            && (!self.by_gcra() || (self.tat == other.tat && self.per_permit == other.per_permit))
    }
}

/// Where a [`Decision`] was made: the limiter whose state it charged ([`LimiterId::NONE`] for a
/// decision built by hand) and a fingerprint of the key (a keyed limiter's hash of it; zero when
/// the limiter has no keys).
///
/// Two decisions are equal when they say the same and would give back the same to the limiter
/// that made them, wherever they were made (two limiters given the same requests decide alike,
/// and limiters of different stores fingerprint one key differently): every origin compares
/// equal.
#[derive(Clone, Copy, Debug, Default, Eq)]
pub(crate) struct Origin {
    limiter: LimiterId,
    key: u64,
}

impl PartialEq for Origin {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Which limiter's state a [`Decision`] charged: one identity per limiter, shared by its clones
/// (which share its state), never by two limiters built apart.
///
/// A counter rather than the address of the limiter's state: an address is reused once a
/// limiter is dropped, and a decision may outlive the limiter that made it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LimiterId(u64);

impl LimiterId {
    /// No limiter: the identity of a decision built by hand, which no refund accepts.
    pub(crate) const NONE: Self = Self(0);

    /// An identity no other limiter has.
    pub(crate) fn new() -> Self {
        // Never wraps: a limiter built every nanosecond would take centuries.
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// For the loom models (`loom/`), which check the algorithms through the public API but need to
/// know when a decision took effect: a stale reading is decided as of a later one.
#[cfg(loom)]
impl Decision {
    /// The instant the permits were charged at, as the crate-private field says; zero for a
    /// refusal.
    pub fn charge_instant(&self) -> u64 {
        self.charged().at
    }
}

impl Decision {
    /// An immediate admission.
    pub fn allowed(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            retry_after: Duration::ZERO,
            reset_after,
            wait: Duration::ZERO,
            admission: Admission {
                cost: u32::MAX,
                ..Admission::default()
            },
        }
    }

    /// A refusal; `retry_after` is raised to one nanosecond if it was zero, since a refused client
    /// must always be told to wait.
    pub fn refused(
        limit: u64,
        remaining: u64,
        retry_after: Duration,
        reset_after: Duration,
    ) -> Self {
        Self {
            allowed: false,
            retry_after: retry_after.max(Duration::from_nanos(1)),
            ..Self::allowed(limit, remaining, reset_after)
        }
    }

    pub(crate) fn reserved(
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        wait: Duration,
        reserved_at: u64,
    ) -> Self {
        Self {
            wait,
            ..Self::allowed(limit, remaining, reset_after)
        }
        .charged_at(reserved_at)
    }

    /// This admission, holding `hold` until it is settled or given back.
    pub(crate) fn holding(mut self, hold: Hold) -> Self {
        self.admission.hold = hold;
        self
    }

    /// Whether this admission holds its estimate until it is settled or given back: whatever
    /// ends the request, the crate settles it (to the estimate, where nothing says otherwise).
    pub(crate) fn holds_estimate(&self) -> bool {
        self.admission.hold == Hold::Estimate
    }

    /// Whether this admission holds slots of requests in flight, which go back whole when the
    /// request ends (see [`Hold::Slots`]).
    pub(crate) fn holds_slots(&self) -> bool {
        self.admission.hold == Hold::Slots
    }

    /// This decision, made by tier `index` of a [`Tiers`](crate::tiers::Tiers) limiter.
    pub(crate) fn in_tier(mut self, index: usize) -> Self {
        self.admission.tier = u16::try_from(index).unwrap_or(u16::MAX);
        self
    }

    /// The tier that made this decision (see [`in_tier`](Self::in_tier)).
    pub(crate) fn tier(&self) -> usize {
        match self.admission.tier {
            u16::MAX => usize::MAX,
            index => usize::from(index),
        }
    }

    /// What this decision tells a client, as a decision that gives nothing back: for the
    /// crate's own bookkeeping once the decision itself has been consumed by a refund. A
    /// report of slots still says it is one, for the headers (it takes nothing back: it was
    /// taken from nothing).
    pub(crate) fn report(&self) -> Decision {
        let slots = self.admission.hold == Hold::Slots;
        Decision {
            admission: Admission {
                cost: 0,
                tier: self.admission.tier,
                hold: if slots { Hold::Slots } else { Hold::Nothing },
                ..Admission::default()
            },
            ..*self
        }
    }

    /// What this admission tells a client once settled from `estimate` permits to `cost` under
    /// `quota` (`gcra`: it was GCRA's), as the key holds it after the settle, where the report
    /// said the state after the estimate: the difference is back in (or out of) `remaining`,
    /// and `reset_after` moves by the time it weighs. For GCRA, whose reset is the TAT's lead,
    /// that is the difference's intervals, exact. For the windows, whose reset is the end of the
    /// window the request counts in, it stays, but for what a settle charges beyond what was
    /// left: debt that the next windows pay, each `permits` of it one period further (exact for
    /// the fixed window; for the sliding ones, whose debt leaves with the window it was charged
    /// in, a reset no earlier than the key's). What is charged beyond the estimate stops where
    /// the limiter's charge stops ([`settle_debt`](crate::algorithm::settle_debt): at what one
    /// request may take).
    pub(crate) fn settle_report(&mut self, estimate: u32, cost: u32, quota: &Quota, gcra: bool) {
        let capacity = if gcra { quota.burst() } else { quota.permits() };
        let debt = crate::algorithm::settle_debt(estimate, cost, capacity);
        let cost = u64::from(cost.min(estimate)) + u64::from(debt);
        let estimate = u64::from(estimate);
        let ns = |nanos: u128| Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        if gcra {
            let interval = u128::from(quota.emission_interval_nanos());
            let weight = |permits: u64| ns(u128::from(permits) * interval);
            self.reset_after = if cost >= estimate {
                self.reset_after.saturating_add(weight(cost - estimate))
            } else {
                self.reset_after.saturating_sub(weight(estimate - cost))
            };
        } else if let Some(debt) = cost.checked_sub(estimate + self.remaining) {
            let windows = debt.div_ceil(u64::from(quota.permits()));
            let period = ns(u128::from(windows) * u128::from(quota.period_nanos()));
            self.reset_after = self.reset_after.saturating_add(period);
        }
        self.remaining = (self.remaining + estimate)
            .saturating_sub(cost)
            .min(self.limit);
    }

    /// This decision, made for the key whose fingerprint is `key`.
    pub(crate) fn for_key(mut self, key: u64) -> Self {
        self.admission.origin.key = key;
        self
    }

    /// This decision, made by `limiter`.
    pub(crate) fn made_by(mut self, limiter: LimiterId) -> Self {
        self.admission.origin.limiter = limiter;
        self
    }

    /// Whether `limiter` made this decision for the key whose fingerprint is `key`: a refund
    /// gives back nothing else.
    pub(crate) fn is_from(&self, limiter: LimiterId, key: u64) -> bool {
        self.fingerprint_by(limiter) == Some(key)
    }

    /// The fingerprint of the key this decision charged, if `limiter` made it.
    pub(crate) fn fingerprint_by(&self, limiter: LimiterId) -> Option<u64> {
        let origin = self.admission.origin;
        (origin.limiter == limiter && limiter != LimiterId::NONE).then_some(origin.key)
    }

    /// The decision on a request of `cost` permits.
    pub(crate) fn of_cost(mut self, cost: u32) -> Self {
        self.admission.cost = cost;
        self
    }

    /// Tells this decision apart from the other recent ones of its limiter, as far as what it
    /// says allows: the key's fingerprint, the instant charged (for a lease's admission, its
    /// lease) and the state it left (two admissions of one key leave different states). Not a
    /// hash: equal tags of different decisions are possible, only unlikely among the few a gauge
    /// compares.
    pub(crate) fn tag(&self) -> u64 {
        // A lease's admissions are told apart by their lease, a hold's by its id, as others by
        // the instant charged.
        let (at, tat) = match self.admission.taken {
            Taken::State(c) | Taken::RedisFailMode(c) => (c.at, c.tat),
            Taken::RedisLease { lease } => (lease, 0),
            Taken::RedisHold { hold } => (hold, 0),
            Taken::Nothing => (0, 0),
        };
        self.admission.origin.key ^ at.rotate_left(21) ^ tat.rotate_left(42) ^ self.remaining
    }

    /// What a give-back or a settle of this decision, named `cost` by its caller, takes back:
    /// `cost`, but never more than it was decided on; for an admission that holds its estimate
    /// (`Metered`, a concurrent slot), the whole of it, whatever the caller names, since a hold
    /// ends once (a part left held would never drain).
    pub(crate) fn refundable(&self, cost: u32) -> u32 {
        if self.admission.hold != Hold::Nothing {
            self.admission.cost
        } else {
            cost.min(self.admission.cost)
        }
    }

    /// This admission, its permits charged to the limiter's state at `at` (see [`Charged`]).
    pub(crate) fn charged_at(mut self, at: u64) -> Self {
        self.admission.taken = Taken::State(Charged {
            at,
            ..self.charged()
        });
        self
    }

    /// This GCRA admission, which left its key's TAT at `tat`, each permit charged at
    /// `per_permit` (see [`Charged`]).
    pub(crate) fn leaving(mut self, tat: u64, per_permit: u64) -> Self {
        self.admission.taken = Taken::State(Charged {
            tat,
            per_permit,
            ..self.charged()
        });
        self
    }

    /// This window algorithm's admission, its permits counted in window `window` of the
    /// numbering that `generation` changes of period made.
    pub(crate) fn counted_in(mut self, window: u64, generation: u64) -> Self {
        self.admission.taken = Taken::State(Charged {
            tat: window.saturating_add(1),
            per_permit: COUNTED_UNDER | generation,
            ..self.charged()
        });
        self
    }

    /// The window a window algorithm's admission was counted in and the numbering it was
    /// counted under (see [`counted_in`](Self::counted_in)); `None` for any other decision.
    pub(crate) fn counted_window(&self) -> Option<(u64, u64)> {
        let charged = self.charged();
        // The mark is the top bit: taking it off fails exactly where it is not set.
        let generation = charged.per_permit.checked_sub(COUNTED_UNDER)?;
        Some((charged.tat.checked_sub(1)?, generation))
    }

    /// The instant this admission was decided at: the instant it was charged at, less its
    /// wait (a reservation's charge falls due that much later).
    pub(crate) fn decided_at(&self) -> u64 {
        let wait = crate::clock::saturating_nanos(self.wait);
        self.charged().at.saturating_sub(wait)
    }

    /// Where this admission's permits were charged, by the limiter's own state or a fail mode's
    /// local limiter; all zero for anything else.
    pub(crate) fn charged(&self) -> Charged {
        match self.admission.taken {
            Taken::State(charged) | Taken::RedisFailMode(charged) => charged,
            Taken::Nothing | Taken::RedisLease { .. } | Taken::RedisHold { .. } => {
                Charged::default()
            }
        }
    }

    /// `Retry-After` in whole seconds as the crate sends it: `max(1, ceil(retry_after))`, or zero
    /// for an admission.
    pub fn retry_after_secs(&self) -> u64 {
        if self.allowed {
            0
        } else {
            retry_after_secs(self.retry_after)
        }
    }
}

/// `wait` as a `Retry-After` says it: whole seconds, rounded up, never zero (a client told zero
/// would call again at once). Every `Retry-After` the crate writes.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    ceil_secs(wait).max(1)
}

/// Whole seconds, rounded up (saturating: `Duration::MAX` is `u64::MAX`).
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Whole milliseconds, rounded up (saturating at `u64::MAX`): every wait the crate says in
/// milliseconds, in a gRPC answer, a log event or the health report.
pub(crate) fn ceil_millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// A request for more permits than the limiter can ever hold at once.
///
/// Waiting would never help, so it is an error rather than a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InsufficientCapacity {
    requested: u32,
    capacity: u32,
}

impl InsufficientCapacity {
    pub(crate) fn new(requested: u32, capacity: u32) -> Self {
        Self {
            requested,
            capacity,
        }
    }

    /// The cost that was asked for.
    pub fn requested(&self) -> u32 {
        self.requested
    }

    /// The most the limiter can admit at once.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}

impl fmt::Display for InsufficientCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a cost of {} exceeds the limiter's capacity of {} and could never be admitted",
            self.requested, self.capacity
        )
    }
}

impl Error for InsufficientCapacity {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_fits_in_128_bytes_and_a_tier_past_the_last_index_reaches_no_tier() {
        // A return of more than 128 bytes is a call to `memcpy` (see `Admission::tier`).
        assert!(std::mem::size_of::<Decision>() <= 128);
        let made_by = |index| {
            Decision::allowed(1, 0, Duration::ZERO)
                .in_tier(index)
                .tier()
        };
        assert_eq!(made_by(0), 0);
        assert_eq!(made_by(65_534), 65_534);
        assert_eq!(made_by(65_535), usize::MAX);
        assert_eq!(made_by(usize::MAX), usize::MAX);
    }

    #[test]
    fn a_window_settle_moves_the_reset_only_by_the_periods_its_debt_takes() {
        let quota = Quota::per_second(10).unwrap();
        let admitted = || Decision::allowed(10, 2, Duration::from_millis(500));
        let settled = |estimate, cost, gcra| {
            let mut decision = admitted();
            decision.settle_report(estimate, cost, &quota, gcra);
            (decision.remaining, decision.reset_after)
        };
        let ms = Duration::from_millis;
        // Within what was left: the window the request counts in still ends in 500 ms.
        assert_eq!(settled(3, 5, false), (0, ms(500)));
        assert_eq!(settled(3, 0, false), (5, ms(500)));
        // Charged up to what one request may take, 10: 5 beyond what was left, one more period
        // (the limiter charges no more; 15 beyond, two periods, was said before).
        assert_eq!(settled(3, 20, false), (0, ms(1500)));
        assert_eq!(settled(3, 10, false), (0, ms(1500)));
        // GCRA: a tenth of a second a permit, either way, never below zero.
        assert_eq!(settled(3, 1, true), (4, ms(300)));
        // A settle far past the burst (10) is charged as the burst: 7 more intervals.
        assert_eq!(settled(3, 1000, true), (0, ms(1200)));
        let mut gcra = admitted();
        gcra.settle_report(3, 1, &quota, true);
        gcra.settle_report(9, 0, &quota, true);
        assert_eq!(gcra.reset_after, Duration::ZERO);
    }

    #[test]
    fn admissions_of_two_leases_are_told_apart() {
        let leased = |lease| {
            let mut d = Decision::allowed(10, 3, Duration::ZERO).for_key(7);
            d.admission.taken = Taken::RedisLease { lease };
            d
        };
        assert_ne!(leased(1).tag(), leased(2).tag());
        assert_eq!(leased(1).tag(), leased(1).tag());
    }

    #[test]
    fn retry_after_secs_rounds_up_and_is_never_zero() {
        let d = |nanos| Decision::refused(1, 0, Duration::from_nanos(nanos), Duration::ZERO);
        assert_eq!(d(0).retry_after_secs(), 1);
        assert_eq!(d(1).retry_after_secs(), 1);
        assert_eq!(d(100_000_000).retry_after_secs(), 1);
        assert_eq!(d(1_000_000_000).retry_after_secs(), 1);
        assert_eq!(d(1_000_000_001).retry_after_secs(), 2);
        assert_eq!(d(59_500_000_000).retry_after_secs(), 60);
        assert!(d(0).retry_after > Duration::ZERO);
        let longest = Decision::refused(1, 0, Duration::MAX, Duration::MAX);
        assert_eq!(longest.retry_after_secs(), u64::MAX);
    }
}
