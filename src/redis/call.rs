//! Script calls, each bounded in time: the limiter's timeout answers the caller, and a deadline
//! in the server's time keeps a decision that runs after it from changing anything.

use std::future::Future;

use super::error::{Cause, RedisFailure};
use super::limiter::Inner;
use super::reply::{parse_reply, Reply};
use super::script::{Operation, ScriptQuota, MAX_NOW};
use crate::decision::Decision;

impl Inner {
    /// Asks Redis to decide on `cost` permits for `key`, waiting at most `max_wait` ticks.
    pub(super) async fn ask_decision(
        &self,
        quota: &ScriptQuota,
        key: &str,
        cost: u32,
        max_wait: u64,
    ) -> Result<Decision, RedisFailure> {
        // The caller is answered when the limiter's timeout or the connection's runs out.
        let longest_wait = self.store.longest_wait(self.timeout).as_nanos();
        let longest_wait = u64::try_from(longest_wait).unwrap_or(u64::MAX);
        let answered_by = self.clock.now().saturating_add(longest_wait);
        self.bounded(quota, key, async {
            // A first "late" answer may come from a probe (no offset known yet) or from an
            // offset that the clocks have left behind; either way the reply corrected the
            // offset, so the request goes once more with a deadline that now means something.
            for _ in 0..2 {
                // Before any reply, a deadline already past: the script answers at once with
                // the server's time and changes nothing (see `offset`).
                let deadline = self.offset.server_deadline(answered_by).unwrap_or(0);
                let operation = Operation::Decide { max_wait, deadline };
                match self.run_script(quota, key, operation, cost).await? {
                    Reply::Decision(decision, _) => return Ok(decision),
                    Reply::Late(_) => {}
                    other => {
                        return Err(Cause::BadReply(format!("{other:?} is not a decision")).into())
                    }
                }
            }
            Err(Cause::Late.into())
        })
        .await
    }

    /// Asks Redis to give back the `cost` permits of `decision` to `key`, with the current
    /// quota's arguments, as the in-memory limiters give back with the current algorithm.
    pub(super) async fn send_refund(
        &self,
        key: &str,
        cost: u32,
        decision: &Decision,
    ) -> Result<(), RedisFailure> {
        let refund = Operation::Refund {
            charged_at: decision.reserved_at,
            left: decision.state_after,
            reserved: !decision.wait.is_zero(),
        };
        let quota = self.quota.load_full();
        let cost = decision.refundable(cost);
        self.bounded(&quota, key, async {
            match self.run_script(&quota, key, refund, cost).await? {
                Reply::Refunded(_) => Ok(()),
                other => {
                    Err(Cause::BadReply(format!("{other:?} is not the answer to a refund")).into())
                }
            }
        })
        .await
    }

    /// Runs `call` unless Redis failed less than a probe interval ago, giving up after the
    /// limiter's timeout; the breaker counts and logs a failure for `key`.
    async fn bounded<T>(
        &self,
        quota: &ScriptQuota,
        key: &str,
        call: impl Future<Output = Result<T, RedisFailure>>,
    ) -> Result<T, RedisFailure> {
        let result = if self.breaker.skipping() {
            Err(Cause::Skipped.into())
        } else {
            tokio::time::timeout(self.timeout, call)
                .await
                .unwrap_or_else(|_| Err(Cause::Timeout(self.timeout).into()))
        };
        match &result {
            Ok(_) => self.breaker.answered(quota.script.name()),
            Err(failure) => self.breaker.failed(key, failure, &self.fail_mode),
        }
        result
    }

    /// One script call and its reply, which also tells the offset between the clocks. With a
    /// client clock, the script decides at its reading; otherwise at the server's `TIME`.
    async fn run_script(
        &self,
        quota: &ScriptQuota,
        key: &str,
        operation: Operation,
        cost: u32,
    ) -> Result<Reply, RedisFailure> {
        let now = quota.client_clock().then(|| self.clock.now());
        if let Some(now) = now.filter(|&now| now > MAX_NOW) {
            return Err(Cause::ClockOutOfRange(now).into());
        }
        let invocation = quota.invocation(key, operation, now, cost);
        let sent = self.clock.now();
        let value = self.store.run(&invocation).await.map_err(Cause::Redis)?;
        let received = self.clock.now();
        let reply = parse_reply(&value, quota)?;
        self.offset.observe(sent, received, reply.server_time());
        Ok(reply)
    }
}
