//! The eviction promise under floods: a key that has used its whole quota ranks above a fresh key
//! with one request, and among keys holding as many permits the established one is kept, so a
//! flood of new keys evicts its own keys (`Overflow`, `src/store/memory.rs`; the guide's "Memory
//! and eviction").

use std::time::Duration;

use tower_bulwark::{
    algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    limiter::Overflow,
    KeyedRateLimiter, Quota,
};

fn name<A>() -> &'static str {
    std::any::type_name::<A>().rsplit("::").next().unwrap()
}

/// One client is limited (its whole quota spent, its next request refused); then a flood of fresh
/// keys, one request each, all within the same second. Returns whether the limited client is
/// admitted again afterwards, which only a wiped record can explain.
fn flood_frees_limited_client<A: Algorithm>(quota: Quota, spend: u32) -> bool {
    let clock = ManualClock::new();
    let max_keys = 64;
    let limiter = KeyedRateLimiter::<u64>::builder(quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .max_keys(max_keys)
        .overflow(Overflow::EvictNearestIdle)
        .build();
    let client = u64::MAX;
    for _ in 0..spend {
        assert!(limiter.check(&client).allowed);
    }
    clock.advance(Duration::from_millis(500));
    assert!(
        !limiter.check(&client).allowed,
        "{} not limited",
        name::<A>()
    );
    for key in 0..20 * max_keys as u64 {
        limiter.check(&key);
    }
    limiter.check(&client).allowed
}

/// A quota of one request a minute: the limited client's whole quota is one request, exactly what
/// each flood key spends, so forgetting either gives away as much. Among keys holding as many
/// permits, GCRA and the sliding log keep the one that took them earliest: the client stays
/// limited. (The fixed window and the sliding counter count permits per window, where the client
/// and the flood's keys are alike in everything the state holds; the guide says so.)
#[test]
fn a_flood_of_one_request_keys_keeps_a_client_limited_to_one_a_minute() {
    let quota = Quota::per_minute(1).unwrap();
    assert!(!flood_frees_limited_client::<Gcra>(quota, 1));
    assert!(!flood_frees_limited_client::<SlidingLog>(quota, 1));
}

/// GCRA with burst 1 and a larger rate (10 a minute, one every 6 s): the client spent its burst
/// and is refused; it holds one permit, as each fresh key does, and took it earlier, so it stays.
#[test]
fn gcra_burst_one_limited_client_is_kept_against_one_request_keys() {
    let quota = Quota::per_minute(10).unwrap().with_burst(1).unwrap();
    assert!(!flood_frees_limited_client::<Gcra>(quota, 1));
}

/// Held: with the default burst (the whole quota) every algorithm keeps the limited client
/// against a flood of one-request keys.
#[test]
fn a_flood_of_one_request_keys_keeps_a_client_limited_to_ten_a_minute() {
    let quota = Quota::per_minute(10).unwrap();
    assert!(!flood_frees_limited_client::<Gcra>(quota, 10));
    assert!(!flood_frees_limited_client::<FixedWindow>(quota, 10));
    assert!(!flood_frees_limited_client::<SlidingLog>(quota, 10));
    assert!(!flood_frees_limited_client::<SlidingCounter>(quota, 10));
}

/// The flood and the limited client race, each on threads of its own (more threads than the
/// shard lock has reader locks, so readers share them): once the client has spent its quota,
/// eight threads flood a one-shard store with fresh keys, inserting and evicting under the write
/// lock, while eight others ask for the client's key. The client, whose whole quota weighs
/// above any fresh key's one permit, is never evicted: not one more of its requests is
/// admitted, and it is still limited once the flood ends. (A client evicted before it has spent
/// its quota may start afresh, as `Overflow::EvictNearestIdle` says.)
#[test]
fn a_flood_racing_a_limited_client_on_many_threads_never_frees_it() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    let quota = Quota::per_minute(10).unwrap();
    for round in 0..5u64 {
        let limiter = KeyedRateLimiter::<u64>::builder(quota)
            .clock(ManualClock::new())
            .max_keys(64)
            .build();
        let client = u64::MAX;
        for _ in 0..10 {
            assert!(limiter.check(&client).allowed, "round {round}");
        }
        let admitted = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(16));
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let (limiter, admitted, barrier) =
                    (limiter.clone(), Arc::clone(&admitted), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    for i in 0..2_000u64 {
                        if t % 2 == 0 {
                            if limiter.check(&client).allowed {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        } else {
                            limiter.check(&((round << 40) | (t << 20) | i));
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 0, "round {round}");
        assert!(!limiter.check(&client).allowed, "round {round}");
        assert!(limiter.len() <= 64, "round {round}: {} keys", limiter.len());
    }
}
