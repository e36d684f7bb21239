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
        self.bounded(async {
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

    /// Asks Redis to apply `refund` of `cost` permits to `key`.
    pub(super) async fn send_refund(
        &self,
        quota: &ScriptQuota,
        key: &str,
        cost: u32,
        refund: Operation,
    ) -> Result<(), RedisFailure> {
        self.bounded(async {
            match self.run_script(quota, key, refund, cost).await? {
                Reply::Refunded(_) => Ok(()),
                other => {
                    Err(Cause::BadReply(format!("{other:?} is not the answer to a refund")).into())
                }
            }
        })
        .await
    }

    /// Runs `call` unless Redis failed less than a probe interval ago, giving up after the
    /// limiter's timeout.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, RedisFailure>>,
    ) -> Result<T, RedisFailure> {
        if self.breaker.skipping() {
            return Err(Cause::Skipped.into());
        }
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| Err(Cause::Timeout(self.timeout).into()))
    }

    /// One script call and its reply, which also tells the offset between the clocks.
    async fn run_script(
        &self,
        quota: &ScriptQuota,
        key: &str,
        operation: Operation,
        cost: u32,
    ) -> Result<Reply, RedisFailure> {
        let now = self.script_now(quota)?;
        let invocation = quota.invocation(key, operation, now, cost);
        let sent = self.clock.now();
        let value = self.store.run(&invocation).await.map_err(Cause::Redis)?;
        let received = self.clock.now();
        let reply = parse_reply(&value, quota)?;
        self.offset.observe(sent, received, reply.server_time());
        Ok(reply)
    }

    /// The instant a script decides at: `None` for the server's `TIME`, or the client clock's
    /// reading.
    fn script_now(&self, quota: &ScriptQuota) -> Result<Option<u64>, RedisFailure> {
        if !quota.client_clock() {
            return Ok(None);
        }
        let now = self.clock.now();
        if now > MAX_NOW {
            return Err(Cause::ClockOutOfRange(now).into());
        }
        Ok(Some(now))
    }
}
