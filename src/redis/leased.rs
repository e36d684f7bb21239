//! The lease route of a Redis decision: admitting from the share of a key this instance holds,
//! or taking a new one in one script call, and giving a share back when its time is up.

use std::sync::Arc;
use std::time::Duration;

use super::limiter::Inner;
use super::reply::Reply;
use super::script::{Operation, ScriptQuota};
use super::RedisFailure;
use crate::decision::Decision;
use crate::BoxError;

impl Inner {
    /// Decides on `cost` permits for `key` from a lease: the share this instance holds, or a
    /// new one that one script call takes (giving the spent one back), while the key's other
    /// calls wait for it and then admit from it. A key without room for a share, or a call that
    /// may wait and finds no lease to be had, is decided as without leases.
    pub(super) async fn lease_decide(
        self: &Arc<Self>,
        quota: &ScriptQuota,
        key: String,
        cost: u32,
        max_wait: u64,
    ) -> Result<Decision, BoxError> {
        let leases = self.leases.as_ref().expect("called with leases");
        let Some(share) = leases.share(&key) else {
            return self.decide(quota, key, cost, max_wait).await;
        };
        let one_at_a_time = share.refill.lock().await;
        // The call before this one's turn may have brought a share, or a refusal.
        let now = self.clock.now();
        if let Some(decision) = leases.take(&share, cost, now, quota) {
            return Ok(self.stamp(decision, &key, cost));
        }
        if let Some(refusal) = self.cached_refusal(quota, &key, cost, max_wait) {
            return Ok(refusal);
        }
        let sent = self.clock.now();
        let (operation, id) = leases.ask(&share, cost, sent, quota);
        let call = self.run_script(quota, &key, operation, cost);
        let decision = match self.bounded(quota, &key, call).await {
            Ok(Reply::Leased {
                permits,
                start,
                end,
                time,
                ..
            }) => {
                let permits = u32::try_from(permits).unwrap_or(u32::MAX);
                let now = self.clock.now();
                let (from, until) = leases.window(quota, (start, end, time), sent, now);
                let grant = (permits, from, until);
                let decision = leases.granted(&share, id, grant, (cost, now), quota);
                drop(one_at_a_time);
                let over_in = Duration::from_nanos(until.saturating_sub(now));
                self.give_back_at_end(key.clone(), id, over_in);
                decision
            }
            Ok(Reply::Decision(refused, _)) if !refused.allowed => {
                drop(one_at_a_time);
                if max_wait > 0 {
                    return self.decide(quota, key, cost, max_wait).await;
                }
                self.cache_refusal(&key, cost, &refused);
                refused
            }
            Ok(other) => {
                let failure = RedisFailure::BadReply(format!("{other:?} is not a lease"));
                return self.fail_mode.decide(quota.limit, key, cost, failure);
            }
            Err(failure) => return self.fail_mode.decide(quota.limit, key, cost, failure),
        };
        Ok(self.stamp(decision, &key, cost))
    }

    /// When the lease `id` of `key` is over (`over_in` from now), gives its unused permits
    /// back to Redis, unless a later call has given it back already.
    ///
    /// The task holds the limiter weakly: a limiter dropped meanwhile gives nothing back, and
    /// Redis ends the lease by itself.
    fn give_back_at_end(self: &Arc<Self>, key: String, id: u64, over_in: Duration) {
        let inner = Arc::downgrade(self);
        super::spawn(async move {
            tokio::time::sleep(over_in).await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let leases = inner.leases.as_ref().expect("spawned with leases");
            if let Some((id, unused)) = leases.end(&key, id) {
                let quota = inner.quota.load_full();
                let operation = Operation::EndLease { id, unused };
                let call = inner.run_script(&quota, &key, operation, 0);
                // Failures are counted and logged inside; the lease ends in Redis anyway.
                let _ = inner.bounded(&quota, &key, call).await;
            }
        });
    }
}
