//! The state of the configured rate limiters, bulkheads, pushbacks and circuit breakers, for a
//! health endpoint.

use super::Registry;
use crate::observe::LimiterSnapshot;
use crate::rate_limit::json_string;

impl Registry {
    /// The state of every rate limiter, bulkhead (fixed and adaptive), pushback and circuit
    /// breaker (feature `adaptive`), for a health endpoint. Overload protections, retries and
    /// client quotas are not in it: read their own state (`Overload::limit`,
    /// `Retry::budget_available`).
    ///
    /// A saturated instance is working as intended (a limiter refusing during a peak, a
    /// bulkhead with every permit taken), so it is reported as saturated and `UP`: an
    /// orchestrator that restarted a service for it would make the peak worse.
    pub fn health(&self) -> Health {
        let bulkheads = (self.bulkheads.iter()).map(|(name, b)| (name, b.snapshot()));
        #[cfg(feature = "adaptive")]
        let bulkheads =
            bulkheads.chain((self.adaptive_bulkheads.iter()).map(|(name, b)| (name, b.snapshot())));
        let mut bulkheads_by_name: Vec<_> = bulkheads
            .map(|(name, snapshot)| BulkheadHealth {
                name: name.clone(),
                saturated: snapshot.available_concurrent_calls == 0,
                snapshot,
            })
            .collect();
        // Fixed and adaptive alike, in name order as the other lists are.
        bulkheads_by_name.sort_by(|a, b| a.name.cmp(&b.name));
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
                        store_failures: named.store_failures(),
                    }
                })
                .collect(),
            bulkheads: bulkheads_by_name,
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
            #[cfg(feature = "adaptive")]
            breakers: (self.breakers.iter())
                .map(|(name, breaker)| BreakerHealth {
                    name: name.clone(),
                    state: breaker.state(),
                })
                .collect(),
        }
    }

    /// Sets every instance's gauges in the `metrics` facade from its current state; call it
    /// before rendering a scrape. Counters and the call-duration histogram are recorded as
    /// events happen. See [the metric names](crate::observe#metric-names).
    #[cfg(feature = "metrics")]
    pub fn publish_gauges(&self) {
        for named in self.limiters.values() {
            named.limiter.publish_gauges();
        }
        #[cfg(feature = "redis")]
        for (name, named) in &self.limiters {
            use crate::observe::metric_names as m;
            if let Some(redis) = &named.redis {
                let counts = redis.counts();
                metrics::counter!(m::RATELIMITER_STORE_FAILURES, "name" => name.clone())
                    .absolute(counts.failures);
                metrics::counter!(m::RATELIMITER_LEASE_DECISIONS, "name" => name.clone())
                    .absolute(counts.lease_decisions);
                for (outcome, count) in [
                    ("taken", counts.leases_taken),
                    ("ended", counts.leases_ended),
                ] {
                    metrics::counter!(m::RATELIMITER_LEASES, "name" => name.clone(), "outcome" => outcome)
                        .absolute(count);
                }
                metrics::counter!(m::RATELIMITER_LEASE_UNUSED, "name" => name.clone())
                    .absolute(counts.lease_unused_permits);
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
        #[cfg(feature = "adaptive")]
        for breaker in self.breakers.values() {
            breaker.publish_gauges();
        }
    }
}

/// The state of the configured rate limiters, bulkheads, pushbacks and circuit breakers; see
/// [`Registry::health`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// One entry per rate limiter, by name.
    pub rate_limiters: Vec<LimiterHealth>,
    /// One entry per bulkhead, fixed or adaptive, in name order.
    pub bulkheads: Vec<BulkheadHealth>,
    /// One entry per pushback, by name.
    pub pushbacks: Vec<PushbackHealth>,
    /// One entry per circuit breaker, by name.
    #[cfg(feature = "adaptive")]
    pub breakers: Vec<BreakerHealth>,
}

/// The health entry of one circuit breaker (feature `adaptive`).
#[cfg(feature = "adaptive")]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerHealth {
    /// The instance name.
    pub name: String,
    /// Where it stands. An open breaker keeps a failing dependency's calls from this service,
    /// which is the breaker doing its job: it is reported, and `UP`.
    pub state: crate::outbound::breaker::BreakerState,
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
    /// Free permits, the limit, the queue and the running totals.
    pub snapshot: crate::bulkhead::BulkheadSnapshot,
}

impl Health {
    /// Always `"UP"`: saturation is reported, never counted as ill health.
    pub fn status(&self) -> &'static str {
        "UP"
    }

    /// The report as JSON:
    /// `{"status":"UP","rateLimiters":{"api":{...}},"bulkheads":{"payment":{...}},"pushbacks":{"partner":{...}}}`,
    /// and with feature `adaptive` `"circuitBreakers":{"partner":{...}}` last.
    ///
    /// A rate limiter's entry has `status`, `saturated`, `availablePermissions`,
    /// `waitingRequests`, `allowedCalls`, `limitedCalls`, and for one kept in Redis
    /// `storeFailures`; a bulkhead's has `status`, `saturated`, `availableConcurrentCalls`,
    /// `maxAllowedConcurrentCalls`, `queueDepth`, `permittedCalls`, `rejectedCalls` and
    /// `finishedCalls`; a pushback's has `status`, `holding` and `heldForMillis` (rounded up,
    /// so a hold in force is never 0); a circuit breaker's has `status` and `state`
    /// (`"CLOSED"`, `"OPEN"` or `"HALF_OPEN"`, as Resilience4j names them).
    pub fn to_json(&self) -> String {
        let limiters = self.rate_limiters.iter().map(|l| {
            let failures = l.store_failures.map(|n| format!(",\"storeFailures\":{n}"));
            let fields = format!(
                "\"saturated\":{},\"availablePermissions\":{},\"waitingRequests\":{},\"allowedCalls\":{},\"limitedCalls\":{}{}",
                l.saturated,
                l.snapshot.available_permissions,
                l.snapshot.waiting_requests,
                l.snapshot.allowed,
                l.snapshot.limited,
                failures.unwrap_or_default()
            );
            (l.name.as_str(), fields)
        });
        let bulkheads = self.bulkheads.iter().map(|b| {
            let fields = format!(
                "\"saturated\":{},\"availableConcurrentCalls\":{},\"maxAllowedConcurrentCalls\":{},\"queueDepth\":{},\"permittedCalls\":{},\"rejectedCalls\":{},\"finishedCalls\":{}",
                b.saturated,
                b.snapshot.available_concurrent_calls,
                b.snapshot.max_allowed_concurrent_calls,
                b.snapshot.queue_depth,
                b.snapshot.total_permitted,
                b.snapshot.total_rejected,
                b.snapshot.total_finished
            );
            (b.name.as_str(), fields)
        });
        let pushbacks = self.pushbacks.iter().map(|p| {
            let millis = crate::decision::ceil_millis(p.held_for);
            let fields = format!("\"holding\":{},\"heldForMillis\":{millis}", p.holding);
            (p.name.as_str(), fields)
        });
        let mut out = String::from("{\"status\":\"UP\",\"rateLimiters\":");
        push_entries(&mut out, limiters);
        out.push_str(",\"bulkheads\":");
        push_entries(&mut out, bulkheads);
        out.push_str(",\"pushbacks\":");
        push_entries(&mut out, pushbacks);
        #[cfg(feature = "adaptive")]
        {
            use crate::outbound::breaker::BreakerState;
            let breakers = self.breakers.iter().map(|b| {
                let state = match b.state {
                    BreakerState::Closed => "CLOSED",
                    BreakerState::Open { .. } => "OPEN",
                    BreakerState::HalfOpen => "HALF_OPEN",
                };
                (b.name.as_str(), format!("\"state\":\"{state}\""))
            });
            out.push_str(",\"circuitBreakers\":");
            push_entries(&mut out, breakers);
        }
        out.push('}');
        out
    }
}

/// Appends a JSON object with one member per entry: its name, and an object of its `status`
/// (always `"UP"`) and its fields, already written as JSON members.
fn push_entries<'a>(out: &mut String, entries: impl Iterator<Item = (&'a str, String)>) {
    out.push('{');
    for (i, (name, fields)) in entries.enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_string(out, name);
        out.push_str(":{\"status\":\"UP\",");
        out.push_str(&fields);
        out.push('}');
    }
    out.push('}');
}

#[cfg(all(test, feature = "adaptive"))]
mod tests {
    use super::*;
    use crate::outbound::breaker::BreakerState;

    /// Each state is written under the name Resilience4j gives it.
    #[test]
    fn a_breakers_state_is_written_as_resilience4j_names_it() {
        let open = BreakerState::Open {
            until: std::time::Duration::from_secs(1),
        };
        let states = [BreakerState::Closed, open, BreakerState::HalfOpen];
        let health = Health {
            rate_limiters: Vec::new(),
            bulkheads: Vec::new(),
            pushbacks: Vec::new(),
            breakers: (states.iter().zip(["a", "b", "c"]))
                .map(|(state, name)| BreakerHealth {
                    name: name.into(),
                    state: *state,
                })
                .collect(),
        };
        assert_eq!(
            health.to_json(),
            "{\"status\":\"UP\",\"rateLimiters\":{},\"bulkheads\":{},\"pushbacks\":{},\
             \"circuitBreakers\":{\"a\":{\"status\":\"UP\",\"state\":\"CLOSED\"},\
             \"b\":{\"status\":\"UP\",\"state\":\"OPEN\"},\
             \"c\":{\"status\":\"UP\",\"state\":\"HALF_OPEN\"}}}"
        );
    }
}
