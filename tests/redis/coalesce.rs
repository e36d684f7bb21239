//! Decisions on one key that go to Redis at the same time from one limiter are sent as one
//! script call: each decided in order inside it, exactly as alone, in fewer calls, and whatever
//! becomes of the callers (dropped before, during or after their call) the key's turn passes on.

use crate::common::for_every_algorithm;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis_server::{or_skip, uncached, FakeRedis, RedisServer};
use crate::common::{poll_once, waits_up_to, Rng};
use tower_bulwark::redis::{
    RedisAlgorithm, RedisFailMode, RedisFailure, RedisRateLimiter, RedisStore,
};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    KeyedRateLimiter, Limiter, Quota,
};

/// Rounds of decisions started together on one thread (so that they queue in the order they
/// start) on two keys, random costs, reservations and immediate ones, the clock moving between
/// rounds: every decision is the in-memory limiter's for the same requests in the same order,
/// field for field, and they took fewer script calls than decisions.
async fn batches_decide_as_in_memory<A: RedisAlgorithm>(server: &RedisServer, seed: u64) {
    let quota = waits_up_to(Quota::per_second(20).unwrap(), Duration::from_millis(300));
    let clock = ManualClock::new();
    let memory = KeyedRateLimiter::<String>::builder(quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let redis = uncached::<A>(&store, quota, &clock, &format!("batch:{seed}:"));
    let mut rng = Rng(seed);
    let (mut decisions, calls_before) = (0, server.evalsha_calls());
    for round in 0..40 {
        let asked: Vec<(String, u32, bool)> = (0..2 + rng.below(20))
            .map(|_| {
                let key = ["a", "b"][rng.below(2) as usize].to_string();
                (key, 1 + rng.below(3) as u32, rng.below(2) == 0)
            })
            .collect();
        decisions += asked.len();
        let in_redis = futures::future::join_all(asked.iter().map(|(key, cost, wait)| {
            let redis = &redis;
            async move {
                match wait {
                    true => redis.reserve(key, *cost).await,
                    false => redis.check_n(key, *cost).await,
                }
            }
        }))
        .await;
        for ((key, cost, wait), r) in asked.iter().zip(in_redis) {
            let m = match wait {
                true => memory.reserve(key, *cost).await.unwrap(),
                false => memory.check_n(key, *cost).unwrap(),
            };
            let r = r.unwrap_or_else(|e| panic!("seed {seed}, round {round}: {e}"));
            assert_eq!(m, r, "seed {seed}, round {round}: {key} for {cost}");
        }
        clock.advance(Duration::from_millis(rng.below(120)));
    }
    let calls = server.evalsha_calls() - calls_before;
    // At most two calls a key a round: the first decision alone, then the rest together.
    assert!(
        calls <= 40 * 2 * 2 && calls * 2 < decisions as u64,
        "{calls} calls for {decisions} decisions"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn decisions_batched_in_one_call_are_decided_as_each_alone() {
    let server = or_skip!(RedisServer::start("decisions_batched_in_one_call"));
    batches_decide_as_in_memory::<Gcra>(&server, 1).await;
    batches_decide_as_in_memory::<FixedWindow>(&server, 2).await;
    batches_decide_as_in_memory::<SlidingLog>(&server, 3).await;
    batches_decide_as_in_memory::<SlidingCounter>(&server, 4).await;
}

/// 400 tasks on two threads race for 50 permits of one key: exactly 50 are admitted, in far
/// fewer script calls than decisions, for each algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_get_exactly_the_limit_in_fewer_calls() {
    let server = or_skip!(RedisServer::start("racing_tasks_get_exactly_the_limit"));
    async fn race<A: RedisAlgorithm>(server: &RedisServer) {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let limiter = RedisRateLimiter::builder(Quota::per_hour(50).unwrap(), store)
            .algorithm::<A>()
            .prefix(format!("race:{}:", std::any::type_name::<A>()))
            .refusal_cache_capacity(0)
            .fail_mode(RedisFailMode::Propagate)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let before = server.evalsha_calls();
        let start = Arc::new(tokio::sync::Barrier::new(400));
        let tasks: Vec<_> = (0..400)
            .map(|_| {
                let (limiter, start) = (limiter.clone(), Arc::clone(&start));
                tokio::spawn(async move {
                    start.wait().await;
                    limiter.check(&"hot").await.unwrap().allowed
                })
            })
            .collect();
        let mut allowed = 0;
        for task in tasks {
            allowed += usize::from(task.await.unwrap());
        }
        let calls = server.evalsha_calls() - before;
        let name = std::any::type_name::<A>();
        assert_eq!(allowed, 50, "{name}");
        assert!(calls < 200, "{name}: {calls} calls for 400 decisions");
    }
    for_every_algorithm!(race(&server).await);
}

type Decision = Pin<
    Box<dyn Future<Output = Result<tower_bulwark::limiter::Decision, tower_bulwark::BoxError>>>,
>;

/// Decisions started together, some dropped before they were polled, some after (while their
/// call, or the call they wait for, is in flight; the first is the one sending): every other
/// decision is answered by Redis, a decision afterwards is too (the key's turn passed on), and
/// what the dropped ones were admitted goes back, so the key ends with exactly the kept
/// admissions spent.
#[tokio::test(flavor = "current_thread")]
async fn decisions_dropped_at_any_point_leave_the_key_free_and_spend_nothing() {
    let (_server, store) =
        or_skip!(RedisServer::with_store("decisions_dropped_at_any_point").await);
    let clock = ManualClock::new();
    let limiter = RedisRateLimiter::builder(Quota::per_hour(1000).unwrap(), store)
        .client_clock(clock.clone())
        .refusal_cache_capacity(0)
        .fail_mode(RedisFailMode::Propagate)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut rng = Rng(7);
    let mut kept_admitted = 0;
    for round in 0..30 {
        let mut started: Vec<(Decision, bool)> = (0..1 + rng.below(12))
            .map(|_| {
                let limiter = limiter.clone();
                let decision: Decision = Box::pin(async move { limiter.check(&"k").await });
                (decision, false)
            })
            .collect();
        let mut answered_at_once = Vec::new();
        for (i, (decision, polled)) in started.iter_mut().enumerate() {
            if rng.below(4) > 0 {
                match poll_once(decision.as_mut()) {
                    std::task::Poll::Pending => *polled = true,
                    std::task::Poll::Ready(answer) => answered_at_once.push((i, answer)),
                }
            }
        }
        for (i, answer) in answered_at_once.into_iter().rev() {
            assert!(answer.unwrap().allowed);
            kept_admitted += 1;
            drop(started.remove(i));
        }
        let mut kept = Vec::new();
        for (i, (decision, polled)) in started.into_iter().enumerate() {
            // The first (which sends, if it was polled) is dropped as often as the others.
            if rng.below(3) == 0 || (i == 0 && polled && rng.below(2) == 0) {
                drop(decision);
            } else {
                kept.push(decision);
            }
        }
        for decision in kept {
            let decision = tokio::time::timeout(Duration::from_secs(5), decision)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a kept decision was never answered"))
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert!(decision.allowed, "round {round}");
            kept_admitted += 1;
        }
    }
    // What the dropped ones were admitted comes back on the runtime: wait until it has.
    let expected = 1000 - kept_admitted;
    let mut remaining = None;
    for _ in 0..500 {
        let now = limiter.check_n(&"k", 1).await.unwrap();
        remaining = Some(now.remaining + 1);
        limiter.settle_and_wait(&"k", 1, now, 0).await.unwrap();
        if remaining == Some(expected) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(remaining, Some(expected), "{kept_admitted} kept admissions");
}

/// The first decision on a key makes its call from its caller's future, and those queued behind
/// it do not wait for that future to be polled again: with the first held unpolled (as a caller
/// awaiting its futures one after another does), each later one is answered, in one more call,
/// and the first is too when it is polled at last.
#[tokio::test(flavor = "current_thread")]
async fn decisions_queued_behind_an_unpolled_first_call_are_answered() {
    let (server, store) =
        or_skip!(RedisServer::with_store("queued_behind_an_unpolled_first").await);
    let limiter = RedisRateLimiter::builder(Quota::per_hour(1000).unwrap(), store)
        .refusal_cache_capacity(0)
        .fail_mode(RedisFailMode::Propagate)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let check = |limiter: &RedisRateLimiter| -> Decision {
        let limiter = limiter.clone();
        Box::pin(async move { limiter.check(&"k").await })
    };
    for round in 0..5 {
        let mut first = check(&limiter);
        assert!(
            poll_once(first.as_mut()).is_pending(),
            "round {round}: the first call is sent"
        );
        let mut later: Vec<Decision> = (0..3).map(|_| check(&limiter)).collect();
        for decision in &mut later {
            assert!(
                poll_once(decision.as_mut()).is_pending(),
                "round {round}: queued"
            );
        }
        for decision in later {
            let decision = tokio::time::timeout(Duration::from_secs(5), decision)
                .await
                .unwrap_or_else(|_| panic!("round {round}: waited on the unpolled first call"))
                .unwrap();
            assert!(decision.allowed, "round {round}");
        }
        assert!(first.await.unwrap().allowed, "round {round}");
    }
    let left = limiter.check(&"k").await.unwrap().remaining;
    assert_eq!(left, 1000 - 21, "every decision spent one permit");

    // A first caller polled again only after the queue behind it was sent, and a later call
    // made on the key, leaves that later call's hold alone: those queued behind the later one
    // still go together, in one call.
    let mut first = check(&limiter);
    assert!(poll_once(first.as_mut()).is_pending());
    let mut queued = check(&limiter);
    assert!(poll_once(queued.as_mut()).is_pending());
    assert!(queued.await.unwrap().allowed);
    let calls = server.evalsha_calls();
    let mut later = check(&limiter);
    assert!(
        poll_once(later.as_mut()).is_pending(),
        "the later call is sent"
    );
    assert!(first.await.unwrap().allowed);
    let behind: Vec<Decision> = (0..3).map(|_| check(&limiter)).collect();
    let (behind, later) = futures::join!(futures::future::join_all(behind), later);
    assert!(later.unwrap().allowed);
    assert!(behind.into_iter().all(|d| d.unwrap().allowed));
    assert_eq!(
        server.evalsha_calls() - calls,
        2,
        "the later call, then the three behind it in one call"
    );
}

/// A batch answered with a reply of the wrong shape (here every call gets one integer): each
/// decision in it gets a failure that says what was wrong, none panics, none waits for ever.
#[tokio::test(flavor = "current_thread")]
async fn a_batch_reply_of_the_wrong_shape_fails_each_of_its_decisions_clearly() {
    let fake = FakeRedis::start(":7\r\n");
    let store = RedisStore::connect(&fake.url()).await.unwrap();
    let limiter = RedisRateLimiter::builder(Quota::per_second(10).unwrap(), store)
        .refusal_cache_capacity(0)
        .fail_mode(RedisFailMode::Propagate)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let answers = futures::future::join_all((0..10).map(|_| limiter.check(&"k"))).await;
    for answer in answers {
        let failure = answer.unwrap_err();
        let failure = failure.downcast_ref::<RedisFailure>().unwrap();
        assert!(
            matches!(failure, RedisFailure::BadReply(why) if why.contains("7")),
            "{failure:?}"
        );
    }
}

/// A runtime that shuts down while decisions are queued on a key (its sending task spawned
/// there, never polled, or polled and awaiting a call Redis holds back) leaves the key free:
/// the limiter, shared with another runtime, answers every later decision on the key.
#[test]
fn a_runtime_shut_down_while_decisions_wait_on_a_key_leaves_it_free() {
    let server = or_skip!(RedisServer::start("runtime_shut_down_mid_call"));
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let limiter = main.block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        RedisRateLimiter::builder(Quota::per_hour(1000).unwrap(), store)
            .client_clock(ManualClock::new())
            .refusal_cache_capacity(0)
            .fail_mode(RedisFailMode::Propagate)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    });
    for task_polled in [false, true] {
        let short = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        if task_polled {
            // The first call is held back past the runtime's end.
            server.command(&["CLIENT", "PAUSE", "600"]);
        }
        short.block_on(async {
            let mut first = Box::pin(limiter.check(&"k"));
            let mut second = Box::pin(limiter.check(&"k"));
            assert!(poll_once(first.as_mut()).is_pending());
            assert!(
                poll_once(second.as_mut()).is_pending(),
                "queued behind the first"
            );
            if task_polled {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        drop(short);
        main.block_on(async {
            if task_polled {
                // Past the pause, which the store's own timeout would otherwise report.
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
            for i in 0..10 {
                let decision = tokio::time::timeout(Duration::from_secs(5), limiter.check(&"k"))
                    .await
                    .unwrap_or_else(|_| panic!("decision {i} on the key was never answered"))
                    .unwrap();
                assert!(decision.allowed);
            }
        });
    }
}
