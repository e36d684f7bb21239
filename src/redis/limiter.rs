//! The limiter: its public face, and the decisions and refunds that go through Redis (each
//! script call bounded in time), its fail mode or its cache of refusals.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::cache::RefusalCache;
use super::coalesce::Coalescer;
use super::fail_mode::{Breaker, DefaultLocal};
use super::future::{ReserveFuture, ReserveState};
use super::hold::Holds;
use super::key::{fingerprint, KeyLayout};
use super::lease::Leases;
use super::offset::ClockOffset;
use super::reply::{parse_reply, Reply};
use super::script::{LimiterScript, Operation, ScriptQuota};
use super::{
    next_id, BuildError, RedisFailMode, RedisFailure, RedisKey, RedisRateLimiterBuilder, RedisStore,
};
use crate::clock::{saturating_nanos, Clock};
use crate::decision::{Decision, Hold, InsufficientCapacity, Taken};
use crate::limiter::Change;
use crate::{BoxError, Limiter, Quota};

/// What a [`RedisRateLimiter`] has counted of its own since it was built
/// ([`RedisRateLimiter::counts`]); the lease counts are zero without
/// [leases](RedisRateLimiterBuilder::lease).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisCounts {
    /// Decisions Redis did not give (timeouts, errors, bad replies, and decisions taken without
    /// asking during a [`probe_interval`](RedisRateLimiterBuilder::probe_interval)): the fail
    /// mode decided each.
    pub failures: u64,
    /// Refusals answered without a round trip: from the cache of refusals, or while the lease
    /// a call would be admitted from had not begun.
    pub cached_refusals: u64,
    /// Admissions made from a lease's share, without a round trip.
    pub lease_decisions: u64,
    /// Calls refused without a round trip while the lease they would be admitted from had not
    /// begun (also counted in `cached_refusals`).
    pub refused_before_lease: u64,
    /// Leases taken from Redis.
    pub leases_taken: u64,
    /// Leases ended: when spent or over (by the next call, or at their time), their unused
    /// permits back in Redis.
    pub leases_ended: u64,
    /// Permits those leases gave back unused.
    pub lease_unused_permits: u64,
}

/// A limiter whose state lives in Redis, shared by every instance that uses the same Redis and
/// key prefix. Cheap to clone; clones share everything.
///
/// It decides for any key that implements [`RedisKey`] (strings, numbers, IP addresses, header
/// values, `()`), through [`Limiter::reserve`] or [`check`](Self::check). Its scripts run the
/// algorithm chosen by [`RedisRateLimiterBuilder::algorithm`].
#[derive(Clone)]
pub struct RedisRateLimiter {
    pub(super) inner: Arc<Inner>,
}

/// Everything a limiter and its clones share.
pub(crate) struct Inner {
    pub(super) store: RedisStore,
    /// The quota and the script arguments made from it, replaced as one.
    pub(super) quota: ArcSwap<ScriptQuota>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) keys: KeyLayout,
    pub(super) timeout: Duration,
    pub(super) fail_mode: RedisFailMode,
    /// The local limiter of [`RedisFailMode::Local`], which `set_quota` keeps on the quota.
    pub(super) local: Option<DefaultLocal>,
    pub(super) breaker: Breaker,
    pub(super) cache: Option<RefusalCache>,
    pub(super) cached_refusals: AtomicU64,
    /// The shares of keys leased to this instance, when leases are on.
    pub(super) leases: Option<Leases>,
    /// The offset between `clock` and the server's `TIME`, from the replies so far.
    pub(super) offset: ClockOffset,
    /// The keys with a decision in flight, and the decisions waiting to go with the next.
    pub(super) coalescer: Arc<Coalescer>,
    /// The holds of this instance's admissions, renewed while they live.
    pub(super) holds: Holds,
}

impl RedisRateLimiter {
    /// A builder for a GCRA limiter of `quota` on `store`, with the server's clock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
    /// use tower_bulwark::{algorithm::SlidingLog, Quota};
    ///
    /// # async fn run() -> Result<(), tower_bulwark::BoxError> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// let limiter = RedisRateLimiter::builder(Quota::per_minute(100)?, store)
    ///     .algorithm::<SlidingLog>()
    ///     .timeout(Duration::from_millis(50))
    ///     .fail_mode(RedisFailMode::Closed(Duration::from_secs(1)))
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(quota: Quota, store: RedisStore) -> RedisRateLimiterBuilder {
        RedisRateLimiterBuilder::new(quota, store)
    }

    /// The quota this limiter sends with its decisions now.
    pub fn quota(&self) -> Quota {
        self.inner.quota.load().quota
    }

    /// Replaces the quota that this limiter, and every clone of it, sends to Redis.
    ///
    /// The state in Redis is kept, as in memory (see [`KeyedRateLimiter::set_quota`]): GCRA
    /// keeps each key's TAT, the sliding log its entries; the window algorithms keep their
    /// counts, and since their windows are cut from the server's tick zero rather than from a
    /// limiter's creation, a key written under another period has its window renumbered as the
    /// window of the new period that holds its latest reading, counts and all. A decision
    /// already sent decides with the quota it was sent with.
    ///
    /// The quota travels with every script call, so a change applies to the decisions of this
    /// process only: each instance that shares the keys must be told (every instance's limiter
    /// must call this, or be rebuilt from the same configuration). Until they all are, each
    /// decides with its own quota against the shared state. Refusals cached here are
    /// forgotten. The local limiter of [`RedisFailMode::Local`] (the default) takes the new
    /// quota too; one given with [`RedisFailMode::fallback`] keeps its own. With a
    /// [`client_clock`](RedisRateLimiterBuilder::client_clock), a decision begun once this has
    /// returned is decided as of the change if its reading is older (sent so, and so decided by
    /// a lease's share), as in memory.
    ///
    /// [`KeyedRateLimiter::set_quota`]: crate::KeyedRateLimiter::set_quota
    ///
    /// # Errors
    ///
    /// The quota cannot run in the scripts (the same checks of the quota as
    /// [`build`](RedisRateLimiterBuilder::build)); nothing changes. A lease's `max_share` above
    /// the new burst is no error: each share is at most the burst in force.
    pub fn set_quota(&self, quota: Quota) -> Result<(), BuildError> {
        let script_quota = self.params_for(&quota)?.changed_at(self.inner.clock.now());
        self.inner.quota.store(Arc::new(script_quota));
        if let Some(local) = &self.inner.local {
            // An in-memory limiter takes any quota.
            let _ = local.set_quota(quota);
        }
        if let Some(cache) = &self.inner.cache {
            cache.clear();
        }
        Ok(())
    }

    /// The script arguments for `quota`, or why it cannot run in this limiter's scripts.
    pub(crate) fn params_for(&self, quota: &Quota) -> Result<ScriptQuota, BuildError> {
        self.inner.quota.load().with_quota(*quota)
    }

    /// [`params_for`](Self::params_for), refused as well where [`build`] would refuse this
    /// limiter's leases under `quota` (a `max_share` above its burst, which `set_quota` takes,
    /// clamping the share): what a config file that `build` refuses cannot bring by a reload.
    ///
    /// [`build`]: super::RedisRateLimiterBuilder::build
    #[cfg_attr(not(feature = "config"), allow(dead_code))]
    pub(crate) fn params_as_built(&self, quota: &Quota) -> Result<ScriptQuota, BuildError> {
        let params = self.params_for(quota)?;
        if let Some(leases) = &self.inner.leases {
            leases.check(&params)?;
        }
        Ok(params)
    }

    /// What this limiter and its clones have counted since it was built: failures, refusals
    /// answered without a round trip, and what its leases did.
    pub fn counts(&self) -> RedisCounts {
        let mut counts =
            (self.inner.leases.as_ref()).map_or_else(RedisCounts::default, Leases::counts);
        counts.failures = self.inner.breaker.failures();
        counts.cached_refusals =
            self.inner.cached_refusals.load(Ordering::Relaxed) + counts.refused_before_lease;
        counts
    }

    /// The Redis key that holds the state of `key`.
    pub fn redis_key<K: RedisKey + ?Sized>(&self, key: &K) -> String {
        self.inner.keys.redis_key(key)
    }

    /// Decides on one permit for `key` now, never reserving a later one.
    ///
    /// # Errors
    ///
    /// Only with [`RedisFailMode::Propagate`]: the [`RedisFailure`] of a decision Redis could
    /// not give. Every other fail mode answers with a decision.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use tower_bulwark::redis::{RedisRateLimiter, RedisStore};
    /// # use tower_bulwark::Quota;
    /// # async fn run() -> Result<(), tower_bulwark::BoxError> {
    /// # let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// let limiter = RedisRateLimiter::builder(Quota::per_second(5)?, store).build()?;
    /// let decision = limiter.check(&"203.0.113.7").await?;
    /// if !decision.allowed {
    ///     println!("come back in {:?}", decision.retry_after);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check<K: RedisKey + ?Sized>(&self, key: &K) -> Result<Decision, BoxError> {
        self.check_n(key, 1).await
    }

    /// Decides on `cost` permits for `key` now, never reserving later ones.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] when `cost` is more than the quota can ever admit at once; with
    /// [`RedisFailMode::Propagate`], the [`RedisFailure`] of a decision Redis could not give.
    pub async fn check_n<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        cost: u32,
    ) -> Result<Decision, BoxError> {
        self.decision(key, cost, false).await
    }

    /// Decides on `cost` permits for `key`, waiting up to the quota's `max_wait` if `wait`,
    /// with the quota current when it is called.
    fn decision<K: RedisKey + ?Sized>(&self, key: &K, cost: u32, wait: bool) -> ReserveFuture {
        let inner = &self.inner;
        let quota = inner.quota.load_full();
        if cost > quota.capacity {
            let err = InsufficientCapacity::new(cost, quota.capacity);
            return ReserveFuture(ReserveState::Ready(Some(Err(err.into()))));
        }
        let max_wait = if wait { quota.max_wait } else { 0 };
        let redis_key = inner.keys.redis_key(key);
        // Decided without a round trip: from the share of a lease held, or a cached refusal.
        let at_once = (inner.share_decision(&quota, &redis_key, cost))
            .or_else(|| inner.cached_refusal(&quota, &redis_key, cost, max_wait));
        if let Some(decision) = at_once {
            return ReserveFuture(ReserveState::Ready(Some(Ok(decision))));
        }
        let call = {
            let inner = Arc::clone(inner);
            let key = redis_key.clone();
            async move { (inner.lease_decide(&quota, key, cost, max_wait)).await }
        };
        ReserveFuture(ReserveState::InFlight {
            call: Box::pin(call),
            inner: Arc::clone(inner),
            key: redis_key,
            cost,
            polled: false,
        })
    }

    /// Settles an admission of `estimate` permits to `cost`, as [`Limiter::settle`] does, and
    /// waits until Redis has applied it; a settle to zero gives the admission back, as
    /// [`Limiter::refund`] does.
    ///
    /// # Errors
    ///
    /// The [`RedisFailure`] of a settle that Redis did not apply (counted and logged as a
    /// failure, and not sent again).
    pub async fn settle_and_wait<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        estimate: u32,
        decision: Decision,
        cost: u32,
    ) -> Result<(), BoxError> {
        let redis_key = self.inner.keys.redis_key(key);
        if let Some(call) = self.inner.change(redis_key, decision, estimate, cost) {
            call.await?;
        }
        Ok(())
    }
}

/// Script calls are each bounded in time: the limiter's timeout answers the caller, and a
/// deadline in the server's time keeps a decision that runs after it from changing anything.
impl Inner {
    /// Decides on `cost` permits for `key` with `quota`, waiting at most `max_wait` ticks: in
    /// Redis, or by the fail mode when Redis cannot.
    pub(super) async fn decide(
        &self,
        quota: &ScriptQuota,
        key: String,
        cost: u32,
        max_wait: u64,
    ) -> Result<Decision, BoxError> {
        // The caller is answered when the limiter's timeout or the connection's runs out.
        let longest_wait = saturating_nanos(self.store.longest_wait(self.timeout));
        let answered_by = self.clock.now().saturating_add(longest_wait);
        // An admission of a script that holds takes its hold under an id of its own, however
        // its call goes (alone, or in a batch with others on the key).
        let hold = if quota.script.holds() { next_id() } else { 0 };
        let call = async {
            // A first "late" answer may come from a probe (no offset known yet) or from an
            // offset that the clocks have left behind; either way the reply corrected the
            // offset, so the request goes once more with a deadline that now means something.
            for _ in 0..2 {
                // Before any reply, a deadline already past: the script answers at once with
                // the server's time and changes nothing (see `offset`).
                let deadline = self.offset.server_deadline(answered_by).unwrap_or(0);
                let operation = Operation::Decide {
                    max_wait,
                    deadline,
                    hold,
                };
                match self.run_script(quota, &key, operation, cost).await? {
                    Reply::Decision(decision, _) => return Ok(decision),
                    Reply::Late(_) => {}
                    other => return Err(other.unexpected("a decision")),
                }
            }
            Err(RedisFailure::Late)
        };
        let asked = self.bounded(quota, call, false);
        let decision = match asked.await {
            Ok(mut decision) => {
                self.cache_refusal(&key, cost, &decision);
                if hold != 0 && decision.allowed {
                    decision.admission.taken = Taken::RedisHold { hold };
                    // Settled whatever ends the request: its estimate, at least (its slots,
                    // below).
                    if quota.script == LimiterScript::Metered {
                        decision = decision.holding(Hold::Estimate);
                    }
                    if cost > 0 {
                        self.holds.take(&key, hold, cost);
                    }
                }
                Ok(self.stamp(decision, &key, cost))
            }
            Err(failure) => (self.fail_mode).decide(self.store.id, quota.limit, key, cost, failure),
        };
        // A concurrent policy's decisions are of slots, whoever made them: Redis's admission
        // and a fail mode's go back whole when the request ends (a rate limiter's too: its
        // permits come back then), and a refusal says so in the headers, as in memory.
        match quota.script {
            LimiterScript::Concurrency => decision.map(|d| d.holding(Hold::Slots)),
            _ => decision,
        }
    }

    /// Settles `decision`, a fail mode's admission for `key`, to `cost`: through the local
    /// limiter that made it, or, made by none, nothing to give back. Whether it was this
    /// limiter's for `key`.
    fn fail_mode_change(&self, key: String, decision: Decision, estimate: u32, cost: u32) -> bool {
        if !decision.allowed {
            return false;
        }
        let mine = decision.is_from(self.store.id, fingerprint(&key));
        (self.fail_mode.change(key, decision, estimate, cost)).unwrap_or(mine)
    }

    /// The cached refusal of `cost` permits for `key` (its Redis key), for a call that may wait
    /// `max_wait` ticks, if one still stands: counted, and answered without a round trip.
    pub(super) fn cached_refusal(
        &self,
        quota: &ScriptQuota,
        key: &str,
        cost: u32,
        max_wait: u64,
    ) -> Option<Decision> {
        let max_wait_nanos = max_wait.saturating_mul(quota.tick_nanos);
        let refusal = (self.cache.as_ref())?.check(key, cost, self.clock.now(), max_wait_nanos)?;
        self.cached_refusals.fetch_add(1, Ordering::Relaxed);
        Some(refusal.of_cost(cost))
    }

    /// Caches `decision` of `cost` permits for `key` (its Redis key) if Redis refused it.
    pub(super) fn cache_refusal(&self, key: &str, cost: u32, decision: &Decision) {
        if let (false, Some(cache)) = (decision.allowed, &self.cache) {
            cache.insert(key, cost, self.clock.now(), decision);
        }
    }

    /// Marks `decision` as this limiter's, for `key` (its Redis key), of `cost` permits.
    pub(super) fn stamp(&self, decision: Decision, key: &str, cost: u32) -> Decision {
        (decision.of_cost(cost).for_key(fingerprint(key))).made_by(self.store.id)
    }

    /// Whether `decision` is an admission of this limiter's for `key` (its Redis key), made
    /// through this limiter's store for that key (a fail mode's: see `fail_mode_change`).
    fn takes_back(&self, key: &str, decision: &Decision) -> bool {
        decision.allowed && decision.is_from(self.store.id, fingerprint(key))
    }

    /// Settles `decision`, admitted for `estimate` permits, to `cost` (a give-back settles to
    /// zero). At once, a cached refusal of `key` is forgotten (its permits came back), a fail
    /// mode's decision goes to the local limiter, a lease's to its share, and a hold leaves the
    /// live ones (see `hold.rs`); what Redis must still be told is returned as a call to send,
    /// exactly once: a hold's settle ([`Metered`]'s, whole, to `cost`; a concurrent policy's
    /// slots beyond `cost`, those it still has), or the [`Change`] of the other scripts. A
    /// decision that Redis made for another key, or through another store, gives nothing back
    /// (see [`takes_back`](Self::takes_back)).
    ///
    /// [`Metered`]: crate::algorithm::Metered
    ///
    /// The call tells the script the instant the permits were charged at and the state the
    /// admission left (GCRA gives back only while the key's TAT is still that one), with the
    /// current quota's arguments, as the in-memory limiters give back with the current
    /// algorithm. It carries no deadline: it only restores what one admission took (the scripts
    /// take off that admission's permits, from wherever they still count), so applying it late
    /// is as right as applying it at once, and dropping it would leave a refused request's
    /// permits spent. It is sent exactly once per decision (nothing retries it), so a late one
    /// cannot be applied twice. A charge is the same: a forced admission of the difference, at
    /// the script's instant, which Redis never refuses.
    pub(super) fn change(
        self: &Arc<Self>,
        key: String,
        decision: Decision,
        estimate: u32,
        cost: u32,
    ) -> Option<impl Future<Output = Result<(), RedisFailure>> + Send + 'static> {
        if let Taken::RedisFailMode(_) = decision.admission.taken {
            self.fail_mode_change(key, decision, estimate, cost);
            return None;
        }
        if !self.takes_back(&key, &decision) {
            return None;
        }
        let mut change = Change::settle(estimate, &decision, cost);
        let quota = self.quota.load();
        if !decision.holds_estimate()
            && !decision.holds_slots()
            && matches!(change, Change::Charge { estimate, cost }
                if crate::algorithm::settle_debt(estimate, cost, quota.capacity) == 0)
        {
            // Settled to its estimate, or past it by nothing it may be charged (it took the
            // whole capacity): nothing changes, as in memory, and no call is made (a hold, of
            // an estimate or of slots, still ends, in Redis or by a fail mode's local limiter).
            return None;
        }
        if let Some(cache) = &self.cache {
            cache.forget(&key);
        }
        // A hold's settle: the call, and the cost it charges.
        let mut settle = None;
        // A share whose lease is over, ended here and given back before the charge (see
        // `Leases::charge`).
        let mut ended = None;
        match (decision.admission.taken, &self.leases) {
            // A metered hold settles whole, whether still live here or not; a concurrent
            // policy's gives back the slots named by the estimate whatever the cost (a slot has
            // no cost to settle, as in memory: a refund names the slots it gives back), never
            // more than it still has.
            (Taken::RedisHold { hold }, _) => {
                let (estimate, cost) = if decision.holds_slots() {
                    let back = decision.refundable(estimate);
                    // A hold this instance does not have live (made by another limiter on the
                    // store, or ended here) is still removed in Redis, by its names: every slot
                    // the admission took, so that the instance renewing it cannot keep it.
                    let had = (self.holds.release(&key, hold, back))
                        .unwrap_or_else(|| decision.refundable(u32::MAX));
                    (back.min(had), had)
                } else {
                    self.holds.release(&key, hold, u32::MAX);
                    (decision.refundable(estimate), cost)
                };
                settle = Some((Operation::Settle { hold, estimate }, cost));
            }
            // From a lease: back to its share while it lasts, or a debt taken from it; a debt
            // the share cannot pay is charged in Redis.
            (Taken::RedisLease { lease }, Some(leases)) => match change {
                Change::Refund(cost) => {
                    leases.refund(&key, lease, decision.refundable(cost));
                    return None;
                }
                Change::Charge { estimate, cost } => {
                    let debt = crate::algorithm::settle_debt(estimate, cost, quota.capacity);
                    let taken = leases.charge(&key, lease, debt, quota.reading(&*self.clock));
                    if debt == 0 || taken == Some(debt) {
                        return None;
                    }
                    ended = taken.is_none().then(|| leases.end(&key, lease)).flatten();
                    // What the share could not pay is charged in Redis.
                    change = Change::Charge {
                        estimate: estimate + taken.unwrap_or(0),
                        cost,
                    };
                }
            },
            _ => {}
        }
        let refund = Operation::Refund {
            charged: decision.charged(),
            waited: saturating_nanos(decision.wait),
        };
        let inner = Arc::clone(self);
        Some(async move {
            let quota = inner.quota.load_full();
            let (operation, cost) = match (settle, change) {
                (Some(settle), _) => settle,
                (None, Change::Refund(cost)) => (refund, decision.refundable(cost)),
                (None, Change::Charge { estimate, cost }) => {
                    let debt = crate::algorithm::settle_debt(estimate, cost, quota.capacity);
                    (Operation::Charge, debt)
                }
            };
            if let Some(ended) = ended {
                inner.give_back_share(&key, ended).await;
            }
            let call = async {
                let reply = inner.run_script(&quota, &key, operation, cost).await?;
                reply.applied("the answer to a refund or a charge")
            };
            inner.bounded(&quota, call, true).await
        })
    }

    /// Runs `call` unless it is a decision (not `give_back`) and Redis failed less than a probe
    /// interval ago, giving up after the limiter's timeout; the breaker counts and logs a
    /// failure. A give-back (a refund, a settle, a share's end) is sent even then: a fail mode
    /// decides in its place when Redis cannot, but nothing would give back what Redis took
    /// before (a hold would stand until its expiry, a settle's debt would be lost). The events
    /// name the limiter by its prefix, never by a client's key, which may identify a person
    /// (see [`Observed::hide_keys`](crate::observe::Observed::hide_keys)).
    pub(super) async fn bounded<T>(
        &self,
        quota: &ScriptQuota,
        call: impl Future<Output = Result<T, RedisFailure>>,
        give_back: bool,
    ) -> Result<T, RedisFailure> {
        let sent = self.breaker.elapsed();
        let result = if !give_back && self.breaker.skipping(sent) {
            Err(RedisFailure::Skipped)
        } else {
            tokio::time::timeout(self.timeout, call)
                .await
                .unwrap_or_else(|_| Err(RedisFailure::Timeout(self.timeout)))
        };
        match &result {
            // A give-back's answer does not end the probe interval: in a cluster it may come from
            // a healthy node while the decisions' node still fails.
            Ok(_) if give_back => {}
            Ok(_) => (self.breaker).answered(&self.keys.prefix, quota.script.name(), sent),
            Err(failure) => {
                (self.breaker).failed(&self.keys.prefix, failure, &self.fail_mode, sent)
            }
        }
        result
    }

    /// One script call and its reply, which also tells the offset between the clocks. With a
    /// client clock, the script decides at its reading; otherwise at the server's `TIME`.
    pub(super) async fn run_script(
        &self,
        quota: &ScriptQuota,
        key: &str,
        operation: Operation,
        cost: u32,
    ) -> Result<Reply, RedisFailure> {
        let now = quota.client_now(&*self.clock)?;
        let sent = self.clock.now();
        let value = match operation {
            Operation::Decide { .. } => {
                (self.coalescer)
                    .decide(&self.store, quota, key, operation, now, cost)
                    .await?
            }
            _ => {
                (self.store)
                    .run(&quota.invocation(key, operation, now, cost))
                    .await?
            }
        };
        let received = self.clock.now();
        let reply = parse_reply(&value, quota)?;
        self.offset.observe(sent, received, reply.server_time());
        Ok(reply)
    }
}

/// Runs `task` on the current tokio runtime; outside one, logs that what a key of the limiter
/// of `prefix` was admitted is not given back.
pub(super) fn spawn_refund(prefix: &str, task: impl Future<Output = ()> + Send + 'static) {
    if !super::spawn(task) {
        tracing::warn!(
            target: "tower_bulwark::redis",
            prefix,
            "a refund outside a tokio runtime; nothing is given back",
        );
    }
}

impl fmt::Debug for RedisRateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        let quota = inner.quota.load();
        f.debug_struct("RedisRateLimiter")
            .field("algorithm", &quota.script.name())
            .field("quota", &quota.quota)
            .field("store", &inner.store)
            .field("client_time", &quota.client_clock())
            .field("prefix", &inner.keys.prefix)
            .field("hash_tag", &inner.keys.hash_tag)
            .field("timeout", &inner.timeout)
            .field("policy", &inner.fail_mode)
            .field("probe_interval", &inner.breaker.probe_interval)
            .field("refusal_cache", &inner.cache.is_some())
            .field("failures", &inner.breaker.failures())
            .finish()
    }
}

impl<K: RedisKey> Limiter<K> for RedisRateLimiter {
    type Future = ReserveFuture;

    fn quota(&self) -> Quota {
        RedisRateLimiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        Ok(RedisRateLimiter::set_quota(self, quota)?)
    }

    fn reserve(&self, key: &K, cost: u32) -> ReserveFuture {
        self.decision(key, cost, true)
    }

    /// A settle to zero.
    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        self.send(key, decision, cost, 0)
    }

    /// A charge is one more script call, sent as a refund is: see [`Limiter::settle`].
    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        self.send(key, decision, estimate, cost)
    }
}

impl RedisRateLimiter {
    /// Settles `decision` of `estimate` permits to `cost`, sending what Redis must be told from
    /// a spawned task.
    fn send<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        decision: Decision,
        estimate: u32,
        cost: u32,
    ) -> bool {
        let redis_key = self.inner.keys.redis_key(key);
        if let Taken::RedisFailMode(_) = decision.admission.taken {
            return (self.inner).fail_mode_change(redis_key, decision, estimate, cost);
        }
        if !self.inner.takes_back(&redis_key, &decision) {
            return false;
        }
        if let Some(call) = self.inner.change(redis_key, decision, estimate, cost) {
            // Failures are counted and logged inside; nothing waits for the outcome.
            let prefix = self.inner.keys.prefix.clone();
            spawn_refund(&self.inner.keys.prefix, async move {
                if let Err(failure) = call.await {
                    tracing::debug!(
                        target: "tower_bulwark::redis",
                        prefix, error = %failure,
                        "a give-back or settle did not reach redis and is not sent again; a \
                         hold it ended ends at its expiry",
                    );
                }
            });
        }
        true
    }
}
