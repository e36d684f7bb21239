//! Events, metrics and tracing of named rate limiters.
//!
//! [`Observed`] wraps any [`Limiter`] with a name. It counts decisions by outcome, remembers what
//! the latest decision left, counts requests waiting for a reservation, and emits a `tracing`
//! debug event on every refusal with the instance name, the key (unless keys are hidden) and the
//! retry delay. With the `metrics` feature it also feeds the `metrics` facade, under the
//! [names below](#metric-names).
//!
//! Bulkheads report through their own hooks and snapshot (see [`crate::bulkhead`]); the
//! configuration registry wires both to metrics.
//!
//! ## Metric names
//!
//! Every metric the crate records, with its type and labels.
//!
//! Every series carries the label `name`, the instance name.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `bulwark_ratelimiter_calls_total` | counter | `name`, `outcome` = `allowed` \| `limited` \| `refunded` | decisions by outcome; `refunded` counts admissions given back (another policy refused the request, or its waiter went away), so requests admitted in the end are `allowed − refunded` |
//! | `bulwark_ratelimiter_available_permissions` | gauge | `name` | permits left after the latest decision recorded (for its key; of decisions racing on several threads, the one recorded last, which may be one made a moment before another: the next decision sets it right) |
//! | `bulwark_ratelimiter_waiting_requests` | gauge | `name` | requests holding a reservation that has not fallen due |
//! | `bulwark_ratelimiter_store_failures_total` | counter | `name` | decisions a shared store (Redis) did not give, decided by the fail mode instead |
//! | `bulwark_ratelimiter_lease_decisions_total` | counter | `name` | admissions a Redis limiter with leases (`redis::RedisRateLimiterBuilder::lease`) made from a share, without a round trip |
//! | `bulwark_ratelimiter_leases_total` | counter | `name`, `outcome` = `taken` \| `ended` | leases a Redis limiter took, and ended (when spent or over; the unused permits go back to Redis) |
//! | `bulwark_ratelimiter_lease_unused_permits_total` | counter | `name` | permits those leases gave back unused |
//! | `bulwark_ratelimit_shadow_refusals_total` | counter | `name` (the policy's) | requests a [shadow](crate::rate_limit::Policy::shadow) policy would have refused and the layer let through |
//! | `bulwark_bulkhead_calls_total` | counter | `name`, `outcome` = `permitted` \| `rejected` \| `finished` | calls by outcome |
//! | `bulwark_bulkhead_available_concurrent_calls` | gauge | `name` | free permits |
//! | `bulwark_bulkhead_max_allowed_concurrent_calls` | gauge | `name` | the current limit; an adaptive bulkhead (feature `adaptive`) also sets it each time its limit moves |
//! | `bulwark_bulkhead_queue_depth` | gauge | `name` | calls waiting for a permit |
//! | `bulwark_bulkhead_call_duration_seconds` | histogram | `name` | how long each permitted call held its permit |
//! | `bulwark_pushback_calls_total` | counter | `name`, `outcome` = `admitted` \| `waited` \| `refused` | calls through a [pushback](crate::outbound::Pushback): sent at once, sent after waiting for a hold to end, or refused with [`PushedBack`](crate::outbound::PushedBack) (at once or after waiting); a call dropped while it waits is not counted |
//! | `bulwark_pushback_holds_total` | counter | `name`, `reason` = `retry_after` \| `ratelimit` \| `x_ratelimit` \| `openai` \| `anthropic` \| `custom` | answers that asked for calls to be held: a 429 or 503 with `Retry-After` (or a 429 naming no time, held one second), or an advertised quota with nothing left, under its dialect (`RateLimit`; `X-RateLimit-Remaining` with `-Reset`; OpenAI's or Anthropic's families; a dialect of your own); an answer saying several counts once under each |
//! | `bulwark_pushback_held_seconds` | gauge | `name` | seconds until a call may be sent, by what the dependency said last (zero when one may go now) |
//! | `bulwark_client_quota_calls_total` | counter | `name`, `outcome` = `admitted` \| `waited` \| `refused` \| `failed` | calls through a [client quota](crate::outbound::ClientQuotaLayer): sent at once, sent after waiting for their permits, refused with [`QuotaExhausted`](crate::outbound::QuotaExhausted), or failed by the limiter's error; a call dropped while it waits (its permits given back) is not counted |
//! | `bulwark_retry_attempts_total` | counter | `name`, `kind` = `first` \| `retry` | attempts through a [retry layer](crate::outbound) (feature `adaptive`): each call's first, and each retry sent |
//! | `bulwark_retry_skipped_total` | counter | `name`, `reason` = `budget` \| `wait` | retries of transient answers not made: the budget held none, or the answer asked for a longer wait than `max_wait`; the call ended with that answer |
//! | `bulwark_overload_limit` | gauge | `name` | an overload protection's limit of requests in flight (feature `adaptive`) |
//! | `bulwark_overload_in_flight` | gauge | `name` | requests it holds in flight, until their bodies end |
//! | `bulwark_overload_queue_depth` | gauge | `name` | requests waiting in its queue |
//! | `bulwark_overload_requests_total` | counter | `name`, `outcome` = `admitted` \| `shed`, `priority` = `critical` \| `default` \| `sheddable` | requests admitted (at once or from the queue) and shed, by class |
//! | `bulwark_breaker_state` | gauge | `name` | a [circuit breaker](crate::outbound)'s state (feature `adaptive`): 0 closed, 1 open, 2 half-open; set at each transition |
//! | `bulwark_breaker_calls_total` | counter | `name`, `outcome` = `success` \| `failure` \| `slow` \| `refused` | calls through it: counted in its window (a failure, slow or not; slow, not failed; neither), or refused with `BreakerOpen`; calls not counted (ignored by the classifier, dropped) are not |
//!
//! Counters and the histogram are recorded as events happen. Gauges are set from each
//! instance's state when `config::Registry::publish_gauges` (feature `config`)
//! runs (call it before rendering a scrape), and the rate limiter gauges also after each decision.
//! The store failure counter and the lease counters are also brought up to date by
//! `publish_gauges`, from the Redis limiter's own counts.
//!
//! An overload protection sets its gauges as its state changes.
//!
//! Pushbacks and client quotas record whether built by hand or from a config file; a pushback's
//! gauge is set by `outbound::Pushback::publish_gauges` (feature `metrics`)
//! (which `Registry::publish_gauges` calls for configured ones). A configured client quota's
//! limiter also records the `bulwark_ratelimiter_*` series under the rate limiter's name.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::time::Instant;

use crate::limiter::BoxReserve;
use crate::sync::{lock, Mutex};
use crate::{decision::Decision, BoxError, Limiter, Quota};

/// The names of the metrics, as the table in the [module docs](self) gives them.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) mod metric_names {
    /// Counter: rate limiter decisions, label `outcome` = `allowed` | `limited`.
    pub(crate) const RATELIMITER_CALLS: &str = "bulwark_ratelimiter_calls_total";
    /// Gauge: permits left after the latest decision.
    pub(crate) const RATELIMITER_AVAILABLE: &str = "bulwark_ratelimiter_available_permissions";
    /// Gauge: requests holding a reservation not yet due.
    pub(crate) const RATELIMITER_WAITING: &str = "bulwark_ratelimiter_waiting_requests";
    #[cfg(all(feature = "redis", feature = "config"))] // Read by the config's registry.
    /// Counter: decisions a shared store (Redis) did not give; the fail mode decided them.
    pub(crate) const RATELIMITER_STORE_FAILURES: &str = "bulwark_ratelimiter_store_failures_total";
    #[cfg(all(feature = "redis", feature = "config"))] // Read by the config's registry.
    /// Counter: admissions made from a lease of a Redis limiter, without a round trip.
    pub(crate) const RATELIMITER_LEASE_DECISIONS: &str =
        "bulwark_ratelimiter_lease_decisions_total";
    #[cfg(all(feature = "redis", feature = "config"))] // Read by the config's registry.
    /// Counter: leases a Redis limiter took and ended, label `outcome` = `taken` | `ended`.
    pub(crate) const RATELIMITER_LEASES: &str = "bulwark_ratelimiter_leases_total";
    #[cfg(all(feature = "redis", feature = "config"))] // Read by the config's registry.
    /// Counter: permits leases gave back unused.
    pub(crate) const RATELIMITER_LEASE_UNUSED: &str =
        "bulwark_ratelimiter_lease_unused_permits_total";
    /// Counter: requests a shadow policy would have refused (and let through); label `name` =
    /// the policy's name.
    pub(crate) const RATELIMIT_SHADOW_REFUSALS: &str = "bulwark_ratelimit_shadow_refusals_total";
    /// Counter: bulkhead calls, label `outcome` = `permitted` | `rejected` | `finished`.
    pub(crate) const BULKHEAD_CALLS: &str = "bulwark_bulkhead_calls_total";
    /// Gauge: free bulkhead permits.
    pub(crate) const BULKHEAD_AVAILABLE: &str = "bulwark_bulkhead_available_concurrent_calls";
    /// Gauge: the bulkhead's current limit.
    pub(crate) const BULKHEAD_MAX: &str = "bulwark_bulkhead_max_allowed_concurrent_calls";
    /// Gauge: calls waiting for a bulkhead permit.
    pub(crate) const BULKHEAD_QUEUE: &str = "bulwark_bulkhead_queue_depth";
    /// Histogram: seconds each permitted bulkhead call held its permit.
    pub(crate) const BULKHEAD_DURATION: &str = "bulwark_bulkhead_call_duration_seconds";
    /// Counter: calls through a pushback, label `outcome` = `admitted` | `waited` | `refused`.
    pub(crate) const PUSHBACK_CALLS: &str = "bulwark_pushback_calls_total";
    /// Counter: answers that asked a pushback to hold calls, label `reason` = `retry_after` |
    /// `ratelimit` | `x_ratelimit` | `openai` | `anthropic` | `custom` (`HOLD_REASONS` in
    /// `outbound/metrics.rs`).
    pub(crate) const PUSHBACK_HOLDS: &str = "bulwark_pushback_holds_total";
    /// Gauge: seconds until a pushback lets a call go.
    pub(crate) const PUSHBACK_HELD_SECONDS: &str = "bulwark_pushback_held_seconds";
    /// Counter: calls through a client quota, label `outcome` = `admitted` | `waited` |
    /// `refused` | `failed`.
    pub(crate) const CLIENT_QUOTA_CALLS: &str = "bulwark_client_quota_calls_total";
    #[cfg(feature = "adaptive")]
    /// Counter: attempts through a retry layer, by `kind` (`first` | `retry`).
    pub(crate) const RETRY_ATTEMPTS: &str = "bulwark_retry_attempts_total";
    #[cfg(feature = "adaptive")]
    /// Counter: retries not made, by `reason` (`budget` | `wait`).
    pub(crate) const RETRY_SKIPPED: &str = "bulwark_retry_skipped_total";
    #[cfg(feature = "adaptive")]
    /// Gauge: an overload protection's limit.
    pub(crate) const OVERLOAD_LIMIT: &str = "bulwark_overload_limit";
    #[cfg(feature = "adaptive")]
    /// Gauge: requests in flight under an overload protection.
    pub(crate) const OVERLOAD_IN_FLIGHT: &str = "bulwark_overload_in_flight";
    #[cfg(feature = "adaptive")]
    /// Gauge: requests waiting in an overload protection's queue.
    pub(crate) const OVERLOAD_QUEUE: &str = "bulwark_overload_queue_depth";
    #[cfg(feature = "adaptive")]
    /// Counter: requests by outcome (`admitted` | `shed`) and `priority`.
    pub(crate) const OVERLOAD_REQUESTS: &str = "bulwark_overload_requests_total";
    #[cfg(feature = "adaptive")]
    /// Gauge: a circuit breaker's state, 0 closed, 1 open, 2 half-open.
    pub(crate) const BREAKER_STATE: &str = "bulwark_breaker_state";
    #[cfg(feature = "adaptive")]
    /// Counter: calls through a circuit breaker, label `outcome` = `success` | `failure` |
    /// `slow` | `refused`.
    pub(crate) const BREAKER_CALLS: &str = "bulwark_breaker_calls_total";
}

/// A point-in-time view of an observed rate limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimiterSnapshot {
    /// Decisions that admitted the request and were not refunded (a request that another
    /// policy refused, or whose waiter went away, is not counted). A settle, even to zero,
    /// leaves its admission counted: the request was admitted, whatever it turned out to cost.
    pub allowed: u64,
    /// Decisions that refused it.
    pub limited: u64,
    /// Permits left after the latest decision recorded, for that decision's key (and back up by
    /// its cost if that decision is given back; a refund of an older decision does not change
    /// it). Of decisions racing on several threads, the one recorded last, which may have been
    /// made a moment before another.
    pub available_permissions: u64,
    /// Requests holding a reservation that has not fallen due.
    pub waiting_requests: u64,
}

/// What an [`Observed`] limiter has counted, shared by its clones.
#[derive(Default)]
struct Observations {
    name: Arc<str>,
    allowed: AtomicU64,
    limited: AtomicU64,
    available: AtomicU64,
    /// The [`tag`](Decision::tag) of the decision whose `remaining` the gauge shows.
    latest: AtomicU64,
    /// Outstanding reservations.
    waiting: Mutex<Reservations>,
    /// The limiter's metric handles, registered with the recorder at the first decision.
    #[cfg(feature = "metrics")]
    handles: std::sync::OnceLock<Handles>,
}

/// The `metrics` handles of one observed limiter, registered once so that a decision records
/// without building keys or allocating.
///
/// They are registered with the recorder installed at the limiter's first decision (not when it
/// is built), so building the limiters before installing the recorder is fine; install it before
/// the first request.
#[cfg(feature = "metrics")]
struct Handles {
    allowed: metrics::Counter,
    limited: metrics::Counter,
    refunded: metrics::Counter,
    available: metrics::Gauge,
    waiting: metrics::Gauge,
}

#[cfg(feature = "metrics")]
impl Handles {
    fn register(name: &str) -> Self {
        let name = name.to_owned();
        let calls = |outcome: &'static str| metrics::counter!(metric_names::RATELIMITER_CALLS, "name" => name.clone(), "outcome" => outcome);
        Self {
            allowed: calls("allowed"),
            limited: calls("limited"),
            refunded: calls("refunded"),
            available: metrics::gauge!(metric_names::RATELIMITER_AVAILABLE, "name" => name.clone()),
            waiting: metrics::gauge!(metric_names::RATELIMITER_WAITING, "name" => name),
        }
    }
}

/// Outstanding reservations, found by the instant they were reserved for (to take one off when
/// it is given back) and by the instant their wait ends (to drop the ended ones from the front).
///
/// Every operation is O(log n) in the reservations outstanding, and ended ones are dropped as
/// soon as anything looks, so neither memory nor the cost of a decision grows with the traffic
/// that went before.
#[derive(Default)]
struct Reservations {
    /// The limiter's `reserved_at` → (when the wait ends, how many share that instant).
    by_slot: HashMap<u64, (Instant, u64)>,
    /// (when the wait ends, `reserved_at`), soonest first.
    by_due: BTreeSet<(Instant, u64)>,
    /// The sum of the counts in `by_slot`.
    total: u64,
}

impl Reservations {
    fn add(&mut self, reserved_at: u64, due: Instant) {
        let entry = self.by_slot.entry(reserved_at).or_insert((due, 0));
        if entry.1 == 0 {
            self.by_due.insert((entry.0, reserved_at));
        }
        entry.1 += 1;
        self.total += 1;
    }

    fn remove_one(&mut self, reserved_at: u64) {
        let Some((due, count)) = self.by_slot.get_mut(&reserved_at) else {
            return;
        };
        *count -= 1;
        self.total -= 1;
        if *count == 0 {
            self.by_due.remove(&(*due, reserved_at));
            self.by_slot.remove(&reserved_at);
        }
    }

    /// Drops the reservations whose wait has ended by `now`; returns how many remain.
    fn outstanding(&mut self, now: Instant) -> u64 {
        while let Some(&(_, reserved_at)) = self.by_due.first().filter(|(due, _)| *due <= now) {
            self.by_due.pop_first();
            if let Some((_, n)) = self.by_slot.remove(&reserved_at) {
                self.total -= n;
            }
        }
        self.total
    }
}

impl Observations {
    #[cfg(feature = "metrics")]
    fn handles(&self) -> &Handles {
        self.handles.get_or_init(|| Handles::register(&self.name))
    }

    fn record(&self, decision: &Decision, key: Option<&str>) {
        self.latest.store(decision.tag(), Ordering::Relaxed);
        self.available.store(decision.remaining, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.handles().available.set(decision.remaining as f64);
        if decision.allowed {
            self.allowed.fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            self.handles().allowed.increment(1);
            if !decision.wait.is_zero() {
                let now = Instant::now();
                let mut waiting = lock(&self.waiting);
                waiting.outstanding(now);
                waiting.add(decision.charged().at, now + decision.wait);
                #[cfg(feature = "metrics")]
                self.handles().waiting.set(waiting.total as f64);
            }
        } else {
            self.limited.fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            self.handles().limited.increment(1);
            let retry_after_ms = crate::decision::ceil_millis(decision.retry_after);
            tracing::debug!(
                limiter = %self.name,
                key = %key.unwrap_or("(hidden)"),
                retry_after_ms,
                "rate limit refused a request"
            );
        }
    }

    /// Takes back what [`record`](Self::record) counted for an admission, if the inner limiter
    /// `taken` it back (settled it), and returns `taken`. Given back whole (a request another
    /// policy refused, a waiter that went away), it no longer counts as allowed and its
    /// reservation no longer waits; either way its permits gauge moves by what was given back or
    /// charged.
    fn unrecord(&self, taken: bool, decision: &TakenBack) -> bool {
        if !taken {
            return false;
        }
        if decision.whole {
            let _ = (self.allowed)
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            #[cfg(feature = "metrics")]
            self.handles().refunded.increment(1);
            if decision.waited {
                lock(&self.waiting).remove_one(decision.reserved_at);
            }
        }
        // The gauge shows the latest decision's figure. If that is still this decision's (the
        // usual case: a veto given back at once), it moves; a settle of an older decision, even
        // one that left the same figure, leaves the latest decision's alone.
        let latest = self.latest.load(Ordering::Relaxed) == decision.tag;
        if latest
            && (self.available)
                .compare_exchange(
                    decision.remaining,
                    decision.available,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            #[cfg(feature = "metrics")]
            self.handles().available.set(decision.available as f64);
        }
        true
    }
}

/// What [`Observations::unrecord`] needs of a settled decision, read before the decision goes
/// to the inner limiter's settle (which consumes it).
struct TakenBack {
    remaining: u64,
    /// The permits left once the settle gave back or charged the difference.
    available: u64,
    /// Given back whole (a refund): the admission no longer counts.
    whole: bool,
    waited: bool,
    reserved_at: u64,
    tag: u64,
}

impl TakenBack {
    /// `decision`, of which `estimate` permits are settled to `cost`.
    fn of(decision: &Decision, estimate: u32, cost: u32, whole: bool) -> Self {
        let estimate = u64::from(decision.refundable(estimate));
        Self {
            remaining: decision.remaining,
            available: (decision.remaining + estimate)
                .saturating_sub(u64::from(cost))
                .min(decision.limit),
            whole,
            waited: !decision.wait.is_zero(),
            reserved_at: decision.charged().at,
            tag: decision.tag(),
        }
    }
}

/// A limiter with a name, counted and traced.
///
/// Clones share the counters. The key type must be `Debug` for the refusal event; set
/// [`hide_keys`](Self::hide_keys) to keep keys out of logs.
#[derive(Clone)]
pub struct Observed<L> {
    inner: L,
    observations: Arc<Observations>,
    hide_keys: bool,
}

impl<L> Observed<L> {
    /// Wraps `limiter` under `name`.
    pub fn new(name: impl Into<Arc<str>>, limiter: L) -> Self {
        Self {
            inner: limiter,
            hide_keys: false,
            observations: Arc::new(Observations {
                name: name.into(),
                ..Observations::default()
            }),
        }
    }

    /// Leaves keys out of the refusal events (for keys that identify people).
    pub fn hide_keys(mut self, hide: bool) -> Self {
        self.hide_keys = hide;
        self
    }

    /// The instance name.
    pub fn name(&self) -> &str {
        &self.observations.name
    }

    /// The wrapped limiter.
    pub fn get_ref(&self) -> &L {
        &self.inner
    }

    /// The key as a refusal's event shows it: formatted only when a debug event could be
    /// emitted and keys are not hidden.
    fn key_for_event(&self, key: &impl fmt::Debug) -> Option<String> {
        (!self.hide_keys && tracing::enabled!(tracing::Level::DEBUG)).then(|| format!("{key:?}"))
    }

    /// The counters and gauges as they stand.
    pub fn snapshot(&self) -> LimiterSnapshot {
        LimiterSnapshot {
            allowed: self.observations.allowed.load(Ordering::Relaxed),
            limited: self.observations.limited.load(Ordering::Relaxed),
            available_permissions: self.observations.available.load(Ordering::Relaxed),
            waiting_requests: lock(&self.observations.waiting).outstanding(Instant::now()),
        }
    }

    /// Sets this limiter's gauges in the `metrics` facade from its current state.
    #[cfg(feature = "metrics")]
    pub fn publish_gauges(&self) {
        let s = self.snapshot();
        let handles = self.observations.handles();
        handles.available.set(s.available_permissions as f64);
        handles.waiting.set(s.waiting_requests as f64);
    }
}

impl<L> fmt::Debug for Observed<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observed")
            .field("name", &self.observations.name)
            .field("snapshot", &self.snapshot())
            .finish_non_exhaustive()
    }
}

impl<K: fmt::Debug, L: Limiter<K>> Limiter<K> for Observed<L> {
    /// Boxed: the decisions of limiters that need I/O, where an allocation is small beside the
    /// round trip; the others are made at once by `reserve_now`.
    type Future = BoxReserve;

    fn quota(&self) -> Quota {
        self.inner.quota()
    }

    fn quota_for(&self, key: &K) -> Quota {
        self.inner.quota_for(key)
    }

    /// Changes the wrapped limiter's quota (see [`Limiter::set_quota`]), and says so in an
    /// info event with the limiter's name and both quotas. The counters carry on.
    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        let old = self.inner.quota();
        self.inner.set_quota(quota)?;
        tracing::info!(
            limiter = %self.observations.name,
            old = ?old,
            new = ?quota,
            "rate limit quota changed",
        );
        Ok(())
    }

    fn reserve(&self, key: &K, cost: u32) -> Self::Future {
        let decision = self.inner.reserve(key, cost);
        let observations = Arc::clone(&self.observations);
        // The decision is not known yet, so the key is kept in case it is a refusal.
        let key = self.key_for_event(key);
        Box::pin(async move {
            let result = decision.await;
            if let Ok(decision) = &result {
                observations.record(decision, key.as_deref());
            }
            result
        })
    }

    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        let result = self.inner.reserve_now(key, cost)?;
        if let Ok(decision) = &result {
            // Only a refusal's event names the key.
            let shown = (!decision.allowed)
                .then(|| self.key_for_event(key))
                .flatten();
            self.observations.record(decision, shown.as_deref());
        }
        Some(result)
    }

    /// Gives back through the wrapped limiter, and takes back what the decision counted, as if
    /// it had never been made. Only what the inner limiter takes back as its own is uncounted:
    /// another limiter's decision, or one for another key, changed nothing there.
    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        let seen = TakenBack::of(&decision, cost, 0, true);
        (self.observations).unrecord(self.inner.refund(key, cost, decision), &seen)
    }

    /// Settles through the wrapped limiter. The admission still counts as allowed, and the
    /// permits gauge moves by what the settle gave back or charged while the decision is still
    /// the latest.
    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        let seen = TakenBack::of(&decision, estimate, cost, false);
        (self.observations).unrecord(self.inner.settle(key, estimate, decision, cost), &seen)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{clock::ManualClock, KeyedRateLimiter};

    /// Reservations whose wait has ended leave the map even when no snapshot is ever taken:
    /// under steady waiting traffic it stays bounded by what is outstanding.
    #[tokio::test(start_paused = true)]
    async fn ended_waits_do_not_pile_up_without_snapshots() {
        let clock = ManualClock::new();
        let quota = Quota::per_second(1000)
            .unwrap()
            .with_burst(1)
            .unwrap()
            .with_max_wait(Duration::from_millis(10))
            .unwrap();
        let limiter = KeyedRateLimiter::<u64>::builder(quota)
            .clock(clock.clone())
            .build();
        let observed = Observed::new("waits", limiter);
        let mut most = 0;
        for key in 0..10_000u64 {
            // Each key: one permit now, the next reserved a millisecond ahead, at an instant of
            // its own.
            clock.advance(Duration::from_micros(1));
            for _ in 0..2 {
                observed.reserve_now(&key, 1).unwrap().unwrap();
            }
            if key % 100 == 99 {
                tokio::time::advance(Duration::from_millis(2)).await;
            }
            let waiting = observed.observations.waiting.lock().unwrap();
            most = most.max(waiting.by_slot.len()).max(waiting.by_due.len());
        }
        // At most the last hundred are outstanding.
        assert!(most <= 100, "the map grew to {most}");
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(observed.snapshot().waiting_requests, 0);
    }
}
