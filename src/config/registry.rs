//! The registry of named instances built from a [`Config`].

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use crate::head::RequestHead;
use http::HeaderValue;

#[cfg(feature = "adaptive")]
use super::{AdaptiveAlgorithmKind, AdaptiveBulkheadSettings};
use super::{
    AlgorithmKind, BulkheadSettings, Config, ConfigError, KeyKind, PushbackSettings,
    RateLimiterSettings, RouteSettings, ShadowKind, StoreKind,
};
#[cfg(feature = "adaptive")]
use crate::bulkhead::adaptive::{AdaptiveBulkhead, AdaptiveBulkheadLayer, Aimd, Gradient, Limits};
use crate::bulkhead::{Bulkhead, BulkheadBuilder, BulkheadLayer};
use crate::observe::{LimiterSnapshot, Observed};
use crate::outbound::pushback::{Pushback, PushbackLayer};
use crate::outbound::quota::{ClientQuotaLayer, FixedCost, QuotaKey};
use crate::rate_limit::{
    BoxLimiter, GlobalKey, HeaderKey, KeyError, KeyExtractor, Policy, RateLimitLayer,
};
use crate::{
    algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog},
    KeyedRateLimiter, Limiter, Quota,
};

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
enum Extract {
    #[cfg(feature = "axum")]
    Peer(crate::rate_limit::PeerIp),
    #[cfg(feature = "axum")]
    Forwarded(crate::rate_limit::ForwardedIp),
    Header(HeaderKey),
    Global,
}

/// The key extractor that a configured rate limiter uses, chosen by its `key` field.
#[derive(Clone, Debug)]
pub struct ConfigKeyExtractor(Extract);

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
pub type ConfiguredClientQuotaLayer =
    ClientQuotaLayer<ConfiguredLimiter, GlobalConfigKey, FixedCost>;

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

struct NamedLimiter {
    limiter: ConfiguredLimiter,
    extractor: ConfigKeyExtractor,
    /// For a limiter whose state lives in a shared store (Redis): how many decisions the store
    /// did not give.
    store_failures: Option<StoreFailures>,
    /// For a limiter whose quota must fit a store's bounds (Redis): why a quota does not.
    quota_check: Option<QuotaCheck>,
}

/// Reads a shared store's failure count.
type StoreFailures = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Says why a quota cannot be given to a limiter, if it cannot.
type QuotaCheck = Arc<dyn Fn(&Quota) -> Result<(), String> + Send + Sync>;

/// Named rate limiters and bulkheads, built once from a configuration and shared by every layer
/// taken from it.
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
/// let payment = registry.bulkhead_layer("payment")?;
/// assert!(registry.rate_limit_layer("nope").is_err());
/// # let _ = (api, payment);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Registry {
    limiters: BTreeMap<String, NamedLimiter>,
    bulkheads: BTreeMap<String, Bulkhead>,
    routes: BTreeMap<String, RouteSettings>,
    pushbacks: BTreeMap<String, Pushback>,
    #[cfg(feature = "adaptive")]
    adaptive_bulkheads: BTreeMap<String, AdaptiveBulkhead>,
    /// Each client quota's layer, built once so that its metrics handles are shared by every
    /// layer taken for it.
    client_quotas: BTreeMap<String, ConfiguredClientQuotaLayer>,
    /// The configuration the instances run with now: the one they were built from, with the
    /// changes of every reload since. Locked while a reload runs, so reloads apply one at a time.
    running: Mutex<Config>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Registry");
        out.field("rate_limiters", &self.limiters.keys().collect::<Vec<_>>())
            .field("bulkheads", &self.bulkheads);
        #[cfg(feature = "adaptive")]
        out.field("adaptive_bulkheads", &self.adaptive_bulkheads);
        out.field("pushbacks", &self.pushbacks)
            .field(
                "client_quotas",
                &self.client_quotas.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Registry {
    /// Builds every instance of `config`.
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        Self::from_config_with(config, |_, builder| builder)
    }

    /// Builds every instance of `config`, passing each bulkhead's builder, with the file's
    /// settings (and, with the `metrics` feature, the metrics hooks) already applied, through
    /// `customize` before it is built: the place to add your own event hooks, which run after
    /// the registry's.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use tower_bulwark::bulkhead::CallRejected;
    /// use tower_bulwark::config::{Config, Registry};
    ///
    /// let config = Config::from_toml_str("[bulkheads.payment]\nmax_concurrent_calls = 2\n")?;
    /// let rejected = Arc::new(AtomicU64::new(0));
    /// let counter = Arc::clone(&rejected);
    /// let registry = Registry::from_config_with(&config, move |name, builder| {
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
    pub fn from_config_with(
        config: &Config,
        mut customize: impl FnMut(&str, BulkheadBuilder) -> BulkheadBuilder,
    ) -> Result<Self, ConfigError> {
        let mut limiters = BTreeMap::new();
        for (name, settings) in &config.rate_limiters {
            limiters.insert(name.clone(), build_limiter(name, settings)?);
        }
        let bulkheads = config
            .bulkheads
            .iter()
            .map(|(name, settings)| {
                let builder = customize(name, bulkhead_builder(name, settings));
                (name.clone(), builder.build())
            })
            .collect();
        let pushbacks = config
            .pushbacks
            .iter()
            .map(|(name, settings)| (name.clone(), build_pushback(name, settings)))
            .collect();
        let mut client_quotas = BTreeMap::new();
        for (name, settings) in &config.client_quotas {
            // `Config` checked that the limiter is configured; a `Config` built in code may not
            // have been.
            let named: &NamedLimiter = limiters.get(&settings.limiter).ok_or_else(|| {
                ConfigError::new(
                    format!("client_quotas.{name}.limiter"),
                    format!(
                        "names `{}`, which is not under `rate_limiters`",
                        settings.limiter
                    ),
                )
            })?;
            let layer = ClientQuotaLayer::new(name.as_str(), named.limiter.clone())
                .key(GlobalConfigKey)
                .cost(settings.cost);
            client_quotas.insert(name.clone(), layer);
        }
        #[cfg(feature = "adaptive")]
        let adaptive_bulkheads = {
            let mut built = BTreeMap::new();
            for (name, settings) in &config.adaptive_bulkheads {
                built.insert(name.clone(), build_adaptive_bulkhead(name, settings)?);
            }
            built
        };
        Ok(Self {
            limiters,
            bulkheads,
            pushbacks,
            #[cfg(feature = "adaptive")]
            adaptive_bulkheads,
            client_quotas,
            routes: config.routes.clone(),
            running: Mutex::new(config.clone()),
        })
    }

    /// Parses, validates and builds a TOML document.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Self::from_config(&Config::from_toml_str(text)?)
    }

    /// Reads, parses, validates and builds a TOML file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::from_config(&Config::from_path(path)?)
    }

    /// Applies `config` to the running instances, in place: the layers and services already
    /// built from them see the change at once, and every key keeps its state.
    ///
    /// What changes in place: a rate limiter's quota (`limit_for_period`,
    /// `limit_refresh_period`, `burst`, `max_wait`), given to its limiter as
    /// [`Limiter::set_quota`] does (see
    /// [`KeyedRateLimiter::set_quota`](crate::KeyedRateLimiter::set_quota) for what each
    /// algorithm keeps), and a bulkhead's `max_concurrent_calls`, as
    /// [`Bulkhead::set_max_concurrent_calls`] does. An instance whose settings are unchanged is
    /// not touched at all.
    ///
    /// Anything else cannot change under the layers already serving, so a reload that changes
    /// it is refused as a whole, with an error naming the instance and the field: a rate
    /// limiter's `algorithm`, `key`, `trusted_proxies`, `max_keys`, `hide_keys`, `store` or
    /// Redis settings, a bulkhead's `max_wait` or `queue_capacity`, any setting of a pushback
    /// (`max_wait`, `max_hold`, `pacing`: the calls already held were admitted under them) or
    /// of a client quota (`limiter`, `cost`: the layers already built hold them), and an
    /// instance added or removed. A client quota's quota is its rate limiter's, and changes in
    /// place with it. (Build a new registry for those, and take new layers from it.) A Redis
    /// limiter's fail mode keeps what it was built from; Redis limiters in other processes
    /// keep their quota until their own registry reloads (the quota travels with each call).
    ///
    /// A refused reload, or one with a quota a Redis script cannot run, changes nothing.
    /// Reloads apply one at a time.
    pub fn reload_config(&self, config: &Config) -> Result<Reloaded, ConfigError> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let mut reloaded = Reloaded::default();
        let mut quotas = Vec::new();
        for (name, next) in &config.rate_limiters {
            let path = format!("rate_limiters.{name}");
            let Some(now) = running.rate_limiters.get(name) else {
                return Err(ConfigError::new(path, NOT_RUNNING));
            };
            fixed_limiter_settings(&path, now, next)?;
            if now.quota != next.quota {
                let named = &self.limiters[name];
                if let Some(check) = &named.quota_check {
                    check(&next.quota).map_err(|e| ConfigError::new(path.clone(), e))?;
                }
                quotas.push((name, next.quota));
            }
        }
        let mut sizes = Vec::new();
        for (name, next) in &config.bulkheads {
            let path = format!("bulkheads.{name}");
            let Some(now) = running.bulkheads.get(name) else {
                return Err(ConfigError::new(path, NOT_RUNNING));
            };
            fixed(&path, "max_wait", &now.max_wait, &next.max_wait)?;
            fixed(
                &path,
                "queue_capacity",
                &now.queue_capacity,
                &next.queue_capacity,
            )?;
            if now.max_concurrent_calls != next.max_concurrent_calls {
                sizes.push((name, next.max_concurrent_calls));
            }
        }
        for (name, next) in &config.pushbacks {
            let path = format!("pushbacks.{name}");
            let Some(now) = running.pushbacks.get(name) else {
                return Err(ConfigError::new(path, NOT_RUNNING));
            };
            fixed(&path, "max_wait", &now.max_wait, &next.max_wait)?;
            fixed(&path, "max_hold", &now.max_hold, &next.max_hold)?;
            fixed(&path, "pacing", &now.pacing, &next.pacing)?;
        }
        for (name, next) in &config.adaptive_bulkheads {
            let path = format!("adaptive_bulkheads.{name}");
            let Some(now) = running.adaptive_bulkheads.get(name) else {
                return Err(ConfigError::new(path, NOT_RUNNING));
            };
            fixed(&path, "min_limit", &now.min_limit, &next.min_limit)?;
            fixed(
                &path,
                "initial_limit",
                &now.initial_limit,
                &next.initial_limit,
            )?;
            fixed(&path, "max_limit", &now.max_limit, &next.max_limit)?;
            fixed(&path, "algorithm", &now.algorithm, &next.algorithm)?;
            fixed(
                &path,
                "ignore_cancelled_calls",
                &now.ignore_cancelled_calls,
                &next.ignore_cancelled_calls,
            )?;
        }
        for (name, next) in &config.client_quotas {
            let path = format!("client_quotas.{name}");
            let Some(now) = running.client_quotas.get(name) else {
                return Err(ConfigError::new(path, NOT_RUNNING));
            };
            fixed(&path, "limiter", &now.limiter, &next.limiter)?;
            fixed(&path, "cost", &now.cost, &next.cost)?;
        }
        let removed = |kind: &str, name: &String| {
            ConfigError::new(
                format!("{kind}.{name}"),
                "is missing; an instance cannot be removed from a running registry \
                 (build a new registry without it)",
            )
        };
        if let Some(name) = running
            .rate_limiters
            .keys()
            .find(|n| !config.rate_limiters.contains_key(*n))
        {
            return Err(removed("rate_limiters", name));
        }
        if let Some(name) = running
            .bulkheads
            .keys()
            .find(|n| !config.bulkheads.contains_key(*n))
        {
            return Err(removed("bulkheads", name));
        }
        if let Some(name) = running
            .pushbacks
            .keys()
            .find(|n| !config.pushbacks.contains_key(*n))
        {
            return Err(removed("pushbacks", name));
        }
        if let Some(name) = running
            .client_quotas
            .keys()
            .find(|n| !config.client_quotas.contains_key(*n))
        {
            return Err(removed("client_quotas", name));
        }
        if let Some(name) = running
            .adaptive_bulkheads
            .keys()
            .find(|n| !config.adaptive_bulkheads.contains_key(*n))
        {
            return Err(removed("adaptive_bulkheads", name));
        }
        if let Some((name, _)) = config
            .routes
            .iter()
            .find(|(name, next)| running.routes.get(*name) != Some(next))
            .or_else(|| {
                running
                    .routes
                    .iter()
                    .find(|(name, _)| !config.routes.contains_key(*name))
            })
        {
            return Err(ConfigError::new(
                format!("routes.{name}"),
                "changed; a route's policies cannot change under the layers already built \
                 (build a new registry and take new layers from it)",
            ));
        }
        // Everything checked: apply.
        for (name, quota) in quotas {
            let path = format!("rate_limiters.{name}");
            self.limiters[name]
                .limiter
                .set_quota(quota)
                .map_err(|e| ConfigError::new(path, e.to_string()))?;
            reloaded.rate_limiters.push(name.clone());
        }
        for (name, size) in sizes {
            self.bulkheads[name].set_max_concurrent_calls(size);
            reloaded.bulkheads.push(name.clone());
        }
        *running = config.clone();
        Ok(reloaded)
    }

    /// [`reload_config`](Self::reload_config) with a TOML document; a document that does not
    /// parse or validate is an error as [`from_toml_str`](Self::from_toml_str) reports it, and
    /// changes nothing.
    pub fn reload_toml_str(&self, text: &str) -> Result<Reloaded, ConfigError> {
        self.reload_config(&Config::from_toml_str(text)?)
    }

    /// [`reload_config`](Self::reload_config) with a TOML file, read again: the way to apply
    /// an operator's edit of the file the registry was built from.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower_bulwark::config::Registry;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = Arc::new(Registry::from_path("bulwark.toml")?);
    /// let reloader = Arc::clone(&registry);
    /// tokio::spawn(async move {
    ///     let mut every = tokio::time::interval(Duration::from_secs(30));
    ///     loop {
    ///         every.tick().await;
    ///         match reloader.reload_path("bulwark.toml") {
    ///             Ok(reloaded) => eprintln!("applied: {reloaded:?}"),
    ///             Err(e) => eprintln!("kept the running configuration: {e}"),
    ///         }
    ///     }
    /// });
    /// # Ok(())
    /// # }
    /// ```
    pub fn reload_path(&self, path: impl AsRef<Path>) -> Result<Reloaded, ConfigError> {
        self.reload_config(&Config::from_path(path)?)
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
        let route = self.routes.get(name).ok_or_else(|| UnknownInstance {
            kind: "route",
            name: name.to_owned(),
        })?;
        let mut policies = Vec::with_capacity(route.policies.len());
        for p in &route.policies {
            let policy = self.policy(&p.limiter)?.cost(p.cost);
            policies.push(match p.shadow {
                ShadowKind::Off => policy,
                ShadowKind::Silent => policy.shadow(),
                ShadowKind::Advertised => policy.shadow_advertised(),
            });
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
        Ok(
            Policy::new(name, named.extractor.clone(), named.limiter.clone())
                .expect("instance names are checked when the registry is built"),
        )
    }

    /// Rate limiter `name`, to call directly or to read its snapshot.
    pub fn rate_limiter(&self, name: &str) -> Result<&ConfiguredLimiter, UnknownInstance> {
        Ok(&self.named(name)?.limiter)
    }

    /// Bulkhead `name`, to read its snapshot or resize it.
    pub fn bulkhead(&self, name: &str) -> Result<&Bulkhead, UnknownInstance> {
        self.bulkheads.get(name).ok_or_else(|| UnknownInstance {
            kind: "bulkhead",
            name: name.to_owned(),
        })
    }

    /// The layer of bulkhead `name`.
    pub fn bulkhead_layer(&self, name: &str) -> Result<BulkheadLayer, UnknownInstance> {
        Ok(self.bulkhead(name)?.layer())
    }

    /// Adaptive bulkhead `name` (under `adaptive_bulkheads`), to read its limit or snapshot.
    #[cfg(feature = "adaptive")]
    pub fn adaptive_bulkhead(&self, name: &str) -> Result<&AdaptiveBulkhead, UnknownInstance> {
        self.adaptive_bulkheads
            .get(name)
            .ok_or_else(|| UnknownInstance {
                kind: "adaptive bulkhead",
                name: name.to_owned(),
            })
    }

    /// The layer of adaptive bulkhead `name`, judging answers with the default classifier
    /// ([`HttpOverload`](crate::bulkhead::adaptive::HttpOverload)); every layer taken for one
    /// name shares one limit. For another classifier, take the bulkhead with
    /// [`adaptive_bulkhead`](Self::adaptive_bulkhead) and call its `layer_with`.
    #[cfg(feature = "adaptive")]
    pub fn adaptive_bulkhead_layer(
        &self,
        name: &str,
    ) -> Result<AdaptiveBulkheadLayer, UnknownInstance> {
        Ok(self.adaptive_bulkhead(name)?.layer())
    }

    /// Pushback `name` (under `pushbacks`), to read how long it holds calls or to
    /// [`observe`](Pushback::observe) a response obtained without its layer.
    pub fn pushback(&self, name: &str) -> Result<&Pushback, UnknownInstance> {
        self.pushbacks.get(name).ok_or_else(|| UnknownInstance {
            kind: "pushback",
            name: name.to_owned(),
        })
    }

    /// The layer of pushback `name`: every layer taken for one name shares what the
    /// dependency said.
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
    ///     .layer(registry.pushback_layer("partner")?)
    ///     .layer(registry.client_quota_layer("partner")?)
    ///     .service(reqwest::Client::new());
    /// # let _ = client;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pushback_layer(&self, name: &str) -> Result<PushbackLayer, UnknownInstance> {
        Ok(self.pushback(name)?.layer())
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
        self.client_quotas
            .get(name)
            .cloned()
            .ok_or_else(|| UnknownInstance {
                kind: "client quota",
                name: name.to_owned(),
            })
    }

    fn named(&self, name: &str) -> Result<&NamedLimiter, UnknownInstance> {
        self.limiters.get(name).ok_or_else(|| UnknownInstance {
            kind: "rate limiter",
            name: name.to_owned(),
        })
    }

    /// The state of every instance, for a health endpoint.
    ///
    /// A saturated instance is working as intended (a limiter refusing during a peak, a
    /// bulkhead with every permit taken), so it is reported as saturated and `UP`: an
    /// orchestrator that restarted a service for it would make the peak worse.
    pub fn health(&self) -> Health {
        Health {
            rate_limiters: self
                .limiters
                .iter()
                .map(|(name, named)| {
                    let snapshot = named.limiter.snapshot();
                    LimiterHealth {
                        name: name.clone(),
                        saturated: snapshot.allowed + snapshot.limited > 0
                            && snapshot.available_permissions == 0,
                        snapshot,
                        store_failures: named.store_failures.as_ref().map(|read| read()),
                    }
                })
                .collect(),
            bulkheads: self
                .bulkheads
                .iter()
                .map(|(name, bulkhead)| bulkhead_health(name, &bulkhead.snapshot()))
                .chain(self.adaptive_health())
                .collect(),
            pushbacks: self
                .pushbacks
                .iter()
                .map(|(name, pushback)| {
                    let held_for = pushback.held_for();
                    PushbackHealth {
                        name: name.clone(),
                        holding: !held_for.is_zero(),
                        held_for,
                    }
                })
                .collect(),
        }
    }

    /// The health entries of the adaptive bulkheads, listed with the others.
    fn adaptive_health(&self) -> impl Iterator<Item = BulkheadHealth> + '_ {
        #[cfg(feature = "adaptive")]
        let entries = self
            .adaptive_bulkheads
            .iter()
            .map(|(name, bulkhead)| bulkhead_health(name, &bulkhead.snapshot()));
        #[cfg(not(feature = "adaptive"))]
        let entries = std::iter::empty();
        entries
    }

    /// Sets every instance's gauges in the `metrics` facade from its current state; call it
    /// before rendering a scrape. Counters and the call-duration histogram are recorded as
    /// events happen. See [`metric_names`](crate::observe::metric_names).
    #[cfg(feature = "metrics")]
    pub fn publish_gauges(&self) {
        use crate::observe::metric_names as m;
        for (name, named) in &self.limiters {
            named.limiter.publish_gauges();
            if let Some(read) = &named.store_failures {
                metrics::counter!(m::RATELIMITER_STORE_FAILURES, "name" => name.clone())
                    .absolute(read());
            }
        }
        for bulkhead in self.bulkheads.values() {
            bulkhead.publish_gauges();
        }
        for pushback in self.pushbacks.values() {
            pushback.publish_gauges();
        }
        #[cfg(feature = "adaptive")]
        for bulkhead in self.adaptive_bulkheads.values() {
            bulkhead.publish_gauges();
        }
    }
}

/// What a reload applied: the instances whose settings changed, by name, in name order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reloaded {
    /// Rate limiters whose quota changed.
    pub rate_limiters: Vec<String>,
    /// Bulkheads whose `max_concurrent_calls` changed.
    pub bulkheads: Vec<String>,
}

const NOT_RUNNING: &str = "is not in the running registry; an instance cannot be added by a \
                           reload (build a new registry with it)";

/// An error if a setting that cannot change in place differs.
fn fixed<T: PartialEq + fmt::Debug>(
    path: &str,
    field: &str,
    now: &T,
    next: &T,
) -> Result<(), ConfigError> {
    if now == next {
        return Ok(());
    }
    Err(ConfigError::new(
        format!("{path}.{field}"),
        format!(
            "changed from {now:?} to {next:?}, which a running registry cannot apply in place \
             (only a rate limiter's quota and a bulkhead's max_concurrent_calls can be); build \
             a new registry for it"
        ),
    ))
}

/// An error naming the first setting of a rate limiter, other than its quota, that differs.
fn fixed_limiter_settings(
    path: &str,
    now: &RateLimiterSettings,
    next: &RateLimiterSettings,
) -> Result<(), ConfigError> {
    fixed(path, "algorithm", &now.algorithm, &next.algorithm)?;
    fixed(path, "key", &now.key, &next.key)?;
    fixed(
        path,
        "trusted_proxies",
        &now.trusted_proxies,
        &next.trusted_proxies,
    )?;
    fixed(path, "max_keys", &now.max_keys, &next.max_keys)?;
    fixed(path, "hide_keys", &now.hide_keys, &next.hide_keys)?;
    match (&now.store, &next.store) {
        (StoreKind::Redis(a), StoreKind::Redis(b)) => {
            fixed(path, "redis_url", &a.url, &b.url)?;
            fixed(path, "redis_prefix", &a.prefix, &b.prefix)?;
            fixed(path, "redis_timeout", &a.timeout, &b.timeout)?;
            fixed(path, "redis_fail_mode", &a.fail_mode, &b.fail_mode)
        }
        (a, b) => fixed(path, "store", a, b),
    }
}

fn build_limiter(name: &str, s: &RateLimiterSettings) -> Result<NamedLimiter, ConfigError> {
    let path = format!("rate_limiters.{name}");
    crate::rate_limit::check_policy_name(name)
        .map_err(|e| ConfigError::new(path.clone(), e.to_string()))?;
    fn keyed<A: crate::algorithm::Algorithm>(s: &RateLimiterSettings) -> BoxLimiter<ConfigKey> {
        BoxLimiter::new(
            KeyedRateLimiter::<ConfigKey>::builder(s.quota)
                .algorithm::<A>()
                .max_keys(s.max_keys)
                .build(),
        )
    }
    let (limiter, store_failures, quota_check) = match &s.store {
        StoreKind::Memory => (
            match s.algorithm {
                AlgorithmKind::Gcra => keyed::<Gcra>(s),
                AlgorithmKind::FixedWindow => keyed::<FixedWindow>(s),
                AlgorithmKind::SlidingLog => keyed::<SlidingLog>(s),
                AlgorithmKind::SlidingCounter => keyed::<SlidingCounter>(s),
            },
            None,
            None,
        ),
        #[cfg(feature = "redis")]
        StoreKind::Redis(redis) => {
            let (limiter, failures, check) = redis_limiter(&path, s, redis)?;
            (limiter, Some(failures), Some(check))
        }
        #[cfg(not(feature = "redis"))]
        StoreKind::Redis(_) => {
            return Err(ConfigError::new(
                format!("{path}.store"),
                "`redis` needs the crate's `redis` feature, which this build lacks",
            ))
        }
    };
    let extractor = match &s.key {
        #[cfg(feature = "axum")]
        KeyKind::PeerIp if s.trusted_proxies.is_empty() => {
            Extract::Peer(crate::rate_limit::PeerIp::new())
        }
        #[cfg(feature = "axum")]
        KeyKind::PeerIp => Extract::Forwarded(crate::rate_limit::ForwardedIp::x_forwarded_for(
            s.trusted_proxies.iter().copied(),
        )),
        #[cfg(not(feature = "axum"))]
        KeyKind::PeerIp => {
            return Err(ConfigError::new(
                format!("{path}.key"),
                "`peer_ip` reads axum's connection info: enable the `axum` feature",
            ))
        }
        KeyKind::Header(h) => Extract::Header(HeaderKey::new(h.clone())),
        KeyKind::Global => Extract::Global,
    };
    Ok(NamedLimiter {
        limiter: Observed::new(name, limiter).hide_keys(s.hide_keys),
        extractor: ConfigKeyExtractor(extractor),
        store_failures,
        quota_check,
    })
}

#[cfg(feature = "redis")]
impl crate::redis::RedisKey for ConfigKey {
    fn write_redis_key(&self, out: &mut String) {
        match self {
            ConfigKey::Ip(ip) => ip.write_redis_key(out),
            ConfigKey::Header(value) => value.write_redis_key(out),
            ConfigKey::Global => out.push_str("global"),
        }
    }
}

#[cfg(feature = "redis")]
fn redis_limiter(
    path: &str,
    s: &RateLimiterSettings,
    redis: &super::RedisSettings,
) -> Result<(BoxLimiter<ConfigKey>, StoreFailures, QuotaCheck), ConfigError> {
    use super::RedisFailModeKind;
    use crate::redis::{RedisAlgorithm, RedisFailMode, RedisRateLimiter, RedisStore};
    use crate::Quota;

    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ConfigError::new(
            format!("{path}.store"),
            "a Redis limiter must be built inside a tokio runtime",
        ));
    }
    let store = RedisStore::connect_lazy(&redis.url)
        .map_err(|e| ConfigError::new(format!("{path}.redis_url"), e.to_string()))?;
    let policy = match redis.fail_mode {
        RedisFailModeKind::Open => RedisFailMode::open(),
        RedisFailModeKind::Closed => RedisFailMode::closed(
            s.quota
                .emission_interval()
                .max(std::time::Duration::from_secs(1)),
        ),
        RedisFailModeKind::Fallback(permits) => {
            let local = Quota::with_period(permits, s.quota.period()).map_err(|e| {
                ConfigError::new(format!("{path}.fallback_limit_for_period"), e.to_string())
            })?;
            RedisFailMode::fallback(local)
        }
    };
    fn build<A: RedisAlgorithm>(
        path: &str,
        s: &RateLimiterSettings,
        redis: &super::RedisSettings,
        store: RedisStore,
        policy: RedisFailMode,
    ) -> Result<(BoxLimiter<ConfigKey>, StoreFailures, QuotaCheck), ConfigError> {
        let mut builder = RedisRateLimiter::builder(s.quota, store)
            .algorithm::<A>()
            .fail_mode(policy);
        if let Some(prefix) = &redis.prefix {
            builder = builder.prefix(prefix.clone());
        }
        if let Some(timeout) = redis.timeout {
            builder = builder.timeout(timeout);
        }
        let limiter = builder
            .build()
            .map_err(|e| ConfigError::new(path.to_owned(), e.to_string()))?;
        let counted = limiter.clone();
        let checked = limiter.clone();
        Ok((
            BoxLimiter::new(limiter),
            Arc::new(move || counted.failures()),
            Arc::new(move |quota| {
                checked
                    .params_for(quota)
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        ))
    }
    match s.algorithm {
        AlgorithmKind::Gcra => build::<Gcra>(path, s, redis, store, policy),
        AlgorithmKind::FixedWindow => build::<FixedWindow>(path, s, redis, store, policy),
        AlgorithmKind::SlidingLog => build::<SlidingLog>(path, s, redis, store, policy),
        AlgorithmKind::SlidingCounter => build::<SlidingCounter>(path, s, redis, store, policy),
    }
}

fn bulkhead_health(name: &str, s: &crate::bulkhead::BulkheadSnapshot) -> BulkheadHealth {
    BulkheadHealth {
        name: name.to_owned(),
        saturated: s.available_concurrent_calls == 0,
        available_concurrent_calls: s.available_concurrent_calls,
        max_allowed_concurrent_calls: s.max_allowed_concurrent_calls,
        queue_depth: s.queue_depth,
        total_permitted: s.total_permitted,
        total_rejected: s.total_rejected,
        total_finished: s.total_finished,
    }
}

#[cfg(feature = "adaptive")]
fn build_adaptive_bulkhead(
    name: &str,
    s: &AdaptiveBulkheadSettings,
) -> Result<AdaptiveBulkhead, ConfigError> {
    // `Config` checked the bounds; a `Config` built in code may not have been.
    let limits = Limits::new(s.min_limit, s.initial_limit, s.max_limit)
        .map_err(|e| ConfigError::new(format!("adaptive_bulkheads.{name}"), e.to_string()))?;
    let builder = AdaptiveBulkhead::builder(name).limits(limits);
    let builder = match s.algorithm {
        AdaptiveAlgorithmKind::Aimd => builder.algorithm(Aimd::default()),
        AdaptiveAlgorithmKind::Gradient => builder.algorithm(Gradient::default()),
    };
    let builder = if s.ignore_cancelled_calls {
        builder.ignore_cancelled_calls()
    } else {
        builder
    };
    Ok(builder.build())
}

fn build_pushback(name: &str, s: &PushbackSettings) -> Pushback {
    Pushback::builder(name)
        .max_wait(s.max_wait)
        .max_hold(s.max_hold)
        .pacing(s.pacing)
        .build()
}

fn bulkhead_builder(name: &str, s: &BulkheadSettings) -> BulkheadBuilder {
    let mut builder = match s.queue_capacity {
        Some(capacity) => Bulkhead::queue(name, s.max_concurrent_calls, capacity),
        None => Bulkhead::semaphore(name, s.max_concurrent_calls),
    };
    if let Some(wait) = s.max_wait {
        builder = builder.max_wait(wait);
    }
    builder
}

/// The state of every configured instance; see [`Registry::health`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// One entry per rate limiter, by name.
    pub rate_limiters: Vec<LimiterHealth>,
    /// One entry per bulkhead, by name.
    pub bulkheads: Vec<BulkheadHealth>,
    /// One entry per pushback, by name.
    pub pushbacks: Vec<PushbackHealth>,
}

/// The health entry of one pushback.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PushbackHealth {
    /// The instance name.
    pub name: String,
    /// Whether the dependency has asked for calls to be held now: a call made now would wait or
    /// be refused. Like saturation, this is the layer doing its job, never ill health.
    pub holding: bool,
    /// How long from now until a call may be sent.
    pub held_for: std::time::Duration,
}

/// The health entry of one rate limiter.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimiterHealth {
    /// The instance name.
    pub name: String,
    /// Whether the latest decision left nothing for its key.
    pub saturated: bool,
    /// Counters and gauges.
    pub snapshot: LimiterSnapshot,
    /// For a limiter whose state lives in Redis: how many decisions Redis did not give since
    /// the registry was built (its fail mode decided them). `None` for in-memory limiters.
    pub store_failures: Option<u64>,
}

/// The health entry of one bulkhead.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BulkheadHealth {
    /// The instance name.
    pub name: String,
    /// Whether every permit is taken.
    pub saturated: bool,
    /// Free permits.
    pub available_concurrent_calls: usize,
    /// The current limit.
    pub max_allowed_concurrent_calls: usize,
    /// Calls waiting for a permit.
    pub queue_depth: usize,
    /// Calls permitted so far.
    pub total_permitted: u64,
    /// Calls refused so far.
    pub total_rejected: u64,
    /// Permitted calls that have ended.
    pub total_finished: u64,
}

impl Health {
    /// Always `"UP"`: saturation is reported, never counted as ill health.
    pub fn status(&self) -> &'static str {
        "UP"
    }

    /// The report as JSON:
    /// `{"status":"UP","rateLimiters":{"api":{...}},"bulkheads":{"payment":{...}},"pushbacks":{"partner":{...}}}`.
    ///
    /// A rate limiter's entry has `status`, `saturated`, `availablePermissions`,
    /// `waitingRequests`, `allowedCalls`, `limitedCalls`, and for one kept in Redis
    /// `storeFailures`; a bulkhead's has `status`, `saturated`, `availableConcurrentCalls`,
    /// `maxAllowedConcurrentCalls`, `queueDepth`, `permittedCalls`, `rejectedCalls` and
    /// `finishedCalls`; a pushback's has `status`, `holding` and `heldForMillis` (rounded up,
    /// so a hold in force is never 0).
    pub fn to_json(&self) -> String {
        let mut out = String::from("{\"status\":\"UP\",\"rateLimiters\":{");
        for (i, l) in self.rate_limiters.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_str(&mut out, &l.name);
            out.push_str(&format!(
                ":{{\"status\":\"UP\",\"saturated\":{},\"availablePermissions\":{},\"waitingRequests\":{},\"allowedCalls\":{},\"limitedCalls\":{}",
                l.saturated,
                l.snapshot.available_permissions,
                l.snapshot.waiting_requests,
                l.snapshot.allowed,
                l.snapshot.limited
            ));
            if let Some(failures) = l.store_failures {
                out.push_str(&format!(",\"storeFailures\":{failures}"));
            }
            out.push('}');
        }
        out.push_str("},\"bulkheads\":{");
        for (i, b) in self.bulkheads.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_str(&mut out, &b.name);
            out.push_str(&format!(
                ":{{\"status\":\"UP\",\"saturated\":{},\"availableConcurrentCalls\":{},\"maxAllowedConcurrentCalls\":{},\"queueDepth\":{},\"permittedCalls\":{},\"rejectedCalls\":{},\"finishedCalls\":{}}}",
                b.saturated,
                b.available_concurrent_calls,
                b.max_allowed_concurrent_calls,
                b.queue_depth,
                b.total_permitted,
                b.total_rejected,
                b.total_finished
            ));
        }
        out.push_str("},\"pushbacks\":{");
        for (i, p) in self.pushbacks.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_str(&mut out, &p.name);
            let millis = p.held_for.as_nanos().div_ceil(1_000_000);
            out.push_str(&format!(
                ":{{\"status\":\"UP\",\"holding\":{},\"heldForMillis\":{millis}}}",
                p.holding
            ));
        }
        out.push_str("}}");
        out
    }
}

fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}
