//! Limiter state in Redis (or Valkey): one quota across every instance of a service.
//!
//! The in-memory limiters limit per process; with N replicas behind a load balancer a quota of 10
//! becomes up to 10·N. A [`RedisRateLimiter`] keeps the state of the same four algorithms in
//! Redis instead, so every instance that shares the Redis draws from one budget per key. It is a
//! [`Limiter`] like the others, so a [`RateLimitLayer`](crate::RateLimitLayer) takes it as it is.
//!
//! ```no_run
//! use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
//! use tower_bulwark::{Limiter, Quota, algorithm::SlidingLog};
//!
//! # async fn run() -> Result<(), tower_bulwark::BoxError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let limiter = RedisRateLimiter::builder(Quota::per_minute(100)?, store)
//!     .algorithm::<SlidingLog>()
//!     .prefix("api:")
//!     .fail_mode(RedisFailMode::fallback(Quota::per_minute(25)?))
//!     .build()?;
//! let decision = limiter.reserve(&"203.0.113.7", 1).await?;
//! println!("allowed: {}, retry after {:?}", decision.allowed, decision.retry_after);
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! * **One script per algorithm, one round trip per decision.** Each algorithm is a Lua script
//!   that reads the key's state, decides and writes the new state atomically on the server. It is
//!   sent by `EVALSHA`; when the server does not know it (a restart empties the script cache) it
//!   is loaded and sent again.
//! * **The server's clock.** Scripts read `TIME` (microseconds), so instances with skewed clocks
//!   agree. Every value a script handles is an integer number of ticks, rounded exactly as the
//!   in-memory algorithm rounds, so nothing is lost to Lua's conversion of numbers to integer
//!   replies. Window algorithms count their windows from the Unix epoch. For tests,
//!   [`client_clock`](RedisRateLimiterBuilder::client_clock) passes a [`Clock`]'s
//!   nanoseconds instead, which makes the decisions identical to the in-memory limiter's.
//! * **One key per decision, always with an expiry.** The key of client key `k` is
//!   `<prefix>{k}` by default: the braces are Redis Cluster's hash tag, so the state of `k` lives
//!   in one slot and different clients spread over the cluster ([`HashTag`]). A `}` or `%` in a
//!   client key is written as `%7D` or `%25`, so no client key can end the hash tag early and
//!   choose its slot, and different client keys stay different. Each write sets an
//!   expiry at the instant the state stops mattering, so idle clients leave nothing behind.
//!   The sliding log keeps one sorted-set member per permit, named `<instant>:<sequence>` so that
//!   many requests in the same microsecond are all counted.
//! * **Clocks that read late.** Every key also keeps the latest instant a script used (GCRA as
//!   `<tat>:<latest>`, the window hashes as field `l`, the sliding log as a member `hw` scored
//!   below zero), and a script whose `now` is earlier (a client clock behind another instance's,
//!   a server clock stepped back) decides as of that instant, as the in-memory limiters do: the
//!   sliding log would otherwise count without the permits a later script pruned.
//! * **Same [`Decision`]** as in memory: `limit`, `remaining`, `retry_after`, `reset_after` and
//!   reservations within the quota's `max_wait`. Every admission remembers the instant its
//!   permits were charged at (and, for GCRA, the TAT it left), so a
//!   [`refund`](Limiter::refund) (a dropped waiter, or a request that another policy refused)
//!   takes off what that admission took, whether it was immediate or reserved, as the
//!   in-memory algorithm does (see the last limit below).
//! * **A decision that comes too late changes nothing.** Each script carries a deadline in the
//!   server's time: the instant at which its caller will have been answered without it (the
//!   limiter's timeout, or the connection's response timeout if shorter), converted with the
//!   offset between this process's clock and the server's `TIME` that every reply reveals
//!   (a lower bound from the send and receive instants, so the deadline errs early). A script
//!   that Redis runs later (after a stall, say) changes nothing and answers "late"; its caller
//!   is long gone. The first decision, before any offset is known, sends a deadline already
//!   past: the script answers at once with the server's time and the decision is sent again
//!   with a real deadline. Refunds carry no deadline: applying one late still restores exactly
//!   what its admission took, and each is sent once.
//! * **Never hangs.** Every call is bounded by a short [`timeout`](RedisRateLimiterBuilder::timeout);
//!   a timeout, a connection error or a reply that is not a decision is counted
//!   ([`RedisRateLimiter::failures`]), logged with `tracing` and decided by the
//!   [`RedisFailMode`]. After a timeout or a connection error, decisions go straight to the
//!   policy for a [`probe_interval`](RedisRateLimiterBuilder::probe_interval), so a dead Redis
//!   does not cost every request a timeout; then Redis is tried again. The connection
//!   reconnects by itself.
//! * **Refusals are cached.** A key that Redis refused is refused locally until its retry time,
//!   without a round trip ([`without_refusal_cache`](RedisRateLimiterBuilder::without_refusal_cache)
//!   turns this off).
//!
//! # Limits
//!
//! * The scripts need Redis 4 or later, or any Valkey: they use multi-field `HSET`, and they
//!   write after reading `TIME`, which needs effects replication (the default from Redis 5; on
//!   Redis 4 the script switches it on).
//! * Lua numbers are doubles: the builder refuses quotas whose arithmetic would leave the exact
//!   integer range (a GCRA burst window or a period longer than about 35 years with the server's
//!   clock, about 13 days with a client clock; `permits × period` above 2^52 ticks for the sliding
//!   counter).
//! * With the server's clock, times are whole microseconds: intervals and periods are rounded up
//!   to the microsecond (never exceeding the rate), `max_wait` down.
//! * [`Limiter::refund`] is synchronous, so it sends its script from a spawned task (it needs a
//!   tokio runtime; outside one it logs and gives nothing back). Use
//!   [`RedisRateLimiter::refund_and_wait`] to await it.
//! * A cached refusal is not revised when another instance gives permits back: such a key may be
//!   refused locally until its original retry time.
//! * The deadline is as good as the clocks: the offset allows 100 ppm of drift between replies,
//!   and in a Redis Cluster each node's clock should agree with the others' (the estimate is one
//!   per limiter, not per node), or a script may run up to their difference after its deadline.
//! * Refunds are exact where the state can say what the admission took, and otherwise never
//!   give back more than it took (the same rules as in memory, see the guide): GCRA gives back
//!   `cost` intervals (never below the latest reading) while the key's TAT is still the one the
//!   admission left, `cost` intervals less the time elapsed since when only immediate
//!   admissions came after it, and nothing while a later reservation is ahead; the fixed window
//!   gives back only a charge that holds the last slots of its queue of cycles.

use std::fmt;
use std::future::{Future, Ready};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::Value;

use crate::algorithm::Gcra;
use crate::clock::{Clock, SystemClock};
use crate::decision::Source;
use crate::{
    decision::{Decision, InsufficientCapacity},
    BoxError, KeyedRateLimiter, Limiter, Quota,
};

mod cache;
mod error;
mod key;
mod offset;
mod script;

pub use error::{BuildError, RedisFailure};
pub use key::RedisKey;
pub use script::RedisAlgorithm;

use cache::RefusalCache;
use offset::ClockOffset;
use script::{Params, Reply};

/// The default timeout of one decision.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// The response timeout of the connection managers this module makes (the client's default).
const MANAGER_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// The default time during which decisions skip Redis after a failure.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// The default bound on refused keys held by the local cache.
pub const DEFAULT_REFUSAL_CACHE_CAPACITY: usize = 100_000;

/// A connection to Redis shared by any number of limiters: one server (through a reconnecting
/// [`ConnectionManager`]) or a Redis Cluster.
///
/// Cloning is cheap; clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    /// How long the connection itself waits for a reply before it fails the command, if it does:
    /// a decision's caller is answered by then at the latest, so its deadline is no later.
    response_timeout: Option<Duration>,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisStore {
    fn manager_config() -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(MANAGER_RESPONSE_TIMEOUT))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1))
    }

    /// Connects to the server at `url` (`redis://host:port/db`), failing if it cannot be reached
    /// now. Later, the connection reconnects by itself whenever it is lost.
    pub async fn connect(url: &str) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let manager = ConnectionManager::new_with_config(client, Self::manager_config()).await?;
        Ok(Self::from_manager(manager))
    }

    /// Prepares a connection to the server at `url` without connecting: the first decision
    /// connects. A service can start while Redis is down (its fail mode decides meanwhile).
    ///
    /// Must be called within a tokio runtime.
    pub fn connect_lazy(url: &str) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let manager = ConnectionManager::new_lazy_with_config(client, Self::manager_config())?;
        Ok(Self::from_manager(manager))
    }

    /// Connects to a Redis Cluster through any of its nodes' URLs.
    pub async fn connect_cluster<I, S>(urls: I) -> Result<Self, redis::RedisError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        let client = redis::cluster::ClusterClient::builder(urls)
            .connection_timeout(Duration::from_secs(1))
            .build()?;
        let conn = client.get_async_connection().await?;
        Ok(Self::from_cluster(conn))
    }

    /// Uses a connection manager configured by hand.
    ///
    /// Its response timeout is taken to be the client's default (500 ms): a decision's deadline
    /// (see [`RedisRateLimiterBuilder::timeout`]) is the shorter of that and the limiter's
    /// timeout. A manager with a shorter response timeout answers callers before the deadline
    /// that their scripts carry; give it one of at least the limiter's timeout.
    pub fn from_manager(manager: ConnectionManager) -> Self {
        Self {
            conn: Conn::Single(manager),
            response_timeout: Some(MANAGER_RESPONSE_TIMEOUT),
        }
    }

    /// Uses a cluster connection configured by hand.
    ///
    /// The limiter's timeout is taken as the deadline of each decision: give the cluster client
    /// no response timeout shorter than it.
    pub fn from_cluster(conn: ClusterConnection) -> Self {
        Self {
            conn: Conn::Cluster(conn),
            response_timeout: None,
        }
    }

    async fn run(&self, invocation: &redis::ScriptInvocation<'_>) -> redis::RedisResult<Value> {
        match &self.conn {
            Conn::Single(manager) => invocation.invoke_async(&mut manager.clone()).await,
            Conn::Cluster(conn) => invocation.invoke_async(&mut conn.clone()).await,
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.conn {
            Conn::Single(_) => "single",
            Conn::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore").field("kind", &kind).finish()
    }
}

/// Where the Redis Cluster hash tag of a limiter's keys comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HashTag {
    /// `<prefix>{<client key>}`: each client's state hashes by the client key alone, so clients
    /// spread over the cluster's slots (the default).
    #[default]
    PerKey,
    /// `<prefix>{<tag>}:<client key>`: every key of the limiter lives in the slot of `tag`.
    Fixed(String),
}

/// What a limiter decides when Redis cannot: it timed out, the connection is down, or the reply
/// was not a decision.
///
/// Every such failure is counted ([`RedisRateLimiter::failures`]) and logged whatever the policy.
#[derive(Clone)]
pub struct RedisFailMode(Policy);

type LocalLimiter = dyn Limiter<String, Future = Ready<Result<Decision, BoxError>>>;

#[derive(Clone)]
enum Policy {
    Open,
    Closed(Duration),
    Fallback(Arc<LocalLimiter>),
    Propagate,
}

impl RedisFailMode {
    /// Admits the request (the default): availability first. The decision reports the full limit
    /// minus the cost as remaining, since nothing better is known.
    pub fn open() -> Self {
        Self(Policy::Open)
    }

    /// Refuses the request, telling the client to come back after `retry_after`.
    pub fn closed(retry_after: Duration) -> Self {
        Self(Policy::Closed(retry_after))
    }

    /// Decides with a local in-memory GCRA limiter of its own `quota`, for example the global
    /// quota divided by the expected number of instances.
    pub fn fallback(quota: Quota) -> Self {
        Self::fallback_to(KeyedRateLimiter::<String>::new(quota))
    }

    /// Decides with `limiter`, keyed by the Redis key of the request (a
    /// [`KeyedRateLimiter<String, _, _>`](crate::KeyedRateLimiter) of any algorithm and clock).
    /// Its own quota applies, `max_wait` included, for every decision it takes.
    pub fn fallback_to<L>(limiter: L) -> Self
    where
        L: Limiter<String, Future = Ready<Result<Decision, BoxError>>>,
    {
        Self(Policy::Fallback(Arc::new(limiter)))
    }

    /// Hands the [`RedisFailure`] to the caller as the error of the decision.
    pub fn propagate() -> Self {
        Self(Policy::Propagate)
    }
}

impl Default for RedisFailMode {
    fn default() -> Self {
        Self::open()
    }
}

impl fmt::Debug for RedisFailMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Policy::Open => f.write_str("RedisFailMode::open()"),
            Policy::Closed(retry) => write!(f, "RedisFailMode::closed({retry:?})"),
            Policy::Fallback(limiter) => f
                .debug_tuple("RedisFailMode::fallback")
                .field(&limiter.quota())
                .finish(),
            Policy::Propagate => f.write_str("RedisFailMode::propagate()"),
        }
    }
}

/// Settings of a [`RedisRateLimiter`]; start with [`RedisRateLimiter::builder`].
pub struct RedisRateLimiterBuilder<A = Gcra, C = SystemClock> {
    quota: Quota,
    store: RedisStore,
    clock: C,
    client_time: bool,
    prefix: Option<String>,
    hash_tag: HashTag,
    timeout: Duration,
    policy: RedisFailMode,
    probe_interval: Duration,
    cache_capacity: Option<usize>,
    _algorithm: PhantomData<fn() -> A>,
}

impl<A, C> fmt::Debug for RedisRateLimiterBuilder<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiterBuilder")
            .field("quota", &self.quota)
            .field("store", &self.store)
            .field("client_time", &self.client_time)
            .field("prefix", &self.prefix)
            .field("hash_tag", &self.hash_tag)
            .field("timeout", &self.timeout)
            .field("policy", &self.policy)
            .field("probe_interval", &self.probe_interval)
            .field("cache_capacity", &self.cache_capacity)
            .finish()
    }
}

impl<A: RedisAlgorithm, C: Clock> RedisRateLimiterBuilder<A, C> {
    /// Uses algorithm `A2` instead of GCRA: [`FixedWindow`](crate::algorithm::FixedWindow),
    /// [`SlidingLog`](crate::algorithm::SlidingLog) or [`SlidingCounter`](crate::algorithm::SlidingCounter).
    pub fn algorithm<A2: RedisAlgorithm>(self) -> RedisRateLimiterBuilder<A2, C> {
        RedisRateLimiterBuilder {
            quota: self.quota,
            store: self.store,
            clock: self.clock,
            client_time: self.client_time,
            prefix: self.prefix,
            hash_tag: self.hash_tag,
            timeout: self.timeout,
            policy: self.policy,
            probe_interval: self.probe_interval,
            cache_capacity: self.cache_capacity,
            _algorithm: PhantomData,
        }
    }

    /// Reads time from `clock` on this process instead of the server's `TIME`, in nanoseconds.
    ///
    /// Meant for tests: with a [`ManualClock`](crate::clock::ManualClock) the decisions are exactly those
    /// of the in-memory limiter on the same clock. Every instance must then share the clock's
    /// origin, and the clock must stay below 2^52 ns (about 52 days). Since such a clock need not
    /// run at the server's pace, every key is kept a minute longer than the clock says.
    pub fn client_clock<C2: Clock>(self, clock: C2) -> RedisRateLimiterBuilder<A, C2> {
        RedisRateLimiterBuilder {
            quota: self.quota,
            store: self.store,
            clock,
            client_time: true,
            prefix: self.prefix,
            hash_tag: self.hash_tag,
            timeout: self.timeout,
            policy: self.policy,
            probe_interval: self.probe_interval,
            cache_capacity: self.cache_capacity,
            _algorithm: PhantomData,
        }
    }

    /// The start of every key this limiter writes (default `bulwark:<algorithm>:`). Give each
    /// limiter its own prefix: two limiters with one prefix share their state. It must not hold
    /// `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Where the Redis Cluster hash tag comes from (default [`HashTag::PerKey`]).
    pub fn hash_tag(mut self, hash_tag: HashTag) -> Self {
        self.hash_tag = hash_tag;
        self
    }

    /// The longest a decision waits for Redis before the fail mode decides (default
    /// [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What to decide when Redis cannot (default [`RedisFailMode::open`]).
    pub fn fail_mode(mut self, policy: RedisFailMode) -> Self {
        self.policy = policy;
        self
    }

    /// After a failure, how long decisions go straight to the fail mode before Redis is
    /// tried again (default [`DEFAULT_PROBE_INTERVAL`]). While Redis is down this spares every
    /// request the wait for a timeout or a reconnection; zero tries Redis on every decision.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// The most refused keys the local cache holds (default
    /// [`DEFAULT_REFUSAL_CACHE_CAPACITY`]).
    pub fn refusal_cache_capacity(mut self, capacity: usize) -> Self {
        self.cache_capacity = Some(capacity);
        self
    }

    /// Sends every request to Redis, even for a key known to be refused.
    pub fn without_refusal_cache(mut self) -> Self {
        self.cache_capacity = None;
        self
    }

    /// Builds the limiter, or says which setting cannot work.
    pub fn build(self) -> Result<RedisRateLimiter<A, C>, BuildError> {
        let kind = script::kind_of::<A>();
        let tick_nanos = if self.client_time { 1 } else { 1000 };
        let params = Params::new(kind, &self.quota, tick_nanos).map_err(BuildError::new)?;
        let prefix = self
            .prefix
            .unwrap_or_else(|| format!("bulwark:{}:", kind.name()));
        if prefix.contains(['{', '}']) {
            return Err(BuildError::new("the key prefix must not hold `{` or `}`"));
        }
        if let HashTag::Fixed(tag) = &self.hash_tag {
            if tag.is_empty() || tag.contains(['{', '}']) {
                return Err(BuildError::new(
                    "a fixed hash tag must be non-empty, without `{` or `}`",
                ));
            }
        }
        if self.timeout.is_zero() {
            return Err(BuildError::new("the timeout must be longer than zero"));
        }
        Ok(RedisRateLimiter {
            inner: Arc::new(Inner {
                store: self.store,
                setup: ArcSwap::from_pointee(Setup {
                    quota: self.quota,
                    params,
                }),
                changing: Mutex::new(()),
                clock: self.clock,
                client_time: self.client_time,
                prefix,
                hash_tag: self.hash_tag,
                timeout: self.timeout,
                policy: self.policy,
                probe_interval: u64::try_from(self.probe_interval.as_nanos()).unwrap_or(u64::MAX),
                cache: self.cache_capacity.map(RefusalCache::new),
                failures: AtomicU64::new(0),
                cached_refusals: AtomicU64::new(0),
                down: AtomicBool::new(false),
                origin: Instant::now(),
                skip_until: AtomicU64::new(0),
                offset: ClockOffset::default(),
            }),
            _algorithm: PhantomData,
        })
    }
}

/// A limiter whose state lives in Redis, shared by every instance that uses the same Redis and
/// key prefix. Cheap to clone; clones share everything.
///
/// It decides for any key that implements [`RedisKey`] (strings, numbers, IP addresses, header
/// values, `()`), through [`Limiter::reserve`] or [`check`](Self::check).
pub struct RedisRateLimiter<A = Gcra, C = SystemClock> {
    inner: Arc<Inner<C>>,
    _algorithm: PhantomData<fn() -> A>,
}

struct Inner<C> {
    store: RedisStore,
    /// The quota and the script arguments made from it, replaced as one.
    setup: ArcSwap<Setup>,
    /// Held while the quota changes, so that changes apply one after the other.
    changing: Mutex<()>,
    clock: C,
    client_time: bool,
    prefix: String,
    hash_tag: HashTag,
    timeout: Duration,
    policy: RedisFailMode,
    /// Nanoseconds after a failure during which Redis is not asked.
    probe_interval: u64,
    cache: Option<RefusalCache>,
    failures: AtomicU64,
    cached_refusals: AtomicU64,
    /// Whether the last call failed: the first failure of a streak logs a warning, the rest at
    /// debug level, and the first success after it says Redis is back.
    down: AtomicBool,
    /// The breaker's own real-time clock (Redis availability is a matter of real time, whatever
    /// clock the decisions use).
    origin: Instant,
    /// Until when (nanoseconds since `origin`) decisions skip Redis after a failure.
    skip_until: AtomicU64,
    /// The offset between `clock` and the server's `TIME`, from the replies so far.
    offset: ClockOffset,
}

/// A quota and the script arguments made from it: one decision uses one of these throughout.
#[derive(Debug)]
struct Setup {
    quota: Quota,
    params: Params,
}

impl RedisRateLimiter {
    /// A builder for a GCRA limiter of `quota` on `store`, with the server's clock.
    pub fn builder(quota: Quota, store: RedisStore) -> RedisRateLimiterBuilder {
        RedisRateLimiterBuilder {
            quota,
            store,
            clock: SystemClock::new(),
            client_time: false,
            prefix: None,
            hash_tag: HashTag::PerKey,
            timeout: DEFAULT_TIMEOUT,
            policy: RedisFailMode::default(),
            probe_interval: DEFAULT_PROBE_INTERVAL,
            cache_capacity: Some(DEFAULT_REFUSAL_CACHE_CAPACITY),
            _algorithm: PhantomData,
        }
    }
}

impl<A: RedisAlgorithm, C: Clock> RedisRateLimiter<A, C> {
    /// The quota this limiter sends with its decisions now.
    pub fn quota(&self) -> Quota {
        self.inner.setup.load().quota
    }

    /// Replaces the quota that this limiter, and every clone of it, sends to Redis, or says
    /// why the quota cannot run in the scripts (the same checks as
    /// [`build`](RedisRateLimiterBuilder::build)), changing nothing.
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
    /// forgotten; the fail mode's local limiter keeps its own quota.
    pub fn set_quota(&self, quota: Quota) -> Result<(), BuildError> {
        let _changing = self
            .inner
            .changing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let params = self.params_for(&quota)?;
        self.inner.setup.store(Arc::new(Setup { quota, params }));
        if let Some(cache) = &self.inner.cache {
            cache.clear();
        }
        Ok(())
    }

    /// The script arguments for `quota`, or why it cannot run in this limiter's scripts.
    pub(crate) fn params_for(&self, quota: &Quota) -> Result<Params, BuildError> {
        let current = self.inner.setup.load();
        Params::new(current.params.kind, quota, current.params.tick_nanos).map_err(BuildError::new)
    }

    /// How many decisions Redis did not give since the limiter was built (timeouts, errors, bad
    /// replies, and decisions taken without asking during a
    /// [`probe_interval`](RedisRateLimiterBuilder::probe_interval)); the fail mode decided
    /// each.
    pub fn failures(&self) -> u64 {
        self.inner.failures.load(Ordering::Relaxed)
    }

    /// How many refusals were answered from the local cache, without a round trip.
    pub fn cached_refusals(&self) -> u64 {
        self.inner.cached_refusals.load(Ordering::Relaxed)
    }

    /// The Redis key that holds the state of `key`.
    pub fn redis_key<K: RedisKey + ?Sized>(&self, key: &K) -> String {
        self.inner.redis_key(key)
    }

    /// Decides on one permit for `key` now, never reserving a later one.
    pub async fn check<K: RedisKey + ?Sized>(&self, key: &K) -> Result<Decision, BoxError> {
        self.check_n(key, 1).await
    }

    /// Decides on `cost` permits for `key` now, never reserving later ones.
    pub async fn check_n<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        cost: u32,
    ) -> Result<Decision, BoxError> {
        self.decide(key, cost, false).await
    }

    /// Decides on `cost` permits for `key`, waiting up to the quota's `max_wait` if `wait`,
    /// with the setup current when it is called.
    fn decide<K: RedisKey + ?Sized>(&self, key: &K, cost: u32, wait: bool) -> ReserveFuture {
        let inner = &self.inner;
        let setup = inner.setup.load_full();
        let params = &setup.params;
        if cost > params.capacity {
            let err = InsufficientCapacity::new(cost, params.capacity);
            return ReserveFuture::ready(Err(err.into()));
        }
        let max_wait = if wait { params.max_wait } else { 0 };
        let redis_key = inner.redis_key(key);
        if let Some(cache) = &inner.cache {
            let now = inner.clock.now();
            let max_wait_nanos = max_wait.saturating_mul(params.tick_nanos);
            if let Some(decision) = cache.check(&redis_key, cost, now, max_wait_nanos) {
                inner.cached_refusals.fetch_add(1, Ordering::Relaxed);
                return ReserveFuture::ready(Ok(decision.of_cost(cost)));
            }
        }
        let settle = Settle {
            inner: Arc::clone(inner) as Arc<dyn RefundLater>,
            key: redis_key.clone(),
            cost,
        };
        let inner = Arc::clone(inner);
        ReserveFuture::remote(
            async move { inner.decide(&setup, redis_key, cost, max_wait).await },
            settle,
        )
    }

    /// Gives back an admitted decision, as [`Limiter::refund`] does, and waits until Redis has
    /// applied it. A decision taken by the fail mode goes back to the local limiter.
    pub async fn refund_and_wait<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        cost: u32,
        decision: Decision,
    ) -> Result<(), BoxError> {
        let redis_key = self.inner.redis_key(key);
        let Some(decision) = self.inner.refund_at_once(&redis_key, cost, decision) else {
            return Ok(());
        };
        self.inner
            .refund_remote(&redis_key, cost, &decision)
            .await
            .map_err(BoxError::from)
    }
}

/// A fingerprint of a Redis key, which a decision carries so that a refund under another key
/// gives nothing back. Stable across limiters and processes (SipHash with fixed keys), so a
/// decision of one limiter can be given back through a clone or another limiter on the same
/// Redis keys.
fn fingerprint(redis_key: &str) -> u64 {
    use std::hash::BuildHasher;
    std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
        .hash_one(redis_key)
}

/// Makes `out[start..]`, a client key written between the braces of a hash tag, safe to stand
/// there: Redis Cluster ends the tag at the first `}`, so a key holding one would choose its own
/// slot (and could pile onto another client's). `}` becomes `%7D` and `%` becomes `%25`, which
/// keeps different client keys different; keys holding neither are written as they are.
fn escape_hash_tag(out: &mut String, start: usize) {
    if !out[start..].contains(['}', '%']) {
        return;
    }
    let key = out.split_off(start);
    for c in key.chars() {
        match c {
            '}' => out.push_str("%7D"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
}

impl<C: Clock> Inner<C> {
    fn redis_key<K: RedisKey + ?Sized>(&self, key: &K) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 24);
        out.push_str(&self.prefix);
        out.push('{');
        match &self.hash_tag {
            HashTag::PerKey => {
                let start = out.len();
                key.write_redis_key(&mut out);
                escape_hash_tag(&mut out, start);
            }
            HashTag::Fixed(tag) => {
                out.push_str(tag);
                out.push_str("}:");
                key.write_redis_key(&mut out);
                return out;
            }
        }
        out.push('}');
        out
    }

    /// The `now` argument of a script: empty for the server's TIME.
    fn now_arg(&self) -> Result<String, RedisFailure> {
        if !self.client_time {
            return Ok(String::new());
        }
        let now = self.clock.now();
        if now > script::MAX_NOW {
            return Err(RedisFailure::clock_out_of_range(now));
        }
        Ok(now.to_string())
    }

    fn elapsed(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// One script call, bounded by the timeout. A decision (`op` "d") carries a deadline in the
    /// server's time; the refund (`op` "r") carries none (see [`Inner::refund_remote`]), and
    /// `after`: the state its admission left, after the algorithm's own arguments.
    async fn call(
        &self,
        params: &Params,
        key: &str,
        op: &str,
        cost: u32,
        arg5: u64,
        after: Option<(u64, bool)>,
    ) -> Result<Reply, RedisFailure> {
        if self.elapsed() < self.skip_until.load(Ordering::Relaxed) {
            return Err(RedisFailure::skipped());
        }
        // The caller is answered when the limiter's timeout or the connection's runs out.
        let bound = match self.store.response_timeout {
            Some(response) => self.timeout.min(response),
            None => self.timeout,
        };
        let bound = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
        let local_deadline = self.clock.now().saturating_add(bound);
        let attempts = async {
            // A first "late" answer may come from a probe (no offset known yet) or from an offset
            // that the clocks have left behind; either way the reply corrected the offset, so
            // the request goes once more with a deadline that now means something.
            let mut retried = false;
            loop {
                let deadline = match op {
                    "d" => match self.offset.server_deadline(local_deadline) {
                        Some(deadline) => deadline.to_string(),
                        // No offset known yet: a deadline already past, answered at once with
                        // the server's time and nothing else (see `offset`).
                        None => "0".to_owned(),
                    },
                    _ => String::new(),
                };
                let now = self.now_arg()?;
                let mut invocation = params.kind.script().prepare_invoke();
                invocation
                    .key(key)
                    .arg(op)
                    .arg(now)
                    .arg(params.ticks_per_ms())
                    .arg(cost)
                    .arg(arg5)
                    .arg(params.ttl_margin_ms)
                    .arg(deadline);
                for arg in &params.args {
                    invocation.arg(arg.as_str());
                }
                if let Some((left, reserved)) = after {
                    invocation.arg(left).arg(u8::from(reserved));
                }
                let sent = self.clock.now();
                let value = self
                    .store
                    .run(&invocation)
                    .await
                    .map_err(RedisFailure::redis)?;
                let received = self.clock.now();
                let reply = script::parse_reply(&value, params)?;
                self.offset.observe(sent, received, reply.server_time());
                match (&reply, op) {
                    (Reply::Late(_), "d") if !retried => retried = true,
                    (Reply::Late(_), "d") => return Err(RedisFailure::late()),
                    (Reply::Decision(..), "d") | (Reply::Refunded(_), "r") => return Ok(reply),
                    _ => {
                        return Err(RedisFailure::bad_reply(format!(
                            "{reply:?} is not an answer to operation {op:?}"
                        )))
                    }
                }
            }
        };
        match tokio::time::timeout(self.timeout, attempts).await {
            Ok(result) => result,
            Err(_) => Err(RedisFailure::timeout(self.timeout)),
        }
    }

    async fn decide(
        &self,
        setup: &Setup,
        key: String,
        cost: u32,
        max_wait: u64,
    ) -> Result<Decision, BoxError> {
        let params = &setup.params;
        match self.call(params, &key, "d", cost, max_wait, None).await {
            Ok(Reply::Decision(decision, _)) => {
                self.recovered();
                if !decision.allowed {
                    if let Some(cache) = &self.cache {
                        cache.insert(&key, cost, self.clock.now(), &decision);
                    }
                }
                Ok(decision
                    .of_cost(cost)
                    .for_key(fingerprint(&key))
                    .made_by(crate::decision::LimiterId::REDIS))
            }
            Ok(other) => {
                let failure = RedisFailure::bad_reply(format!("{other:?} is not a decision"));
                self.fail_mode(params, key, cost, failure)
            }
            Err(failure) => self.fail_mode(params, key, cost, failure),
        }
    }

    fn recovered(&self) {
        if self.down.swap(false, Ordering::Relaxed) {
            self.skip_until.store(0, Ordering::Relaxed);
            tracing::info!(
                target: "tower_bulwark::redis",
                algorithm = self.setup.load().params.kind.name(),
                "redis answers again; decisions come from redis",
            );
        }
    }

    fn failed(&self, key: &str, failure: &RedisFailure) {
        let count = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failure.is_unavailable() {
            let until = self.elapsed().saturating_add(self.probe_interval);
            self.skip_until.fetch_max(until, Ordering::Relaxed);
        }
        if self.down.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                target: "tower_bulwark::redis",
                key, failures = count, error = %failure,
                "redis decision failed; the fail mode decides",
            );
        } else {
            tracing::warn!(
                target: "tower_bulwark::redis",
                key, failures = count, error = %failure, policy = ?self.policy,
                "redis decision failed; the fail mode decides until redis answers again",
            );
        }
    }

    fn fail_mode(
        &self,
        params: &Params,
        key: String,
        cost: u32,
        failure: RedisFailure,
    ) -> Result<Decision, BoxError> {
        self.failed(&key, &failure);
        let limit = params.limit;
        let mut decision = match &self.policy.0 {
            Policy::Open => {
                Decision::allowed(limit, limit.saturating_sub(u64::from(cost)), Duration::ZERO)
            }
            Policy::Closed(retry_after) => Decision::refused(limit, 0, *retry_after, *retry_after),
            Policy::Fallback(local) => local.reserve(&key, cost).into_inner()?,
            Policy::Propagate => return Err(failure.into()),
        };
        decision.source = Source::RedisFailMode;
        Ok(decision.of_cost(cost))
    }

    /// The part of giving `decision` back that is done at once: a cached refusal of `key` is
    /// forgotten (its permits came back), and a fail mode's decision goes back to the local
    /// limiter. Returns whether Redis must still be told ([`refund_remote`](Self::refund_remote)).
    /// Returns the decision if Redis must still be told ([`refund_remote`](Self::refund_remote));
    /// a decision that Redis made for another key gives nothing back.
    fn refund_at_once(&self, key: &str, cost: u32, decision: Decision) -> Option<Decision> {
        if !decision.allowed {
            return None;
        }
        if decision.source == Source::RedisFailMode {
            if let Some(cache) = &self.cache {
                cache.forget(key);
            }
            self.refund_locally(key.to_owned(), cost, decision);
            return None;
        }
        if !decision.is_from(crate::decision::LimiterId::REDIS, fingerprint(key)) {
            return None;
        }
        if let Some(cache) = &self.cache {
            cache.forget(key);
        }
        Some(decision)
    }

    fn refund_locally(&self, key: String, cost: u32, decision: Decision) {
        if let Policy::Fallback(local) = &self.policy.0 {
            let mut local_decision = decision;
            local_decision.source = Source::State;
            local.refund(&key, cost, local_decision);
        }
    }

    /// Gives the `cost` permits of `decision` back to Redis: the script is told the instant they
    /// were charged at and the state the admission left (GCRA gives back only while the key's
    /// TAT is still that one).
    ///
    /// A refund carries no deadline: it only restores what one admission took (the scripts take
    /// off that admission's permits, from wherever they still count), so applying it late is as
    /// right as applying it at once, and dropping it would leave a refused request's permits
    /// spent. It is sent exactly once per decision (nothing retries it), so a late one cannot be
    /// applied twice.
    async fn refund_remote(
        &self,
        key: &str,
        cost: u32,
        decision: &Decision,
    ) -> Result<(), RedisFailure> {
        let (charged, left) = (decision.reserved_at, decision.state_after);
        let reserved = !decision.wait.is_zero();
        let cost = decision.refundable(cost);
        // Given back with the current quota's arguments, as the in-memory limiters give back
        // with the current algorithm.
        let setup = self.setup.load_full();
        match self
            .call(
                &setup.params,
                key,
                "r",
                cost,
                charged,
                Some((left, reserved)),
            )
            .await
        {
            Ok(_) => {
                self.recovered();
                Ok(())
            }
            Err(failure) => {
                self.failed(key, &failure);
                Err(failure)
            }
        }
    }
}

impl<A, C> Clone for RedisRateLimiter<A, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            _algorithm: PhantomData,
        }
    }
}

impl<A: RedisAlgorithm, C> fmt::Debug for RedisRateLimiter<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("RedisRateLimiter")
            .field("algorithm", &inner.setup.load().params.kind.name())
            .field("quota", &inner.setup.load().quota)
            .field("store", &inner.store)
            .field("client_time", &inner.client_time)
            .field("prefix", &inner.prefix)
            .field("hash_tag", &inner.hash_tag)
            .field("timeout", &inner.timeout)
            .field("policy", &inner.policy)
            .field(
                "probe_interval",
                &Duration::from_nanos(inner.probe_interval),
            )
            .field("refusal_cache", &inner.cache.is_some())
            .field("failures", &inner.failures.load(Ordering::Relaxed))
            .finish()
    }
}

impl<K, A, C> Limiter<K> for RedisRateLimiter<A, C>
where
    K: RedisKey,
    A: RedisAlgorithm,
    C: Clock,
{
    type Future = ReserveFuture;

    fn quota(&self) -> Quota {
        RedisRateLimiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        Ok(RedisRateLimiter::set_quota(self, quota)?)
    }

    fn reserve(&self, key: &K, cost: u32) -> ReserveFuture {
        self.decide(key, cost, true)
    }

    fn refund(&self, key: &K, cost: u32, decision: Decision) {
        let redis_key = self.inner.redis_key(key);
        let Some(decision) = self.inner.refund_at_once(&redis_key, cost, decision) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let inner = Arc::clone(&self.inner);
                // Failures are counted and logged inside; nothing waits for the outcome.
                runtime.spawn(async move {
                    let _ = inner.refund_remote(&redis_key, cost, &decision).await;
                });
            }
            Err(_) => tracing::warn!(
                target: "tower_bulwark::redis",
                key = redis_key,
                "refund outside a tokio runtime; nothing is given back",
            ),
        }
    }
}

/// The future of a [`RedisRateLimiter`] decision: ready at once for a cached refusal, otherwise
/// one script call bounded by the limiter's timeout.
///
/// Dropped once its script may have been sent (it was polled and has not finished), it does not
/// take the decision with it: a task on the runtime waits for the answer and gives back what it
/// admitted, so a caller that goes away at any await point (a client that hangs up, a timeout
/// layer above) spends nothing.
pub struct ReserveFuture {
    state: State,
}

type Remote = Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send + 'static>>;

enum State {
    Ready(Option<Result<Decision, BoxError>>),
    Remote {
        future: Remote,
        settle: Settle,
        polled: bool,
    },
    Done,
}

/// What an abandoned decision needs to give its permits back.
struct Settle {
    inner: Arc<dyn RefundLater>,
    key: String,
    cost: u32,
}

/// Giving a decision back, as [`RedisRateLimiter::refund_and_wait`] does, without the clock's type,
/// so that [`ReserveFuture`] stays one type.
trait RefundLater: Send + Sync + 'static {
    fn refund_later(self: Arc<Self>, key: String, cost: u32, decision: Decision) -> Remote;
}

impl<C: Clock> RefundLater for Inner<C> {
    fn refund_later(self: Arc<Self>, key: String, cost: u32, decision: Decision) -> Remote {
        Box::pin(async move {
            let report = decision.report();
            if let Some(decision) = self.refund_at_once(&key, cost, decision) {
                // Failures are counted and logged inside.
                let _ = self.refund_remote(&key, cost, &decision).await;
            }
            Ok(report)
        })
    }
}

impl ReserveFuture {
    fn ready(result: Result<Decision, BoxError>) -> Self {
        Self {
            state: State::Ready(Some(result)),
        }
    }

    fn remote(
        future: impl Future<Output = Result<Decision, BoxError>> + Send + 'static,
        settle: Settle,
    ) -> Self {
        Self {
            state: State::Remote {
                future: Box::pin(future),
                settle,
                polled: false,
            },
        }
    }
}

impl Future for ReserveFuture {
    type Output = Result<Decision, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            State::Ready(result) => Poll::Ready(
                result
                    .take()
                    .expect("ReserveFuture polled after it completed"),
            ),
            State::Remote { future, polled, .. } => {
                *polled = true;
                let result = std::task::ready!(future.as_mut().poll(cx));
                self.state = State::Done;
                Poll::Ready(result)
            }
            State::Done => panic!("ReserveFuture polled after it completed"),
        }
    }
}

impl Drop for ReserveFuture {
    fn drop(&mut self) {
        let State::Remote {
            future,
            settle,
            polled: true,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            // Never polled: nothing was sent. Finished: the caller has the decision.
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                target: "tower_bulwark::redis",
                key = settle.key,
                "a decision abandoned outside a tokio runtime; what it admits is not given back",
            );
            return;
        };
        let Settle { inner, key, cost } = settle;
        runtime.spawn(async move {
            if let Ok(decision) = future.await {
                let _ = inner.refund_later(key, cost, decision).await;
            }
        });
    }
}

impl fmt::Debug for ReserveFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Ready(_) => "ready",
            State::Remote { .. } => "remote",
            State::Done => "done",
        };
        f.debug_struct("ReserveFuture")
            .field("state", &state)
            .finish()
    }
}
