//! Decisions that arrive after their caller gave up: Redis stopped with SIGSTOP while decisions
//! are sent, each answered by the fail mode at its timeout; when Redis resumes, the queued
//! scripts must change nothing.

use crate::common::for_every_algorithm;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::poll_once;
use crate::common::redis_server::{failure_then_open, key_state, or_skip, FakeRedis, RedisServer};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tower_bulwark::redis::{
    RedisAlgorithm, RedisFailMode, RedisFailure, RedisRateLimiter, RedisStore,
};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog},
    Limiter, Quota,
};

/// Generous, so that a loaded machine does not time a live Redis out, yet within the
/// connection's own response timeout (500 ms), so that the limiter's timeout answers.
const TIMEOUT: Duration = Duration::from_millis(400);
/// Scheduling slack on top of a timeout, for a loaded machine.
const SLACK: Duration = Duration::from_millis(600);
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

/// Everything the key holds, in a comparable form (expiries aside), on one line.
async fn state(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    let mut parts = key_state(conn, key).await;
    if parts.len() == 1 {
        // Nothing but the type: keep the separator the other forms have.
        parts.push(String::new());
    }
    parts.join(" ")
}

fn build<A: RedisAlgorithm>(store: &RedisStore, prefix: &str) -> RedisRateLimiter {
    // Ten a month: nothing refills while the test runs.
    let quota = Quota::with_period(10, Duration::from_secs(30 * 86_400)).unwrap();
    RedisRateLimiter::builder(quota, store.clone())
        .algorithm::<A>()
        .prefix(prefix)
        .timeout(TIMEOUT)
        // Every decision goes to Redis (none skips it after a failure), so each queues a script.
        .probe_interval(Duration::ZERO)
        .refusal_cache_capacity(0)
        .fail_mode(RedisFailMode::Closed(Duration::from_secs(1)))
        .build()
        .unwrap()
}

/// Sends `QUEUED` decisions at once; each must come back from the fail mode. Each task answers
/// whether its decision admitted and how long it took.
fn queue(limiter: &RedisRateLimiter) -> Vec<tokio::task::JoinHandle<(bool, Duration)>> {
    (0..QUEUED)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let allowed = limiter.reserve(&"k", 1).await.unwrap().allowed;
                (allowed, start.elapsed())
            })
        })
        .collect()
}

/// Admissions until the first refusal.
async fn admitted_until_refused(limiter: &RedisRateLimiter) -> usize {
    let mut admitted = 0;
    while limiter.reserve(&"k", 1).await.unwrap().allowed {
        admitted += 1;
        assert!(admitted <= 100, "never refused");
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_queued_while_redis_was_stopped_spend_nothing_when_it_resumes() {
    let Some((server, store)) =
        RedisServer::with_store("decisions_queued_while_redis_was_stopped").await
    else {
        return;
    };
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
    let mut conn = server.connection().await;
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
        let (allowed, took) = task.await.unwrap();
        assert!(!allowed, "the fail mode refuses");
        assert!(took <= TIMEOUT + SLACK, "answered at the timeout: {took:?}");
    }
    for failures in [
        gcra.counts().failures,
        window.counts().failures,
        log.counts().failures,
        counter.counts().failures,
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

/// Waits for the answer of a task of [`queue`], which must come from the fail mode.
async fn refused_by_the_fail_mode(task: tokio::task::JoinHandle<(bool, Duration)>) -> Duration {
    let (allowed, took) = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("a decision is answered while redis is stopped")
        .unwrap();
    assert!(!allowed, "the fail mode refuses");
    took
}

/// Waits until a decision on another key comes from Redis (the fail mode refuses, a fresh key is
/// admitted): the resumed server has then run the scripts queued before it.
/// Admits one request of key `k` on `limiter`: its Redis key, a plain connection to `server`
/// and the key's state then.
async fn one_admitted(
    limiter: &RedisRateLimiter,
    server: &RedisServer,
) -> (String, redis::aio::MultiplexedConnection, String) {
    assert!(limiter.reserve(&"k", 1).await.unwrap().allowed);
    let key = limiter.redis_key("k");
    let mut conn = server.connection().await;
    let before = state(&mut conn, &key).await;
    (key, conn, before)
}

/// Once Redis answers again (see [`barrier`]), asserts that the scripts the stall held up
/// changed nothing: the key's state is still `before` and the quota of 10 is whole but for the
/// one admitted.
async fn assert_nothing_spent(
    limiter: &RedisRateLimiter,
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    before: &str,
) {
    barrier(limiter).await;
    assert_eq!(state(conn, key).await, before, "nothing spent");
    assert_eq!(
        admitted_until_refused(limiter).await,
        9,
        "the quota is whole"
    );
}

async fn barrier(limiter: &RedisRateLimiter) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while !limiter.reserve(&"barrier", 1).await.unwrap().allowed {
        assert!(Instant::now() < give_up, "redis answers again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Scripts sent on a connection that the client has since replaced run in the same turn of
    // the server's loop; a moment more covers a slow one.
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// A Redis that stalls, on a connection with no response timeout of its own: every decision is
/// answered by the fail mode at the limiter's timeout, and the scripts, run when Redis resumes,
/// change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_is_answered_at_the_limiters_timeout() {
    let server = or_skip!(RedisServer::start("a_stalled_redis_is_answered"));
    let client = redis::Client::open(server.url()).unwrap();
    let config = ConnectionManagerConfig::new().set_response_timeout(None);
    let manager = ConnectionManager::new_with_config(client, config)
        .await
        .unwrap();
    let limiter = build::<Gcra>(&RedisStore::from_manager(manager), "stall:");
    let (key, mut conn, before) = one_admitted(&limiter, &server).await;

    let stopped = Stopped::stop(pid(&server));
    for task in queue(&limiter) {
        let took = refused_by_the_fail_mode(task).await;
        assert!(took <= TIMEOUT + SLACK, "answered at the timeout: {took:?}");
    }
    drop(stopped);
    assert_nothing_spent(&limiter, &mut conn, &key, &before).await;
}

/// A limiter whose timeout is longer than its connection's response timeout (500 ms) has its
/// callers answered by the connection: the deadline its scripts carry is the connection's, so a
/// script held up between the two changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connections_response_timeout_bounds_the_deadline() {
    let (server, store) =
        or_skip!(RedisServer::with_store("the_connections_response_timeout").await);
    let limiter_timeout = Duration::from_secs(3);
    let limiter = RedisRateLimiter::builder(
        Quota::with_period(10, Duration::from_secs(30 * 86_400)).unwrap(),
        store,
    )
    .prefix("response:")
    .timeout(limiter_timeout)
    .probe_interval(Duration::ZERO)
    .refusal_cache_capacity(0)
    .fail_mode(RedisFailMode::Closed(Duration::from_secs(1)))
    .build()
    .unwrap();
    let (key, mut conn, before) = one_admitted(&limiter, &server).await;

    let stopped = Stopped::stop(pid(&server));
    let started = Instant::now();
    for task in queue(&limiter) {
        let took = refused_by_the_fail_mode(task).await;
        assert!(
            took < limiter_timeout - Duration::from_secs(1),
            "answered at the connection's response timeout: {took:?}"
        );
    }
    // Held up past the connection's response timeout, well within the limiter's.
    tokio::time::sleep_until((started + Duration::from_millis(1500)).into()).await;
    drop(stopped);
    assert_nothing_spent(&limiter, &mut conn, &key, &before).await;
}

/// A server that always answers "late" makes the decision a failure (after one retry with the
/// corrected offset), which the policy decides.
#[tokio::test]
async fn a_late_reply_is_a_failure_decided_by_the_policy() {
    let fake = FakeRedis::start("*2\r\n:2\r\n:1000000\r\n");
    let err = failure_then_open(&fake).await;
    let failure = err.downcast_ref::<RedisFailure>().expect("a RedisFailure");
    assert!(matches!(failure, RedisFailure::Late), "{failure}");
}

/// A key's state without the latest clock reading that every script records (GCRA's
/// `<tat>:<latest>`, the hashes' field `l`, the sliding log's member `hw`): with the server's
/// time it moves on with every call, and it decides nothing that a fresh reading would not.
fn permits(state: &str) -> String {
    if let Some(gcra) = state.strip_prefix("string ") {
        let tat = gcra.split_once(':').map_or(gcra, |(tat, _)| tat);
        return format!("string {tat}");
    }
    state
        .split(' ')
        .filter(|part| !part.starts_with("l=") && !part.starts_with("hw@"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Waits, within a bound, until the key holds the permits of `expected`.
async fn until_state(conn: &mut redis::aio::MultiplexedConnection, key: &str, expected: &str) {
    let expected = permits(expected);
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = permits(&state(conn, key).await);
        if now == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{key}: still {now:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A caller that goes away while its script is on the way (a client that hangs up, a timeout
/// layer above) spends nothing: dropped after any number of polls, the decision is finished on
/// the runtime and what it admitted is given back.
async fn abandoned_decisions_spend_nothing<A: RedisAlgorithm>(server: &RedisServer, tag: &str) {
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let limiter = RedisRateLimiter::builder(
        Quota::with_period(10, Duration::from_secs(30 * 86_400)).unwrap(),
        store,
    )
    .algorithm::<A>()
    .prefix(tag)
    .timeout(TIMEOUT)
    .refusal_cache_capacity(0)
    .fail_mode(RedisFailMode::Propagate)
    .build()
    .unwrap();
    let (key, mut conn, before) = one_admitted(&limiter, server).await;

    // Dropped after 0, 1, 2, ... polls, with the runtime free to move the request on between
    // polls (a fraction of a round trip each), until the decision completes before the drop.
    let mut completed = false;
    for polls in 0.. {
        let mut future = limiter.reserve(&"k", 1);
        for _ in 0..polls {
            if let std::task::Poll::Ready(result) = poll_once(std::pin::Pin::new(&mut future)) {
                let decision = result.unwrap();
                assert!(decision.allowed);
                limiter.settle_and_wait(&"k", 1, decision, 0).await.unwrap();
                completed = true;
                break;
            }
            tokio::time::sleep(Duration::from_micros(50)).await;
        }
        drop(future);
        until_state(&mut conn, &key, &before).await;
        if completed {
            break;
        }
        assert!(
            polls < 2_000,
            "{tag}: a decision completes within 2 000 polls"
        );
    }

    // The same with the script held up in a stopped server: it runs when the server resumes,
    // after its caller has gone.
    let stopped = Stopped::stop(pid(server));
    let mut future = limiter.reserve(&"k", 1);
    for _ in 0..4 {
        assert!(poll_once(std::pin::Pin::new(&mut future)).is_pending());
        tokio::task::yield_now().await;
    }
    drop(future);
    drop(stopped);
    until_state(&mut conn, &key, &before).await;
    assert_eq!(
        admitted_until_refused(&limiter).await,
        9,
        "{tag}: the quota is whole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_decisions_spend_nothing_in_any_algorithm() {
    let server = or_skip!(RedisServer::start("abandoned_decisions_spend_nothing"));
    for_every_algorithm!(prefixed "gone:": abandoned_decisions_spend_nothing(&server).await);
}
