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
//! key = "peer_ip"             # peer_ip | header:x-api-key | global
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
//! Nothing is guessed. A duration must carry its unit (`500ms`, `1s`, `2m`, `1h`, or several
//! together such as `1m30s`): `limit_refresh_period = 500` is an error, because one library reads
//! a bare 500 as nanoseconds and another as milliseconds. Unknown fields, zero limits and values
//! out of range are errors that name the instance and the field.
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
//! | `key` | `peer_ip`, `header:<name>` (values up to 256 bytes), `global` | `peer_ip` |
//! | `trusted_proxies` | list of CIDRs; with `key = "peer_ip"`, the client is read from `X-Forwarded-For` sent by these (an unreadable hop is a `400`, see `ForwardedIp`) | none |
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
use std::error::Error;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use toml::{Table, Value};

use crate::outbound::pushback::{Pacing, DEFAULT_MAX_HOLD};
use crate::rate_limit::Cidr;
use crate::Quota;

mod registry;

pub use registry::{
    BulkheadHealth, ConfigKey, ConfigKeyExtractor, ConfiguredClientQuotaLayer, ConfiguredLimiter,
    ConfiguredPolicy, ConfiguredRateLimitLayer, GlobalConfigKey, Health, LimiterHealth,
    PushbackHealth, Registry, Reloaded, UnknownInstance,
};

/// A configuration file that could not be used: where, and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    path: String,
    message: String,
}

impl ConfigError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }

    /// Where the error is, as a dotted path such as `rate_limiters.api.max_wait`; empty for an
    /// error of the whole file.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What was wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "invalid configuration: {}", self.message)
        } else {
            write!(
                f,
                "invalid configuration at `{}`: {}",
                self.path, self.message
            )
        }
    }
}

impl Error for ConfigError {}

/// Which algorithm a configured rate limiter uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
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
    /// The value of a request header, such as `x-api-key`, at most
    /// [`HeaderKey::DEFAULT_MAX_LEN`](crate::rate_limit::HeaderKey::DEFAULT_MAX_LEN) bytes.
    Header(http::HeaderName),
    /// One key for every request.
    Global,
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
    /// Permits per period, burst and maximum wait.
    pub quota: Quota,
    /// The algorithm.
    pub algorithm: AlgorithmKind,
    /// How the key is found.
    pub key: KeyKind,
    /// Proxies whose `X-Forwarded-For` is believed (for `key = "peer_ip"`).
    pub trusted_proxies: Vec<Cidr>,
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
    /// The most calls in flight at once.
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// A TOML error's message with the line and column where it is (a duplicate key, a value
/// without quotes): such an error belongs to no field path yet, so the place is in the message.
fn syntax_error(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    let Some(span) = error.span() else {
        return message.to_owned();
    };
    let before = &text.as_bytes()[..span.start.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    // Columns in characters, as an editor shows them.
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    format!("{message} (line {line}, column {column})")
}

impl Config {
    /// Parses and validates a TOML document.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let table: Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::new("", syntax_error(text, &e)))?;
        let mut config = Config::default();
        for (section, value) in &table {
            let instances = value.as_table().ok_or_else(|| {
                ConfigError::new(section.as_str(), "must be a table of named instances")
            })?;
            match section.as_str() {
                "rate_limiters" => {
                    for (name, v) in instances {
                        let path = format!("rate_limiters.{name}");
                        let settings = rate_limiter(&path, instance_table(&path, v)?)?;
                        config.rate_limiters.insert(name.clone(), settings);
                    }
                }
                "bulkheads" => {
                    for (name, v) in instances {
                        let path = format!("bulkheads.{name}");
                        let settings = bulkhead(&path, instance_table(&path, v)?)?;
                        config.bulkheads.insert(name.clone(), settings);
                    }
                }
                "routes" => {
                    for (name, v) in instances {
                        let path = format!("routes.{name}");
                        let settings = route(&path, instance_table(&path, v)?)?;
                        config.routes.insert(name.clone(), settings);
                    }
                }
                "pushbacks" => {
                    for (name, v) in instances {
                        let path = format!("pushbacks.{name}");
                        let settings = pushback(&path, instance_table(&path, v)?)?;
                        config.pushbacks.insert(name.clone(), settings);
                    }
                }
                "client_quotas" => {
                    for (name, v) in instances {
                        let path = format!("client_quotas.{name}");
                        let settings = client_quota(&path, instance_table(&path, v)?)?;
                        config.client_quotas.insert(name.clone(), settings);
                    }
                }
                "adaptive_bulkheads" => {
                    for (name, v) in instances {
                        let path = format!("adaptive_bulkheads.{name}");
                        let settings = adaptive_bulkhead(&path, instance_table(&path, v)?)?;
                        config.adaptive_bulkheads.insert(name.clone(), settings);
                    }
                }
                other => {
                    return Err(ConfigError::new(
                        other,
                        "unknown section; expected `rate_limiters`, `bulkheads`, \
                         `adaptive_bulkheads`, `routes`, `pushbacks` or `client_quotas`",
                    ))
                }
            }
        }
        // Bulkheads of both kinds report under one metric name, by name: names must differ.
        if let Some(name) = config
            .adaptive_bulkheads
            .keys()
            .find(|name| config.bulkheads.contains_key(*name))
        {
            return Err(ConfigError::new(
                format!("adaptive_bulkheads.{name}"),
                format!(
                    "has the name of `bulkheads.{name}`; a bulkhead's metrics and health are \
                     keyed by its name, so the two kinds share one namespace"
                ),
            ));
        }
        // A route names rate limiters: each must be configured.
        for (name, route) in &config.routes {
            for (i, policy) in route.policies.iter().enumerate() {
                if !config.rate_limiters.contains_key(&policy.limiter) {
                    return Err(ConfigError::new(
                        format!("routes.{name}.policies[{i}]"),
                        format!(
                            "names `{}`, which is not under `rate_limiters`",
                            policy.limiter
                        ),
                    ));
                }
            }
        }
        // A client quota names a rate limiter: it must be configured, count every call under
        // one key, and be able to grant a call's cost.
        for (name, quota) in &config.client_quotas {
            let path = format!("client_quotas.{name}");
            let Some(limiter) = config.rate_limiters.get(&quota.limiter) else {
                return Err(ConfigError::new(
                    format!("{path}.limiter"),
                    format!(
                        "names `{}`, which is not under `rate_limiters`",
                        quota.limiter
                    ),
                ));
            };
            if limiter.key != KeyKind::Global {
                return Err(ConfigError::new(
                    format!("{path}.limiter"),
                    format!(
                        "names `{}`, whose key is not \"global\"; an outbound call has no client \
                         to key by, so a client quota counts every call under one key: give \
                         `rate_limiters.{}` key = \"global\"",
                        quota.limiter, quota.limiter
                    ),
                ));
            }
            if quota.cost > limiter.quota.burst() {
                return Err(ConfigError::new(
                    format!("{path}.cost"),
                    format!(
                        "is {}, more than the burst of rate limiter `{}` ({}): no call could \
                         ever be sent",
                        quota.cost,
                        quota.limiter,
                        limiter.quota.burst()
                    ),
                ));
            }
        }
        Ok(config)
    }

    /// Reads, parses and validates a TOML file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("", format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml_str(&text)
    }
}

fn instance_table<'a>(path: &str, v: &'a Value) -> Result<&'a Table, ConfigError> {
    v.as_table()
        .ok_or_else(|| ConfigError::new(path, "must be a table of settings"))
}

/// Fields of earlier versions, with their names now.
const RENAMED: &[(&str, &str)] = &[
    ("on_redis_failure", "redis_fail_mode"),
    ("local_limit_for_period", "fallback_limit_for_period"),
];

/// Reads the fields of one instance, refusing any it does not know.
struct Fields<'a> {
    path: &'a str,
    table: &'a Table,
}

impl<'a> Fields<'a> {
    fn new(path: &'a str, table: &'a Table, known: &[&str]) -> Result<Self, ConfigError> {
        if let Some(unknown) = table.keys().find(|k| !known.contains(&k.as_str())) {
            let message = match RENAMED.iter().find(|(old, _)| old == unknown) {
                Some((_, new)) => format!("was renamed `{new}`"),
                None => format!("unknown field; expected one of {}", known.join(", ")),
            };
            return Err(ConfigError::new(format!("{path}.{unknown}"), message));
        }
        Ok(Self { path, table })
    }

    fn err(&self, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(format!("{}.{field}", self.path), message)
    }

    fn get(&self, field: &str) -> Option<&'a Value> {
        self.table.get(field)
    }

    fn required(&self, field: &str) -> Result<&'a Value, ConfigError> {
        self.get(field)
            .ok_or_else(|| self.err(field, "is required"))
    }

    fn positive_int(&self, field: &str, v: &Value, max: u64) -> Result<u64, ConfigError> {
        let n = v
            .as_integer()
            .ok_or_else(|| self.err(field, format!("must be an integer, not {}", v.type_str())))?;
        if n < 1 {
            return Err(self.err(field, format!("must be at least 1, not {n}")));
        }
        let n = n as u64;
        if n > max {
            return Err(self.err(field, format!("must be at most {max}, not {n}")));
        }
        Ok(n)
    }

    fn duration(&self, field: &str, v: &Value) -> Result<Duration, ConfigError> {
        match v {
            Value::String(s) => parse_duration(s).map_err(|m| self.err(field, m)),
            Value::Integer(n) => Err(self.err(
                field,
                format!("`{n}` has no unit; write it with one, such as \"{n}ms\" or \"{n}s\""),
            )),
            other => Err(self.err(
                field,
                format!(
                    "must be a duration string such as \"500ms\", not {}",
                    other.type_str()
                ),
            )),
        }
    }

    fn cidrs(&self, field: &str, v: &Value) -> Result<Vec<Cidr>, ConfigError> {
        let list = v
            .as_array()
            .ok_or_else(|| self.err(field, "must be a list of CIDR strings"))?;
        list.iter()
            .map(|item| {
                let s = self.string(field, item)?;
                s.parse::<Cidr>()
                    .map_err(|e| self.err(field, format!("`{s}`: {e}")))
            })
            .collect()
    }

    fn boolean(&self, field: &str, v: &Value) -> Result<bool, ConfigError> {
        v.as_bool().ok_or_else(|| {
            self.err(
                field,
                format!("must be true or false, not {}", v.type_str()),
            )
        })
    }

    fn string(&self, field: &str, v: &'a Value) -> Result<&'a str, ConfigError> {
        v.as_str()
            .ok_or_else(|| self.err(field, format!("must be a string, not {}", v.type_str())))
    }
}

fn rate_limiter(path: &str, table: &Table) -> Result<RateLimiterSettings, ConfigError> {
    let f = Fields::new(
        path,
        table,
        &[
            "limit_for_period",
            "limit_refresh_period",
            "burst",
            "max_wait",
            "algorithm",
            "key",
            "trusted_proxies",
            "max_keys",
            "hide_keys",
            "store",
            "redis_url",
            "redis_prefix",
            "redis_timeout",
            "redis_fail_mode",
            "fallback_limit_for_period",
        ],
    )?;
    let permits = f.positive_int(
        "limit_for_period",
        f.required("limit_for_period")?,
        u64::from(u32::MAX),
    )? as u32;
    let period = f.duration("limit_refresh_period", f.required("limit_refresh_period")?)?;
    let mut quota = Quota::with_period(permits, period).map_err(|e| {
        let field = if e.field() == "period" {
            "limit_refresh_period"
        } else {
            "limit_for_period"
        };
        f.err(field, e.to_string())
    })?;
    if let Some(v) = f.get("burst") {
        let burst = f.positive_int("burst", v, u64::from(u32::MAX))? as u32;
        quota = quota
            .with_burst(burst)
            .map_err(|e| f.err("burst", e.to_string()))?;
    }
    if let Some(v) = f.get("max_wait") {
        let wait = f.duration("max_wait", v)?;
        quota = quota
            .with_max_wait(wait)
            .map_err(|e| f.err("max_wait", e.to_string()))?;
    }
    let algorithm = match f.get("algorithm") {
        None => AlgorithmKind::default(),
        Some(v) => match f.string("algorithm", v)? {
            "gcra" => AlgorithmKind::Gcra,
            "fixed_window" => AlgorithmKind::FixedWindow,
            "sliding_log" => AlgorithmKind::SlidingLog,
            "sliding_counter" => AlgorithmKind::SlidingCounter,
            other => {
                return Err(f.err(
                    "algorithm",
                    format!(
                        "unknown algorithm `{other}`; expected gcra, fixed_window, sliding_log or sliding_counter"
                    ),
                ))
            }
        },
    };
    let key = match f.get("key") {
        None => KeyKind::default(),
        Some(v) => {
            let s = f.string("key", v)?;
            match s {
                "peer_ip" => KeyKind::PeerIp,
                "global" => KeyKind::Global,
                _ => match s.strip_prefix("header:") {
                    Some(name) => {
                        KeyKind::Header(http::HeaderName::try_from(name.trim()).map_err(|_| {
                            f.err("key", format!("`{name}` is not a valid header name"))
                        })?)
                    }
                    None => {
                        return Err(f.err(
                            "key",
                            format!("unknown key `{s}`; expected peer_ip, header:<name> or global"),
                        ))
                    }
                },
            }
        }
    };
    let mut trusted_proxies = Vec::new();
    if let Some(v) = f.get("trusted_proxies") {
        trusted_proxies = f.cidrs("trusted_proxies", v)?;
        if key != KeyKind::PeerIp {
            return Err(f.err("trusted_proxies", "applies only to key = \"peer_ip\""));
        }
    }
    let max_keys = match f.get("max_keys") {
        None => crate::limiter::DEFAULT_MAX_KEYS,
        Some(v) => f.positive_int("max_keys", v, u32::MAX.into())? as usize,
    };
    let hide_keys = match f.get("hide_keys") {
        None => false,
        Some(v) => f.boolean("hide_keys", v)?,
    };
    let store = store(&f)?;
    Ok(RateLimiterSettings {
        quota,
        algorithm,
        key,
        trusted_proxies,
        max_keys,
        hide_keys,
        store,
    })
}

fn store(f: &Fields<'_>) -> Result<StoreKind, ConfigError> {
    let redis_fields = [
        "redis_url",
        "redis_prefix",
        "redis_timeout",
        "redis_fail_mode",
        "fallback_limit_for_period",
    ];
    let kind = match f.get("store") {
        None => "memory",
        Some(v) => f.string("store", v)?,
    };
    match kind {
        "memory" => {
            if let Some(field) = redis_fields.iter().find(|name| f.get(name).is_some()) {
                return Err(f.err(field, "applies only to store = \"redis\""));
            }
            Ok(StoreKind::Memory)
        }
        "redis" => {
            if cfg!(not(feature = "redis")) {
                return Err(f.err(
                    "store",
                    "`redis` needs the crate's `redis` feature, which this build lacks",
                ));
            }
            let url = f.string("redis_url", f.required("redis_url")?)?.to_owned();
            let prefix = match f.get("redis_prefix") {
                None => None,
                Some(v) => Some(f.string("redis_prefix", v)?.to_owned()),
            };
            let timeout = match f.get("redis_timeout") {
                None => None,
                Some(v) => Some(f.duration("redis_timeout", v)?),
            };
            let local = match f.get("fallback_limit_for_period") {
                None => None,
                Some(v) => {
                    Some(
                        f.positive_int("fallback_limit_for_period", v, u64::from(u32::MAX))? as u32,
                    )
                }
            };
            let fail_mode = match f.get("redis_fail_mode") {
                None => RedisFailModeKind::Open,
                Some(v) => match f.string("redis_fail_mode", v)? {
                    "open" => RedisFailModeKind::Open,
                    "closed" => RedisFailModeKind::Closed,
                    "fallback" => RedisFailModeKind::Fallback(local.ok_or_else(|| {
                        f.err(
                            "fallback_limit_for_period",
                            "is required with redis_fail_mode = \"fallback\"",
                        )
                    })?),
                    other => {
                        return Err(f.err(
                            "redis_fail_mode",
                            format!("unknown mode `{other}`; expected open, closed or fallback"),
                        ))
                    }
                },
            };
            if local.is_some() && !matches!(fail_mode, RedisFailModeKind::Fallback(_)) {
                return Err(f.err(
                    "fallback_limit_for_period",
                    "applies only to redis_fail_mode = \"fallback\"",
                ));
            }
            Ok(StoreKind::Redis(RedisSettings {
                url,
                prefix,
                timeout,
                fail_mode,
            }))
        }
        other => Err(f.err(
            "store",
            format!("unknown store `{other}`; expected memory or redis"),
        )),
    }
}

fn route(path: &str, table: &Table) -> Result<RouteSettings, ConfigError> {
    let f = Fields::new(path, table, &["policies", "exempt_networks"])?;
    let list = f
        .required("policies")?
        .as_array()
        .ok_or_else(|| f.err("policies", "must be a list of rate limiter names or tables"))?;
    if list.is_empty() {
        return Err(f.err("policies", "must name at least one rate limiter"));
    }
    let mut policies = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let field = format!("policies[{i}]");
        let policy = match item {
            Value::String(limiter) => RoutePolicy {
                limiter: limiter.clone(),
                cost: 1,
                shadow: ShadowKind::Off,
            },
            Value::Table(table) => {
                let item_path = format!("{path}.{field}");
                let p = Fields::new(&item_path, table, &["limiter", "cost", "shadow"])?;
                let limiter = p.string("limiter", p.required("limiter")?)?.to_owned();
                let cost = match p.get("cost") {
                    None => 1,
                    Some(v) => p.positive_int("cost", v, u64::from(u32::MAX))? as u32,
                };
                let shadow = match p.get("shadow") {
                    None | Some(Value::Boolean(false)) => ShadowKind::Off,
                    Some(Value::Boolean(true)) => ShadowKind::Silent,
                    Some(Value::String(s)) if s == "advertised" => ShadowKind::Advertised,
                    Some(other) => {
                        return Err(p.err(
                            "shadow",
                            match other {
                                Value::String(s) => {
                                    format!("must be true, false or \"advertised\", not \"{s}\"")
                                }
                                v => format!(
                                    "must be true, false or \"advertised\", not {}",
                                    v.type_str()
                                ),
                            },
                        ))
                    }
                };
                RoutePolicy {
                    limiter,
                    cost,
                    shadow,
                }
            }
            other => {
                return Err(f.err(
                    &field,
                    format!(
                        "must be a rate limiter name or a table with `limiter`, not {}",
                        other.type_str()
                    ),
                ))
            }
        };
        if policies
            .iter()
            .any(|p: &RoutePolicy| p.limiter == policy.limiter)
        {
            return Err(f.err(&field, format!("names `{}` a second time", policy.limiter)));
        }
        policies.push(policy);
    }
    let mut exempt_networks = Vec::new();
    if let Some(v) = f.get("exempt_networks") {
        exempt_networks = f.cidrs("exempt_networks", v)?;
        if !exempt_networks.is_empty() && cfg!(not(feature = "axum")) {
            return Err(f.err(
                "exempt_networks",
                "needs the `axum` feature (the TCP peer comes from axum's ConnectInfo)",
            ));
        }
    }
    Ok(RouteSettings {
        policies,
        exempt_networks,
    })
}

fn bulkhead(path: &str, table: &Table) -> Result<BulkheadSettings, ConfigError> {
    let f = Fields::new(
        path,
        table,
        &["max_concurrent_calls", "max_wait", "queue_capacity"],
    )?;
    let max_concurrent_calls = f.positive_int(
        "max_concurrent_calls",
        f.required("max_concurrent_calls")?,
        u64::from(u32::MAX >> 3),
    )? as usize;
    let max_wait = match f.get("max_wait") {
        None => None,
        Some(v) => Some(f.duration("max_wait", v)?),
    };
    let queue_capacity = match f.get("queue_capacity") {
        None => None,
        Some(v) => Some(f.positive_int("queue_capacity", v, u64::from(u32::MAX >> 3))? as usize),
    };
    Ok(BulkheadSettings {
        max_concurrent_calls,
        max_wait,
        queue_capacity,
    })
}

fn pushback(path: &str, table: &Table) -> Result<PushbackSettings, ConfigError> {
    let f = Fields::new(path, table, &["max_wait", "max_hold", "pacing"])?;
    let mut settings = PushbackSettings::default();
    // Bounded as a quota's spans are: no setting may reach the ends of a clock's range.
    let bounded = |field: &str, v: &Value| {
        let span = f.duration(field, v)?;
        if span > Quota::MAX_SPAN {
            return Err(f.err(field, "is too long (at most 2^60 ns, about 36.5 years)"));
        }
        Ok(span)
    };
    if let Some(v) = f.get("max_wait") {
        settings.max_wait = bounded("max_wait", v)?;
    }
    if let Some(v) = f.get("max_hold") {
        settings.max_hold = bounded("max_hold", v)?;
        if settings.max_hold.is_zero() {
            return Err(f.err(
                "max_hold",
                "must be more than zero: a zero max_hold would cut every hold the dependency \
                 asks for to nothing",
            ));
        }
    }
    if let Some(v) = f.get("pacing") {
        settings.pacing = match f.string("pacing", v)? {
            "until_spent" => Pacing::UntilSpent,
            "spread" => Pacing::Spread,
            other => {
                return Err(f.err(
                    "pacing",
                    format!("unknown pacing `{other}`; expected until_spent or spread"),
                ))
            }
        };
    }
    Ok(settings)
}

fn adaptive_bulkhead(path: &str, table: &Table) -> Result<AdaptiveBulkheadSettings, ConfigError> {
    let f = Fields::new(
        path,
        table,
        &[
            "min_limit",
            "initial_limit",
            "max_limit",
            "algorithm",
            "ignore_cancelled_calls",
        ],
    )?;
    if cfg!(not(feature = "adaptive")) {
        return Err(ConfigError::new(
            path,
            "an adaptive bulkhead needs the crate's `adaptive` feature, which this build lacks",
        ));
    }
    // As the bulkheads' own bound: the semaphore counts permits in 31 bits.
    let bound = (u32::MAX >> 1) as u64;
    let limit = |field: &str, default: usize| match f.get(field) {
        None => Ok(default),
        Some(v) => Ok(f.positive_int(field, v, bound)? as usize),
    };
    let min_limit = limit("min_limit", 1)?;
    let max_limit = limit("max_limit", 256.max(min_limit))?;
    if min_limit > max_limit {
        return Err(f.err(
            "min_limit",
            format!("is {min_limit}, above max_limit ({max_limit})"),
        ));
    }
    let initial_limit = limit("initial_limit", 8.clamp(min_limit, max_limit))?;
    if initial_limit < min_limit || initial_limit > max_limit {
        return Err(f.err(
            "initial_limit",
            format!(
                "is {initial_limit}, outside min_limit..=max_limit ({min_limit}..={max_limit})"
            ),
        ));
    }
    let algorithm = match f.get("algorithm") {
        None => AdaptiveAlgorithmKind::Aimd,
        Some(v) => match f.string("algorithm", v)? {
            "aimd" => AdaptiveAlgorithmKind::Aimd,
            "gradient" => AdaptiveAlgorithmKind::Gradient,
            other => {
                return Err(f.err(
                    "algorithm",
                    format!("unknown algorithm `{other}`; expected aimd or gradient"),
                ))
            }
        },
    };
    let ignore_cancelled_calls = match f.get("ignore_cancelled_calls") {
        None => false,
        Some(v) => f.boolean("ignore_cancelled_calls", v)?,
    };
    Ok(AdaptiveBulkheadSettings {
        min_limit,
        initial_limit,
        max_limit,
        algorithm,
        ignore_cancelled_calls,
    })
}

fn client_quota(path: &str, table: &Table) -> Result<ClientQuotaSettings, ConfigError> {
    let f = Fields::new(path, table, &["limiter", "cost"])?;
    let limiter = f.string("limiter", f.required("limiter")?)?.to_owned();
    let cost = match f.get("cost") {
        None => 1,
        Some(v) => f.positive_int("cost", v, u64::from(u32::MAX))? as u32,
    };
    Ok(ClientQuotaSettings { limiter, cost })
}

/// Parses a duration with units: `250ms`, `1s`, `1m30s`, `1.5s`, `2h`. Units: `ns`, `us` (or
/// `µs`), `ms`, `s`, `m`, `h`, `d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("is empty; write a duration such as \"500ms\"".into());
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!(
                "`{text}` is not a duration; write it such as \"500ms\""
            ));
        }
        let (num, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale: u128 = match unit.trim() {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "" => {
                return Err(format!(
                    "`{text}` has no unit; write it with one, such as \"{num}ms\" or \"{num}s\""
                ))
            }
            other => {
                return Err(format!(
                    "`{text}` has an unknown unit `{other}`; use ns, us, ms, s, m, h or d"
                ))
            }
        };
        let nanos = match num.split_once('.') {
            None => num.parse::<u128>().ok().and_then(|n| n.checked_mul(scale)),
            Some((whole, frac)) if !frac.is_empty() && !frac.contains('.') => {
                let whole: u128 = if whole.is_empty() {
                    0
                } else {
                    whole.parse().ok().unwrap_or(u128::MAX)
                };
                // A fraction finer than a nanosecond would be rounded, and "0.5ns" would
                // silently become zero (for `max_wait`: never wait): refuse it instead.
                let frac = frac.trim_end_matches('0');
                let frac_nanos = if frac.is_empty() {
                    Some(0)
                } else if frac.len() > 18 {
                    None
                } else {
                    let frac_val: u128 = frac.parse().unwrap_or(0);
                    let frac_scale = 10u128.pow(frac.len() as u32);
                    Some(frac_val * scale)
                        .filter(|n| n % frac_scale == 0)
                        .map(|n| n / frac_scale)
                };
                let Some(frac_nanos) = frac_nanos else {
                    return Err(format!(
                        "`{text}` is not a whole number of nanoseconds; durations are counted in \
                         nanoseconds and are never rounded"
                    ));
                };
                whole
                    .checked_mul(scale)
                    .and_then(|w| w.checked_add(frac_nanos))
            }
            Some(_) => return Err(format!("`{text}` has a malformed number `{num}`")),
        };
        total = nanos
            .and_then(|n| total.checked_add(n))
            .ok_or_else(|| format!("`{text}` is too long"))?;
        rest = next;
    }
    let nanos = u64::try_from(total).map_err(|_| format!("`{text}` is too long"))?;
    Ok(Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units() {
        let ok = [
            ("500ms", Duration::from_millis(500)),
            ("1s", Duration::from_secs(1)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5s", Duration::from_millis(1500)),
            ("2h", Duration::from_secs(7200)),
            ("250us", Duration::from_micros(250)),
            ("0s", Duration::ZERO),
            (" 10 ms ", Duration::from_millis(10)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "500",
            "ms",
            "1x",
            "1..5s",
            "-1s",
            "99999999999999999999999d",
            "1.s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should fail");
        }
        assert!(parse_duration("500").unwrap_err().contains("no unit"));
    }

    /// Issue 11, item 11: "0.5ns" was truncated to zero (for `max_wait`: never wait).
    #[test]
    fn durations_finer_than_a_nanosecond_are_refused_not_rounded() {
        for bad in ["0.5ns", "1.5ns", "0.0001us", "1.0000000001s", "0.5ns1s"] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(err.contains(bad) && err.contains("nanoseconds"), "{err}");
        }
        let ok = [
            ("0.5us", Duration::from_nanos(500)),
            ("1.000000001s", Duration::from_nanos(1_000_000_001)),
            ("1.50s", Duration::from_millis(1500)),
            ("0.0s", Duration::ZERO),
            ("18446744073709551615ns", Duration::from_nanos(u64::MAX)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        assert!(parse_duration("18446744073709551616ns")
            .unwrap_err()
            .contains("too long"));
    }
}
