//! Refund semantics that a legitimate caller (the HTTP layer's veto path) relies on, and what
//! `Observed` reports after a refund.

use crate::common::keyed_on;
use crate::common::waits_up_to;
use std::time::Duration;

use tower_bulwark::observe::Observed;
use tower_bulwark::{algorithm::Gcra, clock::ManualClock, KeyedRateLimiter, Limiter, Quota};

/// The guide, GCRA row: "When later admissions moved the TAT on but none of them is a reservation
/// still ahead ..., an immediate admission gives back its cost less the time elapsed since it was
/// charged". An immediate admission (`wait == 0`) that exactly fills the burst is taken for a
/// reservation by the refund (`reserved_at > left - horizon` is strict), so nothing goes back.
///
/// 4 a minute (one every 15 s, burst 4). At 1 s: two of cost 1, then A of cost 2 (immediate,
/// filling the burst). At 16 s: B of cost 1 (immediate). A is vetoed at 16 s: it should give back
/// 30 s - 15 s = one permit. It gives back none. (Never an over-grant: the loss is the client's.)
#[test]
fn a_gcra_admission_filling_the_burst_gives_back_cost_less_elapsed() {
    assert!(
        admits_after_vetoing_a(Duration::ZERO),
        "A's cost (30 s) less the 15 s elapsed should be free again"
    );
}

/// The sequence of the tests here, on a GCRA limiter of 4 a minute: at 1 s, two admissions of
/// cost 1; `a_later` after them, A of cost 2 (immediate); 15 s later, B of cost 1 (immediate);
/// then A is given back. Answers whether the key admits one more then.
fn admits_after_vetoing_a(a_later: Duration) -> bool {
    let clock = ManualClock::new();
    let l = keyed_on::<u64, _>(Quota::per_minute(4).unwrap(), &clock);
    clock.advance(Duration::from_secs(1));
    assert!(l.check(&1).allowed);
    assert!(l.check(&1).allowed);
    clock.advance(a_later);
    let a = l.check_n(&1, 2).unwrap();
    assert!(a.allowed && a.wait.is_zero());
    clock.advance(Duration::from_secs(15));
    let b = l.check(&1);
    assert!(b.allowed && b.wait.is_zero());
    l.refund(&1, 2, a);
    l.check(&1).allowed
}

/// Control for the test above: the same sequence with A one nanosecond short of filling the burst
/// (it is charged 1 ns later, so the fill is not exact) gives back as documented.
#[test]
fn a_gcra_admission_short_of_the_burst_gives_back_cost_less_elapsed() {
    assert!(admits_after_vetoing_a(Duration::from_nanos(1)));
}

/// A GCRA limiter of `permits` a minute on `clock`, observed under the name "api".
fn observed_per_minute(
    permits: u32,
    clock: &ManualClock,
) -> Observed<KeyedRateLimiter<u64, Gcra, ManualClock>> {
    Observed::new(
        "api",
        keyed_on::<u64, _>(Quota::per_minute(permits).unwrap(), clock),
    )
}

/// `LimiterSnapshot::available_permissions`: "Permits left after the latest decision, for that
/// decision's key (and back up by its cost if that decision is given back; a refund of an older
/// decision does not change it)". A late refund of the first of four admissions leaves the
/// fourth's figure; a refund of the fourth puts its permit back.
#[test]
fn observed_available_follows_the_latest_decision_through_refunds() {
    let clock = ManualClock::new();
    let l = observed_per_minute(4, &clock);
    clock.advance(Duration::from_secs(1));
    let first = l.reserve_now(&1, 1).unwrap().unwrap();
    assert_eq!(first.remaining, 3);
    let mut last = None;
    for _ in 0..3 {
        let d = l.reserve_now(&1, 1).unwrap().unwrap();
        assert!(d.allowed);
        last = Some(d);
    }
    let last = last.unwrap();
    assert_eq!(l.snapshot().available_permissions, 0);
    // A refund of an older decision: the latest decision's figure stays.
    l.refund(&1, 1, first);
    assert_eq!(l.snapshot().available_permissions, 0);
    // A refund of the latest decision: its permit is back.
    l.refund(&1, 1, last);
    assert_eq!(l.snapshot().available_permissions, 1);
    assert_eq!(l.snapshot().allowed, 2, "two admissions were given back");
}

/// `LimiterSnapshot::allowed` counts "decisions that admitted the request and were not given
/// back": a decision the inner limiter does not take back (another limiter's, one built by
/// hand, its own under another key) changes no count, gauge or reservation.
#[test]
fn observed_counts_only_what_its_limiter_takes_back() {
    use tower_bulwark::limiter::Decision;

    let clock = ManualClock::new();
    let quota = waits_up_to(Quota::per_minute(4).unwrap(), Duration::from_secs(60));
    let build = || keyed_on::<u64, _>(quota, &clock);
    let observed = Observed::new("api", build());
    let other = build();
    for _ in 0..4 {
        assert!(observed.reserve_now(&1, 1).unwrap().unwrap().allowed);
    }
    // A reservation of the observed limiter, due in 15 s: one request waits.
    let waiting = observed.reserve_now(&1, 1).unwrap().unwrap();
    assert!(waiting.allowed && !waiting.wait.is_zero());
    let before = observed.snapshot();
    assert_eq!((before.allowed, before.waiting_requests), (5, 1));

    // Another limiter's reservation due at the same instant, a hand-built admission, and the
    // observed limiter's own decision under another key: none is taken back.
    for _ in 0..4 {
        other.check(&1);
    }
    let foreign = other.reserve_now(&1, 1).unwrap().unwrap();
    assert_eq!(foreign.wait, waiting.wait);
    assert!(!observed.refund(&1, 1, foreign));
    assert!(!observed.refund(&1, 1, Decision::allowed(4, 3, Duration::from_secs(60))));
    let own = observed.reserve_now(&2, 1).unwrap().unwrap();
    let after_own = observed.snapshot();
    assert!(!observed.refund(&3, 1, own));
    assert_eq!(observed.snapshot(), after_own, "nothing was given back");
    assert_eq!((after_own.allowed, after_own.waiting_requests), (6, 1));

    // The observed limiter's own reservation is taken back.
    assert!(observed.refund(&1, 1, waiting));
    let after = observed.snapshot();
    assert_eq!((after.allowed, after.waiting_requests), (5, 0));
}

/// "A refund of an older decision does not change" the gauge, even when the older decision
/// left the same figure as the latest: key 1 and then key 2 each leave 4 of 5; refunding key
/// 1's decision leaves the gauge at key 2's 4, and refunding key 2's moves it to 5.
#[test]
fn observed_available_tells_apart_decisions_that_left_the_same_figure() {
    let clock = ManualClock::new();
    let l = observed_per_minute(5, &clock);
    let one = l.reserve_now(&1, 1).unwrap().unwrap();
    let two = l.reserve_now(&2, 1).unwrap().unwrap();
    assert_eq!((one.remaining, two.remaining), (4, 4));
    assert!(l.refund(&1, 1, one));
    assert_eq!(l.snapshot().available_permissions, 4);
    assert!(l.refund(&2, 1, two));
    assert_eq!(l.snapshot().available_permissions, 5);
}
