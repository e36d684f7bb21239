//! `examples/hot_key.rs` over real listeners: two instances on one Redis share one global quota
//! (2 000 a second, burst 200), flooded by many clients at once for about a second. Together
//! they admit no more than the quota allows over the flood (rate × time + burst), nearly all of
//! it (or of what the clients asked), and at least 80 % of the admissions are made from leases,
//! without a round trip.

use std::time::{Duration, Instant};

use crate::common::redis_server::{or_skip, RedisServer};

#[path = "../../examples/hot_key.rs"]
#[allow(dead_code)]
mod hot_key;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hot_key_examples_instances_share_one_quota_from_leases() {
    let server = or_skip!(RedisServer::start(
        "the_hot_key_examples_instances_share_one_quota"
    ));
    let mut instances = Vec::new();
    for _ in 0..2 {
        let (app, limiter, counts) = hot_key::app(&server.url(), 2000, true).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        instances.push((addr, limiter, counts));
    }
    let client = reqwest::Client::new();
    let started = Instant::now();
    let flood = Duration::from_millis(1000);
    let mut clients = tokio::task::JoinSet::new();
    for n in 0..16 {
        let (client, addr) = (client.clone(), instances[n % 2].0);
        clients.spawn(async move {
            let mut sent = 0;
            while started.elapsed() < flood {
                let response = client.get(format!("http://{addr}/")).send().await.unwrap();
                assert!(matches!(response.status().as_u16(), 200 | 429));
                sent += 1;
            }
            sent
        });
    }
    let sent: u64 = clients.join_all().await.into_iter().sum();
    let elapsed = started.elapsed();
    let (admitted, local, failures): (u64, u64, u64) =
        instances
            .iter()
            .fold((0, 0, 0), |(a, l, f), (_, limiter, counts)| {
                let redis = limiter.counts();
                (
                    a + counts.read().0,
                    l + redis.lease_decisions,
                    f + redis.failures,
                )
            });
    // The flood began before the first request and ended after the last. A decision Redis did
    // not give in time (a machine so busy that a call outlives the 100 ms timeout) is the fail
    // mode's, `Local` by default, outside the shared quota: each may have admitted one more.
    let allowed = 2000.0 * elapsed.as_secs_f64() + 200.0;
    assert!(
        admitted as f64 <= allowed + failures as f64,
        "{admitted} admitted, at most {allowed:.0} allowed (and {failures} decided by the fail mode)"
    );
    // Nearly all of the quota, or of what was asked if the clients asked less (a busy machine).
    let wanted = allowed.min(sent as f64);
    assert!(
        admitted as f64 >= 0.8 * wanted,
        "{admitted} admitted of {wanted:.0}"
    );
    // Shares grow to 50 (a quarter of the burst) from 1 by doubling: in a flood this short, a
    // few of the first leases are small (`benches/hot_key.sh` measures the long run).
    assert!(
        local as f64 >= 0.8 * admitted as f64,
        "{local} of {admitted} from leases"
    );
}
