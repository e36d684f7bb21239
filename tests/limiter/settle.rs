//! Costs settled after the fact (an LLM API's tokens): a request reserves an estimate and is
//! settled to what it cost. Exact under concurrency, debt that delays the key and is never lost,
//! and a model of each key's tokens.

use crate::common::for_every_algorithm;
use crate::common::next_estimate_and_cost;
use crate::common::{assert_settled_plus_left_is_the_quota, waits_up_to};
use crate::common::{direct_on, keyed_on};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use proptest::prelude::*;
use tower_bulwark::algorithm::{Algorithm, FixedWindow, Gcra, Metered, SlidingCounter, SlidingLog};
use tower_bulwark::{clock::ManualClock, DirectRateLimiter, KeyedRateLimiter, Limiter, Quota};

/// Eight threads race on one key of 1 000 tokens a minute with the clock standing still: each
/// reserves an estimate of up to 50 tokens and settles to a cost of up to twice that, so that
/// give-backs land behind other requests' debt. Whatever the interleaving, the tokens the key
/// admits in all are exactly its quota: what the settled requests cost, plus what the key still
/// admits afterwards, is 1 000, no more, no less (or nothing is left, once they cost more).
fn racing_settles_add_up_to_the_quota<A: Algorithm>() {
    let clock = ManualClock::new();
    let quota = Quota::per_minute(1000).unwrap();
    let limiter = KeyedRateLimiter::<&str>::builder(quota)
        .algorithm::<A>()
        .clock(clock)
        .build();
    let spent = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (limiter, spent, barrier) = (limiter.clone(), spent.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut seed = t * 7919 + 1;
                barrier.wait();
                for _ in 0..400 {
                    let (estimate, cost) = next_estimate_and_cost(&mut seed);
                    let decision = limiter.check_n(&"tenant", estimate).unwrap();
                    if decision.allowed {
                        assert!(limiter.settle(&"tenant", estimate, decision, cost));
                        spent.fetch_add(u64::from(cost), Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    crate::common::joined(threads);
    let left = crate::common::admitted_until_refused(|| limiter.check(&"tenant").allowed);
    assert_settled_plus_left_is_the_quota::<A>(1000, spent.load(Ordering::Relaxed), left);
}

/// A give-back behind another request's debt is not lost. 1 000 tokens a minute, the clock
/// standing still: A takes 100, B takes 100, B settles to 950 (debt beyond the quota), A settles
/// to 10. 960 used: 40 are left and no 41st, under every algorithm, whether or not the quota
/// lets requests wait (no request waited: what lies past the quota is debt).
fn a_give_back_behind_debt_is_exact<A: Algorithm>(quota: Quota) {
    let limiter = KeyedRateLimiter::<&str>::builder(quota)
        .algorithm::<A>()
        .clock(ManualClock::new())
        .build();
    a_give_back_behind_debt_is_exact_on(&limiter, std::any::type_name::<A>());
}

/// [`a_give_back_behind_debt_is_exact`] on `limiter`'s key "k", whole at the clock's reading.
fn a_give_back_behind_debt_is_exact_on<A: Algorithm>(
    limiter: &KeyedRateLimiter<&'static str, A, ManualClock>,
    name: &str,
) {
    let a = limiter.check_n(&"k", 100).unwrap();
    let b = limiter.check_n(&"k", 100).unwrap();
    assert!(a.allowed && a.wait.is_zero() && b.wait.is_zero(), "{name}");
    assert!(limiter.settle(&"k", 100, b, 950), "{name}");
    assert!(limiter.settle(&"k", 100, a, 10), "{name}");
    let forty = limiter.check_n(&"k", 40).unwrap();
    assert!(forty.allowed && forty.wait.is_zero(), "{name}: 40 left");
    assert_eq!(forty.remaining, 0, "{name}");
    let next = limiter.check(&"k");
    assert!(!next.allowed || !next.wait.is_zero(), "{name}: no 41st");
}

/// 1 000 a minute that lets a request wait up to `wait`.
fn waiting(wait: Duration) -> Quota {
    waits_up_to(Quota::per_minute(1000).unwrap(), wait)
}

#[test]
fn a_give_back_behind_debt_is_exact_under_every_algorithm() {
    for quota in [
        Quota::per_minute(1000).unwrap(),
        waiting(Duration::from_secs(90)),
    ] {
        for_every_algorithm!(a_give_back_behind_debt_is_exact(quota));
    }
}

/// Behind a waiter's slot, a give-back is kept: handing its permits out again would let the next
/// caller fall due beside the waiter, past the quota. A takes 100, B takes the other 900, W waits
/// for one, B settles to 950, A settles to 10: still nothing left now, and the key is whole
/// again exactly when the 1 051 permits charged (A's give-back kept) say, under GCRA and the
/// fixed window (the sliding algorithms give it back: they know where each admission lies).
/// Once the key admits within its quota again, a give-back behind debt is exact again.
fn a_give_back_behind_a_waiter_is_kept<A: Algorithm>(whole_after: Duration) {
    let clock = ManualClock::new();
    let limiter = KeyedRateLimiter::<&str>::builder(waiting(Duration::from_secs(90)))
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    let name = std::any::type_name::<A>();
    let a = limiter.check_n(&"k", 100).unwrap();
    let b = limiter.check_n(&"k", 900).unwrap();
    assert!(a.allowed && a.wait.is_zero() && b.wait.is_zero(), "{name}");
    let waiter = limiter.reserve_now(&"k", 1).unwrap().unwrap();
    assert!(
        waiter.allowed && !waiter.wait.is_zero(),
        "{name}: the waiter reserves"
    );
    assert!(limiter.settle(&"k", 900, b, 950), "{name}");
    assert!(limiter.settle(&"k", 100, a, 10), "{name}");
    let refused = limiter.check_n(&"k", 1000).unwrap();
    assert!(!refused.allowed, "{name}");
    assert_eq!(
        refused.retry_after, whole_after,
        "{name}: A's give-back kept"
    );
    // Whole again: the flag of a waiter's slot is gone with it, and give-backs behind debt are
    // exact again.
    clock.advance(whole_after);
    a_give_back_behind_debt_is_exact_on(&limiter, name);
}

#[test]
fn a_give_back_behind_a_waiter_is_kept_under_gcra_and_the_fixed_window() {
    // GCRA, 60 ms a permit: 1 051 charged, the bucket whole again after all of them (63.06 s;
    // 57.66 s had A's 90 come back).
    a_give_back_behind_a_waiter_is_kept::<Gcra>(Duration::from_millis(63_060));
    // Fixed window: 1 051 counted in the first minute, 51 carried into the second, which must
    // begin before 1 000 more fit: the 60 s to the next cycle, then the one after.
    a_give_back_behind_a_waiter_is_kept::<FixedWindow>(Duration::from_secs(120));
}

#[test]
fn racing_settles_add_up_to_the_quota_under_every_algorithm() {
    for_every_algorithm!(racing_settles_add_up_to_the_quota);
}

/// A request that cost more than its estimate leaves debt: the key waits for it, and the refusal
/// says for how long, to the nanosecond.
#[test]
fn a_cost_beyond_what_is_left_is_debt_the_key_waits_for() {
    let clock = ManualClock::new();
    // 600 tokens a minute: one every 100 ms.
    let limiter = keyed_on::<u8, _>(Quota::per_minute(600).unwrap(), &clock);
    let d = limiter.check_n(&1, 500).unwrap();
    assert!(
        limiter.settle(&1, 500, d, 500),
        "the limiter's own decision"
    );
    let d = limiter.check_n(&1, 50).unwrap();
    assert!(limiter.settle(&1, 50, d, 150));
    // 650 of 600 used: 50 tokens of debt, 5 s, and then the one token asked for.
    let refused = limiter.check(&1);
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Duration::from_millis(5100));
    clock.advance(Duration::from_millis(5099));
    assert!(!limiter.check(&1).allowed);
    clock.advance(Duration::from_millis(1));
    assert!(limiter.check(&1).allowed);
}

/// A cost above the most one request may take is charged as that most, never wrapping, and
/// never under a key it was not decided for, nor twice.
#[test]
fn absurd_and_misdirected_settles_change_what_they_should_and_no_more() {
    let clock = ManualClock::new();
    let limiter = keyed_on::<u8, _>(Quota::per_minute(600).unwrap(), &clock);
    let other = keyed_on::<u8, _>(Quota::per_minute(600).unwrap(), &clock);
    let d = limiter.check_n(&1, 10).unwrap();
    // Another limiter's decision, another key: nothing changes.
    assert!(!other.settle(&1, 10, limiter.check_n(&2, 1).unwrap(), u32::MAX));
    assert!(!limiter.settle(&3, 10, limiter.check_n(&2, 1).unwrap(), u32::MAX));
    assert_eq!(other.check(&1).remaining, 599);
    assert!(limiter.settle(&1, 10, d, u32::MAX));
    // Charged as 600, the capacity: the key is empty, and owes nothing more.
    let refused = limiter.check(&1);
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Duration::from_millis(100));
    // An estimate larger than what the decision took gives back only what it took.
    let d = limiter.check_n(&2, 5).unwrap();
    let before = limiter.check(&2).remaining;
    assert!(limiter.settle(&2, 500, d, 0));
    assert_eq!(limiter.check(&2).remaining, before + 5 - 1);
}

/// The same for a direct limiter: one budget, settled.
#[test]
fn a_direct_limiter_settles_its_one_budget() {
    let clock = ManualClock::new();
    let limiter = DirectRateLimiter::builder(Quota::per_minute(100).unwrap())
        .algorithm::<FixedWindow>()
        .clock(clock.clone())
        .build();
    let d = limiter.check_n(60).unwrap();
    assert!(Limiter::<()>::settle(&limiter, &(), 60, d, 20));
    assert_eq!(limiter.check_n(80).unwrap().remaining, 0);
    let d = limiter.check_n(1);
    assert!(!d.unwrap().allowed);
}

/// What one step of a model sequence does.
#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    /// Reserve this estimate.
    Reserve(u32),
    /// Settle the held request at this index (mod the count held) to this many eighths of its
    /// estimate.
    Settle(usize, u32),
}

fn steps(eighths: std::ops::RangeInclusive<u32>) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            (0..40_000u64).prop_map(Step::Advance),
            (0..3u64).prop_map(Step::Advance),
            (1..=4u32).prop_map(Step::Reserve),
            (0..8usize, eighths).prop_map(|(i, e)| Step::Settle(i, e)),
        ],
        1..120,
    )
}

/// Runs `steps` on a direct limiter of `A` and returns every admitted request as (instant,
/// final cost): what it settled to, or its estimate if it never settled.
fn run<A: Algorithm>(q: Quota, steps: Vec<Step>) -> Vec<(u64, u64)> {
    let clock = ManualClock::new();
    let limiter = DirectRateLimiter::builder(q)
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    let mut now = 0u64;
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let mut held: Vec<(usize, u32, tower_bulwark::limiter::Decision)> = Vec::new();
    for step in steps {
        match step {
            Step::Advance(d) => {
                now += d;
                clock.advance(Duration::from_nanos(d));
            }
            Step::Reserve(estimate) => {
                if let Ok(d) = limiter.check_n(estimate) {
                    if d.allowed {
                        admitted.push((now, u64::from(estimate)));
                        held.push((admitted.len() - 1, estimate, d));
                    }
                }
            }
            Step::Settle(i, eighths) if !held.is_empty() => {
                let (index, estimate, d) = held.swap_remove(i % held.len());
                let cost = estimate * eighths / 8;
                assert!(Limiter::<()>::settle(&limiter, &(), estimate, d, cost));
                admitted[index].1 = u64::from(cost);
            }
            Step::Settle(..) => {}
        }
    }
    admitted
}

/// The most tokens admitted requests cost in any span of `span` nanoseconds that starts at an
/// admission.
fn most_in_any_span(admitted: &[(u64, u64)], span: u64) -> u64 {
    admitted
        .iter()
        .map(|&(a, _)| {
            admitted
                .iter()
                .filter(|&&(t, _)| t >= a && t < a + span)
                .map(|&(_, n)| n)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Settles to at most the estimate, in any order, at any time: counting every admitted
    /// request at what it finally cost, no window of any algorithm ever holds more than the
    /// quota allows (GCRA and `Metered`: burst + S/T over any span S; the fixed window and the
    /// sliding counter: the limit per cycle; the sliding log: the limit in every sliding
    /// window). (Under `Metered` a request never settled holds its estimate for good.)
    #[test]
    fn settled_tokens_never_exceed_the_quota_in_any_window(
        permits in 1u32..8, burst in 1u32..10, which in 0usize..5, steps in steps(0..=8),
    ) {
        let period = 60_000u64;
        let q = Quota::with_period(permits, Duration::from_nanos(period)).unwrap().with_burst(burst).unwrap();
        let limit = u64::from(permits);
        match which {
            0 | 4 => {
                let admitted = if which == 0 { run::<Gcra>(q, steps) } else { run::<Metered>(q, steps) };
                let t = q.emission_interval().as_nanos() as u64;
                for &(a, _) in &admitted {
                    for &(b, _) in admitted.iter().filter(|&&(b, _)| b >= a) {
                        let sum: u64 = admitted.iter().filter(|&&(x, _)| x >= a && x <= b).map(|&(_, n)| n).sum();
                        prop_assert!(sum * t <= (b - a) + u64::from(burst) * t, "{} tokens in [{}, {}]", sum, a, b);
                    }
                }
            }
            1 | 3 => {
                let admitted = if which == 1 { run::<FixedWindow>(q, steps) } else { run::<SlidingCounter>(q, steps) };
                for &(a, _) in &admitted {
                    let cycle = a / period;
                    let sum: u64 = admitted.iter().filter(|&&(x, _)| x / period == cycle).map(|&(_, n)| n).sum();
                    prop_assert!(sum <= limit, "{} tokens in cycle {}", sum, cycle);
                }
            }
            _ => {
                let admitted = run::<SlidingLog>(q, steps);
                prop_assert!(most_in_any_span(&admitted, period) <= limit);
            }
        }
    }

    /// GCRA against a leaky bucket of tokens, with settles to the estimate or more: a request
    /// is admitted exactly when the bucket has room for its estimate, and a settle pours the
    /// difference in at its own instant, past the brim if it must (debt). Every decision and
    /// every refusal's `retry_after` match the model: the debt is never lost, nor counted twice.
    #[test]
    fn gcra_debt_is_a_leaky_bucket_of_tokens(
        permits in 1u32..8, burst in 4u32..10, steps in steps(8..=24),
    ) {
        let q = Quota::with_period(permits, Duration::from_nanos(60_000)).unwrap().with_burst(burst).unwrap();
        let t = q.emission_interval().as_nanos() as u64;
        let clock = ManualClock::new();
        let limiter = direct_on(q, &clock);
        let (mut level, mut last, mut now) = (0u64, 0u64, 0u64);
        let mut held = Vec::new();
        for step in steps {
            level = level.saturating_sub(now - last);
            last = now;
            match step {
                Step::Advance(d) => { now += d; clock.advance(Duration::from_nanos(d)); }
                Step::Reserve(estimate) => {
                    let d = limiter.check_n(estimate).unwrap();
                    let need = u64::from(estimate) * t;
                    let fits = level + need <= u64::from(burst) * t;
                    prop_assert_eq!(d.allowed, fits, "level {} need {}", level, need);
                    if fits {
                        level += need;
                        held.push((estimate, d));
                    } else {
                        prop_assert_eq!(d.retry_after, Duration::from_nanos(level + need - u64::from(burst) * t));
                    }
                }
                Step::Settle(i, eighths) if !held.is_empty() => {
                    let (estimate, d) = held.swap_remove(i % held.len());
                    let cost = (estimate * eighths / 8).min(burst);
                    prop_assert!(Limiter::<()>::settle(&limiter, &(), estimate, d, cost));
                    level += u64::from(cost - estimate) * t;
                }
                Step::Settle(..) => {}
            }
        }
    }
}

/// A settle that races a `set_quota` never over-grants: a GCRA admission of 10 tokens made at
/// 100 a minute (600 ms each), given back after the quota became 10 a minute (6 s each), gives
/// back 600 ms a token, what it took, not 6 s. The tokens a key can then take are never more
/// than what its use leaves under either quota. Across every algorithm, a settle after a change
/// admits no more than the key's use allows.
#[test]
fn a_settle_after_set_quota_never_gives_back_more_than_it_took() {
    let clock = ManualClock::new();
    let limiter = keyed_on::<u8, _>(Quota::per_minute(100).unwrap(), &clock);
    for _ in 0..9 {
        assert!(limiter.check_n(&1, 10).unwrap().allowed);
    }
    let last = limiter.check_n(&1, 10).unwrap();
    assert!(last.allowed);
    // 100 of 100 used: the TAT is a minute ahead. At 10 a minute, that is 10 tokens' worth.
    limiter.set_quota(Quota::per_minute(10).unwrap().with_burst(100).unwrap());
    // Settled to none: ten tokens at the old 600 ms each go back (6 s), not ten at 6 s (60 s).
    assert!(limiter.settle(&1, 10, last, 0));
    // 60 s less the 6 s given back: 54 s owed, nine tokens at 6 s, so 91 of the burst of 100
    // are left. Had the ten come back at 6 s each, all 100 would be.
    assert_eq!(drain_n(&limiter, &1), 91);

    for which in 0..4 {
        let clock = ManualClock::new();
        let q = Quota::per_minute(100).unwrap();
        let (check, settle, set): Closures = match which {
            0 => boxed(
                KeyedRateLimiter::<u8>::builder(q)
                    .algorithm::<Gcra>()
                    .clock(clock.clone())
                    .build(),
            ),
            1 => boxed(
                KeyedRateLimiter::<u8>::builder(q)
                    .algorithm::<FixedWindow>()
                    .clock(clock.clone())
                    .build(),
            ),
            2 => boxed(
                KeyedRateLimiter::<u8>::builder(q)
                    .algorithm::<SlidingLog>()
                    .clock(clock.clone())
                    .build(),
            ),
            _ => boxed(
                KeyedRateLimiter::<u8>::builder(q)
                    .algorithm::<SlidingCounter>()
                    .clock(clock.clone())
                    .build(),
            ),
        };
        let d = check(40);
        assert!(d.allowed);
        // The quota shrinks to 50 a minute; the request is settled to 30 after the change.
        set(Quota::per_minute(50).unwrap());
        assert!(settle(40, d, 30));
        // The window algorithms carry counts over: 30 used of 50 leaves 20. GCRA carries
        // time: 30 tokens at 600 ms are 18 s, 15 tokens at 1.2 s, which leaves 35. Not one
        // more: the 10 given back are given at 600 ms each, what they took.
        let exact = if which == 0 { 35 } else { 20 };
        let mut more = 0;
        while check(1).allowed {
            more += 1;
            assert!(
                more <= exact,
                "algorithm {which}: more than the {exact} the use leaves"
            );
        }
        assert_eq!(more, exact, "algorithm {which}");
    }
}

/// A limiter's check, settle and set_quota on key 1.
type Closures = (
    Box<dyn Fn(u32) -> tower_bulwark::limiter::Decision>,
    Box<dyn Fn(u32, tower_bulwark::limiter::Decision, u32) -> bool>,
    Box<dyn Fn(Quota)>,
);

/// A keyed limiter of `A` as three closures on key 1.
fn boxed<A: Algorithm>(limiter: KeyedRateLimiter<u8, A, ManualClock>) -> Closures {
    let (a, b, c) = (limiter.clone(), limiter.clone(), limiter);
    (
        Box::new(move |n| a.check_n(&1, n).unwrap()),
        Box::new(move |estimate, d, cost| b.settle(&1, estimate, d, cost)),
        Box::new(move |q| c.set_quota(q)),
    )
}

/// How many single tokens `key` still gets now.
fn drain_n<A: Algorithm>(limiter: &KeyedRateLimiter<u8, A, ManualClock>, key: &u8) -> u32 {
    let mut n = 0;
    while limiter.check(key).allowed {
        n += 1;
    }
    n
}
