//! One suite, two stores: the same sequences of requests against the in-memory limiter and the
//! Redis limiter, on one manual clock, must give the same decisions, field for field, refunds
//! included: of reservations and of immediate admissions, at once (a veto) or later. `Metered`'s
//! admissions name their hold in Redis and their state in memory: what they tell the client is
//! compared, and the decisions after each settle say whether the settles agreed.

use crate::common::waits_up_to;
use std::time::Duration;

use crate::common::redis_server::{or_skip, RedisServer};
use tower_bulwark::redis::{RedisAlgorithm, RedisRateLimiter, RedisStore};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra, Metered, SlidingCounter, SlidingLog},
    clock::ManualClock,
    limiter::Decision,
    KeyedRateLimiter, Limiter, Quota,
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
        waits_up_to(Quota::per_second(2).unwrap(), ms(1500)),
        waits_up_to(Quota::with_period(10, ms(250)).unwrap(), ms(600)),
        waits_up_to(Quota::with_period(1, ms(700)).unwrap(), ms(2000)),
    ]
}

/// What one sequence exercised.
#[derive(Default)]
struct Exercised {
    reservations: usize,
    immediate_refunds: usize,
    vetoes: usize,
    settles: [usize; 2],
}

/// The largest clock a Redis script takes exactly (2^52 ns).
const MAX_NOW: u64 = 1 << 52;

async fn run<A: RedisAlgorithm>(
    store: &RedisStore,
    quota: Quota,
    seed: u64,
    start: u64,
) -> Exercised {
    let clock = ManualClock::new();
    // One in-memory limiter a key: a Redis key is alone in its state, where a keyed limiter's
    // keys share what their shard's give-backs publish (the mark of a TAT moved back).
    let memories: Vec<KeyedRateLimiter<String, A, ManualClock>> = (0..3)
        .map(|_| {
            KeyedRateLimiter::<String>::builder(quota)
                .algorithm::<A>()
                .clock(clock.clone())
                .build()
        })
        .collect();
    let memory_of = |key: &str| &memories[usize::from(key.as_bytes()[0] - b'a')];
    let redis = RedisRateLimiter::builder(quota, store.clone())
        .algorithm::<A>()
        .client_clock(clock.clone())
        .prefix(format!("conf:{seed}:"))
        .refusal_cache_capacity(0)
        .timeout(Duration::from_secs(5))
        // No metered hold expires in a sequence: memory has no such bound.
        .hold_for(Duration::from_secs(86_400))
        .build()
        .unwrap();
    let name = std::any::type_name::<A>();
    let capacity = match name {
        name if name.ends_with("Gcra") || name.ends_with("Metered") => quota.burst(),
        _ => quota.permits(),
    };
    let same = |m: &Decision, r: &Decision, context: &str| {
        if name.ends_with("Metered") {
            assert_eq!(says(m), says(r), "memory vs redis: {context}");
        } else {
            assert_eq!(m, r, "memory vs redis: {context}");
        }
    };
    let period = u64::try_from(quota.period().as_nanos()).unwrap();
    // Both limiters count from the clock's zero (the in-memory one from its creation).
    clock.set(Duration::from_nanos(start));
    let mut rng = Rng(seed);
    let mut held: Vec<(String, u32, Decision, Decision)> = Vec::new();
    let mut seen = Exercised::default();
    for step in 0..300 {
        let key = ["a", "b", "c"][rng.below(3) as usize].to_string();
        let context = format!(
            "seed {seed}, step {step}, key {key}, t {:?}",
            clock.elapsed()
        );
        match rng.below(10) {
            // Time moves: often not at all (bursts in one instant), sometimes by a lot.
            0..=2 => {
                let by = match rng.below(4) {
                    0 => 0,
                    1 => rng.below(1000),
                    2 => rng.below(period / 3 + 1),
                    _ => rng.below(2 * period),
                };
                let now = u64::try_from(clock.elapsed().as_nanos()).unwrap();
                clock.advance(Duration::from_nanos(by.min(MAX_NOW - now)));
            }
            // Give back a held admission, as a dropped waiter or a veto does, or settle it to
            // what it cost: less, as much, more, or beyond what one request may take.
            3 if !held.is_empty() => {
                let (key, cost, m, r) = held.swap_remove(rng.below(held.len() as u64) as usize);
                if rng.below(2) == 0 {
                    let actual = rng.below(2 * u64::from(cost) + 2) as u32;
                    let actual = if rng.below(8) == 0 { u32::MAX } else { actual };
                    seen.settles[usize::from(actual > cost)] += 1;
                    memory_of(&key).settle(&key, cost, m, actual);
                    redis.settle_and_wait(&key, cost, r, actual).await.unwrap();
                    continue;
                }
                if m.wait.is_zero() {
                    seen.immediate_refunds += 1;
                }
                memory_of(&key).refund(&key, cost, m);
                redis.settle_and_wait(&key, cost, r, 0).await.unwrap();
            }
            // Another policy vetoes the request: whatever it was granted goes back at once.
            4 => {
                let cost = 1 + rng.below(u64::from(capacity.min(3))) as u32;
                let m = memory_of(&key).reserve(&key, cost).await.unwrap();
                let r = redis.reserve(&key, cost).await.unwrap();
                same(&m, &r, &format!("{context}, vetoed cost {cost}"));
                if m.allowed {
                    seen.vetoes += 1;
                    memory_of(&key).refund(&key, cost, m);
                    redis.settle_and_wait(&key, cost, r, 0).await.unwrap();
                }
            }
            op => {
                let cost = 1 + rng.below(u64::from(capacity.min(3))) as u32;
                let (m, r) = if op % 2 == 0 {
                    let m = memory_of(&key).check_n(&key, cost).unwrap();
                    let r = redis.check_n(&key, cost).await.unwrap();
                    (m, r)
                } else {
                    let m = memory_of(&key).reserve(&key, cost).await.unwrap();
                    let r = redis.reserve(&key, cost).await.unwrap();
                    (m, r)
                };
                same(&m, &r, &format!("{context}, cost {cost}"));
                if !m.wait.is_zero() {
                    seen.reservations += 1;
                }
                if m.allowed && rng.below(3) == 0 {
                    held.push((key, cost, m, r));
                }
            }
        }
    }
    seen
}

/// What a decision tells its client.
fn says(d: &Decision) -> (bool, u64, u64, Duration, Duration, Duration) {
    let Decision {
        allowed,
        limit,
        remaining,
        retry_after,
        reset_after,
        wait,
        ..
    } = *d;
    (allowed, limit, remaining, retry_after, reset_after, wait)
}

/// Replays seeded runs of `A` on each quota against a Redis server of the test's own, named
/// `test`, and asserts that each kind of step was exercised.
async fn conform<A: RedisAlgorithm>(test: &str, base_seed: u64) {
    let (_server, store) = or_skip!(RedisServer::with_store(test).await);
    let mut total = Exercised::default();
    for (i, quota) in quotas().into_iter().enumerate() {
        for round in 0..3 {
            let seed = base_seed * 1000 + (i as u64) * 10 + round + 1;
            let seen = run::<A>(&store, quota, seed, 0).await;
            total.reservations += seen.reservations;
            total.immediate_refunds += seen.immediate_refunds;
            total.vetoes += seen.vetoes;
            for (total, seen) in total.settles.iter_mut().zip(seen.settles) {
                *total += seen;
            }
        }
    }
    let name = std::any::type_name::<A>();
    assert!(total.reservations > 0, "{name}: no reservation exercised");
    assert!(
        total.immediate_refunds > 0,
        "{name}: no immediate admission refunded"
    );
    assert!(total.vetoes > 0, "{name}: no veto exercised");
    assert!(
        total.settles.iter().all(|&n| n > 0),
        "{name}: settles to less and to more not both exercised: {:?}",
        total.settles
    );
}

#[tokio::test]
async fn gcra_in_redis_decides_as_in_memory() {
    conform::<Gcra>("gcra_in_redis_decides_as_in_memory", 1).await;
}

#[tokio::test]
async fn fixed_window_in_redis_decides_as_in_memory() {
    conform::<FixedWindow>("fixed_window_in_redis_decides_as_in_memory", 2).await;
}

#[tokio::test]
async fn sliding_log_in_redis_decides_as_in_memory() {
    conform::<SlidingLog>("sliding_log_in_redis_decides_as_in_memory", 3).await;
}

#[tokio::test]
async fn metered_in_redis_decides_and_settles_as_in_memory() {
    conform::<Metered>("metered_in_redis_decides_as_in_memory", 5).await;
}

#[tokio::test]
async fn sliding_counter_in_redis_decides_as_in_memory() {
    conform::<SlidingCounter>("sliding_counter_in_redis_decides_as_in_memory", 4).await;
}

/// Near the bounds of exact arithmetic in Lua's doubles: a clock close to 2^52 ns and periods of
/// 2^50 ns (about 13 days), with sums of such values in every script.
async fn conform_at_the_bounds<A: RedisAlgorithm>(store: &RedisStore, base_seed: u64) {
    // 2^50 - 1 and 2^50 - 4 are multiples of 3: GCRA's burst window stays within 2^50.
    let period = Duration::from_nanos((1 << 50) - 1);
    let quotas = [
        Quota::with_period(3, period).unwrap(),
        waits_up_to(
            Quota::with_period(3, period - Duration::from_nanos(3)).unwrap(),
            period / 2,
        ),
    ];
    for (i, quota) in quotas.into_iter().enumerate() {
        for round in 0..2 {
            let seed = base_seed * 1000 + 500 + (i as u64) * 10 + round + 1;
            // Start so that the sequence (a few periods at most) ends at 2^52 at the latest.
            run::<A>(store, quota, seed, MAX_NOW - 3 * (1 << 50) - 12_345).await;
        }
    }
}

#[tokio::test]
async fn every_algorithm_decides_as_in_memory_at_the_bounds_of_exact_arithmetic() {
    let (_server, store) = or_skip!(RedisServer::with_store("conformance_at_the_bounds").await);
    conform_at_the_bounds::<Gcra>(&store, 11).await;
    conform_at_the_bounds::<FixedWindow>(&store, 12).await;
    conform_at_the_bounds::<SlidingLog>(&store, 13).await;
    conform_at_the_bounds::<SlidingCounter>(&store, 14).await;
}
