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
//! The first decision on a key no one is deciding on makes the call itself. Those queued behind
//! it are sent by a task of their own, which also awaits that first call, so every decision is
//! answered whatever becomes of the others' callers (gone, or not polling); one whose caller
//! went away before its call is not sent.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::Value;
use tokio::sync::oneshot;

use super::error::RedisFailure;
use super::script::{Operation, ScriptQuota};
use super::store::RedisStore;
use crate::sync::{lock, Mutex};

/// A script call in flight, which its caller and the task sending the decisions queued behind
/// it can both await: whichever polls it drives it.
type Call = Shared<BoxFuture<'static, Result<Value, RedisFailure>>>;

/// The keys whose call is in flight.
#[derive(Default)]
pub(super) struct Coalescer {
    in_flight: Mutex<HashMap<String, InFlight>>,
}

/// A key's call in flight and the decisions waiting for the next one.
struct InFlight {
    /// The call its first decision's caller made.
    first: Call,
    queue: Vec<Queued>,
    /// Whether a task sends the key's next calls: once one is queued, until none is.
    sending: bool,
}

/// A decision waiting for its key's next call, and where its reply goes.
struct Queued {
    quota: ScriptQuota,
    operation: Operation,
    now: Option<u64>,
    cost: u32,
    reply: oneshot::Sender<Result<Value, RedisFailure>>,
}

impl Coalescer {
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
        // Queued behind the key's call in flight, or the call this caller makes.
        // Spawned once the map is unlocked: a task dropped at once (no runtime, or one shutting
        // down) frees the key as it drops, which takes the lock.
        let mut sending = None;
        let queued = {
            let mut in_flight = lock(&self.in_flight);
            match in_flight.get_mut(key) {
                Some(entry) => {
                    let (reply, answer) = oneshot::channel();
                    entry.queue.push(Queued {
                        quota: quota.clone(),
                        operation,
                        now,
                        cost,
                        reply,
                    });
                    if !entry.sending {
                        entry.sending = true;
                        sending = Some(Sending {
                            coalescer: Arc::clone(self),
                            key: key.to_owned(),
                            first: entry.first.clone(),
                        });
                    }
                    Err(answer)
                }
                None => {
                    let invocation = quota.invocation(key, operation, now, cost);
                    let store = store.clone();
                    let call = async move { store.run(&invocation).await };
                    let call = call.boxed().shared();
                    let entry = InFlight {
                        first: call.clone(),
                        queue: Vec::new(),
                        sending: false,
                    };
                    in_flight.insert(key.to_owned(), entry);
                    Ok(call)
                }
            }
        };
        if let Some(sending) = sending {
            // A task of its own, so that no decision depends on another caller's future being
            // polled, or kept, until it is answered. Without a runtime, or on one that shuts
            // down before or while it runs, it is dropped, and with it the replies: each is told
            // its call went away, and the key is free (see [`Sending`]).
            super::spawn(sending.run(store.clone()));
        }
        match queued {
            Err(answer) => answer.await.unwrap_or_else(|_| Err(gone())),
            Ok(call) => {
                // The caller makes the key's call and no task is spawned for it: a task for every
                // call cost each decision more instructions in the client (BENCHMARKS.md,
                // "Redis").
                let _turn = Turn {
                    coalescer: self,
                    key,
                    call: call.clone(),
                };
                call.await
            }
        }
    }

    /// Frees `key` if its entry is the one whose first call is `first` and whose queue is (with
    /// `sending`) or is not (without) being sent: the hold of whoever ends, and no later one's.
    fn release(&self, key: &str, first: &Call, sending: bool) {
        let mut in_flight = lock(&self.in_flight);
        let ours = |entry: &InFlight| entry.first.ptr_eq(first) && entry.sending == sending;
        if in_flight.get(key).is_some_and(ours) {
            in_flight.remove(key);
        }
    }

    /// The decisions queued on `key` whose callers still wait, to be sent next; `None`, and the
    /// key free, when there are none.
    fn next_batch(&self, key: &str) -> Option<Vec<Queued>> {
        let mut in_flight = lock(&self.in_flight);
        let queue = in_flight
            .get_mut(key)
            .map(|entry| std::mem::take(&mut entry.queue));
        // Those gone while they waited are not sent.
        let batch: Vec<Queued> = (queue.into_iter().flatten())
            .filter(|q| !q.reply.is_closed())
            .collect();
        if batch.is_empty() {
            in_flight.remove(key);
            return None;
        }
        Some(batch)
    }
}

/// The task sending a key's queued decisions, and its hold on the key: however the task ends
/// (done, or dropped unpolled or mid-call because its runtime shut down), the key is free
/// again afterwards and no decision queued on it waits for an answer that cannot come (each
/// dropped from the queue is told its call went away).
struct Sending {
    coalescer: Arc<Coalescer>,
    key: String,
    /// The key's first call, which tells the key's entry from a later one's.
    first: Call,
}

impl Sending {
    /// Sends the decisions queued on the key once its first call has answered, each call every
    /// one queued by the time the previous one answered, until none is waiting.
    async fn run(self, store: RedisStore) {
        // Its reply is its caller's; the queue's turn comes after it, however it ended.
        let _ = self.first.clone().await;
        let key = &self.key;
        while let Some(batch) = self.coalescer.next_batch(key) {
            let replies = if let [one] = batch.as_slice() {
                let invocation = (one.quota).invocation(key, one.operation, one.now, one.cost);
                vec![store.run(&invocation).await]
            } else {
                let decisions = (batch.iter()).map(|q| (&q.quota, q.operation, q.now, q.cost));
                let invocation = batch[0].quota.batch_invocation(key, decisions);
                split(store.run(&invocation).await, batch.len())
            };
            for (queued, reply) in batch.into_iter().zip(replies) {
                let _ = queued.reply.send(reply);
            }
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        // Done, the task freed the key itself (`next_batch`); a later entry is not ours.
        self.coalescer.release(&self.key, &self.first, true);
    }
}

/// The first decision's caller's hold on its key: however its call ends (answered, timed out,
/// its future dropped), the key is free again, unless decisions queued behind it, whose task
/// then frees it after them.
struct Turn<'a> {
    coalescer: &'a Coalescer,
    key: &'a str,
    /// The call, to tell the key's entry from a later one's (made after the queue behind it
    /// was sent while this caller's future waited unpolled).
    call: Call,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.coalescer.release(self.key, &self.call, false);
    }
}

/// The replies of a batch of `n` decisions, one for each, or the failure for each.
fn split(value: Result<Value, RedisFailure>, n: usize) -> Vec<Result<Value, RedisFailure>> {
    let failure = match value {
        Ok(Value::Array(items)) if items.len() == n => return items.into_iter().map(Ok).collect(),
        Ok(other) => RedisFailure::BadReply(format!(
            "expected the replies of {n} decisions, got {other:?}"
        )),
        Err(failure) => failure,
    };
    vec![Err(failure); n]
}

/// What a decision is told whose call went away unanswered (the runtime shut down).
fn gone() -> RedisFailure {
    RedisFailure::Redis(redis::RedisError::from(std::io::Error::other(
        "the call carrying this decision went away unanswered",
    )))
}
