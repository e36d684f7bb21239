//! The holds of a Redis limiter whose algorithm holds ([`Metered`]'s estimates, a concurrent
//! policy's slots): what this instance holds, and the task that renews it.
//!
//! Each admission holds what it took in its key under an id no other admission has
//! ([`next_id`](super::next_id)), with an expiry of
//! [`hold_for`](super::RedisRateLimiterBuilder::hold_for). While the request lives, its instance
//! keeps the hold in its table of live holds, and one task renews every live hold of the instance
//! every third of that expiry: one call of the batch script, each key's holds an entry of it (one
//! call per cluster slot in a Redis Cluster, and no more than [`MAX_RENEW_ARGS`] arguments a call).
//! A give-back or settle takes the hold out of the table at once, then tells Redis. A hold no live
//! instance renews (its instance died, or its give-back never reached Redis) ends at its expiry: a
//! slot frees, a [`Metered`] estimate stands, charged as of its admission.
//!
//! [`Metered`]: crate::algorithm::Metered

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Weak;
use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::Value;

use super::limiter::Inner;
use super::reply::parse_reply;
use super::script::ScriptQuota;
use super::RedisFailure;
use crate::sync::{lock, Mutex};

/// The most arguments one renewal call carries: the live holds of many keys go in several.
const MAX_RENEW_ARGS: usize = 3_000;

/// The holds of each key, by Redis key: each hold's id and the units (permits, slots) it has.
type Live = HashMap<String, HashMap<u64, u32>>;

/// A Redis key and its live holds, each by its id and the units it has: what a renewal names.
pub(super) type KeyHolds = (String, Vec<(u64, u32)>);

/// The holds this instance keeps live, and whether a task renews them.
pub(super) struct Holds {
    live: Mutex<Live>,
    renewing: AtomicBool,
    /// The limiter these are the holds of, for the renewal task.
    inner: Weak<Inner>,
    /// How long a hold lasts unless renewed; renewals come a third of it apart.
    hold_for: Duration,
}

impl Holds {
    pub(super) fn new(inner: Weak<Inner>, hold_for: Duration) -> Self {
        Self {
            live: Mutex::default(),
            renewing: AtomicBool::new(false),
            inner,
            hold_for,
        }
    }

    /// Keeps the hold `hold` of `units` on `key` live: renewed from now on, until released.
    pub(super) fn take(&self, key: &str, hold: u64, units: u32) {
        (lock(&self.live).entry(key.to_owned()).or_default()).insert(hold, units);
        if self.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let renewer = Renewer {
            inner: Weak::clone(&self.inner),
            every: self.hold_for / 3,
            renewing: true,
        };
        if !super::spawn(renewer.run()) {
            tracing::warn!(
                target: "tower_bulwark::redis",
                "holds taken outside a tokio runtime are not renewed; they end at their expiry",
            );
        }
    }

    /// Takes `units` of the hold `hold` on `key` (its last) out of the live ones, all of them
    /// for `u32::MAX`: the units it had, or `None` if it was not live.
    pub(super) fn release(&self, key: &str, hold: u64, units: u32) -> Option<u32> {
        let mut live = lock(&self.live);
        let holds = live.get_mut(key)?;
        let had = holds.get_mut(&hold)?;
        let before = *had;
        *had = had.saturating_sub(units);
        if *had == 0 {
            holds.remove(&hold);
            if holds.is_empty() {
                live.remove(key);
            }
        }
        Some(before)
    }

    /// Every live hold, by key; `None`, having noted that no task renews them, when there is
    /// none.
    fn snapshot(&self) -> Option<Vec<KeyHolds>> {
        let live = lock(&self.live);
        if live.is_empty() {
            // Under the lock an admission takes to add its hold, before it looks at `renewing`.
            self.renewing.store(false, Ordering::Release);
            return None;
        }
        let holds = |(key, holds): (&String, &HashMap<u64, u32>)| {
            (key.clone(), holds.iter().map(|(&id, &n)| (id, n)).collect())
        };
        Some(live.iter().map(holds).collect())
    }
}

impl Inner {
    /// Renews every live hold of this instance, in as few calls as the keys allow. Returns
    /// `false` once there is none, having noted that no task renews them any more.
    async fn renew(&self) -> bool {
        let Some(live) = self.holds.snapshot() else {
            return false;
        };
        let quota = self.quota.load_full();
        let now = match quota.client_now(&*self.clock) {
            Ok(now) => now,
            Err(failure) => {
                renewal_failed(&failure);
                return true;
            }
        };
        for call in renewals(&quota, now, self.store.is_cluster(), live) {
            let reply = tokio::time::timeout(self.timeout, self.store.run(&call)).await;
            let reply = reply.unwrap_or_else(|_| Err(RedisFailure::Timeout(self.timeout)));
            if let Err(failure) = reply.and_then(|value| renewed(&value, &quota)) {
                renewal_failed(&failure);
            }
        }
        true
    }
}

fn renewal_failed(failure: &RedisFailure) {
    tracing::warn!(
        target: "tower_bulwark::redis",
        error = %failure,
        "renewing this instance's holds in redis failed; a hold not renewed before it expires \
         ends",
    );
}

/// The renewal calls of the live holds `live` (each key with its holds) at `now`: keys of one
/// cluster slot per call (`cluster`), else any together, and no more than [`MAX_RENEW_ARGS`]
/// arguments a call.
fn renewals(
    quota: &ScriptQuota,
    now: Option<u64>,
    cluster: bool,
    live: Vec<KeyHolds>,
) -> Vec<redis::ScriptInvocation<'static>> {
    let mut groups: HashMap<Option<Slot>, Vec<KeyHolds>> = HashMap::new();
    for (key, holds) in live {
        let slot = cluster.then(|| Slot::for_key(&key));
        groups.entry(slot).or_default().push((key, holds));
    }
    let mut calls = Vec::new();
    for group in groups.values() {
        let (mut start, mut args) = (0, 0);
        for (i, (_, holds)) in group.iter().enumerate() {
            // The count, the prelude's seven, the algorithm's own (at most four), the holds.
            args += 12 + 2 * holds.len();
            if i + 1 == group.len() || args >= MAX_RENEW_ARGS {
                calls.push(quota.renewal(&group[start..=i], now));
                (start, args) = (i + 1, 0);
            }
        }
    }
    calls
}

/// Reads the reply to a renewal: one applied answer per key.
fn renewed(value: &Value, quota: &ScriptQuota) -> Result<(), RedisFailure> {
    let Value::Array(replies) = value else {
        let what = format!("expected the replies of a renewal, got {value:?}");
        return Err(RedisFailure::BadReply(what));
    };
    for reply in replies {
        parse_reply(reply, quota)?.applied("the answer to a renewal")?;
    }
    Ok(())
}

/// The task that renews a limiter's live holds, while the limiter lives and holds any.
struct Renewer {
    inner: Weak<Inner>,
    every: Duration,
    /// Whether this task is the one the holds' `renewing` says runs.
    renewing: bool,
}

impl Renewer {
    async fn run(mut self) {
        loop {
            tokio::time::sleep(self.every).await;
            let Some(inner) = self.inner.upgrade() else {
                return;
            };
            if !inner.renew().await {
                // `renew` noted that no task renews them: the next hold starts one.
                self.renewing = false;
                return;
            }
        }
    }
}

impl Drop for Renewer {
    /// The task was dropped while it renewed (its runtime shut down): the next hold starts
    /// another.
    fn drop(&mut self) {
        if let (true, Some(inner)) = (self.renewing, self.inner.upgrade()) {
            inner.holds.renewing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::script::LimiterScript;
    use crate::Quota;

    #[test]
    fn renewals_take_every_key_in_as_few_calls_as_the_limits_allow() {
        let quota = Quota::per_second(4).unwrap();
        let quota = ScriptQuota::new(LimiterScript::Concurrency, quota, false).unwrap();
        let live = |keys: usize| {
            (0..keys)
                .map(|k| (format!("p{{k{k}}}"), vec![(1, 1), (2, 1)]))
                .collect()
        };
        // 16 arguments a key at most: one call for a few keys on one server, several for many.
        assert_eq!(renewals(&quota, None, false, live(10)).len(), 1);
        assert_eq!(renewals(&quota, None, false, live(1000)).len(), 6);
        // In a cluster, one call per slot of the keys' hash tags.
        let slots: std::collections::HashSet<_> = (0..10)
            .map(|k| Slot::for_key(format!("p{{k{k}}}")))
            .collect();
        assert_eq!(renewals(&quota, None, true, live(10)).len(), slots.len());
        assert!(renewals(&quota, None, false, Vec::new()).is_empty());
    }
}
