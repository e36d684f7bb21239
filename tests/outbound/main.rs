//! The outbound layers: pushback, client quotas, the circuit breaker, the documented stack around a `reqwest`
//! client, their metrics (counted by this binary's allocator), and the `partner_api` example.

#[path = "../common/mod.rs"]
mod common;

/// The pushback's default `max_hold`, as `PushbackBuilder::max_hold`'s docs say: ten minutes.
const DEFAULT_MAX_HOLD: std::time::Duration = std::time::Duration::from_secs(600);
#[path = "../common/counting.rs"]
mod counting;

mod answer_order;
#[cfg(feature = "adaptive")]
mod attack_breaker_waits;
mod attack_held;
mod attack_lanes;
mod attack_lanes_more;
mod attack_one_value;
mod attack_pushback_readers;
#[cfg(feature = "adaptive")]
mod attack_quota_budget;
#[cfg(feature = "adaptive")]
mod attack_resilience;
#[cfg(feature = "adaptive")]
mod attack_retries;
mod attack_seam;
#[cfg(feature = "adaptive")]
mod attack_waits;
#[cfg(feature = "adaptive")]
mod breaker;
#[cfg(all(feature = "adaptive", feature = "metrics"))]
mod breaker_events;
#[cfg(all(feature = "adaptive", feature = "grpc"))]
mod breaker_grpc;
#[cfg(feature = "adaptive")]
mod breaker_probes;
#[cfg(all(feature = "adaptive", feature = "reqwest"))]
mod breaker_stack;
mod client_quota;
#[cfg(feature = "reqwest")]
mod dialects;
mod dialects_hostile;
mod dialects_mixed_hostile;
mod dialects_support;
mod hostile;
mod hostile_client_quota;
mod hostile_in_flight;
mod hostile_refusal_times;
mod hostile_support;
#[cfg(all(feature = "metrics", feature = "reqwest"))]
mod metered;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(all(feature = "adaptive", feature = "axum", feature = "reqwest"))]
mod outage_example;
#[cfg(all(feature = "axum", feature = "reqwest"))]
mod partner_api_example;
mod pushback;
mod pushback_hostile;
#[cfg(feature = "adaptive")]
mod retry;
mod retry_after_hostile;
#[cfg(feature = "adaptive")]
mod retry_budget;
#[cfg(all(feature = "adaptive", feature = "reqwest"))]
mod retry_stack;
#[cfg(feature = "reqwest")]
mod settle_from_body;
mod several_quotas;
#[cfg(feature = "reqwest")]
mod stack;
mod tokens;
