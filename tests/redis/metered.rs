//! `Metered` in Redis: each admission holds its estimate in the key under an id of its own until
//! it settles, so settled tokens plus what is left is the quota, across instances, however many
//! requests are in flight; a live instance renews its holds, a dead instance's expire after
//! `hold_for` and leave their estimates charged; a settle is never applied twice.

use std::time::Duration;

use crate::common::poll_once;
use crate::common::redis_server::{eventually, or_skip, uncached, RedisServer};
use crate::common::{assert_settled_plus_left_is_the_quota, manual_clock_at};
use tower_bulwark::algorithm::Metered;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::limiter::Decision;
use tower_bulwark::redis::{Lease, RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

/// A metered limiter of `quota` on `store` under `prefix`, on `clock`, its holds lasting
/// `hold_for`, failing with Redis's error.
pub(crate) fn metered(
    store: &RedisStore,
    quota: Quota,
    clock: &ManualClock,
    prefix: &str,
    hold_for: Duration,
) -> RedisRateLimiter {
    RedisRateLimiter::builder(quota, store.clone())
        .algorithm::<Metered>()
        .client_clock(clock.clone())
        .prefix(prefix)
        .hold_for(hold_for)
        .fail_mode(RedisFailMode::Propagate)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// The holds the Redis key of `key` keeps now.
pub(crate) fn holds(server: &RedisServer, limiter: &RedisRateLimiter, key: &str) -> usize {
    let state = server.command(&["GET", &limiter.redis_key(&key)]);
    state.matches(';').count()
}

/// What `limiter` still admits on `key` now, taken in holds of 100, then 10, then 1 (a few
/// dozen holds at most), never settled.
async fn drain(limiter: &RedisRateLimiter, key: &str) -> u64 {
    let mut left = 0;
    for chunk in [100, 10, 1] {
        while limiter.check_n(&key, chunk).await.unwrap().allowed {
            left += u64::from(chunk);
        }
    }
    left
}

/// What an in-memory `Metered` limiter on its own clock says after four holds of 1 000 of
/// 10 000 a minute, settled to 500 each a second later: the next check of one.
pub(crate) fn in_memory_after_four_streams() -> Decision {
    let clock = ManualClock::new();
    let memory = KeyedRateLimiter::<&str>::builder(Quota::per_minute(10_000).unwrap())
        .algorithm::<Metered>()
        .clock(clock.clone())
        .build();
    let streams: Vec<_> = (0..4)
        .map(|_| memory.check_n(&"k", 1000).unwrap())
        .collect();
    clock.advance(Duration::from_secs(1));
    for stream in streams {
        assert!(memory.settle(&"k", 1000, stream, 500));
    }
    memory.check_n(&"k", 1).unwrap()
}

/// Four holds of 1 000 asked at once (one call, then the three queued behind it in one batch)
/// take four holds of their own; settled to 500 each a second later, the key says what the
/// in-memory `Metered` says, to the token, and holds nothing more.
#[tokio::test]
async fn four_concurrent_holds_settle_to_what_the_in_memory_metered_leaves() {
    let (server, store) = or_skip!(RedisServer::with_store("metered_four_holds").await);
    let clock = ManualClock::new();
    let quota = Quota::per_minute(10_000).unwrap();
    let limiter = metered(&store, quota, &clock, "four:", Duration::from_secs(600));
    let streams = futures::future::join_all((0..4).map(|_| limiter.reserve(&"k", 1000))).await;
    let streams: Vec<Decision> = streams.into_iter().map(Result::unwrap).collect();
    let mut left: Vec<u64> = streams.iter().map(|d| d.remaining).collect();
    left.sort_unstable();
    assert_eq!(left, [6000, 7000, 8000, 9000], "each held its own 1 000");
    assert_eq!(holds(&server, &limiter, "k"), 4, "one hold per decision");
    assert!(!limiter.check_n(&"k", 6001).await.unwrap().allowed);
    clock.advance(Duration::from_secs(1));
    for stream in streams {
        limiter
            .settle_and_wait(&"k", 1000, stream, 500)
            .await
            .unwrap();
    }
    assert_eq!(holds(&server, &limiter, "k"), 0);
    let next = limiter.check_n(&"k", 1).await.unwrap();
    let expected = in_memory_after_four_streams();
    assert_eq!(next.remaining, expected.remaining);
    assert_eq!(next.reset_after, expected.reset_after);
    assert!(next.remaining >= 10_000 - 2001, "{}", next.remaining);
}

/// Two instances (each its own connection), eight tasks each, race on one key of 10 000 tokens
/// a minute with the clock standing still: each holds estimates of up to 50 and settles them to
/// up to twice as much (some 8 000 in all). What the settled requests cost plus what the key still admits is the
/// quota, and nothing stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_racing_holds_and_settles_add_up_to_the_quota() {
    let server = or_skip!(RedisServer::start("metered_two_instances"));
    let clock = manual_clock_at(Duration::from_secs(1));
    let mut instances = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let quota = Quota::per_minute(10_000).unwrap();
        instances.push(uncached::<Metered>(&store, quota, &clock, "race:"));
    }
    let spent = crate::settle::race_settles(&instances, 20).await;
    assert_eq!(holds(&server, &instances[0], "tenant"), 0, "all settled");
    let left = drain(&instances[1], "tenant").await;
    assert!(
        spent > 0 && spent < 10_000,
        "the race must leave some: {spent}"
    );
    assert_settled_plus_left_is_the_quota::<Metered>(10_000, spent, left);
}

/// An instance that dies holding 1 000 of 3 600 tokens an hour: the hold weighs in full until
/// `hold_for` (a minute) has passed, then it stands as if settled to its estimate at its
/// admission (the key holds what a key charged 1 000 then holds), never given back. Its settle,
/// should it come after all, gives nothing back; another expired hold's settle still charges
/// its debt. The key outlasts its holds.
#[tokio::test]
async fn a_dead_instance_holds_expire_after_hold_for_and_leave_the_estimate_charged() {
    let (server, store) = or_skip!(RedisServer::with_store("metered_dead_instance").await);
    let clock = manual_clock_at(Duration::from_secs(1));
    let quota = Quota::per_hour(3600).unwrap();
    let minute = Duration::from_secs(60);
    let dead = metered(&store, quota, &clock, "dead:", minute);
    let alive = metered(&store, quota, &clock, "dead:", minute);
    let lost = dead.check_n(&"k", 1000).await.unwrap();
    let late = dead.check_n(&"k", 100).await.unwrap();
    assert!(lost.allowed && late.allowed);
    drop(dead);
    // The key lasts until charging its holds would leave nothing: 1 100 s ahead.
    let ttl: u64 = server
        .command(&["PTTL", &alive.redis_key(&"k")])
        .trim_start_matches(':')
        .parse()
        .unwrap();
    assert!(ttl >= 1_100_000, "the key must outlast its holds: {ttl} ms");

    clock.advance(Duration::from_secs(59));
    let held = alive.check_n(&"k", 1).await.unwrap();
    assert_eq!(
        held.remaining,
        3600 - 1100 - 1,
        "both holds still weigh in full"
    );
    alive.settle_and_wait(&"k", 1, held, 0).await.unwrap();

    clock.advance(Duration::from_secs(2));
    // Expired at 60 s: charged as of their admission, 61 s ago.
    let charged_then = 3600 - 1100 + 61;
    let now = alive.check_n(&"k", 1).await.unwrap();
    assert_eq!(now.remaining, charged_then - 1);
    assert_eq!(holds(&server, &alive, "k"), 1, "only the check's own hold");
    alive.settle_and_wait(&"k", 1, now, 0).await.unwrap();

    // The dead instance's settles, after all: nothing back for the one that used less, the
    // debt beyond its estimate for the one that used more.
    let revived = metered(&store, quota, &clock, "dead:", minute);
    revived.settle_and_wait(&"k", 1000, lost, 10).await.unwrap();
    assert_eq!(drain(&alive, "k").await, charged_then);
    let fresh = metered(&store, quota, &clock, "dead2:", minute);
    let twin = metered(&store, quota, &clock, "dead3:", minute);
    for limiter in [&fresh, &twin] {
        assert!(limiter.check_n(&"k", 100).await.unwrap().allowed);
    }
    let over = fresh.check_n(&"k", 100).await.unwrap();
    clock.advance(Duration::from_secs(61));
    fresh.settle_and_wait(&"k", 100, over, 250).await.unwrap();
    // The twin never took the second 100: the expired one stands (100) and 150 of debt.
    let twin_left = drain(&twin, "k").await;
    assert_eq!(drain(&fresh, "k").await, twin_left - 100 - 150);
}

/// The expiry of each hold the Redis key of `key` keeps now, in the client clock's ticks.
fn hold_expiries(server: &RedisServer, limiter: &RedisRateLimiter, key: &str) -> Vec<u64> {
    let state = server.command(&["GET", &limiter.redis_key(&key)]);
    (state.split(';').skip(1))
        .map(|hold| hold.rsplit(',').next().unwrap().trim().parse().unwrap())
        .collect()
}

/// A live instance renews its holds every third of `hold_for`: its request's hold outlives
/// `hold_for` and is still given back whole when it settles, while the hold of an instance
/// that died (dropped, so nothing renews it) stands at its expiry, its estimate charged as of
/// its admission.
#[tokio::test]
async fn a_live_hold_is_renewed_past_hold_for_and_a_dead_instances_stands_at_its_expiry() {
    let (server, store) = or_skip!(RedisServer::with_store("metered_renewed").await);
    use tower_bulwark::clock::Clock;
    let clock = manual_clock_at(Duration::from_secs(1));
    let quota = Quota::per_hour(3600).unwrap();
    let second = Duration::from_secs(1);
    let live = metered(&store, quota, &clock, "renew:", second);
    let dead = metered(&store, quota, &clock, "renew:", second);
    let kept = live.check_n(&"k", 100).await.unwrap();
    let lost = dead.check_n(&"k", 100).await.unwrap();
    assert!(kept.allowed && lost.allowed);
    drop(dead);
    for round in 0..2 {
        // Past the dead hold's expiry in the second round: a renewal, which moves the live
        // hold's expiry a second past the clock, charges the dead one and drops it.
        clock.advance(Duration::from_millis(600));
        let renewed = clock.now() + 1_000_000_000;
        eventually("the live hold renewed", Duration::from_secs(10), || {
            hold_expiries(&server, &live, "k").contains(&renewed)
        })
        .await;
        assert_eq!(holds(&server, &live, "k"), 2 - round, "round {round}");
    }
    // 1.2 s after both admissions: the live hold, renewed, gives back all it held.
    live.settle_and_wait(&"k", 100, kept, 0).await.unwrap();
    assert_eq!(holds(&server, &live, "k"), 0);
    let charged_then = 3600 - 100 + 1;
    let now = live.check_n(&"k", 1).await.unwrap();
    assert_eq!(now.remaining, charged_then - 1, "the dead hold's 100 stand");
}

/// A key whose state this crate did not write fails the decision, and a settle on it, with an
/// error that says what is wrong, rather than deciding on nonsense.
#[tokio::test]
async fn wrong_shaped_state_is_an_error_naming_what_is_wrong() {
    let (server, store) = or_skip!(RedisServer::with_store("metered_wrong_state").await);
    let clock = manual_clock_at(Duration::from_secs(1));
    let quota = Quota::per_minute(1000).unwrap();
    let limiter = metered(&store, quota, &clock, "bad:", Duration::from_secs(600));
    let held = limiter.check_n(&"k", 10).await.unwrap();
    assert!(held.allowed);
    let key = limiter.redis_key(&"k");
    let cases = [
        ("12345", "is not \"<tat>:<latest>\" then its holds"),
        (
            "5:7;1,2,3",
            "are not \";<id>,<permits>,<at>,<expires>\" each",
        ),
        (
            "5:7;1,2,3,4;junk",
            "are not \";<id>,<permits>,<at>,<expires>\" each",
        ),
        ("5:7:1", "are not \";<id>,<permits>,<at>,<expires>\" each"),
        ("5:7;1,2,x,4", "is not a number this crate wrote"),
        ("-5:7", "is not a number this crate wrote"),
        ("5:1e300", "is not a number this crate wrote"),
    ];
    for (state, what) in cases {
        assert_eq!(server.command(&["SET", &key, state]), "+OK");
        let err = limiter.check_n(&"k", 1).await.unwrap_err().to_string();
        assert!(err.contains(what), "{state:?}: {err}");
    }
    let err = (limiter.settle_and_wait(&"k", 10, held, 5).await)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a number this crate wrote"), "{err}");
    server.command(&["DEL", &key]);
    server.command(&["HSET", &key, "tat", "5"]);
    let err = limiter.check_n(&"k", 1).await.unwrap_err().to_string();
    assert!(err.contains("WRONGTYPE"), "{err}");
}

/// A key keeps at most 256 holds: the next decision is refused (a second at least, nothing
/// left) until one settles, and the settle forgets the refusal this instance cached.
#[tokio::test]
async fn a_full_table_of_holds_refuses_until_one_settles() {
    let (server, store) = or_skip!(RedisServer::with_store("metered_full_table").await);
    let clock = manual_clock_at(Duration::from_secs(1));
    let quota = Quota::per_minute(1000).unwrap();
    let limiter = RedisRateLimiter::builder(quota, store)
        .algorithm::<Metered>()
        .client_clock(clock.clone())
        .prefix("full:")
        .fail_mode(RedisFailMode::Propagate)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..256 {
        let decision = limiter.check(&"k").await.unwrap();
        assert!(decision.allowed);
        held.push(decision);
    }
    assert_eq!(holds(&server, &limiter, "k"), 256);
    let refused = limiter.check(&"k").await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.remaining, 0);
    assert!(refused.retry_after >= Duration::from_secs(1));
    let one = held.pop().unwrap();
    limiter.settle_and_wait(&"k", 1, one, 1).await.unwrap();
    assert!(limiter.check(&"k").await.unwrap().allowed, "room again");
}

/// While Redis cannot answer, the default fail mode decides with an in-memory `Metered`: its
/// admissions hold their estimates and settle there exactly (the four streams of the issue
/// leave what they leave in memory), and none of it reaches Redis.
#[tokio::test]
async fn the_local_fail_mode_of_a_metered_limiter_is_metered_and_takes_its_settles() {
    let mut server = or_skip!(RedisServer::start("metered_local_fail_mode"));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    server.kill();
    let clock = ManualClock::new();
    let limiter = RedisRateLimiter::builder(Quota::per_minute(10_000).unwrap(), store)
        .algorithm::<Metered>()
        .client_clock(clock.clone())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut streams = Vec::new();
    for _ in 0..4 {
        let decision = limiter.check_n(&"k", 1000).await.unwrap();
        assert!(decision.allowed);
        streams.push(decision);
    }
    assert!(limiter.counts().failures > 0, "decided locally");
    assert!(!limiter.check_n(&"k", 6001).await.unwrap().allowed, "held");
    clock.advance(Duration::from_secs(1));
    for stream in streams {
        assert!(Limiter::<&str>::settle(&limiter, &"k", 1000, stream, 500));
    }
    let next = limiter.check_n(&"k", 1).await.unwrap();
    let expected = in_memory_after_four_streams().remaining;
    assert_eq!(next.remaining, expected);
    assert!(limiter.settle(&"k", 1, next, 1));
    // Settled to its very estimate, a hold is released too: charged as of its admission, it
    // drains with time, where a hold would not.
    let exact = limiter.check_n(&"k", 100).await.unwrap();
    clock.advance(Duration::from_secs(60));
    assert!(limiter.settle(&"k", 100, exact, 100));
    let after = limiter.check_n(&"k", 1).await.unwrap();
    assert_eq!(after.remaining, 9999, "a minute later nothing weighs");
}

/// Settings that cannot work are refused when the limiter is built, saying why: a hold bound
/// under a second or over a day, and leases (a share's admissions hold nothing in Redis).
#[tokio::test]
async fn hold_bounds_and_leases_are_checked_at_build() {
    let (_server, store) = or_skip!(RedisServer::with_store("metered_build_checks").await);
    let quota = Quota::per_minute(1000).unwrap();
    let builder = || RedisRateLimiter::builder(quota, store.clone()).algorithm::<Metered>();
    for hold_for in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_secs(86_401),
    ] {
        let err = builder()
            .hold_for(hold_for)
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("hold_for must be between a second and a day"),
            "{err}"
        );
    }
    for hold_for in [Duration::from_secs(1), Duration::from_secs(86_400)] {
        assert!(builder().hold_for(hold_for).build().is_ok());
    }
    let err = builder()
        .lease(Lease::new())
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("leases cannot be exact with Metered"), "{err}");
}

/// On the server's clock (microseconds), a hold keeps its key for `hold_for`, and once settled
/// the key lasts only as long as what was charged weighs.
#[tokio::test]
async fn on_the_server_clock_a_hold_keeps_its_key_for_hold_for() {
    let (server, store) = or_skip!(RedisServer::with_store("metered_server_clock").await);
    let limiter = RedisRateLimiter::builder(Quota::per_minute(1000).unwrap(), store)
        .algorithm::<Metered>()
        .hold_for(Duration::from_secs(600))
        .fail_mode(RedisFailMode::Propagate)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    // Milliseconds left, or -2 for a key gone.
    let pttl = || -> i64 {
        let reply = server.command(&["PTTL", &limiter.redis_key(&"k")]);
        reply.trim_start_matches(':').parse().unwrap()
    };
    let held = limiter.check(&"k").await.unwrap();
    assert!(held.allowed && held.remaining == 999);
    assert!((590_000..=600_000).contains(&pttl()), "{}", pttl());
    limiter.settle_and_wait(&"k", 1, held, 1).await.unwrap();
    assert_eq!(holds(&server, &limiter, "k"), 0);
    // One token weighs 60 ms (the key may be gone already).
    assert!(pttl() <= 60, "{}", pttl());
}

/// Decisions dropped while their script is on the way (the call on the key, and those queued
/// behind it and sent in one batch) give their holds back; the kept ones hold theirs, and the
/// key then admits exactly the rest of the quota.
#[tokio::test]
async fn decisions_dropped_on_the_way_give_their_holds_back() {
    let (server, store) = or_skip!(RedisServer::with_store("metered_dropped").await);
    let clock = manual_clock_at(Duration::from_secs(1));
    let quota = Quota::per_minute(1000).unwrap();
    let limiter = metered(&store, quota, &clock, "dropped:", Duration::from_secs(600));
    let mut kept = 0;
    for _ in 0..10 {
        let mut calls: Vec<_> = (0..8)
            .map(|_| Box::pin(limiter.reserve(&"k", 10)))
            .collect();
        let sent: Vec<bool> = (calls.iter_mut())
            .map(|call| poll_once(call.as_mut()).is_pending())
            .collect();
        assert!(sent.iter().all(|&pending| pending), "on the way");
        for (i, call) in calls.into_iter().enumerate() {
            if i % 3 == 0 {
                assert!(call.await.unwrap().allowed);
                kept += 1;
            }
        }
    }
    eventually(
        "the dropped decisions' holds are given back",
        Duration::from_secs(5),
        || holds(&server, &limiter, "k") == kept,
    )
    .await;
    assert_eq!(drain(&limiter, "k").await, 1000 - 10 * kept as u64);
}
