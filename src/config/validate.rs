//! The one validation pass over the file's structs ([`file`](super::file)): every instance's
//! fields against each other and against their bounds, and the names instances give each other.
//! The defaults that depend on another field are filled in here.

use std::collections::BTreeMap;
use std::time::Duration;

use super::fields::Count;
use super::file::*;
use super::ConfigError;
use crate::Quota;

/// The path of one instance (`rate_limiters.api`), for errors at its fields.
pub(super) struct InstancePath<'a>(pub(super) &'a str);

impl InstancePath<'_> {
    /// The instance's name, after its section's.
    #[cfg(feature = "adaptive")]
    pub(super) fn name(&self) -> &str {
        self.0.split_once('.').map_or(self.0, |(_, name)| name)
    }

    /// An error at `field` of the instance.
    pub(super) fn err(&self, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(format!("{}.{field}", self.0), message)
    }

    /// An error at the instance unless this build has the `adaptive` feature; `kind_needs` begins
    /// its message, such as "an overload protection needs".
    pub(super) fn needs_adaptive(&self, kind_needs: &str) -> Result<(), ConfigError> {
        if cfg!(feature = "adaptive") {
            return Ok(());
        }
        let lacks = format!("{kind_needs} the crate's `adaptive` feature, which this build lacks");
        Err(ConfigError::new(self.0, lacks))
    }

    /// Fills in the limits left out of `limits` (`min_limit`, `initial_limit`, `max_limit`):
    /// each its default in `defaults` brought within the values written, so that a file that
    /// writes only `max_limit = 4` lowers the default minimum rather than being refused for a
    /// field it did not write. Then checks `min_limit <= initial_limit <= max_limit`, naming a
    /// field written.
    #[cfg(feature = "adaptive")]
    pub(super) fn limits(
        &self,
        limits: [&mut Option<Count<MAX_LIMIT>>; 3],
        defaults: [u32; 3],
    ) -> Result<(), ConfigError> {
        let [min, initial, max] = limits.each_ref().map(|n| n.map(|Count(n)| n));
        let lowest_written = initial.into_iter().chain(max).min().unwrap_or(u32::MAX);
        let min = min.unwrap_or(defaults[0].min(lowest_written));
        let max = max.unwrap_or(defaults[2].max(min).max(initial.unwrap_or(0)));
        // `max` and `min`, not `clamp`, which panics on bounds written the wrong way round.
        let initial = initial.unwrap_or(defaults[1].max(min).min(max));
        for (limit, n) in limits.into_iter().zip([min, initial, max]) {
            *limit = Some(Count(n));
        }
        if min > max {
            return Err(self.err("min_limit", format!("is {min}, above max_limit ({max})")));
        }
        if !(min..=max).contains(&initial) {
            let outside = format!("is {initial}, outside min_limit..=max_limit ({min}..={max})");
            return Err(self.err("initial_limit", outside));
        }
        Ok(())
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

impl Config {
    /// Checks every instance and the names they give each other: the one validation pass.
    pub(super) fn validate(&mut self) -> Result<(), ConfigError> {
        let limiters = RateLimiterSettings::validate;
        let adaptive = AdaptiveBulkheadSettings::validate;
        each("rate_limiters", &mut self.rate_limiters, limiters)?;
        each("bulkheads", &mut self.bulkheads, BulkheadSettings::validate)?;
        each("routes", &mut self.routes, RouteSettings::validate)?;
        each("pushbacks", &mut self.pushbacks, PushbackSettings::validate)?;
        each("adaptive_bulkheads", &mut self.adaptive_bulkheads, adaptive)?;
        each("overload", &mut self.overload, OverloadSettings::validate)?;
        each("breakers", &mut self.breakers, BreakerSettings::validate)?;
        each("retries", &mut self.retries, RetrySettings::validate)?;
        self.check_names()
    }

    /// Checks the names instances give each other: a route's and a client quota's rate
    /// limiters exist and can grant their cost, and no bulkhead of either kind shares a name.
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
                let at = format!("routes.{name}.policies[{i}]");
                let limiter = self.limiter(&at, &policy.limiter)?;
                check_cost(&at, policy.cost, &policy.limiter, limiter)?;
            }
        }
        // A client quota's rate limiter must count every call under one key.
        for (name, quota) in &self.client_quotas {
            let at = format!("client_quotas.{name}");
            let limiter = self.limiter(&format!("{at}.limiter"), &quota.limiter)?;
            if limiter.key != KeyKind::Global {
                return Err(ConfigError::new(
                    format!("{at}.limiter"),
                    format!(
                        "names `{0}`, whose key is not \"global\"; an outbound call has no client to \
                         key by, so a client quota counts every call under one key: give \
                         `rate_limiters.{0}` key = \"global\"",
                        quota.limiter
                    ),
                ));
            }
            check_cost(&at, quota.cost, &quota.limiter, limiter)?;
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
}

/// Checks each instance of `section` with `validate`, at the instance's path, in name order.
fn each<T>(
    section: &str,
    instances: &mut BTreeMap<String, T>,
    validate: fn(&mut T, &InstancePath<'_>) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    (instances.iter_mut()).try_for_each(|(name, settings)| {
        validate(settings, &InstancePath(&format!("{section}.{name}")))
    })
}

/// The cost (at `{at}.cost`) of rate limiter `name` must fit what the limiter can ever grant at
/// once: its burst with GCRA, its permits per window with the window algorithms.
fn check_cost(
    at: &str,
    Count(cost): Count,
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
            format!("{at}.cost"),
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
        let quota = Quota::with_period(self.limit_for_period.0, self.limit_refresh_period)
            .and_then(|q| self.burst.map_or(Ok(q), |Count(burst)| q.with_burst(burst)))
            .and_then(|q| self.max_wait.map_or(Ok(q), |wait| q.with_max_wait(wait)));
        quota.map_err(|e| {
            // `burst` and `max_wait` are the file's names too (and a burst of `permits`, the
            // default, always fits the period: `with_period` refuses only these two).
            let field = match e.field() {
                "permits" => "limit_for_period",
                "period" => "limit_refresh_period",
                field => field,
            };
            InstancePath(path).err(field, e.to_string())
        })
    }

    fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        self.quota(at.0)?;
        let forwarded = self.key == KeyKind::ForwardedIp;
        let what = "key = \"forwarded_ip\"";
        at.only_with("trusted_proxies", &self.trusted_proxies, forwarded, what)?;
        at.only_with("forwarded_header", &self.forwarded_header, forwarded, what)?;
        if forwarded {
            // Never trust a forwarding header unless the operator named who may send it.
            match self.trusted_proxies.as_deref() {
                None => return Err(at.err("trusted_proxies", "is required")),
                Some([]) => return Err(at.err("trusted_proxies", "must name at least one proxy")),
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
        // The defaults written in, so that writing them out is no change.
        #[cfg(feature = "redis")]
        self.redis_timeout
            .get_or_insert(crate::redis::DEFAULT_TIMEOUT);
        #[cfg(feature = "redis")]
        self.redis_prefix.get_or_insert_with(|| {
            let name = match self.algorithm {
                AlgorithmKind::Gcra => "gcra",
                AlgorithmKind::FixedWindow => "fixed_window",
                AlgorithmKind::SlidingLog => "sliding_log",
                AlgorithmKind::SlidingCounter => "sliding_counter",
            };
            crate::redis::default_prefix(name)
        });
        Ok(())
    }
}

impl RouteSettings {
    fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        if self.policies.is_empty() {
            return Err(at.err("policies", "must name at least one rate limiter"));
        }
        for (i, policy) in self.policies.iter().enumerate() {
            let limiter = &policy.limiter;
            if self.policies[..i].iter().any(|p| &p.limiter == limiter) {
                let twice = format!("names `{limiter}` a second time");
                return Err(at.err(&format!("policies[{i}]"), twice));
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
    fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
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

/// Limits that [`InstancePath::limits`] filled in, as a `Limits` takes them.
#[cfg(feature = "adaptive")]
pub(super) fn filled(limits: [Option<Count<MAX_LIMIT>>; 3]) -> (usize, usize, usize) {
    let [min, initial, max] = limits.map(|limit| limit.map_or(0, |Count(n)| n as usize));
    (min, initial, max)
}

impl AdaptiveBulkheadSettings {
    /// The lowest, initial and highest limit (filled in by the validation).
    #[cfg(feature = "adaptive")]
    pub(super) fn limits(&self) -> (usize, usize, usize) {
        filled([self.min_limit, self.initial_limit, self.max_limit])
    }

    fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        at.needs_adaptive("an adaptive bulkhead needs")?;
        #[cfg(feature = "adaptive")]
        at.limits(
            [
                &mut self.min_limit,
                &mut self.initial_limit,
                &mut self.max_limit,
            ],
            crate::bulkhead::adaptive::DEFAULT_LIMITS,
        )?;
        Ok(())
    }
}
