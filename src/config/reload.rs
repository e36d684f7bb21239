//! Reloading a running [`Registry`]: quotas and bulkhead sizes change in place, under the layers
//! already built; anything else is refused, whole.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use super::file::*;
use super::{ConfigError, Registry};
use crate::sync::lock;
use crate::Limiter;

/// What a reload applied: the instances whose settings changed, by name, in name order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reloaded {
    /// Rate limiters whose quota changed.
    pub rate_limiters: Vec<String>,
    /// Bulkheads whose `max_concurrent_calls` changed.
    pub bulkheads: Vec<String>,
}

impl Registry {
    /// Reads the file again and applies it to the running instances, in place: the layers and
    /// services already built from them see the change at once, and every key keeps its state.
    /// The way to apply an operator's edit of the file the registry was built from.
    ///
    /// What changes in place: a rate limiter's quota (`limit_for_period`,
    /// `limit_refresh_period`, `burst`, `max_wait`), given to its limiter as
    /// [`Limiter::set_quota`](crate::Limiter::set_quota) does (see
    /// [`KeyedRateLimiter::set_quota`](crate::KeyedRateLimiter::set_quota) for what each
    /// algorithm keeps), and a bulkhead's `max_concurrent_calls`, as
    /// [`Bulkhead::set_max_concurrent_calls`](crate::bulkhead::Bulkhead::set_max_concurrent_calls)
    /// does. An instance whose settings are unchanged is not touched at all: what is unchanged
    /// is judged against the file last applied, so a change made in code since (a
    /// `set_quota`, a `set_max_concurrent_calls`) stays until the file changes that setting.
    ///
    /// Anything else cannot change under the layers already serving, so a reload that changes
    /// it is refused as a whole, with an error naming the instance and the field: a rate
    /// limiter's `algorithm`, `key`, `trusted_proxies`, `forwarded_header`, `max_keys`,
    /// `hide_keys`, `store` or Redis settings, a bulkhead's `max_wait` or `queue_capacity`, any
    /// setting of a pushback (`max_wait`, `max_hold`, `pacing`: the calls already held were
    /// admitted under them), of a client quota (`limiter`, `cost`: the layers already built
    /// hold them), of an adaptive bulkhead (its limit moves by itself) or of a route, and an
    /// instance added or removed. A client quota's quota is its rate limiter's, and changes in
    /// place with it. (Build a new registry for those, and take new layers from it.) A Redis
    /// limiter's fail mode keeps what it was built from; Redis limiters in other processes
    /// keep their quota until their own registry reloads (the quota travels with each call).
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
    ///
    /// # Errors
    ///
    /// A file that cannot be read, one [`from_toml_str`](Self::from_toml_str) refuses, a
    /// refused change, or a quota a Redis script cannot run: the error changes nothing.
    /// Reloads apply one at a time.
    pub fn reload_path(&self, path: impl AsRef<Path>) -> Result<Reloaded, ConfigError> {
        self.reload_toml_str(&ConfigError::read(path.as_ref())?)
    }

    /// [`reload_path`](Self::reload_path) with a TOML document.
    ///
    /// # Errors
    ///
    /// As [`reload_path`](Self::reload_path), for a document.
    pub fn reload_toml_str(&self, text: &str) -> Result<Reloaded, ConfigError> {
        let config = Config::from_toml_str(text)?;
        self.reload(config).map_err(|e| e.located_in(text))
    }

    fn reload(&self, next: Config) -> Result<Reloaded, ConfigError> {
        let mut running = lock(&self.running);
        let now = &*running;
        same_instances("rate_limiters", &now.rate_limiters, &next.rate_limiters)?;
        same_instances("bulkheads", &now.bulkheads, &next.bulkheads)?;
        same_instances("pushbacks", &now.pushbacks, &next.pushbacks)?;
        same_instances("client_quotas", &now.client_quotas, &next.client_quotas)?;
        let adaptive = (&now.adaptive_bulkheads, &next.adaptive_bulkheads);
        same_instances("adaptive_bulkheads", adaptive.0, adaptive.1)?;
        same_instances("overload", &now.overload, &next.overload)?;
        same_instances("breakers", &now.breakers, &next.breakers)?;
        same_instances("retries", &now.retries, &next.retries)?;
        same_instances("routes", &now.routes, &next.routes)?;
        let mut quotas = Vec::new();
        for (name, limiter) in &next.rate_limiters {
            let path = format!("rate_limiters.{name}");
            let quota = limiter.quota(&path)?;
            if now.rate_limiters[name].quota(&path)? == quota {
                continue;
            }
            #[cfg(feature = "redis")]
            if let Some(redis) = &self.limiters[name].redis {
                redis
                    .params_as_built(&quota)
                    .map_err(|e| super::build::redis_error(&path, &e))?;
            }
            quotas.push((name, quota));
        }
        // Everything checked: apply.
        let mut reloaded = Reloaded::default();
        for (name, quota) in quotas {
            self.limiters[name]
                .limiter
                .set_quota(quota)
                .map_err(|e| ConfigError::new(format!("rate_limiters.{name}"), e.to_string()))?;
            reloaded.rate_limiters.push(name.clone());
        }
        for (name, bulkhead) in &next.bulkheads {
            let size = bulkhead.max_concurrent_calls;
            if now.bulkheads[name].max_concurrent_calls != size {
                self.bulkheads[name].set_max_concurrent_calls(size.0 as usize);
                reloaded.bulkheads.push(name.clone());
            }
        }
        *running = next;
        Ok(reloaded)
    }
}

/// The settings of one kind of instance, as a reload sees them.
trait Reloadable {
    /// The first setting that differs from `next` and cannot change under the layers already
    /// built (every setting but a rate limiter's quota and a bulkhead's size).
    fn fixed_change(&self, next: &Self) -> Option<Change>;
}

/// A setting that changed.
struct Change {
    field: &'static str,
    from: String,
    to: String,
}

/// A [`Change`] of `field` if `now` and `next` differ.
fn differ<T: PartialEq + fmt::Debug>(field: &'static str, now: &T, next: &T) -> Option<Change> {
    (now != next).then(|| Change {
        field,
        from: format!("{now:?}"),
        to: format!("{next:?}"),
    })
}

/// An error unless `next` holds the same instances as `now`, each with the same fixed
/// settings.
fn same_instances<T: Reloadable>(
    section: &str,
    now: &BTreeMap<String, T>,
    next: &BTreeMap<String, T>,
) -> Result<(), ConfigError> {
    if let Some(name) = next.keys().find(|name| !now.contains_key(*name)) {
        return Err(ConfigError::new(
            format!("{section}.{name}"),
            "is not in the running registry; an instance cannot be added by a reload (build a \
             new registry with it)",
        ));
    }
    if let Some(name) = now.keys().find(|name| !next.contains_key(*name)) {
        return Err(ConfigError::new(
            format!("{section}.{name}"),
            "is missing; an instance cannot be removed from a running registry (build a new \
             registry without it)",
        ));
    }
    for (name, next) in next {
        if let Some(Change { field, from, to }) = now[name].fixed_change(next) {
            return Err(ConfigError::new(
                format!("{section}.{name}.{field}"),
                format!(
                    "changed from {from} to {to}, which a running registry cannot apply in place \
                     (only a rate limiter's quota and a bulkhead's max_concurrent_calls can be); \
                     build a new registry for it"
                ),
            ));
        }
    }
    Ok(())
}

/// `Reloadable` for a kind whose listed fields are all fixed: the first that differs.
macro_rules! fixed_fields {
    ($($kind:ty => [$($field:ident),+];)+) => {$(
        impl Reloadable for $kind {
            fn fixed_change(&self, next: &Self) -> Option<Change> {
                None$(.or_else(|| differ(stringify!($field), &self.$field, &next.$field)))+
            }
        }
    )+};
}

// A rate limiter's quota and a bulkhead's `max_concurrent_calls` are the settings of these kinds
// that change in place; the validation filled in the defaults that depend on another field.
fixed_fields! {
    RateLimiterSettings => [
        algorithm, key, trusted_proxies, forwarded_header, max_keys, hide_keys, store, redis_url,
        redis_prefix, redis_timeout, redis_fail_mode, fallback_limit_for_period, redis_leases,
        redis_lease_max_share, redis_lease_length
    ];
    BulkheadSettings => [max_wait, queue_capacity];
    PushbackSettings => [max_wait, max_hold, pacing];
    ClientQuotaSettings => [limiter, cost];
    AdaptiveBulkheadSettings => [
        min_limit, initial_limit, max_limit, algorithm, probe_every, ignore_cancelled_calls
    ];
    RouteSettings => [policies, exempt_networks];
    OverloadSettings => [
        min_limit, initial_limit, max_limit, probe_every, critical_guarantee, default_guarantee,
        critical_borrowing, priority_header, queue_capacity, max_wait
    ];
    BreakerSettings => [
        window_calls, window_seconds, minimum_calls, failure_rate, slow_call_rate,
        slow_call_duration, open_for, half_open_calls
    ];
    RetrySettings => [max_attempts, base, cap, max_wait, ratio, min_per_second, window];
}
