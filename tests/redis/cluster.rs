//! The Redis limiter on a Redis Cluster of three masters: keys of different clients live in
//! different slots on different nodes, and each script touches one slot.

use crate::common::redis_server::{eventually, RedisCluster};
use tower_bulwark::redis::{HashTag, RedisAlgorithm, RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog},
    Quota,
};

async fn per_client<A: RedisAlgorithm>(store: &RedisStore, clients: &[String]) -> Vec<String> {
    // Per hour: a fixed window ends on the hour of the server's clock, so a window that ended
    // while the test ran (a minute's would, once a minute) would admit a fourth call and leave
    // its key expired.
    let limiter = RedisRateLimiter::builder(Quota::per_hour(3).unwrap(), store.clone())
        .algorithm::<A>()
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap();
    let mut tasks = Vec::new();
    for client in clients {
        let limiter = limiter.clone();
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut allowed = Vec::new();
            for _ in 0..5 {
                allowed.push(limiter.check(&client).await.unwrap().allowed);
            }
            allowed
        }));
    }
    for task in tasks {
        let name = std::any::type_name::<A>();
        assert_eq!(
            task.await.unwrap(),
            [true, true, true, false, false],
            "{name}"
        );
    }
    clients.iter().map(|c| limiter.redis_key(c)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_works_across_slots_of_a_cluster() {
    let Some(cluster) = RedisCluster::start("the_limiter_works_across_slots_of_a_cluster") else {
        return;
    };
    let store = RedisStore::connect_cluster(cluster.urls()).await.unwrap();
    let clients: Vec<String> = (0..24).map(|i| format!("client-{i}")).collect();
    let mut keys = Vec::new();
    keys.extend(per_client::<Gcra>(&store, &clients).await);
    keys.extend(per_client::<FixedWindow>(&store, &clients).await);
    keys.extend(per_client::<SlidingLog>(&store, &clients).await);
    keys.extend(per_client::<SlidingCounter>(&store, &clients).await);

    // The keys spread over every master, and each carries an expiry.
    for node in &cluster.nodes {
        let size: u64 = node
            .command(&["DBSIZE"])
            .trim_start_matches(':')
            .parse()
            .unwrap();
        assert!(size > 0, "node {} holds none of the keys", node.port());
    }
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let mut slots = std::collections::HashSet::new();
    for key in &keys {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(pttl > 0, "{key}: PTTL {pttl}");
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        slots.insert(slot);
    }
    assert!(
        slots.len() >= 20,
        "keys of different clients use different slots: {slots:?}"
    );

    // A fixed hash tag puts every key of a limiter in one slot.
    let tenant = RedisRateLimiter::builder(Quota::per_minute(3).unwrap(), store.clone())
        .algorithm::<SlidingLog>()
        .prefix("tenant:")
        .hash_tag(HashTag::Fixed("acme".into()))
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap();
    let mut tenant_slots = std::collections::HashSet::new();
    for client in &clients {
        assert!(tenant.check(client).await.unwrap().allowed);
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(tenant.redis_key(client))
            .query_async(&mut conn)
            .await
            .unwrap();
        tenant_slots.insert(slot);
    }
    assert_eq!(tenant_slots.len(), 1, "{tenant_slots:?}");

    // Every node forgets the scripts: each decision, on whichever node its key lives, loads its
    // script there and is still decided by Redis.
    for node in &cluster.nodes {
        assert_eq!(node.command(&["SCRIPT", "FLUSH"]), "+OK");
    }
    let flushed = RedisRateLimiter::builder(Quota::per_minute(3).unwrap(), store.clone())
        .prefix("flushed:")
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap();
    for client in &clients {
        assert!(flushed.check(client).await.unwrap().allowed, "{client}");
        assert!(tenant.check(client).await.unwrap().allowed, "{client}");
    }
    assert_eq!(flushed.counts().failures + tenant.counts().failures, 0);

    // An admission given back in the cluster is there to take again.
    let decision = flushed.check(&clients[0]).await.unwrap();
    assert_eq!(decision.remaining, 1);
    flushed
        .settle_and_wait(&clients[0], 1, decision, 0)
        .await
        .unwrap();
    assert_eq!(flushed.check(&clients[0]).await.unwrap().remaining, 1);
}

/// `builder.rs`'s `probe_interval`: give-backs are sent while decisions skip Redis, and their
/// answers do not end the skip. One master stalled: a decision for a key on it times out and
/// the limiter skips Redis for a minute. A give-back for a key on a healthy master is sent and
/// answered; the next decision for the stalled master's key is still skipped, never sent there
/// (the stalled master runs two scripts once its pause ends, not three). The give-back's answer
/// ended the skip, and each decision for the stalled master waited its timeout again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_answered_by_a_healthy_master_does_not_end_the_probe_interval() {
    let Some(cluster) = RedisCluster::start("give_back_does_not_end_the_probe") else {
        return;
    };
    let store = RedisStore::connect_cluster(cluster.urls()).await.unwrap();
    let limiter = RedisRateLimiter::builder(Quota::per_hour(100).unwrap(), store)
        .fail_mode(RedisFailMode::Closed(std::time::Duration::from_secs(7)))
        .timeout(std::time::Duration::from_millis(300))
        .probe_interval(std::time::Duration::from_secs(60))
        .refusal_cache_capacity(0)
        .build()
        .unwrap();
    // A client whose key lives on the first master, and one whose key lives on another.
    let on = |client: &String, node: usize| {
        let key = limiter.redis_key(client);
        cluster.nodes[node].command(&["EXISTS", &key]) == ":1"
    };
    let (mut stalled, mut healthy) = (None, None);
    for client in (0..64).map(|i| format!("client-{i}")) {
        assert!(limiter.check(&client).await.unwrap().allowed);
        if on(&client, 0) {
            stalled.get_or_insert(client);
        } else if healthy.is_none() {
            healthy = Some(client);
        }
    }
    let (stalled, healthy) = (stalled.unwrap(), healthy.unwrap());
    let admitted = limiter.check(&healthy).await.unwrap();
    let node = &cluster.nodes[0];
    let before = node.evalsha_calls();
    node.command(&["CLIENT", "PAUSE", "1500"]);
    for _ in 0..2 {
        let refused = limiter.check(&stalled).await.unwrap();
        assert_eq!((refused.allowed, refused.retry_after_secs()), (false, 7));
    }
    limiter
        .settle_and_wait(&healthy, 1, admitted, 0)
        .await
        .unwrap();
    let refused = limiter.check(&stalled).await.unwrap();
    assert_eq!((refused.allowed, refused.retry_after_secs()), (false, 7));
    // Once the pause is over, the scripts sent to it run, one after the other on the store's
    // one connection to it: once the first has run, any other has too.
    eventually(
        "the first decision run",
        std::time::Duration::from_secs(10),
        || node.evalsha_calls() > before,
    )
    .await;
    assert_eq!(
        node.evalsha_calls() - before,
        1,
        "only the first decision was sent"
    );
}
