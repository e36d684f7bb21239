//! Decisions per second through `RedisRateLimiter` against the ceiling of the same Redis server
//! running the same script with the same concurrency, and refusals served from the local cache
//! against refusals that go to Redis.
//!
//! Run with `cargo bench --features redis --bench redis`. The bench starts its own
//! `redis-server` on a free port (and skips, saying why, when there is none).

#[path = "../tests/common/redis_server.rs"]
mod support;

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use redis::aio::ConnectionManager;
use tokio::runtime::Runtime;
use tower_bulwark::redis::{RedisRateLimiter, RedisStore};
use tower_bulwark::Quota;

const TASKS: u64 = 64;

/// The GCRA script exactly as the limiter sends it.
const GCRA_SCRIPT: &str = concat!(
    include_str!("../src/redis/prelude.lua"),
    include_str!("../src/redis/gcra.lua")
);

/// Runs `iters` calls of `call` spread over 64 concurrent tasks and returns the wall time.
fn concurrent<F, Fut>(rt: &Runtime, iters: u64, call: F) -> Duration
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    rt.block_on(async move {
        let start = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let call = Arc::clone(&call);
                let n = iters / TASKS + u64::from(task < iters % TASKS);
                tokio::spawn(async move {
                    for _ in 0..n {
                        call(task).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let Some(server) = support::RedisServer::start("bench redis") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url = server.url();
    // A quota so large that every decision is an admission, as on a healthy service.
    let quota = Quota::per_second(1_000_000_000).unwrap();
    let (store, manager, limiter, strict, strict_cached) = rt.block_on(async {
        let store = RedisStore::connect(&url).await.unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let manager = ConnectionManager::new(client).await.unwrap();
        let limiter = RedisRateLimiter::builder(quota, store.clone())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let one_per_hour = Quota::per_hour(1).unwrap();
        let strict = RedisRateLimiter::builder(one_per_hour, store.clone())
            .prefix("strict:")
            .timeout(Duration::from_secs(5))
            .refusal_cache_capacity(0)
            .build()
            .unwrap();
        let strict_cached = RedisRateLimiter::builder(one_per_hour, store.clone())
            .prefix("strict_cached:")
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        for task in 0..TASKS {
            let key = format!("k{task}");
            strict.check(&key).await.unwrap();
            strict_cached.check(&key).await.unwrap();
        }
        (store, manager, limiter, strict, strict_cached)
    });
    drop(store);
    static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(GCRA_SCRIPT));
    let script: &'static redis::Script = &SCRIPT;
    // The arguments the limiter sends for this quota (interval 1 µs, horizon = burst µs).
    let burst = quota.burst().to_string();
    let interval = quota
        .emission_interval()
        .as_nanos()
        .div_ceil(1000)
        .to_string();
    let horizon = (quota.emission_interval().as_nanos().div_ceil(1000) * u128::from(quota.burst()))
        .to_string();
    // In `prelude.lua`'s order: decide, the server's time, ticks per millisecond, cost, longest
    // wait, expiry margin, no deadline, then GCRA's own.
    let args: Arc<Vec<String>> = Arc::new(
        [
            "d", "", "1000", "1", "0", "0", "", &interval, &horizon, &burst,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    );

    let keys: Arc<Vec<String>> = Arc::new((0..TASKS).map(|t| format!("k{t}")).collect());
    let raw_keys: Arc<Vec<String>> =
        Arc::new((0..TASKS).map(|t| format!("raw:{{k{t}}}")).collect());

    let mut group = c.benchmark_group("redis");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(20)
        .measurement_time(Duration::from_secs(6));

    group.bench_function("ceiling: raw EVALSHA, 64 tasks", |b| {
        b.iter_custom(|iters| {
            let manager = manager.clone();
            let args = Arc::clone(&args);
            let raw_keys = Arc::clone(&raw_keys);
            concurrent(&rt, iters, move |task| {
                let mut manager = manager.clone();
                let args = Arc::clone(&args);
                let raw_keys = Arc::clone(&raw_keys);
                async move {
                    let mut invocation = script.prepare_invoke();
                    invocation.key(raw_keys[task as usize].as_str());
                    for arg in args.iter() {
                        invocation.arg(arg.as_str());
                    }
                    let _: redis::Value = invocation.invoke_async(&mut manager).await.unwrap();
                }
            })
        })
    });

    group.bench_function("RedisRateLimiter, 64 tasks", |b| {
        b.iter_custom(|iters| {
            let limiter = limiter.clone();
            let keys = Arc::clone(&keys);
            concurrent(&rt, iters, move |task| {
                let limiter = limiter.clone();
                let keys = Arc::clone(&keys);
                async move {
                    let d = limiter.check(&keys[task as usize]).await.unwrap();
                    assert!(d.allowed);
                }
            })
        })
    });

    group.bench_function("refusals from redis, 64 tasks", |b| {
        b.iter_custom(|iters| {
            let strict = strict.clone();
            let keys = Arc::clone(&keys);
            concurrent(&rt, iters, move |task| {
                let strict = strict.clone();
                let keys = Arc::clone(&keys);
                async move {
                    let d = strict.check(&keys[task as usize]).await.unwrap();
                    assert!(!d.allowed);
                }
            })
        })
    });

    group.bench_function("refusals from the local cache, 64 tasks", |b| {
        b.iter_custom(|iters| {
            let strict_cached = strict_cached.clone();
            let keys = Arc::clone(&keys);
            concurrent(&rt, iters, move |task| {
                let strict_cached = strict_cached.clone();
                let keys = Arc::clone(&keys);
                async move {
                    let d = strict_cached.check(&keys[task as usize]).await.unwrap();
                    assert!(!d.allowed);
                }
            })
        })
    });
    group.finish();
    assert_eq!(
        limiter.counts().failures + strict.counts().failures + strict_cached.counts().failures,
        0
    );
    drop(server);
}

criterion_group!(benches, bench);
criterion_main!(benches);
