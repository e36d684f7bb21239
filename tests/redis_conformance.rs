//! One suite, two stores: the same sequences of requests against the in-memory limiter and the
//! Redis limiter, on one manual clock, must give the same decisions, field for field.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use support::RedisServer;
use tower_bulwark::store::redis::{RedisAlgorithm, RedisRateLimiter, RedisStore};
use tower_bulwark::{
    Decision, FixedWindow, Gcra, KeyedRateLimiter, Limiter, ManualClock, Quota, SlidingCounter,
    SlidingLog,
};

/// A small deterministic generator (xorshift64*), so a failure names its seed and replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn quotas() -> Vec<Quota> {
    let ms = Duration::from_millis;
    vec![
        Quota::per_second(5).unwrap(),
        // An emission interval that does not divide evenly (333 333 334 ns).
        Quota::with_period(3, ms(1000)).unwrap(),
        Quota::per_second(4).unwrap().with_burst(7).unwrap(),
        Quota::per_second(2)
            .unwrap()
            .with_max_wait(ms(1500))
            .unwrap(),
        Quota::with_period(10, ms(250))
            .unwrap()
            .with_max_wait(ms(600))
            .unwrap(),
        Quota::with_period(1, ms(700))
            .unwrap()
            .with_max_wait(ms(2000))
            .unwrap(),
    ]
}

async fn run<A: RedisAlgorithm>(store: &RedisStore, quota: Quota, seed: u64) -> usize {
    let clock = ManualClock::new();
    let memory = KeyedRateLimiter::<String>::builder(quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    let redis = RedisRateLimiter::builder(quota, store.clone())
        .algorithm::<A>()
        .client_clock(clock.clone())
        .prefix(format!("conf:{seed}:"))
        .without_refusal_cache()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let capacity = match std::any::type_name::<A>() {
        name if name.ends_with("Gcra") => quota.burst(),
        _ => quota.permits(),
    };
    let period = u64::try_from(quota.period().as_nanos()).unwrap();
    let mut rng = Rng(seed);
    let mut held: Vec<(String, u32, Decision)> = Vec::new();
    let mut reservations = 0;
    for step in 0..300 {
        let key = ["a", "b", "c"][rng.below(3) as usize].to_string();
        let context = format!(
            "seed {seed}, step {step}, key {key}, t {:?}",
            clock.elapsed()
        );
        match rng.below(10) {
            // Time moves: often not at all (bursts in one instant), sometimes by a lot.
            0..=2 => clock.advance(Duration::from_nanos(match rng.below(4) {
                0 => 0,
                1 => rng.below(1000),
                2 => rng.below(period / 3 + 1),
                _ => rng.below(2 * period),
            })),
            // Give back a held admission, as a dropped waiter or a veto does.
            3 if !held.is_empty() => {
                let (key, cost, decision) = held.swap_remove(rng.below(held.len() as u64) as usize);
                memory.refund(&key, cost, &decision);
                redis.give_back(&key, cost, &decision).await.unwrap();
            }
            op => {
                let cost = 1 + rng.below(u64::from(capacity.min(3))) as u32;
                let (m, r) = if op % 2 == 0 {
                    let m = memory.check_n(&key, cost).unwrap();
                    let r = redis.check_n(&key, cost).await.unwrap();
                    (m, r)
                } else {
                    let m = memory.reserve(&key, cost).await.unwrap();
                    let r = redis.reserve(&key, cost).await.unwrap();
                    (m, r)
                };
                assert_eq!(m, r, "memory vs redis: {context}, cost {cost}");
                if m.allowed && rng.below(3) == 0 {
                    held.push((key, cost, m));
                }
                if !m.wait.is_zero() {
                    reservations += 1;
                }
            }
        }
    }
    reservations
}

async fn conform<A: RedisAlgorithm>(store: &RedisStore, base_seed: u64) {
    let mut reservations = 0;
    for (i, quota) in quotas().into_iter().enumerate() {
        for round in 0..3 {
            let seed = base_seed * 1000 + (i as u64) * 10 + round + 1;
            reservations += run::<A>(store, quota, seed).await;
        }
    }
    assert!(
        reservations > 0,
        "{}: the sequences must exercise reservations",
        std::any::type_name::<A>()
    );
}

#[tokio::test]
async fn gcra_in_redis_decides_as_in_memory() {
    let Some(server) = RedisServer::start("gcra_in_redis_decides_as_in_memory") else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    conform::<Gcra>(&store, 1).await;
}

#[tokio::test]
async fn fixed_window_in_redis_decides_as_in_memory() {
    let Some(server) = RedisServer::start("fixed_window_in_redis_decides_as_in_memory") else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    conform::<FixedWindow>(&store, 2).await;
}

#[tokio::test]
async fn sliding_log_in_redis_decides_as_in_memory() {
    let Some(server) = RedisServer::start("sliding_log_in_redis_decides_as_in_memory") else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    conform::<SlidingLog>(&store, 3).await;
}

#[tokio::test]
async fn sliding_counter_in_redis_decides_as_in_memory() {
    let Some(server) = RedisServer::start("sliding_counter_in_redis_decides_as_in_memory") else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    conform::<SlidingCounter>(&store, 4).await;
}
