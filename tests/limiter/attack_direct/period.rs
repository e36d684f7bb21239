//! Attacks on the window algorithms' numbering across a change of period (`Timeline`: the change
//! carries the numbering on, a key numbered before it but read past it is numbered anew, a
//! give-back goes back only while its window's number names it). Each test asserts what a user
//! relies on: across a change, the window in progress admits no more than the larger of the two
//! limits, and a give-back never leaves a limiter ahead of a twin that never made the request.

use super::*;
use crate::common::at;

fn drain_key<A: Algorithm, C: Clock>(l: &KeyedRateLimiter<u32, A, C>, key: u32) -> u64 {
    admitted_until_refused(|| l.check(&key).allowed)
}

/// One `#[test]` per algorithm for a generic scenario, so that each can be marked apart.
macro_rules! windows {
    ($($(#[$fw:meta])* $fw_name:ident, $(#[$sc:meta])* $sc_name:ident: $scenario:ident;)*) => {$(
        #[test]
        $(#[$fw])*
        fn $fw_name() {
            $scenario::<FixedWindow>();
        }
        #[test]
        $(#[$sc])*
        fn $sc_name() {
            $scenario::<SlidingCounter>();
        }
    )*};
}

// 1. A change of period at the very instant of the key's latest admissions (no stale reading, one
//    thread): the checks at that instant, before and after the change, are in one window.

fn change_at_the_instant_of_a_drain_direct<A: Algorithm>() {
    let clock = ManualClock::new();
    let l = direct::<A, _>(quota(10, 10 * S, 10, 0), clock.clone());
    change_at_the_instant_of_a_drain::<A>(&clock, || drain(&l), |q| l.set_quota(q));
}

fn change_at_the_instant_of_a_drain_keyed<A: Algorithm>() {
    let clock = ManualClock::new();
    let l = keyed::<A, _>(
        quota(10, 10 * S, 10, 0),
        clock.clone(),
        1024,
        Overflow::default(),
    );
    change_at_the_instant_of_a_drain::<A>(&clock, || drain_key(&l, 7), |q| l.set_quota(q));
}

/// 10 per 10 s, drained at 5 s, the period then 1 s at 5 s, drained again.
fn change_at_the_instant_of_a_drain<A: Algorithm>(
    clock: &ManualClock,
    drain: impl Fn() -> u64,
    set_quota: impl Fn(Quota),
) {
    at(clock, 5 * S);
    let before = drain();
    set_quota(quota(10, S, 10, 0));
    let after = drain();
    assert!(
        before + after <= 10,
        "{}: {before} admitted at 5 s, then {after} more at 5 s once the period went from 10 s \
         to 1 s (larger limit 10)",
        name::<A>()
    );
}

// 2. `set_quota` reads the clock, loses the CPU; keys are drained later in the window they
//    already were in, some keys also roll into a window first; then the change is stored and
//    the same instant is checked again.

fn stale_change_then_drain_in_the_same_window_direct<A: Algorithm>() {
    let time = ManualClock::new();
    let clock = GateClock::new(&time);
    let l = direct::<A, _>(quota(10, 10 * S, 10, 0), clock.clone());
    at(&time, 500 * MS);
    let faster = quota(10, S, 10, 0);
    let (before, ()) = while_held(
        &clock,
        || l.set_quota(faster),
        || {
            // Still window 0 of 10 s.
            at(&time, 5_500 * MS);
            drain(&l)
        },
    );
    let again = drain(&l);
    assert!(
        before + again <= 10,
        "{}: a change that read 0.5 s was stored after 10 were admitted at 5.5 s; {again} more \
         at 5.5 s (larger limit 10)",
        name::<A>()
    );
}

/// Keys of every shard of a keyed limiter (64 shards): even keys rolled into window 1 at 10.5 s,
/// every key drained at 15.5 s, while a change that read 10.5 s was held. Once it is stored, no
/// key admits more at 15.5 s.
fn stale_change_then_drain_in_the_same_window_keyed<A: Algorithm>() {
    let time = ManualClock::new();
    let clock = GateClock::new(&time);
    let l = keyed::<A, _>(
        quota(10, 10 * S, 10, 0),
        clock.clone(),
        1 << 16,
        Overflow::default(),
    );
    let keys = 0..256u32;
    at(&time, 500 * MS);
    for k in keys.clone() {
        assert!(l.check(&k).allowed);
    }
    at(&time, 10_500 * MS);
    for k in keys.clone().filter(|k| k % 2 == 0) {
        assert!(l.check(&k).allowed);
    }
    let faster = quota(10, S, 10, 0);
    let (before, ()) = while_held(
        &clock,
        || l.set_quota(faster),
        || {
            at(&time, 15_500 * MS);
            keys.clone().map(|k| drain_key(&l, k)).collect::<Vec<_>>()
        },
    );
    let over: Vec<_> = keys
        .clone()
        .map(|k| (k, before[k as usize] + drain_key(&l, k)))
        .filter(|&(k, n)| n + u64::from(k % 2 == 0) > 10)
        .collect();
    assert!(
        over.is_empty(),
        "{}: keys admitting more than 10 in the window of 15.5 s once a change that read 10.5 s \
         was stored (key, admitted at 15.5 s): {:?}",
        name::<A>(),
        &over[..over.len().min(6)]
    );
}

// 3. A direct check copies the old rule, reads the clock and loses the CPU; the change is
//    stored, the key drained under the new rule; then the held check decides by the old rule.

fn check_by_the_old_rule_after_the_change<A: Algorithm>() {
    let time = ManualClock::new();
    let clock = GateClock::new(&time);
    let l = direct::<A, _>(quota(10, S, 10, 0), clock.clone());
    at(&time, 1_500 * MS);
    let slower = quota(10, 10 * S, 10, 0);
    let (first, held) = while_held(
        &clock,
        || l.check().allowed,
        || {
            l.set_quota(slower);
            at(&time, 5 * S);
            drain(&l)
        },
    );
    let then = drain(&l);
    let total = first + u64::from(held) + then;
    assert!(
        total <= 10,
        "{}: within the window of 10 s from 1 s: {first} admitted at 5 s, the held check {held}, \
         then {then} more at 5 s: {total} (larger limit 10)",
        name::<A>()
    );
}

// 4. A reservation into the next window of 10 s, the period shortened to 1 s, the reservation
//    given back after the instant it fell due (a waiter that never ran): never more than a twin.

fn reservation_given_back_after_its_instant_under_a_shorter_period<A: Algorithm>() {
    let clock = ManualClock::new();
    let q = quota(10, 10 * S, 10, 20 * S);
    let (a, twin) = (
        direct::<A, _>(q, clock.clone()),
        direct::<A, _>(q, clock.clone()),
    );
    at(&clock, 500 * MS);
    let (mut got, mut twin_got) = (drain(&a), drain(&twin));
    let waiter = Limiter::<()>::reserve_now(&a, &(), 1).unwrap().unwrap();
    assert!(waiter.allowed && !waiter.wait.is_zero(), "{waiter:?}");
    let shorter = quota(10, S, 10, 20 * S);
    [&a, &twin].iter().for_each(|l| l.set_quota(shorter));
    at(&clock, 10_500 * MS);
    got += drain(&a);
    twin_got += drain(&twin);
    assert!(Limiter::<()>::refund(&a, &(), 1, waiter));
    got += drain(&a);
    twin_got += drain(&twin);
    assert!(
        got <= twin_got,
        "{}: {got} admitted by the limiter whose reservation (due at 10 s) was given back at \
         10.5 s, {twin_got} by a twin that never reserved",
        name::<A>()
    );
}

// 5. Random schedules of changes between periods (A→B→A, shorter and longer, other limits; the
//    limit alone), a request made before some of them and given back (refund, settle to less,
//    reservation dropped) after: the limiter never ahead of a twin that never made it.

fn random_changes_and_a_give_back<A: Algorithm>() {
    let quotas = [
        quota(10, S, 10, 3 * S),
        quota(10, 4 * S, 10, 3 * S),
        quota(6, 2 * S, 6, 3 * S),
        quota(10, 250 * MS, 10, 3 * S),
        quota(12, 3 * S, 12, 3 * S),
        // The limit alone changed against one above.
        quota(4, S, 4, 3 * S),
        quota(20, 4 * S, 20, 3 * S),
    ];
    for seed in 1..=300u64 {
        let mut rng = Rng(seed);
        let clock = ManualClock::new();
        let (a, twin) = (
            direct::<A, _>(quotas[0], clock.clone()),
            direct::<A, _>(quotas[0], clock.clone()),
        );
        let mut now = rng.below(3 * S);
        let mut log = vec![];
        let step = |now: &mut u64, log: &mut Vec<String>, rng: &mut Rng| {
            *now += rng.pick(&[0, 1, 100 * MS, 500 * MS, S - 1, S, 2 * S, 3 * S + 7]);
            at(&clock, *now);
            let q = rng.pick(&quotas);
            if rng.below(3) > 0 {
                [&a, &twin].iter().for_each(|l| l.set_quota(q));
                log.push(format!("{now}: set {}/{:?}", q.permits(), q.period()));
            }
        };
        step(&mut now, &mut log, &mut rng);
        let (mut got, mut twin_got) = (drain(&a), drain(&twin));
        let cost = 1 + rng.below(3) as u32;
        let kind = rng.below(3);
        let mut request: Option<Decision> = Some(if kind == 0 {
            a.check_n(cost).unwrap()
        } else {
            Limiter::<()>::reserve_now(&a, &(), cost).unwrap().unwrap()
        })
        .filter(|d| d.allowed);
        log.push(format!("{now}: request {cost} (kind {kind}): {request:?}"));
        let back_at = 1 + rng.below(4);
        for i in 0..8 {
            step(&mut now, &mut log, &mut rng);
            if let Some(request) = request.take_if(|_| i == back_at) {
                if kind == 2 {
                    Limiter::<()>::settle(&a, &(), cost, request, cost / 2);
                } else {
                    Limiter::<()>::refund(&a, &(), cost, request);
                }
                log.push(format!("{now}: given back"));
            }
            got += drain(&a);
            twin_got += drain(&twin);
            log.push(format!("{now}: {got} against {twin_got}"));
            assert!(
                got <= twin_got,
                "{} seed {seed}: {got} admitted, {twin_got} by a twin that never made the \
                 request; schedule:\n{}",
                name::<A>(),
                log.join("\n")
            );
        }
    }
}

// 6. A→B→A in a row at one instant, then checks at instants through the window of the change:
//    the window in progress keeps its count (no more than the larger limit over it).

fn back_and_forth_at_one_instant<A: Algorithm>() {
    let clock = ManualClock::new();
    let l = direct::<A, _>(quota(10, 10 * S, 10, 0), clock.clone());
    at(&clock, 12 * S);
    let mut total = drain(&l);
    for q in [
        quota(10, S, 10, 0),
        quota(10, 10 * S, 10, 0),
        quota(10, 30 * S, 10, 0),
    ] {
        l.set_quota(q);
    }
    at(&clock, 12 * S + 1);
    total += drain(&l);
    at(&clock, 15 * S);
    total += drain(&l);
    assert!(
        total <= 10,
        "{}: {total} admitted from 12 s to 15 s in the window that began at 10 s, through \
         changes to 1 s, 10 s and 30 s at 12 s (larger limit 10)",
        name::<A>()
    );
}

// 7. Keys on every shard while one thread changes the period back and forth and others check
//    all keys, every reading one instant (so no change can end a key's window before a reading
//    already decided): no key admits more than the larger limit at that instant.

fn shards_racing_changes_at_one_instant<A: Algorithm>() {
    let clock = ManualClock::new();
    let l = keyed::<A, _>(
        quota(8, 10 * S, 8, 0),
        clock.clone(),
        1 << 16,
        Overflow::default(),
    );
    at(&clock, 3 * S);
    let keys = 512u32;
    let admitted: Vec<std::sync::atomic::AtomicU64> =
        (0..keys).map(|_| Default::default()).collect();
    std::thread::scope(|s| {
        let changer = l.clone();
        s.spawn(move || {
            for i in 0..200 {
                let period = if i % 2 == 0 { 20 * S } else { 10 * S };
                changer.set_quota(quota(8, period, 8, 0));
            }
        });
        for t in 0..2u32 {
            let (l, admitted) = (l.clone(), &admitted);
            s.spawn(move || {
                for round in 0..12u32 {
                    for k in 0..keys {
                        let key = (k + t * 7 + round) % keys;
                        if l.check(&key).allowed {
                            admitted[key as usize]
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let over: Vec<_> = admitted
        .iter()
        .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
        .enumerate()
        .filter(|&(_, n)| n > 8)
        .collect();
    assert!(
        over.is_empty(),
        "{}: keys admitting more than 8 at one instant: {:?}",
        name::<A>(),
        &over[..over.len().min(6)]
    );
}

windows! {
    attack_period_change_at_the_instant_of_a_drain_direct_fixed_window,
    attack_period_change_at_the_instant_of_a_drain_direct_sliding_counter:
        change_at_the_instant_of_a_drain_direct;
    attack_period_change_at_the_instant_of_a_drain_keyed_fixed_window,
    attack_period_change_at_the_instant_of_a_drain_keyed_sliding_counter:
        change_at_the_instant_of_a_drain_keyed;
    attack_period_stale_change_then_drain_in_the_same_window_direct_fixed_window,
    attack_period_stale_change_then_drain_in_the_same_window_direct_sliding_counter:
        stale_change_then_drain_in_the_same_window_direct;
    attack_period_stale_change_then_drain_in_the_same_window_keyed_fixed_window,
    attack_period_stale_change_then_drain_in_the_same_window_keyed_sliding_counter:
        stale_change_then_drain_in_the_same_window_keyed;
    attack_period_check_by_the_old_rule_after_the_change_fixed_window,
    attack_period_check_by_the_old_rule_after_the_change_sliding_counter:
        check_by_the_old_rule_after_the_change;
    attack_period_reservation_given_back_after_its_instant_fixed_window,
    attack_period_reservation_given_back_after_its_instant_sliding_counter:
        reservation_given_back_after_its_instant_under_a_shorter_period;
    attack_period_random_changes_and_a_give_back_fixed_window,
    attack_period_random_changes_and_a_give_back_sliding_counter:
        random_changes_and_a_give_back;
    attack_period_back_and_forth_at_one_instant_fixed_window,
    attack_period_back_and_forth_at_one_instant_sliding_counter:
        back_and_forth_at_one_instant;
    attack_period_shards_racing_changes_at_one_instant_fixed_window,
    attack_period_shards_racing_changes_at_one_instant_sliding_counter:
        shards_racing_changes_at_one_instant;
}
