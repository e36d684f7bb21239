//! The refund contract through the public [`Limiter::refund`]: "no more than the request took is
//! ever given back" (`Algorithm::refund`). A refund consumes its decision (a `Decision` is neither
//! `Copy` nor `Clone`), so giving one back twice does not compile (the `compile_fail` example on
//! `Limiter::refund`); a decision remembers the cost it was asked for, so a caller naming a larger
//! cost gets back only that; it remembers its key, so giving it back under another key frees
//! nothing there; and it remembers the limiter that made it, so giving it to any other limiter
//! (direct, keyed, another tier, even one of the same quota and clock whose state it matches
//! exactly) frees nothing there, and neither does a decision built by hand. Clones of a limiter
//! share its state and take back each other's decisions. Each algorithm, in memory here and in
//! Redis in `tests/redis/refund.rs`.

use crate::common::for_every_algorithm;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use tower_bulwark::{
    algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    limiter::Decision,
    tiers::Tiers,
    DirectRateLimiter, KeyedRateLimiter, Limiter, Quota,
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

/// Runs `run::<A>()` for every algorithm `A` (it answers what the limiter admits afterwards)
/// and asserts that each admits `expected` (a pair where the run answers for a direct and a
/// keyed limiter), naming every algorithm that does not.
macro_rules! assert_each_admits {
    ($run:ident, $expected:expr) => {{
        let got = [
            (name::<Gcra>(), $run::<Gcra>()),
            (name::<FixedWindow>(), $run::<FixedWindow>()),
            (name::<SlidingLog>(), $run::<SlidingLog>()),
            (name::<SlidingCounter>(), $run::<SlidingCounter>()),
        ];
        let bad: Vec<String> = got
            .iter()
            .filter(|(_, admitted)| *admitted != $expected)
            .map(|(algorithm, admitted)| format!("{algorithm}: {admitted:?} admitted"))
            .collect();
        assert!(bad.is_empty(), "{bad:?}");
    }};
}

/// Four admitted; the last (cost 1) given back with a cost of 3: one permit is free, not three.
#[test]
fn a_refund_with_a_larger_cost_frees_only_what_was_charged() {
    fn run<A: Algorithm>() -> usize {
        let (l, _clock) = limiter::<A>();
        let mut last = None;
        for _ in 0..4 {
            last = Some(l.check(&1));
        }
        l.refund(&1, 3, last.unwrap());
        admitted_now(&l, 1)
    }
    assert_each_admits!(run, 1);
}

/// Key 1 spends its quota; key 2's admission is given back to key 1: key 1 gains nothing.
#[test]
fn a_decision_given_back_to_another_key_frees_nothing_there() {
    fn run<A: Algorithm>() -> usize {
        let (l, _clock) = limiter::<A>();
        assert_eq!(admitted_now(&l, 1), 4);
        let other = l.check(&2);
        assert!(other.allowed);
        l.refund(&1, 1, other);
        admitted_now(&l, 1)
    }
    assert_each_admits!(run, 0);
}

/// Held: a refusal given back (any number of times) frees nothing.
#[test]
fn a_refusal_given_back_frees_nothing() {
    fn run<A: Algorithm>() -> usize {
        let (l, _clock) = limiter::<A>();
        assert_eq!(admitted_now(&l, 1), 4);
        for _ in 0..3 {
            let refused = l.check(&1);
            assert!(!refused.allowed);
            l.refund(&1, 4, refused);
        }
        admitted_now(&l, 1)
    }
    assert_each_admits!(run, 0);
}

/// Five per hour: nothing refills during a test.
fn five_per_hour() -> Quota {
    Quota::per_hour(5).unwrap()
}

fn direct<A: Algorithm>(clock: &ManualClock) -> DirectRateLimiter<A, ManualClock> {
    DirectRateLimiter::builder(five_per_hour())
        .algorithm::<A>()
        .clock(clock.clone())
        .build()
}

/// A hasher that hashes every key to zero: the fingerprint of every key is then the one a
/// direct limiter gives its decisions, and two such limiters fingerprint every key alike.
#[derive(Default)]
struct Zero;

impl Hasher for Zero {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, _: &[u8]) {}
}

type ZeroHashed<A> = KeyedRateLimiter<u64, A, ManualClock, BuildHasherDefault<Zero>>;

fn keyed_zero_hashed<A: Algorithm>(clock: &ManualClock) -> ZeroHashed<A> {
    KeyedRateLimiter::<u64>::builder(five_per_hour())
        .algorithm::<A>()
        .clock(clock.clone())
        .hasher(BuildHasherDefault::<Zero>::default())
        .build()
}

fn direct_admits<A: Algorithm>(l: &DirectRateLimiter<A, ManualClock>) -> usize {
    (0..10).filter(|_| l.check().allowed).count()
}

fn keyed_admits<A: Algorithm>(l: &ZeroHashed<A>, key: u64) -> usize {
    (0..10).filter(|_| l.check(&key).allowed).count()
}

/// Spends three permits of a limiter through `check`, asserting each is admitted.
fn spend_three(mut check: impl FnMut() -> Decision) {
    for _ in 0..3 {
        assert!(check().allowed);
    }
}

/// Admits three through `spend` and takes three through `take` in step, at one instant (so
/// two limiters built alike end in the same state), and answers the last decision of `take`.
fn last_of_three_in_step(
    mut spend: impl FnMut() -> Decision,
    mut take: impl FnMut() -> Decision,
) -> Decision {
    let mut last = None;
    for _ in 0..3 {
        assert!(spend().allowed);
        last = Some(take());
    }
    last.unwrap()
}

/// Gives the admission `decision` (of another limiter) back to the direct limiter `b`, with a
/// cost of 1, and answers how many `b` admits then.
fn direct_admits_after_refund<A: Algorithm>(
    b: &DirectRateLimiter<A, ManualClock>,
    decision: Decision,
) -> usize {
    assert!(decision.allowed);
    Limiter::<()>::refund(b, &(), 1, decision);
    direct_admits(b)
}

/// Two direct limiters `a` and `b` of 5 per hour, `b` having admitted 3: an admission of `a`
/// given to `b` leaves `b` its 2 permits, not 3.
#[test]
fn a_direct_limiters_decision_given_to_another_direct_limiter_frees_nothing() {
    fn run<A: Algorithm>() -> usize {
        let clock = ManualClock::new();
        let (a, b) = (direct::<A>(&clock), direct::<A>(&clock));
        spend_three(|| b.check());
        direct_admits_after_refund(&b, a.check())
    }
    assert_each_admits!(run, 2);
}

/// The hardest case for a check by state alone: `a` and `b` built alike on one clock, each
/// admitting 3 at the same instant, so `a`'s last decision describes `b`'s state exactly (for
/// GCRA, the very TAT `b` holds). Given to `b`, it still frees nothing.
#[test]
fn a_decision_matching_another_limiters_state_exactly_frees_nothing_there() {
    fn run<A: Algorithm>() -> usize {
        let clock = ManualClock::new();
        let (a, b) = (direct::<A>(&clock), direct::<A>(&clock));
        let last_of_a = last_of_three_in_step(|| b.check(), || a.check());
        Limiter::<()>::refund(&b, &(), 1, last_of_a);
        direct_admits(&b)
    }
    assert_each_admits!(run, 2);
}

/// A keyed limiter's admission given to a direct limiter frees nothing, even when the keyed
/// limiter fingerprints its key as zero, as a direct limiter does.
#[test]
fn a_keyed_decision_given_to_a_direct_limiter_frees_nothing() {
    fn run<A: Algorithm>() -> usize {
        let clock = ManualClock::new();
        let (keyed, b) = (keyed_zero_hashed::<A>(&clock), direct::<A>(&clock));
        spend_three(|| b.check());
        direct_admits_after_refund(&b, keyed.check(&7))
    }
    assert_each_admits!(run, 2);
}

/// A direct limiter's admission given to a keyed limiter frees nothing, even when the keyed
/// limiter fingerprints every key as zero, as the direct limiter's decision says.
#[test]
fn a_direct_decision_given_to_a_keyed_limiter_frees_nothing() {
    fn run<A: Algorithm>() -> usize {
        let clock = ManualClock::new();
        let (a, keyed) = (direct::<A>(&clock), keyed_zero_hashed::<A>(&clock));
        spend_three(|| keyed.check(&7));
        let from_a = a.check();
        assert!(from_a.allowed);
        keyed.refund(&7, 1, from_a);
        keyed_admits(&keyed, 7)
    }
    assert_each_admits!(run, 2);
}

/// Two keyed limiters that fingerprint the key alike (same hasher, same key, same state): the
/// admission of one given to the other frees nothing.
#[test]
fn a_keyed_decision_given_to_another_keyed_limiter_frees_nothing() {
    fn run<A: Algorithm>() -> usize {
        let clock = ManualClock::new();
        let (a, b) = (
            keyed_zero_hashed::<A>(&clock),
            keyed_zero_hashed::<A>(&clock),
        );
        let last_of_a = last_of_three_in_step(|| b.check(&7), || a.check(&7));
        b.refund(&7, 1, last_of_a);
        keyed_admits(&b, 7)
    }
    assert_each_admits!(run, 2);
}

/// Decisions built by hand (`Decision::allowed`) belong to no limiter: given to a direct or a
/// keyed limiter (with any cost, under the key a zero hasher fingerprints as the built decision
/// says), they free nothing.
#[test]
fn a_decision_built_by_hand_frees_nothing() {
    fn run<A: Algorithm>() -> (usize, usize) {
        let clock = ManualClock::new();
        let (b, keyed) = (direct::<A>(&clock), keyed_zero_hashed::<A>(&clock));
        spend_three(|| b.check());
        spend_three(|| keyed.check(&7));
        for cost in [1, 3, u32::MAX] {
            let built = Decision::allowed(5, 4, Duration::from_secs(720));
            Limiter::<()>::refund(&b, &(), cost, built);
            let built = Decision::allowed(5, 4, Duration::from_secs(720));
            keyed.refund(&7, cost, built);
        }
        (direct_admits(&b), keyed_admits(&keyed, 7))
    }
    assert_each_admits!(run, (2, 2));
}

/// Clones share their limiter's state, so they share its identity: an admission made through
/// one clone and given back through another frees its permit, direct and keyed.
#[test]
fn clones_of_a_limiter_take_back_each_others_decisions() {
    fn run<A: Algorithm>() -> (usize, usize) {
        let clock = ManualClock::new();
        let (b, keyed) = (direct::<A>(&clock), keyed_zero_hashed::<A>(&clock));
        let (b_clone, keyed_clone) = (b.clone(), keyed.clone());
        let mut last = None;
        let mut last_keyed = None;
        for _ in 0..3 {
            last = Some(b.check());
            last_keyed = Some(keyed.check(&7));
        }
        Limiter::<()>::refund(&b_clone, &(), 1, last.unwrap());
        keyed_clone.refund(&7, 1, last_keyed.unwrap());
        (direct_admits(&b), keyed_admits(&keyed, 7))
    }
    assert_each_admits!(run, (3, 3));
}

fn plans<A: Algorithm>(clock: &ManualClock) -> Tiers<u64, &'static str, ZeroHashed<A>> {
    Tiers::new(
        |key: &u64| if *key >= 100 { "pro" } else { "free" },
        "free",
        keyed_zero_hashed::<A>(clock),
    )
    .tier("pro", keyed_zero_hashed::<A>(clock))
}

fn tier_admits<A: Algorithm>(tiers: &Tiers<u64, &'static str, ZeroHashed<A>>, key: u64) -> usize {
    (0..10)
        .filter(|_| tiers.reserve_now(&key, 1).unwrap().unwrap().allowed)
        .count()
}

/// Each tier is its own limiter. Key 7 (free) spends 3 of its 5 through the tiers; then:
/// * a decision of the "pro" limiter made outside the tiers names no tier, which reads as the
///   first ("free"), so it reaches the free limiter (key 7, fingerprinted alike): it frees
///   nothing there;
/// * a decision of another set of tiers built alike, for the same key: frees nothing;
/// * the tiers' own last decision for key 7 goes back to the free tier and frees its permit
///   (so the two above are refused for who made them, not for how they travel).
#[test]
fn a_decision_of_one_tier_given_back_to_another_frees_nothing() {
    fn run<A: Algorithm>() -> usize {
        let clock = ManualClock::new();
        let (tiers, other_tiers) = (plans::<A>(&clock), plans::<A>(&clock));
        let pro = tiers.get(&"pro").unwrap();
        let mut own = None;
        for _ in 0..3 {
            own = Some(tiers.reserve_now(&7, 1).unwrap().unwrap());
        }
        let from_pro = pro.check(&7);
        let from_other_tiers = other_tiers.reserve_now(&7, 1).unwrap().unwrap();
        assert!(from_pro.allowed && from_other_tiers.allowed);
        tiers.refund(&7, 1, from_pro);
        tiers.refund(&7, 1, from_other_tiers);
        tiers.refund(&7, 1, own.unwrap());
        tier_admits(&tiers, 7)
    }
    assert_each_admits!(run, 3);
}

/// A Redis limiter tells its decisions apart by the fingerprint of the Redis key they charged.
/// A keyed limiter in memory that hashes as that fingerprint does (std's `DefaultHasher` under
/// zero keys), given the Redis key itself as its key, makes decisions whose fingerprint is the
/// Redis key's: given to the Redis limiter, they still free nothing there, and neither does a
/// decision built by hand or one of a direct limiter.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_decision_of_an_in_memory_limiter_frees_nothing_in_redis() {
    use crate::common::redis_server::uncached;
    use std::collections::hash_map::DefaultHasher;
    use tower_bulwark::redis::{RedisAlgorithm, RedisStore};

    async fn run<A: RedisAlgorithm>(store: &RedisStore, tag: &str) -> Option<String> {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(1));
        let redis = uncached::<A>(store, five_per_hour(), &clock, &format!("misuse:{tag}:"));
        let same_fingerprint = KeyedRateLimiter::<String>::builder(five_per_hour())
            .algorithm::<A>()
            .clock(clock.clone())
            .hasher(BuildHasherDefault::<DefaultHasher>::default())
            .build();
        let direct = direct::<A>(&clock);
        let mut last = None;
        for _ in 0..3 {
            last = Some(redis.reserve(&"k", 1).await.unwrap());
        }
        assert!(last.is_some_and(|d| d.allowed));
        let redis_key = redis.redis_key(&"k");
        for _ in 0..3 {
            let from_memory = same_fingerprint.check(&redis_key);
            assert!(from_memory.allowed);
            redis
                .settle_and_wait(&"k", 1, from_memory, 0)
                .await
                .unwrap();
        }
        let built = Decision::allowed(5, 4, Duration::from_secs(720));
        redis.settle_and_wait(&"k", 1, built, 0).await.unwrap();
        redis
            .settle_and_wait(&"k", 1, direct.check(), 0)
            .await
            .unwrap();
        let mut got = 0;
        while got < 10 && redis.reserve(&"k", 1).await.unwrap().allowed {
            got += 1;
        }
        (got != 2).then(|| format!("{tag}: {got} admitted"))
    }

    let Some(server) = crate::common::redis_server::RedisServer::start("refund_misuse_redis")
    else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut bad = Vec::new();
    bad.extend(run::<Gcra>(&store, "gcra").await);
    bad.extend(run::<FixedWindow>(&store, "fixed").await);
    bad.extend(run::<SlidingLog>(&store, "log").await);
    bad.extend(run::<SlidingCounter>(&store, "counter").await);
    assert!(bad.is_empty(), "{bad:?}");
}

/// What `Limiter::refund` says of keys that collide: a keyed limiter tells keys apart by their
/// hash under its hasher and by the entry each key has in its store. A decision given back
/// under another key is not taken back (`false`, nothing freed), with the default hasher and
/// with a hasher that gives every key one hash alike, for every algorithm.
#[test]
fn a_refund_under_another_key_is_told_apart_by_the_limiters_hasher() {
    fn run<A: Algorithm>() {
        let (l, _clock) = limiter::<A>();
        let one = l.check(&1);
        assert!(one.allowed);
        assert!(!l.refund(&2, 1, one), "{}: the default hasher", name::<A>());
        let clock = ManualClock::new();
        let zero = keyed_zero_hashed::<A>(&clock);
        let one = zero.check(&1);
        for _ in 0..5 {
            zero.check(&2);
        }
        assert!(!zero.check(&2).allowed);
        assert!(
            !zero.refund(&2, 1, one),
            "{}: one hash for every key",
            name::<A>()
        );
        assert!(!zero.check(&2).allowed, "{}: freed", name::<A>());
    }
    for_every_algorithm!(run);
}
