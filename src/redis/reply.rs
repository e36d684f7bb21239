//! What a script answers, read without trusting it: a reply of the wrong shape, type or range
//! is an error that names what is wrong, never a panic.
//!
//! Every reply is an array of non-negative integers led by its status (see [`Reply`]). A
//! decision has seven: the status (refused or admitted), remaining, retry_after, reset_after,
//! wait, reserved_at (the instant the permits were charged at) and the server's time, the
//! durations in ticks. GCRA's and the sliding counter's have eight: what the admission left
//! (GCRA's TAT; the sliding counter's numbering of windows, plus one), zero for a refusal,
//! comes before the time.

use std::time::Duration;

use redis::Value;

use super::script::{LimiterScript, ScriptQuota};
use super::RedisFailure;
use crate::decision::Decision;

/// The largest instant a reply may carry: beyond it Lua's arithmetic was not exact.
const MAX_EXACT: u64 = 1 << 53;

/// A script's reply, each with the server's `TIME` (microseconds) at which the script ran. The
/// status that leads the reply (the numbers `prelude.lua` answers with) tells which.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A decision: `[0 refused or 1 admitted, remaining, retry_after, reset_after, wait,
    /// reserved_at, (state_after,) time]`.
    Decision(Decision, u64),
    /// The script ran after its deadline and changed nothing: `[2, time]`.
    Late(u64),
    /// A refund, a charge or a lease's give-back was applied: `[3, time]`.
    Applied(u64),
    /// A lease of `permits` from `start` until `end` (the script's ticks), `remaining` left in
    /// Redis: `[4, permits, start, end, remaining, time]`.
    Leased {
        permits: u64,
        start: u64,
        end: u64,
        remaining: u64,
        time: u64,
    },
}

impl Reply {
    /// The server's `TIME` when the script ran, in microseconds.
    pub(crate) fn server_time(&self) -> u64 {
        match *self {
            Reply::Decision(_, time)
            | Reply::Late(time)
            | Reply::Applied(time)
            | Reply::Leased { time, .. } => time,
        }
    }

    /// The failure of this reply to a call that `expected` another (a decision, a lease).
    pub(crate) fn unexpected(self, expected: &str) -> RedisFailure {
        RedisFailure::BadReply(format!("{self:?} is not {expected}"))
    }

    /// Nothing if this reply says the call was applied, as the `answer` to a give-back, a
    /// charge or a renewal must; otherwise the failure of an unexpected reply.
    pub(crate) fn applied(self, answer: &str) -> Result<(), RedisFailure> {
        match self {
            Reply::Applied(_) => Ok(()),
            other => Err(other.unexpected(answer)),
        }
    }
}

/// The fields of a decision, in order; only GCRA's and the sliding counter's carry
/// `state_after`.
const DECISION: [&str; 8] = [
    "status",
    "remaining",
    "retry_after",
    "reset_after",
    "wait",
    "reserved_at",
    "state_after",
    "time",
];

/// Reads the reply of a script that ran with `quota`.
pub(crate) fn parse_reply(value: &Value, quota: &ScriptQuota) -> Result<Reply, RedisFailure> {
    let Value::Array(items) = value else {
        return Err(bad(format!("expected an array of integers, got {value:?}")));
    };
    let status = int(
        "status",
        items.first().ok_or_else(|| bad("an empty array".into()))?,
    )?;
    // GCRA's decisions carry the TAT an admission left, the sliding counter's the numbering of
    // windows it was counted under; the other scripts' carry neither.
    let with_state_after = matches!(
        quota.script,
        LimiterScript::Gcra | LimiterScript::SlidingCounter
    );
    let names: Vec<&str> = match status {
        0 | 1 => DECISION
            .into_iter()
            .filter(|&name| with_state_after || name != "state_after")
            .collect(),
        2 | 3 => vec!["status", "time"],
        4 => vec!["status", "permits", "start", "end", "remaining", "time"],
        _ => {
            let what = format!("the status is not one a script answers ({status})");
            return Err(bad(what));
        }
    };
    if items.len() != names.len() {
        let (expected, got) = (names.len(), items.len());
        return Err(bad(format!("expected {expected} integers, got {got}")));
    }
    // Each field by its name, checked; a field the reply does not carry (a window script's
    // `state_after`) is zero.
    let field = |name: &str| match names.iter().position(|&n| n == name) {
        Some(i) => int(name, &items[i]),
        None => Ok(0),
    };
    let instant = |name: &str| match field(name)? {
        instant if instant >= MAX_EXACT => {
            Err(bad(format!("`{name}` is out of range ({instant})")))
        }
        instant => Ok(instant),
    };
    let time = instant("time")?;
    match status {
        2 => return Ok(Reply::Late(time)),
        3 => return Ok(Reply::Applied(time)),
        4 => {
            let (permits, remaining) = (field("permits")?, field("remaining")?);
            if permits == 0 || permits.saturating_add(remaining) > quota.limit {
                return Err(bad(format!(
                    "a lease of {permits} with {remaining} left exceeds the limit ({})",
                    quota.limit
                )));
            }
            let (start, end) = (instant("start")?, instant("end")?);
            if end <= start {
                return Err(bad(format!(
                    "a lease that ends ({end}) by its start ({start})"
                )));
            }
            return Ok(Reply::Leased {
                permits,
                start,
                end,
                remaining,
                time,
            });
        }
        _ => {}
    }
    let (reserved_at, state_after) = (instant("reserved_at")?, instant("state_after")?);
    let remaining = field("remaining")?;
    let limit = quota.limit;
    if remaining > limit {
        return Err(bad(format!(
            "`remaining` ({remaining}) exceeds the limit ({limit})"
        )));
    }
    let duration = |name: &str| {
        let ticks = field(name)?;
        ticks
            .checked_mul(quota.tick_nanos)
            .map(Duration::from_nanos)
            .ok_or_else(|| bad(format!("`{name}` is out of range ({ticks})")))
    };
    let (retry_after, reset_after, wait) = (
        duration("retry_after")?,
        duration("reset_after")?,
        duration("wait")?,
    );
    let decision = if status == 0 {
        Decision::refused(limit, remaining, retry_after, reset_after)
    } else {
        // An immediate admission is a reservation of no wait.
        Decision::reserved(limit, remaining, reset_after, wait, reserved_at)
            .leaving(state_after, quota.per_permit())
    };
    Ok(Reply::Decision(decision, time))
}

/// The item `name` of a reply, a non-negative integer.
fn int(name: &str, item: &Value) -> Result<u64, RedisFailure> {
    match item {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad(format!("`{name}` is negative ({n})"))),
        other => Err(bad(format!("`{name}` is not an integer: {other:?}"))),
    }
}

fn bad(what: String) -> RedisFailure {
    RedisFailure::BadReply(what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
    use proptest::prelude::*;

    fn quota() -> ScriptQuota {
        ScriptQuota::new(LimiterScript::Gcra, Quota::per_second(10).unwrap(), false).unwrap()
    }

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&n| Value::Int(n)).collect())
    }

    fn decision(value: &Value) -> Result<Decision, RedisFailure> {
        match parse_reply(value, &quota())? {
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
            .leaving(100_055, quota().per_permit());
        assert_eq!(
            d, expected,
            "an immediate admission keeps the instant it was charged at and the TAT it left"
        );
        let d = decision(&ints(&[0, 0, 50_000, 1_000_000, 0, 0, 0, 123])).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(50));
        let d = decision(&ints(&[1, 0, 0, 1_000_000, 20, 77, 1_000_077, 123])).unwrap();
        assert_eq!(d.wait, Duration::from_micros(20));
        assert_eq!(d.charged().at, 77);
        assert_eq!(d.charged().tat, 1_000_077);
        let q = quota();
        assert_eq!(parse_reply(&ints(&[2, 99]), &q).unwrap(), Reply::Late(99));
        assert_eq!(
            parse_reply(&ints(&[3, 98]), &q).unwrap(),
            Reply::Applied(98)
        );
        // The other algorithms answer with seven integers and leave no TAT.
        let fw = ScriptQuota::new(
            LimiterScript::FixedWindow,
            Quota::per_second(10).unwrap(),
            false,
        )
        .unwrap();
        match parse_reply(&ints(&[1, 9, 0, 100_000, 0, 55, 123]), &fw).unwrap() {
            Reply::Decision(d, 123) => {
                assert_eq!(d.charged().at, 55);
                assert_eq!(d.charged().tat, 0);
            }
            other => panic!("not a decision: {other:?}"),
        }
        assert!(parse_reply(&ints(&[1, 9, 0, 100_000, 0, 55, 0, 123]), &fw).is_err());
        // The sliding counter's carry the numbering of its windows, plus one.
        let sc = ScriptQuota::new(
            LimiterScript::SlidingCounter,
            Quota::per_second(10).unwrap(),
            false,
        )
        .unwrap();
        match parse_reply(&ints(&[1, 9, 0, 100_000, 0, 55, 3, 123]), &sc).unwrap() {
            Reply::Decision(d, 123) => assert_eq!((d.charged().at, d.charged().tat), (55, 3)),
            other => panic!("not a decision: {other:?}"),
        }
        assert!(parse_reply(&ints(&[1, 9, 0, 100_000, 0, 55, 123]), &sc).is_err());
    }

    #[test]
    fn replies_of_the_wrong_shape_are_errors_that_say_what_is_wrong() {
        let q = quota();
        let cases = [
            (Value::Nil, "expected an array"),
            (Value::Int(1), "expected an array"),
            (Value::Okay, "expected an array"),
            (Value::BulkString(b"1".to_vec()), "expected an array"),
            (Value::Array(Vec::new()), "an empty array"),
            (ints(&[1, 2, 3]), "expected 8 integers, got 3"),
            (ints(&[1, 2, 3, 4, 5, 6]), "expected 8 integers, got 6"),
            // GCRA's decisions have eight integers, the other scripts' seven.
            (ints(&[1, 2, 3, 4, 5, 6, 7]), "expected 8 integers, got 7"),
            (
                ints(&[1, 2, 3, 4, 5, 6, 7, 8, 9]),
                "expected 8 integers, got 9",
            ),
            (
                ints(&[2, 0, 0, 0, 0, 0, 0, 0]),
                "expected 2 integers, got 8",
            ),
            (ints(&[2]), "expected 2 integers, got 1"),
            (ints(&[3, 1, 2]), "expected 2 integers, got 3"),
            (ints(&[5, 0]), "the status is not one a script answers"),
            // A lease: status 4, permits, end, remaining, time.
            (ints(&[4, 0]), "expected 6 integers, got 2"),
            (ints(&[4, 0, 1, 9, 3, 1]), "a lease of 0 with 3 left"),
            (ints(&[4, 8, 1, 9, 3, 1]), "exceeds the limit (10)"),
            (ints(&[4, 2, 1, 1 << 53, 3, 1]), "`end` is out of range"),
            (ints(&[4, 2, 9, 9, 3, 1]), "ends (9) by its start (9)"),
            (ints(&[4, 2, 1, 9, -3, 1]), "`remaining` is negative"),
            (ints(&[-1, 0]), "`status` is negative"),
            (ints(&[2, -5]), "`time` is negative"),
            (ints(&[2, 1 << 53]), "`time` is out of range"),
            (ints(&[1, -1, 0, 0, 0, 0, 0, 0]), "`remaining` is negative"),
            (ints(&[1, 11, 0, 0, 0, 0, 0, 0]), "`remaining` (11) exceeds"),
            (
                ints(&[0, 0, i64::MAX, 0, 0, 0, 0, 0]),
                "`retry_after` is out of range",
            ),
            (
                ints(&[1, 0, 0, 0, 5, 1 << 53, 0, 0]),
                "`reserved_at` is out of range",
            ),
            (
                ints(&[1, 0, 0, 0, 5, 0, 1 << 53, 0]),
                "`state_after` is out of range",
            ),
            (
                ints(&[1, 0, 0, 0, 5, 0, -1, 0]),
                "`state_after` is negative",
            ),
            (
                ints(&[1, 0, 0, 0, 0, 0, 0, 1 << 53]),
                "`time` is out of range",
            ),
            (ints(&[1, 0, 0, 0, 0, 0, 0, -1]), "`time` is negative"),
            (
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
                "`remaining` is not an integer",
            ),
            (
                Value::Array(vec![Value::Double(0.5); 8]),
                "`status` is not an integer",
            ),
            (
                Value::Array(vec![Value::BulkString(b"late".to_vec()), Value::Int(1)]),
                "`status` is not an integer",
            ),
        ];
        for (value, what) in cases {
            let err = parse_reply(&value, &q).expect_err(&format!("{value:?}"));
            assert!(matches!(err, RedisFailure::BadReply(_)), "{err}");
            assert!(err.to_string().starts_with("redis"), "{err}");
            assert!(err.to_string().contains(what), "{value:?}: {err}");
        }
    }

    fn any_item() -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => (0i64..20).prop_map(Value::Int),
            1 => any::<i64>().prop_map(Value::Int),
            1 => any::<Vec<u8>>().prop_map(Value::BulkString),
            1 => any::<f64>().prop_map(Value::Double),
            1 => Just(Value::Nil),
        ]
    }

    proptest! {
        /// Whatever a server answers, reading it gives a reply or an error, never a panic.
        #[test]
        fn any_reply_is_read_without_a_panic(
            items in prop::collection::vec(any_item(), 0..10),
            gcra in any::<bool>(),
        ) {
            let script = if gcra { LimiterScript::Gcra } else { LimiterScript::SlidingLog };
            let quota = ScriptQuota::new(script, Quota::per_second(10).unwrap(), false).unwrap();
            let _ = parse_reply(&Value::Array(items), &quota);
        }
    }
}
