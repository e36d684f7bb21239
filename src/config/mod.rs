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
//! key = "peer_ip"             # peer_ip | forwarded_ip | header:x-api-key | global
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
//! Behind a load balancer every connection comes from the balancer, so `peer_ip` would give
//! every client one budget; `forwarded_ip` keys by the client address the balancer forwards:
//!
//! ```toml
//! [rate_limiters.api]
//! limit_for_period = 10
//! limit_refresh_period = "1s"
//! key = "forwarded_ip"
//! trusted_proxies = ["10.0.0.0/8"]    # the balancers; required
//! forwarded_header = "forwarded"      # x-forwarded-for (the default) | forwarded
//! ```
//!
//! Nothing is guessed. A duration must carry its unit (`500ms`, `1s`, `2m`, `1h`, or several
//! together such as `1m30s`): `limit_refresh_period = 500` is an error, because one library reads
//! a bare 500 as nanoseconds and another as milliseconds. Unknown fields, zero limits and values
//! out of range are errors that name the instance and the field, with its line and column
//! ([`ConfigError`]).
//!
//! Fields of a rate limiter:
//!
//! | field | type | default |
//! |---|---|---|
//! | `limit_for_period` | integer ≥ 1 | required |
//! | `limit_refresh_period` | duration > 0 | required |
//! | `burst` | integer ≥ 1: what GCRA admits at once after an idle spell (the window algorithms admit `limit_for_period` per window and ignore it, as `Quota::with_burst` says) | `limit_for_period` |
//! | `max_wait` | duration | `"0s"` (refuse at once) |
//! | `algorithm` | `gcra`, `fixed_window`, `sliding_log`, `sliding_counter` | `gcra` |
//! | `key` | `peer_ip` (the TCP peer), `forwarded_ip` (the client behind trusted proxies), `header:<name>` (values up to 256 bytes), `global` | `peer_ip` |
//! | `trusted_proxies` | with `key = "forwarded_ip"`, required: the proxies (list of CIDRs) whose forwarding header is believed; a request from any other peer is keyed by the peer, whatever it wrote (see `rate_limit::ForwardedIp`, feature `axum`; an unreadable hop is a `400`) | none |
//! | `forwarded_header` | with `key = "forwarded_ip"`: `x-forwarded-for`, or `forwarded` (RFC 7239) | `x-forwarded-for` |
//! | `max_keys` | integer ≥ 1: the most keys the in-memory store keeps (with `store = "redis"`, Redis keeps the keys and this plays no part) | 1 000 000 |
//! | `hide_keys` | boolean: keep client keys out of log events | `false` |
//! | `store` | `memory`, or `redis` (feature `redis`) for one quota across every instance | `memory` |
//! | `redis_url` | `redis://host:port` | required with `store = "redis"` |
//! | `redis_prefix` | key prefix, without `{` or `}` | `bulwark:<algorithm>:` |
//! | `redis_timeout` | duration > 0: how long a decision may wait for Redis | the store's default |
//! | `redis_fail_mode` | `local` (decide with a local limiter of the instance's own quota: each instance admits at most the quota while Redis cannot answer), `open` (admit), `closed` (refuse), or `fallback` (decide with a local limiter of `fallback_limit_for_period`) while Redis cannot answer | `local` |
//! | `fallback_limit_for_period` | integer ≥ 1: the local limiter's permits per period, with `fallback` | required with `fallback` |
//! | `redis_leases` | boolean: lease shares of each key's permits (not with `sliding_log`; see `redis::RedisRateLimiterBuilder::lease`) | `false` |
//! | `redis_lease_max_share` | with `redis_leases`: integer ≥ 1, at most the burst | a quarter of the burst |
//! | `redis_lease_length` | with `redis_leases`: duration > 0 | a tenth of the period, from 1 ms to 1 s |
//!
//! Fields of a bulkhead:
//!
//! | field | type | default |
//! |---|---|---|
//! | `max_concurrent_calls` | integer ≥ 1 | required |
//! | `max_wait` | duration ≤ 2^60 ns | semaphore: `"0s"` (refuse at once); queue: no bound |
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
//! | `policies` | list of rate limiter names, or tables `{ limiter, cost, shadow }`: `cost` an integer ≥ 1 (default 1) and at most what the limiter can grant at once (its `burst` with `gcra`, its `limit_for_period` with a window algorithm), `shadow` `true` (never refuses, not in the headers), `"advertised"` (never refuses, in the headers) or `false` | required |
//! | `exempt_networks` | list of CIDRs (feature `axum`) | none |
//!
//! Outbound calls to a dependency have two more kinds: a pushback, which holds calls back as
//! the dependency's `Retry-After` and rate-limit fields ask ([`Registry::pushback`]), and
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
//! | `cost` | integer ≥ 1, at most what the limiter can grant at once (its `burst` with `gcra`, its `limit_for_period` with a window algorithm): the permits each call takes | 1 |
//!
//! With the `adaptive` feature, a bulkhead whose limit follows the dependency
//! (`Registry::adaptive_bulkhead`, with the `adaptive` feature; see `bulkhead::adaptive`):
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
//! | `max_limit` | integer ≥ `min_limit`, at most 2^31 − 1 | 256, or `min_limit` or `initial_limit` if higher |
//! | `algorithm` | `aimd` (additive increase, multiplicative decrease) or `gradient` (delay-based) | `aimd` |
//! | `probe_every` | integer ≥ 1: the algorithm's baseline is the lowest latency of the uncrowded round trips over two periods of this many, probed for at `min_limit` when there was none (`Aimd::probe_every`, `Gradient::probe_every`) | none (a baseline learnt slowly) |
//! | `ignore_cancelled_calls` | boolean: a call dropped before it ended is no sample (by default it is an overload signal) | `false` |
//!
//! With the `adaptive` feature, an overload protection of the whole service
//! (`Registry::overload`; see `overload`), each request's class read from a header:
//!
//! ```toml
//! [overload.api]
//! critical_guarantee = 0.3
//! priority_header = "x-priority"  # critical | default | sheddable; absent or other: default
//! queue_capacity = 32             # with max_wait: wait instead of being shed at once
//! max_wait = "100ms"
//! ```
//!
//! | field of an overload protection | type | default |
//! |---|---|---|
//! | `min_limit`, `initial_limit`, `max_limit` | integers, `1 <= min_limit <= initial_limit <= max_limit <= 2^31 - 1`: the bounds of the limit of requests in flight and where it starts | 8, 16, 1000, each brought within those written (`max_limit = 4` alone makes 4, 4, 4) |
//! | `probe_every` | integer ≥ 1: the period, in round trips, of the limit's baseline, probed for at `min_limit` when there was none (`Aimd::probe_every`) | 300 |
//! | `critical_guarantee` | number from 0, below 1: the share of the limit the lower classes never take (in whole requests, at most all but one: `OverloadBuilder::guarantee`) | 0.3 |
//! | `default_guarantee` | number from 0, below 1 with `critical_guarantee`: the share `sheddable` never takes besides | 0.1 |
//! | `critical_borrowing` | number from 1 to 100: `critical`'s ceiling in times the limit | 3 |
//! | `priority_header` | a header name: the header whose value names the class | `"x-priority"` |
//! | `queue_capacity` | integer ≥ 1, with `max_wait`: requests that may wait for a place | none (shed at once) |
//! | `max_wait` | duration ≤ 60 s, with `queue_capacity`: the longest a request waits | none |
//!
//! With the `adaptive` feature, a circuit breaker in front of a dependency
//! (`Registry::breaker`; see `outbound::breaker`); a field left out keeps the builder's
//! default:
//!
//! ```toml
//! [breakers.partner]
//! window_calls = 100              # or window_seconds = 10, not both
//! minimum_calls = 20
//! failure_rate = 0.5
//! open_for = "1s"
//! half_open_calls = 10
//! ```
//!
//! | field of a circuit breaker | type | default |
//! |---|---|---|
//! | `window_calls` | integer from 1 to 100 000: the rates are taken over the last calls counted | 100 |
//! | `window_seconds` | integer from 1 to 100 000: the rates are taken over the calls that ended in the last seconds | none |
//! | `minimum_calls` | integer ≥ 1, at most `window_calls`: the fewest calls in the window for it to open | 20, or `window_calls` if fewer |
//! | `failure_rate`, `slow_call_rate` | numbers above 0, at most 1: the share of failed, or slow, calls that opens it | 0.5, 1 |
//! | `slow_call_duration` | duration above zero, ≤ 2^60 ns: a call longer than this is slow | `"10s"` |
//! | `open_for` | duration above zero, ≤ 2^60 ns: how long it stays open before probing | `"1s"` |
//! | `half_open_calls` | integer ≥ 1: the probes that decide whether it closes | 10 |
//!
//! With the `adaptive` feature, the retries of a dependency with their budget
//! (`Registry::retry`; see `outbound::retry`):
//!
//! ```toml
//! [retries.partner]
//! max_attempts = 3                # the first attempt and two retries
//! max_wait = "5s"                 # a longer Retry-After ends the call with its answer
//! ratio = 0.2                     # retries: at most a fifth of the calls...
//! min_per_second = 3              # ...plus 3 a second
//! ```
//!
//! | field of retries | type | default |
//! |---|---|---|
//! | `max_attempts` | integer from 1 to 10: attempts of one call, the first included | 3 |
//! | `base`, `cap` | durations, `base <= cap <= 1h`: the backoff before retry n is random up to `base × 2^(n − 1)`, at most `cap` | `"50ms"`, `"1s"`, each brought within the one written (`cap = "10ms"` alone makes `base` 10 ms; `base` above `"1s"` alone makes `cap` as long, up to an hour) |
//! | `max_wait` | duration ≤ 1 h: the longest a retry waits for the time an answer or refusal asks | `"5s"` |
//! | `ratio` | number from 0 to 10: the retry each call deposits in the budget | 0.2 |
//! | `min_per_second` | integer ≥ 0: retries a second the budget grants with no deposit (the window's worth at once) | 3 |
//! | `window` | duration from 10 ms to 1 h: how long deposits last | `"10s"` |
//!
//! A running [`Registry`] reloads its file with [`Registry::reload_path`]: changed quotas and
//! bulkhead sizes apply in place, under the layers already built, and every key keeps its state
//! (a client quota's limiter included); a change that cannot apply in place (any setting of a
//! pushback, of a client quota, of an adaptive bulkhead, of an overload protection, whose
//! limits move by themselves, of a circuit breaker or of retries), or a bad file, is refused
//! and changes nothing.

mod breaker;
mod build;
mod duration;
mod error;
mod fields;
mod file;
mod health;
mod overload;
mod registry;
mod reload;
mod retry;
mod validate;

pub use error::ConfigError;
#[cfg(feature = "adaptive")]
pub use health::BreakerHealth;
pub use health::{BulkheadHealth, Health, LimiterHealth, PushbackHealth};
pub use registry::{
    ConfigKey, ConfiguredClientQuotaLayer, ConfiguredLimiter, ConfiguredPolicy,
    ConfiguredRateLimitLayer, Registry, UnknownInstance,
};
pub use reload::Reloaded;

use file::Config;

impl Config {
    /// Parses and validates a TOML document; an error names the field at fault with its line
    /// and column.
    fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let mut config: Self =
            toml::from_str(text).map_err(|e| ConfigError::from_toml(text, &e))?;
        config.validate().map_err(|e| e.located_in(text))?;
        Ok(config)
    }
}

/// What a file parses into, where the registry's instances do not show it; and the check of
/// bad values that the sections' own tests share.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::fields::Count;
    use super::file::*;
    use super::Config;
    use crate::outbound::pushback::DEFAULT_MAX_HOLD;
    use crate::Quota;

    fn parse(text: &str) -> Config {
        Config::from_toml_str(text).unwrap()
    }

    /// Checks that each case, the body of the section `[section]` beside the field its error
    /// must name, is refused by the registry at that section with an error naming the field.
    #[cfg(feature = "adaptive")]
    pub(super) fn assert_refused_naming_field(section: &str, cases: &[(&str, &str)]) {
        for (body, field) in cases {
            let text = format!("[{section}]\n{body}\n");
            let err = super::Registry::from_toml_str(&text).unwrap_err();
            assert!(
                err.path().starts_with(section) && err.to_string().contains(field),
                "{body}: {err}"
            );
        }
    }

    #[test]
    fn a_good_file_means_what_it_says() {
        let config = parse(
            "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
             algorithm = \"gcra\"\nkey = \"peer_ip\"\n\
             [rate_limiters.partners]\nlimit_for_period = 1000\nlimit_refresh_period = \"1h\"\n\
             algorithm = \"sliding_log\"\nkey = \"header:x-api-key\"\nmax_keys = 5000\n\
             hide_keys = true\n\
             [bulkheads.payment]\nmax_concurrent_calls = 2\n\
             [bulkheads.inventory]\nmax_concurrent_calls = 8\nqueue_capacity = 16\n",
        );
        let api = &config.rate_limiters["api"];
        assert_eq!(api.algorithm, AlgorithmKind::Gcra);
        assert_eq!(api.key, KeyKind::PeerIp);
        assert_eq!(api.max_keys, Count(crate::limiter::DEFAULT_MAX_KEYS as u32));
        assert!(!api.hide_keys);
        let partners = &config.rate_limiters["partners"];
        assert_eq!(partners.algorithm, AlgorithmKind::SlidingLog);
        let header = http::HeaderName::from_static("x-api-key");
        assert_eq!(partners.key, KeyKind::Header(header));
        assert_eq!(partners.max_keys, Count(5000));
        assert!(partners.hide_keys);
        assert_eq!(config.bulkheads["payment"].queue_capacity, None);
        assert_eq!(
            config.bulkheads["inventory"].queue_capacity,
            Some(Count(16))
        );
    }

    #[test]
    fn a_forwarded_key_reads_its_proxies_and_header() {
        let base = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
                    key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\", \"2001:db8::/32\"]\n";
        let proxies = ["10.0.0.0/8", "2001:db8::/32"].map(|c| c.parse().unwrap());
        for (extra, header) in [
            ("", ForwardedHeader::XForwardedFor),
            (
                "forwarded_header = \"x-forwarded-for\"\n",
                ForwardedHeader::XForwardedFor,
            ),
            (
                "forwarded_header = \"forwarded\"\n",
                ForwardedHeader::Forwarded,
            ),
        ] {
            let config = parse(&format!("{base}{extra}"));
            let api = &config.rate_limiters["api"];
            assert_eq!(api.key, KeyKind::ForwardedIp);
            assert_eq!(api.trusted_proxies.as_deref(), Some(&proxies[..]));
            // Filled in when left out, so that a reload sees the same setting either way.
            assert_eq!(api.forwarded_header, Some(header));
        }
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_settings_are_read() {
        let config = parse(
            "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
             store = \"redis\"\nredis_url = \"redis://127.0.0.1/\"\n\
             redis_fail_mode = \"fallback\"\nfallback_limit_for_period = 3\n\
             redis_timeout = \"50ms\"\n\
             [rate_limiters.local]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
             store = \"redis\"\nredis_url = \"redis://127.0.0.1/\"\n\
             [rate_limiters.open]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
             store = \"redis\"\nredis_url = \"redis://127.0.0.1/\"\nredis_fail_mode = \"open\"\n",
        );
        let api = &config.rate_limiters["api"];
        assert_eq!(api.store, StoreKind::Redis);
        assert_eq!(api.redis_fail_mode, Some(RedisFailModeKind::Fallback));
        assert_eq!(api.fallback_limit_for_period, Some(Count(3)));
        assert_eq!(api.redis_timeout, Some(Duration::from_millis(50)));
        // Left out, the fail mode is the local limiter (filled in by the validation).
        let local = &config.rate_limiters["local"];
        assert_eq!(local.redis_fail_mode, Some(RedisFailModeKind::Local));
        let open = &config.rate_limiters["open"];
        assert_eq!(open.redis_fail_mode, Some(RedisFailModeKind::Open));
    }

    #[cfg(feature = "adaptive")]
    #[test]
    fn adaptive_bulkheads_parse_with_their_defaults() {
        let config = parse(
            "[adaptive_bulkheads.payment]\nmin_limit = 2\ninitial_limit = 4\nmax_limit = 32\n\
             algorithm = \"gradient\"\nignore_cancelled_calls = true\nprobe_every = 20\n\
             [adaptive_bulkheads.search]\n",
        );
        let payment = &config.adaptive_bulkheads["payment"];
        assert_eq!(payment.limits(), (2, 4, 32));
        assert_eq!(payment.algorithm, AdaptiveAlgorithmKind::Gradient);
        assert_eq!(payment.probe_every, Some(Count(20)));
        assert!(payment.ignore_cancelled_calls);
        let search = &config.adaptive_bulkheads["search"];
        assert_eq!(search.limits(), (1, 8, 256));
        assert_eq!(search.algorithm, AdaptiveAlgorithmKind::Aimd);
        assert_eq!(search.probe_every, None);
        assert!(!search.ignore_cancelled_calls);
    }

    #[test]
    fn outbound_sections_parse_with_their_defaults() {
        let config = parse(
            "[rate_limiters.partner-quota]\nlimit_for_period = 3\nlimit_refresh_period = \"1h\"\n\
             key = \"global\"\n\
             [pushbacks.partner]\nmax_wait = \"2s\"\nmax_hold = \"5m\"\npacing = \"spread\"\n\
             [pushbacks.defaults]\n\
             [pushbacks.until-spent]\npacing = \"until_spent\"\n\
             [client_quotas.partner]\nlimiter = \"partner-quota\"\n\
             [client_quotas.partner-bulk]\nlimiter = \"partner-quota\"\ncost = 2\n",
        );
        let partner = &config.pushbacks["partner"];
        assert_eq!(partner.max_wait, Duration::from_secs(2));
        assert_eq!(partner.max_hold, Duration::from_secs(300));
        assert_eq!(partner.pacing, PacingKind::Spread);
        let defaults = &config.pushbacks["defaults"];
        assert_eq!(defaults.max_wait, Duration::ZERO);
        assert_eq!(defaults.max_hold, DEFAULT_MAX_HOLD);
        assert_eq!(defaults.pacing, PacingKind::UntilSpent);
        assert_eq!(
            config.pushbacks["until-spent"].pacing,
            PacingKind::UntilSpent
        );
        let quota = &config.client_quotas["partner"];
        assert_eq!(
            (quota.limiter.as_str(), quota.cost),
            ("partner-quota", Count(1))
        );
        assert_eq!(config.client_quotas["partner-bulk"].cost, Count(2));
        // 2^60 ns, `Quota::MAX_SPAN`, is the longest wait.
        let max = Quota::MAX_SPAN.as_nanos();
        let at_bound = parse(&format!("[pushbacks.p]\nmax_wait = \"{max}ns\"\n"));
        assert_eq!(at_bound.pushbacks["p"].max_wait, Quota::MAX_SPAN);
    }

    /// (`exempt_networks` reads the TCP peer, which needs the `axum` feature.)
    #[cfg(feature = "axum")]
    #[test]
    fn a_route_parses_into_its_policies() {
        use crate::rate_limit::Shadow;

        let config = parse(
            "[rate_limiters.per-ip]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
             [rate_limiters.per-key]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
             [rate_limiters.next-quota]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
             [routes.search]\npolicies = [\"per-ip\", { limiter = \"per-key\", cost = 5 }, \
             { limiter = \"next-quota\", shadow = true }]\nexempt_networks = [\"10.0.0.0/8\"]\n\
             [routes.items]\npolicies = [\"per-ip\", { limiter = \"per-key\", shadow = \
             \"advertised\" }]\n",
        );
        let search = &config.routes["search"];
        let got: Vec<_> = (search.policies.iter())
            .map(|p| (p.limiter.as_str(), p.cost.0, p.shadow))
            .collect();
        assert_eq!(
            got,
            [
                ("per-ip", 1, Shadow::Off),
                ("per-key", 5, Shadow::Off),
                ("next-quota", 1, Shadow::Silent)
            ]
        );
        assert_eq!(search.exempt_networks.len(), 1);
        let items = &config.routes["items"];
        assert_eq!(items.policies[1].shadow, Shadow::Advertised);
        assert!(items.exempt_networks.is_empty());
    }
}
