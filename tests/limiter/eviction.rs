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
