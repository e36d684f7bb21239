//! The refund contract through the public [`Limiter::refund`]: "no more than the request took is
//! ever given back" (`Algorithm::refund`). A refund consumes its decision (a `Decision` is neither
//! `Copy` nor `Clone`), so giving one back twice does not compile (the `compile_fail` example on
//! `Limiter::refund`); a decision remembers the cost it was asked for, so a caller naming a larger
//! cost gets back only that; and it remembers its key, so giving it back under another key frees
//! nothing there. Each algorithm, in memory here and in Redis in `tests/redis/refund.rs`.

use std::time::Duration;

use tower_bulwark::{
    algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    KeyedRateLimiter, Limiter, Quota,
};

fn name<A>() -> &'static str {
    std::any::type_name::<A>().rsplit("::").next().unwrap()
}

fn limiter<A: Algorithm>() -> (KeyedRateLimiter<u64, A, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = KeyedRateLimiter::<u64>::builder(Quota::per_minute(4).unwrap())
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    clock.advance(Duration::from_secs(1));
    (limiter, clock)
}

fn admitted_now<A: Algorithm>(l: &KeyedRateLimiter<u64, A, ManualClock>, key: u64) -> usize {
    (0..10).filter(|_| l.check(&key).allowed).count()
}

macro_rules! each {
    ($run:ident) => {{
        let mut bad = Vec::new();
        if let Some(b) = $run::<Gcra>() {
            bad.push(b);
        }
        if let Some(b) = $run::<FixedWindow>() {
            bad.push(b);
        }
        if let Some(b) = $run::<SlidingLog>() {
            bad.push(b);
        }
        if let Some(b) = $run::<SlidingCounter>() {
            bad.push(b);
        }
        bad
    }};
}

/// Four admitted; the last (cost 1) given back with a cost of 3: one permit is free, not three.
#[test]
fn a_refund_with_a_larger_cost_frees_only_what_was_charged() {
    fn run<A: Algorithm>() -> Option<String> {
        let (l, _clock) = limiter::<A>();
        let mut last = None;
        for _ in 0..4 {
            last = Some(l.check(&1));
        }
        l.refund(&1, 3, last.unwrap());
        let got = admitted_now(&l, 1);
        (got != 1).then(|| format!("{}: {got} admitted", name::<A>()))
    }
    let bad = each!(run);
    assert!(bad.is_empty(), "{bad:?}");
}

/// Key 1 spends its quota; key 2's admission is given back to key 1: key 1 gains nothing.
#[test]
fn a_decision_given_back_to_another_key_frees_nothing_there() {
    fn run<A: Algorithm>() -> Option<String> {
        let (l, _clock) = limiter::<A>();
        assert_eq!(admitted_now(&l, 1), 4);
        let other = l.check(&2);
        assert!(other.allowed);
        l.refund(&1, 1, other);
        let got = admitted_now(&l, 1);
        (got != 0).then(|| format!("{}: {got} admitted", name::<A>()))
    }
    let bad = each!(run);
    assert!(bad.is_empty(), "{bad:?}");
}

/// Held: a refusal given back (any number of times) frees nothing.
#[test]
fn a_refusal_given_back_frees_nothing() {
    fn run<A: Algorithm>() -> Option<String> {
        let (l, _clock) = limiter::<A>();
        assert_eq!(admitted_now(&l, 1), 4);
        for _ in 0..3 {
            let refused = l.check(&1);
            assert!(!refused.allowed);
            l.refund(&1, 4, refused);
        }
        let got = admitted_now(&l, 1);
        (got != 0).then(|| format!("{}: {got} admitted", name::<A>()))
    }
    let bad = each!(run);
    assert!(bad.is_empty(), "{bad:?}");
}
