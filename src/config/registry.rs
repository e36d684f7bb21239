//! The registry of named instances built from a configuration file.

use crate::sync::Mutex;
use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;

use crate::head::RequestHead;
use http::HeaderValue;

#[cfg(feature = "adaptive")]
use super::breaker::build_breaker;
use super::build::*;
use super::file::{Config, RouteSettings};
#[cfg(feature = "adaptive")]
use super::overload::build_overload;
use super::ConfigError;
#[cfg(feature = "adaptive")]
use crate::bulkhead::adaptive::AdaptiveBulkhead;
use crate::bulkhead::{Bulkhead, BulkheadBuilder};
use crate::limiter::BoxLimiter;
use crate::observe::Observed;
use crate::outbound::pushback::Pushback;
use crate::outbound::quota::{ClientQuotaLayer, QuotaKey};
#[cfg(feature = "adaptive")]
use crate::overload::Overload;
use crate::rate_limit::{GlobalKey, HeaderKey, KeyError, KeyExtractor, Policy, RateLimitLayer};

/// The key of a rate limiter built from configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigKey {
    /// A client address (IPv6 by /64).
    Ip(IpAddr),
    /// The value of the configured header: a copy of its bytes, never a view into the request.
    Header(HeaderValue),
    /// The single key of `key = "global"`.
    Global,
}

#[derive(Clone, Debug)]
pub(super) enum Extract {
    #[cfg(feature = "axum")]
    Peer(crate::rate_limit::PeerIp),
    #[cfg(feature = "axum")]
    Forwarded(crate::rate_limit::ForwardedIp),
    Header(HeaderKey),
    Global,
}

/// The key extractor that a configured rate limiter uses, chosen by its `key` field.
#[derive(Clone, Debug)]
pub struct ConfigKeyExtractor(pub(super) Extract);

impl KeyExtractor for ConfigKeyExtractor {
    type Key = ConfigKey;

    fn extract(&self, head: &RequestHead<'_>) -> Result<ConfigKey, KeyError> {
        match &self.0 {
            #[cfg(feature = "axum")]
            Extract::Peer(x) => x.extract(head).map(ConfigKey::Ip),
            #[cfg(feature = "axum")]
            Extract::Forwarded(x) => x.extract(head).map(ConfigKey::Ip),
            Extract::Header(x) => x.extract(head).map(ConfigKey::Header),
            Extract::Global => GlobalKey.extract(head).map(|()| ConfigKey::Global),
        }
    }
}

/// A configured rate limiter: any algorithm, in memory, named and observed.
pub type ConfiguredLimiter = Observed<BoxLimiter<ConfigKey>>;

/// A configured rate limiter as a policy: its name, its key, its limiter.
pub type ConfiguredPolicy = Policy<ConfigKeyExtractor, ConfiguredLimiter>;

/// The layer of a configured rate limiter.
pub type ConfiguredRateLimitLayer = RateLimitLayer<ConfiguredPolicy>;

/// The key of every call through a configured client quota: [`ConfigKey::Global`], the key of
/// its rate limiter (which must have `key = "global"`).
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalConfigKey;

impl<Req> QuotaKey<Req> for GlobalConfigKey {
    type Key = ConfigKey;

    fn key(&self, _: &Req) -> ConfigKey {
        ConfigKey::Global
    }
}

/// The layer of a configured client quota: its rate limiter, one key for every call, the
/// configured cost.
pub type ConfiguredClientQuotaLayer = ClientQuotaLayer<ConfiguredLimiter, GlobalConfigKey>;

/// A name that the configuration does not define.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownInstance {
    kind: &'static str,
    name: String,
}

impl UnknownInstance {
    /// The name that was asked for.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for UnknownInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no {} named `{}` is configured", self.kind, self.name)
    }
}

impl Error for UnknownInstance {}

/// Each instance of a section built by `build`, under its name.
fn build_each<T, U>(
    instances: &BTreeMap<String, T>,
    mut build: impl FnMut(&str, &T) -> Result<U, ConfigError>,
) -> Result<BTreeMap<String, U>, ConfigError> {
    (instances.iter())
        .map(|(name, settings)| Ok((name.clone(), build(name, settings)?)))
        .collect()
}

/// Instance `name` of a kind, or the error naming what was asked for.
fn find<'a, T>(
    instances: &'a BTreeMap<String, T>,
    kind: &'static str,
    name: &str,
) -> Result<&'a T, UnknownInstance> {
    instances.get(name).ok_or_else(|| UnknownInstance {
        kind,
        name: name.to_owned(),
    })
}

pub(super) struct NamedLimiter {
    pub(super) limiter: ConfiguredLimiter,
    pub(super) extractor: ConfigKeyExtractor,
    /// For a limiter whose state lives in Redis, the same limiter: its counts (how many
    /// decisions Redis did not give, what its leases did), and the bounds a quota must fit.
    #[cfg(feature = "redis")]
    pub(super) redis: Option<crate::redis::RedisRateLimiter>,
}

impl NamedLimiter {
    /// How many decisions the limiter's shared store (Redis) did not give; `None` in memory.
    pub(super) fn store_failures(&self) -> Option<u64> {
        #[cfg(feature = "redis")]
        return self.redis.as_ref().map(|redis| redis.counts().failures);
        #[cfg(not(feature = "redis"))]
        None
    }
}

/// Named rate limiters and bulkheads, built once from a TOML file (see [the module](super) for
/// its fields) and shared by every layer taken from it.
///
/// Rate limiters and routes give layers ([`rate_limit_layer`](Self::rate_limit_layer),
/// [`route_layer`](Self::route_layer)), as client quotas do
/// ([`client_quota_layer`](Self::client_quota_layer)); bulkheads and pushbacks are instances,
/// each with its `layer()`.
///
/// ```
/// use tower_bulwark::config::Registry;
///
/// let registry = Registry::from_toml_str(r#"
///     [rate_limiters.api]
///     limit_for_period = 10
///     limit_refresh_period = "1s"
///     key = "header:x-api-key"
///
///     [bulkheads.payment]
///     max_concurrent_calls = 2
/// "#)?;
/// let api = registry.rate_limit_layer("api")?;
/// let payment = registry.bulkhead("payment")?.layer();
/// assert!(registry.rate_limit_layer("nope").is_err());
/// # let _ = (api, payment);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Registry {
    pub(super) limiters: BTreeMap<String, NamedLimiter>,
    pub(super) bulkheads: BTreeMap<String, Bulkhead>,
    routes: BTreeMap<String, RouteSettings>,
    pub(super) pushbacks: BTreeMap<String, Pushback>,
    #[cfg(feature = "adaptive")]
    pub(super) adaptive_bulkheads: BTreeMap<String, AdaptiveBulkhead>,
    #[cfg(feature = "adaptive")]
    overload: BTreeMap<String, Overload>,
    #[cfg(feature = "adaptive")]
    pub(super) breakers: BTreeMap<String, crate::outbound::Breaker>,
    #[cfg(feature = "adaptive")]
    retries: BTreeMap<String, crate::outbound::retry::Retry>,
    /// Each client quota's layer, built once so that its metrics handles are shared by every
    /// layer taken for it.
    client_quotas: BTreeMap<String, ConfiguredClientQuotaLayer>,
    /// The configuration the instances run with now: the one they were built from, with the
    /// changes of every reload since. Locked while a reload runs, so reloads apply one at a time.
    pub(super) running: Mutex<Config>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Registry");
        out.field("rate_limiters", &self.limiters.keys().collect::<Vec<_>>())
            .field("bulkheads", &self.bulkheads);
        #[cfg(feature = "adaptive")]
        out.field("adaptive_bulkheads", &self.adaptive_bulkheads)
            .field("overload", &self.overload)
            .field("breakers", &self.breakers)
            .field("retries", &self.retries);
        out.field("pushbacks", &self.pushbacks)
            .field(
                "client_quotas",
                &self.client_quotas.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Registry {
    /// Reads, parses, validates and builds a TOML file.
    ///
    /// # Errors
    ///
    /// A file that cannot be read, or one [`from_toml_str`](Self::from_toml_str) refuses.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::from_toml_str(&ConfigError::read(path.as_ref())?)
    }

    /// Parses, validates and builds a TOML document.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field at fault (`rate_limiters.api.burst`) with its line
    /// and column: text that is not TOML, an unknown section or field, a value of the wrong
    /// type or out of range, a duration without a unit, a name that points nowhere, or an
    /// instance that cannot be built (a name that cannot be a policy name, a Redis limiter
    /// outside a tokio runtime or with a bad URL).
    ///
    /// ```
    /// use tower_bulwark::config::Registry;
    ///
    /// let text = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = 1\n";
    /// let err = Registry::from_toml_str(text).unwrap_err();
    /// assert_eq!(err.path(), "rate_limiters.api.limit_refresh_period");
    /// assert_eq!(err.position(), Some((3, 24)));
    /// assert!(err.message().contains("no unit"));
    /// ```
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Self::from_toml_str_with(text, |_, builder| builder)
    }

    /// [`from_toml_str`](Self::from_toml_str), passing each bulkhead's builder, with the
    /// file's settings (and, with the `metrics` feature, the metrics hooks) already applied,
    /// through `customize` before it is built: the place to add your own event hooks, which
    /// run after the registry's.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use tower_bulwark::bulkhead::CallRejected;
    /// use tower_bulwark::config::Registry;
    ///
    /// let text = "[bulkheads.payment]\nmax_concurrent_calls = 2\n"; // or std::fs::read_to_string
    /// let rejected = Arc::new(AtomicU64::new(0));
    /// let counter = Arc::clone(&rejected);
    /// let registry = Registry::from_toml_str_with(text, move |name, builder| {
    ///     let counter = Arc::clone(&counter);
    ///     let name = name.to_owned();
    ///     builder.on_call_rejected(move |_: &CallRejected<'_>| {
    ///         counter.fetch_add(1, Ordering::Relaxed);
    ///         eprintln!("bulkhead {name} refused a call");
    ///     })
    /// })?;
    /// # let _ = registry;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_toml_str`](Self::from_toml_str).
    pub fn from_toml_str_with(
        text: &str,
        customize: impl FnMut(&str, BulkheadBuilder) -> BulkheadBuilder,
    ) -> Result<Self, ConfigError> {
        let config = Config::from_toml_str(text)?;
        Self::build(config, customize).map_err(|e| e.located_in(text))
    }

    /// Builds every instance of a validated `config`.
    fn build(
        config: Config,
        mut customize: impl FnMut(&str, BulkheadBuilder) -> BulkheadBuilder,
    ) -> Result<Self, ConfigError> {
        let limiters = build_each(&config.rate_limiters, build_limiter)?;
        // The fields in the order they are built: the first error is the one returned.
        Ok(Self {
            bulkheads: build_each(&config.bulkheads, |name, s| {
                Ok(customize(name, bulkhead_builder(name, s)).build())
            })?,
            pushbacks: build_each(&config.pushbacks, |name, s| Ok(build_pushback(name, s)))?,
            // The validation made sure that every client quota names a rate limiter.
            client_quotas: build_each(&config.client_quotas, |name, s| {
                let limiter = limiters[&s.limiter].limiter.clone();
                Ok(ClientQuotaLayer::new(name, limiter)
                    .key(GlobalConfigKey)
                    .cost(s.cost.0))
            })?,
            #[cfg(feature = "adaptive")]
            adaptive_bulkheads: build_each(&config.adaptive_bulkheads, build_adaptive_bulkhead)?,
            #[cfg(feature = "adaptive")]
            overload: build_each(&config.overload, build_overload)?,
            #[cfg(feature = "adaptive")]
            breakers: build_each(&config.breakers, build_breaker)?,
            #[cfg(feature = "adaptive")]
            retries: build_each(&config.retries, |name, s| s.build(name))?,
            limiters,
            routes: config.routes.clone(),
            running: Mutex::new(config),
        })
    }

    /// The layer of rate limiter `name`; every layer taken for one name shares its state.
    ///
    /// The policy name in the `RateLimit` headers is the instance name.
    pub fn rate_limit_layer(
        &self,
        name: &str,
    ) -> Result<ConfiguredRateLimitLayer, UnknownInstance> {
        Ok(RateLimitLayer::new(self.policy(name)?))
    }

    /// The layer of route `name` (a name under `routes`): one policy per rate limiter it lists, in
    /// its order, each with its key, the route's cost and shadow mode, and the route's exempt
    /// networks. Every layer taken for one route (and every route naming one rate limiter)
    /// shares the rate limiters' state.
    ///
    /// ```
    /// use tower_bulwark::config::Registry;
    ///
    /// let registry = Registry::from_toml_str(r#"
    ///     [rate_limiters.per-ip]
    ///     limit_for_period = 10
    ///     limit_refresh_period = "1s"
    ///
    ///     [rate_limiters.per-key]
    ///     limit_for_period = 1000
    ///     limit_refresh_period = "1h"
    ///     key = "header:x-api-key"
    ///
    ///     [routes.search]
    ///     policies = ["per-ip", { limiter = "per-key", cost = 5 }]
    /// "#)?;
    /// let layer = registry.route_layer("search")?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn route_layer(
        &self,
        name: &str,
    ) -> Result<RateLimitLayer<Vec<ConfiguredPolicy>>, UnknownInstance> {
        let route = find(&self.routes, "route", name)?;
        let mut policies = Vec::with_capacity(route.policies.len());
        for p in &route.policies {
            let mut policy = self.policy(&p.limiter)?.cost(p.cost.0);
            policy.shadow = p.shadow;
            policies.push(policy);
        }
        let layer = RateLimitLayer::new(policies);
        #[cfg(feature = "axum")]
        let layer = if route.exempt_networks.is_empty() {
            layer
        } else {
            layer.exempt_networks(route.exempt_networks.iter().copied())
        };
        Ok(layer)
    }

    /// Rate limiter `name` as a policy (named `name`, with its configured key), to chain with
    /// others on one layer: `registry.policy("per-ip")?.and(registry.policy("per-key")?)`.
    pub fn policy(&self, name: &str) -> Result<ConfiguredPolicy, UnknownInstance> {
        let named = self.named(name)?;
        let policy = Policy::new(name, named.extractor.clone(), named.limiter.clone());
        Ok(policy.expect("instance names are checked when the registry is built"))
    }

    /// Rate limiter `name`, to call directly or to read its snapshot.
    pub fn rate_limiter(&self, name: &str) -> Result<&ConfiguredLimiter, UnknownInstance> {
        Ok(&self.named(name)?.limiter)
    }

    /// Bulkhead `name`: its [`layer`](Bulkhead::layer) (every layer taken from it shares its
    /// permits), its snapshot, its size.
    pub fn bulkhead(&self, name: &str) -> Result<&Bulkhead, UnknownInstance> {
        find(&self.bulkheads, "bulkhead", name)
    }

    /// Adaptive bulkhead `name` (under `adaptive_bulkheads`): its `layer()`, judging answers
    /// with the default classifier ([`HttpOverload`](crate::bulkhead::adaptive::HttpOverload)),
    /// or its `layer_with` another; its limit and snapshot. Every layer taken from it shares
    /// one limit.
    #[cfg(feature = "adaptive")]
    pub fn adaptive_bulkhead(&self, name: &str) -> Result<&AdaptiveBulkhead, UnknownInstance> {
        find(&self.adaptive_bulkheads, "adaptive bulkhead", name)
    }

    /// Overload protection `name` (under `overload`): its `layer()`, limit and ceilings. Every
    /// layer taken from it shares one limit.
    #[cfg(feature = "adaptive")]
    pub fn overload(&self, name: &str) -> Result<&Overload, UnknownInstance> {
        find(&self.overload, "overload protection", name)
    }

    /// Circuit breaker `name` (under `breakers`): its `layer()` and `state()`. Every layer
    /// taken from it shares one state.
    #[cfg(feature = "adaptive")]
    pub fn breaker(&self, name: &str) -> Result<&crate::outbound::Breaker, UnknownInstance> {
        find(&self.breakers, "circuit breaker", name)
    }

    /// Retries `name` (under `retries`): their `layer()` (every layer taken from them shares
    /// one budget).
    #[cfg(feature = "adaptive")]
    pub fn retry(&self, name: &str) -> Result<&crate::outbound::retry::Retry, UnknownInstance> {
        find(&self.retries, "retries", name)
    }

    /// Pushback `name` (under `pushbacks`): its [`layer`](Pushback::layer) (every layer taken
    /// from it shares what the dependency said), how long it holds calls, and
    /// [`observe`](Pushback::observe) for a response obtained without its layer.
    ///
    /// ```
    /// use tower::ServiceBuilder;
    /// use tower_bulwark::config::Registry;
    ///
    /// let registry = Registry::from_toml_str(r#"
    ///     [rate_limiters.partner]
    ///     limit_for_period = 5000
    ///     limit_refresh_period = "1h"
    ///     key = "global"
    ///
    ///     [pushbacks.partner]
    ///     max_wait = "2s"
    ///
    ///     [client_quotas.partner]
    ///     limiter = "partner"
    /// "#)?;
    /// // Pushback before the client quota: a call the partner asked you not to make spends no
    /// // permit (see `tower_bulwark::outbound` for the whole order).
    /// let client = ServiceBuilder::new()
    ///     .layer(registry.pushback("partner")?.layer())
    ///     .layer(registry.client_quota_layer("partner")?)
    ///     .service(reqwest::Client::new());
    /// # let _ = client;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pushback(&self, name: &str) -> Result<&Pushback, UnknownInstance> {
        find(&self.pushbacks, "pushback", name)
    }

    /// The layer of client quota `name` (under `client_quotas`): each call takes the configured
    /// cost from its rate limiter's quota, under [`ConfigKey::Global`]. Every layer taken for
    /// one name, and every route or policy naming the same rate limiter, shares the limiter's
    /// state, memory or Redis; a reload that changes the limiter's quota applies under the
    /// layers already built.
    pub fn client_quota_layer(
        &self,
        name: &str,
    ) -> Result<ConfiguredClientQuotaLayer, UnknownInstance> {
        find(&self.client_quotas, "client quota", name).cloned()
    }

    fn named(&self, name: &str) -> Result<&NamedLimiter, UnknownInstance> {
        find(&self.limiters, "rate limiter", name)
    }
}
