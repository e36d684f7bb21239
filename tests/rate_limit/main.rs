//! The HTTP rate-limit layer: decisions and answers through axum's router, policies, the
//! rate-limit headers, the request head its closures see, exemptions, the response future's
//! permits in every state, and what a key costs in memory (counted by this binary's allocator).
//! The binary needs the `axum` feature (Cargo.toml), so only the other features are named here.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/counting.rs"]
mod counting;

mod attack_body_end;
#[cfg(feature = "reqwest")]
mod attack_concurrency;
#[cfg(feature = "grpc")]
mod attack_grpc;
#[cfg(feature = "grpc")]
mod attack_grpc_answers;
mod attack_http;
mod attack_keys;
mod attack_seam;
mod attack_settle;
#[cfg(feature = "reqwest")]
mod attack_slots;
mod attack_tier_slots;
mod contention;
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
mod headers;
mod hostile_keys;
mod key_memory;
mod layer;
mod layer_hostile;
mod layer_keys;
mod layer_support;
mod layer_waits;
#[cfg(feature = "reqwest")]
mod llm_gateway_example;
mod permit_accounting;
mod permit_accounting_future;
mod policies;
mod request_head;
mod response_states;
mod response_states_future;
mod response_states_ledger;
mod response_states_support;
mod settle;
mod settle_hostile;
mod support;
mod usage_scan;
