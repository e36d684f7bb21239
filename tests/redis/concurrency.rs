//! `Policy::concurrent_in_redis`, limiter by limiter: instances racing for one key's slots get
//! exactly the limit; slots are given back by their ids, so a late give-back frees no one
//! else's; a dead instance's slots come back at the expiry, a live request's never do; a
//! give-back that cannot reach Redis is sent once; Redis down is the fail mode's; a reply of
//! the wrong shape or a key of the wrong type is a clear error.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{ConcurrencyLimiter, HeaderKey, Policy};
use tower_bulwark::redis::{RedisFailMode, RedisFailure, RedisRateLimiter, RedisStore};
use tower_bulwark::{Limiter, Quota};

use crate::common::redis_server::{eventually, or_skip, FakeRedis, RedisServer};

/// The Redis key of tenant `t` under the tests' prefix.
pub(crate) const KEY: &str = "c:{t}";

fn tenant() -> HeaderValue {
    HeaderValue::from_static("t")
}

/// An instance's policy of `in_flight` slots per tenant on `store`, on `clock`, whose slots
/// live `expiry` unless renewed, failing with Redis's error after 5 s (or `fail_mode`).
pub(crate) fn policy_with(
    store: &RedisStore,
    clock: &ManualClock,
    in_flight: u32,
    expiry: Duration,
    fail_mode: RedisFailMode,
) -> Policy<HeaderKey, ConcurrencyLimiter<HeaderValue>> {
    let redis = RedisRateLimiter::builder(Quota::per_second(1).unwrap(), store.clone())
        .client_clock(clock.clone())
        .prefix("c:")
        .timeout(Duration::from_secs(5))
        .probe_interval(Duration::ZERO)
        .fail_mode(fail_mode)
        .hold_for(expiry);
    let key = HeaderKey::new("x-tenant").unwrap();
    Policy::concurrent_in_redis("streams", key, in_flight, redis).unwrap()
}

/// [`policy_with`] failing with Redis's error ([`RedisFailMode::Propagate`]).
pub(crate) fn policy(
    store: &RedisStore,
    clock: &ManualClock,
    in_flight: u32,
    expiry: Duration,
) -> Policy<HeaderKey, ConcurrencyLimiter<HeaderValue>> {
    policy_with(store, clock, in_flight, expiry, RedisFailMode::Propagate)
}

/// The slots `key` holds in Redis (expired ones included until a decision prunes them).
pub(crate) fn held(server: &RedisServer, key: &str) -> u64 {
    let reply = server.command(&["ZCARD", key]);
    reply.trim_start_matches(':').parse().unwrap()
}

/// Whether `limiter` admits one more request of tenant `t` (given back at once if so).
async fn admits(limiter: &ConcurrencyLimiter<HeaderValue>) -> bool {
    let decision = limiter.reserve(&tenant(), 1).await.unwrap();
    let allowed = decision.allowed;
    limiter.refund(&tenant(), 1, decision);
    allowed
}

/// Tasks of two instances take and give back slots of one key, many times over, each holding
/// its slot across an await: never more than the limit hold one at once, and every slot comes
/// back. Then, all holding at once, exactly the limit are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_two_instances_racing_get_exactly_the_slots_and_each_goes_back_once() {
    let server = or_skip!(RedisServer::start("tasks_of_two_instances_racing"));
    const LIMIT: usize = 5;
    let clock = ManualClock::new();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let policy = policy(&store, &clock, LIMIT as u32, Duration::from_secs(60));
        instances.push(Arc::new(policy));
    }
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let policy = Arc::clone(&instances[i % 2]);
            let (holding, most, admitted) = (holding.clone(), most.clone(), admitted.clone());
            tokio::spawn(async move {
                let limiter = policy.limiter();
                for _ in 0..20 {
                    let decision = limiter.reserve(&tenant(), 1).await.unwrap();
                    if decision.allowed {
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        holding.fetch_sub(1, Ordering::SeqCst);
                        assert!(limiter.settle(&tenant(), 1, decision, 0));
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert!(most.load(Ordering::SeqCst) <= LIMIT, "{most:?}");
    assert!(admitted.load(Ordering::SeqCst) >= LIMIT, "{admitted:?}");
    eventually(
        "every give-back reached redis",
        Duration::from_secs(10),
        || held(&server, KEY) == 0,
    )
    .await;
    for round in 0..5 {
        let calls: Vec<_> = (0..16)
            .map(|i| {
                let policy = Arc::clone(&instances[i % 2]);
                let call = async move { policy.limiter().reserve(&tenant(), 1).await.unwrap() };
                (i % 2, tokio::spawn(call))
            })
            .collect();
        let mut taken = Vec::new();
        for (instance, call) in calls {
            let decision = call.await.unwrap();
            if decision.allowed {
                taken.push((instance, decision));
            } else {
                assert_eq!((decision.remaining, decision.retry_after_secs()), (0, 1));
            }
        }
        assert_eq!(taken.len(), LIMIT, "round {round}");
        assert_eq!(held(&server, KEY), LIMIT as u64);
        for (instance, decision) in taken {
            assert!(instances[instance].limiter().refund(&tenant(), 1, decision));
        }
        eventually("every give-back", Duration::from_secs(10), || {
            held(&server, KEY) == 0
        })
        .await;
    }
    // A decision given back to the other instance, or under another key, frees nothing.
    let (a, b) = (instances[0].limiter(), instances[1].limiter());
    assert!(!b.refund(&tenant(), 1, a.reserve(&tenant(), 1).await.unwrap()));
    let other = HeaderValue::from_static("u");
    assert!(!a.refund(&other, 1, a.reserve(&tenant(), 1).await.unwrap()));
    assert_eq!(held(&server, KEY), 2);
}

/// A give-back that reaches Redis after its slot expired and another request took a slot
/// frees nothing of that request's: slots go back by their ids, not by count.
#[tokio::test]
async fn a_late_give_back_frees_no_other_requests_slot() {
    let (server, store) = or_skip!(RedisServer::with_store("a_late_give_back").await);
    let clock = ManualClock::new();
    // Renewals come every 20 s of real time: none during the test.
    let expiry = Duration::from_secs(60);
    let late = policy(&store, &clock, 1, expiry);
    let other = policy(&store, &clock, 1, expiry);
    let stale = late.limiter().reserve(&tenant(), 1).await.unwrap();
    assert!(stale.allowed);
    // The slot expires unrenewed (its instance stalled, say); another request takes one.
    clock.advance(expiry);
    let taken = other.limiter().reserve(&tenant(), 1).await.unwrap();
    assert!(taken.allowed, "an expired slot counts no more");
    let before = server.evalsha_calls();
    assert!(late.limiter().refund(&tenant(), 1, stale));
    eventually("the late give-back ran", Duration::from_secs(10), || {
        server.evalsha_calls() == before + 1
    })
    .await;
    assert_eq!(held(&server, KEY), 1, "the other request's slot stays");
    assert!(!admits(late.limiter()).await);
    assert!(other.limiter().refund(&tenant(), 1, taken));
    eventually("the slot back", Duration::from_secs(10), || {
        held(&server, KEY) == 0
    })
    .await;
}

/// An instance that dies holding slots (it neither gives them back nor renews them): the other
/// instances get them back exactly at the expiry, not a nanosecond before.
#[tokio::test]
async fn a_dead_instances_slots_come_back_at_the_expiry() {
    let (server, store) = or_skip!(RedisServer::with_store("a_dead_instances_slots").await);
    let clock = crate::common::manual_clock_at(Duration::from_secs(1000));
    let expiry = Duration::from_secs(60);
    let dead = policy(&store, &clock, 3, expiry);
    for _ in 0..3 {
        // Never given back: the instance dies holding it.
        assert!(dead.limiter().reserve(&tenant(), 1).await.unwrap().allowed);
    }
    drop(dead);
    let alive = policy(&store, &clock, 3, expiry);
    assert!(!admits(alive.limiter()).await);
    clock.advance(expiry - Duration::from_nanos(1));
    assert!(!admits(alive.limiter()).await, "not before the expiry");
    clock.advance(Duration::from_nanos(1));
    let mut taken = Vec::new();
    for _ in 0..3 {
        let decision = alive.limiter().reserve(&tenant(), 1).await.unwrap();
        assert!(decision.allowed, "back at the expiry");
        taken.push(decision);
    }
    assert!(!admits(alive.limiter()).await, "three, no more");
    assert_eq!(held(&server, KEY), 3);
}

/// Slots held for four times their expiry stay held: the instance renews them every third of
/// the expiry, all five keys in one call each time.
#[tokio::test]
async fn a_live_request_keeps_its_slots_past_the_expiry_renewed_in_one_call_for_all_keys() {
    let (server, store) = or_skip!(RedisServer::with_store("a_live_request_keeps").await);
    use tower_bulwark::clock::Clock;
    let clock = ManualClock::new();
    let expiry = Duration::from_secs(1);
    let live = policy(&store, &clock, 1, expiry);
    let other = policy(&store, &clock, 1, expiry);
    let keys: Vec<HeaderValue> = (0..5)
        .map(|k| HeaderValue::from_str(&format!("k{k}")).unwrap())
        .collect();
    let mut holds = Vec::new();
    for key in &keys {
        let decision = live.limiter().reserve(key, 1).await.unwrap();
        assert!(decision.allowed);
        holds.push(decision);
    }
    assert_eq!(server.command(&["CONFIG", "RESETSTAT"]), "+OK");
    let start = Instant::now();
    for _ in 0..6 {
        // Two thirds of the expiry, then wait for the renewal that moves every slot past it.
        clock.advance(expiry * 2 / 3);
        let renewed = (clock.now() + 1_000_000_000).to_string();
        eventually("every key renewed", Duration::from_secs(10), || {
            (0..5).all(|k| {
                let key = format!("c:{{k{k}}}");
                server.command(&["ZCOUNT", &key, "-inf", &format!("({renewed}")]) == ":0"
                    && held(&server, &key) == 1
            })
        })
        .await;
    }
    let (renewals, elapsed) = (server.evalsha_calls(), start.elapsed());
    assert!(renewals >= 6, "{renewals}");
    // Renewals at most every third of a second: one call each, not one per key (that would be
    // 5 each).
    let most = elapsed.as_millis() / 333 + 1;
    assert!(
        u128::from(renewals) <= most,
        "{renewals} calls in {elapsed:?}"
    );
    for key in &keys {
        assert!(!other.limiter().reserve(key, 1).await.unwrap().allowed);
    }
    for (key, decision) in keys.iter().zip(holds) {
        assert!(live.limiter().settle(key, 1, decision, 0));
    }
    eventually("every slot back", Duration::from_secs(10), || {
        (0..5).all(|k| held(&server, &format!("c:{{k{k}}}")) == 0)
    })
    .await;
    for key in &keys {
        assert!(other.limiter().reserve(key, 1).await.unwrap().allowed);
    }
}

/// Give-backs sent while Redis is down fail, and are not sent again once it is back (its state
/// kept on disk): the slots stay held until they expire, then come back.
#[tokio::test]
async fn a_give_back_that_cannot_reach_redis_is_sent_once_and_its_slots_expire() {
    let mut server = or_skip!(RedisServer::start_persistent(
        "a_give_back_that_cannot_reach"
    ));
    let failed = crate::common::process::TargetEvents::new("tower_bulwark::redis");
    // The test and its give-backs' tasks run on this thread.
    let _guard = crate::common::process::thread_subscriber(failed.clone());
    let clock = ManualClock::new();
    let expiry = Duration::from_secs(60);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let instance = policy(&store, &clock, 2, expiry);
    let first = instance.limiter().reserve(&tenant(), 1).await.unwrap();
    let second = instance.limiter().reserve(&tenant(), 1).await.unwrap();
    assert!(first.allowed && second.allowed);
    server.kill();
    assert!(instance.limiter().refund(&tenant(), 1, first));
    assert!(instance.limiter().settle(&tenant(), 1, second, 0));
    eventually("both give-backs failed", Duration::from_secs(20), || {
        failed.count("did not reach redis") == 2
    })
    .await;
    server.restart();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let other = policy(&store, &clock, 2, expiry);
    assert_eq!(
        held(&server, KEY),
        2,
        "the state survived; nothing was sent again"
    );
    assert!(!admits(other.limiter()).await);
    clock.advance(expiry);
    for _ in 0..2 {
        let decision = other.limiter().reserve(&tenant(), 1).await.unwrap();
        assert!(decision.allowed, "back once expired");
    }
    assert_eq!(failed.count("did not reach redis"), 2);
}

/// With Redis gone, the fail mode decides: `Local` keeps the limit per key in this instance and
/// takes its own slots back; `Closed` refuses with its wait; `Propagate` hands the failure on.
#[tokio::test]
async fn with_redis_down_the_fail_mode_decides_and_takes_its_slots_back() {
    let (mut server, store) = or_skip!(RedisServer::with_store("with_redis_down").await);
    let clock = ManualClock::new();
    let expiry = Duration::from_secs(60);
    let with = |mode| policy_with(&store, &clock, 2, expiry, mode);
    let (local, closed) = (
        with(RedisFailMode::Local),
        with(RedisFailMode::Closed(expiry)),
    );
    let propagate = with(RedisFailMode::Propagate);
    server.kill();
    let local = local.limiter();
    let first = local.reserve(&tenant(), 1).await.unwrap();
    assert!(first.allowed);
    assert!(local.reserve(&tenant(), 1).await.unwrap().allowed);
    let refused = local.reserve(&tenant(), 1).await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after_secs(), 1);
    assert!(local.refund(&tenant(), 1, first));
    assert!(
        local.reserve(&tenant(), 1).await.unwrap().allowed,
        "its slot came back"
    );
    let refused = closed.limiter().reserve(&tenant(), 1).await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, expiry);
    let err = propagate.limiter().reserve(&tenant(), 1).await.unwrap_err();
    assert!(err.is::<RedisFailure>(), "{err}");
}

/// A reply of the wrong shape or type is a `BadReply` that says what is wrong; a key of
/// another type fails with Redis's `WRONGTYPE`.
#[tokio::test]
async fn wrong_replies_and_keys_of_the_wrong_type_are_clear_errors() {
    let cases = [
        (
            "*7\r\n:1\r\n:9\r\n:0\r\n:0\r\n:0\r\n:0\r\n:1\r\n",
            "`remaining` (9) exceeds the limit (2)",
        ),
        (
            "*2\r\n:7\r\n:0\r\n",
            "the status is not one a script answers (7)",
        ),
        ("*2\r\n$1\r\n1\r\n:0\r\n", "`status` is not an integer"),
        ("*1\r\n:1\r\n", "expected 7 integers, got 1"),
        ("+OK\r\n", "expected an array of integers"),
        (":-1\r\n", "expected an array of integers"),
    ];
    let clock = ManualClock::new();
    for (reply, what) in cases {
        let fake = FakeRedis::start(reply);
        let store = RedisStore::connect(&fake.url()).await.unwrap();
        let policy = policy(&store, &clock, 2, Duration::from_secs(60));
        let err = policy.limiter().reserve(&tenant(), 1).await.unwrap_err();
        let failure = err.downcast_ref::<RedisFailure>().expect("a RedisFailure");
        assert!(
            matches!(failure, RedisFailure::BadReply(_)),
            "{reply:?}: {failure}"
        );
        assert!(failure.to_string().contains(what), "{reply:?}: {failure}");
    }
    let (server, store) = or_skip!(RedisServer::with_store("keys_of_the_wrong_type").await);
    assert_eq!(server.command(&["SET", KEY, "text"]), "+OK");
    let policy = policy(&store, &clock, 2, Duration::from_secs(60));
    let err = policy.limiter().reserve(&tenant(), 1).await.unwrap_err();
    assert!(
        matches!(err.downcast_ref(), Some(RedisFailure::Redis(_))),
        "{err}"
    );
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
}

/// Settings that cannot work are refused when the policy is built, each saying why.
#[tokio::test]
async fn settings_that_cannot_work_are_refused_with_a_reason() {
    let store = RedisStore::connect_lazy("redis://127.0.0.1:1/").unwrap();
    let redis = || RedisRateLimiter::builder(Quota::per_second(1).unwrap(), store.clone());
    let build = |redis, in_flight| {
        let key = HeaderKey::new("x-tenant").unwrap();
        Policy::concurrent_in_redis("streams", key, in_flight, redis).map(|_| ())
    };
    let cases = [
        (build(redis(), 0), "in_flight"),
        (build(redis().prefix("{p}"), 1), "prefix"),
        (build(redis().timeout(Duration::ZERO), 1), "timeout"),
        (
            build(redis().hold_for(Duration::from_micros(10)), 1),
            "hold_for must be between a second and a day",
        ),
        (
            build(redis().lease(tower_bulwark::redis::Lease::new()), 1),
            "leases no permits",
        ),
    ];
    for (result, what) in cases {
        let err = result.unwrap_err();
        assert!(err.to_string().contains(what), "{err}: {what}");
    }
    assert!(build(redis(), 4).is_ok());
    let client = RedisRateLimiter::builder(Quota::per_second(1).unwrap(), store)
        .client_clock(ManualClock::new())
        .hold_for(Duration::from_secs(30 * 86_400));
    assert!(build(client, 1).is_err(), "30 days of nanoseconds");
}

/// Redis stalls (SIGSTOP) under a decision: the fail mode answers at the timeout, and the
/// decision's call, which Redis runs once resumed, leaves no slot behind: it runs after its
/// deadline and changes nothing, and nothing else is sent.
#[cfg(unix)]
#[tokio::test]
async fn a_decision_that_times_out_in_a_stalled_redis_leaves_no_slot_behind() {
    let (server, store) = or_skip!(RedisServer::with_store("a_decision_that_times_out").await);
    let signal = |signal: &str, pid: &str| {
        let status = std::process::Command::new("kill")
            .args([signal, pid])
            .status();
        assert!(status.unwrap().success(), "kill {signal} {pid}");
    };
    let info = server.command(&["INFO", "server"]);
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    let timeout = Duration::from_millis(200);
    let redis = RedisRateLimiter::builder(Quota::per_second(1).unwrap(), store)
        .client_clock(ManualClock::new())
        .prefix("c:")
        .timeout(timeout)
        .fail_mode(RedisFailMode::Closed(Duration::from_secs(3)))
        .hold_for(Duration::from_secs(60));
    let key = HeaderKey::new("x-tenant").unwrap();
    let policy = Policy::concurrent_in_redis("streams", key, 2, redis).unwrap();
    // Loads the script.
    assert!(admits(policy.limiter()).await);
    eventually("a clean key", Duration::from_secs(10), || {
        held(&server, KEY) == 0
    })
    .await;
    let before = server.evalsha_calls();
    signal("-STOP", &pid);
    let start = Instant::now();
    let decision = policy.limiter().reserve(&tenant(), 1).await;
    let waited = start.elapsed();
    signal("-CONT", &pid);
    let decision = decision.unwrap();
    assert!(!decision.allowed && decision.retry_after == Duration::from_secs(3));
    assert!(waited < timeout + Duration::from_millis(800), "{waited:?}");
    eventually("the call ran", Duration::from_secs(10), || {
        server.evalsha_calls() > before
    })
    .await;
    assert_eq!(held(&server, KEY), 0);
    assert_eq!(server.evalsha_calls(), before + 1);
}

/// A request of three slots settled to one gives back all three (a slot has no cost to settle,
/// as in memory: the third was kept, and renewed for good, before); a refund that names more
/// than its admission took gives back only what it took; a request of more slots than the
/// limit can never be admitted.
#[tokio::test]
async fn a_give_back_frees_what_it_names_and_never_more_than_was_taken() {
    let (server, store) =
        or_skip!(RedisServer::with_store("a_give_back_frees_what_it_names").await);
    let policy = policy(&store, &ManualClock::new(), 4, Duration::from_secs(60));
    let limiter = policy.limiter();
    let three = limiter.reserve(&tenant(), 3).await.unwrap();
    assert!(three.allowed && three.remaining == 1);
    let one = limiter.reserve(&tenant(), 1).await.unwrap();
    assert!(one.allowed && one.remaining == 0);
    let before = server.evalsha_calls();
    assert!(limiter.settle(&tenant(), 3, three, 1));
    assert!(limiter.refund(&tenant(), 10, one));
    eventually("both give-backs ran", Duration::from_secs(10), || {
        server.evalsha_calls() == before + 2
    })
    .await;
    assert_eq!(held(&server, KEY), 0, "three of three, and one of one");
    let err = limiter.reserve(&tenant(), 5).await.unwrap_err();
    let too_many = err.downcast_ref::<tower_bulwark::limiter::InsufficientCapacity>();
    assert_eq!(
        too_many.map(|e| (e.requested(), e.capacity())),
        Some((5, 4))
    );
}

/// A hold of slots settled to any cost gives its slots back (a slot has no cost to settle): to
/// nothing, below its estimate, to it, or past the capacity after taking every slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_of_slots_settled_to_any_cost_gives_its_slots_back() {
    let server = or_skip!(RedisServer::start("slots_settled_to_any_cost"));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let clock = ManualClock::new();
    let p = policy(&store, &clock, 2, Duration::from_secs(30));
    for cost in [0, 1, 2, 3] {
        let d = p.limiter().reserve(&tenant(), 2).await.unwrap();
        assert!(d.allowed);
        assert_eq!(held(&server, KEY), 2);
        assert!(p.limiter().settle(&tenant(), 2, d, cost));
        eventually(
            &format!("the slots settled to {cost} are back"),
            Duration::from_secs(5),
            || held(&server, KEY) == 0,
        )
        .await;
    }
}

/// Two limiters built apart on one store share its state (the guide: such a limiter "shares the
/// state and takes it back"): a hold of slots given back to the one that did not make it is
/// removed in Redis all the same, and the maker's renewals never bring it back (its slots were
/// renewed for good, given back nowhere, before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_given_back_to_another_limiter_on_its_store_is_removed_for_good() {
    let server = or_skip!(RedisServer::start("hold_given_back_to_another_limiter"));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let clock = ManualClock::new();
    let hold_for = Duration::from_secs(1);
    let (maker, other) = (
        policy(&store, &clock, 2, hold_for),
        policy(&store, &clock, 2, hold_for),
    );
    let d = maker.limiter().reserve(&tenant(), 2).await.unwrap();
    assert!(d.allowed);
    assert!(other.limiter().settle(&tenant(), 2, d, 0));
    eventually("the slots removed", Duration::from_secs(5), || {
        held(&server, KEY) == 0
    })
    .await;
    // Renewals run every third of `hold_for`: three of them, and nothing came back.
    tokio::time::sleep(hold_for).await;
    assert_eq!(held(&server, KEY), 0);
    assert!(maker.limiter().reserve(&tenant(), 2).await.unwrap().allowed);
}
