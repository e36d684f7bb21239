//! Limiter state in Redis (or Valkey): one quota across every instance of a service.
//!
//! The in-memory limiters limit per process; with N replicas behind a load balancer a quota of 10
//! becomes up to 10·N. A [`RedisRateLimiter`] keeps the state of the same algorithms in
//! Redis instead, so every instance that shares the Redis draws from one budget per key. It is a
//! [`Limiter`](crate::Limiter) like the others, so a [`RateLimitLayer`](crate::RateLimitLayer) takes it as it is.
//!
//! ```no_run
//! use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
//! use tower_bulwark::{Limiter, Quota, algorithm::SlidingLog};
//!
//! # async fn run() -> Result<(), tower_bulwark::BoxError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let limiter = RedisRateLimiter::builder(Quota::per_minute(100)?, store)
//!     .algorithm::<SlidingLog>()
//!     .prefix("api:")
//!     .fail_mode(RedisFailMode::fallback(Quota::per_minute(25)?))
//!     .build()?;
//! let decision = limiter.reserve(&"203.0.113.7", 1).await?;
//! println!("allowed: {}, retry after {:?}", decision.allowed, decision.retry_after);
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! * **One script per algorithm, one round trip per decision.** Each algorithm is a Lua script
//!   that reads the key's state, decides and writes the new state atomically on the server. It is
//!   sent by `EVALSHA`; when the server does not know it (a restart empties the script cache) it
//!   is loaded and sent again.
//! * **The server's clock.** Scripts read `TIME` (microseconds), so instances with skewed clocks
//!   agree. Every value a script handles is an integer number of ticks, rounded exactly as the
//!   in-memory algorithm rounds, so nothing is lost to Lua's conversion of numbers to integer
//!   replies. Window algorithms count their windows from the Unix epoch. For tests,
//!   [`client_clock`](RedisRateLimiterBuilder::client_clock) passes a [`Clock`](crate::clock::Clock)'s
//!   nanoseconds instead, which makes the decisions identical to the in-memory limiter's (but
//!   for a stale reading after a refusal: below).
//! * **One key per decision, always with an expiry.** The key of client key `k` is
//!   `<prefix>{k}` by default: the braces are Redis Cluster's hash tag, so the state of `k` lives
//!   in one slot and different clients spread over the cluster ([`HashTag`]). A `}` or `%` in a
//!   client key is written as `%7D` or `%25`, so no client key can end the hash tag early and
//!   choose its slot, and different client keys stay different. Each write sets an
//!   expiry at the instant the state stops mattering, so idle clients leave nothing behind.
//!   The sliding log keeps one sorted-set member per permit, named `<instant>:<sequence>` so that
//!   many requests in the same microsecond are all counted.
//! * **Clocks that read late.** Every key also keeps the latest instant a script wrote it at
//!   (GCRA as `<tat>:<latest>`, the window hashes as field `l`, the sliding log as a member `hw`
//!   scored below zero), and a script whose `now` is earlier (a client clock behind another
//!   instance's, a server clock stepped back) decides as of that instant, as the in-memory
//!   limiters do: the sliding log would otherwise count without the permits a later script
//!   pruned. A refusal writes nothing, so that instant is the key's latest admission's or
//!   give-back's (as GCRA's in memory; the in-memory window algorithms also record a
//!   refusal's). With a client clock, a key that holds nothing more keeps that instant for the
//!   clock's margin (a minute) rather than being deleted, and after
//!   [`set_quota`](RedisRateLimiter::set_quota) an instance sends no reading older than the
//!   change's.
//! * **Same [`Decision`](crate::limiter::Decision)** as in memory: `limit`, `remaining`, `retry_after`, `reset_after` and
//!   reservations within the quota's `max_wait`. Every admission remembers the instant its
//!   permits were charged at (and, for GCRA, the TAT it left), so a
//!   [`refund`](crate::Limiter::refund) (a dropped waiter, or a request that another policy refused)
//!   takes off what that admission took, whether it was immediate or reserved, as the
//!   in-memory algorithm does (see the last limit below).
//! * **A decision that comes too late changes nothing.** Each script carries a deadline in the
//!   server's time: the instant at which its caller will have been answered without it (the
//!   limiter's timeout, or the connection's response timeout if shorter), converted with the
//!   offset between this process's clock and the server's `TIME` that every reply reveals
//!   (a lower bound from the send and receive instants, so the deadline errs early). A script
//!   that Redis runs later (after a stall, say) changes nothing and answers "late"; its caller
//!   is long gone. The first decision, before any offset is known, sends a deadline already
//!   past: the script answers at once with the server's time and the decision is sent again
//!   with a real deadline. Refunds carry no deadline: applying one late still restores exactly
//!   what its admission took, and each is sent once. A lease call carries the deadline as a
//!   decision does.
//! * **Never hangs.** Every call is bounded by a short [`timeout`](RedisRateLimiterBuilder::timeout);
//!   a timeout, a connection error or a reply that is not a decision is counted
//!   (`failures` of [`RedisRateLimiter::counts`]), logged with `tracing` and decided by the
//!   [`RedisFailMode`]. After a timeout or a connection error, decisions go straight to the
//!   policy for a [`probe_interval`](RedisRateLimiterBuilder::probe_interval), so a dead Redis
//!   does not cost every request a timeout; then Redis is tried again. The connection
//!   reconnects by itself. With leases, a decision waits for its key's turn behind the lease
//!   call in flight at most the timeout too, and is then decided without leases, in a call of
//!   its own bounded as every call is.
//! * **Holds, renewed while they live.** The algorithms whose admissions hold what they took
//!   until it is given back ([`Metered`](crate::algorithm::Metered)'s estimates, and the slots
//!   of [`Policy::concurrent_in_redis`](crate::rate_limit::Policy::concurrent_in_redis), the
//!   limit of requests in flight per key) keep each admission's hold in its key under an id
//!   no other admission has, with an expiry. A give-back or settle names its hold, so one that
//!   arrives late or twice touches no other request's. The instance renews all of its live
//!   holds in one call (per cluster slot) every third of
//!   [`hold_for`](RedisRateLimiterBuilder::hold_for); a hold no live instance renews ends at
//!   its expiry: a slot frees, an estimate stands, charged as of its admission.
//! * **Refusals are cached.** A key that Redis refused is refused locally until its retry time,
//!   without a round trip, for a request of the same cost (another cost asks Redis, which
//!   alone knows how long a larger one waits), with the same `retry_after` Redis would give
//!   (a zero
//!   [`refusal_cache_capacity`](RedisRateLimiterBuilder::refusal_cache_capacity) turns this off).
//!
//! # Limits
//!
//! * The scripts need Redis 4 or later, or any Valkey: they use multi-field `HSET`, and they
//!   write after reading `TIME`, which needs effects replication (the default from Redis 5; on
//!   Redis 4 the script switches it on).
//! * Lua numbers are doubles: the builder refuses quotas whose arithmetic would leave the exact
//!   integer range (a GCRA burst window or a period longer than about 35 years with the server's
//!   clock, about 13 days with a client clock; `permits × period` above 2^52 ticks for the sliding
//!   counter).
//! * With the server's clock, times are whole microseconds: intervals and periods are rounded up
//!   to the microsecond (never exceeding the rate), `max_wait` down.
//! * [`Limiter::refund`](crate::Limiter::refund) and [`Limiter::settle`](crate::Limiter::settle)
//!   are synchronous, so they send their script from a spawned task (it needs a tokio runtime;
//!   outside one it logs and gives nothing back). Use [`RedisRateLimiter::settle_and_wait`] to
//!   await it (to zero for a refund).
//! * A cached refusal is not revised when another instance gives permits back: such a key may be
//!   refused locally until its original retry time.
//! * The deadline is as good as the clocks: the offset allows 100 ppm of drift between replies,
//!   and in a Redis Cluster each node's clock should agree with the others' (the estimate is one
//!   per limiter, not per node), or a script may run up to their difference after its deadline.
//! * Refunds are exact where the state can say what the admission took, and otherwise never
//!   give back more than it took (the same rules as in memory, see the guide): GCRA gives back
//!   `cost` intervals (never below the latest reading) while the key's TAT is still the one the
//!   admission left, `cost` intervals less the time elapsed since when only immediate
//!   admissions came after it, and nothing while a later reservation is ahead; the fixed window
//!   gives back only a charge that holds the last slots of its queue of cycles.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

mod builder;
mod cache;
mod coalesce;
mod error;
mod fail_mode;
mod future;
mod hold;
mod key;
mod key_table;
mod lease;
mod limiter;
mod offset;
mod reply;
mod script;
mod store;

pub use builder::RedisRateLimiterBuilder;
// The config writes the builder's defaults in, so that writing them out is no change.
#[cfg(feature = "config")]
pub(crate) use builder::{default_prefix, DEFAULT_TIMEOUT};
pub use error::{BuildError, RedisFailure};
pub use fail_mode::RedisFailMode;

pub use key::{HashTag, RedisKey};
pub use lease::Lease;
pub use limiter::{RedisCounts, RedisRateLimiter};
pub use script::RedisAlgorithm;
pub use store::RedisStore;

/// Starts `task` on the current tokio runtime, if there is one, and says whether it did: the one
/// way the Redis limiter starts work that nobody waits for (a give-back, a key's batch of
/// decisions, the end of a lease). Without a runtime, `task` is dropped.
fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> bool {
    tokio::runtime::Handle::try_current()
        .map(|runtime| drop(runtime.spawn(task)))
        .is_ok()
}

/// The id of the next hold or lease this process makes: a random start, then an odd step, which
/// visits every id before it repeats. Ids stay within Lua's exact integers and are never 0
/// (none); two processes' ids on one key meet with a chance of about one in 2^53 per pair.
fn next_id() -> u64 {
    static NEXT: LazyLock<AtomicU64> =
        LazyLock::new(|| AtomicU64::new(RandomState::new().hash_one(0u8)));
    let id = NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    (id & ((1 << 53) - 1)).max(1)
}
