//! Quotas changed at run time: every key keeps what it has used, for every algorithm; decisions
//! racing changes never admit more than the larger quota allows; a layer built before a change
//! advertises the new quota; a Redis limiter's change applies to its script calls.

use crate::common::dial::Dial;
use crate::common::for_every_algorithm;
use crate::common::keyed_on;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::algorithm::Algorithm;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::observe::Observed;
use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    DirectRateLimiter, KeyedRateLimiter, Limiter, Quota,
};

const MS: Duration = Duration::from_millis(1);

fn per(permits: u32, period: Duration) -> Quota {
    Quota::with_period(permits, period).unwrap()
}

fn keyed<A: Algorithm>(quota: Quota, clock: &ManualClock) -> KeyedRateLimiter<u32, A, ManualClock> {
    KeyedRateLimiter::builder(quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .build()
}

/// How many of `n` checks of `key`, made now, are admitted.
fn admitted<A: Algorithm>(
    limiter: &KeyedRateLimiter<u32, A, ManualClock>,
    key: u32,
    n: u32,
) -> u32 {
    (0..n).filter(|_| limiter.check(&key).allowed).count() as u32
}

/// 9 of 10 used, then the quota becomes 20 with the same emission interval (20 per 2 s): 11
/// are left, not 20; a key never seen gets the whole new quota; a clone sees the change.
fn nine_of_ten_then_twenty<A: Algorithm>() {
    let clock = ManualClock::new();
    clock.advance(300 * MS);
    let limiter = keyed::<A>(per(10, Duration::from_secs(1)), &clock);
    let clone = limiter.clone();
    assert_eq!(admitted(&limiter, 1, 9), 9);
    clock.advance(10 * MS);
    clone.set_quota(per(20, Duration::from_secs(2)));
    assert_eq!(limiter.quota(), per(20, Duration::from_secs(2)));
    let first = limiter.check(&1);
    assert!(first.allowed);
    assert_eq!(first.limit, 20);
    assert_eq!(first.remaining, 10, "{}", std::any::type_name::<A>());
    assert_eq!(
        admitted(&limiter, 1, 100),
        10,
        "{}",
        std::any::type_name::<A>()
    );
    assert_eq!(
        admitted(&limiter, 2, 100),
        20,
        "{}",
        std::any::type_name::<A>()
    );
}

#[test]
fn a_key_keeps_what_it_used_when_its_quota_grows_for_every_algorithm() {
    for_every_algorithm!(nine_of_ten_then_twenty);
}

/// 9 of 10 used, then the quota drops to 5: nothing is left now.
fn nine_of_ten_then_five<A: Algorithm>() {
    let clock = ManualClock::new();
    let limiter = keyed::<A>(per(10, Duration::from_secs(1)), &clock);
    assert_eq!(admitted(&limiter, 1, 9), 9);
    limiter.set_quota(per(5, Duration::from_secs(1)));
    let refused = limiter.check(&1);
    assert!(!refused.allowed, "{}", std::any::type_name::<A>());
    assert_eq!(refused.limit, 5);
    assert!(!refused.retry_after.is_zero());
    assert_eq!(admitted(&limiter, 2, 100), 5);
}

#[test]
fn a_key_that_used_more_than_a_lowered_quota_is_refused_for_every_algorithm() {
    for_every_algorithm!(nine_of_ten_then_five);
}

/// 10 of 10 per 30 minutes spent at one instant, then the quota becomes 10 an hour (a longer
/// emission interval, the same permits): how many more a keyed and a direct limiter admit at
/// that instant.
fn spent_then_a_longer_period<A: Algorithm>() -> (u32, u32) {
    let (clock, longer) = (ManualClock::new(), per(10, Duration::from_secs(3600)));
    clock.advance(Duration::from_secs(42));
    let keyed = keyed::<A>(per(10, Duration::from_secs(1800)), &clock);
    let direct = (DirectRateLimiter::builder(per(10, Duration::from_secs(1800))))
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    let direct_admitted = |n: u32| (0..n).filter(|_| direct.check().allowed).count() as u32;
    assert_eq!((admitted(&keyed, 1, 20), direct_admitted(20)), (10, 10));
    keyed.set_quota(longer);
    direct.set_quota(longer);
    (admitted(&keyed, 1, 20), direct_admitted(20))
}

/// `KeyedRateLimiter::set_quota`: "In the window of the change a key is admitted at most the
/// larger of the two quotas": a key that spent its quota gets nothing more at the instant its
/// period lengthens (found by a blind attack, which held for these algorithms).
#[test]
fn a_spent_key_gets_nothing_more_when_its_period_lengthens() {
    use tower_bulwark::algorithm::Metered;
    assert_eq!(spent_then_a_longer_period::<FixedWindow>(), (0, 0));
    assert_eq!(spent_then_a_longer_period::<SlidingLog>(), (0, 0));
    assert_eq!(spent_then_a_longer_period::<SlidingCounter>(), (0, 0));
    assert_eq!(spent_then_a_longer_period::<Metered>(), (0, 0));
}

/// The same for GCRA, which keeps what a key owes as time across a change of emission interval
/// (`Gcra`'s docs): the half hour the key owes weighs 5 permits of 10 an hour, so 5 more come at
/// the instant of the change, 15 where either quota admits 10 at once. Kept as the known limit
/// `set_quota`'s docs state.
#[test]
#[ignore = "known limit: GCRA keeps a key's debt as time across a change of emission interval; \
            10 of 10 per 30 min spent, the quota becomes 10 an hour: 5 more at that instant"]
fn gcra_a_spent_key_gets_nothing_more_when_its_period_lengthens() {
    assert_eq!(spent_then_a_longer_period::<Gcra>(), (0, 0));
}

#[test]
fn gcra_keeps_the_tat_when_the_emission_interval_changes() {
    let clock = ManualClock::new();
    let limiter = keyed::<Gcra>(per(10, Duration::from_secs(1)), &clock);
    // 9 admissions put the TAT 900 ms ahead.
    assert_eq!(admitted(&limiter, 1, 9), 9);
    // 20 per second: the 100 ms left before the horizon hold two 50 ms intervals.
    limiter.set_quota(per(20, Duration::from_secs(1)));
    assert_eq!(admitted(&limiter, 1, 100), 2);
    // The TAT now lies 1 s ahead; 50 ms later one interval is free again.
    clock.advance(50 * MS);
    assert_eq!(admitted(&limiter, 1, 100), 1);
}

/// 10 used of 10 per second at 400 ms; the period becomes 3 s: the window [0 s, 1 s) becomes
/// [0 s, 3 s) and keeps its 10. At 3 s the next window brings 10 (the sliding counter weighs the
/// previous window in: at the very start of the next, all 10 of it, so `at_three` is 0 there).
fn longer_period<A: Algorithm>(at_three: u32) {
    let clock = ManualClock::new();
    let limiter = keyed::<A>(per(10, Duration::from_secs(1)), &clock);
    let name = std::any::type_name::<A>();
    clock.advance(400 * MS);
    assert_eq!(admitted(&limiter, 1, 20), 10);
    limiter.set_quota(per(10, Duration::from_secs(3)));
    clock.set(Duration::from_millis(1500));
    assert_eq!(admitted(&limiter, 1, 20), 0, "{name}");
    clock.set(Duration::from_millis(2999));
    assert_eq!(admitted(&limiter, 1, 20), 0, "{name}");
    clock.set(Duration::from_secs(3));
    assert_eq!(admitted(&limiter, 1, 20), at_three, "{name}");
}

#[test]
fn a_longer_period_keeps_the_window_in_progress_and_lengthens_it() {
    longer_period::<FixedWindow>(10);
    longer_period::<SlidingCounter>(0);
}

#[test]
fn a_shorter_period_ends_the_window_in_progress_no_later_than_its_new_length() {
    let clock = ManualClock::new();
    let limiter = keyed::<FixedWindow>(per(10, Duration::from_secs(10)), &clock);
    clock.advance(Duration::from_secs(1));
    assert_eq!(admitted(&limiter, 1, 20), 10);
    // At 4 s the window [0 s, 10 s) would end at 0 s + 2 s, already past: it ends now. Its 10
    // stay used: 3 per window of 2 s pay them off, 7 of them at 4 s, 4 at 6 s, 1 at 8 s.
    clock.set(Duration::from_secs(4));
    limiter.set_quota(per(3, Duration::from_secs(2)));
    assert_eq!(admitted(&limiter, 1, 20), 0);
    clock.set(Duration::from_secs(6));
    assert_eq!(admitted(&limiter, 1, 20), 0);
    clock.set(Duration::from_secs(8));
    assert_eq!(admitted(&limiter, 1, 20), 2);
    clock.set(Duration::from_millis(9999));
    assert_eq!(admitted(&limiter, 1, 20), 0);
    clock.set(Duration::from_secs(10));
    assert_eq!(admitted(&limiter, 1, 20), 3);
    // Within 2 s after its start: the window [0 s, 10 s) becomes [0 s, 2 s), and keeps its count.
    let clock = ManualClock::new();
    let limiter = keyed::<FixedWindow>(per(10, Duration::from_secs(10)), &clock);
    clock.advance(500 * MS);
    assert_eq!(admitted(&limiter, 1, 4), 4);
    limiter.set_quota(per(5, Duration::from_secs(2)));
    assert_eq!(admitted(&limiter, 1, 20), 1);
    clock.set(Duration::from_millis(1999));
    assert_eq!(admitted(&limiter, 1, 20), 0);
    clock.set(Duration::from_secs(2));
    assert_eq!(admitted(&limiter, 1, 20), 5);
}

#[test]
fn a_direct_limiter_keeps_its_state_across_a_change() {
    let clock = ManualClock::new();
    let limiter = DirectRateLimiter::builder(per(10, Duration::from_secs(1)))
        .algorithm::<SlidingLog>()
        .clock(clock.clone())
        .build();
    assert_eq!((0..9).filter(|_| limiter.check().allowed).count(), 9);
    Limiter::<()>::set_quota(&limiter.clone(), per(20, Duration::from_secs(1))).unwrap();
    assert_eq!(Limiter::<()>::quota(&limiter).permits(), 20);
    assert_eq!((0..100).filter(|_| limiter.check().allowed).count(), 11);
}

/// What three checks of one key say (allowed, remaining, retry, reset) on a keyed and a direct
/// limiter of `A` that admitted one at 100 ms under 1 a second, changed to 2 per 2 s at 1.5 s
/// (and again at 1 s), then read the clock at `read_ms`.
fn checks_after_a_change<A: Algorithm>(read_ms: u64) -> Vec<(bool, u64, Duration, Duration)> {
    let (keyed_clock, direct_clock) = (Dial::at(100_000_000), Dial::at(100_000_000));
    let keyed = KeyedRateLimiter::<u32>::builder(per(1, Duration::from_secs(1)))
        .algorithm::<A>()
        .clock(keyed_clock.clone())
        .build();
    let direct = DirectRateLimiter::builder(per(1, Duration::from_secs(1)))
        .algorithm::<A>()
        .clock(direct_clock.clone())
        .build();
    assert!(keyed.check(&0).allowed && direct.check().allowed);
    keyed_clock.set(1_500_000_000);
    direct_clock.set(1_500_000_000);
    keyed.set_quota(per(2, Duration::from_secs(2)));
    direct.set_quota(per(2, Duration::from_secs(2)));
    // Made again by a thread whose reading is older: the floor stays at the first change.
    keyed_clock.set(1_000_000_000);
    direct_clock.set(1_000_000_000);
    keyed.set_quota(per(2, Duration::from_secs(2)));
    direct.set_quota(per(2, Duration::from_secs(2)));
    keyed_clock.set(read_ms * 1_000_000);
    direct_clock.set(read_ms * 1_000_000);
    let said = |d: tower_bulwark::limiter::Decision| {
        (d.allowed, d.remaining, d.retry_after, d.reset_after)
    };
    (0..3)
        .map(|_| said(keyed.check(&0)))
        .chain((0..3).map(|_| said(direct.check())))
        .collect()
}

/// `KeyedRateLimiter::set_quota`: "A request whose clock reading is older than the change ...
/// is decided as of the change": a reading of 900 ms after a change read at 1.5 s (a thread
/// that read its clock before the change) is decided as a reading of 1.5 s is, not within the
/// cycle or window of the admission at 100 ms under the old quota.
fn a_stale_reading_is_decided_as_of_a_change<A: Algorithm>() {
    assert_eq!(
        checks_after_a_change::<A>(900),
        checks_after_a_change::<A>(1_500),
        "{}",
        std::any::type_name::<A>()
    );
}

#[test]
fn a_reading_older_than_a_change_of_quota_is_decided_as_of_the_change_for_every_algorithm() {
    for_every_algorithm!(a_stale_reading_is_decided_as_of_a_change);
}

#[test]
fn a_change_through_the_boxed_and_observed_limiter_reaches_the_limiter() {
    let clock = ManualClock::new();
    let limiter = keyed::<FixedWindow>(per(10, Duration::from_secs(1)), &clock);
    let observed = Observed::new("api", BoxLimiter::new(limiter.clone()));
    observed.set_quota(per(3, Duration::from_secs(1))).unwrap();
    assert_eq!(limiter.quota().permits(), 3);
    assert_eq!(observed.quota().permits(), 3);
    assert_eq!(admitted(&limiter, 7, 10), 3);
}

/// Runs `flip` while `threads` threads each call `decide` with their index, over and over until
/// `flip` has returned: the permits the calls answered that they took, in all.
fn taken_while(threads: u64, decide: impl Fn(u64) -> u64 + Sync, flip: impl FnOnce()) -> u64 {
    let taken = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (taken, done, decide) = (&taken, &done, &decide);
            s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    taken.fetch_add(decide(t), Ordering::Relaxed);
                }
            });
        }
        flip();
        done.store(true, Ordering::Relaxed);
    });
    taken.into_inner()
}

/// Threads take single permits and pairs of one key, at one instant, while another thread
/// flips the quota between 10 per second and 20 per 2 s (the same emission interval, so that
/// GCRA counts exactly too): the key never holds more than 20, and once the quota stays at 20,
/// what it took during the race and what is left add up to exactly 20. On a keyed limiter's key
/// (the rule under its shard's lock) and on a direct limiter (the rule copied out of its cell).
fn racing_changes_at_one_instant<A: Algorithm>() {
    let clock = ManualClock::new();
    clock.advance(250 * MS);
    let small = per(10, Duration::from_secs(1));
    let keyed = keyed::<A>(small, &clock);
    let direct = DirectRateLimiter::builder(small).algorithm::<A>();
    let direct = direct.clock(clock.clone()).build();
    let name = std::any::type_name::<A>();
    race_changes(&keyed, &format!("keyed, {name}"));
    race_changes(&direct, &format!("direct, {name}"));
}

fn race_changes(limiter: &impl Limiter<u32>, context: &str) {
    let (small, large) = (limiter.quota(), per(20, Duration::from_secs(2)));
    let take = |cost: u32| {
        let decision = limiter.reserve_now(&1, cost).unwrap().unwrap();
        if decision.allowed {
            cost
        } else {
            0
        }
    };
    let during = taken_while(
        3,
        |t| u64::from(take(1 + (t % 2) as u32)),
        || {
            for i in 0..2_000 {
                limiter
                    .set_quota(if i % 2 == 0 { large } else { small })
                    .unwrap();
            }
        },
    ) as u32;
    assert!(
        during <= 20,
        "{context}: {during} permits taken during the changes"
    );
    limiter.set_quota(large).unwrap();
    let after: u32 = (0..100).map(|_| take(1)).sum();
    assert_eq!(during + after, 20, "{context}");
}

#[test]
fn decisions_racing_quota_changes_add_up_to_exactly_the_larger_quota() {
    for_every_algorithm!(racing_changes_at_one_instant);
}

/// Time runs on while the period flips between 1 s and 2 s (10 and 20 permits): over the whole
/// run the key gets no more than 20 per window of at least 1 s, two windows of slack for the
/// edges; nothing panics.
fn racing_changes_while_time_runs<A: Algorithm>() {
    let clock = ManualClock::new();
    let small = per(10, Duration::from_secs(1));
    let large = per(20, Duration::from_secs(2));
    let limiter = keyed::<A>(small, &clock);
    let decide = |_| (0..4).filter(|key| limiter.check(key).allowed).count() as u64;
    let steps = 3_000u64;
    let step = Duration::from_millis(7);
    let total = taken_while(2, decide, || {
        for i in 0..steps {
            clock.advance(step);
            limiter.set_quota(if i % 3 == 0 { large } else { small });
        }
    });
    let span = step.as_millis() as u64 * steps;
    let bound = 4 * 20 * (span / 1000 + 2);
    assert!(
        total <= bound,
        "{}: {total} admitted over {span} ms, more than {bound}",
        std::any::type_name::<A>()
    );
}

#[test]
fn decisions_racing_period_changes_while_time_runs_stay_bounded() {
    for_every_algorithm!(racing_changes_while_time_runs);
}

#[test]
fn a_reservation_granted_before_a_change_stays_granted_and_counted() {
    let clock = ManualClock::new();
    let quota = per(2, Duration::from_secs(1))
        .with_max_wait(Duration::from_secs(1))
        .unwrap();
    let limiter = keyed::<FixedWindow>(quota, &clock);
    assert_eq!(admitted(&limiter, 1, 2), 2);
    let reserved = limiter.reserve_now(&1, 1).unwrap().unwrap();
    assert!(reserved.allowed);
    assert_eq!(reserved.wait, Duration::from_secs(1));
    limiter.set_quota(per(4, Duration::from_secs(1)));
    // 2 taken and 1 reserved, due in the next cycle: the raise applies from the cycle the
    // reservation falls due in (see `FixedWindow`), so nothing more now; there, 3 beside it.
    assert_eq!(admitted(&limiter, 1, 10), 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(admitted(&limiter, 1, 10), 3);
}

fn peer() -> SocketAddr {
    SocketAddr::new("203.0.113.9".parse().unwrap(), 40_000)
}

async fn policy_header(app: &Router) -> (StatusCode, String) {
    let request = Request::get("/").body(Body::empty()).unwrap();
    let response = app
        .clone()
        .layer(MockConnectInfo(peer()))
        .oneshot(request)
        .await
        .unwrap();
    crate::common::status_and_policy(&response)
}

#[tokio::test]
async fn a_layer_built_before_a_change_advertises_the_new_quota() {
    let clock = ManualClock::new();
    let limiter = keyed_on(per(2, Duration::from_secs(1)), &clock);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("per-ip", PeerIp::new(), limiter.clone()).unwrap(),
        ));
    assert_eq!(
        policy_header(&app).await,
        (StatusCode::OK, "\"per-ip\";q=2;w=1".to_owned())
    );
    limiter.set_quota(per(30, Duration::from_secs(60)));
    for _ in 0..3 {
        assert_eq!(
            policy_header(&app).await,
            (StatusCode::OK, "\"per-ip\";q=30;w=60".to_owned())
        );
    }
    // Refusals say it too.
    limiter.set_quota(per(1, Duration::from_secs(5)));
    assert_eq!(
        policy_header(&app).await,
        (
            StatusCode::TOO_MANY_REQUESTS,
            "\"per-ip\";q=1;w=5".to_owned()
        )
    );
    // Back to the quota the layer was built with.
    limiter.set_quota(per(2, Duration::from_secs(1)));
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        policy_header(&app).await,
        (StatusCode::OK, "\"per-ip\";q=2;w=1".to_owned())
    );
}

#[cfg(feature = "redis")]
mod redis_store {
    use super::*;
    use crate::common::redis_server::{or_skip, propagating, uncached, RedisServer, Refusals};
    use tower_bulwark::redis::{RedisAlgorithm, RedisRateLimiter, RedisStore};

    async fn admitted(limiter: &RedisRateLimiter, key: &str, n: u32) -> u32 {
        let mut count = 0;
        for _ in 0..n {
            if limiter.check(key).await.unwrap().allowed {
                count += 1;
            }
        }
        count
    }

    /// A limiter of `A` in Redis, its refusals cached, for `permits` a second, on a manual clock
    /// `at` seconds from its origin, and the clock.
    fn per_second_at<A: RedisAlgorithm>(
        store: &RedisStore,
        permits: u32,
        at: u64,
        prefix: &str,
    ) -> (RedisRateLimiter, ManualClock) {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(at));
        let quota = per(permits, Duration::from_secs(1));
        let limiter = propagating::<A>(store, quota, &clock, prefix, Refusals::Cached)
            .build()
            .unwrap();
        (limiter, clock)
    }

    async fn nine_of_ten_then_twenty<A: RedisAlgorithm>(store: &RedisStore, prefix: &str) {
        let (limiter, _clock) = per_second_at::<A>(store, 10, 1_000, prefix);
        assert_eq!(admitted(&limiter, "k", 9).await, 9);
        // A refusal is cached; the change must forget it.
        let other = limiter.clone();
        assert_eq!(admitted(&other, "full", 11).await, 10);
        limiter.set_quota(per(20, Duration::from_secs(2))).unwrap();
        assert_eq!(other.quota().permits(), 20);
        assert_eq!(admitted(&limiter, "k", 100).await, 11, "{prefix}");
        assert_eq!(admitted(&other, "full", 100).await, 10, "{prefix}");
        assert_eq!(admitted(&limiter, "fresh", 100).await, 20, "{prefix}");
    }

    #[tokio::test]
    async fn a_redis_limiter_keeps_each_key_s_use_across_a_change() {
        let (_server, store) = or_skip!(RedisServer::with_store("quota_change::redis").await);
        for_every_algorithm!(tagged: nine_of_ten_then_twenty(&store).await);
    }

    /// A longer period must not strand a window key in a window that lies years away.
    async fn longer_period_stays_sane<A: RedisAlgorithm>(store: &RedisStore, prefix: &str) {
        let (limiter, clock) = per_second_at::<A>(store, 5, 1_000_000, prefix);
        assert_eq!(admitted(&limiter, "k", 3).await, 3);
        limiter.set_quota(per(5, Duration::from_secs(60))).unwrap();
        // The 3 stay counted in the minute that holds them.
        assert_eq!(admitted(&limiter, "k", 10).await, 2, "{prefix}");
        let refused = limiter.check("k").await.unwrap();
        assert!(!refused.allowed);
        assert!(
            refused.retry_after <= Duration::from_secs(120),
            "{prefix}: retry after {:?}",
            refused.retry_after
        );
        clock.advance(Duration::from_secs(120));
        assert!(limiter.check("k").await.unwrap().allowed, "{prefix}");
    }

    #[tokio::test]
    async fn a_longer_period_in_redis_keeps_the_count_and_ends_in_time() {
        let (_server, store) =
            or_skip!(RedisServer::with_store("quota_change::redis_period").await);
        longer_period_stays_sane::<FixedWindow>(&store, "fw:").await;
        longer_period_stays_sane::<SlidingCounter>(&store, "sc:").await;
        longer_period_stays_sane::<SlidingLog>(&store, "log:").await;
    }

    /// The sliding counter's reservation into the next window, the period then lengthened, and
    /// the reservation given back: never more admitted than by a twin key that never reserved
    /// (in memory, `attack_a_reservation_given_back_after_the_period_grew…`).
    #[tokio::test]
    async fn a_sliding_counter_reservation_given_back_after_a_longer_period_frees_no_slot() {
        let (_server, store) =
            or_skip!(RedisServer::with_store("quota_change::redis_sc_refund").await);
        let clock = ManualClock::new();
        clock.advance(Duration::from_millis(1_000_500));
        let with_wait = |period| {
            per(10, period)
                .with_max_wait(Duration::from_secs(1))
                .unwrap()
        };
        let limiter =
            uncached::<SlidingCounter>(&store, with_wait(Duration::from_secs(1)), &clock, "scr:");
        for key in ["k", "twin"] {
            assert_eq!(admitted(&limiter, key, 10).await, 10);
        }
        let waiter = limiter.reserve(&"k".to_owned(), 1).await.unwrap();
        assert!(waiter.allowed && !waiter.wait.is_zero(), "{waiter:?}");
        limiter
            .set_quota(with_wait(Duration::from_secs(4)))
            .unwrap();
        limiter.settle_and_wait("k", 1, waiter, 0).await.unwrap();
        for step in 0..20 {
            let (got, twin) = (
                admitted(&limiter, "k", 20).await,
                admitted(&limiter, "twin", 20).await,
            );
            assert!(
                got <= twin,
                "step {step}: {got} admitted, {twin} by the twin"
            );
            clock.advance(Duration::from_millis(250));
        }
    }

    #[tokio::test]
    async fn a_quota_the_scripts_cannot_run_is_refused_and_changes_nothing() {
        let (_server, store) =
            or_skip!(RedisServer::with_store("quota_change::redis_refused").await);
        let clock = ManualClock::new();
        let q = per(10, Duration::from_secs(1));
        let limiter = propagating::<SlidingCounter>(&store, q, &clock, "bad:", Refusals::Cached)
            .build()
            .unwrap();
        let huge = per(u32::MAX, Quota::MAX_SPAN);
        assert!(limiter.set_quota(huge).is_err());
        assert_eq!(limiter.quota(), q);
        assert_eq!(admitted(&limiter, "k", 20).await, 10);
    }
}

/// What the docs of `Limiter::refund` and `Gcra::with_quota` say of a refund across a quota
/// change: GCRA gives back each permit at the shorter of the interval it was charged at and the
/// one in force. 10 a second (burst 10): all 10 spent at once, then the quota becomes 1 a second
/// (burst 10, so the TAT's lead of 1 s is one permit owed); the last admission, given back,
/// moves the TAT back by the 100 ms it added, not by one new interval (1 s): the key admits 9,
/// as it would had the request never been made, not 10.
#[test]
fn a_gcra_refund_across_a_longer_interval_gives_back_no_more_than_it_took() {
    let clock = ManualClock::new();
    let limiter = keyed::<Gcra>(per(10, Duration::from_secs(1)), &clock);
    let mut last = None;
    for _ in 0..10 {
        let decision = limiter.check(&1);
        assert!(decision.allowed);
        last = Some(decision);
    }
    let never_made = keyed::<Gcra>(per(10, Duration::from_secs(1)), &clock);
    assert_eq!(admitted(&never_made, 1, 9), 9);
    let slower = per(1, Duration::from_secs(1)).with_burst(10).unwrap();
    limiter.set_quota(slower);
    never_made.set_quota(slower);
    assert!(limiter.refund(&1, 1, last.unwrap()));
    assert_eq!(admitted(&never_made, 1, 20), 9);
    assert_eq!(admitted(&limiter, 1, 20), 9);
}
