//! The HTTP rate-limit layer: decisions and answers through axum's router, policies, the
//! rate-limit headers, the request head its closures see, exemptions, the response future's
//! permits in every state, and what a key costs in memory (counted by this binary's allocator).

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/counting.rs"]
mod counting;

#[cfg(all(feature = "axum", feature = "reqwest"))]
mod attack_concurrency;
#[cfg(feature = "grpc")]
mod attack_grpc;
#[cfg(feature = "axum")]
mod attack_http;
#[cfg(feature = "axum")]
mod attack_keys;
#[cfg(feature = "axum")]
mod attack_settle;
#[cfg(all(feature = "axum", feature = "reqwest"))]
mod attack_slots;
#[cfg(feature = "axum")]
mod attack_tier_slots;
#[cfg(feature = "axum")]
mod contention;
#[cfg(feature = "axum")]
mod exemptions;
#[cfg(feature = "grpc")]
mod grpc;
#[cfg(feature = "grpc")]
mod grpc_example;
#[cfg(feature = "grpc")]
mod grpc_hostile;
#[cfg(feature = "grpc")]
mod grpc_refusals;
#[cfg(feature = "grpc")]
mod grpc_streaming;
#[cfg(feature = "axum")]
mod headers;
#[cfg(feature = "axum")]
mod hostile_keys;
#[cfg(feature = "axum")]
mod key_memory;
#[cfg(feature = "axum")]
mod layer;
#[cfg(feature = "axum")]
mod layer_hostile;
#[cfg(feature = "axum")]
mod layer_keys;
#[cfg(feature = "axum")]
mod layer_support;
#[cfg(feature = "axum")]
mod layer_waits;
#[cfg(all(feature = "axum", feature = "reqwest"))]
mod llm_gateway_example;
mod permit_accounting;
mod permit_accounting_future;
#[cfg(feature = "axum")]
mod policies;
mod request_head;
mod response_states;
mod response_states_future;
mod response_states_ledger;
mod response_states_support;
#[cfg(feature = "axum")]
mod settle;
#[cfg(feature = "axum")]
mod settle_hostile;
mod support;
mod usage_scan;
