//! The slots of a concurrent policy kept in Redis
//! ([`Policy::concurrent_in_redis`](crate::rate_limit::Policy::concurrent_in_redis)), so that
//! every instance draws from each key's one limit.
//!
//! Each admission takes its slots in one script call (`concurrency.lua`) as members of the key's
//! sorted set, named by an id no other admission has and scored by when they expire. Its
//! instance keeps them while the request lives: one call every third of the expiry renews every
//! live slot of the instance (per cluster slot in a Redis Cluster). Given back, they are removed
//! by their ids, once, so a give-back that arrives late or twice frees no other request's slot.
//! A slot whose instance died, or whose give-back never reached Redis, stops counting when it
//! expires.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use redis::{ScriptInvocation, Value};

use super::concurrency_script::{self as script, Held, Ticks};
use super::fail_mode::Breaker;
use super::key::{fingerprint, KeyLayout};
use super::limiter::spawn_refund;
use super::script::MAX_NOW;
use super::{
    BuildError, RedisFailMode, RedisFailure, RedisKey, RedisRateLimiterBuilder, RedisStore,
};
use crate::algorithm::Concurrency;
use crate::clock::Clock;
use crate::decision::{Decision, InsufficientCapacity, LimiterId, Taken};
use crate::limiter::BoxReserve;
use crate::{BoxError, KeyedRateLimiter, Quota};

/// What a refusal says to wait: when a slot frees is not known, so the least `Retry-After`.
const RETRY: Duration = Duration::from_secs(1);

/// The local limiter of [`RedisFailMode::Local`] for slots: `in_flight` per key, per instance.
type LocalSlots = KeyedRateLimiter<String, Concurrency>;

/// The slots an instance holds: by Redis key, each admission's number and the first and last
/// of the slots it still holds.
type Live = HashMap<String, HashMap<u64, (u32, u32)>>;

/// A concurrent policy's slots in Redis, for client keys of type `K`.
pub(crate) struct RedisSlots<K> {
    slots: Arc<Slots>,
    /// How a client key names its sorted set (made where `K: RedisKey` is known).
    redis_key: fn(&KeyLayout, &K) -> String,
}

/// What a limiter and its clones share.
struct Slots {
    store: RedisStore,
    keys: KeyLayout,
    /// The client clock the script reads, if not the server's `TIME`.
    clock: Option<Arc<dyn Clock>>,
    ticks: Ticks,
    timeout: Duration,
    fail_mode: RedisFailMode,
    local: Option<LocalSlots>,
    breaker: Breaker,
    /// The slots per key, as the burst of this quota.
    quota: Mutex<Quota>,
    /// The identity of this limiter's decisions.
    id: LimiterId,
    /// This instance's part of every slot's id, random, and the number of the next admission.
    instance: u64,
    next: AtomicU64,
    /// The slots this instance holds, by Redis key and admission: what the renewals renew.
    live: Mutex<Live>,
    /// How long a slot lives without renewal.
    expiry: Duration,
    /// Whether a task renews the live slots.
    renewing: AtomicBool,
}

impl<K: RedisKey> RedisSlots<K> {
    /// At most `in_flight` slots per key, in the Redis of `redis`, with its settings.
    pub(crate) fn new(in_flight: u32, redis: RedisRateLimiterBuilder) -> Result<Self, BuildError> {
        let RedisRateLimiterBuilder {
            settings,
            client_clock,
        } = redis;
        if settings.lease.is_some() {
            return Err(BuildError::new(
                "a concurrent policy holds slots, it leases no permits",
            ));
        }
        if settings.timeout.is_zero() {
            return Err(BuildError::new("the timeout must be longer than zero"));
        }
        let quota = Quota::per_second(in_flight)
            .map_err(|_| BuildError::new("a concurrent policy needs at least one slot"))?;
        let prefix = (settings.prefix).unwrap_or_else(|| "bulwark:concurrency:".to_owned());
        let keys = KeyLayout::new(prefix, settings.hash_tag)?;
        let ticks = Ticks::new(settings.slot_expiry, client_clock.is_some())?;
        let (fail_mode, local) = match settings.fail_mode {
            RedisFailMode::Local => {
                let local = KeyedRateLimiter::<String>::builder(quota)
                    .algorithm::<Concurrency>()
                    .build();
                (RedisFailMode::fallback_to(local.clone()), Some(local))
            }
            other => (other, None),
        };
        let slots = Slots {
            store: settings.store,
            keys,
            clock: client_clock,
            ticks,
            timeout: settings.timeout,
            fail_mode,
            local,
            breaker: Breaker::new(settings.probe_interval),
            quota: Mutex::new(quota),
            id: LimiterId::new(),
            instance: std::hash::RandomState::new().hash_one(0u8),
            next: AtomicU64::new(1),
            live: Mutex::default(),
            expiry: settings.slot_expiry,
            renewing: AtomicBool::new(false),
        };
        Ok(Self {
            slots: Arc::new(slots),
            redis_key: KeyLayout::redis_key::<K>,
        })
    }
}

impl<K> RedisSlots<K> {
    pub(crate) fn quota(&self) -> Quota {
        *self.slots.quota()
    }

    /// Takes the burst of `quota` as the slots per key, here and in the local fail mode.
    pub(crate) fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        if let Some(local) = &self.slots.local {
            local.set_quota(quota);
        }
        *self.slots.quota() = quota;
        Ok(())
    }

    /// Decides on `cost` slots for `key`: in Redis, or by the fail mode when Redis cannot.
    pub(crate) fn reserve(&self, key: &K, cost: u32) -> BoxReserve {
        let key = (self.redis_key)(&self.slots.keys, key);
        let limit = self.slots.quota().burst();
        if cost > limit {
            let too_many = InsufficientCapacity::new(cost, limit);
            return Box::pin(std::future::ready(Err(too_many.into())));
        }
        let call = Arc::clone(&self.slots).acquire(key.clone(), cost, limit);
        Box::pin(Acquire {
            call: Some(Box::pin(call)),
            slots: Arc::clone(&self.slots),
            key,
            cost,
            polled: false,
        })
    }

    /// Settles `decision` of `key`, admitted for `estimate` slots, to `cost`: the slots beyond
    /// `cost` go back (a refund settles to zero; a cost above the estimate changes nothing: a
    /// slot has no debt). Whether the decision was this limiter's.
    pub(crate) fn give_back(&self, key: &K, decision: Decision, estimate: u32, cost: u32) -> bool {
        let key = (self.redis_key)(&self.slots.keys, key);
        self.slots.give_back(key, decision, estimate, cost)
    }
}

impl Slots {
    fn quota(&self) -> MutexGuard<'_, Quota> {
        self.quota.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        // Each change to the map is whole: a panic elsewhere leaves it usable.
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The client clock's reading, or `None` for the server's `TIME`.
    fn now(&self) -> Result<Option<u64>, RedisFailure> {
        match self.clock.as_ref().map(|clock| clock.now()) {
            Some(now) if now > MAX_NOW => Err(RedisFailure::ClockOutOfRange(now)),
            now => Ok(now),
        }
    }

    /// Runs `invocation`, giving up after the timeout.
    async fn run(&self, invocation: ScriptInvocation<'static>) -> Result<Value, RedisFailure> {
        let call = self.store.run(&invocation);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(reply) => reply.map_err(RedisFailure::Redis),
            Err(_) => Err(RedisFailure::Timeout(self.timeout)),
        }
    }

    /// Takes `cost` slots of `key` if the key holds at most `limit` with them; when Redis cannot
    /// say, the fail mode decides, and the slots the call may have taken go back by their id.
    async fn acquire(
        self: Arc<Self>,
        key: String,
        cost: u32,
        limit: u32,
    ) -> Result<Decision, BoxError> {
        let held = Held {
            seq: self.next.fetch_add(1, Ordering::Relaxed),
            first: 1,
            last: cost,
        };
        let asked = if self.breaker.skipping() {
            Err(RedisFailure::Skipped)
        } else {
            match self.now() {
                Ok(now) => {
                    let call = script::acquire(&self.ticks, now, self.instance, &key, held, limit);
                    let reply = self.run(call).await;
                    reply.and_then(|value| script::acquired(&value, limit))
                }
                Err(failure) => Err(failure),
            }
        };
        let (admitted, free) = match asked {
            Ok(reply) => reply,
            Err(failure) => {
                if !matches!(
                    failure,
                    RedisFailure::Skipped | RedisFailure::ClockOutOfRange(_)
                ) {
                    self.release_later(key.clone(), held);
                }
                self.breaker.failed(&key, &failure, &self.fail_mode);
                return self.fail_mode.decide(limit.into(), key, cost, failure);
            }
        };
        self.breaker.answered("concurrency");
        let limit = u64::from(limit);
        if !admitted {
            return Ok(Decision::refused(limit, free, RETRY, RETRY).of_cost(cost));
        }
        let decision = Decision::allowed(limit, free, Duration::ZERO)
            // The admission's number, which names its slots.
            .charged_at(held.seq)
            .of_cost(cost)
            .for_key(fingerprint(&key))
            .made_by(self.id);
        if cost > 0 {
            (self.live().entry(key).or_default()).insert(held.seq, (1, cost));
            self.renew_from_now_on();
        }
        Ok(decision)
    }

    /// See [`RedisSlots::give_back`].
    fn give_back(
        self: &Arc<Self>,
        key: String,
        decision: Decision,
        estimate: u32,
        cost: u32,
    ) -> bool {
        if !decision.allowed {
            return false;
        }
        if matches!(decision.admission.taken, Taken::RedisFailMode(_)) {
            self.fail_mode.change(key, decision, estimate, cost);
            return true;
        }
        if !decision.is_from(self.id, fingerprint(&key)) {
            return false;
        }
        // Slots have no debt: what a settle names beyond them is nothing to give back.
        let cost = decision.refundable(estimate.saturating_sub(cost));
        if cost == 0 {
            return true;
        }
        let seq = decision.charged().at;
        // The first `cost` of the slots it still holds leave the live ones, at once.
        let released = {
            let mut live = self.live();
            let Some(admissions) = live.get_mut(&key) else {
                return true;
            };
            let Some((first, last)) = admissions.get_mut(&seq) else {
                return true;
            };
            // In u64: `first + cost` may pass `u32::MAX`.
            let through = (u64::from(*first) + u64::from(cost)).min(u64::from(*last) + 1) - 1;
            let released = Held {
                seq,
                first: *first,
                last: u32::try_from(through).unwrap_or(*last),
            };
            if through >= u64::from(*last) {
                admissions.remove(&seq);
                if admissions.is_empty() {
                    live.remove(&key);
                }
            } else {
                *first = released.last + 1;
            }
            released
        };
        if released.last >= released.first {
            self.release_later(key, released);
        }
        true
    }

    /// Sends the release of `held` on `key` from a task of its own, once: a release that fails
    /// is not sent again, and its slots come back when they expire.
    fn release_later(self: &Arc<Self>, key: String, held: Held) {
        let slots = Arc::clone(self);
        spawn_refund(&key.clone(), async move {
            let call = script::release(&slots.ticks, slots.instance, &key, held);
            let reply = slots.run(call).await;
            if let Err(failure) = reply.and_then(|value| script::found(&value)) {
                tracing::debug!(
                    target: "tower_bulwark::redis",
                    key, error = %failure, expiry = ?slots.expiry,
                    "a give-back of concurrency slots did not reach redis; they come back when \
                     they expire",
                );
            }
        });
    }

    /// Makes sure a task renews the live slots, every third of their expiry, for as long as
    /// there are any.
    fn renew_from_now_on(self: &Arc<Self>) {
        if self.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let renewer = Renewer {
            slots: Arc::downgrade(self),
            renewing: true,
        };
        if !super::spawn(renewer.run()) {
            tracing::warn!(
                target: "tower_bulwark::redis",
                "concurrency slots taken outside a tokio runtime are not renewed; they come back \
                 when they expire",
            );
        }
    }

    /// Renews every live slot of this instance, in as few calls as the keys allow. Returns
    /// `false` once there is none, having noted that no task renews them any more.
    async fn renew(&self) -> bool {
        let live: Vec<(String, Vec<Held>)> = {
            let live = self.live();
            if live.is_empty() {
                // Under the lock an admission takes to add its slots, before it looks here.
                self.renewing.store(false, Ordering::Release);
                return false;
            }
            let held = |(&seq, &(first, last)): (&u64, &(u32, u32))| Held { seq, first, last };
            (live.iter())
                .map(|(key, admissions)| (key.clone(), admissions.iter().map(held).collect()))
                .collect()
        };
        let now = match self.now() {
            Ok(now) => now,
            Err(failure) => {
                Self::renewal_failed(&failure);
                return true;
            }
        };
        let cluster = self.store.is_cluster();
        for call in script::renewals(&self.ticks, now, self.instance, cluster, live) {
            let reply = self.run(call).await;
            if let Err(failure) = reply.and_then(|value| script::found(&value)) {
                Self::renewal_failed(&failure);
            }
        }
        true
    }

    fn renewal_failed(failure: &RedisFailure) {
        tracing::warn!(
            target: "tower_bulwark::redis",
            error = %failure,
            "renewing this instance's concurrency slots in redis failed; a slot not renewed \
             before it expires counts no more",
        );
    }
}

/// The task that renews a limiter's live slots, while the limiter lives and holds any.
struct Renewer {
    slots: Weak<Slots>,
    /// Whether this task is the one the limiter's `renewing` says runs.
    renewing: bool,
}

impl Renewer {
    async fn run(mut self) {
        loop {
            let Some(every) = self.slots.upgrade().map(|slots| slots.expiry / 3) else {
                return;
            };
            tokio::time::sleep(every).await;
            let Some(slots) = self.slots.upgrade() else {
                return;
            };
            if !slots.renew().await {
                // `renew` noted that no task renews them: the next admission starts one.
                self.renewing = false;
                return;
            }
        }
    }
}

impl Drop for Renewer {
    /// The task was dropped while it renewed (its runtime shut down): the next admission starts
    /// another.
    fn drop(&mut self) {
        if let (true, Some(slots)) = (self.renewing, self.slots.upgrade()) {
            slots.renewing.store(false, Ordering::Release);
        }
    }
}

/// The future of an acquisition, which gives back what it admitted when its caller goes away.
struct Acquire {
    call: Option<BoxReserve>,
    slots: Arc<Slots>,
    key: String,
    cost: u32,
    /// Whether the call may have been sent.
    polled: bool,
}

impl Future for Acquire {
    type Output = Result<Decision, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.polled = true;
        let call = self
            .call
            .as_mut()
            .expect("an acquisition polled after it finished");
        let decision = ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(decision)
    }
}

impl Drop for Acquire {
    /// Dropped while its call may be on its way, it lets the call finish on a task of its own
    /// and gives back what it admitted.
    fn drop(&mut self) {
        let (Some(call), true) = (self.call.take(), self.polled) else {
            return;
        };
        let (slots, key, cost) = (Arc::clone(&self.slots), self.key.clone(), self.cost);
        spawn_refund(&self.key, async move {
            if let Ok(decision) = call.await {
                slots.give_back(key, decision, cost, 0);
            }
        });
    }
}

impl<K> Clone for RedisSlots<K> {
    fn clone(&self) -> Self {
        Self {
            slots: Arc::clone(&self.slots),
            redis_key: self.redis_key,
        }
    }
}

impl<K> fmt::Debug for RedisSlots<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slots = &*self.slots;
        f.debug_struct("RedisSlots")
            .field("in_flight", &slots.quota().burst())
            .field("store", &slots.store)
            .field("prefix", &slots.keys.prefix)
            .field("slot_expiry", &slots.expiry)
            .field("timeout", &slots.timeout)
            .field("fail_mode", &slots.fail_mode)
            .field("client_clock", &slots.clock.is_some())
            .finish()
    }
}
