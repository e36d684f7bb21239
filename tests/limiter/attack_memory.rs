//! Attacks on the keyed limiter's memory (the key bound, eviction, `retain_recent`, a full
//! store under `Overflow::RefuseNewKeys`) and on waiting (`acquire` across a quota change), for
//! every algorithm, through the public API only. Each test names the promise it attacks.

use std::time::Duration;

use tower_bulwark::algorithm::{Algorithm, FixedWindow, Gcra, Metered, SlidingCounter, SlidingLog};
use tower_bulwark::clock::{Clock, ManualClock};
use tower_bulwark::limiter::acquire;
use tower_bulwark::limiter::{Decision, Overflow};
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

use crate::attack_direct::{each_reporting_all, keyed, name, Dial};
use crate::common::{joined, paused_runtime, poll_once, tokio_keyed_with};

const S: u64 = 1_000_000_000;

/// Far from zero, as a real clock's readings are.
const BASE: u64 = 1_000 * S;

/// Settles `d` (admitted for one permit) to one permit under `Metered`, whose admissions hold
/// their estimate until settled; nothing for the other algorithms (a settle to the estimate
/// changes nothing there). Whether the limiter took it (false: the key was evicted since).
fn settled<A: Algorithm, C: Clock>(l: &KeyedRateLimiter<u32, A, C>, k: u32, d: Decision) -> bool {
    name::<A>() != "Metered" || !d.allowed || Limiter::settle(l, &k, 1, d, 1)
}

/// How many of `n` checks of `key` (each settled) are admitted now.
fn admits<A: Algorithm, C: Clock>(l: &KeyedRateLimiter<u32, A, C>, key: u32, n: u32) -> u32 {
    (0..n)
        .filter(|_| {
            let d = l.check(&key);
            let allowed = d.allowed;
            assert!(settled(l, key, d));
            allowed
        })
        .count() as u32
}

// ---------------------------------------------------------------------------------------------
// 1. The key bound: `len()` never above `max_keys`.

/// Eight threads flood a limiter with 100 times `max_keys` fresh keys (one request each, a
/// quota of one an hour: every key stays live), for bounds that are and are not a multiple of
/// the shard count, sampling `len()` as they go.
fn flood_stays_within_max_keys<A: Algorithm>() {
    for overflow in [Overflow::EvictNearestIdle, Overflow::RefuseNewKeys] {
        for max_keys in [1usize, 63, 2_049] {
            let clock = ManualClock::new();
            let q = Quota::per_hour(1).unwrap();
            let limiter = keyed::<A, _>(q, clock, max_keys, overflow);
            let threads = (0..8u32)
                .map(|t| {
                    let limiter = limiter.clone();
                    std::thread::spawn(move || {
                        let mut most = 0;
                        for i in (t..100 * max_keys as u32).step_by(8) {
                            // A flood's key may be evicted before its settle.
                            settled(&limiter, i, limiter.check(&i));
                            if i % 97 == 0 {
                                most = most.max(limiter.len());
                            }
                        }
                        most
                    })
                })
                .collect();
            let most = joined(threads)
                .into_iter()
                .max()
                .unwrap()
                .max(limiter.len());
            assert!(
                most <= max_keys && limiter.max_keys() <= max_keys,
                "{} {overflow:?}: {most} keys held, max_keys {max_keys} (says {})",
                name::<A>(),
                limiter.max_keys()
            );
        }
    }
}

/// `max_keys` (`src/limiter/builder.rs:151`): "The most keys held in memory"; the guide
/// (`src/guide.rs:136`): "A `KeyedRateLimiter` holds at most `max_keys` keys".
#[test]
fn a_flood_from_eight_threads_never_holds_more_than_max_keys() {
    each_reporting_all(&five!(flood_stays_within_max_keys));
}

// ---------------------------------------------------------------------------------------------
// 2. `retain_recent` and a reading older than the sweep.

/// 2 a second. Both limiters admit what they can at `BASE + 0.5 s`; the one under attack then
/// sweeps at `BASE + 10 s` (every key idle by then) and gets a reading from before the sweep
/// (`BASE + 0.9 s`, a thread that read the clock first), while its twin, which never drops a
/// key, gets that reading raised to the sweep's, as the docs say the drop decides it. Then both
/// at `BASE + 10 s`. Returns what each admitted in all.
fn admitted_across_a_sweep<A: Algorithm>() -> (u32, u32) {
    let q = Quota::per_second(2).unwrap();
    let (da, db) = (Dial::at(BASE), Dial::at(BASE));
    let a = keyed::<A, _>(q, da.clone(), 64, Overflow::RefuseNewKeys);
    let twin = keyed::<A, _>(q, db.clone(), 64, Overflow::RefuseNewKeys);
    let (mut got, mut twin_got) = (0, 0);
    for (reading, twin_reading, sweep) in [
        (BASE + S / 2, BASE + S / 2, false),
        (BASE + 9 * S / 10, BASE + 10 * S, true),
        (BASE + 10 * S, BASE + 10 * S, false),
    ] {
        if sweep {
            da.set(BASE + 10 * S);
            a.retain_recent();
            assert_eq!(a.len(), 0, "{}: the idle key is dropped", name::<A>());
        }
        da.set(reading);
        db.set(twin_reading);
        got += admits(&a, 7, 3);
        twin_got += admits(&twin, 7, 3);
    }
    (got, twin_got)
}

fn a_stale_reading_after_a_sweep_admits_as_the_twin<A: Algorithm>() {
    let (got, twin) = admitted_across_a_sweep::<A>();
    assert_eq!(
        got,
        twin,
        "{}: {got} admitted across the sweep, {twin} by the twin that kept the key",
        name::<A>()
    );
}

/// `src/store/memory.rs:18-22`: dropping idle keys "changes no decision: the store first
/// publishes its own reading to the shard's latest reading, so that a reading older than the
/// drop that reaches a fresh key is decided as of the drop"; `retain_recent`
/// (`src/limiter/keyed.rs:259`): "No decision changes".
///
/// (Found by this attack: under every algorithm but GCRA, the fresh key decided the old reading
/// as of itself, 6 admitted in all against the twin's 4, 4 of them at `BASE + 0.5 s` and
/// `BASE + 0.9 s` under 2 a second. Every algorithm now decides as of the shard's reading when
/// it is later than the key's.)
#[test]
fn retain_recent_then_a_reading_older_than_the_sweep_changes_no_decision() {
    each_reporting_all(&five!(a_stale_reading_after_a_sweep_admits_as_the_twin));
}

// ---------------------------------------------------------------------------------------------
// 3. A full store under `RefuseNewKeys`: the refusal of a new key.

/// One slot (`max_keys(1)`), 2 a second, the limiter made at `BASE`. Key 0 takes one permit at
/// `BASE + 0.25 s`; key 1 is then refused. Its `retry_after` must be the exact time until it is
/// admitted (a nanosecond earlier it is still refused), and key 0 keeps its own budget.
fn a_refused_new_key_is_told_exactly_when<A: Algorithm>() {
    let q = Quota::per_second(2).unwrap();
    let dial = Dial::at(BASE);
    let limiter = keyed::<A, _>(q, dial.clone(), 1, Overflow::RefuseNewKeys);
    let at = BASE + S / 4;
    dial.set(at);
    assert_eq!(admits(&limiter, 0, 1), 1);
    let refused = limiter.check(&1);
    let n = name::<A>();
    assert!(!refused.allowed, "{n}: a new key in a full store");
    assert_eq!(refused.remaining, 0, "{n}");
    let too_much = limiter
        .check_n(&1, 3)
        .expect_err("a cost no quota of 2 admits");
    assert_eq!(too_much.capacity(), 2, "{n}");
    let wait = refused.retry_after.as_nanos() as u64;
    assert!(wait > 0, "{n}: retry_after of a refusal is never zero");
    dial.set(at + wait - 1);
    assert!(
        !limiter.check(&1).allowed,
        "{n}: admitted {wait} ns - 1 ns later"
    );
    assert_eq!(limiter.len(), 1, "{n}");
    dial.set(at + wait);
    let admitted = limiter.check(&1);
    assert!(
        admitted.allowed,
        "{n}: refused after retry_after ({wait} ns): {admitted:?}"
    );
}

/// The guide (`src/guide.rs:117-118`): "`retry_after` of a refusal is the exact time until the
/// same request would be admitted if nothing else arrived in between; it is never zero";
/// `Overflow::RefuseNewKeys` (`src/store/memory.rs:59`): "at most until the nearest key goes
/// idle, which the refusal's `retry_after` says".
#[test]
fn a_new_key_refused_by_a_full_store_is_admitted_exactly_at_retry_after() {
    each_reporting_all(&five!(a_refused_new_key_is_told_exactly_when));
}

// ---------------------------------------------------------------------------------------------
// 4. Eviction: a limited client with reservations or held estimates, against a flood of keys
//    that each spend the whole quota, from eight threads.

/// 10 a minute, waiting up to two minutes, `max_keys(64)`. The client spends its 10 and reserves
/// 10 more (under `Metered`, its 10 estimates stay held); then, a second later, eight threads
/// flood 100 times `max_keys` fresh keys that each spend the whole quota (10 requests), while a
/// ninth asks for the client. Not one of the client's requests is admitted, during the flood or
/// after it.
fn a_client_with_reservations_survives_a_full_quota_flood<A: Algorithm>() {
    a_client_taking_survives_a_full_quota_flood::<A>(20);
}

fn a_client_taking_survives_a_full_quota_flood<A: Algorithm>(taken: u32) {
    let q = Quota::per_minute(10)
        .unwrap()
        .with_max_wait(Duration::from_secs(120))
        .unwrap();
    let dial = Dial::at(BASE);
    let limiter = keyed::<A, _>(q, dial.clone(), 64, Overflow::EvictNearestIdle);
    let client = u32::MAX;
    for _ in 0..taken {
        let d = Limiter::reserve_now(&limiter, &client, 1).unwrap().unwrap();
        assert!(d.allowed, "{}: {d:?}", name::<A>());
    }
    dial.set(BASE + S);
    let mut threads: Vec<_> = (0..8u32)
        .map(|t| {
            let limiter = limiter.clone();
            std::thread::spawn(move || {
                for key in (t..6_400).step_by(8) {
                    for _ in 0..10 {
                        settled(&limiter, key, limiter.check(&key));
                    }
                }
                0
            })
        })
        .collect();
    let asker = limiter.clone();
    threads.push(std::thread::spawn(move || {
        (0..5_000).filter(|_| asker.check(&client).allowed).count()
    }));
    let during: usize = joined(threads).into_iter().sum();
    let after = limiter.check(&client).allowed;
    assert!(
        during == 0 && !after && limiter.len() <= 64,
        "{}: the client was admitted {during} times during the flood, after it: {after}",
        name::<A>()
    );
}

/// `Overflow::EvictNearestIdle` (`src/store/memory.rs:46-49`): "A key that has used its whole
/// quota always ranks above a fresh key with one request, so a flood of new keys, however
/// large, evicts the flood's own keys and never wipes the record of the clients that are being
/// limited"; the guide (`src/guide.rs:145-149`): "a flood of fresh keys never hands a client
/// that is being limited a fresh quota", its one exception a quota of one request.
#[test]
fn a_client_with_reservations_is_never_evicted_by_a_flood_spending_whole_quotas() {
    each_reporting_all(&five!(
        a_client_with_reservations_survives_a_full_quota_flood
    ));
}

fn a_limited_client_survives_a_full_quota_flood<A: Algorithm>() {
    a_client_taking_survives_a_full_quota_flood::<A>(10);
}

/// The same promise, and `Metered`'s (`src/algorithm/metered.rs:168`): "A key evicted while
/// it holds permits (only when every key in the store holds more)". The client takes its 10
/// (under `Metered`, 10 estimates held, unsettled) with no reservation, so it holds as many as
/// each flood key, and took them a second earlier: "among keys holding as many, the one that
/// took them earliest is kept" (`src/store/memory.rs:45-46`).
///
/// (Found by this attack: it was evicted under three algorithms, whose counts did not say
/// when they were taken: the fixed window admitted it 48 times during the flood, `Metered` 10
/// (a fresh quota, though no key held more than it), the sliding counter after it. Each now
/// keeps the reading at which a key began to weigh, and ranks by it among equals.)
#[test]
fn a_limited_client_is_never_evicted_by_a_later_flood_spending_whole_quotas() {
    each_reporting_all(&five!(a_limited_client_survives_a_full_quota_flood));
}

// ---------------------------------------------------------------------------------------------
// 5. `acquire` across a quota change, on tokio's paused clock.

/// 1 a second, waiting up to 2 s: key 7 spends its permit, then an `acquire` is polled once
/// (it reserves) and the quota changes to `next`; the waiter must resolve admitted exactly when
/// a twin's reservation, made at the same instant under the old quota, says (tokio's timer
/// rounds a deadline up to its millisecond: the sliding counter's 1 s + 1 ns resolves at
/// 1.001 s).
async fn a_waiter_falls_due_as_told_across_a_change<A: Algorithm>(next: Quota) {
    let q = Quota::per_second(1)
        .unwrap()
        .with_max_wait(Duration::from_secs(2))
        .unwrap();
    let (l, twin) = (tokio_keyed_with::<u32, A>(q), tokio_keyed_with::<u32, A>(q));
    assert!(l.check(&7).allowed && twin.check(&7).allowed);
    let start = tokio::time::Instant::now();
    let told = Limiter::reserve_now(&twin, &7, 1).unwrap().unwrap();
    assert!(told.allowed && !told.wait.is_zero(), "{told:?}");
    let mut waiter = Box::pin(acquire(&l, &7, 1));
    assert!(poll_once(waiter.as_mut()).is_pending());
    l.set_quota(next);
    let d = waiter.await.unwrap();
    let waited = start.elapsed();
    assert!(
        d.allowed && waited >= told.wait && waited < told.wait + Duration::from_millis(1),
        "{}: resolved after {:?}, told {:?}: {d:?}",
        name::<A>(),
        waited,
        told.wait
    );
}

fn a_waiter_falls_due_as_told_across_stricter_and_looser_quotas<A: Algorithm>() {
    for next in [
        Quota::per_minute(1).unwrap(),
        Quota::per_second(100).unwrap(),
    ] {
        paused_runtime().block_on(a_waiter_falls_due_as_told_across_a_change::<A>(next));
    }
}

/// `KeyedRateLimiter::set_quota` (`src/limiter/keyed.rs:208-210`): "a reservation granted
/// under the old quota stays granted and falls due when it was told to".
#[test]
fn an_acquire_waiting_across_a_quota_change_falls_due_when_it_was_told() {
    each_reporting_all(&five!(
        a_waiter_falls_due_as_told_across_stricter_and_looser_quotas
    ));
}
