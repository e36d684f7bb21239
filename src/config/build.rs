//! Each kind of instance built from its validated settings, for the [`Registry`](super::Registry).

use super::file::*;
use super::ConfigError;
#[cfg(feature = "adaptive")]
use crate::bulkhead::adaptive::{AdaptiveBulkhead, Aimd, Gradient, Limits};
use crate::bulkhead::{Bulkhead, BulkheadBuilder};
use crate::limiter::BoxLimiter;
use crate::observe::Observed;
use crate::outbound::pushback::{Pacing, Pushback};
use crate::rate_limit::HeaderKey;
use crate::{
    algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog},
    KeyedRateLimiter, Quota,
};

use super::registry::{ConfigKey, ConfigKeyExtractor, Extract, NamedLimiter};

/// A builder's setting applied where the file gives it: a field left out keeps the builder's
/// default.
pub(super) trait Given: Sized {
    /// The builder with `set` applied to `value`, if the file gives one.
    fn given<T>(self, value: Option<T>, set: impl FnOnce(Self, T) -> Self) -> Self {
        match value {
            Some(value) => set(self, value),
            None => self,
        }
    }
}

impl<B> Given for B {}

pub(super) fn build_limiter(
    name: &str,
    s: &RateLimiterSettings,
) -> Result<NamedLimiter, ConfigError> {
    let path = format!("rate_limiters.{name}");
    crate::rate_limit::check_policy_name(name)
        .map_err(|e| ConfigError::new(path.clone(), e.to_string()))?;
    let quota = s.quota(&path)?;
    #[cfg(feature = "redis")]
    let mut redis = None;
    let limiter = match s.store {
        StoreKind::Memory => memory_limiter(s, quota),
        #[cfg(feature = "redis")]
        StoreKind::Redis => BoxLimiter::new(redis.insert(redis_limiter(&path, s, quota)?).clone()),
        #[cfg(not(feature = "redis"))]
        StoreKind::Redis => {
            unreachable!("the validation refuses a Redis store without the feature")
        }
    };
    Ok(NamedLimiter {
        #[cfg(feature = "redis")]
        redis,
        limiter: Observed::new(name, limiter).hide_keys(s.hide_keys),
        extractor: key_extractor(s).map_err(|e| ConfigError::new(format!("{path}.key"), e))?,
    })
}

pub(super) fn memory_limiter(s: &RateLimiterSettings, quota: Quota) -> BoxLimiter<ConfigKey> {
    let builder = KeyedRateLimiter::<ConfigKey>::builder(quota).max_keys(s.max_keys.0 as usize);
    match s.algorithm {
        AlgorithmKind::Gcra => BoxLimiter::new(builder.algorithm::<Gcra>().build()),
        AlgorithmKind::FixedWindow => BoxLimiter::new(builder.algorithm::<FixedWindow>().build()),
        AlgorithmKind::SlidingLog => BoxLimiter::new(builder.algorithm::<SlidingLog>().build()),
        AlgorithmKind::SlidingCounter => {
            BoxLimiter::new(builder.algorithm::<SlidingCounter>().build())
        }
    }
}

pub(super) fn key_extractor(s: &RateLimiterSettings) -> Result<ConfigKeyExtractor, &'static str> {
    let extract = match &s.key {
        #[cfg(feature = "axum")]
        KeyKind::PeerIp => Extract::Peer(crate::rate_limit::PeerIp::new()),
        #[cfg(feature = "axum")]
        KeyKind::ForwardedIp => {
            use crate::rate_limit::ForwardedIp;
            // The validation made sure that a forwarded key has proxies.
            let trusted = s.trusted_proxies.iter().flatten().copied();
            Extract::Forwarded(match s.forwarded_header.unwrap_or_default() {
                ForwardedHeader::XForwardedFor => ForwardedIp::x_forwarded_for(trusted),
                ForwardedHeader::Forwarded => ForwardedIp::forwarded(trusted),
            })
        }
        #[cfg(not(feature = "axum"))]
        KeyKind::PeerIp | KeyKind::ForwardedIp => {
            return Err(
                "`peer_ip` and `forwarded_ip` read axum's connection info: enable the \
                        `axum` feature",
            )
        }
        KeyKind::Header(h) => Extract::Header(HeaderKey::for_header(h.clone())),
        KeyKind::Global => Extract::Global,
    };
    Ok(ConfigKeyExtractor(extract))
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
pub(super) fn redis_limiter(
    path: &str,
    s: &RateLimiterSettings,
    quota: Quota,
) -> Result<crate::redis::RedisRateLimiter, ConfigError> {
    use crate::redis::{RedisRateLimiter, RedisStore};

    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ConfigError::new(
            format!("{path}.store"),
            "a Redis limiter must be built inside a tokio runtime",
        ));
    }
    let url = (s.redis_url.as_deref()).expect("the validation requires a Redis store's URL");
    let store = RedisStore::connect_lazy(url)
        .map_err(|e| ConfigError::new(format!("{path}.redis_url"), e.to_string()))?;
    let mut builder = RedisRateLimiter::builder(quota, store)
        .fail_mode(redis_fail_mode(path, s, quota)?)
        .given(s.redis_prefix.clone(), |b, prefix| b.prefix(prefix))
        .given(s.redis_timeout, |b, timeout| b.timeout(timeout));
    if s.redis_leases {
        let lease = crate::redis::Lease::new()
            .given(s.redis_lease_max_share, |b, share| b.max_share(share.0))
            .given(s.redis_lease_length, |b, length| b.length(length));
        builder = builder.lease(lease);
    }
    let builder = match s.algorithm {
        AlgorithmKind::Gcra => builder.algorithm::<Gcra>(),
        AlgorithmKind::FixedWindow => builder.algorithm::<FixedWindow>(),
        AlgorithmKind::SlidingLog => builder.algorithm::<SlidingLog>(),
        AlgorithmKind::SlidingCounter => builder.algorithm::<SlidingCounter>(),
    };
    (builder.build()).map_err(|e| redis_error(path, &e))
}

/// A Redis limiter's build error at the field of the file that sets what it names, or at the
/// instance.
#[cfg(feature = "redis")]
pub(super) fn redis_error(path: &str, error: &crate::redis::BuildError) -> ConfigError {
    let field = match error.setting() {
        Some("max_share") => "redis_lease_max_share",
        Some("length") => "redis_lease_length",
        Some("timeout") => "redis_timeout",
        Some("prefix") => "redis_prefix",
        Some("max_wait") => "max_wait",
        Some("period") => "limit_refresh_period",
        _ => return ConfigError::new(path, error.to_string()),
    };
    ConfigError::new(format!("{path}.{field}"), error.to_string())
}

/// What a Redis limiter does when Redis cannot answer: a refusal tells the client to come back
/// after one emission interval (at least a second); a fallback decides with a local quota of
/// the same period.
#[cfg(feature = "redis")]
pub(super) fn redis_fail_mode(
    path: &str,
    s: &RateLimiterSettings,
    quota: Quota,
) -> Result<crate::redis::RedisFailMode, ConfigError> {
    use crate::redis::RedisFailMode;

    Ok(match s.redis_fail_mode.unwrap_or_default() {
        RedisFailModeKind::Local => RedisFailMode::Local,
        RedisFailModeKind::Open => RedisFailMode::Open,
        RedisFailModeKind::Closed => RedisFailMode::Closed(
            quota
                .emission_interval()
                .max(std::time::Duration::from_secs(1)),
        ),
        RedisFailModeKind::Fallback => {
            let permits = (s.fallback_limit_for_period)
                .expect("the validation requires fallback_limit_for_period with a fallback")
                .0;
            let local = Quota::with_period(permits, quota.period()).map_err(|e| {
                ConfigError::new(format!("{path}.fallback_limit_for_period"), e.to_string())
            })?;
            RedisFailMode::fallback(local)
        }
    })
}

#[cfg(feature = "adaptive")]
pub(super) fn build_adaptive_bulkhead(
    name: &str,
    s: &AdaptiveBulkheadSettings,
) -> Result<AdaptiveBulkhead, ConfigError> {
    let (min, initial, max) = s.limits();
    let at = |e: crate::SettingError| {
        ConfigError::new(format!("adaptive_bulkheads.{name}"), e.to_string())
    };
    let builder =
        AdaptiveBulkhead::builder(name).limits(Limits::new(min, initial, max).map_err(at)?);
    let mut builder = match (s.algorithm, s.probe_every) {
        (AdaptiveAlgorithmKind::Aimd, None) => builder.algorithm(Aimd::default()),
        (AdaptiveAlgorithmKind::Aimd, Some(n)) => {
            builder.algorithm(Aimd::default().probe_every(n.0).map_err(at)?)
        }
        (AdaptiveAlgorithmKind::Gradient, None) => builder.algorithm(Gradient::default()),
        (AdaptiveAlgorithmKind::Gradient, Some(n)) => {
            builder.algorithm(Gradient::default().probe_every(n.0).map_err(at)?)
        }
    };
    if s.ignore_cancelled_calls {
        builder = builder.ignore_cancelled_calls();
    }
    Ok(builder.build())
}

pub(super) fn build_pushback(name: &str, s: &PushbackSettings) -> Pushback {
    Pushback::builder(name)
        .max_wait(s.max_wait)
        .max_hold(s.max_hold)
        .pacing(match s.pacing {
            PacingKind::UntilSpent => Pacing::UntilSpent,
            PacingKind::Spread => Pacing::Spread,
        })
        .build()
}

pub(super) fn bulkhead_builder(name: &str, s: &BulkheadSettings) -> BulkheadBuilder {
    let size = s.max_concurrent_calls.0 as usize;
    let builder = match s.queue_capacity {
        Some(capacity) => Bulkhead::queue(name, size, capacity.0 as usize),
        None => Bulkhead::semaphore(name, size),
    };
    builder.given(s.max_wait, BulkheadBuilder::max_wait)
}
