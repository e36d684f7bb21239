//! The file as serde reads it, one struct per kind (validated in [`validate`](super::validate)).
//!
//! The registry builds from these structs once they are validated. Fields with a fixed default
//! take it from serde; the few whose default depends on another field are filled in by the
//! validation, so that two files meaning the same settings compare equal on a reload.
//! Required fields that serde alone would report at the instance are `Option`s, so that a
//! missing one is an error at its own path; the readers of [`fields`](super::fields) check what
//! one value alone can say (a count's bounds, a duration's unit).

use std::collections::BTreeMap;
use std::time::Duration;

pub(super) use super::breaker::BreakerSettings;
use super::duration::{optional, with_units};
pub(super) use super::overload::OverloadSettings;
pub(super) use super::retry::RetrySettings;

use super::fields::{choice, cidrs, instances, policies, some_choice, some_cidrs, Count};
use crate::limiter::DEFAULT_MAX_KEYS;
use crate::outbound::pushback::DEFAULT_MAX_HOLD;
use crate::rate_limit::{Cidr, Shadow};

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
    #[serde(deserialize_with = "instances")]
    pub(super) overload: BTreeMap<String, OverloadSettings>,
    #[serde(deserialize_with = "instances")]
    pub(super) breakers: BTreeMap<String, BreakerSettings>,
    #[serde(deserialize_with = "instances")]
    pub(super) retries: BTreeMap<String, RetrySettings>,
}

/// `[rate_limiters.NAME]`.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RateLimiterSettings {
    /// The quota's four fields, read as one by `quota` (in [`validate`](super::validate)).
    pub(super) limit_for_period: Count,
    #[serde(deserialize_with = "with_units")]
    pub(super) limit_refresh_period: Duration,
    pub(super) burst: Option<Count>,
    #[serde(default, deserialize_with = "optional")]
    pub(super) max_wait: Option<Duration>,
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

/// Which algorithm a rate limiter uses (its name in the file is its script's in Redis).
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
#[serde(rename_all = "kebab-case")]
pub(super) enum ForwardedHeader {
    #[default]
    XForwardedFor,
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
    Local,
    Open,
    Closed,
    /// With `fallback_limit_for_period`.
    Fallback,
}

/// `[bulkheads.NAME]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct BulkheadSettings {
    pub(super) max_concurrent_calls: Count<MAX_LIMIT>,
    /// For a semaphore bulkhead zero (refuse at once) when absent, for a queue bulkhead no
    /// bound.
    #[serde(default, deserialize_with = "optional")]
    pub(super) max_wait: Option<Duration>,
    /// With a value, a queue bulkhead holding up to this many waiting calls.
    pub(super) queue_capacity: Option<Count<MAX_LIMIT>>,
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
    pub(super) shadow: Shadow,
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
    pub(super) probe_every: Option<Count>,
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

/// The bound of a bulkhead's limit and queue, of either kind, and of an overload protection's
/// limits: the largest limit a bulkhead accepts.
pub(super) const MAX_LIMIT: u32 = crate::bulkhead::MAX_CONCURRENT_CALLS as u32;
