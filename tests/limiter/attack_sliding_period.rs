//! Attacks on the sliding counter's fixed windows across changes of period, in memory (keyed
//! and direct limiters): each window admits at most its limit, reservations counted where they
//! fall due; after a change of period with reservations standing ahead the key admits nothing
//! until the end of the new window the last of them falls due in; give-backs of admissions made
//! before a change give nothing back. The model is `tests/common/sliding_model.rs`.

use std::time::Duration;

use tower_bulwark::Quota;

use crate::common::block_on;
use crate::common::sliding_schedules::{
    assert_no_failures, back_and_forth, drive, failure, reserved_then_changed, schedule, shrink,
    sliding_quota, twins, Backend, Change, First, InMemory, Mix, Numbering, Op, Step, CHANGED_AT,
};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// 1. Random schedules: every seed's model keeps the guarantee, keyed and direct.
fn random_schedules(seeds: std::ops::Range<u64>, mix: Mix) {
    let mut failures = Vec::new();
    for seed in seeds {
        let (first, steps) = schedule(Numbering::Memory, seed, 100, mix);
        let quota = sliding_quota(first.0, first.1);
        for (b, what) in [
            (InMemory::keyed(quota), "keyed"),
            (InMemory::direct(quota), "direct"),
        ] {
            let (model, _) = block_on(drive(&b, Numbering::Memory, first, &steps));
            failures.extend(failure(&format!("seed {seed} ({what})"), &model, false));
        }
    }
    assert_no_failures("random schedules", &failures);
}

/// Every mix: changes of period in a row, spaced out, none, and without reservations.
#[test]
fn attack_sliding_period_random_schedules() {
    for (seeds, mix) in [
        (0..200, Mix::ALL),
        (0..300, Mix::SPACED),
        (0..200, Mix::NO_PERIODS),
        (0..200, Mix::NO_RESERVATIONS),
    ] {
        random_schedules(seeds, mix);
    }
}

/// The model of what `make`'s limiter admitted under [`reserved_then_changed`]'s steps.
fn reserved_then_changed_on<B: Backend>(
    make: impl Fn(Quota) -> B,
    first: (u64, u32, u32, u32),
    changes: &[(u64, u64, u32)],
    every: u64,
) -> crate::common::sliding_model::Model {
    let b = make(sliding_quota(first.0, first.1));
    let steps = reserved_then_changed(first, changes, every);
    block_on(drive(&b, Numbering::Memory, (first.0, first.1), &steps)).0
}

type Case<'a> = (First, &'a [Change]);

/// Runs each case of [`reserved_then_changed`] on a keyed and a direct limiter; fails with all
/// that broke the guarantee.
fn cases_keep_the_guarantee(cases: &[Case]) {
    let mut failures = Vec::new();
    for &(first, changes) in cases {
        let what = format!("{first:?} then {changes:?}");
        for (model, name) in [
            (
                reserved_then_changed_on(InMemory::keyed, first, changes, 50 * MS),
                "keyed",
            ),
            (
                reserved_then_changed_on(InMemory::direct, first, changes, 50 * MS),
                "direct",
            ),
        ] {
            failures.extend(failure(&format!("{name}: {what}"), &model, false));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} broke the guarantee:\n{}",
        failures.len(),
        2 * cases.len(),
        failures.join("\n\n")
    );
}

/// 2. One change of period, shorter or longer, at a window's start, 1 ns either side or within
///    it, with the next window reserved (or the window in progress, from its start): no window
///    holds more than its limit, and nothing is admitted while the reservations hold the key.
#[test]
fn attack_sliding_period_one_change_with_reservations_ahead() {
    let mut cases = Vec::new();
    let changes: Vec<[(u64, u64, u32); 1]> = [S, 750 * MS, 300 * MS, 3 * S, 1_100 * MS]
        .into_iter()
        .flat_map(|p| CHANGED_AT.map(|at| [(at, p, 4)]))
        .collect();
    for c in &changes {
        cases.push(((2 * S, 4, 4, 4), &c[..]));
        cases.push(((2 * S, 4, 2, 4), &c[..]));
    }
    cases_keep_the_guarantee(&cases);
}

/// 3. Two changes of period in a row, at one instant or at two, reservations standing ahead
///    of both: the second change forgets them.
#[test]
fn attack_sliding_period_two_changes_in_a_row_with_reservations_ahead() {
    cases_keep_the_guarantee(&[
        ((2 * S, 4, 4, 4), &[(2 * S, S, 4), (2 * S, 750 * MS, 4)]),
        (
            (2 * S, 5, 5, 3),
            &[(2 * S + 100 * MS, S, 3), (2 * S + 100 * MS, 1_100 * MS, 5)],
        ),
        ((2 * S, 4, 4, 4), &[(4 * S, S, 4), (5 * S - 1, 750 * MS, 4)]),
    ]);
}

#[test]
fn attack_sliding_period_back_and_forth_with_reservations_ahead() {
    let cases = back_and_forth();
    let cases: Vec<Case> = cases.iter().map(|(f, c)| (*f, &c[..])).collect();
    cases_keep_the_guarantee(&cases);
}

#[test]
#[ignore = "a tool: SEED=n RULE=count: MIX=all|spaced|no_periods|no_reservations \
            cargo test debug_seed -- --ignored --nocapture"]
fn debug_seed() {
    let seed: u64 = std::env::var("SEED").map_or(0, |s| s.parse().unwrap());
    let rule = std::env::var("RULE").unwrap_or_else(|_| "count:".into());
    let mix = match std::env::var("MIX").as_deref() {
        Ok("spaced") => Mix::SPACED,
        Ok("no_periods") => Mix::NO_PERIODS,
        Ok("no_reservations") => Mix::NO_RESERVATIONS,
        _ => Mix::ALL,
    };
    let (first, steps) = schedule(Numbering::Memory, seed, 100, mix);
    let steps = block_on(shrink(
        |_| InMemory::keyed(sliding_quota(first.0, first.1)),
        Numbering::Memory,
        first,
        steps,
        &rule,
    ));
    println!("first {first:?}");
    let b = InMemory::keyed(sliding_quota(first.0, first.1));
    let (model, said) = block_on(drive(&b, Numbering::Memory, first, &steps));
    for s in &said {
        println!("{s}");
    }
    println!("{}", model.violations(false).join("\n"));
    println!("{}", model.log.join("\n"));
}

/// 4. Twins: a request made and given back (a refund, or a settle to zero), changes of period
///    and of the limit between and after: never more admitted since than by a twin that never
///    made it.
#[test]
fn attack_sliding_period_a_give_back_never_puts_a_limiter_ahead_of_its_twin() {
    let mut failures = Vec::new();
    for seed in 0..300 {
        let (first, _) = schedule(Numbering::Memory, seed, 100, Mix::ALL);
        let q = sliding_quota(first.0, first.1);
        failures.extend(block_on(twins(
            &InMemory::keyed(q),
            &InMemory::keyed(q),
            Numbering::Memory,
            seed,
        )));
        failures.extend(block_on(twins(
            &InMemory::direct(q),
            &InMemory::direct(q),
            Numbering::Memory,
            seed,
        )));
    }
    assert_no_failures("twins", &failures);
}

/// 5. A key left alone through changes of period: seed 74's schedule up to 13.7 s (its last
///    admission; nothing reserved after 12.6 s), then only the changes of its steps 23 to 51
///    (the last, 3 per 750 ms, at 19.08 s). Read again at 19.08 s, 5.4 s later, it admits
///    nothing until 19.6 s, where a twin that read the key at 13.7 s (a request made and
///    vetoed) admits 3 (see the twins above).
#[test]
#[ignore = "found by attack (a refusal, not a grant): a key idle 5.4 s through eleven changes \
            of period admits nothing at 19.08 s under 3 per 750 ms (seed 74)"]
fn attack_sliding_period_a_key_left_alone_through_changes_admits_again() {
    let (first, steps) = schedule(Numbering::Memory, 74, 100, Mix::ALL);
    let b = InMemory::keyed(sliding_quota(first.0, first.1));
    let mut kept: Vec<Step> = steps[..23].to_vec();
    kept.extend(
        steps[23..52]
            .iter()
            .filter(|s| matches!(s.op, Op::Quota(..))),
    );
    block_on(drive(&b, Numbering::Memory, first, &kept));
    b.read(19_082_812_777);
    let admitted = crate::common::admitted_until_refused(|| block_on(b.check(1)).unwrap().allowed);
    assert_eq!(admitted, 3, "admitted at 19.08 s, 3 per 750 ms");
}

/// 6. Hostile values: periods of 1 ns to `MAX_SPAN`, limits of 1 to `u32::MAX`, waits as long
///    as the bounds allow, readings from 0 to `u64::MAX`, and changes between them: no panic;
///    with readings below 2^61 ns, no window beyond its limit. Quotas past the bounds are
///    errors naming their field.
#[test]
fn attack_sliding_period_hostile_values() {
    let span = Quota::MAX_SPAN.as_nanos() as u64;
    let periods = [1, 2, 3, 1_000, S, span / 3, span - 1, span];
    let limits = [1, 2, 7, 1 << 20, u32::MAX];
    // The longest wait the bounds allow: `permits · (max_wait / period + 2) < 2^53`.
    let hostile = |period: u64, permits: u32| {
        let most = ((1u64 << 53) - 1) / u64::from(permits);
        let wait = most.saturating_sub(2).saturating_mul(period).min(span);
        let q = Quota::with_period(permits, Duration::from_nanos(period)).unwrap();
        q.with_max_wait(Duration::from_nanos(wait))
            .or_else(|_| q.with_max_wait(Duration::from_nanos(wait / 2)))
            .unwrap()
    };
    for seed in 0..300u64 {
        let mut rng = crate::common::Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let wild = seed % 3 == 0;
        let (p, l) = (rng.pick(&periods), rng.pick(&limits));
        let mut model = crate::common::sliding_model::Model::new(Numbering::Memory, p, l.into());
        let (keyed, direct) = (
            InMemory::keyed(hostile(p, l)),
            InMemory::direct(hostile(p, l)),
        );
        let mut now = rng.below(1 << 40);
        let (mut latest, mut limit) = (0, l);
        for _ in 0..60 {
            let reading = match rng.below(6) {
                0 if wild => rng.pick(&[(1 << 62) - 1, 1 << 62, u64::MAX]),
                1 => now.saturating_sub(rng.below(2 * S)),
                _ => {
                    now += rng.pick(&[0, 1, 2, 1_000, S, span / 2, span]);
                    if !wild {
                        now = now.min(1 << 61);
                    }
                    now
                }
            };
            keyed.read(reading);
            direct.read(reading);
            let decided = reading.max(latest);
            latest = decided;
            let cost = 1 + rng.below(u64::from(limit.min(3))) as u32;
            match rng.below(4) {
                0 => {
                    let (p, l) = (rng.pick(&periods), rng.pick(&limits));
                    keyed.set_quota(hostile(p, l));
                    direct.set_quota(hostile(p, l));
                    if !wild {
                        // At the reading the change took, stale or not: the limiter numbers
                        // windows from it (a key decided past it is numbered anew).
                        model.change(reading, p, l.into());
                    }
                    limit = l;
                }
                op => {
                    let (k, d) = if op == 1 {
                        (block_on(keyed.check(cost)), block_on(direct.check(cost)))
                    } else {
                        (
                            block_on(keyed.reserve(cost)),
                            block_on(direct.reserve(cost)),
                        )
                    };
                    if let Some(k) = k.filter(|k| k.allowed && !wild) {
                        let id = model.admit(decided, k.wait.as_nanos() as u64, cost.into());
                        if op == 3 {
                            block_on(keyed.settle(cost, k, 0));
                            model.give_back(decided, id, cost.into());
                        }
                    }
                    if let Some(d) = d.filter(|d| d.allowed && op == 3) {
                        block_on(direct.settle(cost, d, cost / 2));
                    }
                }
            }
        }
        // The count only: hostile values are about the arithmetic.
        if let Some(failure) = failure(&format!("seed {seed}"), &model, true) {
            panic!("{failure}");
        }
    }
    let refused = [
        Quota::with_period(0, Duration::from_secs(1))
            .unwrap_err()
            .field(),
        Quota::with_period(1, Duration::ZERO).unwrap_err().field(),
        Quota::with_period(1, Quota::MAX_SPAN + Duration::from_nanos(1))
            .unwrap_err()
            .field(),
        Quota::with_period(u32::MAX, Duration::from_nanos(1))
            .unwrap()
            .with_max_wait(Duration::from_secs(1))
            .unwrap_err()
            .field(),
    ];
    assert_eq!(refused, ["permits", "period", "period", "max_wait"]);
}
