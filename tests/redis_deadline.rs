//! Decisions that arrive after their caller gave up (issue 11, item 12): Redis stopped with
//! SIGSTOP while decisions are sent, each answered by the failure policy at its timeout; when
//! Redis resumes, the queued scripts must change nothing.
#![cfg(all(feature = "redis", unix))]

mod support;

use std::process::Command;
use std::time::Duration;

use support::{FakeRedis, RedisServer};
use tower_bulwark::store::redis::{
    FailurePolicy, RedisAlgorithm, RedisFailure, RedisRateLimiter, RedisStore,
};
use tower_bulwark::{FixedWindow, Gcra, Limiter, Quota, SlidingCounter, SlidingLog};

/// Generous, so that a loaded machine does not time a live Redis out, yet within the
/// connection's own response timeout (500 ms), so that the limiter's timeout answers.
const TIMEOUT: Duration = Duration::from_millis(400);
/// Decisions sent to each limiter while Redis is stopped.
const QUEUED: usize = 12;

/// The server's process id, from `INFO server`.
fn pid(server: &RedisServer) -> String {
    let info = server.command(&["INFO", "server"]);
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .expect("INFO server names the process id")
        .trim()
        .to_owned()
}

fn signal(pid: &str, signal: &str) {
    let status = Command::new("kill")
        .args([signal, pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// Resumes the server however the test ends.
struct Stopped(String);

impl Stopped {
    fn stop(pid: String) -> Self {
        signal(&pid, "-STOP");
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(&self.0, "-CONT");
    }
}

/// Everything the key holds, in a comparable form (expiries aside).
async fn state(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap();
    let body: Vec<String> = match kind.as_str() {
        "none" => Vec::new(),
        "string" => vec![redis::cmd("GET").arg(key).query_async(conn).await.unwrap()],
        "hash" => {
            let mut pairs: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(conn)
                .await
                .unwrap();
            pairs.sort();
            pairs.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
        }
        "zset" => {
            let members: Vec<(String, String)> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(conn)
                .await
                .unwrap();
            members
                .into_iter()
                .map(|(m, s)| format!("{m}@{s}"))
                .collect()
        }
        other => panic!("unexpected type {other}"),
    };
    format!("{kind} {}", body.join(" "))
}

fn build<A: RedisAlgorithm>(store: &RedisStore, prefix: &str) -> RedisRateLimiter<A> {
    // Ten a month: nothing refills while the test runs.
    let quota = Quota::with_period(10, Duration::from_secs(30 * 86_400)).unwrap();
    RedisRateLimiter::builder(quota, store.clone())
        .algorithm::<A>()
        .prefix(prefix)
        .timeout(TIMEOUT)
        // Every decision goes to Redis (none skips it after a failure), so each queues a script.
        .probe_interval(Duration::ZERO)
        .without_refusal_cache()
        .on_failure(FailurePolicy::fail_closed(Duration::from_secs(1)))
        .build()
        .unwrap()
}

/// Sends `QUEUED` decisions at once; each must come back from the failure policy.
fn queue<A: RedisAlgorithm>(limiter: &RedisRateLimiter<A>) -> Vec<tokio::task::JoinHandle<bool>> {
    (0..QUEUED)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.reserve(&"k", 1).await.unwrap().allowed })
        })
        .collect()
}

/// Admissions until the first refusal.
async fn admitted_until_refused<A: RedisAlgorithm>(limiter: &RedisRateLimiter<A>) -> usize {
    let mut admitted = 0;
    while limiter.reserve(&"k", 1).await.unwrap().allowed {
        admitted += 1;
        assert!(admitted <= 100, "never refused");
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_queued_while_redis_was_stopped_spend_nothing_when_it_resumes() {
    let Some(server) = RedisServer::start("decisions_queued_while_redis_was_stopped") else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let gcra = build::<Gcra>(&store, "stop:gcra:");
    let window = build::<FixedWindow>(&store, "stop:fw:");
    let log = build::<SlidingLog>(&store, "stop:log:");
    let counter = build::<SlidingCounter>(&store, "stop:sc:");
    // One admission each while Redis answers.
    assert!(gcra.reserve(&"k", 1).await.unwrap().allowed);
    assert!(window.reserve(&"k", 1).await.unwrap().allowed);
    assert!(log.reserve(&"k", 1).await.unwrap().allowed);
    assert!(counter.reserve(&"k", 1).await.unwrap().allowed);
    let keys = [
        gcra.redis_key("k"),
        window.redis_key("k"),
        log.redis_key("k"),
        counter.redis_key("k"),
    ];
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut before = Vec::new();
    for key in &keys {
        before.push(state(&mut conn, key).await);
    }

    let stopped = Stopped::stop(pid(&server));
    let mut tasks = Vec::new();
    tasks.extend(queue(&gcra));
    tasks.extend(queue(&window));
    tasks.extend(queue(&log));
    tasks.extend(queue(&counter));
    for task in tasks {
        assert!(!task.await.unwrap(), "the failure policy refuses");
    }
    for failures in [
        gcra.failures(),
        window.failures(),
        log.failures(),
        counter.failures(),
    ] {
        assert_eq!(failures, QUEUED as u64, "every queued decision timed out");
    }
    drop(stopped);

    // A decision on another key through the same connection: once it is answered, Redis has run
    // every script queued before it.
    let _ = gcra.reserve(&"barrier", 1).await.unwrap();
    let mut after = Vec::new();
    for key in &keys {
        after.push(state(&mut conn, key).await);
    }
    assert_eq!(
        after, before,
        "the scripts queued during the stop spent nothing"
    );
    // And the quota is whole: 10 in all, one of them taken before the stop.
    assert_eq!(admitted_until_refused(&gcra).await, 9, "gcra");
    assert_eq!(admitted_until_refused(&window).await, 9, "fixed window");
    assert_eq!(admitted_until_refused(&log).await, 9, "sliding log");
    assert_eq!(admitted_until_refused(&counter).await, 9, "sliding counter");
}

/// A server that always answers "late" makes the decision a failure (after one retry with the
/// corrected offset), which the policy decides.
#[tokio::test]
async fn a_late_reply_is_a_failure_decided_by_the_policy() {
    let fake = FakeRedis::start("*2\r\n:2\r\n:1000000\r\n");
    let store = RedisStore::connect(&fake.url()).await.unwrap();
    let limiter = RedisRateLimiter::builder(Quota::per_second(5).unwrap(), store.clone())
        .on_failure(FailurePolicy::propagate())
        .build()
        .unwrap();
    let err = limiter.reserve(&"k", 1).await.unwrap_err();
    let failure = err.downcast_ref::<RedisFailure>().expect("a RedisFailure");
    assert!(failure.is_late(), "{failure}");
    let open = RedisRateLimiter::builder(Quota::per_second(5).unwrap(), store)
        .on_failure(FailurePolicy::fail_open())
        .build()
        .unwrap();
    assert!(open.check(&"k").await.unwrap().allowed);
    assert_eq!(open.failures(), 1);
}
