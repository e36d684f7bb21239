//! A limit of requests in flight per key, as a policy: [`Policy::concurrent`], in memory, and
//! `Policy::concurrent_in_redis` (feature `redis`), shared by every instance.

use std::hash::Hash;

use super::policy::{Policy, PolicyError};
use super::KeyExtractor;
use crate::algorithm::Concurrency;
use crate::decision::Decision;
#[cfg(feature = "redis")]
use crate::limiter::BoxLimiter;
use crate::limiter::BoxReserve;
#[cfg(feature = "redis")]
use crate::redis::RedisRateLimiterBuilder;
use crate::{BoxError, KeyedRateLimiter, Limiter, Quota};

/// The limiter of a [`Policy::concurrent`] or a `Policy::concurrent_in_redis`: at most a
/// number of requests in flight per key, each holding its slot until its response body ends or
/// is dropped. Built only by those policies; every slot goes back exactly once, also where a
/// clone of it serves elsewhere: in [`Policy::new`] (one pool of slots for two policies) it
/// makes a concurrent policy; inside a [`Tiers`](crate::tiers::Tiers) (a limit per plan) or a
/// client quota, its admissions say they hold slots, so the layer gives them back whole when
/// the request ends (the body's end with [`wrap_body`](super::RateLimitLayer::wrap_body), else
/// the response's head; a client quota, the answer's head), and the headers advertise the
/// tier's slots as a concurrent policy's, `qu="concurrent-requests"` with no window.
#[derive(Clone, Debug)]
pub struct ConcurrencyLimiter<K: 'static>(Slots<K>);

/// Where the slots are kept.
#[derive(Clone, Debug)]
enum Slots<K: 'static> {
    Memory(KeyedRateLimiter<K, Concurrency>),
    /// A [`RedisRateLimiter`](crate::redis::RedisRateLimiter) of the `Concurrency` script.
    #[cfg(feature = "redis")]
    Redis(BoxLimiter<K>),
}

/// `Limiter::$method($args)` of whichever limiter keeps the slots.
macro_rules! on_slots {
    ($slots:expr, $method:ident($($arg:expr),*)) => {
        match $slots {
            Slots::Memory(memory) => Limiter::$method(memory, $($arg),*),
            #[cfg(feature = "redis")]
            Slots::Redis(redis) => Limiter::$method(redis, $($arg),*),
        }
    };
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Limiter<K> for ConcurrencyLimiter<K> {
    /// Boxed: a decision in Redis needs I/O; one in memory is made at once, by
    /// [`reserve_now`](Limiter::reserve_now).
    type Future = BoxReserve;

    /// The requests in flight allowed per key, as `permits` (and burst) of a quota whose period
    /// plays no part.
    fn quota(&self) -> Quota {
        on_slots!(&self.0, quota())
    }

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        on_slots!(&self.0, set_quota(quota))
    }

    fn reserve(&self, key: &K, cost: u32) -> Self::Future {
        match &self.0 {
            Slots::Memory(memory) => Box::pin(memory.reserve(key, cost)),
            #[cfg(feature = "redis")]
            Slots::Redis(redis) => redis.reserve(key, cost),
        }
    }

    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        on_slots!(&self.0, reserve_now(key, cost))
    }

    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        on_slots!(&self.0, refund(key, cost, decision))
    }

    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        on_slots!(&self.0, settle(key, estimate, decision, cost))
    }
}

impl<X> Policy<X, ConcurrencyLimiter<X::Key>>
where
    X: KeyExtractor,
    X::Key: Hash + Eq + Clone + Sync,
{
    /// At most `in_flight` requests of each key at once: an admitted request holds its slot
    /// until its response body ends, fails or is dropped, or until the inner service fails or
    /// the request is dropped before an answer; every slot goes back exactly once. A request
    /// that finds no free slot is refused at once, like any other policy's refusal (a `429`, in
    /// the same all-or-nothing decision: the other policies keep nothing), with `Retry-After:
    /// 1` (when a slot frees is not known); the headers say `qu="concurrent-requests"` and no
    /// window (draft-ietf-httpapi-ratelimit-headers-11): `"name";q=4;qu="concurrent-requests"`
    /// and `"name";r=2`. At most a million keys are held, those with nothing in flight dropped
    /// first.
    ///
    /// The slots are this process's; `concurrent_in_redis` (feature `redis`) keeps them in
    /// Redis, shared by every instance.
    ///
    /// The layer must carry the body: call [`wrap_body`](super::RateLimitLayer::wrap_body).
    /// A concurrent policy keeps its hold: [`count_if`](Self::count_if),
    /// [`settle_by`](Self::settle_by) and [`settle_from_body`](Self::settle_from_body) leave it
    /// as it is. [`cost`](Self::cost) and [`cost_by`](Self::cost_by) choose how many slots a
    /// request takes.
    ///
    /// ```
    /// use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
    ///
    /// // Four streams at once per API key.
    /// let streams = Policy::concurrent("streams", HeaderKey::new("x-api-key")?, 4)?;
    /// let layer = RateLimitLayer::new(streams).wrap_body();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PolicyError`] for a bad name (as [`Policy::new`]) or an `in_flight` of zero.
    pub fn concurrent(
        name: impl Into<String>,
        key: X,
        in_flight: u32,
    ) -> Result<Self, PolicyError> {
        let quota = Quota::per_second(in_flight)
            .map_err(|_| PolicyError::new("in_flight", "must be at least 1"))?;
        let limiter = KeyedRateLimiter::builder(quota)
            .algorithm::<Concurrency>()
            .build();
        Policy::new(name, key, ConcurrencyLimiter(Slots::Memory(limiter)))
    }
}

#[cfg(feature = "redis")]
impl<X> Policy<X, ConcurrencyLimiter<X::Key>>
where
    X: KeyExtractor,
    X::Key: crate::redis::RedisKey + Hash + Eq + Clone + Sync,
{
    /// [`Policy::concurrent`] with its slots in Redis: at most `in_flight` requests of each key
    /// at once across every instance that shares the Redis and the key prefix. A slot is held
    /// and given back, and the headers and refusals say what they say, as in memory
    /// (`qu="concurrent-requests"`, `Retry-After: 1`).
    ///
    /// The slots are kept by a [`RedisRateLimiter`](crate::redis::RedisRateLimiter) built
    /// from `redis`, running the algorithm of in-flight requests (`Concurrency`) in place of
    /// the builder's: at most `in_flight` slots per key, whatever the builder's quota. Its
    /// other settings apply as they do to any Redis limiter: the
    /// [`prefix`](RedisRateLimiterBuilder::prefix) (default `bulwark:concurrency:`; give each
    /// policy its own), the [`hash_tag`](RedisRateLimiterBuilder::hash_tag), the
    /// [`timeout`](RedisRateLimiterBuilder::timeout), the
    /// [`fail_mode`](RedisRateLimiterBuilder::fail_mode) and its
    /// [`probe_interval`](RedisRateLimiterBuilder::probe_interval), a
    /// [`client_clock`](RedisRateLimiterBuilder::client_clock) (for tests) and
    /// [`hold_for`](RedisRateLimiterBuilder::hold_for). It caches no refusals (a refusal's
    /// second is no time at which a slot frees). Every instance must be given the same
    /// `in_flight` (each sends its own with each decision), as a
    /// [`set_quota`](Limiter::set_quota) must reach them all.
    ///
    /// * **Atomic, by ids.** Each key is one sorted set. An admission takes its slots in one
    ///   script call, as a hold: members named by an id no other admission has, scored by when
    ///   they expire. A give-back removes those members by their names, in one call sent once
    ///   from a task of its own: one that arrives late, or twice, frees no other request's slot.
    /// * **A dead instance's slots come back** at most
    ///   [`hold_for`](RedisRateLimiterBuilder::hold_for) (30 s by default) after its last
    ///   renewal: each instance renews all of its live holds every third of it, in one call,
    ///   so a request of any length keeps its slot while its instance reaches Redis (see
    ///   `hold_for` for the bound). It loses it only if every renewal fails for about two
    ///   thirds of `hold_for` (Redis unreachable or stalled from this instance that long): the
    ///   slot then stops counting, and another request may take it while this one runs.
    /// * **Redis down or stalling.** A decision waits at most the timeout; then the fail mode
    ///   decides, as for any [`RedisRateLimiter`](crate::redis::RedisRateLimiter), and for a
    ///   probe interval after a failure to reach Redis it decides without asking.
    ///   [`RedisFailMode::Local`](crate::redis::RedisFailMode::Local), the default, is an
    ///   in-memory limit of `in_flight` per key in each instance (N instances admit at most N
    ///   × `in_flight` per key while Redis is away); `Open`, `Closed`, `Fallback` (the limiter
    ///   given decides; its decisions are given back to it) and `Propagate` (the layer's
    ///   [`limiter_error_mode`](super::RateLimitLayer::limiter_error_mode) answers) are as
    ///   documented there. A decision that Redis runs after its caller was answered (a stall)
    ///   changes nothing; one whose reply comes back too late holds its slots until they
    ///   expire. A give-back that cannot reach Redis is not sent again: its slots come back
    ///   when they expire, as a dead instance's do.
    /// * A Redis that restarts empty (or fails over to a replica behind it) has forgotten the
    ///   slots taken before: renewals never bring back a slot that Redis does not hold, so until
    ///   the requests then in flight end, a key may have up to twice `in_flight` in flight.
    /// * A reply of the wrong shape or type is a
    ///   [`RedisFailure::BadReply`](crate::redis::RedisFailure::BadReply) that says what is
    ///   wrong; a key that holds another type fails with Redis's `WRONGTYPE` error. The fail
    ///   mode decides either.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
    /// use tower_bulwark::redis::{RedisRateLimiter, RedisStore};
    /// use tower_bulwark::Quota;
    ///
    /// # async fn run() -> Result<(), tower_bulwark::BoxError> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// // The quota of the builder plays no part: four streams at once per API key, in all.
    /// let redis = RedisRateLimiter::builder(Quota::per_second(1)?, store)
    ///     .prefix("streams:")
    ///     .hold_for(Duration::from_secs(20));
    /// let streams = Policy::concurrent_in_redis("streams", HeaderKey::new("x-api-key")?, 4, redis)?;
    /// let layer = RateLimitLayer::new(streams).wrap_body();
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`PolicyError`] for a bad name or an `in_flight` of zero, as
    /// [`concurrent`](Self::concurrent); a [`BuildError`](crate::redis::BuildError) for Redis
    /// settings that cannot work: a prefix or hash tag holding a brace, a zero timeout, a
    /// [`hold_for`](RedisRateLimiterBuilder::hold_for) under a second or over a day, or a
    /// [`lease`](RedisRateLimiterBuilder::lease) (a concurrent policy holds slots, it leases
    /// no permits).
    pub fn concurrent_in_redis(
        name: impl Into<String>,
        key: X,
        in_flight: u32,
        redis: RedisRateLimiterBuilder,
    ) -> Result<Self, BoxError> {
        if in_flight == 0 {
            return Err(PolicyError::new("in_flight", "must be at least 1").into());
        }
        let slots = ConcurrencyLimiter(Slots::Redis(BoxLimiter::new(redis.concurrent(in_flight)?)));
        Ok(Policy::new(name, key, slots)?)
    }
}
