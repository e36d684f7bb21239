//! A Redis that stalls under a lease call (found by a blind attack): the lease call carries the
//! deadline a decision carries, so Redis running it after its caller was answered leases
//! nothing; and callers queued behind it for the key's turn are answered within the timeout,
//! not one timeout more each.

use std::time::{Duration, Instant};

use tower_bulwark::redis::{Lease, RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::Quota;

use crate::common::redis_server::{or_skip, RedisServer};

/// 10 per 100 s, on the server's clock, through `url` under `prefix`.
fn builder(store: RedisStore, prefix: &str) -> tower_bulwark::redis::RedisRateLimiterBuilder {
    let quota = Quota::with_period(10, Duration::from_secs(100)).unwrap();
    (RedisRateLimiter::builder(quota, store).prefix(prefix)).refusal_cache_capacity(0)
}

/// An instance leasing the whole burst for a second, which waits 100 ms for Redis, then
/// refuses, and tries Redis on every decision (`probe_interval` zero).
async fn leasing(url: &str, prefix: &str) -> RedisRateLimiter {
    let store = RedisStore::connect(url).await.unwrap();
    builder(store, prefix)
        .timeout(Duration::from_millis(100))
        .probe_interval(Duration::ZERO)
        .fail_mode(RedisFailMode::Closed(Duration::from_secs(1)))
        .lease(Lease::new().max_share(10).length(Duration::from_secs(1)))
        .build()
        .unwrap()
}

/// Calls of `n` tasks to `limiter` on one key at once: whether each was admitted and how long
/// it waited.
async fn at_once(limiter: &RedisRateLimiter, n: usize) -> Vec<(bool, Duration)> {
    let calls: Vec<_> = (0..n)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let decision = limiter.check(&"k").await.unwrap();
                (decision.allowed, started.elapsed())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    answers
}

/// `redis` module docs: "A decision that comes too late changes nothing. Each script carries a
/// deadline in the server's time ... A script that Redis runs later (after a stall, say) changes
/// nothing". Four lease calls held up by a stall ran once Redis resumed, each leaving a lease
/// nobody held: another instance found 6 of the burst of 10 until they ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_call_run_after_a_stall_leases_nothing() {
    let server = or_skip!(RedisServer::start("attack_lease_stall_late"));
    let leasing = leasing(&server.url(), "stall:late:").await;
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let other = (builder(store, "stall:late:").timeout(Duration::from_secs(3)))
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap();
    // Both know the offset to the server's clock.
    assert!(leasing.check(&"warm").await.unwrap().allowed);
    assert!(other.check(&"warm").await.unwrap().allowed);
    {
        let _stalled = server.stall();
        let started = Instant::now();
        let answers = at_once(&leasing, 4).await;
        assert!(answers.iter().all(|(allowed, _)| !allowed), "{answers:?}");
        // Stalled past every caller's deadline, then resumed: Redis runs what was sent.
        tokio::time::sleep_until((started + Duration::from_millis(800)).into()).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut admitted = 0;
    while other.check(&"k").await.unwrap().allowed {
        admitted += 1;
    }
    let state = server.command(&["GET", &other.redis_key(&"k")]);
    assert_eq!(admitted, 10, "the key's state: {state:?}");
}

/// `redis` module docs: "Never hangs. Every call is bounded by a short timeout". Six callers of
/// one key while Redis stalls: the k-th waited k timeouts for its turn behind the others' lease
/// calls (608 ms for the sixth, with a timeout of 100 ms). Each waits at most the timeout for its
/// turn, and its own call at most the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_queued_behind_a_stalled_lease_call_are_answered_within_the_timeout() {
    let server = or_skip!(RedisServer::start("attack_lease_stall_queue"));
    let leasing = leasing(&server.url(), "stall:queue:").await;
    assert!(leasing.check(&"warm").await.unwrap().allowed);
    let answers = {
        let _stalled = server.stall();
        at_once(&leasing, 6).await
    };
    let longest = answers.iter().map(|(_, waited)| *waited).max().unwrap();
    // A turn and a call, and room for a loaded machine's scheduling; never one timeout more for
    // each caller ahead.
    assert!(longest < Duration::from_millis(290), "{answers:?}");
}
