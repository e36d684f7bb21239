//! The in-memory limiters through their public API, with a manual clock: no test sleeps.

use crate::attack_direct::keyed;
use crate::common::for_every_algorithm;
use crate::common::keyed_on;
use crate::common::{in_bursts_of, tokio_direct, tokio_keyed, tokio_keyed_with, waits_up_to};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use tower_bulwark::{
    algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    limiter::Overflow,
    DirectRateLimiter, KeyedRateLimiter, Quota,
};

/// A limiter of algorithm `A` for 10 a second on `clock`.
fn ten_per_second<A: Algorithm>(clock: &ManualClock) -> DirectRateLimiter<A, ManualClock> {
    DirectRateLimiter::builder(Quota::per_second(10).unwrap())
        .algorithm::<A>()
        .clock(clock.clone())
        .build()
}

#[test]
fn resilience4j_scenario_ten_per_second_then_refused_then_admitted() {
    fn run<A: Algorithm>() {
        let clock = ManualClock::new();
        let limiter = ten_per_second::<A>(&clock);
        for i in 0..10 {
            assert!(
                limiter.check().allowed,
                "{}: check {i}",
                std::any::type_name::<A>()
            );
        }
        let refused = limiter.check();
        assert!(!refused.allowed);
        assert!(refused.retry_after > Duration::ZERO);
        assert!(refused.retry_after <= Duration::from_secs(1), "{refused:?}");
        assert_eq!(refused.retry_after_secs(), 1);
        clock.advance(Duration::from_secs(1));
        assert!(limiter.check().allowed, "{}", std::any::type_name::<A>());
    }
    run::<Gcra>();
    run::<FixedWindow>();
    run::<SlidingLog>();
    // The sliding counter's estimate at a window boundary still weighs the whole previous window
    // (⌊10 · W / W⌋ = 10), so one second after the burst it refuses; a nanosecond later the
    // previous window's share rounds down to 9 and one more fits.
    let clock = ManualClock::new();
    let limiter = ten_per_second::<SlidingCounter>(&clock);
    for _ in 0..10 {
        assert!(limiter.check().allowed);
    }
    let refused = limiter.check();
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Duration::from_nanos(1_000_000_001));
    clock.advance(refused.retry_after);
    assert!(limiter.check().allowed);
}

/// Releases `threads` OS threads together; each runs `f` once and the allowed count is returned.
fn race(threads: usize, f: impl Fn(usize) -> bool + Send + Sync + 'static) -> usize {
    let barrier = Arc::new(Barrier::new(threads));
    let f = Arc::new(f);
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let f = Arc::clone(&f);
            thread::spawn(move || {
                barrier.wait();
                f(i)
            })
        })
        .collect();
    let allowed = crate::common::joined(handles);
    allowed.into_iter().filter(|&allowed| allowed).count()
}

fn exact_under_contention<A: Algorithm>(refill: Duration) {
    let name = std::any::type_name::<A>();
    for round in 0..20 {
        let clock = ManualClock::new();
        let limiter = DirectRateLimiter::builder(Quota::per_minute(5).unwrap())
            .algorithm::<A>()
            .clock(clock.clone())
            .build();
        let l = limiter.clone();
        assert_eq!(
            race(20, move |_| l.check().allowed),
            5,
            "{name} round {round}"
        );
        assert!(!limiter.check().allowed, "{name}: one more is refused");
        clock.advance(refill);
        let l = limiter.clone();
        assert_eq!(
            race(20, move |_| l.check().allowed),
            5,
            "{name} after refill"
        );
        assert!(!limiter.check().allowed);
    }
}

#[test]
fn exactly_the_limit_under_contention_for_every_algorithm() {
    exact_under_contention::<Gcra>(Duration::from_secs(60));
    exact_under_contention::<FixedWindow>(Duration::from_secs(60));
    exact_under_contention::<SlidingLog>(Duration::from_secs(60));
    // Two windows: at the first boundary the counter still weighs the previous window fully.
    exact_under_contention::<SlidingCounter>(Duration::from_secs(120));
}

fn keyed_exact_under_contention<A: Algorithm>() {
    let name = std::any::type_name::<A>();
    let clock = ManualClock::new();
    let limiter = KeyedRateLimiter::<u32>::builder(Quota::per_minute(5).unwrap())
        .algorithm::<A>()
        .clock(clock)
        .build();
    // 64 threads over 4 keys: 16 racers per key.
    let counts: Vec<Arc<std::sync::atomic::AtomicUsize>> = (0..4)
        .map(|_| Arc::new(std::sync::atomic::AtomicUsize::new(0)))
        .collect();
    let c = counts.clone();
    let l = limiter.clone();
    let total = race(64, move |i| {
        let key = (i % 4) as u32;
        let allowed = l.check(&key).allowed;
        if allowed {
            c[i % 4].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        allowed
    });
    assert_eq!(total, 20, "{name}");
    for (key, count) in counts.iter().enumerate() {
        assert_eq!(
            count.load(std::sync::atomic::Ordering::SeqCst),
            5,
            "{name} key {key}"
        );
    }
    assert_eq!(limiter.len(), 4);
}

#[test]
fn keyed_limiter_gives_each_key_exactly_its_limit_under_contention() {
    for_every_algorithm!(keyed_exact_under_contention);
}

#[test]
fn clones_share_one_state() {
    let clock = ManualClock::new();
    let a = KeyedRateLimiter::<&str>::builder(Quota::per_second(2).unwrap())
        .clock(clock)
        .build();
    let b = a.clone();
    assert!(a.check(&"k").allowed);
    assert!(b.check(&"k").allowed);
    assert!(!a.check(&"k").allowed);
    assert!(!b.check(&"k").allowed);
}

#[test]
fn weighted_requests_and_costs_beyond_capacity() {
    let clock = ManualClock::new();
    let limiter = keyed_on::<&str, _>(Quota::per_second(10).unwrap(), &clock);
    let d = limiter.check_n(&"k", 7).unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 3);
    let refused = limiter.check_n(&"k", 4).unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.remaining, 3, "a refusal spends nothing");
    assert_eq!(refused.retry_after, Duration::from_millis(100));
    let err = limiter.check_n(&"k", 11).unwrap_err();
    assert_eq!((err.requested(), err.capacity()), (11, 10));
    assert!(err.to_string().contains("capacity of 10"), "{err}");
    for alg_err in [
        DirectRateLimiter::builder(Quota::per_second(3).unwrap())
            .algorithm::<FixedWindow>()
            .build()
            .check_n(4),
        DirectRateLimiter::builder(Quota::per_second(3).unwrap())
            .algorithm::<SlidingLog>()
            .build()
            .check_n(4),
        DirectRateLimiter::builder(Quota::per_second(3).unwrap())
            .algorithm::<SlidingCounter>()
            .build()
            .check_n(4),
    ] {
        assert_eq!(alg_err.unwrap_err().capacity(), 3);
    }
}

#[test]
fn a_refused_request_retried_after_retry_after_is_admitted() {
    let clock = ManualClock::new();
    let limiter = keyed_on::<u8, _>(
        in_bursts_of(
            Quota::with_period(3, Duration::from_millis(900)).unwrap(),
            2,
        ),
        &clock,
    );
    for _ in 0..50 {
        let d = limiter.check(&1);
        if !d.allowed {
            clock.advance(d.retry_after - Duration::from_nanos(1));
            assert!(!limiter.check(&1).allowed, "not a nanosecond early");
            clock.advance(Duration::from_nanos(1));
            assert!(limiter.check(&1).allowed);
        }
    }
}

#[test]
fn a_flood_of_keys_stays_within_max_keys() {
    for overflow in [Overflow::EvictNearestIdle, Overflow::RefuseNewKeys] {
        let clock = ManualClock::new();
        let limiter = KeyedRateLimiter::<u64>::builder(Quota::per_minute(5).unwrap())
            .clock(clock.clone())
            .max_keys(10_000)
            .overflow(overflow)
            .build();
        assert_eq!(limiter.max_keys(), 10_000);
        for key in 0..100_000u64 {
            limiter.check(&key);
        }
        assert!(limiter.len() <= 10_000, "{overflow:?}: {}", limiter.len());
        assert!(limiter.len() >= 9_000, "{overflow:?}: {}", limiter.len());
        // Once every key is idle they are dropped without changing any decision.
        clock.advance(Duration::from_secs(61));
        limiter.retain_recent();
        assert!(limiter.is_empty());
    }
}

#[test]
fn refuse_new_keys_when_full_tells_when_room_frees() {
    let clock = ManualClock::new();
    let limiter = KeyedRateLimiter::<u32>::builder(Quota::per_second(1).unwrap())
        .clock(clock.clone())
        .max_keys(1)
        .overflow(Overflow::RefuseNewKeys)
        .build();
    assert!(limiter.check(&1).allowed);
    let refused = limiter.check(&2);
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Duration::from_secs(1));
    clock.advance(Duration::from_secs(1));
    assert!(limiter.check(&2).allowed, "key 1 went idle and made room");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_admitted_exactly_when_its_reservation_falls_due() {
    let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(2));
    let limiter = tokio_keyed::<u8>(quota);
    let start = tokio::time::Instant::now();
    assert!(limiter.acquire(&7).await.unwrap().allowed);
    assert_eq!(start.elapsed(), Duration::ZERO);
    let d = limiter.acquire(&7).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.wait, Duration::from_secs(1));
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let d = limiter.acquire(&7).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert!(d.allowed);
    // Two waiters reserve the next two slots (1 s and 2 s away); a third would wait 3 s, more
    // than max_wait, so it is refused at once and reserves nothing.
    let w1 = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(&7).await.unwrap() }
    });
    let w2 = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(&7).await.unwrap() }
    });
    tokio::task::yield_now().await;
    let before = tokio::time::Instant::now();
    let refused = limiter.acquire(&7).await.unwrap();
    assert_eq!(before.elapsed(), Duration::ZERO, "refused at once");
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Duration::from_secs(3));
    assert_eq!(w1.await.unwrap().wait, Duration::from_secs(1));
    assert_eq!(w2.await.unwrap().wait, Duration::from_secs(2));
    assert_eq!(start.elapsed(), Duration::from_secs(4));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_its_permit_back() {
    async fn run<A: Algorithm>() {
        let name = std::any::type_name::<A>();
        let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(5));
        let limiter = tokio_keyed_with::<&str, A>(quota);
        let start = tokio::time::Instant::now();
        assert!(limiter.acquire(&"k").await.unwrap().allowed);
        // This waiter gives up after 100 ms; its future is dropped while it waits.
        let gave_up = tokio::time::timeout(Duration::from_millis(100), limiter.acquire(&"k")).await;
        assert!(gave_up.is_err(), "{name}");
        // The next caller gets the slot the dropped waiter held, not the one after it.
        let d = limiter.acquire(&"k").await.unwrap();
        assert!(d.allowed, "{name}");
        assert_eq!(start.elapsed(), Duration::from_secs(1), "{name}");
    }
    run::<Gcra>().await;
    run::<FixedWindow>().await;
    run::<SlidingLog>().await;
}

#[tokio::test(start_paused = true)]
async fn direct_limiter_waits_and_refunds_too() {
    let quota = waits_up_to(Quota::per_second(2).unwrap(), Duration::from_millis(500));
    let limiter = tokio_direct(quota);
    let start = tokio::time::Instant::now();
    assert!(limiter.acquire().await.unwrap().allowed);
    assert!(limiter.acquire().await.unwrap().allowed);
    assert_eq!(start.elapsed(), Duration::ZERO);
    let d = limiter.acquire().await.unwrap();
    assert!(d.allowed);
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    let err = tower_bulwark::limiter::acquire(&limiter, &(), 3)
        .await
        .unwrap_err();
    assert!(
        err.is::<tower_bulwark::limiter::InsufficientCapacity>(),
        "{err}"
    );
}

/// "New keys are refused until a slot frees, at most until the nearest key goes idle": a refund
/// that leaves a key idle frees its slot at once. One slot, one request an hour: key 1 is
/// admitted and key 2 refused for the hour; key 1's admission is given back (another policy
/// vetoed it), and a millisecond later key 2 is admitted. Every algorithm.
#[test]
fn a_refund_that_leaves_a_key_idle_frees_its_slot_for_new_keys() {
    fn check<A: Algorithm>() {
        use tower_bulwark::Limiter;
        let clock = ManualClock::new();
        let limiter = KeyedRateLimiter::<u32>::builder(Quota::per_hour(1).unwrap())
            .algorithm::<A>()
            .clock(clock.clone())
            .max_keys(1)
            .overflow(Overflow::RefuseNewKeys)
            .build();
        let admitted = limiter.check(&1);
        assert!(admitted.allowed);
        let refused = limiter.check(&2);
        // Until key 1 goes idle: an hour, two windows for the sliding counter.
        assert!(!refused.allowed && refused.retry_after >= Duration::from_secs(3600));
        limiter.refund(&1, 1, admitted);
        clock.advance(Duration::from_millis(1));
        let next = limiter.check(&2);
        assert!(
            next.allowed,
            "{}: refused for {:?}",
            std::any::type_name::<A>(),
            next.retry_after
        );
    }
    for_every_algorithm!(check);
}

/// A request of cost zero takes nothing, under every algorithm alike: it is admitted with the
/// whole quota left and nothing to reset, and leaves nothing that keeps its key (the sliding
/// log wrote an entry of zero permits, which said a reset of a whole window and held the key
/// for it).
#[test]
fn a_request_of_cost_zero_leaves_nothing_behind() {
    fn check<A: Algorithm>() {
        let clock = ManualClock::new();
        let limiter = keyed::<A, _>(
            Quota::per_second(10).unwrap(),
            clock.clone(),
            1_000,
            Overflow::EvictNearestIdle,
        );
        let name = std::any::type_name::<A>();
        let decision = limiter.check_n(&1, 0).unwrap();
        assert!(decision.allowed, "{name}");
        assert_eq!(
            (decision.remaining, decision.reset_after),
            (10, Duration::ZERO),
            "{name}"
        );
        clock.advance(Duration::from_nanos(1));
        limiter.retain_recent();
        assert!(limiter.is_empty(), "{name}: a key kept");
    }
    for_every_algorithm!(check);
}

/// `KeyedRateLimiter::retain_recent`: "No decision changes", with readings out of order too. A
/// key decided at 10 s and given back (nothing weighs on it) while a sweep reads 9.99 s (a
/// request decided while the sweep ran, on another thread): a stale reading of 9.995 s that
/// comes next is decided as of 10 s on the kept key, so the swept limiter must decide it so
/// too. Every algorithm; GCRA kept such a key before, the others dropped it and decided the
/// stale reading as of 9.995 s (the fixed window's reset then ended with cycle 9, 5 ms away).
#[test]
fn a_sweep_behind_a_key_s_latest_reading_changes_no_decision() {
    fn check<A: Algorithm>() {
        use crate::attack_direct::Dial;
        use tower_bulwark::Limiter;
        let dial = Dial::at(0);
        let make = || {
            keyed::<A, _>(
                Quota::per_second(10).unwrap(),
                dial.clone(),
                1_000,
                Overflow::EvictNearestIdle,
            )
        };
        let (swept, kept) = (make(), make());
        let name = std::any::type_name::<A>();
        dial.set(10_000_000_000);
        for limiter in [&swept, &kept] {
            let decision = limiter.check(&1);
            assert!(Limiter::refund(limiter, &1, 1, decision), "{name}");
        }
        dial.set(9_990_000_000);
        swept.retain_recent();
        dial.set(9_995_000_000);
        let (a, b) = (swept.check(&1), kept.check(&1));
        assert_eq!(
            (a.allowed, a.remaining, a.reset_after),
            (b.allowed, b.remaining, b.reset_after),
            "{name}"
        );
    }
    for_every_algorithm!(check);
    check::<tower_bulwark::algorithm::Metered>();
}
