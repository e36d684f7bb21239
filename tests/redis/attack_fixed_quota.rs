//! Attack on `FixedWindow`'s reservations across changes of quota in Redis (CHANGELOG, "Fixed
//! (2026-12-06, later)": "in memory and in Redis"), against an in-memory twin on the same
//! manual clock: random checks, reservations, give-backs, settles both ways and changes of
//! limit, `max_wait` and (at instants both periods divide) period.

use std::time::Duration;

use crate::common::quota_ns;
use crate::common::redis_server::{or_skip, uncached, RedisServer};
use crate::common::reservation_windows::ReservationWindows;
use crate::common::{manual_clock_at, Rng};
use tower_bulwark::algorithm::FixedWindow;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::limiter::Decision;
use tower_bulwark::redis::RedisStore;
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const BASE: u64 = 1000 * S;
const STEP: u64 = 250 * MS;

fn at(clock: &ManualClock, nanos: u64) {
    clock.set(Duration::from_nanos(BASE + nanos));
}

/// What a schedule changes: only `max_wait`, the limit too, or the period too.
#[derive(Clone, Copy, PartialEq)]
enum Changes {
    MaxWait,
    Limits,
    Periods,
}

/// The quotas a schedule picks from: periods of whole steps (so every window sees a request).
fn pool(changes: Changes) -> Vec<Quota> {
    if changes == Changes::MaxWait {
        return [3 * S, 0, 5 * S, 3600 * S, S / 4]
            .map(|wait| quota_ns(10, S, 10, wait))
            .to_vec();
    }
    let mut q = vec![
        quota_ns(10, S, 10, 3 * S),
        quota_ns(20, S, 20, 3 * S),
        quota_ns(3, S, 3, 5 * S),
        quota_ns(7, S, 7, 0),
        quota_ns(1, S, 1, 3600 * S),
    ];
    if changes == Changes::Periods {
        q.extend([
            quota_ns(10, S / 2, 10, 2 * S),
            quota_ns(30, 2 * S, 30, 6 * S),
            quota_ns(5, S / 4, 5, 3 * S),
        ]);
    }
    q
}

/// [`schedule`] for 25 seeds, the `n`th `n × spread`.
async fn schedules(name: &str, spread: u64, changes: Changes, give_backs: bool, twin: bool) {
    for n in 1..=25u64 {
        schedule(name, n.wrapping_mul(spread), changes, give_backs, twin).await;
    }
}

/// One random schedule from `seed` on the key "k" of a Redis limiter and an in-memory twin made
/// at 1000 s (its cycles those of Redis): every 250 ms up to 1 to 4 calls (a check, a
/// reservation of one permit, a give-back of an admission or of a reservation before it falls
/// due, a settle to more of an admission) and at times one to three changes of quota. With
/// `twin`, each decision of Redis must be the twin's; in any case, every window keeps what
/// `ReservationWindows` asserts (give-backs left out of the tally: reservations of one permit
/// and only ever admissions given back whole, which only makes it more lenient).
async fn schedule(name: &str, seed: u64, periods: Changes, give_backs: bool, twin: bool) {
    const END: u64 = 8 * S;
    let server = or_skip!(RedisServer::start(name));
    let clock = manual_clock_at(Duration::from_nanos(BASE));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let pool = pool(periods);
    let mut rng = Rng(seed);
    let first = pool[0];
    let l = uncached::<FixedWindow>(&store, first, &clock, &format!("{name}:{seed}"));
    let memory = KeyedRateLimiter::<&str>::builder(first)
        .algorithm::<FixedWindow>()
        .clock(clock.clone())
        .build();
    let mut changes = vec![(0, first)];
    let mut log = vec![format!("seed {seed}")];
    // (Redis's decision, the twin's, due at).
    let mut held: Vec<(Decision, Decision, u64)> = Vec::new();
    // What the tally is fed once the schedule is over: (now, what).
    enum T {
        Request(usize),
        Admitted,
        Reserved(u64, usize),
    }
    let mut events: Vec<(u64, T, Option<usize>)> = Vec::new();
    let mut quota = 0;
    let mut now = 0;
    while now < END {
        at(&clock, now);
        events.push((now, T::Request(quota), None));
        for _ in 0..1 + rng.below(4) {
            match rng.below(10) {
                0..=2 => {
                    let (d, m) = (l.check(&"k").await.unwrap(), memory.check(&"k"));
                    log.push(format!("{now}: check: {} / {}", d.allowed, m.allowed));
                    assert!(
                        !twin || d.allowed == m.allowed,
                        "check differs:\n{}",
                        log.join("\n")
                    );
                    if d.allowed {
                        events.push((now, T::Admitted, Some(held.len())));
                        held.push((d, m, now));
                    }
                }
                3..=6 => {
                    let d = Limiter::reserve(&l, &"k", 1).await.unwrap();
                    let m = Limiter::reserve(&memory, &"k", 1).await.unwrap();
                    log.push(format!(
                        "{now}: reserve: {} {:?} / {} {:?}",
                        d.allowed, d.wait, m.allowed, m.wait
                    ));
                    assert!(
                        !twin || (d.allowed, d.wait) == (m.allowed, m.wait),
                        "reservation differs:\n{}",
                        log.join("\n")
                    );
                    if d.allowed {
                        let wait = d.wait.as_nanos() as u64;
                        events.push((now, T::Reserved(wait, quota), Some(held.len())));
                        held.push((d, m, now + wait));
                    }
                }
                7 | 8 if give_backs && !held.is_empty() => {
                    let n = rng.below(held.len() as u64) as usize;
                    let (d, m, due) = held.swap_remove(n);
                    let to = if rng.below(3) == 0 { 2 } else { 0 };
                    // Which event: the one whose index `n` was... found by due and kind below.
                    l.settle_and_wait(&"k", 1, d, to).await.unwrap();
                    Limiter::settle(&memory, &"k", 1, m, to);
                    log.push(format!(
                        "{now}: give-back of one due at {due}, settled to {to}"
                    ));
                    if to == 0 {
                        // Left out of the tally: the last event of this due instant.
                        if let Some(e) = events.iter_mut().rev().find(|e| {
                            e.2.is_some()
                                && match e.1 {
                                    T::Admitted => e.0 == due,
                                    T::Reserved(w, _) => e.0 + w == due,
                                    T::Request(_) => false,
                                }
                        }) {
                            e.2 = None;
                            e.1 = T::Request(usize::MAX);
                        }
                    }
                }
                9 => {
                    for _ in 0..1 + rng.below(3) {
                        let q = pool[rng.below(pool.len() as u64) as usize];
                        let (old, new) = (changes.last().unwrap().1.period(), q.period());
                        let ns = |d: Duration| d.as_nanos() as u64;
                        if old != new && (now % ns(old) != 0 || now % ns(new) != 0) {
                            continue;
                        }
                        l.set_quota(q).unwrap();
                        memory.set_quota(q);
                        changes.push((now, q));
                        quota += 1;
                        events.push((now, T::Request(quota), None));
                        log.push(format!("{now}: {q:?}"));
                    }
                }
                _ => {}
            }
        }
        now += STEP;
    }
    let mut windows = ReservationWindows::new(&changes, name);
    for (now, e, _) in &events {
        match *e {
            T::Request(usize::MAX) => {}
            T::Request(q) => windows.request(*now, q),
            T::Admitted => windows.admitted(*now),
            T::Reserved(wait, q) => windows.reserved(*now, wait, q),
        }
    }
    let what = format!("{name}:\n{}", log.join("\n"));
    windows.assert_kept(END, &what);
}

/// CHANGELOG "Fixed (2026-12-06, later)": "Reservations now keep the cycles they fall due in
/// ... in memory and in Redis"; `tests/redis/attack_two.rs`: the twin made at 1000 s "must make
/// the same decisions" (not across a change of period). Limits and `max_wait` changed at random,
/// the period never: Redis decides as memory does, and every window keeps its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "found by attack: seed 6018027440424182931 (the 7th): limit raised while reservations stand ahead, then lowered: a reservation waits 158.75 s in Redis, 120.75 s in memory (6.75 s by the docs)"]
async fn attack_fixed_quota_redis_limit_changes_as_memory() {
    schedules(
        "attack_fixed_quota_limits",
        0x9E37_79B9_7F4A_7C15,
        Changes::Limits,
        false,
        true,
    )
    .await;
}

/// The same as [`attack_fixed_quota_redis_limit_changes_as_memory`], with give-backs (to zero)
/// and settles to more: `Limiter::refund`, "No more than the decision took is ever given back,
/// whatever set_quota changed since".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "found by attack: seed 5371643315472677434 (the 2nd), limits changed around give-backs: a reservation at 3.75 s waits 8.25 s in Redis, 10.25 s in memory (sequence in the failure's message)"]
async fn attack_fixed_quota_redis_limit_changes_with_give_backs_as_memory() {
    schedules(
        "attack_fixed_quota_give_backs",
        0x2545_F491_4F6C_DD1D,
        Changes::Limits,
        true,
        true,
    )
    .await;
}

/// CHANGELOG "Fixed (2026-12-06, later)": "after a change of period the count frees nothing
/// until then" (the cycle the last reservation falls due in), in Redis: changes of period at
/// instants both periods divide, with give-backs; every window keeps its bound (no twin: the
/// two are documented to differ after refusals across a change of period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_fixed_quota_redis_period_changes_keep_every_window() {
    schedules(
        "attack_fixed_quota_periods",
        0xD6E8_FEB8_6659_FD93,
        Changes::Periods,
        true,
        false,
    )
    .await;
}

/// `FixedWindow`: "Without a reservation ahead, or without a change, none of this applies";
/// `tests/redis/attack_two.rs`: the twin "must make the same decisions". Only `max_wait`
/// changes (limit and period never), with give-backs and settles to more: Redis decides as
/// memory does, and every window keeps its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_fixed_quota_redis_max_wait_changes_as_memory() {
    schedules(
        "attack_fixed_quota_max_wait",
        0xA076_1D64_78BD_642F,
        Changes::MaxWait,
        true,
        true,
    )
    .await;
}

type Waits = Vec<(bool, Duration, bool, Duration)>;

/// A reservation of one permit of "k" through `l` and `memory`: Redis's (allowed, wait), both
/// decisions pushed on `waits`.
async fn both(
    l: &tower_bulwark::redis::RedisRateLimiter,
    memory: &KeyedRateLimiter<&'static str, FixedWindow, ManualClock>,
    waits: &mut Waits,
) -> (bool, Duration) {
    let d = Limiter::reserve(l, &"k", 1).await.unwrap();
    let m = Limiter::reserve(memory, &"k", 1).await.unwrap();
    waits.push((d.allowed, d.wait, m.allowed, m.wait));
    (d.allowed, d.wait)
}

/// The memory test `attack_fixed_quota_raised_then_lowered_back_with_reservations_ahead`
/// (tests/limiter/attack_fixed_quota.rs) in Redis: 20 per 1 s, 7 taken at 3 s; 1 per 1 s (up to
/// 1 h) from 3.75 s, reservations at 4 s and 4.25 s due at 10, 11 and 12 s; 20 per 1 s from
/// 4.5 s, refused requests until 6.25 s; 7 then 1 per 1 s from 6.25 s: a reservation there falls
/// due at 13 s (`FixedWindow`: "a lowered one at once (the count, reservations included, drains
/// by it, slower than they fall due, so a cycle holds no more than the larger of its
/// reservations and the new limit)"), in Redis as in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "found by attack: limit raised then lowered with reservations ahead: a reservation waits minutes (Redis and memory disagree too) where 6.75 s is due"]
async fn attack_fixed_quota_redis_raised_then_lowered_back_with_reservations_ahead() {
    let name = "attack_fixed_quota_raised_lowered";
    let server = or_skip!(RedisServer::start(name));
    let clock = manual_clock_at(Duration::from_nanos(BASE));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let (twenty, one) = (quota_ns(20, S, 20, 3 * S), quota_ns(1, S, 1, 3600 * S));
    let l = uncached::<FixedWindow>(&store, twenty, &clock, name);
    let memory = KeyedRateLimiter::<&str>::builder(twenty)
        .algorithm::<FixedWindow>()
        .clock(clock.clone())
        .build();
    let mut waits = Vec::new();
    at(&clock, 3 * S);
    for _ in 0..7 {
        assert!(l.check(&"k").await.unwrap().allowed && memory.check(&"k").allowed);
    }
    at(&clock, 15 * S / 4);
    l.set_quota(one).unwrap();
    memory.set_quota(one);
    at(&clock, 4 * S);
    both(&l, &memory, &mut waits).await;
    at(&clock, 17 * S / 4);
    both(&l, &memory, &mut waits).await;
    both(&l, &memory, &mut waits).await;
    at(&clock, 9 * S / 2);
    l.set_quota(twenty).unwrap();
    memory.set_quota(twenty);
    for (t, n) in [(19, 2), (20, 2), (21, 4), (22, 2), (23, 1), (25, 1)] {
        at(&clock, t * S / 4);
        for _ in 0..n {
            both(&l, &memory, &mut waits).await;
        }
    }
    for q in [quota_ns(7, S, 7, 0), one] {
        l.set_quota(q).unwrap();
        memory.set_quota(q);
    }
    let last = both(&l, &memory, &mut waits).await;
    assert!(
        waits.iter().all(|w| (w.0, w.1) == (w.2, w.3))
            && last == (true, Duration::from_millis(6750)),
        "(Redis allowed, wait, memory allowed, wait) of each reservation: {waits:?}"
    );
}
