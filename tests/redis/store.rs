//! The Redis store through the public API, each test against its own `redis-server`.

use crate::common::for_every_algorithm;
use crate::common::keyed_on;
use crate::common::{redis_server, waits_up_to};

use std::time::Duration;

use crate::common::manual_clock_at;
use crate::common::redis_server::{or_skip, RedisServer};
use tower_bulwark::redis::{
    HashTag, RedisAlgorithm, RedisFailMode, RedisFailure, RedisRateLimiter, RedisStore,
};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    limiter::{acquire, Decision},
    Limiter, Quota,
};

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .expect("connect to the test server")
}

/// On a limiter whose next slot of key `k` is 1 s away: reserves it, gives it back, and reserves
/// again, asserting both wait 1 s (`again` says why the second must); answers the second.
async fn reserved_again_after_a_refund(limiter: &RedisRateLimiter, again: &str) -> Decision {
    let reserved = limiter.reserve(&"k", 1).await.unwrap();
    assert_eq!(reserved.wait, Duration::from_secs(1));
    limiter.settle_and_wait(&"k", 1, reserved, 0).await.unwrap();
    let reserved_again = limiter.reserve(&"k", 1).await.unwrap();
    assert_eq!(reserved_again.wait, Duration::from_secs(1), "{again}");
    reserved_again
}

async fn admitted<L: Limiter<String>>(limiter: &L, key: &str, n: usize) -> Vec<Decision> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(limiter.reserve(&key.to_string(), 1).await.unwrap());
    }
    out
}

#[tokio::test]
async fn seed_fixed_window_three_per_minute() {
    let server = or_skip!(RedisServer::start("seed_fixed_window_three_per_minute"));
    let clock = manual_clock_at(Duration::from_secs(3600) + Duration::from_millis(1500));
    let limiter = RedisRateLimiter::builder(Quota::per_minute(3).unwrap(), store(&server).await)
        .algorithm::<FixedWindow>()
        .client_clock(clock.clone())
        .build()
        .unwrap();
    let d = admitted(&limiter, "alice", 4).await;
    assert!(d[..3].iter().all(|d| d.allowed), "{d:?}");
    assert_eq!(
        d.iter().map(|d| d.remaining).collect::<Vec<_>>(),
        [2, 1, 0, 0]
    );
    assert!(!d[3].allowed);
    // The window started at 3600 s; the fourth comes back at its end.
    assert_eq!(d[3].retry_after, Duration::from_millis(58_500));
    assert_eq!(d[3].retry_after_secs(), 59);
    clock.advance(Duration::from_millis(58_500));
    assert!(limiter.check(&"alice").await.unwrap().allowed);
}

#[tokio::test]
async fn seed_sliding_windows_three_per_minute_on_server_time() {
    let server = or_skip!(RedisServer::start("seed_sliding_windows_three_per_minute"));
    let quota = Quota::per_minute(3).unwrap();
    let log = RedisRateLimiter::builder(quota, store(&server).await)
        .algorithm::<SlidingLog>()
        .build()
        .unwrap();
    let counter = RedisRateLimiter::builder(quota, store(&server).await)
        .algorithm::<SlidingCounter>()
        .build()
        .unwrap();
    for (name, d) in [
        ("log", admitted(&log, "alice", 4).await),
        ("counter", admitted(&counter, "alice", 4).await),
    ] {
        assert!(d[..3].iter().all(|d| d.allowed), "{name}: {d:?}");
        assert!(!d[3].allowed, "{name}: {d:?}");
        assert_eq!(d[3].remaining, 0, "{name}");
        // The log frees a permit when it is a minute old; the counter also waits for the
        // previous window's share to fade, up to two windows.
        let bound = Duration::from_secs(if name == "log" { 60 } else { 120 });
        assert!(d[3].retry_after <= bound, "{name}: {d:?}");
        assert!(d[3].retry_after_secs() >= 1, "{name}");
        assert_eq!(d[3].limit, 3);
    }
    let d = admitted(&log, "alice", 1).await;
    assert!(
        d[0].retry_after > Duration::from_secs(59),
        "the log refuses until the first permit is a minute old: {d:?}"
    );
}

#[tokio::test]
async fn fifty_requests_in_one_millisecond_against_a_sliding_log_of_ten() {
    let server = or_skip!(RedisServer::start("fifty_requests_in_one_millisecond"));
    let quota = Quota::per_second(10).unwrap();
    // The same instant for all fifty, on a client clock.
    let clock = manual_clock_at(Duration::from_millis(7));
    let exact = RedisRateLimiter::builder(quota, store(&server).await)
        .algorithm::<SlidingLog>()
        .client_clock(clock.clone())
        .prefix("exact:")
        .refusal_cache_capacity(0)
        .build()
        .unwrap();
    let d = admitted(&exact, "k", 50).await;
    assert_eq!(d.iter().filter(|d| d.allowed).count(), 10);
    assert!(d[..10].iter().all(|d| d.allowed));
    assert_eq!(d[10].retry_after, Duration::from_secs(1));
    let mut conn = server.connection().await;
    // Permits have scores >= 0; the one other member (`hw`, the latest instant seen) is below.
    let members: u64 = redis::cmd("ZCOUNT")
        .arg(exact.redis_key("k"))
        .arg(0)
        .arg("+inf")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(members, 10, "one member per admitted permit");

    // Fifty at once on the server's clock: most share a millisecond (and microseconds).
    // Every answer from the script (a loaded machine must not turn a slow reply into the fail
    // mode's admission).
    let limiter = RedisRateLimiter::builder(Quota::per_minute(10).unwrap(), store(&server).await)
        .algorithm::<SlidingLog>()
        .refusal_cache_capacity(0)
        .timeout(Duration::from_secs(10))
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.check(&"burst").await.unwrap().allowed })
        })
        .collect();
    let mut allowed = 0;
    for task in tasks {
        allowed += usize::from(task.await.unwrap());
    }
    assert_eq!(allowed, 10);
}

async fn exercise<A: RedisAlgorithm>(server: &RedisServer, prefix: &str) -> Vec<String> {
    // Minutes, so no key expires before the test reads it, even on a stalled machine.
    let quota = waits_up_to(Quota::per_minute(2).unwrap(), Duration::from_secs(150));
    let limiter = RedisRateLimiter::builder(quota, store(server).await)
        .algorithm::<A>()
        .prefix(prefix)
        .build()
        .unwrap();
    let mut keys = Vec::new();
    for key in ["a", "b", "c"] {
        for _ in 0..3 {
            let d = limiter.reserve(&key, 1).await.unwrap();
            assert!(d.allowed);
        }
        // The third one was a reservation; give one back, which rewrites the key.
        let d = limiter.reserve(&key, 1).await.unwrap();
        limiter.settle_and_wait(&key, 1, d, 0).await.unwrap();
        keys.push(limiter.redis_key(key));
    }
    // The expiry is the moment the state stops mattering: the decision's reset_after.
    let d = limiter.check(&"fresh").await.unwrap();
    let key = limiter.redis_key("fresh");
    let pttl: u64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut server.connection().await)
        .await
        .unwrap();
    let reset = d.reset_after.as_millis() as u64;
    assert!(
        pttl <= reset + 1 && pttl + 2_000 >= reset,
        "{key}: PTTL {pttl} ms against reset_after {reset} ms"
    );
    keys.push(key);
    keys
}

#[tokio::test]
async fn every_key_written_has_an_expiry() {
    let server = or_skip!(RedisServer::start("every_key_written_has_an_expiry"));
    let mut expected = Vec::new();
    expected.extend(exercise::<Gcra>(&server, "gcra:").await);
    expected.extend(exercise::<FixedWindow>(&server, "fw:").await);
    expected.extend(exercise::<SlidingLog>(&server, "log:").await);
    expected.extend(exercise::<SlidingCounter>(&server, "sc:").await);
    let mut conn = server.connection().await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    keys.sort();
    expected.sort();
    assert_eq!(keys, expected, "exactly the keys of the limiters");
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(pttl > 0, "{key} has PTTL {pttl}");
        assert!(
            pttl <= 240_000,
            "{key} expires when its state stops mattering: {pttl}"
        );
    }
}

async fn admitted_across_instances<A: RedisAlgorithm>(server: &RedisServer) -> usize {
    let quota = Quota::per_hour(100).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        // Each instance has its own connection.
        let limiter = RedisRateLimiter::builder(quota, store(server).await)
            .algorithm::<A>()
            .timeout(Duration::from_secs(5))
            .fail_mode(RedisFailMode::Propagate)
            .build()
            .unwrap();
        for _ in 0..50 {
            let limiter = limiter.clone();
            tasks.push(tokio::spawn(async move {
                let mut allowed = 0;
                for _ in 0..2 {
                    allowed += usize::from(limiter.check(&"shared").await.unwrap().allowed);
                }
                allowed
            }));
        }
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_quota_across_four_instances() {
    let server = or_skip!(RedisServer::start(
        "exactly_the_quota_across_four_instances"
    ));
    assert_eq!(admitted_across_instances::<Gcra>(&server).await, 100);
    assert_eq!(admitted_across_instances::<SlidingLog>(&server).await, 100);
    assert_eq!(
        admitted_across_instances::<SlidingCounter>(&server).await,
        100
    );
}

#[tokio::test]
async fn a_cached_refusal_needs_no_round_trip() {
    let server = or_skip!(RedisServer::start("a_cached_refusal_needs_no_round_trip"));
    let clock = ManualClock::new();
    let quota = Quota::per_second(1).unwrap();
    let cached = RedisRateLimiter::builder(quota, store(&server).await)
        .client_clock(clock.clone())
        .prefix("cached:")
        .build()
        .unwrap();
    let uncached = RedisRateLimiter::builder(quota, store(&server).await)
        .client_clock(clock.clone())
        .prefix("uncached:")
        .refusal_cache_capacity(0)
        .build()
        .unwrap();
    let mut conn = server.connection().await;
    for limiter in [&cached, &uncached] {
        assert!(limiter.check(&"k").await.unwrap().allowed);
        let refused = limiter.check(&"k").await.unwrap();
        assert!(!refused.allowed);
        // Wipe the state in Redis: only a limiter that asks Redis sees it.
        let _: () = redis::cmd("DEL")
            .arg(limiter.redis_key("k"))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    clock.advance(Duration::from_millis(400));
    let local = cached.check(&"k").await.unwrap();
    assert!(!local.allowed, "refused from the cache");
    assert_eq!(local.retry_after, Duration::from_millis(600));
    assert_eq!(cached.counts().cached_refusals, 1);
    assert!(uncached.check(&"k").await.unwrap().allowed, "asked redis");
    assert_eq!(uncached.counts().cached_refusals, 0);
    // Another key is not affected.
    assert!(cached.check(&"other").await.unwrap().allowed);
    // Once the retry time has come, the cached limiter asks Redis again.
    clock.advance(Duration::from_millis(600));
    assert!(cached.check(&"k").await.unwrap().allowed);
    assert_eq!(cached.counts().cached_refusals, 1);
}

/// A cached refusal stands only while it is true: giving an admission of the key back forgets
/// it at once (through either refund), and so does a change of quota, so the next request asks
/// Redis.
#[tokio::test]
async fn a_refund_or_a_quota_change_forgets_cached_refusals() {
    let server = or_skip!(RedisServer::start("a_refund_forgets_cached_refusals"));
    let clock = ManualClock::new();
    let limiter = RedisRateLimiter::builder(Quota::per_second(1).unwrap(), store(&server).await)
        .client_clock(clock.clone())
        .prefix("forget:")
        .build()
        .unwrap();
    let admitted = limiter.check(&"k").await.unwrap();
    assert!(admitted.allowed);
    assert!(
        !limiter.check(&"k").await.unwrap().allowed,
        "refused by redis"
    );
    assert!(
        !limiter.check(&"k").await.unwrap().allowed,
        "refused from the cache"
    );
    assert_eq!(limiter.counts().cached_refusals, 1);

    limiter.settle_and_wait(&"k", 1, admitted, 0).await.unwrap();
    let again = limiter.check(&"k").await.unwrap();
    assert!(again.allowed, "the permit given back is there at once");
    assert_eq!(limiter.counts().cached_refusals, 1);

    assert!(
        !limiter.check(&"k").await.unwrap().allowed,
        "refused by redis"
    );
    // The spawned refund may reach Redis before or after the next check; the cached refusal is
    // gone before `refund` returns either way.
    Limiter::refund(&limiter, &"k", 1, again);
    let _ = limiter.check(&"k").await.unwrap();
    assert_eq!(
        limiter.counts().cached_refusals,
        1,
        "asked redis after the refund"
    );

    assert!(limiter.check(&"other").await.unwrap().allowed);
    assert!(!limiter.check(&"other").await.unwrap().allowed);
    limiter.set_quota(Quota::per_second(1).unwrap()).unwrap();
    let cached = limiter.counts().cached_refusals;
    let _ = limiter.check(&"other").await.unwrap();
    assert_eq!(
        limiter.counts().cached_refusals,
        cached,
        "asked redis after the change"
    );
}

async fn reservations<A: RedisAlgorithm>(server: &RedisServer, clock: &ManualClock) {
    let quota = waits_up_to(Quota::per_second(2).unwrap(), Duration::from_millis(2500));
    let limiter = RedisRateLimiter::builder(quota, store(server).await)
        .algorithm::<A>()
        .client_clock(clock.clone())
        .build()
        .unwrap();
    let mut waits = Vec::new();
    loop {
        let d = limiter.reserve(&"k", 1).await.unwrap();
        if !d.allowed {
            // The counter reserves only in the current or the next window, even within
            // max_wait; the others refuse only what lies beyond it.
            let counter = std::any::type_name::<A>().ends_with("SlidingCounter");
            assert!(
                counter || d.retry_after > Duration::from_millis(2500),
                "{d:?}"
            );
            break;
        }
        waits.push(d.wait);
        assert!(waits.len() <= 10, "{waits:?}");
    }
    let name = std::any::type_name::<A>();
    assert_eq!(waits[..2], [Duration::ZERO; 2], "{name}");
    assert!(
        waits.len() > 2,
        "{name}: at least one reservation: {waits:?}"
    );
    assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{name}: {waits:?}");
    assert!(waits[2..]
        .iter()
        .all(|w| *w > Duration::ZERO && *w <= Duration::from_millis(2500)));
}

#[tokio::test]
async fn reservations_within_max_wait_for_every_algorithm() {
    let server = or_skip!(RedisServer::start(
        "reservations_within_max_wait_for_every_algorithm"
    ));
    let clock = ManualClock::new();
    for_every_algorithm!(reservations(&server, &clock).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_gives_a_reservation_back_in_redis() {
    let server = or_skip!(RedisServer::start(
        "refund_gives_a_reservation_back_in_redis"
    ));
    let clock = ManualClock::new();
    let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(5));
    let limiter = RedisRateLimiter::builder(quota, store(&server).await)
        .algorithm::<SlidingLog>()
        .client_clock(clock.clone())
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let zcard = || server.command(&["ZCOUNT", &limiter.redis_key("k"), "0", "+inf"]);
    assert!(limiter.reserve(&"k", 1).await.unwrap().allowed);
    let again = reserved_again_after_a_refund(&limiter, "the same slot, not a later one").await;

    // Through the trait: the refund is sent from a task; the slot comes back shortly after.
    Limiter::refund(&limiter, &"k", 1, again);
    redis_server::eventually("the spawned refund lands", Duration::from_secs(5), || {
        zcard() == ":1"
    })
    .await;
    let after = limiter.reserve(&"k", 1).await.unwrap();
    assert_eq!(after.wait, Duration::from_secs(1));
    assert_eq!(zcard(), ":2");

    // A waiter dropped before its slot falls due gives it back too. The reservation comes from
    // Redis within the limiter's timeout (300 ms); the waiter then waits 2 s, and is dropped
    // at 1 s.
    let waiting = tokio::time::timeout(Duration::from_secs(1), acquire(&limiter, &"k", 1)).await;
    assert!(
        waiting.is_err(),
        "the waiter was waiting for its slot: {waiting:?}"
    );
    redis_server::eventually(
        "the dropped waiter's refund lands",
        Duration::from_secs(5),
        || zcard() == ":2",
    )
    .await;
}

#[tokio::test]
async fn policies_decide_when_redis_is_unreachable() {
    // No server at all: a closed port. No redis-server binary is needed.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let quota = Quota::per_second(10).unwrap();
    let build = |policy: RedisFailMode| {
        RedisRateLimiter::builder(quota, RedisStore::connect_lazy(&url).unwrap())
            .timeout(Duration::from_millis(200))
            .fail_mode(policy)
            .build()
            .unwrap()
    };
    let timed = |limiter: RedisRateLimiter| async move {
        let start = std::time::Instant::now();
        let result = limiter.check(&"k").await;
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "answered promptly"
        );
        (limiter, result)
    };

    let (open, d) = timed(build(RedisFailMode::Open)).await;
    let d = d.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 9);
    assert_eq!(open.counts().failures, 1);

    let (closed, d) = timed(build(RedisFailMode::Closed(Duration::from_secs(3)))).await;
    let d = d.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Duration::from_secs(3));
    assert_eq!(closed.counts().failures, 1);

    let (propagate, err) = timed(build(RedisFailMode::Propagate)).await;
    let err = err.unwrap_err();
    let failure = err.downcast_ref::<RedisFailure>().expect("a RedisFailure");
    assert!(
        matches!(failure, RedisFailure::Redis(_) | RedisFailure::Timeout(_)),
        "{failure}"
    );
    assert_eq!(propagate.counts().failures, 1);
    // Within the probe interval after a connection failure, Redis is not asked at all.
    let err = propagate.check(&"k").await.unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<RedisFailure>().unwrap(),
            RedisFailure::Skipped
        ),
        "{err}"
    );
    assert_eq!(propagate.counts().failures, 2);
    let eager = RedisRateLimiter::builder(quota, RedisStore::connect_lazy(&url).unwrap())
        .timeout(Duration::from_millis(200))
        .probe_interval(Duration::ZERO)
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap();
    for _ in 0..2 {
        let err = eager.check(&"k").await.unwrap_err();
        assert!(
            !matches!(
                err.downcast_ref::<RedisFailure>().unwrap(),
                RedisFailure::Skipped
            ),
            "{err}"
        );
    }

    let fallback = build(RedisFailMode::fallback(Quota::per_minute(2).unwrap()));
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(fallback.check(&"k").await.unwrap().allowed);
    }
    assert_eq!(
        seen,
        [true, true, false],
        "the local quota of two per minute"
    );
    assert_eq!(fallback.counts().failures, 3);
}

#[tokio::test]
async fn keys_carry_the_prefix_and_hash_tag() {
    let server = or_skip!(RedisServer::start("keys_carry_the_prefix_and_hash_tag"));
    let quota = Quota::per_second(1).unwrap();
    let default = RedisRateLimiter::builder(quota, store(&server).await)
        .build()
        .unwrap();
    assert_eq!(default.redis_key("10.0.0.1"), "bulwark:gcra:{10.0.0.1}");
    let fixed = RedisRateLimiter::builder(quota, store(&server).await)
        .algorithm::<SlidingCounter>()
        .prefix("app:")
        .hash_tag(HashTag::Fixed("limits".into()))
        .build()
        .unwrap();
    assert_eq!(fixed.redis_key(&42), "app:{limits}:42");
    assert!(fixed.check(&42).await.unwrap().allowed);
    assert_eq!(server.command(&["EXISTS", "app:{limits}:42"]), ":1");

    let errors = [
        RedisRateLimiter::builder(quota, store(&server).await)
            .prefix("a{b")
            .build()
            .unwrap_err(),
        RedisRateLimiter::builder(quota, store(&server).await)
            .hash_tag(HashTag::Fixed(String::new()))
            .build()
            .unwrap_err(),
        RedisRateLimiter::builder(quota, store(&server).await)
            .timeout(Duration::ZERO)
            .build()
            .unwrap_err(),
        RedisRateLimiter::builder(
            Quota::with_period(1, Duration::from_secs(100 * 86_400)).unwrap(),
            store(&server).await,
        )
        .client_clock(ManualClock::new())
        .build()
        .unwrap_err(),
    ];
    for err in errors {
        assert!(
            err.to_string().starts_with("invalid redis limiter"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn a_cost_above_capacity_is_an_error() {
    let server = or_skip!(RedisServer::start("a_cost_above_capacity_is_an_error"));
    let limiter = RedisRateLimiter::builder(Quota::per_second(5).unwrap(), store(&server).await)
        .build()
        .unwrap();
    let err = limiter.check_n(&"k", 6).await.unwrap_err();
    assert!(
        err.is::<tower_bulwark::limiter::InsufficientCapacity>(),
        "{err}"
    );
    let d = limiter.check_n(&"k", 5).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
}

#[tokio::test]
async fn a_fallback_reservation_goes_back_to_the_local_limiter() {
    // No server: every decision comes from the local fallback, on a manual clock.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let clock = ManualClock::new();
    let local_quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(5));
    let local = keyed_on::<String, _>(local_quota, &clock);
    let limiter = RedisRateLimiter::builder(
        Quota::per_second(100).unwrap(),
        RedisStore::connect_lazy(&format!("redis://127.0.0.1:{port}/")).unwrap(),
    )
    .timeout(Duration::from_millis(200))
    .fail_mode(RedisFailMode::fallback_to(local.clone()))
    .build()
    .unwrap();
    let first = limiter.reserve(&"k", 1).await.unwrap();
    assert!(first.allowed && first.wait.is_zero());
    assert_eq!(first.limit, 1, "the local limiter's decision");
    let again = reserved_again_after_a_refund(&limiter, "the local slot came back").await;
    Limiter::refund(&limiter, &"k", 1, again);
    let after = local.reserve(&limiter.redis_key("k"), 1).await.unwrap();
    assert_eq!(
        after.wait,
        Duration::from_secs(1),
        "the trait's refund reached it too"
    );
    assert_eq!(limiter.counts().failures, 3);
}

/// The scripts' integer helpers, run by Redis's Lua on values of the sizes they meet (server
/// time in microseconds is about 2^51), against Rust's integer arithmetic.
#[tokio::test]
async fn lua_integer_arithmetic_is_exact() {
    let server = or_skip!(RedisServer::start("lua_integer_arithmetic_is_exact"));
    let script = redis::Script::new(concat!(
        include_str!("../../src/redis/prelude.lua"),
        "local out = {}\n",
        "for i = 7, #ARGV, 2 do\n",
        "  local a, b = tonumber(ARGV[i]), tonumber(ARGV[i + 1])\n",
        "  out[#out + 1] = int(idiv(a, b)) .. ' ' .. int(cdiv(a, b))\n",
        "end\n",
        "return out\n",
    ));
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut pairs: Vec<(u64, u64)> = vec![
        ((1 << 52) - 1, 3),
        ((1 << 52) - 1, (1 << 26) + 1),
        (1_764_412_345_678_901, 333_334),
        (1_764_412_345_678_901, 60_000_000),
        (0, 7),
        (999_999, 1_000_000),
    ];
    for _ in 0..500 {
        let b = 1 + next() % (1 << 40);
        let a = next() % (1 << 52);
        pairs.push((a, b));
        // Exact multiples and their neighbours, where rounding errors would show.
        let m = (a / b) * b;
        pairs.push((m, b));
        if m > 0 {
            pairs.push((m - 1, b));
        }
    }
    let mut invocation = script.prepare_invoke();
    invocation.arg(["d", "0", "1000", "1", "0", "0"].as_slice());
    for (a, b) in &pairs {
        invocation.arg(a).arg(b);
    }
    let mut conn = server.connection().await;
    let results: Vec<String> = invocation.invoke_async(&mut conn).await.unwrap();
    assert_eq!(results.len(), pairs.len());
    for ((a, b), got) in pairs.iter().zip(results) {
        assert_eq!(got, format!("{} {}", a / b, a.div_ceil(*b)), "{a} / {b}");
    }
}

/// Redis Cluster's hash tag of `key`: what lies between the first `{` and the first `}` after
/// it, if that is not empty; otherwise the whole key.
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[tokio::test]
async fn no_client_key_chooses_its_cluster_slot_or_shares_a_key() {
    let server = or_skip!(RedisServer::start("no_client_key_chooses_its_cluster_slot"));
    let limiter = RedisRateLimiter::builder(Quota::per_second(5).unwrap(), store(&server).await)
        .prefix("rl:")
        .build()
        .unwrap();
    // A client key holding `}` would end the hash tag early: every key starting `victim}` would
    // share one slot with (and pile onto the node of) `victim`'s.
    assert_eq!(limiter.redis_key("victim}x"), "rl:{victim%7Dx}");
    assert_eq!(limiter.redis_key("100%"), "rl:{100%25}");
    assert_eq!(limiter.redis_key("plain-key"), "rl:{plain-key}");
    let hostile = [
        "}", "}}", "{", "{}", "a}b", "a%7Db", "a%7db", "%", "%25", "%%7D", "{a}", "}{", "", "é}",
    ];
    let mut seen = std::collections::HashMap::new();
    for key in hostile {
        let redis_key = limiter.redis_key(key);
        let tag = hash_tag(&redis_key);
        // The tag is the client key, escaped: nothing of it is cut off or left out.
        let unescaped = tag.replace("%7D", "}").replace("%25", "%");
        if !key.is_empty() {
            assert_eq!(unescaped, key, "{redis_key:?}");
        }
        if let Some(other) = seen.insert(redis_key.clone(), key) {
            panic!("{key:?} and {other:?} share the Redis key {redis_key:?}");
        }
    }
    // And the state really lives apart: a key with `}` and its look-alike get separate budgets.
    for _ in 0..5 {
        assert!(limiter.check(&"a}b").await.unwrap().allowed);
    }
    assert!(!limiter.check(&"a}b").await.unwrap().allowed);
    assert!(limiter.check(&"a%7Db").await.unwrap().allowed);
}

/// "`retry_after` of a refusal is the exact time until the same request would be admitted":
/// a refusal cached for a cost of 1 does not answer a cost of 5, which waits longer. 10 per
/// 100 s, all spent: cost 1 is refused for 10 s, cost 5 for 50 s, as Redis and the in-memory
/// limiter say; asked again, the cache gives each its own.
#[tokio::test]
async fn a_cached_refusal_answers_only_its_own_cost() {
    let server = or_skip!(RedisServer::start(
        "a_cached_refusal_answers_only_its_own_cost"
    ));
    let clock = ManualClock::new();
    let quota = Quota::with_period(10, Duration::from_secs(100)).unwrap();
    let limiter = RedisRateLimiter::builder(quota, store(&server).await)
        .client_clock(clock.clone())
        .prefix("costs:")
        .build()
        .unwrap();
    let memory = tower_bulwark::KeyedRateLimiter::<&str>::new(quota);
    for _ in 0..10 {
        assert!(limiter.check(&"k").await.unwrap().allowed);
        assert!(memory.check(&"k").allowed);
    }
    let round = |d: Duration| d.as_secs_f64().round() as u64;
    for _ in 0..2 {
        let one = limiter.reserve(&"k", 1).await.unwrap();
        let five = limiter.reserve(&"k", 5).await.unwrap();
        assert!(!one.allowed && !five.allowed);
        assert_eq!(round(one.retry_after), 10);
        assert_eq!(round(five.retry_after), 50);
        assert_eq!(
            round(five.retry_after),
            round(memory.reserve_now(&"k", 5).unwrap().unwrap().retry_after)
        );
    }
}
