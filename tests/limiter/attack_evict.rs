//! Attacks on what changed with eviction (CHANGELOG, Unreleased): a key's incarnations (a
//! give-back of an admission whose key was dropped and made anew gives nothing, a settle's debt
//! still lands), the rank of keys holding as many permits (the one that began first is kept),
//! and `Metered` settles after an eviction. Through the public API only; each test quotes the
//! promise it attacks.

use std::sync::{Arc, Barrier};

use tower_bulwark::algorithm::{Algorithm, FixedWindow, Gcra, Metered, SlidingCounter, SlidingLog};
use tower_bulwark::clock::TokioClock;
use tower_bulwark::limiter::{acquire, Decision, Overflow};
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

use crate::attack_direct::{each_reporting_all, keyed, name, read_here, Dial};
use crate::common::quota_ns as quota;
use crate::common::{admitted_until_refused, joined, paused_runtime, poll_once};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// Far from zero, as a real clock's readings are.
const BASE: u64 = 1_000 * S;

type Keyed<A> = KeyedRateLimiter<u32, A, Dial>;

/// Checks of one permit for `key` at the current reading until one is refused: how many were
/// admitted (under `Metered` each holds its estimate).
fn left<A: Algorithm>(l: &Keyed<A>, key: u32) -> u64 {
    admitted_until_refused(|| l.check(&key).allowed)
}

fn admitted<A: Algorithm>(l: &Keyed<A>, key: u32, cost: u32) -> Decision {
    let d = l.check_n(&key, cost).unwrap();
    assert!(
        d.allowed,
        "{}: key {key} refused {cost}: {d:?}",
        name::<A>()
    );
    d
}

// ---------------------------------------------------------------------------------------------
// 1. Thousands of incarnations of one key, and stale give-backs into each.

/// 1 000 a second, frozen, `max_keys(1)`: key 0 takes 64 permits one by one (its first
/// incarnation's decisions). Then, 140 000 times, key 1 spends the whole burst (evicting key 0,
/// the only key of the full shard) and key 0 is made anew by one permit (evicting key 1). At
/// incarnations around 2^8, 2^16 and 2^17 (where a counter narrower than it says would wrap), a
/// decision of the first incarnation is given back under key 0 and one under key 1: each must
/// give nothing, so key 0 still has 999 permits and no more. (Whether each says it was taken
/// back is [`a_stale_give_back_says_it_was_not_taken_back`]'s.)
fn stale_give_backs_across_incarnations<A: Algorithm>() {
    let dial = Dial::at(BASE);
    let l = keyed::<A, _>(quota(1_000, S, 1_000, 0), dial, 1, Overflow::default());
    let mut stale: Vec<Decision> = (0..64).map(|_| admitted(&l, 0, 1)).collect();
    let probes = [
        1u32, 2, 255, 256, 257, 65_535, 65_536, 65_537, 131_071, 131_072, 131_073, 140_000,
    ];
    for i in 1..=140_000u32 {
        admitted(&l, 1, 1_000);
        admitted(&l, 0, 1);
        if probes.contains(&i) {
            let (a, b) = (stale.pop().unwrap(), stale.pop().unwrap());
            Limiter::refund(&l, &0, 1, a);
            Limiter::settle(&l, &1, 1, b, 0);
            // What key 0 has left must be 999: it holds the one permit of this incarnation.
            assert!(
                l.check_n(&0, 1_000).is_ok_and(|d| !d.allowed),
                "{}: incarnation {i}: key 0 admits its whole burst while it holds a permit",
                name::<A>()
            );
        }
    }
    let more = left(&l, 0);
    assert_eq!(
        more,
        999,
        "{}: key 0's last incarnation holds one permit; it admits {more} more (stale give-backs \
         reached it)",
        name::<A>()
    );
}

/// The guide (`src/guide.rs:151-155`): "An evicted key gives away what it held, and nothing
/// more: a give-back of one of its admissions that arrives after the key was made anew gives
/// nothing (each key's entry says which of the key's incarnations it is, and a decision carries
/// it ...)"; `Limiter::refund` (`src/limiter/mod.rs:113-116`): "given ... back under another
/// key, it gives nothing back".
#[test]
fn stale_give_backs_across_140_000_incarnations_of_one_key_give_nothing() {
    each_reporting_all(&five!(stale_give_backs_across_incarnations));
}

// ---------------------------------------------------------------------------------------------
// 2. Dropped as idle (by `retain_recent`, or by a full shard), made anew, then a stale give-back.

/// 10 a second. Key 0 takes 5 at `BASE`; at `BASE + 10 s` it is dropped as idle (by
/// `retain_recent` under `Overflow::RefuseNewKeys`, or by key 1 arriving in a full shard of one
/// key), then made anew by 5 at
/// `recreate` (the drop's reading, or a stale one that a thread read before the drop). The
/// first 5 are then given back, reading `refund_at`. Returns what key 0 admits at
/// `BASE + 10 s` afterwards, with (`give_back`) and without the stale give-back.
fn after_an_idle_drop<A: Algorithm>(
    by_sweep: bool,
    recreate: u64,
    refund_at: u64,
    give_back: bool,
) -> (bool, u64) {
    let dial = Dial::at(BASE);
    // The sweep's drop under `RefuseNewKeys`, the full shard's under the default.
    let (max_keys, overflow) = if by_sweep {
        (64, Overflow::RefuseNewKeys)
    } else {
        (1, Overflow::default())
    };
    let l = keyed::<A, _>(quota(10, S, 10, 0), dial.clone(), max_keys, overflow);
    let old = admitted(&l, 0, 5);
    dial.set(BASE + 10 * S);
    if by_sweep {
        l.retain_recent();
    } else {
        admitted(&l, 1, 1);
    }
    assert!(
        l.len() <= 1 && (!by_sweep || l.is_empty()),
        "{}: the idle key is dropped",
        name::<A>()
    );
    // Key 1, if any, is live: key 0 evicts it.
    dial.set(recreate);
    admitted(&l, 0, 5);
    dial.set(refund_at);
    let taken = give_back && Limiter::refund(&l, &0, 5, old);
    dial.set(BASE + 10 * S);
    (taken, left(&l, 0))
}

fn an_idle_drop_then_a_stale_give_back_gives_nothing<A: Algorithm>() {
    for by_sweep in [true, false] {
        for recreate in [BASE + 10 * S, BASE + 5 * S, BASE + S / 2] {
            for refund_at in [BASE, BASE + S / 2, BASE + 10 * S, BASE + 20 * S] {
                let (taken, got) = after_an_idle_drop::<A>(by_sweep, recreate, refund_at, true);
                let (_, twin) = after_an_idle_drop::<A>(by_sweep, recreate, refund_at, false);
                let _ = taken;
                assert_eq!(
                    got,
                    twin,
                    "{} (dropped by {}, made anew at {} ms, given back at {} ms): after the \
                     stale give-back key 0 admits {got}, a twin that gave nothing back {twin}",
                    name::<A>(),
                    if by_sweep {
                        "retain_recent"
                    } else {
                        "a full shard"
                    },
                    (recreate - BASE) / MS,
                    (refund_at - BASE) / MS
                );
            }
        }
    }
}

/// The guide (`src/guide.rs:151-155`): "a give-back of one of its admissions that arrives after
/// the key was made anew gives nothing". (Not `Metered`: a key holding permits is never
/// dropped as idle.)
#[test]
fn a_give_back_after_an_idle_drop_and_recreation_gives_nothing() {
    each_reporting_all(&four!(an_idle_drop_then_a_stale_give_back_gives_nothing));
}

// ---------------------------------------------------------------------------------------------
// 3. A key made anew by a settle's debt, then a stale give-back.

/// 10 a second, frozen, `max_keys(1)`. Key 0 takes `a` and `b` (one permit each); key 1 spends
/// 10 (evicting key 0); `a` settles to 5 (its debt of 4 makes key 0 anew); then `b` is given
/// back (or not, `give_back`). Returns whether `b` was taken back and what key 0 admits then.
fn after_a_debt_made_the_key_anew<A: Algorithm>(give_back: bool) -> (bool, bool, u64) {
    let dial = Dial::at(BASE);
    let l = keyed::<A, _>(quota(10, S, 10, 0), dial, 1, Overflow::default());
    let (a, b) = (admitted(&l, 0, 1), admitted(&l, 0, 1));
    admitted(&l, 1, 10);
    let settled = Limiter::settle(&l, &0, 1, a, 5);
    let taken = give_back && Limiter::refund(&l, &0, 1, b);
    (settled, taken, left(&l, 0))
}

fn a_debt_lands_and_a_stale_give_back_gives_nothing<A: Algorithm>() {
    let (settled, taken, got) = after_a_debt_made_the_key_anew::<A>(true);
    // Whether `taken` says so is `a_stale_give_back_says_it_was_not_taken_back`'s.
    let (_, _, twin) = after_a_debt_made_the_key_anew::<A>(false);
    assert!(
        settled && got == twin && got == 6,
        "{}: the settle to 5 of an evicted key's admission of 1 returned {settled}; the stale \
         give-back after it said taken back: {taken}; key 0 then admits {got} (a twin that gave \
         nothing back: {twin}; the debt of 4 on a fresh key of 10 leaves 6)",
        name::<A>()
    );
}

/// The guide (`src/guide.rs:151-155`): "a give-back of one of its admissions that arrives after
/// the key was made anew gives nothing ..., while a settle's debt still lands on it";
/// `Limiter::settle` (`src/limiter/mod.rs:160-163`): "a settle to more charges its debt to the
/// key made afresh, as the dropped key would have had it".
#[test]
fn a_key_made_anew_by_a_settles_debt_takes_no_stale_give_back() {
    each_reporting_all(&five!(a_debt_lands_and_a_stale_give_back_gives_nothing));
}

// ---------------------------------------------------------------------------------------------
// 4. `Metered`: a settle after eviction takes nothing from the new key's holds.

/// 10 a second, frozen, `max_keys(1)`: key 0's old admission of 5 (held); key 1 spends 10
/// (evicting key 0); key 0 anew holds 5 (one admission of 5); the old admission settles to
/// `cost`. Key 0 must then have `5 - (cost - 5 if above)` left: the new hold stays whole, and
/// only the cost beyond the old estimate is charged.
#[test]
fn a_metered_settle_after_eviction_leaves_the_new_holds_whole() {
    for cost in [0u32, 1, 4, 5, 6, 8, 10, 1_000] {
        let dial = Dial::at(BASE);
        let l = keyed::<Metered, _>(quota(10, S, 10, 0), dial, 1, Overflow::default());
        let old = admitted(&l, 0, 5);
        admitted(&l, 1, 10);
        let _new = admitted(&l, 0, 5);
        Limiter::settle(&l, &0, 5, old, cost);
        let debt = u64::from(cost.saturating_sub(5)).min(10);
        let expected = 5u64.saturating_sub(debt);
        let got = left(&l, 0);
        assert_eq!(
            got, expected,
            "Metered: an evicted admission of 5 settled to {cost} after key 0 was made anew \
             holding 5: key 0 admits {got}, where its hold of 5 and a debt of {debt} leave \
             {expected} (src/guide.rs:151-155; `Metered` src/algorithm/metered.rs:186-190: \
             \"takes nothing out of what the key's new admissions hold ... and charges only \
             what it cost beyond its estimate\")"
        );
    }
}

/// Four threads race on `Metered`, 1 000 a second frozen, `max_keys(1)`: one settles to zero,
/// one by one, 400 admissions of key 0's first incarnation, while two make key 0 anew (one
/// permit held, no settle) and evict it (key 1 + i spending the burst), and a fourth settles
/// stale admissions to twice their estimate (debt of one each, which may land on any
/// incarnation). At the end, with the threads joined, key 0's last incarnation holds its one
/// permit plus at most the debts: never fewer held than that, so it admits at most 999.
#[test]
fn metered_stale_settles_racing_recreation_never_free_a_new_hold() {
    for round in 0..4 {
        let dial = Dial::at(BASE);
        let l = keyed::<Metered, _>(quota(1_000, S, 1_000, 0), dial, 1, Overflow::default());
        let mut debts: Vec<Decision> = (0..400).map(|_| admitted(&l, 0, 1)).collect();
        let zeros = debts.split_off(200);
        // Key 0's first incarnation (400 held) is evicted: every one of those is stale now.
        admitted(&l, 1_000_000, 1_000);
        let start = Arc::new(Barrier::new(4));
        let mut threads = Vec::new();
        for (settles, cost) in [(zeros, 0u32), (debts, 2)] {
            let (l, start) = (l.clone(), start.clone());
            threads.push(std::thread::spawn(move || {
                start.wait();
                settles
                    .into_iter()
                    .map(|d| u64::from(Limiter::settle(&l, &0, 1, d, cost) && cost == 0))
                    .sum::<u64>()
            }));
        }
        for t in 0..2u32 {
            let (l, start) = (l.clone(), start.clone());
            threads.push(std::thread::spawn(move || {
                start.wait();
                for i in 0..3_000u32 {
                    let _ = l.check_n(&(1 + t + 2 * i), 1_000);
                    let _ = l.check(&0);
                }
                0
            }));
        }
        let taken: u64 = joined(threads).into_iter().sum();
        // The last incarnation: made anew by one admission held now.
        let _ = l.check_n(&7_777_777, 1_000);
        admitted(&l, 0, 1);
        let got = left(&l, 0);
        assert!(
            got <= 999,
            "Metered round {round}: key 0's last incarnation, holding one permit, admits {got} \
             (at most 999; {taken} stale settles to zero said they were taken back)"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Give-backs racing evictions, on dial clocks of their own per thread.

/// 100 a second, `max_keys(1)`. Key 0's first incarnation takes 100 permits one by one (each
/// thread's reading of its own, some before it, some after); key 1 evicts it. Then four threads
/// race: two give those 100 back (each must be refused), reading stale and future instants of
/// their own, and two make key 0 anew (one permit) and evict it again with fresh keys spending
/// the burst, at readings of their own. Joined, key 0 is made anew once more at `BASE`: it
/// must admit 99 more.
fn stale_give_backs_racing_recreation<A: Algorithm>() {
    for round in 0..3u32 {
        let dial = Dial::at(BASE);
        let l = keyed::<A, _>(quota(100, S, 100, 0), dial, 1, Overflow::default());
        let mut stale: Vec<Decision> = (0..100).map(|_| admitted(&l, 0, 1)).collect();
        admitted(&l, 1, 100);
        let other = stale.split_off(50);
        let start = Arc::new(Barrier::new(4));
        let mut threads = Vec::new();
        for (t, decisions) in [stale, other].into_iter().enumerate() {
            let (l, start) = (l.clone(), start.clone());
            threads.push(std::thread::spawn(move || {
                read_here(Some(BASE + [0, S / 2][t]));
                start.wait();
                decisions
                    .into_iter()
                    .map(|d| u64::from(Limiter::refund(&l, &0, 1, d)))
                    .sum::<u64>()
            }));
        }
        for t in 0..2u32 {
            let (l, start) = (l.clone(), start.clone());
            threads.push(std::thread::spawn(move || {
                read_here(Some(BASE + [MS, 0][t as usize]));
                start.wait();
                for i in 0..2_000u32 {
                    let _ = l.check_n(&(10 + t + 2 * i), 100);
                    let _ = l.check(&0);
                }
                0
            }));
        }
        let taken: u64 = joined(threads).into_iter().sum();
        read_here(None);
        let _ = l.check_n(&9_999_999, 100);
        admitted(&l, 0, 1);
        let got = left(&l, 0);
        assert!(
            got == 99,
            "{} round {round}: key 0 made anew with one permit admits {got} more (99; {taken} \
             stale give-backs said they were taken back)",
            name::<A>()
        );
    }
}

/// The guide (`src/guide.rs:151-155`), as above, with give-backs racing the evictions and recreations of their key, on readings that
/// reach the limiter out of order (`src/guide.rs:176-180`: "readings that reach a limiter out
/// of order never make it admit more than its quota").
#[test]
fn stale_give_backs_racing_evictions_and_recreation_give_nothing() {
    each_reporting_all(&five!(stale_give_backs_racing_recreation));
}

// ---------------------------------------------------------------------------------------------
// 6. A limited client and a flood of fresh keys spending whole quotas, at every instant.

/// 10 a minute (GCRA: one every 6 s), `max_keys(16)`. The client spends its 10 at `BASE`; at
/// `BASE + at` it asks once more; if refused (it is being limited), 1 600 fresh keys (100 times
/// `max_keys`) each spend the whole quota at once (`check_n(10)`), with readings `flood_at`
/// (their threads read the clock then). Then, at `BASE + at`, the client must still be
/// refused. Returns the instants where it was admitted after the flood.
fn freed_by_a_flood<A: Algorithm>(at: u64, flood_at: u64) -> Option<String> {
    let dial = Dial::at(BASE);
    let l = keyed::<A, _>(
        Quota::per_minute(10).unwrap(),
        dial.clone(),
        16,
        Overflow::default(),
    );
    let client = u32::MAX;
    assert_eq!(left(&l, client), 10, "{}", name::<A>());
    dial.set(BASE + at);
    if l.check(&client).allowed {
        return None;
    }
    dial.set(flood_at);
    for key in 0..1_600u32 {
        let _ = l.check_n(&key, 10);
    }
    dial.set(BASE + at);
    let after = left(&l, client);
    (after > 0).then(|| {
        format!(
            "limited at +{} ms, {after} admitted after a flood read at {:+} us",
            at / MS,
            (flood_at as i128 - BASE as i128) / 1_000
        )
    })
}

fn a_limited_client_is_kept_at_every_instant<A: Algorithm>() {
    let mut instants: Vec<u64> = vec![1, MS, S, 3 * S, 19 * S, 20 * S - 1, 30 * S, 59 * S];
    for k in 1..10u64 {
        instants.extend([k * 6 * S - 1, k * 6 * S, k * 6 * S + 1, k * 6 * S - MS]);
    }
    let freed: Vec<String> = instants
        .iter()
        .filter_map(|&at| freed_by_a_flood::<A>(at, BASE + at))
        .collect();
    assert!(
        freed.is_empty(),
        "{}: a limited client got a fresh quota from a later flood: {freed:?}",
        name::<A>()
    );
}

/// The guide (`src/guide.rs:145-149`): "Either way a flood of fresh keys never hands a client
/// that is being limited a fresh quota, not even a flood whose keys each spend a whole quota
/// after it: among keys holding as many permits, the one that began to hold them first is
/// kept"; `Overflow::EvictNearestIdle` (`src/store/memory.rs`, its doc): "A key that has used
/// its whole quota always ranks above a fresh key with one request, and above a later key that
/// spent as much". The client asks at instants near each permit's return and each window's
/// end, whenever it is still refused.
#[test]
fn a_limited_client_is_never_freed_by_a_later_flood_at_any_instant() {
    each_reporting_all(&five!(a_limited_client_is_kept_at_every_instant));
}

fn a_limited_client_is_kept_by_a_flood_at_its_own_reading<A: Algorithm>() {
    // Eight limiters (each hashes its keys its own way), the flood after the client at the very
    // reading of its spending.
    let freed: Vec<String> = (0..8)
        .filter_map(|_| freed_by_a_flood::<A>(0, BASE))
        .collect();
    assert!(
        freed.is_empty(),
        "{}: a limited client got a fresh quota from a flood that came after it at the same \
         reading, in {} of 8 limiters: {freed:?}",
        name::<A>(),
        freed.len()
    );
}

/// The guide (`src/guide.rs:145-149`): "a flood of fresh keys never hands a client that is
/// being limited a fresh quota, not even a flood whose keys each spend a whole quota after it:
/// among keys holding as many permits, the one that began to hold them first is kept". The
/// client spends its 10 at `BASE` and is refused; then the flood, at the same reading (a frozen
/// or coarse clock, or two requests in one tick), each key spending 10.
///
/// (Found by this attack: ties at one reading went by hash order, and the client was evicted in
/// 5 to 8 of 8 limiters under every algorithm. Among keys of equal rank the store now keeps the
/// key it made first.)
#[test]
fn a_limited_client_is_never_freed_by_a_flood_at_the_reading_of_its_spending() {
    each_reporting_all(&five!(
        a_limited_client_is_kept_by_a_flood_at_its_own_reading
    ));
}

fn a_limited_client_is_kept_by_a_stale_flood<A: Algorithm>() {
    // Floods read a second, and a microsecond, before the client spent.
    let freed: Vec<String> = [S, 3 * S, 5 * S]
        .iter()
        .flat_map(|&at| [(at, BASE - S), (at, BASE - 1_000)])
        .filter_map(|(at, flood_at)| freed_by_a_flood::<A>(at, flood_at))
        .collect();
    assert!(
        freed.is_empty(),
        "{}: a limited client got a fresh quota from a flood whose readings predate its \
         spending: {freed:?}",
        name::<A>()
    );
}

/// The same promise (`src/guide.rs:145-149`) with the flood's readings a second, or a
/// microsecond, older than the client's spending (threads that read the clock before and reached the limiter after), and
/// `src/guide.rs:176-180`: "readings that reach a limiter out of order never make it admit more
/// than its quota" (`src/guide.rs:186-189`: a reading older than the latest its key has seen is
/// decided as of that latest reading; the shard's reading is the floor under a fresh key's).
///
/// (Found by this attack: the fixed window, the sliding counter and `Metered` ranked the
/// flood's keys by their older readings and evicted the client. They now leave the tie to the
/// store, which keeps the key it made first.)
#[test]
fn a_limited_client_is_never_freed_by_a_flood_of_stale_readings() {
    each_reporting_all(&five!(a_limited_client_is_kept_by_a_stale_flood));
}

// ---------------------------------------------------------------------------------------------
// 7. What a stale give-back says.

/// 10 a second, `max_keys(1)`: key 0 takes `a`, `b`, `c` and `d` (one permit each) at `BASE`.
/// Then: dropped by eviction (key 1 spends 10) and made anew (one permit), `a` is given back;
/// made anew by a settle's debt (`b` settled to 5 after key 1 evicted key 0 again), `c` is given
/// back; dropped as idle by `retain_recent` at `BASE + 10 s` and made anew, `d` is given back.
/// Each says whether it was taken back: none may say so.
fn stale_give_backs_say_so<A: Algorithm>() {
    let dial = Dial::at(BASE);
    let l = keyed::<A, _>(quota(10, S, 10, 0), dial.clone(), 1, Overflow::default());
    let [a, b, c, d] = [(); 4].map(|_| admitted(&l, 0, 1));
    admitted(&l, 1, 10);
    admitted(&l, 0, 1);
    let evicted = Limiter::refund(&l, &0, 1, a);
    admitted(&l, 1, 10);
    Limiter::settle(&l, &0, 1, b, 5);
    let after_debt = Limiter::refund(&l, &0, 1, c);
    let idle = if name::<A>() == "Metered" {
        false // a key holding permits is never dropped as idle
    } else {
        dial.set(BASE + 100 * S);
        l.retain_recent();
        assert!(l.is_empty(), "{}", name::<A>());
        admitted(&l, 0, 1);
        Limiter::refund(&l, &0, 1, d)
    };
    assert!(
        !evicted && !after_debt && !idle,
        "{}: a give-back of an admission whose key was dropped since said it was taken back: \
         after an eviction {evicted}, after a settle's debt made the key anew {after_debt}, \
         after `retain_recent` dropped it idle {idle}",
        name::<A>()
    );
}

/// `Limiter::refund` (`src/limiter/mod.rs:128-132`): "Returns whether the decision was taken
/// back ... `false` ... for an admission whose key a keyed limiter has dropped since (the key
/// forgot it). [`Observed`](crate::observe::Observed) counts only what was taken back";
/// `Limiter::settle` (`src/limiter/mod.rs:158-163`): `false` "for a settle to less of an
/// admission whose key a keyed limiter has dropped since".
///
/// (Found by this attack: it returned `true` after an eviction, a debt and an idle drop. A
/// give-back to a key made anew now says it was not taken back.)
#[test]
fn a_stale_give_back_says_it_was_not_taken_back() {
    each_reporting_all(&five!(stale_give_backs_say_so));
}

// ---------------------------------------------------------------------------------------------
// 8. A waiter dropped after its key was evicted and made anew.

/// 10 a second, waiting up to 10 s, `max_keys(1)`, on tokio's paused clock. Key 0 spends its
/// 10, and an `acquire` of one more is polled once (it reserves); key 1 evicts key 0; key 0 is
/// made anew and spends its fresh 10 at the same instant. The waiter is then dropped: its
/// reservation belonged to the evicted key, and giving it back must give the new key nothing,
/// so key 0 is refused at once afterwards.
async fn a_dropped_waiter_of_an_evicted_key<A: Algorithm>() {
    let q = Quota::per_second(10)
        .unwrap()
        .with_max_wait(std::time::Duration::from_secs(10))
        .unwrap();
    let l = keyed::<A, _>(q, TokioClock::new(), 1, Overflow::default());
    let spend =
        |l: &KeyedRateLimiter<u32, A, TokioClock>| admitted_until_refused(|| l.check(&0).allowed);
    assert_eq!(spend(&l), 10, "{}", name::<A>());
    let mut waiter = Box::pin(acquire(&l, &0, 1));
    assert!(poll_once(waiter.as_mut()).is_pending(), "{}", name::<A>());
    assert!(l.check_n(&1, 10).unwrap().allowed);
    assert_eq!(spend(&l), 10, "{}: key 0 made anew", name::<A>());
    drop(waiter);
    let after = l.check(&0);
    assert!(
        !after.allowed,
        "{}: the dropped waiter of the evicted key gave its reservation to key 0 made anew, \
         which spent its 10 at this instant: admitted again ({after:?})",
        name::<A>()
    );
}

fn a_dropped_waiter_gives_a_key_made_anew_nothing<A: Algorithm>() {
    paused_runtime().block_on(a_dropped_waiter_of_an_evicted_key::<A>());
}

/// The guide (`src/guide.rs:151-155`): "a give-back of one of its admissions that arrives after
/// the key was made anew gives nothing"; `acquire`'s future (`src/limiter/mod.rs`, its doc):
/// "gives back if dropped while waiting" (the reservation, to the key that made it).
#[test]
fn a_waiter_dropped_after_its_key_was_evicted_and_made_anew_gives_nothing() {
    each_reporting_all(&five!(a_dropped_waiter_gives_a_key_made_anew_nothing));
}

/// What the stale give-back's answer does to `Observed`: `LimiterSnapshot::allowed` counts
/// "decisions that admitted the request and were not given back", and `Observed` "counts only
/// what was taken back" (`Limiter::refund`, `src/limiter/mod.rs:128-132`; the guide,
/// `src/guide.rs:207`: "`Observed` counts only what its limiter took back"). Key 0 is admitted,
/// evicted by key 1, made anew and admitted again; the first admission, given back now, gives
/// nothing back, so three admissions stand and the count must stay three.
///
/// (Found by this attack: `allowed` fell from 3 to 2. It follows from the give-back's answer,
/// fixed above.)
#[test]
fn observed_keeps_counting_an_admission_given_back_after_its_key_was_evicted() {
    use tower_bulwark::observe::Observed;
    let l = Observed::new(
        "api",
        keyed::<Gcra, _>(quota(10, S, 10, 0), Dial::at(BASE), 1, Overflow::default()),
    );
    let stale = Limiter::reserve_now(&l, &0, 1).unwrap().unwrap();
    assert!(stale.allowed);
    assert!(Limiter::reserve_now(&l, &1, 10).unwrap().unwrap().allowed);
    assert!(Limiter::reserve_now(&l, &0, 1).unwrap().unwrap().allowed);
    assert_eq!(l.snapshot().allowed, 3);
    let said = Limiter::refund(&l, &0, 1, stale);
    let allowed = l.snapshot().allowed;
    assert_eq!(
        allowed, 3,
        "the stale give-back (which said taken back: {said}) was uncounted"
    );
}

/// 10 a second, `Overflow::RefuseNewKeys` with room to spare: key 0 takes `a` and `b` (one
/// permit each) at `BASE`; at `BASE + 10 s` `retain_recent` drops it idle; `a` settles to 5
/// (its debt of 4 makes key 0 anew) and `b` is given back. Key 0 must admit 6: the debt landed,
/// the stale give-back gave nothing.
fn a_debt_after_a_sweep_lands_under_refuse_new_keys<A: Algorithm>() {
    let dial = Dial::at(BASE);
    let l = keyed::<A, _>(
        quota(10, S, 10, 0),
        dial.clone(),
        64,
        Overflow::RefuseNewKeys,
    );
    let (a, b) = (admitted(&l, 0, 1), admitted(&l, 0, 1));
    dial.set(BASE + 10 * S);
    l.retain_recent();
    assert!(l.is_empty(), "{}: idle since BASE + 0.2 s", name::<A>());
    Limiter::settle(&l, &0, 1, a, 5);
    Limiter::refund(&l, &0, 1, b);
    let got = left(&l, 0);
    assert_eq!(
        got,
        6,
        "{}: after a debt of 4 and a stale give-back of 1 on key 0 made anew, it admits {got} \
         (6)",
        name::<A>()
    );
}

/// The guide (`src/guide.rs:164-168`): "A settle's debt that comes for a key dropped since
/// (idle) is charged to the key made afresh, where the dropped state would have had it; only
/// where the key's shard is full of live keys under `Overflow::RefuseNewKeys` is there no room
/// to make it"; and (`src/guide.rs:151-155`) a give-back after the key was made anew gives
/// nothing. (Not `Metered`: a key holding permits is never dropped as idle.)
#[test]
fn under_refuse_new_keys_with_room_a_debt_lands_and_a_stale_give_back_gives_nothing() {
    each_reporting_all(&four!(a_debt_after_a_sweep_lands_under_refuse_new_keys));
}
