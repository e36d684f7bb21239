//! Named instances from a TOML file.
//!
//! Operators configure each rate limiter and bulkhead by name:
//!
//! ```toml
//! [rate_limiters.api]
//! limit_for_period = 10
//! limit_refresh_period = "1s"
//! max_wait = "0s"
//! algorithm = "gcra"          # gcra | fixed_window | sliding_log | sliding_counter
//! key = "peer_ip"             # peer_ip | forwarded_ip | header:x-api-key | global
//!
//! [bulkheads.payment]
//! max_concurrent_calls = 2
//! max_wait = "0s"
//!
//! [bulkheads.inventory]
//! max_concurrent_calls = 8
//! queue_capacity = 16
//! ```
//!
//! Behind a load balancer every connection comes from the balancer, so `peer_ip` would give
//! every client one budget; `forwarded_ip` keys by the client address the balancer forwards:
//!
//! ```toml
//! [rate_limiters.api]
//! limit_for_period = 10
//! limit_refresh_period = "1s"
//! key = "forwarded_ip"
//! trusted_proxies = ["10.0.0.0/8"]    # the balancers; required
//! forwarded_header = "forwarded"      # x-forwarded-for (the default) | forwarded
//! ```
//!
//! Nothing is guessed. A duration must carry its unit (`500ms`, `1s`, `2m`, `1h`, or several
//! together such as `1m30s`): `limit_refresh_period = 500` is an error, because one library reads
//! a bare 500 as nanoseconds and another as milliseconds. Unknown fields, zero limits and values
//! out of range are errors that name the instance and the field, with its line and column
//! ([`ConfigError`]).
//!
//! Fields of a rate limiter:
//!
//! | field | type | default |
//! |---|---|---|
//! | `limit_for_period` | integer ≥ 1 | required |
//! | `limit_refresh_period` | duration > 0 | required |
//! | `burst` | integer ≥ 1 | `limit_for_period` |
//! | `max_wait` | duration | `"0s"` (refuse at once) |
//! | `algorithm` | `gcra`, `fixed_window`, `sliding_log`, `sliding_counter` | `gcra` |
//! | `key` | `peer_ip` (the TCP peer), `forwarded_ip` (the client behind trusted proxies), `header:<name>` (values up to 256 bytes), `global` | `peer_ip` |
//! | `trusted_proxies` | with `key = "forwarded_ip"`, required: the proxies (list of CIDRs) whose forwarding header is believed; a request from any other peer is keyed by the peer, whatever it wrote (see [`ForwardedIp`](crate::rate_limit::ForwardedIp); an unreadable hop is a `400`) | none |
//! | `forwarded_header` | with `key = "forwarded_ip"`: `x-forwarded-for`, or `forwarded` (RFC 7239) | `x-forwarded-for` |
//! | `max_keys` | integer ≥ 1 | 1 000 000 |
//! | `hide_keys` | boolean: keep client keys out of log events | `false` |
//! | `store` | `memory`, or `redis` (feature `redis`) for one quota across every instance | `memory` |
//! | `redis_url` | `redis://host:port` | required with `store = "redis"` |
//! | `redis_prefix` | key prefix | `bulwark:<algorithm>:` |
//! | `redis_timeout` | duration: how long a decision may wait for Redis | the store's default |
//! | `redis_fail_mode` | `open` (admit), `closed` (refuse), or `fallback` (decide with a local limiter) while Redis cannot answer | `open` |
//! | `fallback_limit_for_period` | integer ≥ 1: the local limiter's permits per period, with `fallback` | required with `fallback` |
//!
//! Fields of a bulkhead:
//!
//! | field | type | default |
//! |---|---|---|
//! | `max_concurrent_calls` | integer ≥ 1 | required |
//! | `max_wait` | duration | semaphore: `"0s"` (refuse at once); queue: no bound |
//! | `queue_capacity` | integer ≥ 1: a queue bulkhead | none: a semaphore bulkhead |
//!
//! A route puts several rate limiters on one layer ([`Registry::route_layer`]), each with its
//! own key, a cost on this route and an optional shadow mode; requests from `exempt_networks`
//! (the TCP peer) skip them all:
//!
//! ```toml
//! [routes.search]
//! policies = [
//!     "per-ip",                                     # cost 1, enforced
//!     { limiter = "per-key", cost = 5 },            # a search costs 5 of the key's quota
//!     { limiter = "next-quota", shadow = true },    # watched, never refuses
//! ]
//! exempt_networks = ["10.0.0.0/8"]
//! ```
//!
//! | field of a route | type | default |
//! |---|---|---|
//! | `policies` | list of rate limiter names, or tables `{ limiter, cost, shadow }`: `cost` an integer ≥ 1 (default 1), `shadow` `true` (never refuses, not in the headers), `"advertised"` (never refuses, in the headers) or `false` | required |
//! | `exempt_networks` | list of CIDRs (feature `axum`) | none |
//!
//! Outbound calls to a dependency have two more kinds: a pushback, which holds calls back as
//! the dependency's `Retry-After` and rate-limit fields ask ([`Registry::pushback_layer`]), and
//! a client quota, which applies one of the rate limiters above to the calls
//! ([`Registry::client_quota_layer`]; see [`outbound`](crate::outbound)):
//!
//! ```toml
//! [rate_limiters.partner]         # 5 000 calls per hour, shared by every instance with Redis
//! limit_for_period = 5000
//! limit_refresh_period = "1h"
//! max_wait = "1s"
//! key = "global"                  # a client quota counts every call under one key
//!
//! [pushbacks.partner]
//! max_wait = "2s"
//! max_hold = "5m"
//! pacing = "spread"               # until_spent | spread
//!
//! [client_quotas.partner]
//! limiter = "partner"             # a name under rate_limiters
//! cost = 1
//! ```
//!
//! | field of a pushback | type | default |
//! |---|---|---|
//! | `max_wait` | duration ≤ 2^60 ns: how long a held call may wait for the hold to end before it is sent | `"0s"` (refuse at once) |
//! | `max_hold` | duration > 0 and ≤ 2^60 ns: the longest hold any response can impose | `"10m"` |
//! | `pacing` | `until_spent` (calls go while the advertised quota lasts) or `spread` (the calls left spread evenly over the window) | `until_spent` |
//!
//! | field of a client quota | type | default |
//! |---|---|---|
//! | `limiter` | the name of a rate limiter under `rate_limiters`, with `key = "global"`; its quota (and `max_wait`, and store: memory or Redis) is the client quota's | required |
//! | `cost` | integer ≥ 1, at most the limiter's `burst`: the permits each call takes | 1 |
//!
//! With the `adaptive` feature, a bulkhead whose limit follows the dependency
//! ([`Registry::adaptive_bulkhead_layer`]; see `bulkhead::adaptive`):
//!
//! ```toml
//! [adaptive_bulkheads.payment]
//! min_limit = 2
//! initial_limit = 8
//! max_limit = 64
//! algorithm = "aimd"              # aimd | gradient
//! ```
//!
//! | field of an adaptive bulkhead | type | default |
//! |---|---|---|
//! | `min_limit` | integer ≥ 1 | 1 |
//! | `initial_limit` | integer from `min_limit` to `max_limit` | 8 (within the bounds) |
//! | `max_limit` | integer ≥ `min_limit`, at most 2^31 − 1 | 256 |
//! | `algorithm` | `aimd` (additive increase, multiplicative decrease) or `gradient` (delay-based) | `aimd` |
//! | `ignore_cancelled_calls` | boolean: a call dropped before it ended is no sample (by default it is an overload signal) | `false` |
//!
//! A running [`Registry`] reloads its file with [`Registry::reload_path`]: changed quotas and
//! bulkhead sizes apply in place, under the layers already built, and every key keeps its state
//! (a client quota's limiter included); a change that cannot apply in place (any setting of a
//! pushback, of a client quota or of an adaptive bulkhead, whose limit moves by itself), or a
//! bad file, is refused and changes nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::outbound::pushback::{Pacing, DEFAULT_MAX_HOLD};
use crate::rate_limit::Cidr;
use crate::Quota;

mod duration;
mod error;
mod fields;
mod file;
mod health;
mod registry;
mod reload;

pub use duration::parse_duration;
pub use error::ConfigError;
pub use health::{BulkheadHealth, Health, LimiterHealth, PushbackHealth};
pub use registry::{
    ConfigKey, ConfigKeyExtractor, ConfiguredClientQuotaLayer, ConfiguredLimiter, ConfiguredPolicy,
    ConfiguredRateLimitLayer, GlobalConfigKey, Registry, UnknownInstance,
};
pub use reload::Reloaded;

/// Which algorithm a configured rate limiter uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AlgorithmKind {
    /// [`Gcra`](crate::algorithm::Gcra), the default.
    #[default]
    Gcra,
    /// [`FixedWindow`](crate::algorithm::FixedWindow).
    FixedWindow,
    /// [`SlidingLog`](crate::algorithm::SlidingLog).
    SlidingLog,
    /// [`SlidingCounter`](crate::algorithm::SlidingCounter).
    SlidingCounter,
}

/// How a configured rate limiter finds the key of a request.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyKind {
    /// The peer's IP address (IPv6 by /64), the default.
    #[default]
    PeerIp,
    /// The client's IP address (IPv6 by /64) as the trusted proxies forward it, read as
    /// [`ForwardedIp`](crate::rate_limit::ForwardedIp) reads it: a request from a peer outside
    /// `trusted_proxies` is keyed by that peer, whatever its header says.
    ForwardedIp {
        /// The header the proxies write.
        header: ForwardedHeader,
        /// The proxies whose header is believed; never empty.
        trusted_proxies: Vec<Cidr>,
    },
    /// The value of a request header, such as `x-api-key`, at most
    /// [`HeaderKey::DEFAULT_MAX_LEN`](crate::rate_limit::HeaderKey::DEFAULT_MAX_LEN) bytes.
    Header(http::HeaderName),
    /// One key for every request.
    Global,
}

/// The header that trusted proxies forward the client's address in (`forwarded_header`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For` (`"x-forwarded-for"`, the default).
    #[default]
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    /// RFC 7239 `Forwarded`, its `for=` parameters (`"forwarded"`).
    #[serde(rename = "forwarded")]
    Forwarded,
}

/// Where a configured rate limiter keeps its state.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StoreKind {
    /// In this process's memory (the default).
    #[default]
    Memory,
    /// In Redis, shared by every instance of the service (feature `redis`).
    Redis(RedisSettings),
}

/// What a Redis-backed rate limiter does when Redis cannot answer in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisFailModeKind {
    /// Admit the request (the default): `redis_fail_mode = "open"`.
    Open,
    /// Refuse the request: `redis_fail_mode = "closed"`.
    Closed,
    /// Decide with a local in-memory limiter admitting this many per period:
    /// `redis_fail_mode = "fallback"` with `fallback_limit_for_period`.
    Fallback(u32),
}

/// The Redis settings of a rate limiter (`store = "redis"`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisSettings {
    /// The server, such as `redis://127.0.0.1:6379`.
    pub url: String,
    /// The prefix of the limiter's keys; the store's default when absent.
    pub prefix: Option<String>,
    /// How long a decision may wait for Redis; the store's default when absent.
    pub timeout: Option<Duration>,
    /// What to do when Redis cannot answer.
    pub fail_mode: RedisFailModeKind,
}

/// The settings of one named rate limiter.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RateLimiterSettings {
    /// Permits per period, burst and maximum wait: the part a reload changes in place.
    pub quota: Quota,
    /// The algorithm.
    pub algorithm: AlgorithmKind,
    /// How the key is found.
    pub key: KeyKind,
    /// The most keys held in memory.
    pub max_keys: usize,
    /// Whether log events leave client keys out.
    pub hide_keys: bool,
    /// Where the state lives.
    pub store: StoreKind,
}

/// The settings of one named bulkhead.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BulkheadSettings {
    /// The most calls in flight at once: the part a reload changes in place.
    pub max_concurrent_calls: usize,
    /// How long a call may wait for a permit: for a semaphore bulkhead zero (refuse at once) when
    /// absent, for a queue bulkhead no bound when absent.
    pub max_wait: Option<Duration>,
    /// With a value, a queue bulkhead holding up to this many waiting calls.
    pub queue_capacity: Option<usize>,
}

/// A route's rate limiting: the policies one layer holds (each a named rate limiter with its
/// key, and the cost and shadow mode it has on this route) and the networks it exempts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteSettings {
    /// The policies, in the order the layer asks them.
    pub policies: Vec<RoutePolicy>,
    /// Networks whose requests skip every policy (the TCP peer's address).
    pub exempt_networks: Vec<Cidr>,
}

/// One policy of a route.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoutePolicy {
    /// The rate limiter (a name under `rate_limiters`), which is also the policy's name.
    pub limiter: String,
    /// The permits each request of the route costs.
    pub cost: u32,
    /// Whether the policy is in shadow mode (decides and counts, never refuses).
    pub shadow: ShadowKind,
}

/// A route policy's shadow mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShadowKind {
    /// Enforced (the default).
    #[default]
    Off,
    /// Never refuses; left out of the rate-limit headers (`shadow = true`).
    Silent,
    /// Never refuses; described in the headers as if enforced (`shadow = "advertised"`).
    Advertised,
}

/// The settings of one named pushback (`[pushbacks.NAME]`): see
/// [`Pushback`](crate::outbound::Pushback).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PushbackSettings {
    /// How long a held call may wait for the hold to end; zero (the default) refuses at once.
    pub max_wait: Duration,
    /// The longest hold any response can impose.
    pub max_hold: Duration,
    /// How calls are paced by a quota the dependency advertises.
    pub pacing: Pacing,
}

impl Default for PushbackSettings {
    fn default() -> Self {
        Self {
            max_wait: Duration::ZERO,
            max_hold: DEFAULT_MAX_HOLD,
            pacing: Pacing::default(),
        }
    }
}

/// The settings of one named adaptive bulkhead (`[adaptive_bulkheads.NAME]`, feature
/// `adaptive`): see `bulkhead::adaptive::AdaptiveBulkhead`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdaptiveBulkheadSettings {
    /// The lowest the limit goes.
    pub min_limit: usize,
    /// The limit it starts at.
    pub initial_limit: usize,
    /// The highest the limit goes.
    pub max_limit: usize,
    /// How the limit follows the dependency.
    pub algorithm: AdaptiveAlgorithmKind,
    /// Whether a call dropped before it ended (a timeout above) is no sample at all, rather
    /// than an overload signal.
    pub ignore_cancelled_calls: bool,
}

/// The algorithm of an adaptive bulkhead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AdaptiveAlgorithmKind {
    /// Additive increase, multiplicative decrease (`aimd`, the default).
    #[default]
    Aimd,
    /// Delay-based (`gradient`).
    Gradient,
}

/// The settings of one named client quota (`[client_quotas.NAME]`): a rate limiter applied to
/// outbound calls, see [`ClientQuotaLayer`](crate::outbound::ClientQuotaLayer).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientQuotaSettings {
    /// The rate limiter (a name under `rate_limiters`) whose quota the calls draw on.
    pub limiter: String,
    /// The permits each call takes.
    pub cost: u32,
}

/// A parsed and validated configuration: named rate limiters, bulkheads and routes.
#[derive(Clone, Debug, PartialEq, Default)]
#[non_exhaustive]
pub struct Config {
    /// Rate limiters by name.
    pub rate_limiters: BTreeMap<String, RateLimiterSettings>,
    /// Bulkheads by name.
    pub bulkheads: BTreeMap<String, BulkheadSettings>,
    /// Routes by name: several rate limiters on one layer.
    pub routes: BTreeMap<String, RouteSettings>,
    /// Pushbacks by name: outbound calls held back as a dependency asks.
    pub pushbacks: BTreeMap<String, PushbackSettings>,
    /// Client quotas by name: a rate limiter applied to outbound calls.
    pub client_quotas: BTreeMap<String, ClientQuotaSettings>,
    /// Adaptive bulkheads by name (feature `adaptive`).
    pub adaptive_bulkheads: BTreeMap<String, AdaptiveBulkheadSettings>,
}

impl Config {
    /// Parses and validates a TOML document.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field at fault (`rate_limiters.api.burst`) with its line
    /// and column: text that is not TOML, an unknown section or field, a value of the wrong
    /// type or out of range, a duration without a unit, or a name that points nowhere.
    ///
    /// ```
    /// use tower_bulwark::config::Config;
    ///
    /// let text = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = 1\n";
    /// let err = Config::from_toml_str(text).unwrap_err();
    /// assert_eq!(err.path(), "rate_limiters.api.limit_refresh_period");
    /// assert_eq!(err.position(), Some((3, 24)));
    /// assert!(err.message().contains("no unit"));
    /// ```
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let file: file::File =
            toml::from_str(text).map_err(|e| ConfigError::from_toml(text, &e))?;
        file.validate().map_err(|e| e.located_in(text))
    }

    /// Reads, parses and validates a TOML file.
    ///
    /// # Errors
    ///
    /// A file that cannot be read, or one [`from_toml_str`](Self::from_toml_str) refuses.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::from_toml_str(&ConfigError::read(path.as_ref())?)
    }

    /// Checks the names instances give each other: a route's and a client quota's rate
    /// limiters exist, and no bulkhead of either kind shares a name.
    fn check_names(&self) -> Result<(), ConfigError> {
        // Bulkheads of both kinds report under one metric name, by name: names must differ.
        if let Some(name) = self
            .adaptive_bulkheads
            .keys()
            .find(|name| self.bulkheads.contains_key(*name))
        {
            return Err(ConfigError::new(
                format!("adaptive_bulkheads.{name}"),
                format!(
                    "has the name of `bulkheads.{name}`; a bulkhead's metrics and health are \
                     keyed by its name, so the two kinds share one namespace"
                ),
            ));
        }
        for (name, route) in &self.routes {
            for (i, policy) in route.policies.iter().enumerate() {
                self.limiter(&format!("routes.{name}.policies[{i}]"), &policy.limiter)?;
            }
        }
        for (name, quota) in &self.client_quotas {
            self.check_client_quota(name, quota)?;
        }
        Ok(())
    }

    /// Rate limiter `name`, which the setting at `path` names.
    fn limiter(&self, path: &str, name: &str) -> Result<&RateLimiterSettings, ConfigError> {
        self.rate_limiters.get(name).ok_or_else(|| {
            ConfigError::new(
                path,
                format!("names `{name}`, which is not under `rate_limiters`"),
            )
        })
    }

    /// A client quota's rate limiter must count every call under one key, and be able to grant
    /// a call's cost.
    fn check_client_quota(
        &self,
        name: &str,
        quota: &ClientQuotaSettings,
    ) -> Result<(), ConfigError> {
        let path = format!("client_quotas.{name}");
        let limiter = self.limiter(&format!("{path}.limiter"), &quota.limiter)?;
        if limiter.key != KeyKind::Global {
            return Err(ConfigError::new(
                format!("{path}.limiter"),
                format!(
                    "names `{0}`, whose key is not \"global\"; an outbound call has no client to \
                     key by, so a client quota counts every call under one key: give \
                     `rate_limiters.{0}` key = \"global\"",
                    quota.limiter
                ),
            ));
        }
        if quota.cost > limiter.quota.burst() {
            return Err(ConfigError::new(
                format!("{path}.cost"),
                format!(
                    "is {}, more than the burst of rate limiter `{}` ({}): no call could ever be \
                     sent",
                    quota.cost,
                    quota.limiter,
                    limiter.quota.burst()
                ),
            ));
        }
        Ok(())
    }
}
