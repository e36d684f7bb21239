//! Attacks on `Policy::concurrent_in_redis` behind the HTTP layer, with a real `redis-server`:
//! an instance's layer dropped (a reload) while its streams run, an instance that dies holding
//! slots, clients of two instances racing over real listeners, a veto by a rate policy after
//! the slot was taken in Redis, and a Redis that is killed and comes back empty under the
//! default fail mode.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_bulwark::clock::{Clock, ManualClock};
use tower_bulwark::rate_limit::{ConcurrencyLimiter, HeaderKey, Policy};
use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::{Limiter, Quota};

use crate::common::held_stream::{
    admitted_in_a_row, limited, plain_answer, plainly_limited, racing_clients, request,
};
use crate::common::redis_server::{eventually, or_skip, RedisServer};
use crate::concurrency::{held, policy, policy_with, KEY};

type Streams = Policy<HeaderKey, ConcurrencyLimiter<HeaderValue>>;

/// Whether `limiter` admits one more request of tenant `t` (given back at once if so, and
/// waited for until Redis has it back).
async fn admits(server: &RedisServer, limiter: &ConcurrencyLimiter<HeaderValue>) -> bool {
    let before = held(server, KEY);
    let tenant = HeaderValue::from_static("t");
    let decision = limiter.reserve(&tenant, 1).await.unwrap();
    let allowed = decision.allowed;
    limiter.refund(&tenant, 1, decision);
    if allowed {
        eventually("the probe given back", Duration::from_secs(10), || {
            held(server, KEY) <= before
        })
        .await;
    }
    allowed
}

/// Waits (ten seconds at most) until Redis holds `slots` slots of tenant `t`; `what` says
/// what the wait is for.
async fn held_eventually(server: &RedisServer, slots: u64, what: &str) {
    eventually(what, Duration::from_secs(10), || held(server, KEY) == slots).await;
}

/// Moves `clock` on by two thirds of `hold_for`, `rounds` times, each time waiting until tenant
/// `t`'s one slot is renewed (none expires within the next second) and asserting that `other`,
/// another instance's policy, is refused meanwhile.
async fn assert_slot_renewed_and_held(
    server: &RedisServer,
    clock: &ManualClock,
    hold_for: Duration,
    other: &Streams,
    rounds: usize,
) {
    for _ in 0..rounds {
        clock.advance(hold_for * 2 / 3);
        let renewed = (clock.now() + 1_000_000_000).to_string();
        eventually("the stream's slot renewed", Duration::from_secs(10), || {
            server.command(&["ZCOUNT", KEY, "-inf", &format!("({renewed}")]) == ":0"
                && held(server, KEY) == 1
        })
        .await;
        assert!(!admits(server, other.limiter()).await, "the slot is held");
    }
}

/// Lets `stream`'s held body end (a permit on `ends`), asserts that it sent `ab`, and waits
/// until Redis holds no slot of tenant `t`; `what` says what the wait is for.
async fn end_stream_and_await_slots_back(
    server: &RedisServer,
    ends: &Semaphore,
    stream: http::Response<tower_bulwark::rate_limit::RateLimitBody<axum::body::Body>>,
    what: &str,
) {
    ends.add_permits(1);
    let body = stream.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ab");
    held_eventually(server, 0, what).await;
}

/// What a limit of two slots answers three streams held at once: two admitted, one refused.
const TWO_ADMITTED_THEN_REFUSED: [StatusCode; 3] = [
    StatusCode::OK,
    StatusCode::OK,
    StatusCode::TOO_MANY_REQUESTS,
];

/// The statuses of three calls of `call()` in a row, each answer held until all three are in.
async fn statuses_of_three_at_once<F, B, E>(call: impl Fn() -> F) -> Vec<StatusCode>
where
    F: std::future::Future<Output = Result<http::Response<B>, E>>,
    E: std::fmt::Debug,
{
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(call().await.unwrap());
    }
    open.iter().map(|r| r.status()).collect()
}

/// src/rate_limit/concurrent.rs:173-175 ("each instance renews all of its live holds every
/// third of it, in one call, so a request of any length keeps its slot while its instance
/// reaches Redis") and src/guide.rs:215 ("each slot goes back once, by its id, whatever ends
/// the request"). An instance's layer and policy are dropped (a configuration reload) while one
/// of its streams runs: the stream keeps its slot past twice `hold_for` (renewed), another
/// instance is refused meanwhile, and once the stream ends its slot goes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_outliving_its_layer_keeps_its_slot_and_gives_it_back() {
    let (server, store) = or_skip!(RedisServer::with_store("a_stream_outliving_its_layer").await);
    let clock = ManualClock::new();
    let hold_for = Duration::from_secs(1);
    let (service, ends) = plainly_limited(policy(&store, &clock, 1, hold_for));
    let stream = service.clone().oneshot(request("stream")).await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    drop(service); // the reload: only the stream's body is left of the old layer
    let other_store = RedisStore::connect(&server.url()).await.unwrap();
    let other = policy(&other_store, &clock, 1, hold_for);
    assert_slot_renewed_and_held(&server, &clock, hold_for, &other, 4).await;
    end_stream_and_await_slots_back(&server, &ends, stream, "the slot back").await;
    assert!(admits(&server, other.limiter()).await);
}

/// src/rate_limit/concurrent.rs:171-173 ("A dead instance's slots come back at most
/// `hold_for` ... after its last renewal"), src/guide.rs:215 ("a dead instance's slots come
/// back exactly at `hold_for`") and src/rate_limit/concurrent.rs:147-148 ("at most `in_flight`
/// requests of each key at once across every instance"). Instance A, on a runtime of its own,
/// admits two streams of three through its layer and dies (its runtime shut down, the
/// streams never ended): instance B gets exactly the one slot left until `hold_for` has
/// passed since A's slots were taken (not a nanosecond before), then exactly the two others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_slots_come_back_at_hold_for_and_never_more_meanwhile() {
    let server = or_skip!(RedisServer::start("a_dead_instances_slots_through"));
    let clock = crate::common::manual_clock_at(Duration::from_secs(1000));
    let hold_for = Duration::from_secs(30);
    let (url, a_clock) = (server.url(), clock.clone());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let store = RedisStore::connect(&url).await.unwrap();
            let policy = policy(&store, &a_clock, 3, hold_for);
            let service = limited(policy, &Arc::new(Semaphore::new(0)), plain_answer);
            for _ in 0..2 {
                let response = service.clone().oneshot(request("stream")).await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                // The process dies mid-stream: the body is never dropped nor read.
                std::mem::forget(response);
            }
            std::mem::forget(service);
        });
        runtime.shutdown_timeout(Duration::from_secs(5));
    })
    .join()
    .unwrap();
    assert_eq!(held(&server, KEY), 2);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let b = policy(&store, &clock, 3, hold_for);
    let (service, _ends) = plainly_limited(b);
    let call = || service.clone().oneshot(request("stream"));
    // B's own slot is taken a second later than A's: it expires a second after them.
    clock.advance(Duration::from_secs(1));
    let mut open = vec![call().await.unwrap()];
    assert_eq!(open[0].status(), StatusCode::OK, "the one slot left");
    clock.advance(hold_for - Duration::from_secs(1) - Duration::from_nanos(1));
    let refused = call().await.unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "A's slots before hold_for"
    );
    clock.advance(Duration::from_nanos(1));
    open.extend(admitted_in_a_row(call, 2, "back at hold_for").await);
    assert_eq!(
        call().await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS,
        "three, no more"
    );
    assert_eq!(held(&server, KEY), 3);
}

/// An instance over a real listener: `/stream` answers with a held body behind `policy`.
async fn serve_instance(policy: Streams, ends: &Arc<Semaphore>) -> String {
    crate::common::held_stream::serve_held_streams(policy, ends).await
}

/// src/rate_limit/concurrent.rs:147-148 ("at most `in_flight` requests of each key at once
/// across every instance") and src/guide.rs:215 ("tasks of two instances racing for L slots of
/// a key never hold more than L at once and, all holding, get exactly L"). Over real listeners,
/// twenty `reqwest` clients race, half on each instance, for five slots, five rounds: exactly
/// five stream each round, and once they end (read to their ends or dropped by their clients)
/// Redis holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_two_instances_racing_over_real_listeners_get_exactly_the_slots() {
    let server = or_skip!(RedisServer::start("clients_of_two_instances_racing"));
    let clock = ManualClock::new();
    let ends = Arc::new(Semaphore::new(0));
    let mut urls = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let policy = policy(&store, &clock, 5, Duration::from_secs(60));
        urls.push(serve_instance(policy, &ends).await);
    }
    let client = reqwest::Client::new();
    for round in 0..5 {
        let (open, refused) = racing_clients(&client, &urls, 20).await;
        for response in &refused {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(response.headers()["retry-after"], "1");
        }
        let admitted = open.len();
        drop(open);
        // The admitted clients went away mid-stream.
        assert_eq!(admitted, 5, "round {round}");
        held_eventually(&server, 0, "every stream's slot back").await;
    }
}

/// src/guide.rs:207 ("a request refused by one policy ... gives back every permit the others
/// granted, once") and :208 ("a request refused for want of a slot costs the other policies
/// nothing"), in Redis. The Redis concurrent policy first, then a rate policy of one request a
/// minute that vetoes: each vetoed request's slot, taken in Redis, goes back, so the key holds
/// only the admitted stream's slot, and once the rate allows the last slot is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_veto_after_the_slot_was_taken_in_redis_gives_it_back() {
    use tower_bulwark::KeyedRateLimiter;
    let (server, store) = or_skip!(RedisServer::with_store("a_veto_after_the_slot").await);
    let clock = ManualClock::new();
    let rate = KeyedRateLimiter::<HeaderValue>::builder(Quota::per_minute(1).unwrap())
        .clock(clock.clone())
        .build();
    let rate = Policy::new("rate", HeaderKey::new("x-tenant").unwrap(), rate).unwrap();
    let policy = policy_with(
        &store,
        &clock,
        2,
        Duration::from_secs(3600), // the rate's minute must not expire the slots
        RedisFailMode::Propagate,
    );
    let (service, _ends) = plainly_limited(policy.and(rate));
    let call = || service.clone().oneshot(request("stream"));
    let first = call().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    for _ in 0..4 {
        let vetoed = call().await.unwrap();
        assert_eq!(vetoed.status(), StatusCode::TOO_MANY_REQUESTS);
        let field = vetoed.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert!(field.contains("\"rate\";r=0"), "the rate vetoed: {field}");
    }
    held_eventually(&server, 1, "the vetoes' slots back").await;
    clock.advance(Duration::from_secs(60));
    let second = call().await.unwrap();
    assert_eq!(second.status(), StatusCode::OK, "a veto kept a slot");
    let field = second.headers()["ratelimit"].to_str().unwrap();
    assert!(
        field.starts_with("\"streams\";r=0, \"rate\";r=0"),
        "{field}"
    );
    drop((first, second));
}

/// src/rate_limit/concurrent.rs:181-183 ("`RedisFailMode::Local`, the default, is an
/// in-memory limit of `in_flight` per key in each instance") and :190-192 ("A Redis that
/// restarts empty ... has forgotten the slots taken before: renewals never bring back a slot
/// that Redis does not hold, so until the requests then in flight end, a key may have up to
/// twice `in_flight` in flight"), with src/guide.rs:215 ("with Redis down the fail mode decides
/// (`Local`: the limit per instance, its slots taken back)"). Two slots per tenant: one stream
/// admitted by Redis; Redis killed; the local limit admits two and refuses a third, and takes
/// them back when they end; Redis restarted empty while the first stream runs: at most two
/// more (twice the limit in all); once everything ended, exactly two again, no slot leaked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_killed_and_back_empty_leaks_no_slot_under_the_local_fail_mode() {
    let (mut server, store) = or_skip!(RedisServer::with_store("a_redis_killed_and_back").await);
    let clock = ManualClock::new();
    let policy = policy_with(
        &store,
        &clock,
        2,
        Duration::from_secs(60),
        RedisFailMode::Local,
    );
    let (service, _ends) = plainly_limited(policy);
    let call = || service.clone().oneshot(request("stream"));
    let in_redis = call().await.unwrap();
    assert_eq!(in_redis.status(), StatusCode::OK);
    assert_eq!(held(&server, KEY), 1);
    server.kill();
    let mut local = admitted_in_a_row(call, 2, "the local limit admits").await;
    let refused = call().await.unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the local limit"
    );
    local.pop();
    let again = call().await.unwrap();
    assert_eq!(again.status(), StatusCode::OK, "taken back locally");
    local.push(again);
    drop(local);
    server.restart();
    let mut after = Vec::new();
    for _ in 0..3 {
        let response = call().await.unwrap();
        if response.status() == StatusCode::OK {
            after.push(response);
        }
    }
    assert!(
        after.len() <= 2,
        "{} admitted beside the forgotten stream",
        after.len()
    );
    drop((in_redis, after));
    held_eventually(&server, 0, "every slot back").await;
    assert_eq!(
        statuses_of_three_at_once(call).await,
        TWO_ADMITTED_THEN_REFUSED,
        "exactly the limit once Redis is back"
    );
}

/// The holds under the tests' prefix, in all keys, and those of them that expire before
/// `before` (a client-clock reading in nanoseconds), counted by one script in Redis.
fn holds_and_expiring_before(server: &RedisServer, before: u64) -> (u64, u64) {
    let count = |script: &str| -> u64 {
        let reply = server.command(&["EVAL", script, "0", &before.to_string()]);
        reply.trim_start_matches(':').parse().unwrap()
    };
    let all = count(
        "local n = 0 for _, k in ipairs(redis.call('KEYS', 'c:*')) do \
         n = n + redis.call('ZCARD', k) end return n",
    );
    let early = count(
        "local n = 0 for _, k in ipairs(redis.call('KEYS', 'c:*')) do \
         n = n + redis.call('ZCOUNT', k, '-inf', '(' .. ARGV[1]) end return n",
    );
    (all, early)
}

/// src/redis/builder.rs:98-102 ("While the request lives, its instance renews the hold: all of
/// the instance's live holds in one call every third of this bound (... a call carries at most
/// 3 000 arguments, so thousands of requests in flight take a few). So a request of any length
/// keeps its hold while its instance reaches Redis") and src/rate_limit/concurrent.rs:173-175.
/// One instance holds 4 100 slots, past what one renewal call carries: 2 600 of one key and one
/// of each of 1 500 others. Every one of them is renewed past the expiry, twice; none lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_slots_in_flight_are_all_renewed_across_several_calls() {
    let (server, store) = or_skip!(RedisServer::with_store("thousands_of_slots_renewed").await);
    let clock = crate::common::manual_clock_at(Duration::from_secs(1000));
    let hold_for = Duration::from_secs(1);
    let policy = Arc::new(policy(&store, &clock, 3000, hold_for));
    let mut keys = vec![HeaderValue::from_static("t"); 2600];
    keys.extend((0..1500).map(|k| HeaderValue::from_str(&format!("k{k}")).unwrap()));
    let mut holds = Vec::new();
    for chunk in keys.chunks(200) {
        let calls: Vec<_> = chunk
            .iter()
            .map(|key| {
                let (policy, key) = (Arc::clone(&policy), key.clone());
                tokio::spawn(async move {
                    let decision = policy.limiter().reserve(&key, 1).await.unwrap();
                    assert!(decision.allowed);
                    (key, decision)
                })
            })
            .collect();
        for call in calls {
            holds.push(call.await.unwrap());
        }
    }
    assert_eq!(holds_and_expiring_before(&server, 0).0, 4100);
    for _ in 0..2 {
        clock.advance(hold_for * 2 / 3);
        let renewed = clock.now() + 1_000_000_000;
        eventually("every slot renewed", Duration::from_secs(10), || {
            holds_and_expiring_before(&server, renewed) == (4100, 0)
        })
        .await;
    }
    for (key, decision) in holds {
        assert!(policy.limiter().refund(&key, 1, decision));
    }
    eventually("every slot back", Duration::from_secs(10), || {
        holds_and_expiring_before(&server, 0).0 == 0
    })
    .await;
}

/// src/redis/builder.rs:101-103 ("a request of any length keeps its hold while its instance
/// reaches Redis; it loses it only if every renewal fails for about two thirds of the bound")
/// and src/redis/store.rs:49 ("Later, the connection reconnects by itself whenever it is
/// lost"). Redis (its state on disk) is killed under a stream and comes back before the slot
/// expires: renewals fail meanwhile, then resume, so the stream keeps its slot through two
/// more expiries and another instance stays refused; the stream's end gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_resume_after_redis_comes_back() {
    let mut server = or_skip!(RedisServer::start_persistent("renewals_resume_after"));
    let clock = crate::common::manual_clock_at(Duration::from_secs(1000));
    let hold_for = Duration::from_secs(3);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let (service, ends) = plainly_limited(policy(&store, &clock, 1, hold_for));
    let stream = service.clone().oneshot(request("stream")).await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    server.kill();
    // Down for a renewal period and more (renewals every second of real time): one fails.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.restart();
    assert_eq!(held(&server, KEY), 1, "the state survived");
    let other_store = RedisStore::connect(&server.url()).await.unwrap();
    let other = policy(&other_store, &clock, 1, hold_for);
    assert_slot_renewed_and_held(&server, &clock, hold_for, &other, 3).await;
    end_stream_and_await_slots_back(&server, &ends, stream, "the slot back").await;
}

/// src/rate_limit/layer.rs:84-85 ("What to do when a limiter returns an error
/// ([`FailMode::Closed`] by default: answer `503`)"), src/rate_limit/settings.rs:24 (`Open`:
/// "Let the request through without counting it against the policy that could not decide") and
/// src/guide.rs:207 ("a request refused by one policy ... gives back every permit the others
/// granted, once"). Slots in a live Redis, then a second concurrent policy whose Redis is gone
/// and which hands its failure on: every request is a `503`, and the slot each took in the live
/// Redis goes back; under `FailMode::Open` requests stream, each holding its live slot, and
/// exactly the live limit are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_policy_after_the_slot_answers_503_and_gives_the_slot_back() {
    use tower::Layer;
    use tower_bulwark::rate_limit::{FailMode, RateLimitLayer};
    let (server, store) = or_skip!(RedisServer::with_store("a_failing_policy_after").await);
    let clock = ManualClock::new();
    let live = || policy(&store, &clock, 2, Duration::from_secs(60));
    let dead_store = RedisStore::connect_lazy("redis://127.0.0.1:1/").unwrap();
    let dead = || {
        let redis = RedisRateLimiter::builder(Quota::per_second(1).unwrap(), dead_store.clone())
            .client_clock(clock.clone())
            .prefix("d:")
            .probe_interval(Duration::ZERO)
            .fail_mode(RedisFailMode::Propagate);
        let key = HeaderKey::new("x-tenant").unwrap();
        Policy::concurrent_in_redis("gone", key, 2, redis).unwrap()
    };
    let (service, ends) = plainly_limited(live().and(dead()));
    let mut answers = Vec::new();
    for _ in 0..4 {
        let response = service.clone().oneshot(request("stream")).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        answers.push(response);
    }
    held_eventually(&server, 0, "the live slots back").await;
    drop(answers);
    let open = RateLimitLayer::new(live().and(dead()))
        .wrap_body()
        .limiter_error_mode(FailMode::Open)
        .layer(crate::common::held_stream::handler(
            Arc::clone(&ends),
            plain_answer,
        ));
    let call_open = || open.clone().oneshot(request("stream"));
    let streaming = admitted_in_a_row(call_open, 2, "let through").await;
    let third = call_open().await.unwrap();
    assert_eq!(
        third.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the live limit"
    );
    assert_eq!(held(&server, KEY), 2);
    drop(streaming);
    held_eventually(&server, 0, "the streams' slots back").await;
}

/// The process id of `server`, from `INFO server`.
#[cfg(unix)]
fn pid(server: &RedisServer) -> String {
    let info = server.command(&["INFO", "server"]);
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned()
}

/// Sends `signal` (`-STOP`, `-CONT`) to process `pid`.
#[cfg(unix)]
fn signal(signal: &str, pid: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, pid])
        .status();
    assert!(status.unwrap().success(), "kill {signal} {pid}");
}

/// src/rate_limit/concurrent.rs:178-187 ("Redis down or stalling. A decision waits at most the
/// timeout; then the fail mode decides ... A decision that Redis runs after its caller was
/// answered (a stall) changes nothing") and src/guide.rs:215 ("a decision that times out in a
/// stalled Redis leaves no slot behind"). Redis stalls (SIGSTOP) under the layer with the
/// default fail mode: the stalled requests are admitted by the local limit of two and refused
/// beyond it; a stream ends while Redis is stalled (its give-back waits); Redis resumes and runs
/// every call it queued: no slot is left behind, and exactly two are admitted again.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_under_the_layer_leaves_no_slot_behind_once_it_resumes() {
    let (server, store) = or_skip!(RedisServer::with_store("a_stalled_redis_under").await);
    let clock = ManualClock::new();
    let redis = RedisRateLimiter::builder(Quota::per_second(1).unwrap(), store)
        .client_clock(clock.clone())
        .prefix("c:")
        .timeout(Duration::from_millis(200))
        .probe_interval(Duration::ZERO)
        .hold_for(Duration::from_secs(3600));
    let key = HeaderKey::new("x-tenant").unwrap();
    let policy = Policy::concurrent_in_redis("streams", key, 2, redis).unwrap();
    let (service, _ends) = plainly_limited(policy);
    let call = || service.clone().oneshot(request("stream"));
    let before_stall = call().await.unwrap();
    assert_eq!(before_stall.status(), StatusCode::OK);
    assert_eq!(held(&server, KEY), 1);
    let pid = pid(&server);
    signal("-STOP", &pid);
    let mut stalled = Vec::new();
    for _ in 0..3 {
        stalled.push(call().await.unwrap());
    }
    // The ended stream's give-back goes out while Redis is stalled.
    drop(before_stall);
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal("-CONT", &pid);
    let statuses: Vec<_> = stalled.iter().map(|r| r.status()).collect();
    assert_eq!(statuses, TWO_ADMITTED_THEN_REFUSED, "the local limit");
    drop(stalled);
    held_eventually(&server, 0, "no slot left behind").await;
    assert_eq!(
        statuses_of_three_at_once(call).await,
        TWO_ADMITTED_THEN_REFUSED,
        "exactly the limit once Redis is back"
    );
}

/// src/rate_limit/concurrent.rs:107-110 ("A concurrent policy keeps its hold: `count_if`,
/// `settle_by` and `settle_from_body` leave it as it is. `cost` and `cost_by` choose how many
/// slots a request takes") and :148-150 ("A slot is held and given back, and the headers and
/// refusals say what they say, as in memory"), in Redis. A stream of two slots of three under a
/// `count_if` that never counts: its slots stay held in Redis until its body ends (a third
/// request of two is refused), then both come back, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_if_leaves_a_redis_hold_of_several_slots_as_it_is() {
    let (server, store) = or_skip!(RedisServer::with_store("count_if_leaves_a_redis").await);
    let clock = ManualClock::new();
    let policy = policy(&store, &clock, 3, Duration::from_secs(60))
        .cost(2)
        .count_if(|_| false);
    let (service, ends) = plainly_limited(policy);
    let call = || service.clone().oneshot(request("stream"));
    let first = call().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["ratelimit"], "\"streams\";r=1");
    assert_eq!(
        first.headers()["ratelimit-policy"],
        "\"streams\";q=3;qu=\"concurrent-requests\""
    );
    // The response head is out: a settle by the head would have run by now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        held(&server, KEY),
        2,
        "both slots held while the body streams"
    );
    let refused = call().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    end_stream_and_await_slots_back(&server, &ends, first, "both slots back").await;
    let again = call().await.unwrap();
    assert_eq!(again.headers()["ratelimit"], "\"streams\";r=1", "back once");
}

/// src/rate_limit/concurrent.rs:178-186 ("then the fail mode decides, as for any
/// `RedisRateLimiter`"; "`Open`, `Closed`, ... are as documented there"), src/redis/
/// fail_mode.rs:43 (`Closed`: "Refuses the request, telling the client to come back after this
/// long") and src/rate_limit/concurrent.rs:96-99 (a refusal is a `429` saying
/// `qu="concurrent-requests"`). Redis killed under `Closed(30 s)`: every request is a `429`
/// told to come back in 30 s, not a `503`; once Redis is back (empty), exactly the limit are
/// admitted, the refusals having taken nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_fail_mode_refuses_with_its_wait_and_takes_nothing() {
    let (mut server, store) = or_skip!(RedisServer::with_store("a_closed_fail_mode").await);
    let clock = ManualClock::new();
    let closed = RedisFailMode::Closed(Duration::from_secs(30));
    let policy = policy_with(&store, &clock, 2, Duration::from_secs(60), closed);
    let (service, _ends) = plainly_limited(policy);
    let call = || service.clone().oneshot(request("stream"));
    server.kill();
    for _ in 0..3 {
        let refused = call().await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()["retry-after"], "30");
        let policy = refused.headers()["ratelimit-policy"].to_str().unwrap();
        assert!(policy.contains("qu=\"concurrent-requests\""), "{policy}");
    }
    server.restart();
    let first = crate::common::first_within_ten_seconds("Redis never back", || {
        let sent = call();
        async move {
            let response = sent.await.unwrap();
            (response.status() == StatusCode::OK).then_some(response)
        }
    })
    .await;
    assert_eq!(first.headers()["ratelimit"], "\"streams\";r=1");
    let second = call().await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(
        call().await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(held(&server, KEY), 2);
}
