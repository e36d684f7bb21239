//! Faults: Redis killed under load, Redis restarted with an empty script cache, state of the
//! wrong type, replies of the wrong shape. Every request is answered in time, nothing panics.

use crate::common::redis_server;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::process::{thread_subscriber, TargetEvents};
use crate::common::redis_server::{failure_then_open, or_skip, FakeRedis, RedisServer};
use tower_bulwark::redis::{
    RedisAlgorithm, RedisFailMode, RedisFailure, RedisRateLimiter, RedisRateLimiterBuilder,
    RedisStore,
};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog},
    Limiter, Quota,
};

const TIMEOUT: Duration = Duration::from_millis(250);
/// Scheduling slack on top of the timeout, for a loaded machine.
const SLACK: Duration = Duration::from_millis(750);

#[derive(Debug, Default)]
struct Outcomes {
    before_kill: usize,
    allowed_after_kill: usize,
    refused_after_kill: usize,
    errors_after_kill: usize,
    slowest: Duration,
}

async fn hammer(
    limiter: RedisRateLimiter,
    killed: Arc<AtomicBool>,
    progress: Arc<AtomicUsize>,
    key: String,
) -> Outcomes {
    let mut out = Outcomes::default();
    let mut after = 0;
    while after < 40 {
        let was_killed = killed.load(Ordering::SeqCst);
        let start = Instant::now();
        let result = limiter.reserve(&key, 1).await;
        out.slowest = out.slowest.max(start.elapsed());
        if !was_killed {
            if killed.load(Ordering::SeqCst) {
                // Sent before the kill, answered around it: either outcome is right.
                continue;
            }
            result.expect("redis is up: every decision comes from it");
            out.before_kill += 1;
            progress.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            continue;
        }
        after += 1;
        match result {
            Ok(d) if d.allowed => out.allowed_after_kill += 1,
            Ok(_) => out.refused_after_kill += 1,
            Err(err) => {
                assert!(err.is::<RedisFailure>(), "{err}");
                out.errors_after_kill += 1;
            }
        }
    }
    out
}

/// A limiter of algorithm `A` for 3 a minute on `server`, with the tests' timeout, whose
/// failures are errors.
async fn propagating_three_a_minute<A: RedisAlgorithm>(server: &RedisServer) -> RedisRateLimiter {
    let store = RedisStore::connect(&server.url()).await.unwrap();
    RedisRateLimiter::builder(Quota::per_minute(3).unwrap(), store)
        .algorithm::<A>()
        .timeout(TIMEOUT)
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap()
}

/// What errors a limiter may answer while it reconnects.
#[derive(Clone, Copy, PartialEq)]
enum Errors {
    /// Only `RedisFailure`s (asserted).
    OnlyRedisFailures,
    /// Any error.
    Any,
}

/// Checks key `k` on `limiter` (of 3) until the server it reconnects to answers, within 15 s,
/// every error before that being of the kind `errors` allows; asserts that the answer is an
/// admission from a fresh state.
async fn assert_a_fresh_state_once_reconnected(limiter: &RedisRateLimiter, errors: Errors) {
    let start = Instant::now();
    let decision = loop {
        match limiter.check(&"k").await {
            Ok(d) => break d,
            Err(err) => {
                if errors == Errors::OnlyRedisFailures {
                    assert!(err.is::<RedisFailure>(), "{err}");
                }
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "no reconnection: {err}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 2, "a fresh state on the new server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_every_request_answered_by_policy() {
    let mut server = or_skip!(RedisServer::start("redis_killed_under_load"));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let quota = Quota::per_hour(1_000_000).unwrap();
    let build = |policy: RedisFailMode, prefix: &str| {
        RedisRateLimiter::builder(quota, store.clone())
            .prefix(prefix)
            .timeout(TIMEOUT)
            .fail_mode(policy)
            .build()
            .unwrap()
    };
    let closed = build(RedisFailMode::Closed(Duration::from_secs(2)), "closed:");
    let open = build(RedisFailMode::Open, "open:");
    let fallback = build(
        RedisFailMode::fallback(Quota::per_hour(5).unwrap()),
        "fallback:",
    );
    let propagate = build(RedisFailMode::Propagate, "propagate:");
    let killed = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (name, limiter) in [
        ("closed", &closed),
        ("open", &open),
        ("fallback", &fallback),
        ("propagate", &propagate),
    ] {
        for i in 0..8 {
            let task = hammer(
                limiter.clone(),
                Arc::clone(&killed),
                Arc::clone(&progress),
                format!("k{i}"),
            );
            tasks.push((name, tokio::spawn(task)));
        }
    }
    // Let the load run against a live server, then kill it (SIGKILL, like a crash).
    let limiters = [&closed, &open, &fallback, &propagate];
    redis_server::eventually(
        "redis decided 500 requests",
        Duration::from_secs(20),
        || progress.load(Ordering::SeqCst) >= 500,
    )
    .await;
    killed.store(true, Ordering::SeqCst);
    server.kill();
    let mut by_policy = std::collections::HashMap::<&str, Outcomes>::new();
    for (name, task) in tasks {
        let out = task.await.expect("no task panicked");
        assert!(
            out.slowest <= TIMEOUT + SLACK,
            "{name}: a decision took {:?}",
            out.slowest
        );
        let sum = by_policy.entry(name).or_default();
        sum.before_kill += out.before_kill;
        sum.allowed_after_kill += out.allowed_after_kill;
        sum.refused_after_kill += out.refused_after_kill;
        sum.errors_after_kill += out.errors_after_kill;
    }
    for limiter in limiters {
        assert!(limiter.counts().failures > 0, "{limiter:?}");
    }
    // 8 keys × 40 decisions after the kill for each policy. A request sent just before the kill
    // can still be answered by redis, so the counts are checked per policy's own rule.
    let closed = &by_policy["closed"];
    assert!(closed.before_kill > 0);
    assert_eq!(closed.errors_after_kill, 0);
    assert!(closed.refused_after_kill >= 300, "{closed:?}");
    let open = &by_policy["open"];
    assert_eq!(open.allowed_after_kill, 320, "{open:?}");
    let fallback = &by_policy["fallback"];
    assert_eq!(fallback.errors_after_kill, 0);
    // The local quota: at most 5 per key once redis is gone (8 keys), plus a few in flight.
    assert!(fallback.allowed_after_kill <= 8 * 5 + 8, "{fallback:?}");
    assert!(
        fallback.refused_after_kill >= 320 - 8 * 5 - 8,
        "{fallback:?}"
    );
    let propagate = &by_policy["propagate"];
    assert!(propagate.errors_after_kill >= 300, "{propagate:?}");
}

#[tokio::test]
async fn decisions_resume_after_a_restart_empties_the_script_cache() {
    let mut server = or_skip!(RedisServer::start("decisions_resume_after_a_restart"));
    let limiter = propagating_three_a_minute::<FixedWindow>(&server).await;
    assert!(limiter.check(&"k").await.unwrap().allowed);
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]), "+OK");
    assert!(
        limiter.check(&"k").await.unwrap().allowed,
        "a flushed script cache is reloaded (NOSCRIPT, then load and run)"
    );
    assert_eq!(limiter.counts().failures, 0);

    server.restart();
    let key = limiter.redis_key("k");
    assert_eq!(
        server.command(&["EXISTS", &key]),
        ":0",
        "a new, empty server"
    );
    assert_a_fresh_state_once_reconnected(&limiter, Errors::OnlyRedisFailures).await;
    assert_eq!(server.command(&["EXISTS", &key]), ":1");
}

/// The `calls` of each of `commands` in `INFO commandstats`, failed calls included (zero for a
/// command never called).
async fn calls(conn: &mut redis::aio::MultiplexedConnection, commands: &[&str]) -> Vec<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    commands
        .iter()
        .map(|command| {
            let prefix = format!("cmdstat_{command}:calls=");
            info.lines()
                .find_map(|line| line.strip_prefix(&prefix))
                .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
        })
        .collect()
}

/// Each decision is one `EVALSHA`: the script's body is never sent with a decision, and a script
/// cache emptied under the limiter costs one `NOSCRIPT`, one `SCRIPT LOAD` and the same
/// `EVALSHA` again, for every algorithm, without a failure.
#[tokio::test]
async fn each_decision_is_one_evalsha_and_a_flushed_script_is_loaded_once() {
    let (server, store) = or_skip!(RedisServer::with_store("each_decision_is_one_evalsha").await);
    let mut conn = server.connection().await;
    let quota = Quota::per_minute(1000).unwrap();
    let build = |limiter: RedisRateLimiterBuilder| {
        limiter
            .refusal_cache_capacity(0)
            .fail_mode(RedisFailMode::Propagate)
    };
    let gcra = build(RedisRateLimiter::builder(quota, store.clone()))
        .build()
        .unwrap();
    let window = build(RedisRateLimiter::builder(quota, store.clone()))
        .algorithm::<FixedWindow>()
        .build()
        .unwrap();
    let log = build(RedisRateLimiter::builder(quota, store.clone()))
        .algorithm::<SlidingLog>()
        .build()
        .unwrap();
    let counter = build(RedisRateLimiter::builder(quota, store))
        .algorithm::<SlidingCounter>()
        .build()
        .unwrap();
    type ReserveFuture = <RedisRateLimiter as Limiter<&'static str>>::Future;
    let all: [&dyn Limiter<&str, Future = ReserveFuture>; 4] = [&gcra, &window, &log, &counter];
    let admit_one_each = || async {
        for limiter in all {
            assert!(limiter.reserve(&"k", 1).await.unwrap().allowed);
        }
    };
    for round in 0..2 {
        // Learns the server's clock offset and loads the scripts.
        admit_one_each().await;
        assert_eq!(server.command(&["CONFIG", "RESETSTAT"]), "+OK");
        for _ in 0..10 {
            admit_one_each().await;
        }
        assert_eq!(
            calls(&mut conn, &["evalsha", "eval", "script|load"]).await,
            [40, 0, 0],
            "round {round}: one EVALSHA per decision, and nothing else"
        );
        assert_eq!(server.command(&["SCRIPT", "FLUSH"]), "+OK");
        assert_eq!(server.command(&["CONFIG", "RESETSTAT"]), "+OK");
        admit_one_each().await;
        assert_eq!(
            calls(&mut conn, &["evalsha", "eval", "script|load"]).await,
            [8, 0, 4],
            "round {round}: NOSCRIPT, SCRIPT LOAD and EVALSHA again, once per script"
        );
    }
    let failures = [
        gcra.counts().failures,
        window.counts().failures,
        log.counts().failures,
        counter.counts().failures,
    ];
    assert_eq!(failures, [0; 4]);
}

#[tokio::test]
async fn decisions_resume_after_an_outage_longer_than_the_reconnect_retries() {
    let mut server = or_skip!(RedisServer::start("decisions_resume_after_a_long_outage"));
    let limiter = propagating_three_a_minute::<Gcra>(&server).await;
    assert!(limiter.check(&"k").await.unwrap().allowed);
    server.kill();
    // Requests keep coming during an outage that outlasts the connection's own retries
    // (about 2.5 s of backoff): every one is answered promptly, by the policy.
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(4) {
        let start = Instant::now();
        let err = limiter.check(&"k").await.unwrap_err();
        assert!(err.is::<RedisFailure>(), "{err}");
        assert!(start.elapsed() <= TIMEOUT + SLACK, "{:?}", start.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.restart();
    assert_a_fresh_state_once_reconnected(&limiter, Errors::Any).await;
}

#[tokio::test]
async fn state_of_the_wrong_type_is_an_error_not_a_panic() {
    let Some((server, store)) =
        RedisServer::with_store("state_of_the_wrong_type_is_an_error").await
    else {
        return;
    };
    let quota = Quota::per_second(5).unwrap();
    let gcra = RedisRateLimiter::builder(quota, store.clone())
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap();
    let window = RedisRateLimiter::builder(quota, store.clone())
        .algorithm::<FixedWindow>()
        .fail_mode(RedisFailMode::Closed(Duration::from_secs(1)))
        .build()
        .unwrap();
    assert_eq!(
        server.command(&["SET", &gcra.redis_key("k"), "garbage"]),
        "+OK"
    );
    assert_eq!(server.command(&["SET", &window.redis_key("k"), "5"]), "+OK");
    let err = gcra.check(&"k").await.unwrap_err();
    let failure = err.downcast_ref::<RedisFailure>().expect("a RedisFailure");
    assert!(matches!(failure, RedisFailure::Redis(_)), "{failure}");
    assert!(failure.to_string().contains("not a number"), "{failure}");
    let d = window.check(&"k").await.unwrap();
    assert!(!d.allowed, "WRONGTYPE, so the policy refuses");
    assert_eq!(window.counts().failures, 1);
}

#[tokio::test]
async fn a_reply_of_the_wrong_shape_is_an_error_not_a_panic() {
    for reply in [
        "*2\r\n:1\r\n:2\r\n",
        ":1\r\n",
        "$3\r\nabc\r\n",
        "*6\r\n:1\r\n:1\r\n:0\r\n$2\r\nno\r\n:0\r\n:0\r\n",
        "*6\r\n:7\r\n:1\r\n:0\r\n:0\r\n:0\r\n:0\r\n",
        "*-1\r\n",
    ] {
        let fake = FakeRedis::start(reply);
        let err = failure_then_open(&fake).await;
        let failure = err.downcast_ref::<RedisFailure>().expect("a RedisFailure");
        assert!(
            matches!(failure, RedisFailure::BadReply(_)),
            "{reply:?}: {failure}"
        );
    }
}

#[tokio::test]
async fn failures_are_logged_once_loudly_then_quietly_and_recovery_is_told() {
    let mut server = or_skip!(RedisServer::start("failures_are_logged"));
    let recorder = TargetEvents::new("tower_bulwark::redis");
    // The test runs on one thread, so a thread-local default subscriber sees every event.
    let _guard = thread_subscriber(recorder.clone());
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let limiter = RedisRateLimiter::builder(Quota::per_minute(3).unwrap(), store)
        .timeout(TIMEOUT)
        .fail_mode(RedisFailMode::Closed(Duration::from_secs(1)))
        .build()
        .unwrap();
    assert!(limiter.check(&"k").await.unwrap().allowed);
    assert!(
        recorder.seen().is_empty(),
        "nothing to say while redis answers"
    );
    server.kill();
    for _ in 0..3 {
        assert!(!limiter.check(&"k").await.unwrap().allowed);
    }
    assert_eq!(limiter.counts().failures, 3);
    {
        let events = recorder.seen();
        let levels: Vec<_> = events.iter().map(|(level, _)| *level).collect();
        assert_eq!(
            levels,
            [
                tracing::Level::WARN,
                tracing::Level::DEBUG,
                tracing::Level::DEBUG
            ],
            "{events:?}"
        );
        assert!(events[0].1.contains("fail mode"), "{events:?}");
    }
    server.restart();
    let start = Instant::now();
    // Refusals come from the policy; the first admission comes from the fresh server.
    while !limiter.check(&"k").await.unwrap().allowed {
        assert!(start.elapsed() < Duration::from_secs(15), "no reconnection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let events = recorder.seen();
    let last = events.last().unwrap();
    assert_eq!(last.0, tracing::Level::INFO, "{events:?}");
    assert!(last.1.contains("redis answers again"), "{events:?}");
}

/// A leasing limiter given a lease reply of the wrong shape (a lease of nothing, one beyond the
/// burst, one that ends by its start, too few fields), or lease state in Redis that this crate
/// did not write: an error naming what is wrong (or the fail mode's answer), never a panic, and
/// no share taken.
#[tokio::test]
async fn a_lease_reply_or_state_of_the_wrong_shape_is_an_error_not_a_panic() {
    use tower_bulwark::redis::Lease;

    let quota = Quota::per_second(5).unwrap();
    for (reply, what) in [
        ("*6\r\n:4\r\n:0\r\n:1\r\n:2\r\n:0\r\n:1\r\n", "a lease of 0"),
        (
            "*6\r\n:4\r\n:6\r\n:1\r\n:2\r\n:0\r\n:1\r\n",
            "exceeds the limit",
        ),
        ("*6\r\n:4\r\n:2\r\n:5\r\n:5\r\n:0\r\n:1\r\n", "by its start"),
        (
            "*5\r\n:4\r\n:2\r\n:1\r\n:2\r\n:1\r\n",
            "expected 6 integers",
        ),
        (
            "*6\r\n:4\r\n:2\r\n:-1\r\n:2\r\n:0\r\n:1\r\n",
            "`start` is negative",
        ),
    ] {
        let fake = FakeRedis::start(reply);
        let store = RedisStore::connect(&fake.url()).await.unwrap();
        let limiter = RedisRateLimiter::builder(quota, store)
            .lease(Lease::new())
            .fail_mode(RedisFailMode::Propagate)
            .build()
            .unwrap();
        let err = limiter.check(&"k").await.unwrap_err();
        let failure = err.downcast_ref::<RedisFailure>().expect("a RedisFailure");
        assert!(
            matches!(failure, RedisFailure::BadReply(_)),
            "{reply:?}: {failure}"
        );
        assert!(failure.to_string().contains(what), "{reply:?}: {failure}");
        assert_eq!(limiter.counts().leases_taken, 0);
    }

    let (server, store) =
        or_skip!(RedisServer::with_store("a_lease_state_of_the_wrong_shape").await);
    let limiter = RedisRateLimiter::builder(quota, store)
        .lease(Lease::new())
        .fail_mode(RedisFailMode::Closed(Duration::from_secs(1)))
        .build()
        .unwrap();
    for state in ["5:5;x,1,9", "5:5;1,-2,9", "5:5;1,2,1e300"] {
        assert_eq!(
            server.command(&["SET", &limiter.redis_key("k"), state]),
            "+OK"
        );
        let decision = limiter.check(&"k").await.unwrap();
        assert!(!decision.allowed, "{state}: the fail mode refuses");
    }
    assert_eq!(limiter.counts().failures, 3);
    assert_eq!(limiter.counts().leases_taken, 0);
}

/// `Limiter::refund`: a decision given to another limiter, or back under another key, "gives
/// nothing back" and returns `false`. Also for an admission a fail mode made while Redis could
/// not answer: `Open`'s (made by no limiter) and the default local limiter's. Was broken: any
/// fail mode's admission was taken back by any Redis limiter under any key (`true`), so
/// `Observed` uncounted admissions nothing took back.
#[tokio::test]
async fn a_fail_mode_admission_is_taken_back_only_by_its_limiter_for_its_key() {
    let dead = || RedisStore::connect_lazy("redis://127.0.0.1:1/").unwrap();
    let quota = Quota::per_hour(100).unwrap();
    for mode in ["open", "local"] {
        let build = |store: RedisStore, prefix: &str| {
            let builder = RedisRateLimiter::builder(quota, store)
                .prefix(prefix)
                .timeout(TIMEOUT);
            match mode {
                "open" => builder.fail_mode(RedisFailMode::Open),
                _ => builder,
            }
            .build()
            .unwrap()
        };
        // `b` on a store of its own; `c` on `a`'s store under another prefix (other keys).
        let store = dead();
        let (a, b) = (build(store.clone(), "p:"), build(dead(), "p:"));
        let c = build(store, "q:");
        assert!(
            !Limiter::refund(&c, &"x", 1, a.check(&"x").await.unwrap()),
            "{mode}: c"
        );
        let admitted = || async {
            let decision = a.check(&"x").await.unwrap();
            assert!(decision.allowed, "{mode}: {decision:?}");
            decision
        };
        assert!(
            !Limiter::refund(&a, &"y", 1, admitted().await),
            "{mode}: another key"
        );
        assert!(
            !Limiter::refund(&b, &"x", 1, admitted().await),
            "{mode}: another limiter"
        );
        let settled = Limiter::settle(&b, &"x", 1, admitted().await, 5);
        assert!(!settled, "{mode}: another limiter's settle");
        assert!(
            Limiter::refund(&a, &"x", 1, admitted().await),
            "{mode}: its own"
        );
        assert!(
            Limiter::settle(&a, &"x", 1, admitted().await, 2),
            "{mode}: its own"
        );
    }
}

/// A client clock past what a script can take exactly (2^52 ticks) is a `ClockOutOfRange`
/// failure, told before any call (here to a Redis that is not there); at 2^52 the call is made
/// (and fails to connect). A limiter and a clock of its own for each reading (a `ManualClock`
/// never goes back).
#[tokio::test]
async fn a_client_clock_past_what_the_scripts_take_fails_before_any_call() {
    use tower_bulwark::clock::ManualClock;

    for (at, out_of_range) in [(1u64 << 52, false), ((1 << 52) + 1, true)] {
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(at));
        let limiter = RedisRateLimiter::builder(
            Quota::per_second(10).unwrap(),
            RedisStore::connect_lazy("redis://127.0.0.1:1/").unwrap(),
        )
        .client_clock(clock)
        .fail_mode(RedisFailMode::Propagate)
        .timeout(TIMEOUT)
        .build()
        .unwrap();
        let err = limiter.check(&"k").await.unwrap_err();
        let failure = err.downcast_ref::<RedisFailure>().expect("a RedisFailure");
        let clock_failure = matches!(failure, RedisFailure::ClockOutOfRange(now) if *now == at);
        assert_eq!(clock_failure, out_of_range, "{at}: {failure}");
    }
}
