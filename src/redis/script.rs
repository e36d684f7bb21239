//! The Lua scripts, which algorithm runs which, and the arguments they take.
//!
//! `prelude.lua` describes the arguments and replies every script shares; each algorithm's file
//! describes its own arguments and the state it keeps.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, ScriptInvocation};

use super::{BuildError, RedisFailure};
use crate::algorithm::{Algorithm, FixedWindow, Gcra, Metered, SlidingCounter, SlidingLog};
use crate::clock::{saturating_nanos, Clock};
use crate::decision::Charged;
use crate::Quota;

/// The largest tick count a script may see: the arithmetic stays exact in Lua's doubles (53 bits)
/// with room for the sums of a few such values.
pub(crate) const MAX_TICKS: u64 = 1 << 50;

/// With a client clock (nanosecond ticks), the pace of time need not match the server's, so
/// expiries get this margin: no state may expire in real time while it still matters on the
/// client's clock (a manual clock in a test may stand still for a while). A key that holds
/// nothing more keeps its latest reading this long rather than being deleted, so that a stale
/// reading after it is decided as of it (`prelude.lua`).
pub(crate) const CLIENT_CLOCK_TTL_MARGIN_MS: u64 = 60_000;

/// The largest `now` a script may be given, in ticks (below the crate's clock bound,
/// [`MAX_NOW`](crate::clock::MAX_NOW): a Lua number is exact to 2^53).
pub(crate) const MAX_SCRIPT_NOW: u64 = 1 << 52;

/// How long a hold lasts unless its instance renews it, unless the builder says otherwise
/// ([`hold_for`](super::RedisRateLimiterBuilder::hold_for)).
pub(crate) const DEFAULT_HOLD_FOR: Duration = Duration::from_secs(30);

/// The name of an algorithm's script, the script, and its batch script: several decisions on one
/// key in one call, each run by the algorithm's own script, in order, as if it were called alone
/// (its `ARGV` is a parameter that hides the call's). The call's `ARGV` holds, for each decision,
/// the count of its arguments and then its arguments; the reply is the list of the decisions'
/// replies (the loop that runs them is `batch.lua`).
type Scripts = (&'static str, LazyLock<Script>, LazyLock<Script>);

/// The [`Scripts`] of the algorithm named `name`, made of the prelude and `file`s; the scripts of
/// the algorithms that hold also take `holds.lua`, after the prelude.
macro_rules! scripts {
    ($name:literal: $($file:literal),+) => {
        (
            $name,
            LazyLock::new(|| {
                Script::new(concat!(include_str!("prelude.lua"), $(include_str!($file)),+))
            }),
            LazyLock::new(|| {
                Script::new(concat!(
                    "local batch, keys, replies, i = ARGV, KEYS, {}, 1\n",
                    "local function one(ARGV, KEYS)\n",
                    include_str!("prelude.lua"),
                    $(include_str!($file),)+
                    include_str!("batch.lua"),
                ))
            }),
        )
    };
}

mod sealed {
    /// The script of one algorithm: public in a private module, as the sealed trait that
    /// names it must be.
    #[allow(unreachable_pub)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum LimiterScript {
        Gcra,
        FixedWindow,
        SlidingLog,
        SlidingCounter,
        Metered,
        Concurrency,
    }

    /// Keeps [`RedisAlgorithm`](super::RedisAlgorithm) to the crate's own algorithms.
    #[allow(unreachable_pub)]
    pub trait Sealed {
        /// The script that runs the algorithm.
        const SCRIPT: LimiterScript;
    }
}

pub(crate) use sealed::LimiterScript;

/// An algorithm of the crate that also runs in Redis, as one Lua script.
///
/// Implemented for [`Gcra`], [`FixedWindow`], [`SlidingLog`], [`SlidingCounter`] and
/// [`Metered`]; it cannot be implemented outside the crate, since every script must match its
/// in-memory twin exactly.
pub trait RedisAlgorithm: Algorithm + sealed::Sealed {}

macro_rules! redis_algorithms {
    ($($algorithm:ident),*) => {$(
        impl sealed::Sealed for $algorithm {
            const SCRIPT: LimiterScript = LimiterScript::$algorithm;
        }
        impl RedisAlgorithm for $algorithm {}
    )*};
}

redis_algorithms!(Gcra, FixedWindow, SlidingLog, SlidingCounter, Metered);

impl LimiterScript {
    /// The name, the script and the batch script (see [`Scripts`]), by the enum's order.
    fn scripts(self) -> &'static Scripts {
        static SCRIPTS: [Scripts; 6] = [
            scripts!("gcra": "gcra.lua"),
            scripts!("fixed_window": "fixed_window.lua"),
            scripts!("sliding_log": "sliding_log.lua"),
            scripts!("sliding_counter": "sliding_counter.lua"),
            scripts!("metered": "holds.lua", "metered.lua"),
            scripts!("concurrency": "holds.lua", "concurrency.lua"),
        ];
        &SCRIPTS[self as usize]
    }

    /// The name used in the default key prefix and in logs.
    pub(crate) fn name(self) -> &'static str {
        self.scripts().0
    }

    /// Whether its admissions hold what they took under an id until they are given back, or
    /// expire unless renewed: [`Metered`]'s estimates, a concurrent policy's slots.
    pub(crate) fn holds(self) -> bool {
        matches!(self, Self::Metered | Self::Concurrency)
    }
}

/// What one script call asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operation {
    /// A decision that waits at most `max_wait` ticks for a reservation. A script that runs after
    /// `deadline` (the server's `TIME`, microseconds) changes nothing and answers "late". For a
    /// script that [holds](LimiterScript::holds), `hold` is the id its admission's hold takes
    /// (0 for the other scripts).
    Decide {
        max_wait: u64,
        deadline: u64,
        hold: u64,
    },
    /// Giving back an admission whose permits were `charged` (at `charged.at`, leaving the key
    /// at `charged.tat`: GCRA's TAT, the sliding counter's numbering plus one, zero for the
    /// others; GCRA's at `charged.per_permit` each) and which `waited` nanoseconds for them
    /// (zero: admitted at once; the decision was made `waited` before `charged.at`). A refund
    /// has no deadline.
    Refund { charged: Charged, waited: u64 },
    /// Charging the permits at the script's instant, never refused: what an admission cost
    /// beyond its estimate. A charge has no deadline, as a refund has none.
    Charge,
    /// A lease of `wanted` permits (at least the call's cost) for `length` ticks under the id
    /// `id`, giving back `back` (a lease id, 0 for none) with its `unused` permits first. After
    /// `deadline` it changes nothing and answers "late", as a decision does.
    Lease {
        length: u64,
        wanted: u32,
        id: u64,
        back: u64,
        unused: u32,
        deadline: u64,
    },
    /// The lease `id` comes back with `unused` permits.
    EndLease { id: u64, unused: u32 },
    /// The hold `hold` settles: [`Metered`]'s, of `estimate` permits, to the call's cost; a
    /// concurrent policy's gives back its last `estimate` slots of the call's cost (the slots
    /// it had: a slot has no cost to settle to). A settle has no deadline, as a refund has none.
    Settle { hold: u64, estimate: u32 },
    /// Each hold named after the arguments is renewed (see [`ScriptQuota::renewal`]).
    Renew,
}

/// A quota and the arguments a script takes for it, in the ticks the script works in.
#[derive(Clone, Debug)]
pub(crate) struct ScriptQuota {
    pub(crate) quota: Quota,
    pub(crate) script: LimiterScript,
    /// Nanoseconds per tick: 1000 with the server's time (microseconds), 1 with a client clock.
    pub(crate) tick_nanos: u64,
    /// Milliseconds added to every key expiry (see [`CLIENT_CLOCK_TTL_MARGIN_MS`]).
    ttl_margin_ms: u64,
    /// The algorithm's own arguments (ARGV[8..]); for a script that holds, the last is how long
    /// a hold lasts unless renewed.
    args: Vec<u64>,
    /// The quota's `max_wait`, in ticks, rounded down (never wait longer than allowed).
    pub(crate) max_wait: u64,
    /// The `limit` of every decision.
    pub(crate) limit: u64,
    /// The most permits one request may ask for.
    pub(crate) capacity: u32,
    /// The limiter's clock's reading when this quota replaced another (0 for the first): an
    /// older reading is decided at, and sent to a client clock's script as, this one, so a
    /// reading older than a change of quota is decided as of the change, as in memory.
    changed_at: u64,
}

impl ScriptQuota {
    /// The arguments of `script` for `quota`, in the server's microseconds or, with
    /// `client_clock`, in nanoseconds; or why the quota cannot run exactly in Lua.
    pub(crate) fn new(
        script: LimiterScript,
        quota: Quota,
        client_clock: bool,
    ) -> Result<Self, BuildError> {
        let tick_nanos = if client_clock { 1 } else { 1000 };
        let permits = u64::from(quota.permits());
        // Durations that bound admissions round up, so the rate is never exceeded; the wait a
        // caller accepts rounds down.
        let period = quota.period_nanos().div_ceil(tick_nanos);
        let max_wait = quota.max_wait_nanos() / tick_nanos;
        if max_wait > MAX_TICKS {
            return Err(BuildError::at(
                "max_wait",
                "the quota's max_wait is too long for the redis store",
            ));
        }
        let (mut args, limit, capacity) = match script {
            LimiterScript::Gcra | LimiterScript::Metered => {
                let interval = quota
                    .period_nanos()
                    .div_ceil(permits.saturating_mul(tick_nanos));
                let burst = quota.burst();
                let horizon = interval.saturating_mul(u64::from(burst));
                if horizon > MAX_TICKS {
                    return Err(BuildError::new(
                        "burst times the emission interval is too long for the redis store",
                    ));
                }
                let limit = u64::from(burst);
                (vec![interval, horizon, limit], limit, burst)
            }
            LimiterScript::Concurrency => {
                let burst = quota.burst();
                (vec![u64::from(burst)], u64::from(burst), burst)
            }
            LimiterScript::FixedWindow | LimiterScript::SlidingLog => {
                if period > MAX_TICKS {
                    return Err(BuildError::at(
                        "period",
                        "the quota's period is too long for the redis store",
                    ));
                }
                (vec![period, permits], permits, quota.permits())
            }
            LimiterScript::SlidingCounter => {
                // The script multiplies counts by the window length.
                if period > MAX_TICKS || (permits + 1).saturating_mul(period) > MAX_SCRIPT_NOW {
                    return Err(BuildError::new(
                        "permits times the period is too large for the redis sliding counter",
                    ));
                }
                (vec![period, permits], permits, quota.permits())
            }
        };
        if script.holds() {
            args.push(saturating_nanos(DEFAULT_HOLD_FOR) / tick_nanos);
        }
        Ok(Self {
            quota,
            script,
            tick_nanos,
            ttl_margin_ms: if client_clock {
                CLIENT_CLOCK_TTL_MARGIN_MS
            } else {
                0
            },
            args,
            max_wait,
            limit,
            capacity,
            changed_at: 0,
        })
    }

    /// The arguments for `quota` on the same script and clock, holds lasting as long: what a
    /// `set_quota` sends from then on, or why `quota` cannot run in the scripts.
    pub(crate) fn with_quota(&self, quota: Quota) -> Result<Self, BuildError> {
        let next = Self::new(self.script, quota, self.client_clock())?;
        Ok(Self {
            changed_at: self.changed_at,
            ..next.holding_for_ticks(self.args.last().copied())
        })
    }

    /// These arguments as a change of quota made at the clock's reading `now` (or at the
    /// change before, if that read later: the floor never moves back).
    pub(crate) fn changed_at(self, now: u64) -> Self {
        Self {
            changed_at: now.min(MAX_SCRIPT_NOW).max(self.changed_at),
            ..self
        }
    }

    /// A reading of `clock`, no earlier than the change of quota that made these arguments:
    /// what the instance decides a lease's share at, and what a client clock's script call is
    /// sent. (A cached refusal reads the clock as it is: it only ever refuses.)
    pub(crate) fn reading(&self, clock: &dyn Clock) -> u64 {
        clock.now().max(self.changed_at)
    }

    /// These arguments with holds lasting `hold_for` unless renewed, rounded up to a tick (the
    /// builder checks the bounds); the other scripts hold nothing.
    pub(crate) fn holding_for(self, hold_for: Duration) -> Self {
        let ticks = saturating_nanos(hold_for).div_ceil(self.tick_nanos);
        self.holding_for_ticks(Some(ticks))
    }

    fn holding_for_ticks(mut self, ticks: Option<u64>) -> Self {
        if let (true, Some(ticks)) = (self.script.holds(), ticks) {
            *self
                .args
                .last_mut()
                .expect("a script that holds has arguments") = ticks;
        }
        self
    }

    /// What each permit of a GCRA admission is charged (the emission interval, in ticks); zero
    /// for the other algorithms.
    pub(crate) fn per_permit(&self) -> u64 {
        match self.script {
            LimiterScript::Gcra => self.args[0],
            _ => 0,
        }
    }

    /// Whether the scripts read a client clock (nanoseconds) rather than the server's `TIME`.
    pub(crate) fn client_clock(&self) -> bool {
        self.tick_nanos == 1
    }

    /// The reading of `clock` a script call is given where the scripts read a client clock
    /// (no earlier than the change of quota that made these arguments), `None` where they read
    /// the server's `TIME`; an error for a reading past [`MAX_SCRIPT_NOW`].
    pub(crate) fn client_now(&self, clock: &dyn Clock) -> Result<Option<u64>, RedisFailure> {
        if !self.client_clock() {
            return Ok(None);
        }
        match self.reading(clock) {
            now if now > MAX_SCRIPT_NOW => Err(RedisFailure::ClockOutOfRange(now)),
            now => Ok(Some(now)),
        }
    }

    /// Ticks per millisecond, for key expiries.
    fn ticks_per_ms(&self) -> u64 {
        1_000_000 / self.tick_nanos
    }

    /// The call of this quota's script on `key` for `cost` permits, at `now` (a client clock's
    /// reading, or `None` for the server's `TIME`), with its arguments in the order
    /// `prelude.lua` reads them.
    pub(crate) fn invocation(
        &self,
        key: &str,
        operation: Operation,
        now: Option<u64>,
        cost: u32,
    ) -> ScriptInvocation<'static> {
        let mut invocation = self.script.scripts().1.prepare_invoke();
        invocation.key(key);
        self.push_args(&mut invocation, operation, now, cost);
        invocation
    }

    /// One call of the batch script on `key`: each of `decisions` (an operation, a clock
    /// reading and a cost, with the quota it was asked under) as [`invocation`](Self::invocation)
    /// would send it alone. Only decisions are batched: they take [`Self::decide_args`]
    /// arguments each.
    pub(crate) fn batch_invocation<'a>(
        &self,
        key: &str,
        decisions: impl Iterator<Item = (&'a ScriptQuota, Operation, Option<u64>, u32)>,
    ) -> ScriptInvocation<'static> {
        let mut invocation = self.script.scripts().2.prepare_invoke();
        invocation.key(key);
        for (quota, operation, now, cost) in decisions {
            invocation.arg(quota.decide_args(operation));
            quota.push_args(&mut invocation, operation, now, cost);
        }
        invocation
    }

    /// How many arguments a decision takes: the prelude's seven, the algorithm's own, and the
    /// id of its hold, for a script that holds.
    fn decide_args(&self, operation: Operation) -> usize {
        let hold = matches!(operation, Operation::Decide { hold, .. } if hold != 0);
        7 + self.args.len() + usize::from(hold)
    }

    /// One renewal call of the batch script on `holds`, each key with its holds (their ids and
    /// the units each still has), at `now` (see `holds.lua`).
    pub(crate) fn renewal(
        &self,
        holds: &[super::hold::KeyHolds],
        now: Option<u64>,
    ) -> ScriptInvocation<'static> {
        let mut invocation = self.script.scripts().2.prepare_invoke();
        for (key, held) in holds {
            invocation.key(key);
            invocation.arg(7 + self.args.len() + 2 * held.len());
            self.push_args(&mut invocation, Operation::Renew, now, 0);
            for &(id, units) in held {
                invocation.arg(id).arg(units);
            }
        }
        invocation
    }

    /// The arguments of `operation` in the order `prelude.lua` reads them.
    fn push_args(
        &self,
        invocation: &mut ScriptInvocation<'static>,
        operation: Operation,
        now: Option<u64>,
        cost: u32,
    ) {
        // The operation, ARGV[5], the deadline, and the arguments after the algorithm's own.
        let (op, arg5, deadline, tail) = match operation {
            Operation::Decide {
                max_wait,
                deadline,
                hold,
            } => {
                // A decision of a script that holds names its hold; the others have no tail.
                let has_hold = usize::from(hold != 0);
                ("d", max_wait, Some(deadline), &[hold][..has_hold])
            }
            // How long the admission waited, in ticks (a wait is a whole number of them); '0':
            // it was admitted at once.
            Operation::Refund { charged, waited } => (
                "r",
                charged.at,
                None,
                &[charged.tat, waited / self.tick_nanos][..],
            ),
            Operation::Charge => ("c", 0, None, &[][..]),
            Operation::Lease {
                length,
                wanted,
                id,
                back,
                unused,
                deadline,
            } => (
                "l",
                length,
                Some(deadline),
                &[wanted.into(), id, back, unused.into()][..],
            ),
            Operation::EndLease { id, unused } => ("e", 0, None, &[unused.into(), id][..]),
            Operation::Settle { hold, estimate } => ("s", estimate.into(), None, &[hold][..]),
            Operation::Renew => ("k", 0, None, &[][..]),
        };
        let text = |n: Option<u64>| n.map_or_else(String::new, |n| n.to_string());
        invocation
            .arg(op)
            .arg(text(now))
            .arg(self.ticks_per_ms())
            .arg(cost)
            .arg(arg5)
            .arg(self.ttl_margin_ms)
            .arg(text(deadline));
        for (i, arg) in self.args.iter().enumerate() {
            match operation {
                // GCRA gives back no more per permit than the admission was charged.
                Operation::Refund { charged, .. }
                    if i == 0 && self.script == LimiterScript::Gcra =>
                {
                    invocation.arg((*arg).min(charged.per_permit))
                }
                _ => invocation.arg(*arg),
            };
        }
        invocation.arg(tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn quotas_convert_to_ticks_rounding_towards_safety() {
        let q = Quota::per_second(3)
            .unwrap()
            .with_max_wait(Duration::from_nanos(2_500))
            .unwrap();
        let micros = ScriptQuota::new(LimiterScript::Gcra, q, false).unwrap();
        assert_eq!(micros.args, [333_334, 1_000_002, 3]);
        assert_eq!(micros.max_wait, 2);
        assert_eq!(micros.ticks_per_ms(), 1000);
        let nanos = ScriptQuota::new(LimiterScript::Gcra, q, true).unwrap();
        assert_eq!(nanos.args[0], q.emission_interval_nanos());
        assert_eq!(micros.ttl_margin_ms, 0);
        assert_eq!(nanos.ttl_margin_ms, CLIENT_CLOCK_TTL_MARGIN_MS);
        let fw = ScriptQuota::new(LimiterScript::FixedWindow, q, false).unwrap();
        assert_eq!(fw.args, [1_000_000, 3]);
        // A script that holds ends with how long a hold lasts, in its ticks, rounded up.
        let hold_for = Duration::from_nanos(1_499_999_999);
        let slots = ScriptQuota::new(LimiterScript::Concurrency, q, false).unwrap();
        assert_eq!(slots.holding_for(hold_for).args, [3, 1_500_000]);
        let slots = ScriptQuota::new(LimiterScript::Concurrency, q, true).unwrap();
        let slots = slots.holding_for(hold_for);
        assert_eq!(slots.args, [3, 1_499_999_999]);
        // A new quota keeps how long holds last.
        let four = Quota::per_second(4).unwrap();
        assert_eq!(slots.with_quota(four).unwrap().args, [4, 1_499_999_999]);
    }

    #[test]
    fn quotas_beyond_exact_lua_arithmetic_are_refused() {
        let long = Quota::with_period(1, Duration::from_secs(60 * 86_400)).unwrap();
        assert!(
            ScriptQuota::new(LimiterScript::Gcra, long, true).is_err(),
            "60 days in ns"
        );
        assert!(
            ScriptQuota::new(LimiterScript::Gcra, long, false).is_ok(),
            "60 days in µs"
        );
        let many = Quota::with_period(u32::MAX, Duration::from_secs(86_400)).unwrap();
        assert!(ScriptQuota::new(LimiterScript::SlidingCounter, many, false).is_err());
        assert!(ScriptQuota::new(LimiterScript::SlidingLog, many, false).is_ok());
    }
}
