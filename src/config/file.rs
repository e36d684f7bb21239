//! The file as serde reads it, one struct per kind, and the one validation pass over it.
//!
//! The registry builds from these structs once they are validated. Fields with a fixed default
//! take it from serde; the few whose default depends on another field are filled in by the
//! validation, so that two files meaning the same settings compare equal on a reload.
//! Required fields that serde alone would report at the instance are `Option`s, so that a
//! missing one is an error at its own path; the readers of [`fields`](super::fields) check what
//! one value alone can say (a count's bounds, a duration's unit).

use std::collections::BTreeMap;
use std::time::Duration;

use super::duration::{optional, with_units};
use super::fields::{choice, cidrs, instances, policies, some_choice, some_cidrs, Count};
use super::ConfigError;
use crate::limiter::DEFAULT_MAX_KEYS;
use crate::outbound::pushback::DEFAULT_MAX_HOLD;
use crate::rate_limit::Cidr;
use crate::Quota;

/// The whole file, validated: a table of named instances per kind.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct Config {
    #[serde(deserialize_with = "instances")]
    pub(super) rate_limiters: BTreeMap<String, RateLimiterSettings>,
    #[serde(deserialize_with = "instances")]
    pub(super) bulkheads: BTreeMap<String, BulkheadSettings>,
    #[serde(deserialize_with = "instances")]
    pub(super) routes: BTreeMap<String, RouteSettings>,
    #[serde(deserialize_with = "instances")]
    pub(super) pushbacks: BTreeMap<String, PushbackSettings>,
    #[serde(deserialize_with = "instances")]
    pub(super) client_quotas: BTreeMap<String, ClientQuotaSettings>,
    #[serde(deserialize_with = "instances")]
    pub(super) adaptive_bulkheads: BTreeMap<String, AdaptiveBulkheadSettings>,
}

/// `[rate_limiters.NAME]`.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RateLimiterSettings {
    limit_for_period: Count,
    #[serde(deserialize_with = "with_units")]
    limit_refresh_period: Duration,
    burst: Option<Count>,
    #[serde(default, deserialize_with = "optional")]
    max_wait: Option<Duration>,
    #[serde(default, deserialize_with = "choice")]
    pub(super) algorithm: AlgorithmKind,
    #[serde(default)]
    pub(super) key: KeyKind,
    /// With `key = "forwarded_ip"` only, and then never empty.
    #[serde(default, deserialize_with = "some_cidrs")]
    pub(super) trusted_proxies: Option<Vec<Cidr>>,
    /// With `key = "forwarded_ip"` only, and then filled in by the validation.
    #[serde(default, deserialize_with = "some_choice")]
    pub(super) forwarded_header: Option<ForwardedHeader>,
    #[serde(default = "default_max_keys")]
    pub(super) max_keys: Count,
    #[serde(default)]
    pub(super) hide_keys: bool,
    #[serde(default, deserialize_with = "choice")]
    pub(super) store: StoreKind,
    /// With `store = "redis"` only, and then required.
    pub(super) redis_url: Option<String>,
    pub(super) redis_prefix: Option<String>,
    #[serde(default, deserialize_with = "optional")]
    pub(super) redis_timeout: Option<Duration>,
    /// With `store = "redis"` only, and then filled in by the validation.
    #[serde(default, deserialize_with = "some_choice")]
    pub(super) redis_fail_mode: Option<RedisFailModeKind>,
    /// With `redis_fail_mode = "fallback"` only, and then required.
    pub(super) fallback_limit_for_period: Option<Count>,
    /// With `store = "redis"` only.
    #[serde(default)]
    pub(super) redis_leases: bool,
    /// With `redis_leases = true` only.
    pub(super) redis_lease_max_share: Option<Count>,
    #[serde(default, deserialize_with = "optional")]
    pub(super) redis_lease_length: Option<Duration>,
}

fn default_max_keys() -> Count {
    Count(DEFAULT_MAX_KEYS as u32)
}

/// Which algorithm a rate limiter uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum AlgorithmKind {
    #[default]
    Gcra,
    FixedWindow,
    SlidingLog,
    SlidingCounter,
}

/// How a rate limiter finds the key of a request (`key`; read by
/// [`fields`](super::fields)).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(super) enum KeyKind {
    #[default]
    PeerIp,
    /// With `trusted_proxies` and `forwarded_header`.
    ForwardedIp,
    Header(http::HeaderName),
    Global,
}

/// The header that trusted proxies forward the client's address in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub(super) enum ForwardedHeader {
    #[default]
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    #[serde(rename = "forwarded")]
    Forwarded,
}

/// Where a rate limiter keeps its state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum StoreKind {
    #[default]
    Memory,
    Redis,
}

/// What a Redis-backed rate limiter does when Redis cannot answer in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RedisFailModeKind {
    #[default]
    Open,
    Closed,
    /// With `fallback_limit_for_period`.
    Fallback,
}

/// `[bulkheads.NAME]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct BulkheadSettings {
    pub(super) max_concurrent_calls: Count<MAX_CALLS>,
    /// For a semaphore bulkhead zero (refuse at once) when absent, for a queue bulkhead no
    /// bound.
    #[serde(default, deserialize_with = "optional")]
    pub(super) max_wait: Option<Duration>,
    /// With a value, a queue bulkhead holding up to this many waiting calls.
    pub(super) queue_capacity: Option<Count<MAX_CALLS>>,
}

impl BulkheadSettings {
    fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        if let Some(wait) = self.max_wait {
            at.span("max_wait", wait)?;
        }
        // A semaphore bulkhead's default written in, so that writing it out is no change.
        if self.queue_capacity.is_none() {
            self.max_wait.get_or_insert(Duration::ZERO);
        }
        Ok(())
    }
}

/// `[routes.NAME]`: the policies one layer holds, and the networks it exempts.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RouteSettings {
    #[serde(deserialize_with = "policies")]
    pub(super) policies: Vec<RoutePolicy>,
    #[serde(default, deserialize_with = "cidrs")]
    pub(super) exempt_networks: Vec<Cidr>,
}

/// One item of a route's `policies` (a table, or a rate limiter's name alone: read by
/// [`fields`](super::fields)).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RoutePolicy {
    pub(super) limiter: String,
    #[serde(default = "Count::one")]
    pub(super) cost: Count,
    #[serde(default)]
    pub(super) shadow: ShadowKind,
}

/// A route policy's shadow mode: `false`, `true` (silent) or `"advertised"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum ShadowKind {
    #[default]
    Off,
    Silent,
    Advertised,
}

/// `[pushbacks.NAME]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct PushbackSettings {
    #[serde(default, deserialize_with = "with_units")]
    pub(super) max_wait: Duration,
    #[serde(default = "default_max_hold", deserialize_with = "with_units")]
    pub(super) max_hold: Duration,
    #[serde(default, deserialize_with = "choice")]
    pub(super) pacing: PacingKind,
}

fn default_max_hold() -> Duration {
    DEFAULT_MAX_HOLD
}

/// A pushback's [`Pacing`](crate::outbound::pushback::Pacing), as the file names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum PacingKind {
    #[default]
    UntilSpent,
    Spread,
}

/// `[client_quotas.NAME]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct ClientQuotaSettings {
    pub(super) limiter: String,
    #[serde(default = "Count::one")]
    pub(super) cost: Count,
}

/// `[adaptive_bulkheads.NAME]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct AdaptiveBulkheadSettings {
    /// The three limits are filled in by the validation.
    pub(super) min_limit: Option<Count<MAX_LIMIT>>,
    pub(super) initial_limit: Option<Count<MAX_LIMIT>>,
    pub(super) max_limit: Option<Count<MAX_LIMIT>>,
    #[serde(default, deserialize_with = "choice")]
    pub(super) algorithm: AdaptiveAlgorithmKind,
    #[serde(default)]
    pub(super) ignore_cancelled_calls: bool,
}

/// The algorithm of an adaptive bulkhead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum AdaptiveAlgorithmKind {
    #[default]
    Aimd,
    Gradient,
}

/// The bulkheads' bound: the semaphore counts permits in 29 bits.
const MAX_CALLS: u32 = u32::MAX >> 3;

/// The adaptive bulkheads' bound: their semaphore counts permits in 31 bits.
const MAX_LIMIT: u32 = u32::MAX >> 1;

/// The path of one instance (`rate_limiters.api`), for errors at its fields.
struct InstancePath<'a>(&'a str);

impl InstancePath<'_> {
    fn err(&self, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(format!("{}.{field}", self.0), message)
    }

    /// A span of `field`, bounded as a quota's are: no setting may reach the ends of a clock's
    /// range.
    fn span(&self, field: &str, span: Duration) -> Result<(), ConfigError> {
        if span > Quota::MAX_SPAN {
            return Err(self.err(field, "is too long (at most 2^60 ns, about 36.5 years)"));
        }
        Ok(())
    }

    /// An error naming `field` and where it applies, if it is set where it does not.
    fn only_with<T>(
        &self,
        field: &str,
        value: &Option<T>,
        allowed: bool,
        what: &str,
    ) -> Result<(), ConfigError> {
        match value {
            Some(_) if !allowed => Err(self.err(field, format!("applies only to {what}"))),
            _ => Ok(()),
        }
    }
}

impl Config {
    /// Checks every instance and the names they give each other: the one validation pass.
    pub(super) fn validate(&mut self) -> Result<(), ConfigError> {
        let at = |section: &str, name: &str| format!("{section}.{name}");
        for (name, s) in &mut self.rate_limiters {
            s.validate(&InstancePath(&at("rate_limiters", name)))?;
        }
        for (name, s) in &mut self.bulkheads {
            s.validate(&InstancePath(&at("bulkheads", name)))?;
        }
        for (name, s) in &self.routes {
            s.validate(&InstancePath(&at("routes", name)))?;
        }
        for (name, s) in &self.pushbacks {
            s.validate(&InstancePath(&at("pushbacks", name)))?;
        }
        for (name, s) in &mut self.adaptive_bulkheads {
            s.validate(&InstancePath(&at("adaptive_bulkheads", name)))?;
        }
        self.check_names()
    }

    /// Checks the names instances give each other: a route's and a client quota's rate
    /// limiters exist, and no bulkhead of either kind shares a name.
    fn check_names(&self) -> Result<(), ConfigError> {
        // Bulkheads of both kinds report under one metric name, by name: names must differ.
        if let Some(name) =
            (self.adaptive_bulkheads.keys()).find(|n| self.bulkheads.contains_key(*n))
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
                let path = format!("routes.{name}.policies[{i}]");
                let limiter = self.limiter(&path, &policy.limiter)?;
                check_cost(
                    &format!("{path}.cost"),
                    policy.cost.0,
                    &policy.limiter,
                    limiter,
                )?;
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
        check_cost(
            &format!("{path}.cost"),
            quota.cost.0,
            &quota.limiter,
            limiter,
        )
    }
}

/// A cost of rate limiter `name` (at `path`) must fit what the limiter can ever grant at once:
/// its burst with GCRA, its permits per window with the window algorithms.
fn check_cost(
    path: &str,
    cost: u32,
    name: &str,
    limiter: &RateLimiterSettings,
) -> Result<(), ConfigError> {
    let quota = limiter.quota(&format!("rate_limiters.{name}"))?;
    let (capacity, what) = match limiter.algorithm {
        AlgorithmKind::Gcra => (quota.burst(), "burst"),
        _ => (quota.permits(), "limit_for_period"),
    };
    if cost > capacity {
        return Err(ConfigError::new(
            path,
            format!(
                "is {cost}, more than the {what} of rate limiter `{name}` ({capacity}): it could \
                 never be granted"
            ),
        ));
    }
    Ok(())
}

impl RateLimiterSettings {
    /// The quota of the limiter at `path`: permits per period, burst and maximum wait, the part
    /// a reload changes in place. An error only for settings the validation refuses.
    pub(super) fn quota(&self, path: &str) -> Result<Quota, ConfigError> {
        let at = InstancePath(path);
        let Count(permits) = self.limit_for_period;
        let mut quota =
            Quota::with_period(permits, self.limit_refresh_period).map_err(|e| {
                match e.field() {
                    "period" => at.err("limit_refresh_period", e.to_string()),
                    _ => at.err("limit_for_period", e.to_string()),
                }
            })?;
        if let Some(Count(burst)) = self.burst {
            quota = quota
                .with_burst(burst)
                .map_err(|e| at.err("burst", e.to_string()))?;
        }
        if let Some(wait) = self.max_wait {
            quota = quota
                .with_max_wait(wait)
                .map_err(|e| at.err("max_wait", e.to_string()))?;
        }
        Ok(quota)
    }

    fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        self.quota(at.0)?;
        let forwarded = self.key == KeyKind::ForwardedIp;
        let what = "key = \"forwarded_ip\"";
        at.only_with("trusted_proxies", &self.trusted_proxies, forwarded, what)?;
        at.only_with("forwarded_header", &self.forwarded_header, forwarded, what)?;
        if forwarded {
            // Never trust a forwarding header unless the operator named who may send it.
            match &self.trusted_proxies {
                None => return Err(at.err("trusted_proxies", "is required")),
                Some(proxies) if proxies.is_empty() => {
                    return Err(at.err("trusted_proxies", "must name at least one proxy"))
                }
                Some(_) => {}
            }
            self.forwarded_header.get_or_insert_default();
        }
        self.validate_store(at)
    }

    fn validate_store(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        let redis = self.store == StoreKind::Redis;
        let what = "store = \"redis\"";
        at.only_with("redis_url", &self.redis_url, redis, what)?;
        at.only_with("redis_prefix", &self.redis_prefix, redis, what)?;
        at.only_with("redis_timeout", &self.redis_timeout, redis, what)?;
        at.only_with("redis_fail_mode", &self.redis_fail_mode, redis, what)?;
        let local = "fallback_limit_for_period";
        at.only_with(local, &self.fallback_limit_for_period, redis, what)?;
        let leases = self.redis_leases.then_some(());
        at.only_with("redis_leases", &leases, redis, what)?;
        let what = "redis_leases = true";
        let share = "redis_lease_max_share";
        at.only_with(share, &self.redis_lease_max_share, self.redis_leases, what)?;
        let length = "redis_lease_length";
        at.only_with(length, &self.redis_lease_length, self.redis_leases, what)?;
        if self.redis_leases && self.algorithm == AlgorithmKind::SlidingLog {
            let why = "cannot be exact with algorithm = \"sliding_log\"";
            return Err(at.err("redis_leases", why));
        }
        if !redis {
            return Ok(());
        }
        if cfg!(not(feature = "redis")) {
            return Err(at.err(
                "store",
                "`redis` needs the crate's `redis` feature, which this build lacks",
            ));
        }
        let fallback = *self.redis_fail_mode.get_or_insert_default() == RedisFailModeKind::Fallback;
        let what = "redis_fail_mode = \"fallback\"";
        at.only_with(local, &self.fallback_limit_for_period, fallback, what)?;
        if fallback && self.fallback_limit_for_period.is_none() {
            return Err(at.err(local, "is required with redis_fail_mode = \"fallback\""));
        }
        if self.redis_url.is_none() {
            return Err(at.err("redis_url", "is required"));
        }
        Ok(())
    }
}

impl RouteSettings {
    fn validate(&self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        if self.policies.is_empty() {
            return Err(at.err("policies", "must name at least one rate limiter"));
        }
        for (i, policy) in self.policies.iter().enumerate() {
            if self.policies[..i]
                .iter()
                .any(|p| p.limiter == policy.limiter)
            {
                return Err(at.err(
                    &format!("policies[{i}]"),
                    format!("names `{}` a second time", policy.limiter),
                ));
            }
        }
        if !self.exempt_networks.is_empty() && cfg!(not(feature = "axum")) {
            return Err(at.err(
                "exempt_networks",
                "needs the `axum` feature (the TCP peer comes from axum's ConnectInfo)",
            ));
        }
        Ok(())
    }
}

impl PushbackSettings {
    fn validate(&self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        at.span("max_wait", self.max_wait)?;
        at.span("max_hold", self.max_hold)?;
        if self.max_hold.is_zero() {
            return Err(at.err(
                "max_hold",
                "must be more than zero: a zero max_hold would cut every hold the dependency \
                 asks for to nothing",
            ));
        }
        Ok(())
    }
}

impl AdaptiveBulkheadSettings {
    /// The lowest, initial and highest limit: each as written, or its default within the
    /// others.
    pub(super) fn limits(&self) -> (usize, usize, usize) {
        let limit = |value: Option<Count<MAX_LIMIT>>, default: usize| {
            value.map_or(default, |Count(n)| n as usize)
        };
        let min = limit(self.min_limit, 1);
        let max = limit(self.max_limit, 256.max(min));
        (
            min,
            limit(self.initial_limit, 8.clamp(min, max.max(min))),
            max,
        )
    }

    fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        if cfg!(not(feature = "adaptive")) {
            return Err(ConfigError::new(
                at.0,
                "an adaptive bulkhead needs the crate's `adaptive` feature, which this build lacks",
            ));
        }
        let (min, initial, max) = self.limits();
        if min > max {
            return Err(at.err("min_limit", format!("is {min}, above max_limit ({max})")));
        }
        if !(min..=max).contains(&initial) {
            return Err(at.err(
                "initial_limit",
                format!("is {initial}, outside min_limit..=max_limit ({min}..={max})"),
            ));
        }
        let count = |n: usize| Some(Count(n as u32));
        (self.min_limit, self.initial_limit, self.max_limit) =
            (count(min), count(initial), count(max));
        Ok(())
    }
}
