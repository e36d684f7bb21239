//! Leased limiters on one hot key, in one process: four instances (each its own connection, as
//! separate processes would have), each flooded by tasks far above the quota, at quotas of
//! 5 000, 50 000 and 500 000 a second. Prints, per quota: script calls per instance per second,
//! the share of the quota used, and whether the admissions stayed within rate × time + burst,
//! over `SECS` seconds after a first second that spends the burst.
//!
//! ```sh
//! cargo bench --features redis --bench leases            # SECS=3 QUOTAS=5000,50000,500000
//! ```
//!
//! `WORKERS` sets the runtime's threads (2 by default); with more, the tasks ask as fast as Redis
//! answers.
//!
//! The bench starts its own `redis-server` on a free port (and skips, saying why, when there is
//! none). Script calls are Redis's own count (`INFO commandstats`, `evalsha` and `eval`).

#[path = "../tests/common/redis_server.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_bulwark::redis::{Lease, RedisRateLimiter, RedisStore};
use tower_bulwark::Quota;

const INSTANCES: usize = 4;
const TASKS_PER_INSTANCE: usize = 4;

/// Script calls Redis has run so far.
async fn script_calls(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn run(url: &str, per_second: u32, secs: u64) {
    let quota = Quota::per_second(per_second).unwrap();
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        let store = RedisStore::connect(url).await.unwrap();
        let limiter = RedisRateLimiter::builder(quota, store)
            .prefix(format!("leases:{per_second}:"))
            .lease(Lease::new())
            .build()
            .unwrap();
        instances.push(limiter);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    // The first second spends the burst and settles the shares: counted from its end.
    let counting = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for limiter in &instances {
        for _ in 0..TASKS_PER_INSTANCE {
            let (limiter, stop, admitted) = (limiter.clone(), stop.clone(), admitted.clone());
            let counting = counting.clone();
            tasks.push(tokio::spawn(async move {
                let mut mine = 0;
                while !stop.load(Ordering::Relaxed) {
                    let allowed = limiter.check(&"hot").await.is_ok_and(|d| d.allowed);
                    if allowed && counting.load(Ordering::Relaxed) {
                        mine += 1;
                    }
                    tokio::task::yield_now().await;
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls_before = script_calls(url).await;
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let calls = script_calls(url).await - calls_before;
    for task in tasks {
        task.await.unwrap();
    }
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    let allowed = f64::from(per_second) * elapsed + f64::from(per_second);
    let used = admitted / (f64::from(per_second) * elapsed);
    println!(
        "| {per_second} | {:.1} | {:.1} % | {} |",
        calls as f64 / elapsed / INSTANCES as f64,
        100.0 * used,
        if admitted <= allowed { "yes" } else { "NO" },
    );
}

fn main() {
    let Some(server) = support::RedisServer::start("bench leases") else {
        return;
    };
    let secs = std::env::var("SECS").map_or(3, |s| s.parse().unwrap());
    let quotas: Vec<u32> = std::env::var("QUOTAS")
        .unwrap_or_else(|_| "5000,50000,500000".into())
        .split(',')
        .map(|q| q.trim().parse().unwrap())
        .collect();
    let workers = std::env::var("WORKERS").map_or(2, |n| n.parse().unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    println!("| quota a second | script calls per instance per second | quota used | within rate × time + burst |");
    println!("|---:|---:|---:|---|");
    for per_second in quotas {
        rt.block_on(run(&server.url(), per_second, secs));
    }
}
