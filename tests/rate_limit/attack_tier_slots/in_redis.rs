//! Tiers of slots kept in Redis (`Policy::concurrent_in_redis`'s limiters), as
//! `attack_tier_slots` attacks them in memory.

use super::*;
use crate::common::redis_server::{or_skip, RedisServer};
use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};

/// The limiter of a policy of `n` slots per tenant in the Redis of `store`, under `prefix`.
fn slots_in(store: &RedisStore, prefix: &str, n: u32) -> ConcurrencyLimiter<HeaderValue> {
    let redis = RedisRateLimiter::builder(Quota::per_second(1).unwrap(), store.clone())
        .client_clock(ManualClock::new())
        .prefix(prefix)
        .timeout(std::time::Duration::from_secs(5))
        .fail_mode(RedisFailMode::Propagate);
    let policy = Policy::concurrent_in_redis("streams", key(), n, redis).unwrap();
    policy.limiter().clone()
}

/// Free (1) and pro (3) tenants, their slots in Redis, each plan under its own prefix.
fn plans_in(
    store: &RedisStore,
) -> Tiers<HeaderValue, &'static str, ConcurrencyLimiter<HeaderValue>> {
    Tiers::new(plan, "free", slots_in(store, "free:", 1)).tier("pro", slots_in(store, "pro:", 3))
}

/// `Policy::concurrent_in_redis`: "the headers and refusals say what they say, as in
/// memory"; `ConcurrencyLimiter`: in `Tiers`, "the headers advertise the tier's slots as a
/// concurrent policy's"; CHANGELOG: "in memory and in Redis". Free and pro tenants with
/// their slots in Redis: each plan's `q`, the slots left, refusals, and an ended stream's
/// slot back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_plan_in_redis_advertises_its_own_slots() {
    let (_server, store) = or_skip!(RedisServer::with_store("attack_tier_slots").await);
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(streams(plans_in(&store)), &ends, plain_answer);
    drop(plans_say_their_own_slots(&service, &ends).await);
}

/// As `a_refusal_by_another_policy_still_advertises_tiered_slots`, in Redis: a tenant whose
/// slots are kept in Redis and whose request a rate policy (one a minute) refuses is told
/// its tier's slots as slots (found by attack: it said `"streams";q=3;w=1`, as in memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_another_policy_still_advertises_redis_tiered_slots() {
    let (_server, store) = or_skip!(RedisServer::with_store("attack_tier_slots_veto").await);
    let ends = Arc::new(Semaphore::new(0));
    for rate_first in [false, true] {
        let rate = Policy::new("rate", key(), per_minute(1, &ManualClock::new())).unwrap();
        let service = if rate_first {
            limited(rate.and(streams(plans_in(&store))), &ends, plain_answer)
        } else {
            limited(streams(plans_in(&store)).and(rate), &ends, plain_answer)
        };
        let tenant = if rate_first { "pro-2" } else { "pro-3" };
        let (s, held) = open(&service, tenant).await;
        assert_admitted(&s, 3, 2, "admitted");
        let (s, _) = open(&service, tenant).await;
        assert_eq!(s.status, StatusCode::TOO_MANY_REQUESTS, "the rate refuses");
        let policy = item(&s.policy, "streams").unwrap();
        let what = format!("rate first: {rate_first}: {s:?}");
        assert_eq!(policy, format!("\"streams\";q=3;{SLOTS}"), "{what}");
        drop(held);
    }
}
