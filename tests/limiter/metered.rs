//! `Metered`: GCRA whose settles are exact. Requests in flight hold their estimates; a settle
//! charges the true cost as of the admission, so the key ends where a key charged the true
//! costs up front would be, however many requests were in flight and however long they took.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use proptest::prelude::*;
use tower_bulwark::algorithm::{Gcra, Metered};
use tower_bulwark::{clock::ManualClock, DirectRateLimiter, KeyedRateLimiter, Limiter, Quota};

use crate::common::assert_settled_plus_left_is_the_quota;

fn metered(quota: Quota, clock: &ManualClock) -> DirectRateLimiter<Metered, ManualClock> {
    DirectRateLimiter::builder(quota)
        .algorithm::<Metered>()
        .clock(clock.clone())
        .build()
}

/// What is left on `limiter`, counted by taking it one permit at a time (and never settling).
fn drain<A: tower_bulwark::algorithm::Algorithm>(
    limiter: &DirectRateLimiter<A, ManualClock>,
) -> u32 {
    let mut left = 0;
    while limiter.check().allowed {
        left += 1;
    }
    left
}

/// The gateway: 10 000 tokens a minute, four streams of `max_tokens` 1 000 at once, each
/// using 500 and settling a second later, one after the other. The key then holds what a key
/// charged 500 per stream up front holds a second later, to the permit; under GCRA the streams
/// admitted before the last one lose what the second drained of their estimates.
#[test]
fn four_concurrent_streams_settle_to_what_they_used() {
    let quota = Quota::per_minute(10_000).unwrap();
    let clock = ManualClock::new();
    let limiter = metered(quota, &clock);
    let streams: Vec<_> = (0..4).map(|_| limiter.check_n(1000).unwrap()).collect();
    assert!(streams.iter().all(|d| d.allowed));
    assert!(!limiter.check_n(6001).unwrap().allowed, "4 000 held");
    clock.advance(Duration::from_secs(1));
    for stream in streams {
        assert!(Limiter::<()>::settle(&limiter, &(), 1000, stream, 500));
    }
    let next = limiter.check_n(1).unwrap();

    let exact_clock = ManualClock::new();
    let exact = DirectRateLimiter::builder(quota)
        .clock(exact_clock.clone())
        .build();
    for _ in 0..4 {
        assert!(exact.check_n(500).unwrap().allowed);
    }
    exact_clock.advance(Duration::from_secs(1));
    let expected = exact.check_n(1).unwrap();
    assert_eq!(next.remaining, expected.remaining);
    assert!(next.remaining >= 10_000 - 2001, "{}", next.remaining);
    assert_eq!(drain(&limiter), drain(&exact));
}

/// Held estimates never drain: a stream in flight for ten minutes still holds its 1 000 of a
/// key's 1 000 a minute, and a refusal meanwhile says how long until the request would fit were
/// the stream to settle at once to its estimate.
#[test]
fn a_request_in_flight_holds_its_estimate_however_long_it_takes() {
    let clock = ManualClock::new();
    let limiter = metered(Quota::per_minute(1000).unwrap(), &clock);
    let stream = limiter.check_n(1000).unwrap();
    clock.advance(Duration::from_secs(600));
    let refused = limiter.check_n(100).unwrap();
    assert!(!refused.allowed);
    assert_eq!(
        refused.retry_after,
        Duration::from_secs(6),
        "100 tokens' weight"
    );
    assert_eq!(refused.remaining, 0);
    // Settled to 300 as of its admission, ten minutes ago: long drained.
    assert!(Limiter::<()>::settle(&limiter, &(), 1000, stream, 300));
    assert_eq!(drain(&limiter), 1000);
}

/// A give-back is a settle to nothing; a cost above the estimate is debt charged from the
/// settle, never lost, and a settle or give-back of another limiter's decision changes nothing.
#[test]
fn give_backs_debts_and_stray_settles() {
    let clock = ManualClock::new();
    let limiter = metered(Quota::per_minute(1000).unwrap(), &clock);
    let vetoed = limiter.check_n(400).unwrap();
    assert!(Limiter::<()>::refund(&limiter, &(), 400, vetoed));
    let over = limiter.check_n(100).unwrap();
    clock.advance(Duration::from_secs(30));
    // 100 as of the admission (drained by now: 500 came back in 30 s), 150 of debt from now.
    assert!(Limiter::<()>::settle(&limiter, &(), 100, over, 250));
    assert_eq!(drain(&limiter), 850);

    let other = metered(Quota::per_minute(1000).unwrap(), &clock);
    let stray = other.check_n(500).unwrap();
    assert!(!Limiter::<()>::settle(&limiter, &(), 500, stray, 0));
    assert_eq!(
        drain(&other),
        500,
        "the stray decision's estimate is still held"
    );
}

/// Eight threads race for one key of 1 000 tokens with the clock standing still, each holding
/// estimates and settling them to up to twice as much: what the settled requests cost plus
/// what is left is the quota. Then, with every request in flight held and none settled, the
/// racers get exactly the quota between them.
#[test]
fn racing_holds_and_settles_add_up_to_the_quota() {
    let limiter = KeyedRateLimiter::<&str>::builder(Quota::per_minute(1000).unwrap())
        .algorithm::<Metered>()
        .clock(ManualClock::new())
        .build();
    let barrier = Arc::new(Barrier::new(8));
    let (spent, held) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (limiter, barrier) = (limiter.clone(), barrier.clone());
            let (spent, held) = (spent.clone(), held.clone());
            std::thread::spawn(move || {
                let mut seed = t * 7919 + 1;
                barrier.wait();
                for _ in 0..300 {
                    let (estimate, cost) = crate::common::next_estimate_and_cost(&mut seed);
                    let decision = limiter.check_n(&"a", estimate).unwrap();
                    if decision.allowed {
                        assert!(limiter.settle(&"a", estimate, decision, cost));
                        spent.fetch_add(cost, Ordering::Relaxed);
                    }
                }
                barrier.wait();
                // Now hold without settling: the quota is taken by exactly its permits.
                while limiter.check(&"b").allowed {
                    held.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    crate::common::joined(threads);
    let left = crate::common::admitted_until_refused(|| limiter.check(&"a").allowed);
    let spent = u64::from(spent.load(Ordering::Relaxed));
    assert_settled_plus_left_is_the_quota::<Metered>(1000, spent, left);
    assert_eq!(held.load(Ordering::Relaxed), 1000);
}

/// A key whose requests are in flight is never dropped as idle, however long they take; once
/// they have settled and the key has drained, it is.
#[test]
fn a_key_holding_estimates_is_not_dropped_as_idle() {
    let clock = ManualClock::new();
    let limiter = KeyedRateLimiter::<u32>::builder(Quota::per_second(10).unwrap())
        .algorithm::<Metered>()
        .clock(clock.clone())
        .max_keys(4)
        .build();
    let stream = limiter.check_n(&0, 10).unwrap();
    clock.advance(Duration::from_secs(3600));
    // New keys come and go; key 0 still holds its 10.
    for key in 1..=100 {
        assert!(limiter.check(&key).allowed);
        clock.advance(Duration::from_secs(10));
    }
    assert!(!limiter.check(&0).allowed, "key 0 still holds its estimate");
    assert!(limiter.settle(&0, 10, stream, 0));
    assert!(limiter.check(&0).allowed);
}

#[derive(Clone, Debug)]
enum Step {
    /// Let this many nanoseconds pass.
    Advance(u64),
    /// A request of this estimate, which will turn out to cost this many eighths of it.
    Admit(u32, u32),
    /// Settle the request in flight at this index (mod the count in flight), or the oldest.
    Settle(Option<usize>),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            (0..40_000u64).prop_map(Step::Advance),
            (1..=4u32, 0..=8u32).prop_map(|(e, eighths)| Step::Admit(e, eighths)),
            prop::option::of(0..8usize).prop_map(Step::Settle),
        ],
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Against a GCRA key charged each admitted request's true cost at the instant it was
    /// admitted: once everything has settled, the metered key holds exactly as much when the
    /// settles came in the order of the admissions, and never less otherwise (a settle charges
    /// its cost as of its admission, after the settles before it: an earlier request settled
    /// after a later one, across an idle gap, counts from the later one's instant).
    #[test]
    fn settles_leave_the_key_where_true_costs_would(
        permits in 1u32..8, burst in 1u32..10, in_order in any::<bool>(), steps in steps(),
    ) {
        let q = Quota::with_period(permits, Duration::from_nanos(60_000)).unwrap().with_burst(burst).unwrap();
        let clock = ManualClock::new();
        let limiter = metered(q, &clock);
        let exact: DirectRateLimiter<Gcra, ManualClock> = DirectRateLimiter::builder(q).clock(clock.clone()).build();
        let mut flight = Vec::new();
        let settle = |limiter: &DirectRateLimiter<Metered, ManualClock>, (e, cost, d)| {
            assert!(Limiter::<()>::settle(limiter, &(), e, d, cost));
        };
        for step in steps {
            match step {
                Step::Advance(d) => clock.advance(Duration::from_nanos(d)),
                Step::Admit(estimate, eighths) => {
                    let Ok(d) = limiter.check_n(estimate) else { continue };
                    if d.allowed {
                        let cost = estimate * eighths / 8;
                        if cost > 0 {
                            let charged = exact.check_n(cost).unwrap();
                            prop_assert!(charged.allowed, "true costs fit where estimates did");
                        }
                        flight.push((estimate, cost, d));
                    }
                }
                Step::Settle(_) if flight.is_empty() => {}
                Step::Settle(which) => {
                    let i = if in_order { 0 } else { which.map_or(0, |i| i % flight.len()) };
                    settle(&limiter, flight.remove(i));
                }
            }
        }
        for request in flight.drain(..) {
            settle(&limiter, request);
        }
        let (left, exact_left) = (drain(&limiter), drain(&exact));
        if in_order {
            prop_assert_eq!(left, exact_left);
        } else {
            prop_assert!(left <= exact_left, "{} > {}", left, exact_left);
        }
    }
}
