//! Property tests: each algorithm against a simple reference model, over random sequences of
//! checks and clock moves.

use crate::common::direct_on;
use crate::common::in_bursts_of;
use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tower_bulwark::{
    algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    limiter::Decision,
    DirectRateLimiter, Quota,
};

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    /// Exactly one period, so that boundaries are hit exactly, not only by chance.
    AdvancePeriod,
    Check(u32),
}

fn ops(period: u64, max_cost: u32) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            (0..=period * 3 / 2).prop_map(Op::Advance),
            (0..3u64).prop_map(Op::Advance),
            Just(Op::AdvancePeriod),
            (1..=max_cost).prop_map(Op::Check),
        ],
        1..80,
    )
}

fn quota(permits: u32, period: u64, burst: u32) -> Quota {
    in_bursts_of(
        Quota::with_period(permits, Duration::from_nanos(period)).unwrap(),
        burst,
    )
}

/// A limiter of algorithm `A` for `quota` on `clock`.
fn direct_with<A: Algorithm>(
    quota: Quota,
    clock: &ManualClock,
) -> DirectRateLimiter<A, ManualClock> {
    DirectRateLimiter::builder(quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .build()
}

/// Plays `ops` on `clock` (`AdvancePeriod` moves it by exactly `period`), calling
/// `check(now, cost)` for each check, `now` being the nanoseconds the ops have moved the clock
/// so far; stops at the first failure `check` answers.
fn replay(
    ops: Vec<Op>,
    period: u64,
    clock: &ManualClock,
    mut check: impl FnMut(u64, u32) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let mut now = 0u64;
    for op in ops {
        let d = match op {
            Op::Advance(d) => d,
            Op::AdvancePeriod => period,
            Op::Check(cost) => {
                check(now, cost)?;
                continue;
            }
        };
        now += d;
        clock.advance(Duration::from_nanos(d));
    }
    Ok(())
}

/// Plays `ops` against a limiter of algorithm `A` admitting `permits` per `period` ns in bursts
/// of 1, calling `decided(now, cost, decision)` for each check (see [`replay`]) of a cost the
/// limiter can ever admit; a larger cost must be an error.
fn replay_window<A: Algorithm>(
    permits: u32,
    period: u64,
    ops: Vec<Op>,
    mut decided: impl FnMut(u64, u32, Decision) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let limiter = direct_with::<A>(quota(permits, period, 1), &clock);
    replay(ops, period, &clock, |now, cost| {
        let Ok(d) = limiter.check_n(cost) else {
            prop_assert!(cost > permits);
            return Ok(());
        };
        decided(now, cost, d)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// GCRA against a leaky bucket (the continuous-state formulation of the same contract), and
    /// its span guarantee: over any span S, admitted·T ≤ S + burst·T.
    #[test]
    fn gcra_matches_a_leaky_bucket(
        permits in 1u32..6, period in 1_000u64..20_000, burst in 1u32..8,
        ops in ops(20_000, 3),
    ) {
        let q = quota(permits, period, burst);
        let t = q.emission_interval().as_nanos() as u64;
        let clock = ManualClock::new();
        let limiter = direct_on(q, &clock);
        let (mut level, mut last) = (0u64, 0u64);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        replay(ops, period, &clock, |now, cost| {
            level = level.saturating_sub(now - last);
            last = now;
            let need = u64::from(cost) * t;
            let got = limiter.check_n(cost);
            if cost > burst {
                prop_assert!(got.is_err());
                return Ok(());
            }
            let d = got.unwrap();
            let fits = level + need <= u64::from(burst) * t;
            prop_assert_eq!(d.allowed, fits, "level {} need {}", level, need);
            if fits {
                level += need;
                prop_assert_eq!(d.remaining, (u64::from(burst) * t - level) / t);
                admitted.push((now, u64::from(cost)));
            } else {
                let retry = level + need - u64::from(burst) * t;
                prop_assert_eq!(d.retry_after, Duration::from_nanos(retry));
            }
            Ok(())
        })?;
        for i in 0..admitted.len() {
            let mut sum = 0;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let span = admitted[j].0 - admitted[i].0;
                prop_assert!(sum * t <= span + u64::from(burst) * t);
            }
        }
    }

    /// Fixed window against a map from cycle to count; no cycle admits more than the limit.
    #[test]
    fn fixed_window_matches_counts_per_cycle(
        permits in 1u32..6, period in 1_000u64..20_000, ops in ops(20_000, 3),
    ) {
        let limit = u64::from(permits);
        let mut used: HashMap<u64, u64> = HashMap::new();
        replay_window::<FixedWindow>(permits, period, ops, |now, cost, d| {
            let cycle = now / period;
            let count = used.entry(cycle).or_default();
            let fits = *count + u64::from(cost) <= limit;
            prop_assert_eq!(d.allowed, fits);
            if fits {
                *count += u64::from(cost);
                prop_assert_eq!(d.remaining, limit - *count);
            } else {
                prop_assert_eq!(d.retry_after, Duration::from_nanos((cycle + 1) * period - now));
            }
            prop_assert!(*count <= limit);
            Ok(())
        })?;
    }

    /// Sliding log against a plain list of admissions: exact, and never more than the limit in
    /// any window; a refusal's retry_after is the exact instant of admission.
    #[test]
    fn sliding_log_matches_a_list_of_admissions(
        permits in 1u32..6, period in 1_000u64..20_000, ops in ops(20_000, 3),
    ) {
        let limit = u64::from(permits);
        let mut log: Vec<(u64, u64)> = Vec::new();
        let in_window = |log: &[(u64, u64)], at: u64| -> u64 {
            log.iter().filter(|&&(t, _)| t + period > at).map(|&(_, n)| n).sum()
        };
        replay_window::<SlidingLog>(permits, period, ops, |now, cost, d| {
            let cost = u64::from(cost);
            let fits = in_window(&log, now) + cost <= limit;
            prop_assert_eq!(d.allowed, fits);
            if fits {
                log.push((now, cost));
                prop_assert_eq!(d.remaining, limit - in_window(&log, now));
            } else {
                let at = now + d.retry_after.as_nanos() as u64;
                prop_assert!(in_window(&log, at) + cost <= limit, "admitted at retry time");
                prop_assert!(in_window(&log, at - 1) + cost > limit, "not a nanosecond sooner");
            }
            Ok(())
        })?;
        for &(a, _) in &log {
            prop_assert!(log.iter().filter(|&&(t, _)| t <= a && t + period > a).map(|&(_, n)| n).sum::<u64>() <= limit);
        }
    }

    /// Sliding counter against per-window counts and the weighted estimate (the previous
    /// window's share rounded down); no fixed window admits more than the limit and no sliding
    /// window holds more than twice the limit.
    #[test]
    fn sliding_counter_matches_the_weighted_estimate(
        permits in 1u32..6, period in 1_000u64..20_000, ops in ops(20_000, 3),
    ) {
        let limit = u64::from(permits);
        let mut counts: HashMap<u64, u64> = HashMap::new();
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        replay_window::<SlidingCounter>(permits, period, ops, |now, cost, d| {
            let cost = u64::from(cost);
            let w = now / period;
            let e = now % period;
            let prev = if w == 0 { 0 } else { counts.get(&(w - 1)).copied().unwrap_or(0) };
            let curr = counts.get(&w).copied().unwrap_or(0);
            // The previous window's share is rounded down.
            let share = prev * (period - e) / period;
            let fits = share + curr + cost <= limit;
            prop_assert_eq!(d.allowed, fits, "prev {} curr {} e {}", prev, curr, e);
            if fits {
                *counts.entry(w).or_default() += cost;
                admitted.push((now, cost));
            } else {
                prop_assert!(d.retry_after > Duration::ZERO);
            }
            Ok(())
        })?;
        prop_assert!(counts.values().all(|&c| c <= limit));
        for &(a, _) in &admitted {
            let in_window: u64 = admitted.iter().filter(|&&(t, _)| t <= a && t + period > a).map(|&(_, n)| n).sum();
            prop_assert!(in_window <= 2 * limit);
        }
    }

    /// Any algorithm: a refused request retried exactly after its retry_after is admitted.
    #[test]
    fn retry_after_is_honest_for_every_algorithm(
        permits in 1u32..6, period in 1_000u64..20_000, burst in 1u32..8,
        which in 0usize..4, ops in ops(20_000, 1),
    ) {
        let q = quota(permits, period, burst);
        let clock = ManualClock::new();
        let check: Box<dyn Fn() -> Decision> = match which {
            0 => { let l = direct_with::<Gcra>(q, &clock); Box::new(move || l.check()) }
            1 => { let l = direct_with::<FixedWindow>(q, &clock); Box::new(move || l.check()) }
            2 => { let l = direct_with::<SlidingLog>(q, &clock); Box::new(move || l.check()) }
            _ => { let l = direct_with::<SlidingCounter>(q, &clock); Box::new(move || l.check()) }
        };
        replay(ops, period, &clock, |_, _| {
            let d = check();
            if !d.allowed {
                prop_assert!(d.retry_after > Duration::ZERO);
                clock.advance(d.retry_after);
                prop_assert!(check().allowed, "admitted after {:?}", d.retry_after);
            }
            Ok(())
        })?;
    }
}
