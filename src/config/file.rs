//! The file as serde reads it, one struct per kind with every field as written, and the one
//! validation pass that turns it into a [`Config`].
//!
//! Integers are read as TOML's `i64` and checked here, so that a `0`, a `-3` or a number too
//! large gets a message saying the bound; required fields are `Option`s, so that a missing one
//! is an error at its own path.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};

use super::duration::with_units;
use super::{
    AdaptiveAlgorithmKind, AdaptiveBulkheadSettings, AlgorithmKind, BulkheadSettings,
    ClientQuotaSettings, Config, ConfigError, ForwardedHeader, KeyKind, PushbackSettings,
    RateLimiterSettings, RedisFailModeKind, RedisSettings, RoutePolicy, RouteSettings, ShadowKind,
    StoreKind,
};
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
    limit_for_period: Option<Integer>,
    #[serde(default, deserialize_with = "with_units")]
    limit_refresh_period: Option<Duration>,
    burst: Option<Integer>,
    #[serde(default, deserialize_with = "with_units")]
    max_wait: Option<Duration>,
    #[serde(default, deserialize_with = "choice")]
    algorithm: Option<AlgorithmKind>,
    key: Option<String>,
    #[serde(default, deserialize_with = "cidrs")]
    trusted_proxies: Option<Vec<Cidr>>,
    #[serde(default, deserialize_with = "choice")]
    forwarded_header: Option<ForwardedHeader>,
    max_keys: Option<Integer>,
    #[serde(default)]
    hide_keys: bool,
    #[serde(default, deserialize_with = "choice")]
    store: Option<StoreName>,
    redis_url: Option<String>,
    redis_prefix: Option<String>,
    #[serde(default, deserialize_with = "with_units")]
    redis_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "choice")]
    redis_fail_mode: Option<FailModeName>,
    fallback_limit_for_period: Option<Integer>,
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
    max_concurrent_calls: Option<Integer>,
    #[serde(default, deserialize_with = "with_units")]
    max_wait: Option<Duration>,
    queue_capacity: Option<Integer>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
struct RouteFile {
    policies: Option<Vec<PolicyFile>>,
    #[serde(default, deserialize_with = "cidrs")]
    exempt_networks: Option<Vec<Cidr>>,
}

/// One item of a route's `policies`: a rate limiter's name, or a table.
enum PolicyFile {
    Name(String),
    Table(PolicyTable),
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyTable {
    limiter: Option<String>,
    cost: Option<Integer>,
    #[serde(default)]
    shadow: ShadowKind,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
struct PushbackFile {
    #[serde(default, deserialize_with = "with_units")]
    max_wait: Option<Duration>,
    #[serde(default, deserialize_with = "with_units")]
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
    limiter: Option<String>,
    cost: Option<Integer>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
struct AdaptiveBulkheadFile {
    min_limit: Option<Integer>,
    initial_limit: Option<Integer>,
    max_limit: Option<Integer>,
    #[serde(default, deserialize_with = "choice")]
    algorithm: Option<AdaptiveAlgorithmKind>,
    #[serde(default)]
    ignore_cancelled_calls: bool,
}

/// A TOML integer, checked against its field's bounds by the validation pass; in a type error
/// it is "an integer" (serde's own name for `i64` would be "i64").
#[derive(Clone, Copy)]
struct Integer(i64);

impl<'de> Deserialize<'de> for Integer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct AnInteger;
        impl Visitor<'_> for AnInteger {
            type Value = Integer;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Integer, E> {
                Ok(Integer(n))
            }
        }
        d.deserialize_i64(AnInteger)
    }
}

/// The fields of one instance, for errors at their paths.
struct At<'a>(&'a str);

impl At<'_> {
    fn err(&self, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(format!("{}.{field}", self.0), message)
    }

    fn required<T>(&self, field: &str, value: Option<T>) -> Result<T, ConfigError> {
        value.ok_or_else(|| self.err(field, "is required"))
    }

    /// An integer from 1 to `max`.
    fn count(&self, field: &str, Integer(value): Integer, max: u32) -> Result<u32, ConfigError> {
        match u32::try_from(value) {
            Ok(n) if n > max => Err(self.err(field, format!("must be at most {max}, not {n}"))),
            Ok(n) if n >= 1 => Ok(n),
            _ if value < 1 => Err(self.err(field, format!("must be at least 1, not {value}"))),
            _ => Err(self.err(field, format!("must be at most {max}, not {value}"))),
        }
    }

    fn optional_count(
        &self,
        field: &str,
        value: Option<Integer>,
        max: u32,
    ) -> Result<Option<u32>, ConfigError> {
        value.map(|n| self.count(field, n, max)).transpose()
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

impl File {
    /// Checks every instance and the names they give each other: the one validation pass.
    pub(super) fn validate(self) -> Result<Config, ConfigError> {
        fn each<F, S>(
            section: &str,
            files: BTreeMap<String, F>,
            check: impl Fn(F, &At<'_>) -> Result<S, ConfigError>,
        ) -> Result<BTreeMap<String, S>, ConfigError> {
            files
                .into_iter()
                .map(|(name, file)| {
                    let path = format!("{section}.{name}");
                    Ok((name, check(file, &At(&path))?))
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
    fn validate(self, at: &At<'_>) -> Result<RateLimiterSettings, ConfigError> {
        let permits = at.count(
            "limit_for_period",
            at.required("limit_for_period", self.limit_for_period)?,
            u32::MAX,
        )?;
        let period = at.required("limit_refresh_period", self.limit_refresh_period)?;
        let mut quota = Quota::with_period(permits, period).map_err(|e| match e.field() {
            "period" => at.err("limit_refresh_period", e.to_string()),
            _ => at.err("limit_for_period", e.to_string()),
        })?;
        if let Some(burst) = at.optional_count("burst", self.burst, u32::MAX)? {
            quota = quota
                .with_burst(burst)
                .map_err(|e| at.err("burst", e.to_string()))?;
        }
        if let Some(wait) = self.max_wait {
            quota = quota
                .with_max_wait(wait)
                .map_err(|e| at.err("max_wait", e.to_string()))?;
        }
        let max_keys = at.optional_count("max_keys", self.max_keys, u32::MAX)?;
        Ok(RateLimiterSettings {
            quota,
            algorithm: self.algorithm.unwrap_or_default(),
            key: self.key(at)?,
            max_keys: max_keys.map_or(crate::limiter::DEFAULT_MAX_KEYS, |n| n as usize),
            hide_keys: self.hide_keys,
            store: self.store(at)?,
        })
    }

    fn key(&self, at: &At<'_>) -> Result<KeyKind, ConfigError> {
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

    fn store(&self, at: &At<'_>) -> Result<StoreKind, ConfigError> {
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
                let permits = self.fallback_limit_for_period.ok_or_else(|| {
                    at.err(local, "is required with redis_fail_mode = \"fallback\"")
                })?;
                RedisFailModeKind::Fallback(at.count(local, permits, u32::MAX)?)
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
    fn validate(self, at: &At<'_>) -> Result<BulkheadSettings, ConfigError> {
        let calls = at.required("max_concurrent_calls", self.max_concurrent_calls)?;
        Ok(BulkheadSettings {
            max_concurrent_calls: at.count("max_concurrent_calls", calls, MAX_CALLS)? as usize,
            max_wait: self.max_wait,
            queue_capacity: at
                .optional_count("queue_capacity", self.queue_capacity, MAX_CALLS)?
                .map(|n| n as usize),
        })
    }
}

impl RouteFile {
    fn validate(self, at: &At<'_>) -> Result<RouteSettings, ConfigError> {
        let items = at.required("policies", self.policies)?;
        if items.is_empty() {
            return Err(at.err("policies", "must name at least one rate limiter"));
        }
        let mut policies: Vec<RoutePolicy> = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let field = format!("policies[{i}]");
            let policy = match item {
                PolicyFile::Name(limiter) => RoutePolicy {
                    limiter,
                    cost: 1,
                    shadow: ShadowKind::Off,
                },
                PolicyFile::Table(table) => {
                    let item_path = format!("{}.{field}", at.0);
                    let item = At(&item_path);
                    RoutePolicy {
                        limiter: item.required("limiter", table.limiter)?,
                        cost: item
                            .optional_count("cost", table.cost, u32::MAX)?
                            .unwrap_or(1),
                        shadow: table.shadow,
                    }
                }
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
    fn validate(self, at: &At<'_>) -> Result<PushbackSettings, ConfigError> {
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
    fn validate(self, at: &At<'_>) -> Result<ClientQuotaSettings, ConfigError> {
        Ok(ClientQuotaSettings {
            limiter: at.required("limiter", self.limiter)?,
            cost: at.optional_count("cost", self.cost, u32::MAX)?.unwrap_or(1),
        })
    }
}

impl AdaptiveBulkheadFile {
    fn validate(self, at: &At<'_>) -> Result<AdaptiveBulkheadSettings, ConfigError> {
        if cfg!(not(feature = "adaptive")) {
            return Err(ConfigError::new(
                at.0,
                "an adaptive bulkhead needs the crate's `adaptive` feature, which this build lacks",
            ));
        }
        // As the bulkheads' own bound: the semaphore counts permits in 31 bits.
        let limit = |field: &str, value: Option<Integer>, default: usize| {
            let n = at.optional_count(field, value, u32::MAX >> 1)?;
            Ok::<_, ConfigError>(n.map_or(default, |n| n as usize))
        };
        let min_limit = limit("min_limit", self.min_limit, 1)?;
        let max_limit = limit("max_limit", self.max_limit, 256.max(min_limit))?;
        if min_limit > max_limit {
            return Err(at.err(
                "min_limit",
                format!("is {min_limit}, above max_limit ({max_limit})"),
            ));
        }
        let initial_limit = limit(
            "initial_limit",
            self.initial_limit,
            8.clamp(min_limit, max_limit),
        )?;
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

/// Reads a choice among names, such as `algorithm = "gcra"`, from a string only: serde's enums
/// would also take a table (`algorithm = { gcra = {} }`), which is no way to write a choice.
fn choice<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let name = String::deserialize(d)?;
    T::deserialize(de::IntoDeserializer::<D::Error>::into_deserializer(name)).map(Some)
}

/// Reads a section: a table of named instances.
fn instances<'de, D, T>(d: D) -> Result<BTreeMap<String, T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Instances<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Instances<T> {
        type Value = BTreeMap<String, T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table of named instances")
        }

        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
            let mut out = BTreeMap::new();
            while let Some((name, settings)) = map.next_entry()? {
                out.insert(name, settings);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Instances(PhantomData))
}

/// Reads a list of networks in CIDR notation. Each item is checked here, after toml has read
/// it, so that an error is the field's (`trusted_proxies`), whichever item is wrong.
fn cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Cidr>>, D::Error> {
    struct Cidrs;
    impl<'de> Visitor<'de> for Cidrs {
        type Value = Vec<Cidr>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of CIDR strings")
        }

        fn visit_seq<S: de::SeqAccess<'de>>(self, mut items: S) -> Result<Vec<Cidr>, S::Error> {
            let mut out = Vec::new();
            while let Some(item) = items.next_element::<toml::Value>()? {
                let Some(text) = item.as_str() else {
                    let kind = item.type_str();
                    return Err(de::Error::custom(format!(
                        "must be a list of CIDR strings, not of {kind}s"
                    )));
                };
                let cidr = text.parse();
                out.push(cidr.map_err(|e| de::Error::custom(format!("`{text}`: {e}")))?);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Cidrs).map(Some)
}

impl<'de> Deserialize<'de> for PolicyFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Item;
        impl<'de> Visitor<'de> for Item {
            type Value = PolicyFile;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate limiter name or a table with `limiter`")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<PolicyFile, E> {
                Ok(PolicyFile::Name(name.to_owned()))
            }

            fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<PolicyFile, M::Error> {
                let table = PolicyTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(PolicyFile::Table(table))
            }
        }
        d.deserialize_any(Item)
    }
}

impl<'de> Deserialize<'de> for ShadowKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Shadow;
        impl Visitor<'_> for Shadow {
            type Value = ShadowKind;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or \"advertised\"")
            }

            fn visit_bool<E: de::Error>(self, shadow: bool) -> Result<ShadowKind, E> {
                Ok(match shadow {
                    true => ShadowKind::Silent,
                    false => ShadowKind::Off,
                })
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<ShadowKind, E> {
                match s {
                    "advertised" => Ok(ShadowKind::Advertised),
                    other => Err(E::custom(format!(
                        "must be true, false or \"advertised\", not \"{other}\""
                    ))),
                }
            }
        }
        d.deserialize_any(Shadow)
    }
}
