//! The file as serde reads it, one struct per kind with every field as written, and the one
//! validation pass that turns it into a [`Config`].
//!
//! Required fields are `Option`s, so that a missing one is an error at its own path; the
//! readers of [`fields`](super::fields) check what one value alone can say (a count's bounds,
//! a duration's unit).

use std::collections::BTreeMap;
use std::time::Duration;

use super::duration::{optional, with_units};
use super::fields::{choice, cidrs, instances, Count};
use super::{
    AdaptiveAlgorithmKind, AdaptiveBulkheadSettings, AlgorithmKind, BulkheadSettings,
    ClientQuotaSettings, Config, ConfigError, ForwardedHeader, KeyKind, PushbackSettings,
    RateLimiterSettings, RedisFailModeKind, RedisSettings, RoutePolicy, RouteSettings, ShadowKind,
    StoreKind,
};
use crate::limiter::DEFAULT_MAX_KEYS;
use crate::outbound::pushback::Pacing;
use crate::rate_limit::Cidr;
use crate::Quota;

/// The whole file: a table of named instances per kind.
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct File {
    #[serde(deserialize_with = "instances")]
    rate_limiters: BTreeMap<String, RateLimiterFile>,
    #[serde(deserialize_with = "instances")]
    bulkheads: BTreeMap<String, BulkheadFile>,
    #[serde(deserialize_with = "instances")]
    routes: BTreeMap<String, RouteFile>,
    #[serde(deserialize_with = "instances")]
    pushbacks: BTreeMap<String, PushbackFile>,
    #[serde(deserialize_with = "instances")]
    client_quotas: BTreeMap<String, ClientQuotaFile>,
    #[serde(deserialize_with = "instances")]
    adaptive_bulkheads: BTreeMap<String, AdaptiveBulkheadFile>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
struct RateLimiterFile {
    limit_for_period: Count,
    #[serde(deserialize_with = "with_units")]
    limit_refresh_period: Duration,
    burst: Option<Count>,
    #[serde(default, deserialize_with = "optional")]
    max_wait: Option<Duration>,
    #[serde(default, deserialize_with = "choice")]
    algorithm: Option<AlgorithmKind>,
    key: Option<String>,
    #[serde(default, deserialize_with = "cidrs")]
    trusted_proxies: Option<Vec<Cidr>>,
    #[serde(default, deserialize_with = "choice")]
    forwarded_header: Option<ForwardedHeader>,
    max_keys: Option<Count>,
    #[serde(default)]
    hide_keys: bool,
    #[serde(default, deserialize_with = "choice")]
    store: Option<StoreName>,
    redis_url: Option<String>,
    redis_prefix: Option<String>,
    #[serde(default, deserialize_with = "optional")]
    redis_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "choice")]
    redis_fail_mode: Option<FailModeName>,
    fallback_limit_for_period: Option<Count>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum StoreName {
    Memory,
    Redis,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum FailModeName {
    Open,
    Closed,
    Fallback,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
struct BulkheadFile {
    max_concurrent_calls: Count<MAX_CALLS>,
    #[serde(default, deserialize_with = "optional")]
    max_wait: Option<Duration>,
    queue_capacity: Option<Count<MAX_CALLS>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
struct RouteFile {
    policies: Vec<PolicyItem>,
    #[serde(default, deserialize_with = "cidrs")]
    exempt_networks: Option<Vec<Cidr>>,
}

/// One item of a route's `policies`: a table, or a rate limiter's name alone (read as a table
/// naming only `limiter`).
pub(super) struct PolicyItem(pub(super) PolicyTable);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyTable {
    pub(super) limiter: String,
    pub(super) cost: Option<Count>,
    #[serde(default)]
    pub(super) shadow: ShadowKind,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
struct PushbackFile {
    #[serde(default, deserialize_with = "optional")]
    max_wait: Option<Duration>,
    #[serde(default, deserialize_with = "optional")]
    max_hold: Option<Duration>,
    #[serde(default, deserialize_with = "choice")]
    pacing: Option<PacingName>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum PacingName {
    UntilSpent,
    Spread,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
struct ClientQuotaFile {
    limiter: String,
    cost: Option<Count>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
struct AdaptiveBulkheadFile {
    min_limit: Option<Count<MAX_LIMIT>>,
    initial_limit: Option<Count<MAX_LIMIT>>,
    max_limit: Option<Count<MAX_LIMIT>>,
    #[serde(default, deserialize_with = "choice")]
    algorithm: Option<AdaptiveAlgorithmKind>,
    #[serde(default)]
    ignore_cancelled_calls: bool,
}

/// The path of one instance (`rate_limiters.api`), for errors at its fields.
struct InstancePath<'a>(&'a str);

impl InstancePath<'_> {
    fn err(&self, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(format!("{}.{field}", self.0), message)
    }

    fn required<T>(&self, field: &str, value: Option<T>) -> Result<T, ConfigError> {
        value.ok_or_else(|| self.err(field, "is required"))
    }

    /// `Some` only where `allowed`; otherwise an error naming `field` and where it applies.
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

/// The bulkheads' bound: the semaphore counts permits in 29 bits.
const MAX_CALLS: u32 = u32::MAX >> 3;

/// The adaptive bulkheads' bound: their semaphore counts permits in 31 bits.
const MAX_LIMIT: u32 = u32::MAX >> 1;

impl File {
    /// Checks every instance and the names they give each other: the one validation pass.
    pub(super) fn validate(self) -> Result<Config, ConfigError> {
        fn each<F, S>(
            section: &str,
            files: BTreeMap<String, F>,
            check: impl Fn(F, &InstancePath<'_>) -> Result<S, ConfigError>,
        ) -> Result<BTreeMap<String, S>, ConfigError> {
            files
                .into_iter()
                .map(|(name, file)| {
                    let path = format!("{section}.{name}");
                    Ok((name, check(file, &InstancePath(&path))?))
                })
                .collect()
        }
        let config = Config {
            rate_limiters: each(
                "rate_limiters",
                self.rate_limiters,
                RateLimiterFile::validate,
            )?,
            bulkheads: each("bulkheads", self.bulkheads, BulkheadFile::validate)?,
            routes: each("routes", self.routes, RouteFile::validate)?,
            pushbacks: each("pushbacks", self.pushbacks, PushbackFile::validate)?,
            client_quotas: each(
                "client_quotas",
                self.client_quotas,
                ClientQuotaFile::validate,
            )?,
            adaptive_bulkheads: each(
                "adaptive_bulkheads",
                self.adaptive_bulkheads,
                AdaptiveBulkheadFile::validate,
            )?,
        };
        config.check_names()?;
        Ok(config)
    }
}

impl RateLimiterFile {
    fn validate(self, at: &InstancePath<'_>) -> Result<RateLimiterSettings, ConfigError> {
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
        Ok(RateLimiterSettings {
            quota,
            algorithm: self.algorithm.unwrap_or_default(),
            key: self.key(at)?,
            max_keys: (self.max_keys).map_or(DEFAULT_MAX_KEYS, |Count(n)| n as usize),
            hide_keys: self.hide_keys,
            store: self.store(at)?,
        })
    }

    fn key(&self, at: &InstancePath<'_>) -> Result<KeyKind, ConfigError> {
        let key = match self.key.as_deref().unwrap_or("peer_ip") {
            "peer_ip" => KeyKind::PeerIp,
            "global" => KeyKind::Global,
            "forwarded_ip" => {
                // Never trust a forwarding header unless the operator named who may send it.
                let trusted_proxies =
                    at.required("trusted_proxies", self.trusted_proxies.clone())?;
                if trusted_proxies.is_empty() {
                    return Err(at.err("trusted_proxies", "must name at least one proxy"));
                }
                KeyKind::ForwardedIp {
                    header: self.forwarded_header.unwrap_or_default(),
                    trusted_proxies,
                }
            }
            other => match other.strip_prefix("header:") {
                Some(name) => {
                    KeyKind::Header(http::HeaderName::try_from(name.trim()).map_err(|_| {
                        at.err("key", format!("`{name}` is not a valid header name"))
                    })?)
                }
                None => {
                    return Err(at.err(
                        "key",
                        format!(
                            "unknown key `{other}`; expected peer_ip, forwarded_ip, \
                             header:<name> or global"
                        ),
                    ))
                }
            },
        };
        let forwarded = matches!(key, KeyKind::ForwardedIp { .. });
        let what = "key = \"forwarded_ip\"";
        at.only_with("trusted_proxies", &self.trusted_proxies, forwarded, what)?;
        at.only_with("forwarded_header", &self.forwarded_header, forwarded, what)?;
        Ok(key)
    }

    fn store(&self, at: &InstancePath<'_>) -> Result<StoreKind, ConfigError> {
        let redis = matches!(self.store, Some(StoreName::Redis));
        let what = "store = \"redis\"";
        at.only_with("redis_url", &self.redis_url, redis, what)?;
        at.only_with("redis_prefix", &self.redis_prefix, redis, what)?;
        at.only_with("redis_timeout", &self.redis_timeout, redis, what)?;
        at.only_with("redis_fail_mode", &self.redis_fail_mode, redis, what)?;
        let local = "fallback_limit_for_period";
        at.only_with(local, &self.fallback_limit_for_period, redis, what)?;
        if !redis {
            return Ok(StoreKind::Memory);
        }
        if cfg!(not(feature = "redis")) {
            return Err(at.err(
                "store",
                "`redis` needs the crate's `redis` feature, which this build lacks",
            ));
        }
        let fallback = matches!(self.redis_fail_mode, Some(FailModeName::Fallback));
        let what = "redis_fail_mode = \"fallback\"";
        at.only_with(local, &self.fallback_limit_for_period, fallback, what)?;
        let fail_mode = match self.redis_fail_mode {
            None | Some(FailModeName::Open) => RedisFailModeKind::Open,
            Some(FailModeName::Closed) => RedisFailModeKind::Closed,
            Some(FailModeName::Fallback) => {
                let Count(permits) = self.fallback_limit_for_period.ok_or_else(|| {
                    at.err(local, "is required with redis_fail_mode = \"fallback\"")
                })?;
                RedisFailModeKind::Fallback(permits)
            }
        };
        Ok(StoreKind::Redis(RedisSettings {
            url: at.required("redis_url", self.redis_url.clone())?,
            prefix: self.redis_prefix.clone(),
            timeout: self.redis_timeout,
            fail_mode,
        }))
    }
}

impl BulkheadFile {
    fn validate(self, _: &InstancePath<'_>) -> Result<BulkheadSettings, ConfigError> {
        Ok(BulkheadSettings {
            max_concurrent_calls: self.max_concurrent_calls.0 as usize,
            max_wait: self.max_wait,
            queue_capacity: self.queue_capacity.map(|Count(n)| n as usize),
        })
    }
}

impl RouteFile {
    fn validate(self, at: &InstancePath<'_>) -> Result<RouteSettings, ConfigError> {
        let items = self.policies;
        if items.is_empty() {
            return Err(at.err("policies", "must name at least one rate limiter"));
        }
        let mut policies: Vec<RoutePolicy> = Vec::with_capacity(items.len());
        for (i, PolicyItem(item)) in items.into_iter().enumerate() {
            let field = format!("policies[{i}]");
            let policy = RoutePolicy {
                limiter: item.limiter,
                cost: item.cost.map_or(1, |Count(n)| n),
                shadow: item.shadow,
            };
            if policies.iter().any(|p| p.limiter == policy.limiter) {
                return Err(at.err(&field, format!("names `{}` a second time", policy.limiter)));
            }
            policies.push(policy);
        }
        let exempt_networks = self.exempt_networks.unwrap_or_default();
        if !exempt_networks.is_empty() && cfg!(not(feature = "axum")) {
            return Err(at.err(
                "exempt_networks",
                "needs the `axum` feature (the TCP peer comes from axum's ConnectInfo)",
            ));
        }
        Ok(RouteSettings {
            policies,
            exempt_networks,
        })
    }
}

impl PushbackFile {
    fn validate(self, at: &InstancePath<'_>) -> Result<PushbackSettings, ConfigError> {
        let mut settings = PushbackSettings::default();
        // Bounded as a quota's spans are: no setting may reach the ends of a clock's range.
        let bounded = |field: &str, span: Duration| match span > Quota::MAX_SPAN {
            true => Err(at.err(field, "is too long (at most 2^60 ns, about 36.5 years)")),
            false => Ok(span),
        };
        if let Some(wait) = self.max_wait {
            settings.max_wait = bounded("max_wait", wait)?;
        }
        if let Some(hold) = self.max_hold {
            settings.max_hold = bounded("max_hold", hold)?;
            if hold.is_zero() {
                return Err(at.err(
                    "max_hold",
                    "must be more than zero: a zero max_hold would cut every hold the \
                     dependency asks for to nothing",
                ));
            }
        }
        settings.pacing = match self.pacing {
            None | Some(PacingName::UntilSpent) => Pacing::UntilSpent,
            Some(PacingName::Spread) => Pacing::Spread,
        };
        Ok(settings)
    }
}

impl ClientQuotaFile {
    fn validate(self, _: &InstancePath<'_>) -> Result<ClientQuotaSettings, ConfigError> {
        Ok(ClientQuotaSettings {
            limiter: self.limiter,
            cost: self.cost.map_or(1, |Count(n)| n),
        })
    }
}

impl AdaptiveBulkheadFile {
    fn validate(self, at: &InstancePath<'_>) -> Result<AdaptiveBulkheadSettings, ConfigError> {
        if cfg!(not(feature = "adaptive")) {
            return Err(ConfigError::new(
                at.0,
                "an adaptive bulkhead needs the crate's `adaptive` feature, which this build lacks",
            ));
        }
        let limit = |value: Option<Count<MAX_LIMIT>>, default: usize| {
            value.map_or(default, |Count(n)| n as usize)
        };
        let min_limit = limit(self.min_limit, 1);
        let max_limit = limit(self.max_limit, 256.max(min_limit));
        if min_limit > max_limit {
            return Err(at.err(
                "min_limit",
                format!("is {min_limit}, above max_limit ({max_limit})"),
            ));
        }
        let initial_limit = limit(self.initial_limit, 8.clamp(min_limit, max_limit));
        if !(min_limit..=max_limit).contains(&initial_limit) {
            return Err(at.err(
                "initial_limit",
                format!(
                    "is {initial_limit}, outside min_limit..=max_limit ({min_limit}..={max_limit})"
                ),
            ));
        }
        Ok(AdaptiveBulkheadSettings {
            min_limit,
            initial_limit,
            max_limit,
            algorithm: self.algorithm.unwrap_or_default(),
            ignore_cancelled_calls: self.ignore_cancelled_calls,
        })
    }
}
