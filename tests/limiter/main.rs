//! The limiters themselves: each algorithm in memory against models, under contention, stale
//! and hostile clock readings, refunds, quota changes and bounds, key floods and tiers.

#[path = "../common/mod.rs"]
mod common;

#[macro_use]
mod attack_direct;
mod attack_evict;
mod attack_fixed_quota;
mod attack_memory;
mod attack_seam;
mod attack_sliding_period;
mod attack_windows;
mod default_clock;
mod eviction;
mod hostile;
mod hostile_props;
mod in_memory;
mod keys_and_clocks;
mod metered;
mod model_props;
mod quota_bounds;
#[cfg(feature = "axum")]
mod quota_change;
mod refund_misuse;
mod refund_semantics;
mod settle;
mod settle_hostile;
mod tiers;
