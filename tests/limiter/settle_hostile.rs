//! Hostile settles: estimates that lie, costs of `u32::MAX`, debt piled past every counter and
//! every span, decisions of other keys, limiters and tiers, settles of reservations that wait,
//! of admissions whose time has passed, racing quota changes and stale clock readings.

use crate::common::for_every_algorithm;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use futures::FutureExt;

use tower_bulwark::algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter, SlidingLog};
use tower_bulwark::clock::{Clock, ManualClock};
use tower_bulwark::limiter::{BoxLimiter, Decision};
use tower_bulwark::observe::Observed;
use tower_bulwark::tiers::Tiers;
use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Limiter, Quota};

type Keyed<A, C = ManualClock> = KeyedRateLimiter<u64, A, C>;

fn keyed<A: Algorithm, C: Clock>(quota: Quota, clock: C) -> Keyed<A, C> {
    KeyedRateLimiter::builder(quota)
        .algorithm::<A>()
        .clock(clock)
        .build()
}

fn fresh<A: Algorithm>(quota: Quota) -> (Keyed<A>, ManualClock) {
    let clock = ManualClock::new();
    (keyed(quota, clock.clone()), clock)
}

fn per_min(permits: u32) -> Quota {
    Quota::per_minute(permits).unwrap()
}

fn waiting(quota: Quota, secs: u64) -> Quota {
    quota.with_max_wait(Duration::from_secs(secs)).unwrap()
}

fn drain<A: Algorithm, C: Clock>(l: &Keyed<A, C>, key: u64) -> u64 {
    (0..100_000).take_while(|_| l.check(&key).allowed).count() as u64
}

fn reserve<L: Limiter<u64>>(l: &L, key: u64, cost: u32) -> Decision {
    let now = || {
        l.reserve(&key, cost)
            .now_or_never()
            .expect("an in-memory decision")
    };
    l.reserve_now(&key, cost).unwrap_or_else(now).unwrap()
}

fn name<A>() -> &'static str {
    std::any::type_name::<A>().rsplit("::").next().unwrap()
}

/// An estimate larger than what was taken gives back only what was taken; a smaller one is
/// what the settle counts from (the docs: the estimate is the decision's where it is smaller);
/// a cost of `u32::MAX` is charged as the capacity, so two periods later the key is whole.
#[test]
fn estimates_that_lie_are_held_to_what_the_decision_took() {
    fn run<A: Algorithm>() {
        let rows = [
            (u32::MAX, 0, 10),
            (u32::MAX, 1, 9),
            (1, 0, 7),
            (1, 3, 4),
            (4, u32::MAX, 0),
        ];
        for (estimate, cost, left) in rows {
            let ((l, clock), who) = (fresh::<A>(per_min(10)), name::<A>());
            let d = l.check_n(&1, 4).unwrap();
            assert!(l.settle(&1, estimate, d, cost));
            assert_eq!(drain(&l, 1), left, "{who}: settle({estimate}, {cost})");
            clock.advance(Duration::from_secs(120));
            assert_eq!(drain(&l, 1), 10, "{who}: settle({estimate}, {cost}), later");
        }
    }
    for_every_algorithm!(run);
}

/// A thousand admissions of one permit under a quota of `u32::MAX`, each settled to `u32::MAX`
/// at one instant: ~2^42 permits of debt. No count wraps: the key stays refused for as long as
/// each algorithm says debt weighs (the sliding log: one period; the counter: two windows).
#[test]
fn debt_piled_past_u32_never_wraps_into_room() {
    fn run<A: Algorithm>() {
        let (l, clock) = fresh::<A>(per_min(u32::MAX));
        let held: Vec<_> = (0..1000).map(|_| l.check(&1)).collect();
        for d in held {
            assert!(d.allowed);
            assert!(l.settle(&1, 1, d, u32::MAX));
        }
        let who = name::<A>();
        assert!(!l.check(&1).allowed, "{who}: admitted under 2^42 of debt");
        clock.advance(Duration::from_secs(60) + Duration::from_nanos(1));
        let one = who == "SlidingLog";
        assert_eq!(l.check(&1).allowed, one, "{who} after one period");
        clock.advance(Duration::from_secs(60));
        let two = one || who == "SlidingCounter";
        assert_eq!(l.check(&1).allowed, two, "{who} after two periods");
    }
    for_every_algorithm!(run);
}

/// A period of `Quota::MAX_SPAN` (2^60 ns) and 64 admissions each settled to `u32::MAX`: 4 096
/// permits of 64 a period, 2^66 ns of debt for GCRA and the fixed window, a previous-window
/// share of 4 096 · 2^60 for the counter. Nothing wraps or panics; the key stays refused.
#[test]
fn debt_of_more_time_than_u64_nanoseconds_holds() {
    fn run<A: Algorithm>() {
        let (l, clock) = fresh::<A>(Quota::with_period(64, Quota::MAX_SPAN).unwrap());
        let held: Vec<_> = (0..64).map(|_| l.check(&1)).collect();
        for d in held {
            assert!(l.settle(&1, 1, d, u32::MAX));
        }
        let who = name::<A>();
        let refused = l.check(&1);
        assert!(!refused.allowed, "{who}");
        assert!(
            refused.retry_after >= Quota::MAX_SPAN / 2,
            "{who}: {refused:?}"
        );
        clock.set(Quota::MAX_SPAN + Quota::MAX_SPAN / 2); // half way into period 2
        assert_eq!(
            l.check(&1).allowed,
            who == "SlidingLog",
            "{who} in period 2"
        );
    }
    for_every_algorithm!(run);
}

/// Refusals, another limiter's or key's decision, a decision built by hand: settling them
/// returns false and changes nothing, whether they would give back (cost 0) or charge
/// (`u32::MAX`). A clone's decision is the limiter's own.
#[test]
fn foreign_refused_and_forged_decisions_settle_nothing_either_way() {
    fn run<A: Algorithm>() {
        let (q, clock) = (per_min(10), ManualClock::new());
        let (l, other) = (
            keyed::<A, _>(q, clock.clone()),
            keyed::<A, _>(q, clock.clone()),
        );
        let direct = DirectRateLimiter::builder(q)
            .algorithm::<A>()
            .clock(clock.clone())
            .build();
        l.check_n(&1, 4).unwrap();
        l.check_n(&2, 10).unwrap();
        for cost in [0, u32::MAX] {
            let refused = l.check(&2);
            assert!(!refused.allowed);
            assert!(!l.settle(&2, 1, refused, cost));
            assert!(!l.settle(&1, 1, other.check(&1), cost));
            assert!(!other.settle(&1, 1, l.check_n(&1, 1).unwrap(), cost));
            assert!(!l.settle(&1, 1, l.check(&3), cost));
            assert!(!l.settle(&1, 1, direct.check(), cost));
            let forged = Decision::allowed(10, 9, Duration::ZERO);
            assert!(!l.settle(&1, 1, forged, cost));
        }
        let who = name::<A>();
        assert_eq!(drain(&l, 1), 10 - 4 - 2, "{who}: key 1");
        assert_eq!(drain(&l, 3), 8, "{who}: key 3");
        assert_eq!(drain(&other, 1), 8, "{who}: the other limiter");
        assert!(!direct.check_n(9).unwrap().allowed, "{who}: direct");
        let d = l.check_n(&4, 4).unwrap();
        assert!(l.clone().settle(&4, 4, d, 0));
        assert_eq!(drain(&l, 4), 10, "{who}: a clone's settle");
    }
    for_every_algorithm!(run);
}

/// A key that moves to another tier between its admission and the settle: the settle goes to
/// the tier that decided, both ways; another `Tiers` of the same shape takes nothing.
#[test]
fn a_settle_goes_to_the_tier_that_decided_even_after_the_key_moved() {
    let (q, clock) = (per_min(10), ManualClock::new());
    let (a, b) = (
        keyed::<Gcra, _>(q, clock.clone()),
        keyed::<Gcra, _>(q, clock.clone()),
    );
    let pro = Arc::new(AtomicBool::new(false));
    let p = pro.clone();
    let tiers =
        Tiers::new(move |_: &u64| p.load(Ordering::SeqCst), false, a.clone()).tier(true, b.clone());
    let lookalike = Tiers::new(|_: &u64| false, false, keyed::<Gcra, _>(q, clock.clone()))
        .tier(true, keyed::<Gcra, _>(q, clock.clone()));
    for (cost, left_in_a) in [(0, 10), (9, 1)] {
        pro.store(false, Ordering::SeqCst);
        let d = reserve(&tiers, 1, 5);
        pro.store(true, Ordering::SeqCst);
        assert!(!lookalike.settle(&1, 5, reserve(&tiers, 2, 5), u32::MAX));
        assert!(tiers.settle(&1, 5, d, cost));
        assert_eq!((drain(&a, 1), drain(&b, 1)), (left_in_a, 10), "cost {cost}");
        clock.advance(Duration::from_secs(60));
    }
}

/// Every wrapper settles through to the limiter it wraps (the trait has no default for it, so
/// none can drop a charge): debt is charged, and a refund gives back. `Observed` keeps counting
/// a settled admission as allowed, and its gauge follows the settle.
#[test]
fn wrappers_charge_debt_through_to_the_limiter() {
    fn check<L: Limiter<u64>>(what: &str, wrapper: L, inner: &Keyed<Gcra>) {
        let d = reserve(&wrapper, 1, 2);
        assert!(wrapper.settle(&1, 2, d, 7), "{what}");
        assert_eq!(drain(inner, 1), 3, "{what}: charged");
        let d = reserve(&wrapper, 2, 2);
        assert!(wrapper.settle(&2, 2, d, 0), "{what}");
        assert_eq!(drain(inner, 2), 10, "{what}: given back");
    }
    let l = fresh::<Gcra>(per_min(10)).0;
    check("Observed", Observed::new("o", l.clone()), &l);
    // What `Observed` counts: a settled admission stays allowed, given back or charged; a
    // refusal settled stays limited.
    let observed = Observed::new("o", fresh::<Gcra>(per_min(10)).0);
    let (d, e) = (reserve(&observed, 1, 2), reserve(&observed, 1, 2));
    assert!(observed.settle(&1, 2, d, 0) && observed.settle(&1, 2, e, 9));
    let refused = reserve(&observed, 1, 5);
    assert!(!refused.allowed && !observed.settle(&1, 5, refused, 0));
    let snapshot = observed.snapshot();
    assert_eq!((snapshot.allowed, snapshot.limited), (2, 1), "{snapshot:?}");
    // Its permits gauge follows a settle of the latest decision: 10 a minute, 4 taken (6 left),
    // settled to 1 (9 left); 2 taken (7 left), settled to 9 (nothing left).
    let observed = Observed::new("o", fresh::<Gcra>(per_min(10)).0);
    let gauge = |o: &Observed<_>| o.snapshot().available_permissions;
    let d = reserve(&observed, 1, 4);
    assert_eq!(gauge(&observed), 6);
    assert!(observed.settle(&1, 4, d, 1));
    assert_eq!(gauge(&observed), 9);
    let d = reserve(&observed, 1, 2);
    assert!(observed.settle(&1, 2, d, 9));
    assert_eq!(gauge(&observed), 0);
    let l = fresh::<Gcra>(per_min(10)).0;
    check("BoxLimiter", BoxLimiter::new(l.clone()), &l);
    let l = fresh::<Gcra>(per_min(10)).0;
    let boxed = BoxLimiter::new(Observed::new("o", l.clone()));
    check(
        "Tiers<BoxLimiter<Observed>>",
        Tiers::new(|_: &u64| 0, 0, boxed),
        &l,
    );
}

/// Reservations that wait. Settled once due (as a request that waited is): exactly its permits
/// come back. Settled before (GCRA, the log, the counter; the fixed window is the next test):
/// the next caller gets the very slot, and debt on it pushes every later caller back.
#[test]
fn settles_of_reservations_never_hand_out_a_held_slot() {
    fn run<A: Algorithm>() {
        let ((l, clock), who) = (fresh::<A>(waiting(per_min(2), 240)), name::<A>());
        assert!(l.check_n(&1, 2).unwrap().allowed);
        let r = reserve(&l, 1, 2);
        let wait = r.wait;
        assert!(r.allowed && wait > Duration::ZERO, "{who}: {r:?}");
        let (k, r) = if who == "FixedWindow" {
            (1, r)
        } else {
            assert!(l.settle(&1, 2, r, 0));
            let again = reserve(&l, 1, 2);
            assert_eq!(again.wait, wait, "{who}: the slot is the next caller's");
            assert!(l.settle(&1, 2, again, 2));
            let later = reserve(&l, 1, 1);
            assert!(!later.allowed || later.wait > wait, "{who}: a held slot");
            assert!(l.check_n(&2, 2).unwrap().allowed);
            (2, reserve(&l, 2, 2))
        };
        clock.advance(wait + Duration::from_secs(1));
        assert!(l.settle(&k, 2, r, 0));
        assert_eq!(drain(&l, k), 2, "{who}: settled once due");
    }
    for_every_algorithm!(run);
    // GCRA, exactly: one a second, burst 5; d0 takes 3 and another 2 now, r1 is due at 1 s,
    // r2 at 2 s.
    let quota = Quota::per_second(1).unwrap().with_burst(5).unwrap();
    let l = fresh::<Gcra>(waiting(quota, 10)).0;
    let d0 = l.check_n(&1, 3).unwrap();
    assert!(l.check_n(&1, 2).unwrap().allowed);
    let (r1, r2) = (reserve(&l, 1, 1), reserve(&l, 1, 1));
    let secs = Duration::from_secs;
    assert_eq!((r1.wait, r2.wait), (secs(1), secs(2)));
    assert!(l.settle(&1, 1, r1, 0), "r2 follows: nothing comes back");
    assert_eq!(l.check(&1).retry_after, secs(3));
    assert!(l.settle(&1, 1, r2, 0), "the last one: its slot comes back");
    assert_eq!(l.check(&1).retry_after, secs(2));
    assert!(l.settle(&1, 3, d0, 5), "two permits of debt");
    assert_eq!(l.check(&1).retry_after, secs(4));
}

/// The fixed window's refund rule, as its docs say: a reservation of one permit due in the
/// last cycle holding charges comes back exactly; one of several permits is kept (it may begin
/// in the cycle before, which one count cannot tell), even where it lies wholly inside its
/// cycle (slots 3 and 4 of a limit of 2). Never an over-grant. (An outside attack first took
/// the docs' older wording to promise these back.)
#[test]
fn a_fixed_window_reservation_of_several_permits_settled_before_it_is_due_is_kept() {
    for (limit, cost) in [(2, 1), (2, 2), (4, 2), (4, 4)] {
        let quota = waiting(per_min(limit), 240);
        let l = fresh::<FixedWindow>(quota).0;
        let slots = |l: &Keyed<_>| (0..100).take_while(|_| reserve(l, 1, 1).allowed).count();
        let all = slots(&fresh::<FixedWindow>(quota).0);
        assert!(l.check_n(&1, limit).unwrap().allowed);
        let r = reserve(&l, 1, cost);
        assert_eq!(r.wait, Duration::from_secs(60));
        assert!(l.settle(&1, cost, r, 0));
        let kept = all - limit as usize - slots(&l);
        let expected = if cost == 1 { 0 } else { cost as usize };
        assert_eq!(kept, expected, "limit {limit}, reserved {cost}");
    }
}

/// Settles of admissions whose time has passed give back no time that passed: a fixed window
/// whose cycle ended (also after a change of period), a log entry already pruned, the
/// counter's previous window exactly, GCRA only what the key's state still holds.
#[test]
fn settles_of_old_admissions_give_back_no_time_that_passed() {
    let (q, secs) = (per_min(10), Duration::from_secs);
    for change in [false, true] {
        let (l, clock) = fresh::<FixedWindow>(q);
        let d = l.check_n(&1, 10).unwrap();
        if change {
            l.set_quota(Quota::with_period(10, secs(30)).unwrap());
        }
        clock.advance(secs(61));
        assert!(l.settle(&1, 10, d, 0));
        assert_eq!(drain(&l, 1), 10, "fixed window, period changed: {change}");
    }
    let (l, clock) = fresh::<SlidingLog>(q);
    let (d, old) = (l.check_n(&1, 6).unwrap(), l.check_n(&1, 4).unwrap());
    clock.advance(secs(30));
    assert!(l.settle(&1, 6, d, 2), "4 of the entry at 0 s come back");
    assert_eq!(drain(&l, 1), 4, "sliding log at 30 s");
    clock.advance(secs(31));
    assert!(l.settle(&1, 4, old, 0), "pruned: nothing");
    assert_eq!(
        drain(&l, 1),
        6,
        "sliding log at 61 s: 4 of 30 s still weigh"
    );
    let (l, clock) = fresh::<SlidingCounter>(q);
    let d = l.check_n(&1, 10).unwrap();
    clock.advance(secs(90));
    assert!(l.settle(&1, 10, d, 0));
    assert_eq!(drain(&l, 1), 10, "sliding counter: the previous window");

    // GCRA, one every 6 s: 10 at 0 s, 5 at 30 s, then the first settled to nothing. Had it never
    // been made, the 5 of 30 s would leave 5: exactly that, not 10.
    let (l, clock) = fresh::<Gcra>(q);
    let d = l.check_n(&1, 10).unwrap();
    clock.advance(secs(30));
    assert!(l.check_n(&1, 5).unwrap().allowed);
    assert!(l.settle(&1, 10, d, 0));
    assert_eq!(drain(&l, 1), 5, "gcra");
}

/// GCRA after `set_quota`: a settle of an earlier decision gives back each permit at the
/// shorter of the interval it was charged at and the one in force (no more time than it took),
/// and charges debt at the one in force, whatever the estimate says.
#[test]
fn gcra_settles_across_a_quota_change_give_back_no_more_time_than_taken() {
    let before = Quota::per_minute(60).unwrap().with_burst(60).unwrap();
    let longer = Quota::per_minute(6).unwrap().with_burst(60).unwrap();
    for (estimate, cost, left) in [(u32::MAX, 0, 55), (4, 0, 55), (4, 2, 54), (4, 6, 52)] {
        let l = fresh::<Gcra>(before).0;
        l.check_n(&1, 50).unwrap();
        let d = l.check_n(&1, 4).unwrap();
        l.set_quota(longer);
        assert!(l.settle(&1, estimate, d, cost));
        // TAT 54 s, 10 s an interval from now on (600 s of burst): 4 permits back at 1 s each
        // is 50 s (55 left), 2 back is 52 s (54 left), 2 charged at 10 s is 74 s (52 left).
        assert_eq!(drain(&l, 1), left, "settle({estimate}, {cost})");
    }
    let l = fresh::<Gcra>(per_min(60)).0;
    let d = l.check_n(&1, 4).unwrap();
    l.set_quota(per_min(120).with_burst(10).unwrap());
    assert!(l.settle(&1, 4, d, 0));
    assert_eq!(
        drain(&l, 1),
        6,
        "a shorter interval gives back 2 s, not 4 s"
    );
}

/// A clock whose readings each thread refreshes only every few reads: monotonic per thread,
/// stale against the others.
#[derive(Clone)]
struct Stale(ManualClock);

thread_local!(static SEEN: Cell<(u64, u32)> = const { Cell::new((0, 0)) });

impl Clock for Stale {
    fn now(&self) -> u64 {
        SEEN.with(|seen| {
            let (mut at, n) = seen.get();
            if n % 5 == 0 {
                at = self.0.now();
            }
            seen.set((at, n + 1));
            at
        })
    }
}

/// Eight threads reserve and settle (cost at most the estimate) on one key while a ninth
/// changes the quota back and forth, all on stale readings of a clock they move on by 1 ms now
/// and then. Counting every admission at its settled cost: never more than the larger quota
/// (GCRA: its burst plus what the elapsed time refills), and exactly it where refunds are exact.
#[test]
fn racing_settles_quota_changes_and_stale_readings_never_over_grant() {
    fn run<A: Algorithm>(second: Quota, exact: bool) {
        SEEN.with(|seen| seen.set((0, 0)));
        let inner = ManualClock::new();
        let first = Quota::per_hour(1000).unwrap();
        let l = keyed::<A, _>(first, Stale(inner.clone()));
        let (spent, done, barrier) = (AtomicU64::new(0), AtomicBool::new(false), Barrier::new(9));
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..8u64)
                .map(|t| {
                    let (l, spent, barrier, clock) = (&l, &spent, &barrier, &inner);
                    s.spawn(move || {
                        let mut seed = t * 2654435761 + 17;
                        barrier.wait();
                        for i in 0..1000 {
                            seed ^= seed << 13;
                            seed ^= seed >> 7;
                            seed ^= seed << 17;
                            let estimate = 1 + (seed % 40) as u32;
                            let cost = (seed >> 20) as u32 % (estimate + 1);
                            if i % 3 == 0 {
                                clock.advance(Duration::from_millis(1));
                            }
                            let d = l.check_n(&7, estimate).unwrap();
                            if d.allowed {
                                assert!(l.settle(&7, estimate, d, cost));
                                spent.fetch_add(u64::from(cost), Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            s.spawn(|| {
                barrier.wait();
                for flip in (0..).map(|i| i % 2 == 0) {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    l.set_quota(if flip { second } else { first });
                }
                l.set_quota(first);
            });
            workers.into_iter().for_each(|w| w.join().unwrap());
            done.store(true, Ordering::Relaxed);
        });
        let total = spent.load(Ordering::Relaxed) + drain(&l, 7);
        let refill = inner
            .now()
            .div_ceil(first.emission_interval().as_nanos() as u64);
        let (who, most) = (name::<A>(), 1000 + refill);
        assert!(total <= most, "{who}: {total} tokens, at most {most}");
        if exact {
            assert_eq!(total, 1000, "{who}: tokens lost");
        }
    }
    let half = Quota::per_hour(500).unwrap();
    run::<Gcra>(
        Quota::per_hour(1000).unwrap().with_burst(500).unwrap(),
        false,
    );
    // Twice the interval, the same burst in time: every permit still weighs at least 3.6 s.
    run::<Gcra>(half, false);
    run::<FixedWindow>(half, false);
    run::<SlidingLog>(half, true);
    run::<SlidingCounter>(half, true);
}

/// Debt is state a key cannot shed: a flood of fresh keys through a bounded store, or
/// `retain_recent`, must not evict the indebted key into a fresh one.
#[test]
fn debt_survives_a_key_flood_and_retain_recent() {
    let clock = ManualClock::new();
    let l: Keyed<Gcra> = KeyedRateLimiter::builder(per_min(10))
        .clock(clock.clone())
        .max_keys(64)
        .build();
    let held: Vec<_> = (0..5).map(|_| l.check(&0)).collect();
    for d in held {
        assert!(l.settle(&0, 1, d, 10));
    }
    // 5 + 45 permits of debt: 40 over a burst of 10, four minutes at one every 6 s.
    clock.advance(Duration::from_secs(60));
    for key in 1..5000 {
        l.check(&key);
    }
    l.retain_recent();
    let refused = l.check(&0);
    assert!(!refused.allowed, "the indebted key was forgotten");
    assert_eq!(refused.retry_after, Duration::from_secs(180 + 6));
}
