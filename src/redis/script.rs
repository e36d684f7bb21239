//! The Lua scripts, the arguments they take and the replies they give.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::error::RedisFailure;
use crate::algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog};
use crate::{algorithm::Algorithm, decision::Decision, Quota};

/// The largest tick count a script may see: the arithmetic stays exact in Lua's doubles (53 bits)
/// with room for the sums of a few such values.
pub(crate) const MAX_TICKS: u64 = 1 << 50;

/// With a client clock (nanosecond ticks), the pace of time need not match the server's, so
/// expiries get this margin: no state may expire in real time while it still matters on the
/// client's clock (a manual clock in a test may stand still for a while).
pub(crate) const CLIENT_CLOCK_TTL_MARGIN_MS: u64 = 60_000;

/// The largest `now` a script may be given, in ticks.
pub(crate) const MAX_NOW: u64 = 1 << 52;

macro_rules! limiter_script {
    ($file:literal) => {
        LazyLock::new(|| Script::new(concat!(include_str!("prelude.lua"), include_str!($file))))
    };
}

static GCRA: LazyLock<Script> = limiter_script!("gcra.lua");
static FIXED_WINDOW: LazyLock<Script> = limiter_script!("fixed_window.lua");
static SLIDING_LOG: LazyLock<Script> = limiter_script!("sliding_log.lua");
static SLIDING_COUNTER: LazyLock<Script> = limiter_script!("sliding_counter.lua");

mod sealed {
    /// Which script an algorithm runs.
    #[allow(unreachable_pub)] // Sealed-trait pattern: public in a private module on purpose.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Kind {
        Gcra,
        FixedWindow,
        SlidingLog,
        SlidingCounter,
    }

    /// Keeps [`RedisAlgorithm`](super::RedisAlgorithm) to the crate's own algorithms.
    #[allow(unreachable_pub)] // Sealed-trait pattern: public in a private module on purpose.
    pub trait Sealed {
        fn kind() -> Kind;
    }
}

pub(crate) use sealed::Kind;

/// An algorithm of the crate that also runs in Redis, as one Lua script.
///
/// Implemented for [`Gcra`], [`FixedWindow`], [`SlidingLog`] and [`SlidingCounter`]; it cannot be
/// implemented outside the crate, since every script must match its in-memory twin exactly.
pub trait RedisAlgorithm: Algorithm + sealed::Sealed {}

impl sealed::Sealed for Gcra {
    fn kind() -> Kind {
        Kind::Gcra
    }
}
impl RedisAlgorithm for Gcra {}

impl sealed::Sealed for FixedWindow {
    fn kind() -> Kind {
        Kind::FixedWindow
    }
}
impl RedisAlgorithm for FixedWindow {}

impl sealed::Sealed for SlidingLog {
    fn kind() -> Kind {
        Kind::SlidingLog
    }
}
impl RedisAlgorithm for SlidingLog {}

impl sealed::Sealed for SlidingCounter {
    fn kind() -> Kind {
        Kind::SlidingCounter
    }
}
impl RedisAlgorithm for SlidingCounter {}

pub(crate) fn kind_of<A: RedisAlgorithm>() -> Kind {
    <A as sealed::Sealed>::kind()
}

impl Kind {
    pub(crate) fn script(self) -> &'static Script {
        match self {
            Kind::Gcra => &GCRA,
            Kind::FixedWindow => &FIXED_WINDOW,
            Kind::SlidingLog => &SLIDING_LOG,
            Kind::SlidingCounter => &SLIDING_COUNTER,
        }
    }

    /// The name used in the default key prefix and in logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Gcra => "gcra",
            Kind::FixedWindow => "fixed_window",
            Kind::SlidingLog => "sliding_log",
            Kind::SlidingCounter => "sliding_counter",
        }
    }
}

/// A quota translated into the ticks a script works in.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    pub(crate) kind: Kind,
    /// Nanoseconds per tick: 1000 with the server's time (microseconds), 1 with a client clock.
    pub(crate) tick_nanos: u64,
    /// Milliseconds added to every key expiry (see [`CLIENT_CLOCK_TTL_MARGIN_MS`]).
    pub(crate) ttl_margin_ms: u64,
    /// The algorithm's own arguments (ARGV[8..]), as decimal strings.
    pub(crate) args: Vec<String>,
    /// The quota's `max_wait`, in ticks, rounded down (never wait longer than allowed).
    pub(crate) max_wait: u64,
    /// The `limit` of every decision.
    pub(crate) limit: u64,
    /// The most permits one request may ask for.
    pub(crate) capacity: u32,
}

impl Params {
    pub(crate) fn new(kind: Kind, quota: &Quota, tick_nanos: u64) -> Result<Self, &'static str> {
        let permits = u64::from(quota.permits());
        // Durations that bound admissions round up, so the rate is never exceeded; the wait a
        // caller accepts rounds down.
        let period = quota.period_nanos().div_ceil(tick_nanos);
        let max_wait = quota.max_wait_nanos() / tick_nanos;
        if max_wait > MAX_TICKS {
            return Err("the quota's max_wait is too long for the redis store");
        }
        let (args, limit, capacity) = match kind {
            Kind::Gcra => {
                let interval = quota
                    .period_nanos()
                    .div_ceil(permits.saturating_mul(tick_nanos));
                let burst = quota.burst();
                let horizon = interval.saturating_mul(u64::from(burst));
                if horizon > MAX_TICKS {
                    return Err(
                        "burst times the emission interval is too long for the redis store",
                    );
                }
                let limit = u64::from(burst);
                (vec![interval, horizon, limit], limit, burst)
            }
            Kind::FixedWindow | Kind::SlidingLog => {
                if period > MAX_TICKS {
                    return Err("the quota's period is too long for the redis store");
                }
                (vec![period, permits], permits, quota.permits())
            }
            Kind::SlidingCounter => {
                // The script multiplies counts by the window length.
                if period > MAX_TICKS || (permits + 1).saturating_mul(period) > MAX_NOW {
                    return Err(
                        "permits times the period is too large for the redis sliding counter",
                    );
                }
                (vec![period, permits], permits, quota.permits())
            }
        };
        Ok(Self {
            kind,
            tick_nanos,
            ttl_margin_ms: if tick_nanos == 1 {
                CLIENT_CLOCK_TTL_MARGIN_MS
            } else {
                0
            },
            args: args.iter().map(u64::to_string).collect(),
            max_wait,
            limit,
            capacity,
        })
    }

    /// Ticks per millisecond, for key expiries.
    pub(crate) fn ticks_per_ms(&self) -> u64 {
        1_000_000 / self.tick_nanos
    }
}

fn int_field(value: &Value, name: &str) -> Result<u64, RedisFailure> {
    match value {
        Value::Int(n) => u64::try_from(*n)
            .map_err(|_| RedisFailure::bad_reply(format!("`{name}` is negative ({n})"))),
        other => Err(RedisFailure::bad_reply(format!(
            "`{name}` is not an integer: {other:?}"
        ))),
    }
}

/// A script's reply, each with the server's `TIME` (microseconds) at which the script ran.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A decision.
    Decision(Decision, u64),
    /// The script ran after its deadline and changed nothing.
    Late(u64),
    /// A refund was applied.
    Refunded(u64),
}

impl Reply {
    /// The server's `TIME` when the script ran, in microseconds.
    pub(crate) fn server_time(&self) -> u64 {
        match *self {
            Reply::Decision(_, time) | Reply::Late(time) | Reply::Refunded(time) => time,
        }
    }
}

/// The largest instant a reply may carry: beyond it Lua's arithmetic was not exact.
const MAX_EXACT: u64 = 1 << 53;

/// Turns a script's reply into a [`Reply`], or says what is wrong with it.
///
/// A decision is an array of seven non-negative integers: allowed (0 or 1), remaining,
/// retry_after, reset_after, wait, reserved_at (the instant the permits were charged at) and
/// the server's time, the durations in ticks. GCRA's has eight: the TAT an admission left
/// (zero for a refusal) comes before the time. "Late" is `[2, time]`, a refund `[3, time]`.
pub(crate) fn parse_reply(value: &Value, params: &Params) -> Result<Reply, RedisFailure> {
    let Value::Array(items) = value else {
        return Err(RedisFailure::bad_reply(format!(
            "expected an array of integers, got {value:?}"
        )));
    };
    let time = |value: &Value| -> Result<u64, RedisFailure> {
        let time = int_field(value, "time")?;
        if time >= MAX_EXACT {
            return Err(RedisFailure::bad_reply(format!(
                "`time` is out of range ({time})"
            )));
        }
        Ok(time)
    };
    let status = match items.first() {
        Some(status) => int_field(status, "status")?,
        None => return Err(RedisFailure::bad_reply("an empty array".into())),
    };
    // GCRA's decisions carry the TAT an admission left; the other scripts' do not.
    let (fields, count) = match params.kind {
        Kind::Gcra => (8, "eight"),
        _ => (7, "seven"),
    };
    match (status, items.as_slice()) {
        (2, [_, t]) => return Ok(Reply::Late(time(t)?)),
        (3, [_, t]) => return Ok(Reply::Refunded(time(t)?)),
        (0 | 1, items) if items.len() == fields => {}
        (0 | 1, _) => {
            return Err(RedisFailure::bad_reply(format!(
                "expected {count} integers, got {}",
                items.len()
            )))
        }
        (2 | 3, _) => {
            return Err(RedisFailure::bad_reply(format!(
                "expected two integers, got {}",
                items.len()
            )))
        }
        (n, _) => {
            return Err(RedisFailure::bad_reply(format!(
                "the status is neither 0, 1, 2 nor 3 ({n})"
            )))
        }
    }
    let (remaining, retry_after, reset_after, wait, reserved_at, state_after, t) =
        match items.as_slice() {
            [_, remaining, retry_after, reset_after, wait, reserved_at, t] => (
                remaining,
                retry_after,
                reset_after,
                wait,
                reserved_at,
                None,
                t,
            ),
            [_, remaining, retry_after, reset_after, wait, reserved_at, state_after, t] => (
                remaining,
                retry_after,
                reset_after,
                wait,
                reserved_at,
                Some(state_after),
                t,
            ),
            _ => unreachable!("seven or eight items checked above"),
        };
    let allowed = status == 1;
    let remaining = int_field(remaining, "remaining")?;
    if remaining > params.limit {
        return Err(RedisFailure::bad_reply(format!(
            "`remaining` ({remaining}) exceeds the limit ({})",
            params.limit
        )));
    }
    let duration = |value: &Value, name: &str| -> Result<Duration, RedisFailure> {
        let ticks = int_field(value, name)?;
        ticks
            .checked_mul(params.tick_nanos)
            .map(Duration::from_nanos)
            .ok_or_else(|| RedisFailure::bad_reply(format!("`{name}` is out of range ({ticks})")))
    };
    let retry_after = duration(retry_after, "retry_after")?;
    let reset_after = duration(reset_after, "reset_after")?;
    let wait = duration(wait, "wait")?;
    let reserved_at = int_field(reserved_at, "reserved_at")?;
    if reserved_at >= MAX_EXACT {
        return Err(RedisFailure::bad_reply(format!(
            "`reserved_at` is out of range ({reserved_at})"
        )));
    }
    let state_after = match state_after {
        Some(value) => {
            let state_after = int_field(value, "state_after")?;
            if state_after >= MAX_EXACT {
                return Err(RedisFailure::bad_reply(format!(
                    "`state_after` is out of range ({state_after})"
                )));
            }
            state_after
        }
        None => 0,
    };
    let time = time(t)?;
    let limit = params.limit;
    let decision = if !allowed {
        Decision::refused(limit, remaining, retry_after, reset_after)
    } else if wait.is_zero() {
        Decision::allowed(limit, remaining, reset_after)
            .charged_at(reserved_at)
            .leaving(state_after)
    } else {
        Decision::reserved(limit, remaining, reset_after, wait, reserved_at).leaving(state_after)
    };
    Ok(Reply::Decision(decision, time))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params::new(Kind::Gcra, &Quota::per_second(10).unwrap(), 1000).unwrap()
    }

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&n| Value::Int(n)).collect())
    }

    fn decision(value: &Value) -> Result<Decision, RedisFailure> {
        match parse_reply(value, &params())? {
            Reply::Decision(decision, time) => {
                assert_eq!(time, 123);
                Ok(decision)
            }
            other => panic!("not a decision: {other:?}"),
        }
    }

    #[test]
    fn a_well_formed_reply_becomes_a_decision() {
        let d = decision(&ints(&[1, 9, 0, 100_000, 0, 55, 100_055, 123])).unwrap();
        let expected = Decision::allowed(10, 9, Duration::from_millis(100))
            .charged_at(55)
            .leaving(100_055);
        assert_eq!(
            d, expected,
            "an immediate admission keeps the instant it was charged at and the TAT it left"
        );
        let d = decision(&ints(&[0, 0, 50_000, 1_000_000, 0, 0, 0, 123])).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(50));
        let d = decision(&ints(&[1, 0, 0, 1_000_000, 20, 77, 1_000_077, 123])).unwrap();
        assert_eq!(d.wait, Duration::from_micros(20));
        assert_eq!(d.reserved_at, 77);
        assert_eq!(d.state_after, 1_000_077);
        let p = params();
        assert_eq!(parse_reply(&ints(&[2, 99]), &p).unwrap(), Reply::Late(99));
        assert_eq!(
            parse_reply(&ints(&[3, 98]), &p).unwrap(),
            Reply::Refunded(98)
        );
        // The other algorithms answer with seven integers and leave no TAT.
        let fw = Params::new(Kind::FixedWindow, &Quota::per_second(10).unwrap(), 1000).unwrap();
        match parse_reply(&ints(&[1, 9, 0, 100_000, 0, 55, 123]), &fw).unwrap() {
            Reply::Decision(d, 123) => {
                assert_eq!(d.reserved_at, 55);
                assert_eq!(d.state_after, 0);
            }
            other => panic!("not a decision: {other:?}"),
        }
        assert!(parse_reply(&ints(&[1, 9, 0, 100_000, 0, 55, 0, 123]), &fw).is_err());
    }

    #[test]
    fn replies_of_the_wrong_shape_are_errors() {
        let p = params();
        let cases = [
            Value::Nil,
            Value::Int(1),
            Value::Okay,
            Value::BulkString(b"1".to_vec()),
            Value::Array(Vec::new()),
            ints(&[1, 2, 3]),
            ints(&[1, 2, 3, 4, 5, 6]),
            // GCRA's decisions have eight integers, the other scripts' seven.
            ints(&[1, 2, 3, 4, 5, 6, 7]),
            ints(&[1, 2, 3, 4, 5, 6, 7, 8, 9]),
            ints(&[2, 0, 0, 0, 0, 0, 0, 0]),
            ints(&[2]),
            ints(&[3, 1, 2]),
            ints(&[4, 0]),
            ints(&[-1, 0]),
            ints(&[2, -5]),
            ints(&[2, 1 << 53]),
            ints(&[1, -1, 0, 0, 0, 0, 0, 0]),
            ints(&[1, 11, 0, 0, 0, 0, 0, 0]),
            ints(&[0, 0, i64::MAX, 0, 0, 0, 0, 0]),
            ints(&[1, 0, 0, 0, 5, 1 << 53, 0, 0]),
            ints(&[1, 0, 0, 0, 5, 0, 1 << 53, 0]),
            ints(&[1, 0, 0, 0, 5, 0, -1, 0]),
            ints(&[1, 0, 0, 0, 0, 0, 0, 1 << 53]),
            ints(&[1, 0, 0, 0, 0, 0, 0, -1]),
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"9".to_vec()),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
            Value::Array(vec![Value::Double(0.5); 8]),
            Value::Array(vec![Value::BulkString(b"late".to_vec()), Value::Int(1)]),
        ];
        for value in cases {
            let err = parse_reply(&value, &p).expect_err(&format!("{value:?}"));
            assert!(err.is_bad_reply(), "{err}");
            assert!(err.to_string().starts_with("redis"), "{err}");
        }
    }

    #[test]
    fn quotas_convert_to_ticks_rounding_towards_safety() {
        let q = Quota::per_second(3)
            .unwrap()
            .with_max_wait(Duration::from_nanos(2_500))
            .unwrap();
        let micros = Params::new(Kind::Gcra, &q, 1000).unwrap();
        assert_eq!(micros.args, ["333334", "1000002", "3"]);
        assert_eq!(micros.max_wait, 2);
        assert_eq!(micros.ticks_per_ms(), 1000);
        let nanos = Params::new(Kind::Gcra, &q, 1).unwrap();
        assert_eq!(nanos.args[0], q.emission_interval_nanos().to_string());
        assert_eq!(micros.ttl_margin_ms, 0);
        assert_eq!(nanos.ttl_margin_ms, CLIENT_CLOCK_TTL_MARGIN_MS);
        let fw = Params::new(Kind::FixedWindow, &q, 1000).unwrap();
        assert_eq!(fw.args, ["1000000", "3"]);
    }

    #[test]
    fn quotas_beyond_exact_lua_arithmetic_are_refused() {
        let long = Quota::with_period(1, Duration::from_secs(60 * 86_400)).unwrap();
        assert!(Params::new(Kind::Gcra, &long, 1).is_err(), "60 days in ns");
        assert!(
            Params::new(Kind::Gcra, &long, 1000).is_ok(),
            "60 days in µs"
        );
        let many = Quota::with_period(u32::MAX, Duration::from_secs(86_400)).unwrap();
        assert!(Params::new(Kind::SlidingCounter, &many, 1000).is_err());
        assert!(Params::new(Kind::SlidingLog, &many, 1000).is_ok());
    }
}
