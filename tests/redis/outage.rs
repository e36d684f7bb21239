//! Losing Redis under a flood with the default fail mode (`RedisFailMode::Local`): each instance
//! decides with a local limiter of its own quota, so the instances together admit at most their
//! number times the quota while Redis is gone, to the permit, where `Open` admits everything.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::manual_clock_at;
use crate::common::redis_server::{or_skip, RedisServer};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::redis::{RedisRateLimiter, RedisStore};
use tower_bulwark::Quota;

/// Four tasks on each of `instances` send `each` checks of the key "hot"; the admissions of each
/// instance.
async fn flood(instances: &[RedisRateLimiter], each: u64) -> Vec<u64> {
    let admitted: Vec<_> = instances
        .iter()
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let mut tasks = Vec::new();
    for (limiter, count) in instances.iter().zip(&admitted) {
        for _ in 0..4 {
            let (limiter, count) = (limiter.clone(), Arc::clone(count));
            tasks.push(tokio::spawn(async move {
                for _ in 0..each {
                    if limiter
                        .check(&"hot")
                        .await
                        .expect("the fail mode answers")
                        .allowed
                    {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    admitted.iter().map(|n| n.load(Ordering::Relaxed)).collect()
}

/// Two instances share a key of 100 a minute. While Redis answers they admit 100 together; once
/// it is killed the refusals it gave stand until they fall due, then each instance admits its
/// own burst of 100 and 50 more over the next 30 s: 300 in all over the outage, within the bound
/// the fail mode's docs give (`N` bursts, then `N` times the rate). Each instance counted its
/// failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_under_the_default_fail_mode_admits_at_most_the_quota_per_instance() {
    let mut server = or_skip!(RedisServer::start("outage_default_fail_mode"));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let clock = manual_clock_at(Duration::from_secs(1));
    let instances: Vec<_> = (0..2)
        .map(|_| {
            RedisRateLimiter::builder(Quota::per_minute(100).unwrap(), store.clone())
                .client_clock(clock.clone())
                .prefix("outage:")
                .timeout(Duration::from_millis(250))
                .build()
                .unwrap()
        })
        .collect();
    let before = flood(&instances, 50).await;
    assert_eq!(
        before.iter().sum::<u64>(),
        100,
        "Redis holds the quota: {before:?}"
    );
    assert!(instances.iter().all(|i| i.counts().failures == 0));

    server.kill();
    // The refusals Redis gave stand (each instance caches them) until they fall due.
    assert_eq!(flood(&instances, 10).await, [0, 0], "cached refusals stand");
    clock.advance(Duration::from_secs(1));
    let burst = flood(&instances, 60).await;
    assert_eq!(burst, [100, 100], "each instance its own burst, no more");
    clock.advance(Duration::from_secs(30));
    let later = flood(&instances, 60).await;
    assert_eq!(
        later,
        [50, 50],
        "then each its own rate: 30 s of 100 a minute"
    );
    let outage: u64 = burst.iter().chain(&later).sum();
    // The documented bound: N × (burst + rate × elapsed) = 2 × (100 + 51.7) over 31 s.
    assert_eq!(outage, 300);
    for instance in &instances {
        assert!(instance.counts().failures >= 150, "{:?}", instance.counts());
    }
}

/// The default fail mode's local limiter follows `set_quota`: a quota lowered during an outage
/// holds at once.
#[tokio::test]
async fn the_local_limiter_takes_a_new_quota() {
    let mut server = or_skip!(RedisServer::start("outage_set_quota"));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let clock = ManualClock::new();
    let limiter = RedisRateLimiter::builder(Quota::per_minute(100).unwrap(), store)
        .client_clock(clock.clone())
        .timeout(Duration::from_millis(250))
        .build()
        .unwrap();
    server.kill();
    limiter.set_quota(Quota::per_minute(10).unwrap()).unwrap();
    assert_eq!(flood(std::slice::from_ref(&limiter), 5).await, [10]);
}
