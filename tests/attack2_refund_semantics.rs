//! Attacks on documented refund semantics that a legitimate caller (the HTTP layer's veto path)
//! relies on, and on what `Observed` reports after a refund.

use std::time::Duration;

use tower_bulwark::observe::Observed;
use tower_bulwark::{KeyedRateLimiter, Limiter, ManualClock, Quota};

/// The guide, GCRA row: "When later admissions moved the TAT on but none of them is a reservation
/// still ahead ..., an immediate admission gives back its cost less the time elapsed since it was
/// charged". An immediate admission (`wait == 0`) that exactly fills the burst is taken for a
/// reservation by the refund (`reserved_at > left - horizon` is strict), so nothing goes back.
///
/// 4 a minute (one every 15 s, burst 4). At 1 s: two of cost 1, then A of cost 2 (immediate,
/// filling the burst). At 16 s: B of cost 1 (immediate). A is vetoed at 16 s: it should give back
/// 30 s - 15 s = one permit. It gives back none. (Never an over-grant: the loss is the client's.)
#[test]
#[ignore = "defect: GCRA: an immediate admission that fills the burst exactly is refunded as a reservation (nothing back)"]
fn a_gcra_admission_filling_the_burst_gives_back_cost_less_elapsed() {
    let clock = ManualClock::new();
    let l = KeyedRateLimiter::<u64>::builder(Quota::per_minute(4).unwrap())
        .clock(clock.clone())
        .build();
    clock.advance(Duration::from_secs(1));
    assert!(l.check(&1).allowed);
    assert!(l.check(&1).allowed);
    let a = l.check_n(&1, 2).unwrap();
    assert!(a.allowed && a.wait.is_zero());
    clock.advance(Duration::from_secs(15));
    let b = l.check(&1);
    assert!(b.allowed && b.wait.is_zero());
    l.refund(&1, 2, &a);
    assert!(
        l.check(&1).allowed,
        "A's cost (30 s) less the 15 s elapsed should be free again"
    );
}

/// Control for the test above: the same sequence with A one nanosecond short of filling the burst
/// (it is charged 1 ns later, so the fill is not exact) gives back as documented.
#[test]
fn a_gcra_admission_short_of_the_burst_gives_back_cost_less_elapsed() {
    let clock = ManualClock::new();
    let l = KeyedRateLimiter::<u64>::builder(Quota::per_minute(4).unwrap())
        .clock(clock.clone())
        .build();
    clock.advance(Duration::from_secs(1));
    assert!(l.check(&1).allowed);
    assert!(l.check(&1).allowed);
    clock.advance(Duration::from_nanos(1));
    let a = l.check_n(&1, 2).unwrap();
    assert!(a.allowed && a.wait.is_zero());
    clock.advance(Duration::from_secs(15));
    let b = l.check(&1);
    assert!(b.allowed && b.wait.is_zero());
    l.refund(&1, 2, &a);
    assert!(l.check(&1).allowed);
}

/// `LimiterSnapshot::available_permissions`: "Permits left after the latest decision, for that
/// decision's key". After a refund it is set from the refunded decision's own `remaining` plus its
/// cost, however old that decision is: here 4 while one permit is left.
#[test]
#[ignore = "defect: Observed: available_permissions after a refund is the old decision's remaining + cost, not what is left"]
fn observed_available_after_a_late_refund_is_what_is_left() {
    let clock = ManualClock::new();
    let l = Observed::new(
        "api",
        KeyedRateLimiter::<u64>::builder(Quota::per_minute(4).unwrap())
            .clock(clock.clone())
            .build(),
    );
    clock.advance(Duration::from_secs(1));
    let first = l.reserve_now(&1, 1).unwrap().unwrap();
    assert_eq!(first.remaining, 3);
    for _ in 0..3 {
        assert!(l.reserve_now(&1, 1).unwrap().unwrap().allowed);
    }
    // The first admission is vetoed late: GCRA gives back its cost (nothing has elapsed): one
    // permit is left.
    l.refund(&1, 1, &first);
    let shown = l.snapshot().available_permissions;
    let next = l.reserve_now(&1, 1).unwrap().unwrap();
    assert!(next.allowed && next.remaining == 0, "one permit was left");
    assert_eq!(shown, 1, "the snapshot claimed {shown} permits left");
}
