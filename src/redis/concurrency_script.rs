//! The calls of `concurrency.lua`, which keeps a concurrent policy's slots in Redis, and their
//! replies, read without trusting them.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::{Script, ScriptInvocation, Value};

use super::script::{CLIENT_CLOCK_TTL_MARGIN_MS, MAX_TICKS};
use super::{BuildError, RedisFailure};
use crate::clock::saturating_nanos;

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("concurrency.lua")));

/// The most arguments one renewal call carries: the live slots of many keys go in several.
const MAX_RENEW_ARGS: usize = 3_000;

/// The slots `first..=last` of the admission numbered `seq` (none when `last < first`): their
/// members in Redis are `<instance>:<seq>:<n>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) seq: u64,
    pub(super) first: u32,
    pub(super) last: u32,
}

/// How the script counts time: in ticks of the server's `TIME` (microseconds) or of a client
/// clock (nanoseconds), each slot living `lifetime` ticks unless renewed.
#[derive(Debug)]
pub(super) struct Ticks {
    tick_nanos: u64,
    ttl_margin_ms: u64,
    lifetime: u64,
}

impl Ticks {
    /// Slots that live `expiry` on the server's clock, or with `client_clock` on the client's.
    pub(super) fn new(expiry: Duration, client_clock: bool) -> Result<Self, BuildError> {
        let tick_nanos = if client_clock { 1 } else { 1000 };
        let lifetime = saturating_nanos(expiry).div_ceil(tick_nanos);
        if expiry < Duration::from_millis(1) || lifetime > MAX_TICKS {
            return Err(BuildError::new(
                "a slot's expiry must be at least a millisecond and within the scripts' exact \
                 arithmetic",
            ));
        }
        let ttl_margin_ms = if client_clock {
            CLIENT_CLOCK_TTL_MARGIN_MS
        } else {
            0
        };
        Ok(Self {
            tick_nanos,
            ttl_margin_ms,
            lifetime,
        })
    }
}

/// One call of the script: operation `op` at `now` (a client clock's reading, or `None` for the
/// server's `TIME`) on `keys`, each with its requests, of the instance `instance`; `limit` for
/// an acquisition.
fn invocation<'a>(
    op: &str,
    ticks: &Ticks,
    now: Option<u64>,
    instance: u64,
    keys: impl IntoIterator<Item = (&'a str, &'a [Held])>,
    limit: Option<u32>,
) -> ScriptInvocation<'static> {
    let mut invocation = SCRIPT.prepare_invoke();
    invocation
        .arg(op)
        .arg(now.map_or_else(String::new, |now| now.to_string()))
        .arg(1_000_000 / ticks.tick_nanos)
        .arg(ticks.ttl_margin_ms)
        .arg(ticks.lifetime);
    for (key, held) in keys {
        invocation.key(key).arg(held.len());
        for h in held {
            invocation
                .arg(format!("{instance:016x}:{}", h.seq))
                .arg(h.first)
                .arg(h.last);
        }
    }
    if let Some(limit) = limit {
        invocation.arg(limit);
    }
    invocation
}

/// Takes the slots of `held` on `key` if the key holds no more than `limit` with them.
pub(super) fn acquire(
    ticks: &Ticks,
    now: Option<u64>,
    instance: u64,
    key: &str,
    held: Held,
    limit: u32,
) -> ScriptInvocation<'static> {
    invocation("a", ticks, now, instance, [(key, &[held][..])], Some(limit))
}

/// Gives back the slots of `held` on `key`, those still there.
pub(super) fn release(
    ticks: &Ticks,
    instance: u64,
    key: &str,
    held: Held,
) -> ScriptInvocation<'static> {
    invocation("r", ticks, Some(0), instance, [(key, &[held][..])], None)
}

/// The renewal calls of the live slots `live` (each key with its admissions) at `now`: keys of
/// one cluster slot per call (`cluster`), else any together, and no more than
/// [`MAX_RENEW_ARGS`] arguments a call.
pub(super) fn renewals(
    ticks: &Ticks,
    now: Option<u64>,
    instance: u64,
    cluster: bool,
    live: Vec<(String, Vec<Held>)>,
) -> Vec<ScriptInvocation<'static>> {
    let mut groups: HashMap<Option<Slot>, Vec<(String, Vec<Held>)>> = HashMap::new();
    for (key, held) in live {
        let slot = cluster.then(|| Slot::for_key(&key));
        groups.entry(slot).or_default().push((key, held));
    }
    let mut calls = Vec::new();
    for group in groups.values() {
        let mut start = 0;
        let mut args = 0;
        for (i, (_, held)) in group.iter().enumerate() {
            args += 1 + 3 * held.len();
            if i + 1 == group.len() || args >= MAX_RENEW_ARGS {
                let keys = group[start..=i].iter().map(|(k, h)| (k.as_str(), &h[..]));
                calls.push(invocation("k", ticks, now, instance, keys, None));
                (start, args) = (i + 1, 0);
            }
        }
    }
    calls
}

/// The reply to an acquisition with `limit`: whether it was admitted, and the slots left free.
pub(super) fn acquired(value: &Value, limit: u32) -> Result<(bool, u64), RedisFailure> {
    let (status, free) = pair(value)?;
    if status > 1 {
        return Err(bad(format!(
            "the status {status} does not answer an acquisition"
        )));
    }
    if free > u64::from(limit) {
        return Err(bad(format!(
            "{free} slots free exceeds the limit ({limit})"
        )));
    }
    Ok((status == 1, free))
}

/// The reply to a release or a renewal: the slots it found.
pub(super) fn found(value: &Value) -> Result<u64, RedisFailure> {
    match pair(value)? {
        (2, found) => Ok(found),
        (status, _) => Err(bad(format!(
            "the status {status} does not answer a release or a renewal"
        ))),
    }
}

/// A reply of two non-negative integers.
fn pair(value: &Value) -> Result<(u64, u64), RedisFailure> {
    let int = |name: &str, item: &Value| match item {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad(format!("`{name}` is negative ({n})"))),
        other => Err(bad(format!("`{name}` is not an integer: {other:?}"))),
    };
    match value {
        Value::Array(items) if items.len() == 2 => {
            Ok((int("status", &items[0])?, int("slots", &items[1])?))
        }
        other => Err(bad(format!(
            "expected an array of two integers, got {other:?}"
        ))),
    }
}

fn bad(what: String) -> RedisFailure {
    RedisFailure::BadReply(format!("concurrency slots: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&n| Value::Int(n)).collect())
    }

    #[test]
    fn replies_are_read_and_wrong_ones_say_what_is_wrong() {
        assert_eq!(acquired(&ints(&[1, 3]), 4).unwrap(), (true, 3));
        assert_eq!(acquired(&ints(&[0, 0]), 4).unwrap(), (false, 0));
        assert_eq!(found(&ints(&[2, 7])).unwrap(), 7);
        fn unit<T>(result: Result<T, RedisFailure>) -> Result<(), RedisFailure> {
            result.map(|_| ())
        }
        let wrong = [
            (
                unit(acquired(&ints(&[2, 0]), 4)),
                "the status 2 does not answer an acquisition",
            ),
            (
                unit(acquired(&ints(&[1, 5]), 4)),
                "5 slots free exceeds the limit (4)",
            ),
            (unit(acquired(&ints(&[1, -1]), 4)), "`slots` is negative"),
            (
                unit(acquired(&ints(&[1]), 4)),
                "expected an array of two integers",
            ),
            (
                unit(acquired(&Value::Okay, 4)),
                "expected an array of two integers",
            ),
            (
                unit(found(&ints(&[1, 3]))),
                "does not answer a release or a renewal",
            ),
            (
                unit(found(&Value::Array(vec![
                    Value::Int(2),
                    Value::BulkString(b"1".to_vec()),
                ]))),
                "`slots` is not an integer",
            ),
        ];
        for (result, what) in wrong {
            let err = result.unwrap_err();
            assert!(matches!(err, RedisFailure::BadReply(_)), "{err}");
            assert!(err.to_string().contains(what), "{err}: {what}");
        }
    }

    #[test]
    fn expiries_convert_to_ticks_and_bad_ones_are_refused() {
        let ticks = Ticks::new(Duration::from_millis(1500), false).unwrap();
        assert_eq!((ticks.lifetime, ticks.tick_nanos), (1_500_000, 1000));
        let ticks = Ticks::new(Duration::from_millis(1500), true).unwrap();
        assert_eq!(ticks.lifetime, 1_500_000_000);
        assert_eq!(ticks.ttl_margin_ms, CLIENT_CLOCK_TTL_MARGIN_MS);
        assert!(Ticks::new(Duration::from_micros(999), false).is_err());
        assert!(Ticks::new(Duration::from_secs(30 * 86_400), true).is_err());
        assert!(Ticks::new(Duration::from_secs(30 * 86_400), false).is_ok());
    }

    #[test]
    fn renewals_take_every_key_in_as_few_calls_as_the_limits_allow() {
        let ticks = Ticks::new(Duration::from_secs(30), false).unwrap();
        let held = |n: usize| {
            let h = Held {
                seq: 1,
                first: 1,
                last: 1,
            };
            vec![h; n]
        };
        let live = |keys: usize| (0..keys).map(|k| (format!("p{{k{k}}}"), held(2))).collect();
        // 7 arguments a key: one call for a few keys on one server, several for many.
        assert_eq!(renewals(&ticks, None, 1, false, live(10)).len(), 1);
        assert_eq!(renewals(&ticks, None, 1, false, live(1000)).len(), 3);
        // In a cluster, one call per slot of the keys' hash tags.
        let slots: std::collections::HashSet<_> = (0..10)
            .map(|k| Slot::for_key(format!("p{{k{k}}}")))
            .collect();
        assert_eq!(renewals(&ticks, None, 1, true, live(10)).len(), slots.len());
        assert!(renewals(&ticks, None, 1, false, Vec::new()).is_empty());
    }
}
