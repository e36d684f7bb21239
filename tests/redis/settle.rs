//! Costs settled through a real Redis: tasks racing with estimates and settles on one key get
//! exactly the quota in tokens, for every algorithm; debt is charged in Redis; a fail mode's
//! decision settles with its local limiter.

use crate::common::for_every_algorithm;
use crate::common::{assert_settled_plus_left_is_the_quota, waits_up_to};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::manual_clock_at;
use crate::common::next_estimate_and_cost;
use crate::common::redis_server::{or_skip, propagating, RedisServer, Refusals};
use tower_bulwark::redis::{RedisAlgorithm, RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra},
    clock::ManualClock,
    Limiter, Quota,
};

fn limiter<A: RedisAlgorithm>(
    store: &RedisStore,
    clock: &ManualClock,
    prefix: &str,
) -> RedisRateLimiter {
    propagating::<A>(
        store,
        Quota::per_minute(1000).unwrap(),
        clock,
        prefix,
        Refusals::Cached,
    )
    .build()
    .unwrap()
}

/// Sixteen tasks spread over `instances` race on the key `tenant`, the clock standing still,
/// each making `rounds` requests: each reserves an estimate of up to 50 and, if admitted,
/// settles it to up to twice as much and waits for the settle to reach Redis. What the settled
/// requests cost in all.
pub(crate) async fn race_settles(instances: &[RedisRateLimiter], rounds: usize) -> u64 {
    let spent = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16u64)
        .map(|t| {
            let limiter = instances[t as usize % instances.len()].clone();
            let spent = Arc::clone(&spent);
            tokio::spawn(async move {
                let mut seed = t * 7919 + 1;
                for _ in 0..rounds {
                    let (estimate, cost) = next_estimate_and_cost(&mut seed);
                    let decision = limiter.reserve(&"tenant", estimate).await.unwrap();
                    if decision.allowed {
                        limiter
                            .settle_and_wait(&"tenant", estimate, decision, cost)
                            .await
                            .unwrap();
                        spent.fetch_add(u64::from(cost), Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    spent.load(Ordering::Relaxed)
}

/// Sixteen tasks on four limiters (instances) of one Redis race on one key of 1 000 tokens a
/// minute, the clock standing still: each reserves up to 50 and settles to up to twice that. The
/// settled tokens and what the key admits afterwards add up to the quota exactly (nothing is
/// left once they cost more).
async fn racing_settles_add_up_to_the_quota<A: RedisAlgorithm>(store: &RedisStore, prefix: &str) {
    let clock = manual_clock_at(Duration::from_secs(1));
    let instances: Vec<_> = (0..4)
        .map(|_| limiter::<A>(store, &clock, prefix))
        .collect();
    let spent = race_settles(&instances, 40).await;
    let mut left = 0;
    while instances[0].reserve(&"tenant", 1).await.unwrap().allowed {
        left += 1;
    }
    assert_settled_plus_left_is_the_quota::<A>(1000, spent, left);
}

/// A give-back behind another request's debt is not lost, in Redis as in memory: A takes 100,
/// B takes 100, B settles to 950, A settles to 10; 40 are left and no 41st, whether or not the
/// quota lets requests wait (none waited).
async fn a_give_back_behind_debt_is_exact<A: RedisAlgorithm>(store: &RedisStore, prefix: &str) {
    let waiting = waits_up_to(Quota::per_minute(1000).unwrap(), Duration::from_secs(90));
    for (quota, prefix) in [
        (Quota::per_minute(1000).unwrap(), format!("{prefix}now:")),
        (waiting, format!("{prefix}wait:")),
    ] {
        let clock = manual_clock_at(Duration::from_secs(1));
        let limiter = propagating::<A>(store, quota, &clock, &prefix, Refusals::Cached)
            .build()
            .unwrap();
        let name = std::any::type_name::<A>();
        let a = limiter.reserve(&"k", 100).await.unwrap();
        let b = limiter.reserve(&"k", 100).await.unwrap();
        assert!(a.allowed && b.allowed, "{name}");
        limiter.settle_and_wait(&"k", 100, b, 950).await.unwrap();
        limiter.settle_and_wait(&"k", 100, a, 10).await.unwrap();
        let forty = limiter.reserve(&"k", 40).await.unwrap();
        assert!(forty.allowed && forty.wait.is_zero(), "{name}: 40 left");
        assert_eq!(forty.remaining, 0, "{name}");
        let next = limiter.reserve(&"k", 1).await.unwrap();
        assert!(!next.allowed || !next.wait.is_zero(), "{name}: no 41st");
    }
}

/// Behind a waiter's slot a give-back is kept, in Redis as in memory (see the in-memory twin):
/// A takes 100, B 900, W waits for one, B settles to 950, A to 10; the key is whole again only
/// after the 1 051 permits charged.
async fn a_give_back_behind_a_waiter_is_kept<A: RedisAlgorithm>(
    store: &RedisStore,
    prefix: &str,
    whole_after: Duration,
) {
    let quota = waits_up_to(Quota::per_minute(1000).unwrap(), Duration::from_secs(90));
    let clock = ManualClock::new();
    let limiter = propagating::<A>(store, quota, &clock, prefix, Refusals::Cached)
        .build()
        .unwrap();
    let name = std::any::type_name::<A>();
    let a = limiter.reserve(&"k", 100).await.unwrap();
    let b = limiter.reserve(&"k", 900).await.unwrap();
    assert!(a.wait.is_zero() && b.allowed && b.wait.is_zero(), "{name}");
    let waiter = limiter.reserve(&"k", 1).await.unwrap();
    assert!(waiter.allowed && !waiter.wait.is_zero(), "{name}");
    limiter.settle_and_wait(&"k", 900, b, 950).await.unwrap();
    limiter.settle_and_wait(&"k", 100, a, 10).await.unwrap();
    let whole = limiter.check_n(&"k", 1000).await.unwrap();
    assert!(!whole.allowed, "{name}");
    assert_eq!(whole.retry_after, whole_after, "{name}: A's give-back kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_settles_in_redis_add_up_to_the_quota_for_every_algorithm() {
    let (_server, store) = or_skip!(RedisServer::with_store("racing_settles_in_redis").await);
    for_every_algorithm!(tagged: racing_settles_add_up_to_the_quota(&store).await);
    for_every_algorithm!(prefixed "debt-": a_give_back_behind_debt_is_exact(&store).await);
    let gcra_whole = Duration::from_millis(63_060);
    a_give_back_behind_a_waiter_is_kept::<Gcra>(&store, "waiter-gcra:", gcra_whole).await;
    let fw_whole = Duration::from_secs(120);
    a_give_back_behind_a_waiter_is_kept::<FixedWindow>(&store, "waiter-fw:", fw_whole).await;
}

/// Debt in Redis: a settle to more than is left delays the key on every instance, by exactly
/// the tokens owed; the synchronous `settle` sends it from a task of its own.
#[tokio::test]
async fn debt_settled_in_redis_delays_every_instance() {
    let (_server, store) = or_skip!(RedisServer::with_store("debt_settled_in_redis").await);
    let clock = manual_clock_at(Duration::from_secs(1));
    let (a, b) = (
        limiter::<Gcra>(&store, &clock, "debt:"),
        limiter::<Gcra>(&store, &clock, "debt:"),
    );
    let d = a.reserve(&"k", 990).await.unwrap();
    assert!(d.allowed);
    a.settle_and_wait(&"k", 990, d, 990).await.unwrap();
    let d = a.reserve(&"k", 10).await.unwrap();
    assert!(
        Limiter::<&str>::settle(&a, &"k", 10, d, 70),
        "its own decision"
    );
    // Sent from a spawned task: wait until it lands.
    let mut refused = b.reserve(&"k", 1).await.unwrap();
    for _ in 0..100 {
        if refused.retry_after > Duration::from_secs(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        refused = b.reserve(&"k", 1).await.unwrap();
    }
    // 1 060 of 1 000 used: 60 tokens of debt (3.6 s) and then the one asked for (60 ms).
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Duration::from_millis(3660));
}

/// In Redis as in memory: a GCRA admission made before a `set_quota` that lengthens the
/// interval, settled after it, gives back each token at the interval it was charged at.
#[tokio::test]
async fn a_settle_after_set_quota_gives_back_no_more_than_it_took_in_redis() {
    let (_server, store) =
        or_skip!(RedisServer::with_store("settle_after_set_quota_in_redis").await);
    let clock = manual_clock_at(Duration::from_secs(1));
    let limiter = RedisRateLimiter::builder(Quota::per_minute(100).unwrap(), store)
        .client_clock(clock.clone())
        .prefix("change:")
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap();
    let mut last = None;
    for _ in 0..10 {
        let d = limiter.reserve(&"k", 10).await.unwrap();
        assert!(d.allowed);
        last = Some(d);
    }
    limiter
        .set_quota(Quota::per_minute(10).unwrap().with_burst(100).unwrap())
        .unwrap();
    limiter
        .settle_and_wait(&"k", 10, last.unwrap(), 0)
        .await
        .unwrap();
    let mut left = 0;
    while limiter.reserve(&"k", 1).await.unwrap().allowed {
        left += 1;
    }
    // 54 s owed at 6 s a token: 91 of 100 left (100 had the ten come back at 6 s each).
    assert_eq!(left, 91);
}

/// A memory limiter and a Redis one of algorithm `A` with `quota`, each named.
fn in_memory_and_in_redis<A: RedisAlgorithm>(
    store: &RedisStore,
    quota: Quota,
    clock: &ManualClock,
    prefix: &str,
) -> [(
    &'static str,
    tower_bulwark::limiter::BoxLimiter<&'static str>,
); 2] {
    use tower_bulwark::limiter::BoxLimiter;
    let redis = propagating::<A>(store, quota, clock, prefix, Refusals::Uncached);
    let memory = tower_bulwark::KeyedRateLimiter::<&'static str>::builder(quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    [
        ("memory", BoxLimiter::new(memory)),
        ("redis", BoxLimiter::new(redis.build().unwrap())),
    ]
}

/// A cost of zero (`Limiter::reserve`, `check_n`: "a cost of zero takes nothing; it is admitted
/// at once unless the key is over its limit now"): admitted on a spent key, which stays spent;
/// a give-back of zero gives nothing back (yet the admission was this limiter's, so it is taken
/// back); a settle to zero gives the whole estimate back. Behind a reservation it is answered
/// no later than the reservation falls due, and takes nothing: the key's next reservation waits
/// as long as a twin key's that never saw it. The same in memory and in Redis, for every
/// algorithm.
async fn a_cost_of_zero_takes_nothing<A: RedisAlgorithm>(store: &RedisStore, prefix: &str) {
    let clock = manual_clock_at(Duration::from_secs(1000));
    let name = std::any::type_name::<A>();
    let waits = Quota::per_minute(3)
        .unwrap()
        .with_max_wait(Duration::from_secs(120))
        .unwrap();
    let waiting = format!("{prefix}w-");
    for (what, limiter) in in_memory_and_in_redis::<A>(store, waits, &clock, &waiting) {
        let mut ahead = Duration::ZERO;
        for key in ["k", "twin"] {
            for _ in 0..3 {
                assert!(limiter.reserve(&key, 1).await.unwrap().allowed);
            }
            ahead = limiter.reserve(&key, 1).await.unwrap().wait;
            assert!(!ahead.is_zero(), "{name} {what}: a reservation ahead");
        }
        let zero = limiter.reserve(&"k", 0).await.unwrap();
        assert!(
            zero.allowed && zero.wait <= ahead,
            "{name} {what}: zero behind a reservation due in {ahead:?}: {zero:?}"
        );
        let (next, twin) = (
            limiter.reserve(&"k", 1).await.unwrap(),
            limiter.reserve(&"twin", 1).await.unwrap(),
        );
        assert_eq!(
            (next.allowed, next.wait),
            (twin.allowed, twin.wait),
            "{name} {what}: zero behind a reservation took something"
        );
    }
    let quota = Quota::per_minute(3).unwrap();
    for (what, limiter) in in_memory_and_in_redis::<A>(store, quota, &clock, prefix) {
        let one = limiter.reserve(&"k", 1).await.unwrap();
        let two = limiter.reserve(&"k", 2).await.unwrap();
        assert!(one.allowed && two.allowed, "{name} {what}");
        let zero = limiter.reserve(&"k", 0).await.unwrap();
        assert!(
            zero.allowed && zero.wait.is_zero(),
            "{name} {what}: zero on a spent key"
        );
        assert_eq!(
            zero.remaining, 0,
            "{name} {what}: zero took nothing, left nothing"
        );
        assert!(limiter.refund(&"k", 0, one), "{name} {what}: taken back");
        assert!(
            limiter.settle(&"k", 0, zero, 0),
            "{name} {what}: a settle of zero to zero"
        );
        // Nothing came back: the key is still spent (a Redis give-back is sent in the
        // background, so give it the time a real one takes to land).
        tokio::time::sleep(Duration::from_millis(50)).await;
        let spent = limiter.reserve(&"k", 1).await.unwrap();
        assert!(
            !spent.allowed,
            "{name} {what}: a give-back of zero gave something back"
        );
        // A settle to zero gives the whole estimate back.
        assert!(limiter.settle(&"k", 2, two, 0), "{name} {what}");
        let mut back = false;
        for _ in 0..200 {
            let again = limiter.reserve(&"k", 2).await.unwrap();
            if again.allowed {
                back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            back,
            "{name} {what}: a settle to zero gave the estimate back"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_of_zero_takes_nothing_in_memory_and_in_redis_for_every_algorithm() {
    let (_server, store) = or_skip!(RedisServer::with_store("a_cost_of_zero").await);
    for_every_algorithm!(prefixed "zero-": a_cost_of_zero_takes_nothing(&store).await);
}
