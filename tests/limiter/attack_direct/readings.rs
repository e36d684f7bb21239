//! Attacks on a keyed GCRA limiter's handling of clock readings, through the public API only:
//! stale and out-of-order readings, `retain_recent` at readings older or newer than the keys',
//! shards that fill and drop idle keys, give-backs and settles at stale readings, threads racing
//! on one key or two while another sweeps. Each test names the promise it attacks.

use super::*;
use crate::common::joined;
use tower_bulwark::limiter::Overflow;

type Keyed = KeyedRateLimiter<u32, Gcra, Dial>;

/// What a client sees of a decision.
fn seen(d: &Decision) -> (bool, Duration, u64, Duration) {
    (d.allowed, d.wait, d.remaining, d.retry_after)
}

/// Far from zero, as a real clock's readings are.
const BASE: u64 = 1_000_000_000;
/// The emission interval of the quotas below.
const T: u64 = 1_000;

// ---------------------------------------------------------------------------------------------
// Promise 3: dropping idle keys (`retain_recent`, at any reading) changes no decision.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    /// A request for `key` of `cost` at reading `BASE + at * T / 2`, made with `reserve_now`.
    Ask { key: u32, at: u64, cost: u32 },
    /// `retain_recent` at reading `at` (only the limiter under attack).
    Retain { at: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3u32, 0..40u64, 1..3u32).prop_map(|(key, at, cost)| Op::Ask { key, at, cost }),
        2 => (0..40u64).prop_map(|at| Op::Retain { at }),
    ]
}

fn reading(at: u64) -> u64 {
    BASE + at * T / 2
}

/// (Give-backs are left out here: a give-back's reading counts as one its key has seen, and
/// one that finds its key dropped records none, so the twin would need the store's internals
/// to be told apart; the tests below attack give-backs across a drop directly.)
///
/// Runs `ops` on a limiter that `retain_recent`s where they say and on a twin that never drops
/// a key. The sweep publishes its reading to every shard (the floor under its keys' readings,
/// so that a reading older than a drop is decided as of it), so the twin gets each reading
/// raised to the latest sweep's: then every decision must be the
/// same, and so must what each key has left at the end.
fn retain_changes_nothing(q: Quota, ops: &[Op]) -> Result<(), TestCaseError> {
    let (da, db) = (Dial::default(), Dial::default());
    let a = keyed::<Gcra, _>(q, da.clone(), 1 << 20, Overflow::RefuseNewKeys);
    let b = keyed::<Gcra, _>(q, db.clone(), 1 << 20, Overflow::RefuseNewKeys);
    let mut last = 0;
    let mut swept = 0;
    for (i, o) in ops.iter().enumerate() {
        match *o {
            Op::Ask { key, at, cost } => {
                da.set(reading(at));
                db.set(reading(at).max(swept));
                last = last.max(reading(at));
                let x = Limiter::reserve_now(&a, &key, cost).unwrap().unwrap();
                let y = Limiter::reserve_now(&b, &key, cost).unwrap().unwrap();
                prop_assert_eq!(
                    seen(&x),
                    seen(&y),
                    "op {}: key {} cost {} at {}: dropping limiter vs twin",
                    i,
                    key,
                    cost,
                    reading(at)
                );
            }
            Op::Retain { at } => {
                da.set(reading(at));
                a.retain_recent();
                swept = swept.max(reading(at));
                last = last.max(swept);
            }
        }
    }
    da.set(last);
    db.set(last);
    for key in 0..3u32 {
        let (mut ga, mut gb) = (0, 0);
        while a.check(&key).allowed {
            ga += 1;
        }
        while b.check(&key).allowed {
            gb += 1;
        }
        prop_assert_eq!(ga, gb, "key {}: left at the end {} vs twin {}", key, ga, gb);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Immediate admissions only (no wait): burst 3.
    #[test]
    fn attack_reading_retain_recent_at_any_reading_changes_no_decision(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        retain_changes_nothing(quota(1, T, 3, 0), &ops)?;
    }

    /// Reservations of up to two intervals ahead: burst 2.
    #[test]
    fn attack_reading_retain_recent_with_reservations_changes_no_decision(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        retain_changes_nothing(quota(1, T, 2, 2 * T), &ops)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Promises 3, 4 and 5: a settle that charges more than the estimate, after the key's state went
// idle and was dropped.
// ---------------------------------------------------------------------------------------------

/// Admits one permit of key 0 at `BASE` (burst 3, no wait), lets `drop_idle` run at `BASE + T`
/// (when the key's TAT has just passed: idle), settles the admission to 3 permits at `BASE + T`,
/// then counts what key 0 still admits at `BASE + T`. Returns (settle's answer, admitted after).
fn charge_after_an_idle_drop(
    drop_idle: impl Fn(&Keyed, &Dial),
    before_counting: impl Fn(&Keyed),
) -> (bool, u64) {
    let dial = Dial::default();
    let limiter = keyed::<Gcra, _>(quota(1, T, 3, 0), dial.clone(), 1, Overflow::RefuseNewKeys);
    dial.set(BASE);
    let d = limiter.check(&0);
    assert!(d.allowed);
    dial.set(BASE + T);
    drop_idle(&limiter, &dial);
    let answer = Limiter::settle(&limiter, &0, 1, d, 3);
    before_counting(&limiter);
    let mut after = 0;
    while limiter.check(&0).allowed {
        after += 1;
    }
    (answer, after)
}

/// The same schedule on a twin that never drops the key: what key 0 admits after the settle.
fn charge_on_a_twin() -> u64 {
    let dial = Dial::default();
    let twin = keyed::<Gcra, _>(
        quota(1, T, 3, 0),
        dial.clone(),
        1 << 20,
        Overflow::RefuseNewKeys,
    );
    dial.set(BASE);
    let d = twin.check(&0);
    dial.set(BASE + T);
    assert!(Limiter::settle(&twin, &0, 1, d, 3));
    let mut after = 0;
    while twin.check(&0).allowed {
        after += 1;
    }
    after
}

/// `retain_recent` at `BASE + T` drops key 0 (idle: its TAT is `BASE + T`); the settle to 3
/// permits that follows must still charge the 2 beyond the estimate. A twin that never
/// dropped the key admits 1 more at `BASE + T`; a replay of the request at its final cost
/// (3 at `BASE`) admits 1 as well; and promise 5 allows `burst + S/T = 3 + 1 = 4` permits
/// over `[BASE, BASE + T]`, of which the settled request took 3.
#[test]
fn attack_reading_a_settle_charge_after_retain_recent_dropped_the_key_is_not_lost() {
    let twin = charge_on_a_twin();
    assert_eq!(
        twin, 1,
        "the twin: 3 - (3 settled - 1 replenished) + ... admits 1"
    );
    let (answer, after) = charge_after_an_idle_drop(|l, _| l.retain_recent(), |_| {});
    assert!(
        3 + after <= 3 + 1,
        "over [BASE, BASE + T] (burst 3, T = {T} ns) key 0 took 3 settled + {after} more = {} \
         permits, above burst + S/T = 4; a twin that never dropped the key admits {twin} after \
         the settle (settle answered {answer})",
        3 + after
    );
    assert_eq!(
        after, twin,
        "dropping an idle key changed what it admits: {after} vs the twin's {twin}"
    );
}

/// The same, the key dropped by the store itself: `max_keys(1)` and a new key (1) arriving at
/// `BASE + T` (refused new keys, so no live key is ever evicted: key 0 goes only as idle).
/// Key 1's admission is then refunded (its own latest: it is idle again and frees its slot), so
/// that key 0 can come back to count what it admits.
#[test]
#[ignore = "known limit (guide, Memory and eviction): the settle to 3 comes while key 1 fills the one slot under RefuseNewKeys, so key 0 cannot be made to hold its debt; once key 1 frees the slot key 0 admits 3 at BASE + T, the twin 1"]
fn attack_reading_a_settle_charge_after_the_store_dropped_the_idle_key_is_not_lost() {
    let twin = charge_on_a_twin();
    let taken = std::cell::RefCell::new(None);
    let (answer, after) = charge_after_an_idle_drop(
        |l, _| {
            let d = l.check(&1);
            assert!(d.allowed, "key 1 takes key 0's idle slot");
            *taken.borrow_mut() = Some(d);
        },
        |l| {
            let d = taken.borrow_mut().take().unwrap();
            assert!(Limiter::refund(l, &1, 1, d), "key 1's refund");
        },
    );
    assert_eq!(
        after,
        twin,
        "after an idle drop made room for key 1, key 0's settle to 3 (answered {answer}) left \
         it admitting {after} at BASE + T; the twin {twin}; bound burst + S/T = 4 permits over \
         [BASE, BASE + T], taken: {}",
        3 + after
    );
}

// ---------------------------------------------------------------------------------------------
// Promises 1, 2 and 3 under threads: readings handed out of order, two keys, a sweeper.
// ---------------------------------------------------------------------------------------------

/// Eight threads race on keys 0 and 1 (four each, eight requests apiece) with readings handed
/// out of order within 4 µs of `BASE`, while a ninth calls `retain_recent` at readings in the
/// same span (never past a key's TAT: a permit lasts a second). Burst 8: each key admits exactly
/// 8, what one thread deciding everything at the latest reading would, for every small
/// `max_keys`.
#[test]
fn attack_reading_racing_threads_with_out_of_order_readings_and_a_sweeper_get_the_burst() {
    const L: u32 = 8;
    for max_keys in [2usize, 16, 1 << 20] {
        for round in 0..20u64 {
            let dial = Dial::default();
            dial.set(BASE);
            let limiter = keyed::<Gcra, _>(
                quota(1, 1_000_000_000, L, 0),
                dial.clone(),
                max_keys,
                Overflow::default(),
            );
            let start = Arc::new(Barrier::new(9));
            let mut threads = Vec::new();
            for t in 0..8u64 {
                let (limiter, start) = (limiter.clone(), Arc::clone(&start));
                threads.push(std::thread::spawn(move || {
                    let key = (t % 2) as u32;
                    start.wait();
                    let mut admitted = 0;
                    for i in 0..8u64 {
                        // Later threads read earlier: readings reach the key out of order.
                        read_here(Some(BASE + ((7 - t) * 500 + i * 37 + round * 13) % 4_000));
                        if limiter.check(&key).allowed {
                            admitted += 1;
                        }
                    }
                    (key, admitted)
                }));
            }
            let sweeper = {
                let (limiter, start) = (limiter.clone(), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..50u64 {
                        read_here(Some(BASE + (i * 997) % 4_000));
                        limiter.retain_recent();
                    }
                })
            };
            let got = joined(threads);
            sweeper.join().unwrap();
            for key in 0..2u32 {
                let n: u32 = got.iter().filter(|g| g.0 == key).map(|g| g.1).sum();
                assert_eq!(
                    n, L,
                    "max_keys {max_keys}, round {round}: key {key} admitted {n}, burst {L}"
                );
            }
        }
    }
}
