//! Attacks on the eviction promise: "A key that has used its whole quota always ranks above a
//! fresh key with one request, so a flood of new keys, however large, evicts the flood's own
//! keys and never wipes the record of the clients that are being limited" (`Overflow`,
//! `src/store/memory.rs`; the guide's "Memory and eviction").

use std::time::Duration;

use tower_bulwark::{
    Algorithm, FixedWindow, Gcra, KeyedRateLimiter, ManualClock, Overflow, Quota, SlidingCounter,
    SlidingLog,
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
        .on_overflow(Overflow::EvictNearestIdle)
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
/// each flood key spends. GCRA and the sliding log rank the client strictly below every fresh key
/// (its state goes idle sooner), so it is always evicted; the fixed window and the sliding counter
/// tie it with the flood's keys and evict it or not by table order (the fixed window did in one
/// run of four here; the sliding counter in none).
#[test]
#[ignore = "defect: with a quota of 1 a flood of one-request keys evicts a limited client, GCRA and sliding log always, fixed window by chance"]
fn a_flood_of_one_request_keys_frees_a_client_limited_to_one_a_minute() {
    let quota = Quota::per_minute(1).unwrap();
    let freed: Vec<&str> = [
        (flood_frees_limited_client::<Gcra>(quota, 1), name::<Gcra>()),
        (
            flood_frees_limited_client::<FixedWindow>(quota, 1),
            name::<FixedWindow>(),
        ),
        (
            flood_frees_limited_client::<SlidingLog>(quota, 1),
            name::<SlidingLog>(),
        ),
        (
            flood_frees_limited_client::<SlidingCounter>(quota, 1),
            name::<SlidingCounter>(),
        ),
    ]
    .into_iter()
    .filter_map(|(freed, name)| freed.then_some(name))
    .collect();
    assert!(
        freed.is_empty(),
        "limited client handed a fresh quota by: {freed:?}"
    );
}

/// GCRA with burst 1 and a larger rate (10 a minute, one every 6 s): the client spent its burst,
/// is refused, and ranks by `TAT - now` = 5.5 s, below a fresh key's 6 s.
#[test]
#[ignore = "defect: GCRA burst 1: a limited client ranks below a fresh one-request key and is evicted"]
fn gcra_burst_one_limited_client_is_evicted_by_one_request_keys() {
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
