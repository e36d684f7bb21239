//! The settings of a [`RedisRateLimiter`] and their checks.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::cache::RefusalCache;
use super::fail_mode::Breaker;
use super::hold::Holds;
use super::key::KeyLayout;
use super::limiter::Inner;
use super::offset::ClockOffset;
use super::script::{LimiterScript, ScriptQuota, DEFAULT_HOLD_FOR};
use super::{
    BuildError, HashTag, Lease, RedisAlgorithm, RedisFailMode, RedisRateLimiter, RedisStore,
};
use crate::clock::{Clock, SystemClock};
use crate::Quota;

/// Settings of a [`RedisRateLimiter`]; start with [`RedisRateLimiter::builder`]. A
/// [`Policy::concurrent_in_redis`](crate::rate_limit::Policy::concurrent_in_redis) takes them
/// too, and builds the limiter of its slots with them.
///
/// Until told otherwise it runs GCRA on the server's clock under the prefix
/// `bulwark:<algorithm>:` with a hash tag per key, waits 100 ms for each decision, decides with a
/// local limiter of its own quota when Redis cannot ([`RedisFailMode::Local`]), skips Redis for
/// 250 ms after a failure to
/// reach it, and caches up to 100 000 refused keys.
pub struct RedisRateLimiterBuilder {
    settings: Settings,
    /// The client clock the scripts read, if they do not read the server's `TIME`.
    client_clock: Option<Arc<dyn Clock>>,
}

/// The settings that print (a clock does not).
#[derive(Debug)]
struct Settings {
    quota: Quota,
    store: RedisStore,
    script: LimiterScript,
    hold_for: Duration,
    prefix: Option<String>,
    hash_tag: HashTag,
    timeout: Duration,
    fail_mode: RedisFailMode,
    probe_interval: Duration,
    cache_capacity: usize,
    lease: Option<Lease>,
}

impl fmt::Debug for RedisRateLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisRateLimiterBuilder")
            .field(&self.settings)
            .field(&self.client_clock.is_some())
            .finish()
    }
}

impl RedisRateLimiterBuilder {
    pub(crate) fn new(quota: Quota, store: RedisStore) -> Self {
        Self {
            settings: Settings {
                quota,
                store,
                script: LimiterScript::Gcra,
                hold_for: DEFAULT_HOLD_FOR,
                prefix: None,
                hash_tag: HashTag::PerKey,
                timeout: DEFAULT_TIMEOUT,
                fail_mode: RedisFailMode::default(),
                probe_interval: Duration::from_millis(250),
                cache_capacity: 100_000,
                lease: None,
            },
            client_clock: None,
        }
    }

    /// Uses algorithm `A` instead of GCRA: [`FixedWindow`](crate::algorithm::FixedWindow),
    /// [`SlidingLog`](crate::algorithm::SlidingLog), [`SlidingCounter`](crate::algorithm::SlidingCounter)
    /// or [`Metered`](crate::algorithm::Metered).
    pub fn algorithm<A: RedisAlgorithm>(mut self) -> Self {
        self.settings.script = A::SCRIPT;
        self
    }

    /// For the algorithms whose admissions hold what they took until they are given back
    /// ([`Metered`](crate::algorithm::Metered)'s estimates, and the slots of a
    /// [`Policy::concurrent_in_redis`](crate::rate_limit::Policy::concurrent_in_redis); the
    /// other algorithms hold nothing): how long a hold lasts unless its instance renews it
    /// (default 30 s), between a second and a day.
    ///
    /// Every admission holds what it took in Redis, under an id of its own, until it is
    /// settled or given back, which the crate's layers see to whatever ends the request. While
    /// the request lives, its instance renews the hold: all of the instance's live holds in one
    /// call every third of this bound (one per hash slot in a Redis Cluster; a call carries at
    /// most 3 000 arguments, so thousands of requests in flight take a few). So a request of
    /// any length keeps its hold while its instance reaches Redis; it loses it only if every
    /// renewal fails for about two thirds of the bound. (An admission made through the
    /// [`Limiter`](crate::Limiter) methods directly and never settled nor given back is
    /// renewed as long as its limiter lives.) A hold no live instance renews (its
    /// instance died, its give-back never reached Redis, or the decision's reply came after
    /// the limiter's timeout) ends this long after its last renewal: a concurrent policy's
    /// slot frees; a metered estimate is charged whole as of its admission, then dropped (the
    /// estimate stands, never more generous than the settle would have been; the settle, if
    /// it comes, gives nothing back and still charges what it cost beyond its estimate). A
    /// metered key keeps at most 256 holds: a decision that finds them all taken is refused
    /// (nothing left, `retry_after` a second at least) until one settles or expires.
    ///
    /// Limiters that hold refuse [leases](Self::lease): an admission from a share would hold
    /// nothing in Redis.
    pub fn hold_for(mut self, hold_for: Duration) -> Self {
        self.settings.hold_for = hold_for;
        self
    }

    /// Reads time from `clock` on this process instead of the server's `TIME`, in nanoseconds.
    ///
    /// Meant for tests: with a [`ManualClock`](crate::clock::ManualClock) the decisions are
    /// exactly those of the in-memory limiter on the same clock. Every instance must then share
    /// the clock's origin, and the clock must stay below 2^52 ns (about 52 days). Since such a
    /// clock need not run at the server's pace, every key is kept a minute longer than the clock
    /// says.
    pub fn client_clock(mut self, clock: impl Clock) -> Self {
        self.client_clock = Some(Arc::new(clock));
        self
    }

    /// The start of every key this limiter writes (default `bulwark:<algorithm>:`). Give each
    /// limiter its own prefix: two limiters with one prefix share their state. It must not hold
    /// `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = Some(prefix.into());
        self
    }

    /// Where the Redis Cluster hash tag comes from (default [`HashTag::PerKey`]).
    pub fn hash_tag(mut self, hash_tag: HashTag) -> Self {
        self.settings.hash_tag = hash_tag;
        self
    }

    /// The longest a decision waits for Redis before the fail mode decides (default 100 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// What to decide when Redis cannot (default [`RedisFailMode::Local`]).
    pub fn fail_mode(mut self, fail_mode: RedisFailMode) -> Self {
        self.settings.fail_mode = fail_mode;
        self
    }

    /// After a failure, how long decisions go straight to the fail mode before Redis is
    /// tried again (default 250 ms). While Redis is down this spares every
    /// request the wait for a timeout or a reconnection; zero tries Redis on every decision.
    /// Give-backs (refunds, settles) are sent all the same, each within the timeout: what Redis
    /// took before the failure has no other way back.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.settings.probe_interval = interval;
        self
    }

    /// Leases the keys' permits in shares (GCRA, the fixed window and the sliding counter): an
    /// instance takes a share of a key's burst in one script call and admits from it without a round trip until
    /// it is spent or its [`length`](Lease::length) is up, so a key with a large quota is not
    /// bound by one Redis core and its admitted requests do not wait for the network.
    ///
    /// Exact across instances. With GCRA, Redis counts a lease's permits as taken at every
    /// instant until it comes back or ends, and never leases more than the burst; with the
    /// window algorithms, a share is of what the current window can still admit, counted at
    /// once, and is admitted from only until the window ends (a permit spent later in a sliding
    /// counter's window weighs no less than an admission then). Either way, what every
    /// instance admits together keeps to the quota.
    ///
    /// What it changes:
    ///
    /// * A share follows the instance's demand, up to [`max_share`](Lease::max_share) (a quarter
    ///   of the burst by default): it doubles while spent before its end and halves when it
    ///   ends mostly unused. With GCRA, a share of which less than half can be had now (the
    ///   instances together want more than the quota) is leased whole, starting later, within a
    ///   lease's length: the instance refuses until then, the wait as `retry_after`, and asks
    ///   Redis nothing more (counted in `refused_before_lease` of [`RedisRateLimiter::counts`]). So
    ///   the script calls a second follow the shares, not the rate: about 5 per instance at
    ///   quotas from 5 000 to 500 000 a second (`benches/leases.rs`).
    /// * An admission's `remaining` is what is left of the instance's share (what it can admit
    ///   without asking), not what Redis has left for all of them.
    /// * A refund goes back to the share it came from while that lease lasts; after, the
    ///   permits stay spent. A settle's debt is taken from the share as far as it holds, and
    ///   the rest charged in Redis.
    /// * **A limit:** a debt charged in Redis (a settle to more than the estimate, beyond what
    ///   the settling instance's share holds) does not stop the shares other instances already
    ///   hold; until their leases end, they may admit up to what they hold beyond the quota in
    ///   the debt's window (at most `max_share` each). Settles to less are exact. For costs
    ///   often settled above their estimate (tokens of an LLM API), estimate high, or do not
    ///   lease.
    /// * A call that may wait (a quota's `max_wait`) and finds no share is decided in Redis; a
    ///   reservation then falls due only after every lease out has ended, since their permits
    ///   may be spent until then.
    /// * What a share holds unused goes back when its lease is over (or with the next lease,
    ///   or before the debt of a settle that comes after the lease is over, which it would
    ///   otherwise stand behind);
    ///   an instance that dies holding one leaves its permits unused until twice the lease's
    ///   length has passed (the quota is under-used, never over-used).
    /// * A share granted under another quota than the one in force (a
    ///   [`set_quota`](super::RedisRateLimiter::set_quota) since) is not admitted from: the
    ///   next call gives its unused permits back and leases under the new quota (spent later,
    ///   they could land in a window of the new period that does not count them: 12 in a
    ///   window of 10 per 500 ms, found by attack). Other instances' shares last until they
    ///   change their quota too.
    /// * **A limit:** with GCRA, a share given back after a `set_quota` that lengthened the
    ///   interval gives its unused permits back at the new interval. While it was out, the key
    ///   counted its permits at the interval of each write (the old one when it was granted,
    ///   the new one after the change), and which of them the key's state holds cannot be told
    ///   apart: admissions made beside the share before the change may be forgotten, at most
    ///   the unused permits times the lengthening (one admission more than in memory after a
    ///   change from 100 to 10 a second, found by attack). Giving them back at the old interval
    ///   instead would under-admit by up to the share whenever the key was written under the
    ///   new quota before the share ended.
    /// * At most 64 leases of one key are out at once; an instance is refused until one comes
    ///   back.
    /// * Calls on one key that find no share wait for one lease call of this instance, then
    ///   admit from what it brought.
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) refuses leases with the sliding log (it counts each permit at
    /// the instant it was admitted, and a share is spent over a lease's length: exact only if
    /// each permit were counted over that length too) and with `Metered` (an admission from a
    /// share would hold no estimate in Redis), a share of 0 or above the burst, or a length of
    /// zero or too long for the scripts' arithmetic.
    pub fn lease(mut self, lease: Lease) -> Self {
        self.settings.lease = Some(lease);
        self
    }

    /// The most refused keys the local cache holds (default 100 000); zero turns the cache off,
    /// so that every request goes to Redis, even for a key known to be refused.
    pub fn refusal_cache_capacity(mut self, capacity: usize) -> Self {
        self.settings.cache_capacity = capacity;
        self
    }

    /// The limiter of a concurrent policy's slots: at most `in_flight` requests of a key at
    /// once ([`Concurrency`](crate::algorithm::Concurrency)), whatever quota this builder was
    /// given, and no cache of refusals (a refusal's second is no time at which a slot frees).
    pub(crate) fn concurrent(mut self, in_flight: u32) -> Result<RedisRateLimiter, BuildError> {
        self.settings.quota = Quota::per_second(in_flight)
            .map_err(|_| BuildError::new("a concurrent policy needs at least one slot"))?;
        self.settings.script = LimiterScript::Concurrency;
        self.settings.cache_capacity = 0;
        self.build()
    }

    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the setting that cannot work: a quota whose arithmetic would
    /// leave Lua's exact integers (see the module's limits), a prefix or fixed hash tag holding
    /// a brace, a zero timeout, a [`hold_for`](Self::hold_for) under a second or over a day,
    /// or [leases](Self::lease) that cannot be exact.
    pub fn build(self) -> Result<RedisRateLimiter, BuildError> {
        let settings = self.settings;
        let script = settings.script;
        if !(Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&settings.hold_for) {
            return Err(BuildError::at(
                "hold_for",
                "hold_for must be between a second and a day",
            ));
        }
        let quota = ScriptQuota::new(script, settings.quota, self.client_clock.is_some())?
            .holding_for(settings.hold_for);
        let prefix = (settings.prefix).unwrap_or_else(|| default_prefix(script.name()));
        let keys = KeyLayout::new(prefix, settings.hash_tag)?;
        if settings.timeout.is_zero() {
            return Err(BuildError::at(
                "timeout",
                "the timeout must be longer than zero",
            ));
        }
        let leases = settings
            .lease
            .map(|lease| lease.leases(&quota))
            .transpose()?;
        let clock = self
            .client_clock
            .unwrap_or_else(|| Arc::new(SystemClock::new()));
        let (fail_mode, local) = settings.fail_mode.resolved(settings.quota, &clock, script);
        Ok(RedisRateLimiter {
            inner: Arc::new_cyclic(|inner| Inner {
                store: settings.store,
                quota: ArcSwap::from_pointee(quota),
                clock,
                keys,
                timeout: settings.timeout,
                fail_mode,
                local,
                breaker: Breaker::new(settings.probe_interval),
                cache: (settings.cache_capacity > 0)
                    .then(|| RefusalCache::new(settings.cache_capacity)),
                cached_refusals: AtomicU64::new(0),
                leases,
                offset: ClockOffset::default(),
                coalescer: Arc::default(),
                holds: Holds::new(inner.clone(), settings.hold_for),
            }),
        })
    }
}

/// How long a decision waits for Redis where the builder names no timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// The key prefix of a limiter of `algorithm` (a script's name) that names none.
pub(crate) fn default_prefix(algorithm: &str) -> String {
    format!("bulwark:{algorithm}:")
}
