//! A blind attack on the one seam that gives back and settles admissions
//! (`Limiter::refund`, `Limiter::settle`), through every wrapper a user can stack: `BoxLimiter`,
//! `Observed`, `Tiers` and a limiter of the user's own that forwards. Each test takes its
//! figures from the quota and the rustdoc of `Limiter::settle` / `Limiter::refund`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_bulwark::algorithm::{Algorithm, FixedWindow, Gcra, Metered};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::limiter::{BoxLimiter, Decision};
use tower_bulwark::observe::Observed;
use tower_bulwark::tiers::Tiers;
use tower_bulwark::{BoxError, KeyedRateLimiter, Limiter, Quota};

use crate::common::{admitted_until_refused, probe};

type Keyed<A> = KeyedRateLimiter<u64, A, ManualClock>;

/// A limiter of the user's own that wraps another and forwards every call.
#[derive(Clone)]
struct Forward<L>(L);

impl<K: 'static, L: Limiter<K>> Limiter<K> for Forward<L> {
    type Future = L::Future;
    fn quota(&self) -> Quota {
        self.0.quota()
    }
    fn reserve(&self, key: &K, cost: u32) -> Self::Future {
        self.0.reserve(key, cost)
    }
    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        self.0.reserve_now(key, cost)
    }
    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool {
        self.0.refund(key, cost, decision)
    }
    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool {
        self.0.settle(key, estimate, decision, cost)
    }
}

fn keyed<A: Algorithm>(permits: u32, clock: &ManualClock) -> Keyed<A> {
    KeyedRateLimiter::<u64>::builder(Quota::per_minute(permits).unwrap())
        .algorithm::<A>()
        .clock(clock.clone())
        .build()
}

/// An immediate admission of `cost` for `key`, made at once.
fn take<L: Limiter<u64>>(l: &L, key: u64, cost: u32) -> Decision {
    let d = l.reserve_now(&key, cost).expect("in memory").unwrap();
    assert!(d.allowed && d.wait.is_zero(), "{cost} admitted at once");
    d
}

/// Single permits `l` still grants `key` now (takes them all).
fn left<L: Limiter<u64>>(l: &L, key: u64) -> u64 {
    admitted_until_refused(|| l.reserve_now(&key, 1).unwrap().unwrap().allowed)
}

/// `Limiter::settle`: "The crate's limiters take the estimate from the decision where it is
/// smaller than `estimate`, so that a settle never gives back what was not taken", and
/// `Observed::settle`: "the permits gauge moves by what the settle gave back or charged". A
/// caller that names an estimate of `u32::MAX` and settles to zero gets back the 3 taken, and
/// the gauge says 10 left, as the limiter does.
#[test]
fn an_observed_settle_with_a_lying_estimate_moves_the_gauge_by_what_went_back() {
    for fixed in [true, false] {
        let clock = ManualClock::new();
        let (gauge, really) = if fixed {
            lying_settle(Observed::new("t", keyed::<FixedWindow>(10, &clock)))
        } else {
            lying_settle(Observed::new("t", keyed::<Gcra>(10, &clock)))
        };
        assert_eq!((gauge, really), (10, 10), "fixed window: {fixed}");
    }
}

fn lying_settle<L: Limiter<u64>>(o: Observed<L>) -> (u64, u64) {
    let d = take(&o, 1, 3);
    assert_eq!(d.remaining, 7);
    assert!(o.settle(&1, u32::MAX, d, 0));
    let gauge = o.snapshot().available_permissions;
    (gauge, left(o.get_ref(), 1))
}

/// `Limiter::refund`: "No more than the decision took is ever given back, whatever `cost`
/// says"; `LimiterSnapshot::available_permissions`: "back up by its cost if that decision is
/// given back". A refund naming `u32::MAX` of an admission of 3 leaves the gauge at the 10 the
/// key has, never above its limit.
#[test]
fn an_observed_refund_naming_a_huge_cost_puts_the_gauge_back_by_what_was_taken() {
    let clock = ManualClock::new();
    let o = Observed::new("t", keyed::<FixedWindow>(10, &clock));
    let d = take(&o, 1, 3);
    assert!(o.refund(&1, u32::MAX, d));
    let snap = o.snapshot();
    assert_eq!(snap.allowed, 0, "given back whole: not counted");
    assert_eq!(snap.available_permissions, 10);
    assert_eq!(left(o.get_ref(), 1), 10);
}

/// `Limiter::settle`: the estimate is the caller's where it is smaller than what the decision
/// took: an admission of 5 settled from a claimed estimate of 1 to 3 charges 2 more, 7 used of
/// 10. The gauge follows what the limiter did: 3 left.
#[test]
fn an_observed_settle_with_a_smaller_estimate_charges_from_that_estimate() {
    let clock = ManualClock::new();
    let o = Observed::new("t", keyed::<FixedWindow>(10, &clock));
    let d = take(&o, 1, 5);
    assert!(o.settle(&1, 1, d, 3));
    assert_eq!(o.snapshot().available_permissions, 3);
    assert_eq!(left(o.get_ref(), 1), 3);
}

/// `Observed::refund`/`settle`: "Only what the inner limiter takes back as its own is
/// uncounted: another limiter's decision, or one for another key, changed nothing there." A
/// foreign decision settled or refunded through `Observed` returns `false`, and neither the
/// counts nor the gauge move.
#[test]
fn foreign_decisions_through_observed_change_no_count_and_no_gauge() {
    let clock = ManualClock::new();
    let o = Observed::new("t", keyed::<FixedWindow>(10, &clock));
    let other = keyed::<FixedWindow>(10, &clock);
    take(&o, 1, 4);
    let before = o.snapshot();
    assert!(!o.settle(&1, 9, take(&other, 1, 9), 0));
    assert!(!o.refund(&1, 9, take(&other, 2, 9)));
    assert!(!o.settle(&2, 4, take(&o, 1, 1), 0), "under another key");
    let after_own = o.snapshot();
    assert_eq!(before.allowed + 1, after_own.allowed);
    assert_eq!(after_own.available_permissions, 5);
    assert_eq!(left(o.get_ref(), 1), 5);
}

/// The stack a user builds: a box around a named, observed set of tiers whose limiters are
/// limiters of the user's own that forward.
type Plans<A> = Observed<Tiers<u64, &'static str, Forward<Keyed<A>>>>;

fn stack<A: Algorithm>(clock: &ManualClock, pro: Arc<AtomicBool>) -> (BoxLimiter<u64>, Plans<A>) {
    let tiers = Tiers::new(
        move |_: &u64| ["free", "pro"][usize::from(pro.load(Ordering::SeqCst))],
        "free",
        Forward(keyed::<A>(10, clock)),
    )
    .tier("pro", Forward(keyed::<A>(100, clock)));
    let observed = Observed::new("plans", tiers);
    (BoxLimiter::new(observed.clone()), observed)
}

/// What key 1 has left in the `free` and `pro` tiers under `observed`.
fn tiers_left<A: Algorithm>(observed: &Plans<A>) -> (u64, u64) {
    let tier = |name| left(observed.get_ref().get(&name).unwrap(), 1);
    (tier("free"), tier("pro"))
}

/// `Tiers`: "A decision remembers the tier that made it, so a refund goes back to that tier
/// even if the key has moved since"; `Limiter::settle`: "A settle to zero gives back all the
/// admission took", a settle above "charged". Through box → observed → tiers → forwarder: an
/// admission of 3 on `free`, the key moved to `pro`, settled to 0, gives `free` its 10 back and
/// leaves `pro` at 100; an admission of 2 on `free` settled to 6 after the move charges `free`.
#[test]
fn settles_through_the_whole_stack_go_to_the_tier_that_decided() {
    let moved = Arc::new(AtomicBool::new(false));
    let (l, observed) = stack::<FixedWindow>(&ManualClock::new(), Arc::clone(&moved));
    let a = take(&l, 1, 3);
    let b = take(&l, 1, 2);
    moved.store(true, Ordering::SeqCst);
    assert!(l.settle(&1, 3, a, 0));
    assert!(l.settle(&1, 2, b, 6));
    assert_eq!(tiers_left(&observed), (4, 100), "free: 10 - 6");
}

/// The same, by refunds: a refund of the `free` tier's admission after the key moved frees
/// `free`, returns `true`, and `Observed` no longer counts it.
#[test]
fn refunds_through_the_whole_stack_go_to_the_tier_that_decided() {
    let moved = Arc::new(AtomicBool::new(false));
    let (l, observed) = stack::<Gcra>(&ManualClock::new(), Arc::clone(&moved));
    let a = take(&l, 1, 4);
    moved.store(true, Ordering::SeqCst);
    assert!(l.refund(&1, 4, a));
    assert_eq!(observed.snapshot().allowed, 0);
    assert_eq!(tiers_left(&observed), (10, 100));
}

/// Guide, hostile table: "N threads racing for L get exactly L", and a give-back at one
/// instant is exact. 16 threads through clones of the whole stack, each taking single permits
/// and settling every other one to zero, on a clock that stands still: the permits kept are
/// exactly the 10 of `free`, and `Observed` counts each admission once ("The admission still
/// counts as allowed" after a settle, `Observed::settle`).
#[test]
fn racing_threads_settling_through_the_stack_keep_exactly_the_quota() {
    for (name, (kept, more, settled, allowed)) in [
        ("fixed window", race::<FixedWindow>()),
        ("gcra", race::<Gcra>()),
    ] {
        assert_eq!(kept + more, 10, "{name}");
        assert!(kept > 0, "{name}: the race admitted some for good");
        assert_eq!(allowed, 10 + settled, "{name}: each admission counted once");
    }
}

/// The race above on algorithm `A`: (permits kept by the threads, permits left after them,
/// admissions settled to zero, what `Observed` counts as allowed after draining those).
fn race<A: Algorithm>() -> (u64, u64, u64, u64) {
    let clock = ManualClock::new();
    let (l, observed) = stack::<A>(&clock, Arc::new(AtomicBool::new(false)));
    let (kept, settled) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (l, kept, settled) = (l.clone(), Arc::clone(&kept), Arc::clone(&settled));
            std::thread::spawn(move || {
                for i in 0..400u32 {
                    let d = l.reserve_now(&7, 1).unwrap().unwrap();
                    if !d.allowed {
                        continue;
                    }
                    if i % 2 == 0 {
                        assert!(l.settle(&7, 1, d, 0));
                        settled.fetch_add(1, Ordering::SeqCst);
                    } else {
                        kept.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let more = left(&l, 7);
    let settled = settled.load(Ordering::SeqCst);
    (
        kept.load(Ordering::SeqCst),
        more,
        settled,
        observed.snapshot().allowed,
    )
}

/// `Limiter::settle`: under `Metered`, "the decision's whole estimate, whatever `estimate`
/// says: a hold ends once". An admission of 40 settled through box → observed → forwarder
/// naming an estimate of 10 and a cost of 10 ends the whole hold of 40 and charges 10: 90 left;
/// a minute later everything has drained, nothing stays held.
#[test]
fn a_metered_hold_settled_through_wrappers_with_a_wrong_estimate_ends_whole() {
    let clock = ManualClock::new();
    let inner = keyed::<Metered>(100, &clock);
    let l = BoxLimiter::new(Observed::new("m", Forward(inner.clone())));
    let d = take(&l, 1, 40);
    assert!(l.settle(&1, 10, d, 10));
    assert_eq!(probe(&inner, &1), 90);
    clock.advance(Duration::from_secs(60));
    assert_eq!(probe(&inner, &1), 100, "no hold left behind");
}

/// `Limiter::settle`: "A cost above the most one request can take (`InsufficientCapacity`'s
/// capacity) is charged as that most." 10 a minute, an admission of 1 settled through the
/// stack to `u32::MAX` charges 10 in all: nothing left, the next permit in 6 s, and the key
/// whole again a minute later (not 2^32 / 10 minutes).
#[test]
fn a_settle_to_u32_max_through_wrappers_is_charged_as_the_capacity() {
    let clock = ManualClock::new();
    let inner = keyed::<Gcra>(10, &clock);
    let o = Observed::new("g", Forward(inner.clone()));
    let l = BoxLimiter::new(o.clone());
    let d = take(&l, 1, 1);
    assert!(l.settle(&1, 1, d, u32::MAX));
    assert_eq!(o.snapshot().available_permissions, 0);
    let refused = inner.check(&1);
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Duration::from_secs(6));
    clock.advance(Duration::from_secs(60));
    assert_eq!(left(&inner, 1), 10);
}
