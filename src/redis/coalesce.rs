//! Decisions on one key that go to Redis at the same time from one limiter, sent as one script
//! call.
//!
//! One call per key is in flight at a time. A decision that finds its key's call in flight
//! waits in the key's queue; when that call's reply comes, every decision then queued goes as
//! one call of the batch script, which decides each in order, as the algorithm's script would
//! alone (see `script.rs`). A key no one else is deciding on goes to Redis at once, as one plain
//! call: batching adds no wait, and under load a key costs Redis one script call per round trip
//! instead of one per decision.
//!
//! The calls on a key run as a task of their own, so every decision is answered whatever
//! becomes of the others' callers (gone, or not polling); one whose caller went away before its
//! call is not sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use redis::Value;
use tokio::sync::oneshot;

use super::error::RedisFailure;
use super::script::{Operation, ScriptQuota};
use super::store::RedisStore;

/// The keys whose call is in flight, each with the decisions waiting for the next one.
#[derive(Debug, Default)]
pub(super) struct Coalescer {
    in_flight: Mutex<HashMap<String, Vec<Queued>>>,
}

/// A decision waiting for its key's next call, and where its reply goes.
#[derive(Debug)]
struct Queued {
    quota: ScriptQuota,
    operation: Operation,
    now: Option<u64>,
    cost: u32,
    reply: oneshot::Sender<Result<Value, RedisFailure>>,
}

impl Coalescer {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Queued>>> {
        // The map stays whole whatever panicked while it was held: each change is one call.
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The reply to one decision (`operation` must be a decision) on `key` with `quota`, sent
    /// alone or in a batch with others on the same key.
    pub(super) async fn decide(
        self: &Arc<Self>,
        store: &RedisStore,
        quota: &ScriptQuota,
        key: &str,
        operation: Operation,
        now: Option<u64>,
        cost: u32,
    ) -> Result<Value, RedisFailure> {
        let (reply, answer) = oneshot::channel();
        let queued = Queued {
            quota: quota.clone(),
            operation,
            now,
            cost,
            reply,
        };
        let first = {
            let mut in_flight = self.lock();
            match in_flight.get_mut(key) {
                Some(queue) => {
                    queue.push(queued);
                    None
                }
                None => {
                    in_flight.insert(key.to_owned(), Vec::new());
                    Some(queued)
                }
            }
        };
        if let Some(first) = first {
            let calls = Arc::clone(self).calls(store.clone(), key.to_owned(), first);
            // A task of its own: the decisions waiting on the key must not depend on this
            // caller's future being polled, or kept, until they are answered.
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(calls)),
                Err(_) => calls.await,
            }
        }
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    /// The calls on `key` from `first` on: each sends every decision queued by the time the
    /// previous one answered, until none is waiting.
    async fn calls(self: Arc<Self>, store: RedisStore, key: String, first: Queued) {
        let mut batch = vec![first];
        loop {
            let invocation = match batch.as_slice() {
                [one] => (one.quota).invocation(&key, one.operation, one.now, one.cost),
                [first, ..] => first.quota.batch_invocation(
                    &key,
                    (batch.iter()).map(|q| (&q.quota, q.operation, q.now, q.cost)),
                ),
                [] => break,
            };
            let value = store.run(&invocation).await.map_err(RedisFailure::Redis);
            let replies = match batch.len() {
                1 => vec![value],
                n => split(value, n),
            };
            for (queued, reply) in batch.drain(..).zip(replies) {
                let _ = queued.reply.send(reply);
            }
            let mut in_flight = self.lock();
            let queue = in_flight.get_mut(&key).map(std::mem::take);
            // Those gone while they waited are not sent.
            batch = (queue.into_iter().flatten())
                .filter(|q| !q.reply.is_closed())
                .collect();
            if batch.is_empty() {
                in_flight.remove(&key);
                return;
            }
        }
    }
}

/// The replies of a batch of `n` decisions, one for each, or the failure for each.
fn split(value: Result<Value, RedisFailure>, n: usize) -> Vec<Result<Value, RedisFailure>> {
    match value {
        Ok(Value::Array(items)) if items.len() == n => items.into_iter().map(Ok).collect(),
        Ok(other) => {
            let failure = RedisFailure::BadReply(format!(
                "expected the replies of {n} decisions, got {other:?}"
            ));
            vec![Err(failure); n]
        }
        Err(failure) => vec![Err(failure); n],
    }
}

/// What a decision is told whose call went away unanswered (the runtime shut down).
fn gone() -> RedisFailure {
    RedisFailure::Redis(redis::RedisError::from(std::io::Error::other(
        "the call carrying this decision went away unanswered",
    )))
}
