//! Refunds through a real Redis: a request that another policy vetoes leaves the Redis state
//! exactly as it was, for every algorithm, whether it was admitted at once or reserved, and
//! whether the refund comes at once or later; hostile state is refused, not believed.

use crate::common::for_every_algorithm;
use crate::common::keyed_on;
use crate::common::waits_up_to;
use std::time::Duration;

use crate::common::manual_clock_at;
use crate::common::redis_server::{key_state, or_skip, uncached, RedisServer};
use tower_bulwark::redis::{RedisAlgorithm, RedisFailure, RedisRateLimiter, RedisStore};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    Limiter, Quota,
};

const MS: u64 = 1_000_000;

/// One veto: the history both limiters see, the vetoed request (instant, cost) and the instant
/// its refund arrives.
struct Scenario {
    name: &'static str,
    history: &'static [(u64, u32)],
    veto: (u64, u32),
    refund_at: u64,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "an immediate admission, refunded at once",
        history: &[(100, 1)],
        veto: (100, 1),
        refund_at: 100,
    },
    Scenario {
        name: "an immediate admission into a full log of a later instant, refunded at once",
        history: &[(100, 1), (350, 1)],
        veto: (350, 1),
        refund_at: 350,
    },
    Scenario {
        name: "a reservation, refunded at once",
        history: &[(100, 1), (400, 2)],
        veto: (400, 1),
        refund_at: 400,
    },
    Scenario {
        name: "an immediate admission, refunded after its window ended",
        history: &[(100, 1)],
        veto: (900, 2),
        refund_at: 1_300,
    },
    Scenario {
        name: "a reservation, refunded after it fell due",
        history: &[(100, 1), (400, 2)],
        veto: (400, 1),
        refund_at: 1_500,
    },
];

/// The vetoed limiter and its twin, which never saw the vetoed request, must hold the same state
/// and then give the same decisions. `tag` (`gcra:`, ...) names the algorithm and keeps its
/// keys apart.
async fn vetoes_leave_no_trace<A: RedisAlgorithm>(server: &RedisServer, tag: &str) {
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut conn = server.connection().await;
    let quota = waits_up_to(Quota::per_second(3).unwrap(), Duration::from_secs(2));
    for (i, s) in SCENARIOS.iter().enumerate() {
        let clock = ManualClock::new();
        let vetoed = uncached::<A>(&store, quota, &clock, &format!("{tag}{i}:v:"));
        let twin = uncached::<A>(&store, quota, &clock, &format!("{tag}{i}:t:"));
        let (vkey, tkey) = (vetoed.redis_key("k"), twin.redis_key("k"));
        let context = format!("{tag} {}", s.name);
        for &(at, cost) in s.history {
            clock.set(Duration::from_nanos(at * MS));
            let a = vetoed.reserve(&"k", cost).await.unwrap();
            let b = twin.reserve(&"k", cost).await.unwrap();
            assert_eq!(a, b, "{context}");
            assert!(a.allowed, "{context}: the history is admitted");
        }
        clock.set(Duration::from_nanos(s.veto.0 * MS));
        let before = key_state(&mut conn, &vkey).await;
        let d = vetoed.reserve(&"k", s.veto.1).await.unwrap();
        assert!(d.allowed, "{context}: the vetoed request was admitted");
        assert_ne!(
            key_state(&mut conn, &vkey).await,
            before,
            "{context}: it spent"
        );
        clock.set(Duration::from_nanos(s.refund_at * MS));
        vetoed.settle_and_wait(&"k", s.veto.1, d, 0).await.unwrap();
        if s.refund_at == s.veto.0 {
            assert_eq!(
                key_state(&mut conn, &vkey).await,
                before,
                "{context}: the state is exactly as before"
            );
        }
        // The next decisions, at the refund's instant and later, are the twin's.
        for step in 0..12u64 {
            if step % 4 == 3 {
                clock.advance(Duration::from_millis(170));
            }
            let cost = 1 + (step % 2) as u32;
            let a = vetoed.reserve(&"k", cost).await.unwrap();
            let b = twin.reserve(&"k", cost).await.unwrap();
            assert_eq!(a, b, "{context}: decision {step} after the refund");
        }
        assert_eq!(
            key_state(&mut conn, &vkey).await[1..],
            key_state(&mut conn, &tkey).await[1..],
            "{context}: the same state in the end"
        );
    }
}

#[tokio::test]
async fn a_vetoed_request_leaves_the_state_as_it_was_for_every_algorithm() {
    let server = or_skip!(RedisServer::start("vetoed"));
    for_every_algorithm!(tagged: vetoes_leave_no_trace(&server).await);
}

/// GCRA in Redis gives back only the key's latest admission. One permit a second, burst 1, all
/// at 0: a permit used; A reserves (due 1 s), B reserves (due 2 s); A leaves. The script moved
/// the TAT back from 3 s to 2 s and gave the next caller B's slot at 2 s: two permits due at one
/// instant with a burst of one. A's permits stay spent; the latest one's refund is exact.
#[tokio::test]
async fn a_gcra_refund_in_redis_never_hands_out_a_slot_a_later_admission_holds() {
    let (server, store) = or_skip!(RedisServer::with_store("gcra_refund_of_the_latest_only").await);
    let mut conn = server.connection().await;
    let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(10));
    let clock = ManualClock::new();
    let gcra = uncached::<Gcra>(&store, quota, &clock, "latest:reserved:");
    let key = gcra.redis_key("k");
    assert!(gcra.reserve(&"k", 1).await.unwrap().allowed);
    let a = gcra.reserve(&"k", 1).await.unwrap();
    let b = gcra.reserve(&"k", 1).await.unwrap();
    assert_eq!(
        (a.wait, b.wait),
        (Duration::from_secs(1), Duration::from_secs(2))
    );
    let state = key_state(&mut conn, &key).await;
    gcra.settle_and_wait(&"k", 1, a, 0).await.unwrap();
    assert_eq!(
        key_state(&mut conn, &key).await,
        state,
        "A's permits stay spent"
    );
    let c = gcra.reserve(&"k", 1).await.unwrap();
    assert_eq!(c.wait, Duration::from_secs(3), "not B's slot at 2 s: {c:?}");
    // C is the latest: its refund restores the state exactly, and the next caller takes its slot.
    gcra.settle_and_wait(&"k", 1, c, 0).await.unwrap();
    assert_eq!(key_state(&mut conn, &key).await, state);
    assert_eq!(
        gcra.reserve(&"k", 1).await.unwrap().wait,
        Duration::from_secs(3)
    );
}

/// A vetoed immediate admission behind a later reservation, in Redis: a permit used at 0, a
/// reservation at 0.5 s (due 1 s), the first given back. Keeping back only the time elapsed
/// gave the next caller a slot at 1.5 s, half a second after the reservation's.
#[tokio::test]
async fn a_vetoed_gcra_admission_in_redis_behind_a_later_reservation_stays_spent() {
    let (_server, store) =
        or_skip!(RedisServer::with_store("gcra_veto_behind_a_reservation").await);
    let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(10));
    let clock = ManualClock::new();
    let gcra = uncached::<Gcra>(&store, quota, &clock, "latest:vetoed:");
    let first = gcra.reserve(&"k", 1).await.unwrap();
    clock.set(Duration::from_millis(500));
    let later = gcra.reserve(&"k", 1).await.unwrap();
    assert_eq!(later.wait, Duration::from_millis(500));
    gcra.settle_and_wait(&"k", 1, first, 0).await.unwrap();
    let next = gcra.reserve(&"k", 1).await.unwrap();
    assert_eq!(
        next.wait,
        Duration::from_millis(1500),
        "due at 2 s: {next:?}"
    );
}

/// A admitted at 0, B at 1 s, then A's veto given back at 1 s, in Redis: A's slot has passed
/// and B holds the next one, so a third caller at 1 s is refused.
#[tokio::test]
async fn a_late_gcra_refund_in_redis_never_frees_a_later_admissions_slot() {
    let (_server, store) = or_skip!(RedisServer::with_store("gcra_late_refund").await);
    let clock = ManualClock::new();
    let gcra = uncached::<Gcra>(
        &store,
        Quota::per_second(1).unwrap(),
        &clock,
        "latest:late:",
    );
    let a = gcra.reserve(&"k", 1).await.unwrap();
    clock.set(Duration::from_secs(1));
    assert!(gcra.reserve(&"k", 1).await.unwrap().allowed);
    gcra.settle_and_wait(&"k", 1, a, 0).await.unwrap();
    let c = gcra.reserve(&"k", 1).await.unwrap();
    assert!(!c.allowed, "{c:?}");
    assert_eq!(c.retry_after, Duration::from_secs(1));
}

/// In Redis as in memory (`attack_gcra_refunds_on_a_coarse_clock_…`): 3 then 1 permit at 0 s,
/// the 3 given back at 1 s, 2 at 2 s, which brings the TAT back to the value the 1 left; the 1
/// given back then. The key admits at 2 s no more than a twin that only ever took the 2.
#[tokio::test]
async fn a_gcra_refund_whose_tat_came_back_in_redis_is_never_more_generous_than_a_twin() {
    let (_server, store) = or_skip!(RedisServer::with_store("gcra_tat_came_back").await);
    let clock = ManualClock::new();
    let quota = Quota::per_second(1).unwrap().with_burst(200).unwrap();
    let gcra = uncached::<Gcra>(&store, quota, &clock, "back:");
    let three = gcra.check_n(&"k", 3).await.unwrap();
    let one = gcra.check_n(&"k", 1).await.unwrap();
    assert!(three.allowed && one.allowed);
    clock.set(Duration::from_secs(1));
    gcra.settle_and_wait(&"k", 3, three, 0).await.unwrap();
    clock.set(Duration::from_secs(2));
    assert!(gcra.check_n(&"k", 2).await.unwrap().allowed);
    assert!(gcra.check_n(&"twin", 2).await.unwrap().allowed);
    gcra.settle_and_wait(&"k", 1, one, 0).await.unwrap();
    let mut counts = [0, 0];
    for (key, count) in ["k", "twin"].into_iter().zip(&mut counts) {
        while gcra.check(&key).await.unwrap().allowed {
            *count += 1;
        }
    }
    assert!(
        counts[0] <= counts[1],
        "{} admitted, {} by the twin",
        counts[0],
        counts[1]
    );
}

/// Two policies, the window in Redis: 5 a minute (Redis) and 1 a second (in memory), 4 requests
/// a second for 5 s. A request refused by one policy gives back what the other took.
async fn two_policies<A: RedisAlgorithm>(server: &RedisServer, tag: &str) -> usize {
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let clock = ManualClock::new();
    let window = uncached::<A>(&store, Quota::per_minute(5).unwrap(), &clock, tag);
    let second = keyed_on::<String, _>(Quota::per_second(1).unwrap(), &clock);
    let mut admitted = 0;
    for i in 0..20u64 {
        clock.set(Duration::from_millis(250 * i));
        let key = "tenant".to_string();
        let a = window.reserve(&key, 1).await.unwrap();
        let b = second.reserve(&key, 1).await.unwrap();
        if a.allowed && b.allowed {
            admitted += 1;
            continue;
        }
        // The layer's veto: whatever was granted goes back.
        if a.allowed {
            window.settle_and_wait(&key, 1, a, 0).await.unwrap();
        }
        if b.allowed {
            second.refund(&key, 1, b);
        }
    }
    admitted
}

#[tokio::test]
async fn refusals_of_another_policy_do_not_drain_the_redis_window() {
    let server = or_skip!(RedisServer::start("refusals_do_not_drain"));
    assert_eq!(two_policies::<FixedWindow>(&server, "fw:").await, 5);
    assert_eq!(two_policies::<SlidingLog>(&server, "log:").await, 5);
    assert_eq!(two_policies::<SlidingCounter>(&server, "sc:").await, 5);
    assert_eq!(two_policies::<Gcra>(&server, "gcra:").await, 5);
}

/// A client clock that reads late (another instance's clock behind, or a read that waited) must
/// not let the sliding log admit more than its limit in any window.
#[tokio::test]
async fn a_stale_clock_read_cannot_make_the_sliding_log_over_admit() {
    let (server, store) = or_skip!(RedisServer::with_store("stale_sliding_log").await);
    let mut conn = server.connection().await;
    let quota = Quota::with_period(2, Duration::from_secs(10)).unwrap();
    let fresh_clock = ManualClock::new();
    let stale_clock = ManualClock::new();
    let fresh = uncached::<SlidingLog>(&store, quota, &fresh_clock, "stale:");
    let stale = uncached::<SlidingLog>(&store, quota, &stale_clock, "stale:");
    let key = fresh.redis_key("k");
    let mut admitted_at = Vec::new();
    let mut record = |members: &[String]| {
        for m in members {
            let member = m.split_once('@').map_or(m.as_str(), |(member, _)| member);
            if member.contains(':') && !admitted_at.iter().any(|a| a == member) {
                admitted_at.push(member.to_owned());
            }
        }
    };
    for (at, cost) in [(0, 1), (6, 1), (10, 2)] {
        fresh_clock.set(Duration::from_secs(at));
        let _ = fresh.reserve(&"k", cost).await.unwrap();
        record(&key_state(&mut conn, &key).await[1..]);
    }
    // Read at 9 s but decided after the fresh decision at 10 s pruned the permit of 0 s.
    stale_clock.set(Duration::from_secs(9));
    let _ = stale.reserve(&"k", 1).await.unwrap();
    record(&key_state(&mut conn, &key).await[1..]);
    // Every permit ever admitted, by instant (members are `<instant>:<sequence>`, in ns).
    let mut instants: Vec<u64> = admitted_at
        .iter()
        .map(|m| m.split(':').next().unwrap().parse().unwrap())
        .collect();
    instants.sort_unstable();
    let window = 10 * 1000 * MS;
    for (i, &start) in instants.iter().enumerate() {
        let within = instants[i..]
            .iter()
            .filter(|&&t| t < start + window)
            .count();
        assert!(
            within <= 2,
            "{within} permits within 10 s from {start} ns: {instants:?}"
        );
    }
}

/// State that this crate did not write (a fraction, a negative, an infinity, NaN, a huge
/// exponent, a field too many) is an error, never a decision built on it.
#[tokio::test]
async fn stored_state_that_is_not_an_exact_count_is_an_error() {
    let (server, store) = or_skip!(RedisServer::with_store("corrupt_state_is_an_error").await);
    let clock = manual_clock_at(Duration::from_secs(5));
    let quota = Quota::per_second(5).unwrap();
    let gcra = uncached::<Gcra>(&store, quota, &clock, "bad:gcra:");
    let window = uncached::<FixedWindow>(&store, quota, &clock, "bad:fw:");
    let counter = uncached::<SlidingCounter>(&store, quota, &clock, "bad:sc:");
    let log = uncached::<SlidingLog>(&store, quota, &clock, "bad:log:");
    let mut cases: Vec<(&str, Vec<String>)> = Vec::new();
    for bad in ["1.5", "-3", "inf", "nan", "1e300", "-inf"] {
        cases.push(("gcra", vec!["SET".into(), gcra.redis_key("k"), bad.into()]));
        for (name, key, fields) in [
            ("fixed window", window.redis_key("k"), ["c", "5", "u"]),
            ("sliding counter", counter.redis_key("k"), ["w", "5", "p"]),
        ] {
            let mut command = vec!["HSET".to_owned(), key];
            command.extend(fields.iter().map(|f| f.to_string()));
            command.push(bad.into());
            cases.push((name, command));
        }
    }
    // GCRA's "<tat>:<latest>[:<reserved>[:<moved back>]];<lease>...": a fifth field, a mark or
    // a reading moved back at or a lease of a fraction, a bad latest.
    for bad in [
        "5000:5000:1:2:3",
        "5000:5000:1:0.5",
        "5000:5000:0:-2",
        "5000:5000:0.5",
        "5000:5000:;1,2,3",
        "5000:5000;1,2,0.5",
        "5000:1e300",
        "5000:5000x;1,2,3",
    ] {
        cases.push(("gcra", vec!["SET".into(), gcra.redis_key("k"), bad.into()]));
    }
    // The log's scores: a permit's score that is read (the newest), and its `hw` member.
    for (score, member) in [
        ("5500000000.5", "5500000000:0000000000"),
        ("inf", "4500000000:0000000000"),
        ("1e300", "4500000000:0000000000"),
        ("-1.5", "hw"),
        ("5", "hw"),
        ("-1e300", "hw"),
    ] {
        let command = vec![
            "ZADD".into(),
            log.redis_key("k"),
            score.into(),
            member.into(),
        ];
        cases.push(("sliding log", command));
    }
    for (name, command) in cases {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        let reply = server.command(&args);
        assert!(
            reply.starts_with(':') || reply == "+OK",
            "{args:?}: {reply}"
        );
        let result = match name {
            "gcra" => gcra.check(&"k").await,
            "fixed window" => window.check(&"k").await,
            "sliding counter" => counter.check(&"k").await,
            _ => log.check(&"k").await,
        };
        let err = result.expect_err(&format!("{args:?}: a decision"));
        let failure = err.downcast_ref::<RedisFailure>().expect("a RedisFailure");
        assert!(
            failure.to_string().contains("this crate wrote"),
            "{args:?}: {failure}"
        );
        server.command(&["DEL", args[1]]);
    }
}

/// The sliding counter in Redis admits steady traffic below the rate for small limits (the
/// previous window's share is rounded down, as in memory).
#[tokio::test]
async fn the_sliding_counter_admits_steady_traffic_below_the_rate() {
    let (_server, store) =
        or_skip!(RedisServer::with_store("sliding_counter_steady_traffic").await);
    for (permits, requests) in [(1u32, 30u64), (2, 50)] {
        let clock = ManualClock::new();
        let quota = Quota::with_period(permits, Duration::from_secs(3600)).unwrap();
        let limiter =
            uncached::<SlidingCounter>(&store, quota, &clock, &format!("steady{permits}:"));
        // Evenly spaced at 90 % of the rate.
        let gap = Duration::from_secs(3600) / permits * 10 / 9;
        let mut refused = 0;
        for i in 0..requests {
            clock.set(gap * u32::try_from(i).unwrap());
            if !limiter.reserve(&"k", 1).await.unwrap().allowed {
                refused += 1;
            }
        }
        assert_eq!(refused, 0, "{permits}/h: refused {refused} of {requests}");
    }
}

/// Admits on `limiter` until it refuses, at the clock's current instant.
async fn redis_admitted_until_refused(limiter: &RedisRateLimiter) -> u64 {
    let mut n = 0;
    while limiter.reserve(&"k", 1).await.unwrap().allowed {
        n += 1;
        assert!(n <= 1_000, "never refused");
    }
    n
}

/// A shared key under GCRA in Redis, with requests another policy refuses interleaved with
/// requests that are admitted: each refused one gives back what it took though another was
/// admitted after it (exactly at one instant; never more than if it had never come, and all but
/// the time elapsed, with time between), as in memory.
#[tokio::test]
async fn refusals_on_a_shared_gcra_key_in_redis_drain_nothing_while_others_are_admitted() {
    let (_server, store) = or_skip!(RedisServer::with_store("gcra_shared_key_refusals").await);
    let quota = Quota::per_second(10).unwrap();
    for gap_ms in [0u64, 30] {
        let clock = ManualClock::new();
        let prefix = |p: &str| format!("shared:{gap_ms}:{p}:");
        let vetoed = uncached::<Gcra>(&store, quota, &clock, &prefix("v"));
        let twin = uncached::<Gcra>(&store, quota, &clock, &prefix("t"));
        let kept = uncached::<Gcra>(&store, quota, &clock, &prefix("k"));
        for _ in 0..4 {
            let refused_elsewhere = vetoed.reserve(&"k", 1).await.unwrap();
            assert!(refused_elsewhere.allowed);
            assert!(kept.reserve(&"k", 1).await.unwrap().allowed);
            clock.advance(Duration::from_millis(gap_ms));
            assert!(vetoed.reserve(&"k", 1).await.unwrap().allowed);
            assert!(twin.reserve(&"k", 1).await.unwrap().allowed);
            assert!(kept.reserve(&"k", 1).await.unwrap().allowed);
            vetoed
                .settle_and_wait(&"k", 1, refused_elsewhere, 0)
                .await
                .unwrap();
        }
        let v = redis_admitted_until_refused(&vetoed).await;
        let t = redis_admitted_until_refused(&twin).await;
        let k = redis_admitted_until_refused(&kept).await;
        crate::common::assert_refunds_between(gap_ms, v, t, k);
    }
}

/// For every algorithm in Redis: key `a` spends its quota; an admission of key `b`, and one made
/// by an in-memory limiter for `a` itself, given back under `a` free nothing there; `b`'s own
/// admission given back under `b` frees its permit (the check does not simply refuse refunds).
async fn refunds_stay_with_their_key<A: RedisAlgorithm>(store: &RedisStore, tag: &str) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1));
    let quota = Quota::per_minute(3).unwrap();
    let redis = uncached::<A>(store, quota, &clock, &format!("own-key:{tag}:"));
    let memory = keyed_on::<&str, _>(quota, &clock);
    for _ in 0..3 {
        assert!(redis.reserve(&"a", 1).await.unwrap().allowed, "{tag}");
    }
    let other = redis.reserve(&"b", 1).await.unwrap();
    assert!(other.allowed);
    redis.settle_and_wait(&"a", 1, other, 0).await.unwrap();
    let from_memory = memory.check(&"a");
    assert!(from_memory.allowed);
    redis
        .settle_and_wait(&"a", 1, from_memory, 0)
        .await
        .unwrap();
    assert!(
        !redis.reserve(&"a", 1).await.unwrap().allowed,
        "{tag}: a refund under another key or from another limiter freed a permit of `a`"
    );
    // The same shape of refund under its own key does give back (`b` holds one already).
    for _ in 0..1 {
        assert!(redis.reserve(&"b", 1).await.unwrap().allowed, "{tag}");
    }
    let last = redis.reserve(&"b", 1).await.unwrap();
    assert!(last.allowed);
    redis.settle_and_wait(&"b", 1, last, 0).await.unwrap();
    assert!(
        redis.reserve(&"b", 1).await.unwrap().allowed,
        "{tag}: b's own refund gave nothing back"
    );
}

#[tokio::test]
async fn a_decision_given_back_under_another_key_frees_nothing_in_redis() {
    let (_server, store) = or_skip!(RedisServer::with_store("refund_other_key").await);
    for_every_algorithm!(tagged: refunds_stay_with_their_key(&store).await);
}

/// A decision given back "to another limiter … gives nothing back (each algorithm, in memory
/// and in Redis)": two Redis servers, one prefix on both. A decision of the limiter on server A
/// given back to the limiter on server B gives B nothing back, whatever the algorithm; on one
/// store, a limiter built apart with the same prefix shares the state and takes it back.
async fn a_refund_across_servers_gives_nothing_back<A: RedisAlgorithm>(
    a: &RedisServer,
    b: &RedisServer,
) {
    let name = std::any::type_name::<A>();
    let clock = ManualClock::new();
    let quota = Quota::per_hour(2).unwrap();
    let store_a = RedisStore::connect(&a.url()).await.unwrap();
    let store_b = RedisStore::connect(&b.url()).await.unwrap();
    let prefix = format!("shared:{name}:");
    let on_a = uncached::<A>(&store_a, quota, &clock, &prefix);
    let on_b = uncached::<A>(&store_b, quota, &clock, &prefix);
    let twin_of_a = uncached::<A>(&store_a, quota, &clock, &prefix);
    for _ in 0..2 {
        assert!(on_b.check(&"k").await.unwrap().allowed, "{name}");
    }
    let (first, second) = (
        on_a.check(&"k").await.unwrap(),
        on_a.check(&"k").await.unwrap(),
    );
    assert!(first.allowed && second.allowed, "{name}");
    on_b.settle_and_wait(&"k", 1, first, 0).await.unwrap();
    assert!(
        !on_b.check(&"k").await.unwrap().allowed,
        "{name}: B got A's permit back"
    );
    assert!(!on_a.check(&"k").await.unwrap().allowed, "{name}");
    twin_of_a.settle_and_wait(&"k", 1, second, 0).await.unwrap();
    assert!(
        on_a.check(&"k").await.unwrap().allowed,
        "{name}: one state on one store"
    );
}

#[tokio::test]
async fn a_refund_across_redis_servers_gives_nothing_back() {
    let a = or_skip!(RedisServer::start("a_refund_across_redis_servers_a"));
    let b = or_skip!(RedisServer::start("a_refund_across_redis_servers_b"));
    for_every_algorithm!(a_refund_across_servers_gives_nothing_back(&a, &b).await);
}
