//! Policies (`Policy::cost`, `cost_by`, `count_if`, `shadow`, `shadow_advertised`,
//! `Policy::and`, `Vec<Policy>`): through axum's router in [`router`], and every promise of the
//! layer's docs attacked, by subject, with real in-memory limiters wrapped in the accounting
//! limiter of [`accounting`], which books every permit granted and given back.

mod accounting;
mod cancellation;
mod composition;
mod concurrent;
mod costs;
mod count_if;
mod metered;
mod model;
mod panics;
mod races;
mod refunds;
mod router;
mod shadows;
mod vetoes;
