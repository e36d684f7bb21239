//! Exact permit accounting on the request path: admissions at once and full decisions under
//! contention, stale and out-of-order clock readings, costs, waiting reservations and refunds on
//! veto; and the layer's response future, whose permits must be released exactly once whatever
//! happens to it (dropped in every state, limiters that pend or fail, inner services that panic
//! or fail, headers on and off, `count_if`).
//!
//! Every count is checked against the real limiter's state afterwards (what is left of the
//! budget, drained permit by permit), never against a fake.

use crate::common::{block_on, paused_runtime, poll_once, Rng, YieldOnce};
use crate::support::{drain, header_cost, header_key, keyed, with_admitted_headers, Slow};
use std::cell::Cell;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::clock::{Clock, ManualClock, TokioClock};
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::Decision;
use tower_bulwark::rate_limit::{FailMode, KeyError, Policy, RateLimitLayer};
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

// ---------------------------------------------------------------------------------------------
// Instruments
// ---------------------------------------------------------------------------------------------

thread_local! {
    /// This thread's offset from the shared base time, in nanoseconds (negative: a stale clock).
    static SKEW: Cell<i64> = const { Cell::new(0) };
}

/// A clock whose readings the test controls per thread: a shared base plus the reading
/// thread's own skew, so threads read the "same" time out of step (some of them an hour stale).
#[derive(Clone)]
struct SkewClock(Arc<AtomicU64>);

impl SkewClock {
    fn at(base: Duration) -> Self {
        Self(Arc::new(AtomicU64::new(base.as_nanos() as u64)))
    }
}

impl Clock for SkewClock {
    fn now(&self) -> u64 {
        let base = self.0.load(Ordering::Acquire);
        base.saturating_add_signed(SKEW.with(Cell::get))
    }
}

fn set_skew(skew_ns: i64) {
    SKEW.with(|s| s.set(skew_ns));
}

const MS: i64 = 1_000_000;
const HOUR: i64 = 3_600_000 * MS;

/// Skews a racing thread may read at: ahead by up to 49 ms, behind by a few ms, a second, an
/// hour. The quotas under race have an emission interval of 100 ms.
const SKEWS: [i64; 8] = [
    0,
    49 * MS,
    -5 * MS,
    -HOUR,
    10 * MS,
    -1_000 * MS,
    30 * MS,
    -HOUR / 2,
];

fn request(tenant: &str, gate: &str, cost: u32) -> Request<Body> {
    Request::get("/r")
        .header("x-tenant", tenant)
        .header("x-gate", gate)
        .header("x-cost", cost.to_string())
        .body(Body::empty())
        .unwrap()
}

/// Runs `per_thread` requests on each of `threads` threads at once (each thread reading the
/// clock at `SKEWS[i % 8]`), through clones of `app`, on a paused-time runtime per thread.
/// Returns every response's status, `retry-after`, and how long (in the thread's paused tokio
/// time) the request took.
fn race_http(
    app: Router,
    threads: usize,
    per_thread: usize,
    make: impl Fn(usize, usize) -> Request<Body> + Send + Sync + 'static,
) -> Vec<Raced> {
    let make = Arc::new(make);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (app, make, barrier) = (app.clone(), Arc::clone(&make), Arc::clone(&barrier));
            std::thread::spawn(move || {
                set_skew(SKEWS[t % SKEWS.len()]);
                let rt = paused_runtime();
                barrier.wait();
                rt.block_on(async move {
                    let mut out = Vec::new();
                    for i in 0..per_thread {
                        let started = tokio::time::Instant::now();
                        let response = app.clone().oneshot(make(t, i)).await.unwrap();
                        let took = started.elapsed();
                        let retry = response
                            .headers()
                            .get("retry-after")
                            .map(|v| v.to_str().unwrap().to_string());
                        out.push((response.status(), retry, took));
                    }
                    out
                })
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

type Raced = (StatusCode, Option<String>, Duration);

fn ok_count(results: &[Raced]) -> usize {
    results
        .iter()
        .filter(|(s, ..)| *s == StatusCode::OK)
        .count()
}

// ---------------------------------------------------------------------------------------------
// 1. Exact limits under contention
// ---------------------------------------------------------------------------------------------

/// `check` from 8 threads on one key of a frozen `ManualClock`: exactly `L` admissions, each
/// with a distinct `remaining` (L-1 down to 0), every refusal with the same exact retry-after.
#[test]
fn check_admits_exactly_the_limit_under_contention() {
    for (round, limit) in [1u32, 2, 7, 10, 64].repeat(20).into_iter().enumerate() {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(1_000));
        let limiter = KeyedRateLimiter::<String>::builder(Quota::per_second(limit).unwrap())
            .clock(clock.clone())
            .build();
        let key = format!("hot-{round}");
        let barrier = Arc::new(Barrier::new(8));
        let decisions: Vec<Decision> = (0..8)
            .map(|_| {
                let (limiter, key, barrier) = (limiter.clone(), key.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..40).map(|_| limiter.check(&key)).collect::<Vec<_>>()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let mut remaining: Vec<u64> = decisions
            .iter()
            .filter(|d| d.allowed)
            .map(|d| d.remaining)
            .collect();
        remaining.sort_unstable();
        let expected: Vec<u64> = (0..u64::from(limit)).collect();
        assert_eq!(
            remaining, expected,
            "limit {limit}: admissions and their remaining"
        );
        let interval = limiter.quota().emission_interval();
        for d in decisions.iter().filter(|d| !d.allowed) {
            assert_eq!(d.retry_after, interval, "limit {limit}: {d:?}");
            assert_eq!(d.remaining, 0);
        }
        assert_eq!(drain(&limiter, &key), 0);
    }
}

/// `Limiter::reserve` / `reserve_now` with costs 1 to 4 from 8 threads: the costs admitted plus
/// what is left afterwards make exactly the burst, and no admission leaves a negative budget.
#[test]
fn reserve_with_costs_spends_exactly_the_burst_under_contention() {
    for round in 0..100u64 {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(50));
        let limiter = KeyedRateLimiter::<String>::builder(Quota::per_second(25).unwrap())
            .clock(clock.clone())
            .build();
        let key = format!("costly-{round}");
        let barrier = Arc::new(Barrier::new(8));
        let admitted: u64 = (0..8u64)
            .map(|t| {
                let (limiter, key, barrier) = (limiter.clone(), key.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let mut rng = Rng(0x9E37_79B9 ^ (round << 8) ^ (t + 1));
                    barrier.wait();
                    let mut spent = 0u64;
                    for i in 0..10 {
                        let cost = 1 + rng.below(4) as u32;
                        let decision = if i % 2 == 0 {
                            limiter.reserve_now(&key, cost).unwrap().unwrap()
                        } else {
                            Limiter::reserve(&limiter, &key, cost).into_inner().unwrap()
                        };
                        assert_eq!(decision.wait, Duration::ZERO, "no max_wait: never a wait");
                        if decision.allowed {
                            spent += u64::from(cost);
                        }
                    }
                    spent
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        let left = drain(&limiter, &key);
        assert_eq!(
            admitted + left,
            25,
            "round {round}: spent {admitted}, left {left}"
        );
        // With 80 requests of up to 4 permits racing for 25, the leftover is below the smallest
        // cost that was still being asked for, i.e. at most 3.
        assert!(left <= 3, "round {round}: {left} permits left unused");
    }
}

/// Waiting reservations (max_wait) from 8 threads: exactly `burst + max_wait / T` admissions,
/// whose waits are exactly 0 (burst times) then T, 2T, ... each once.
#[test]
fn reservations_are_exact_under_contention() {
    for round in 0..50 {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(7));
        let quota = Quota::per_second(10)
            .unwrap()
            .with_max_wait(Duration::from_millis(500))
            .unwrap();
        let limiter = KeyedRateLimiter::<String>::builder(quota)
            .clock(clock.clone())
            .build();
        let key = format!("waiters-{round}");
        let barrier = Arc::new(Barrier::new(8));
        let mut waits: Vec<Duration> = (0..8)
            .map(|_| {
                let (limiter, key, barrier) = (limiter.clone(), key.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..6)
                        .map(|_| limiter.reserve_now(&key, 1).unwrap().unwrap())
                        .filter(|d| d.allowed)
                        .map(|d| d.wait)
                        .collect::<Vec<_>>()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        waits.sort_unstable();
        let mut expected = vec![Duration::ZERO; 10];
        expected.extend((1..=5).map(|k| Duration::from_millis(100 * k)));
        assert_eq!(waits, expected, "round {round}");
    }
}

/// Stale and out-of-order readings between threads (one thread an hour behind, others a few
/// ms off either way): once the key has seen the latest reading, every racing reading is
/// decided as of it, so exactly the rest of the burst is admitted and every refusal says the
/// same exact retry-after, for `check` and for `reserve_now` with costs.
#[test]
fn stale_readings_between_threads_admit_exactly_the_rest() {
    for (round, cost) in (0..40u64).map(|r| (r, [1u32, 1, 2, 3][r as usize % 4])) {
        let clock = SkewClock::at(Duration::from_secs(10_000));
        let limiter = KeyedRateLimiter::<String>::builder(Quota::per_second(10).unwrap())
            .clock(clock.clone())
            .build();
        let key = format!("stale-{round}");
        // The key sees the latest reading any thread will make (49 ms ahead) and spends one.
        set_skew(49 * MS);
        assert!(limiter.check(&key).allowed);
        set_skew(0);
        let barrier = Arc::new(Barrier::new(8));
        let decisions: Vec<Decision> = (0..8)
            .map(|t| {
                let (limiter, key, barrier) = (limiter.clone(), key.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    set_skew(SKEWS[t]);
                    barrier.wait();
                    (0..10)
                        .map(|_| {
                            if cost == 1 {
                                limiter.check(&key)
                            } else {
                                limiter.reserve_now(&key, cost).unwrap().unwrap()
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let spent: u64 = decisions.iter().filter(|d| d.allowed).count() as u64 * u64::from(cost);
        assert_eq!(
            spent,
            9 / u64::from(cost) * u64::from(cost),
            "round {round} (cost {cost})"
        );
        for d in decisions.iter().filter(|d| !d.allowed) {
            // As of the latest reading: the key's TAT is 1 s + (cost - rest) T ahead.
            let short = u64::from(cost) - (9 - spent);
            assert_eq!(
                d.retry_after,
                Duration::from_millis(100 * short),
                "round {round}: {d:?}"
            );
        }
        set_skew(49 * MS);
        assert_eq!(drain(&limiter, &key), 9 - spent, "round {round}");
        set_skew(0);
    }
}

/// Skews a racing thread may read at when no reading went before: all within 49 ms, less than
/// one emission interval (100 ms) apart.
const NEAR_SKEWS: [i64; 8] = [0, 49 * MS, 10 * MS, 30 * MS, 5 * MS, 20 * MS, 40 * MS, MS];

/// Racing readings out of order by up to half an emission interval, on a fresh key (nothing
/// published before): the key's admissions are decided at instants that never go backwards, so
/// exactly the burst is admitted, through `check`, `reserve_now` and the layer's fast path.
#[test]
fn out_of_order_readings_on_a_fresh_key_admit_exactly_the_burst() {
    for round in 0..30u64 {
        let clock = SkewClock::at(Duration::from_secs(30_000));
        let limiter = KeyedRateLimiter::<String>::builder(Quota::per_second(10).unwrap())
            .clock(clock.clone())
            .build();
        let key = format!("fresh-{round}");
        let barrier = Arc::new(Barrier::new(8));
        let admitted: usize = (0..8)
            .map(|t| {
                let (limiter, key, barrier) = (limiter.clone(), key.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    set_skew(NEAR_SKEWS[(t + round as usize) % 8]);
                    barrier.wait();
                    (0..5)
                        .filter(|i| {
                            if (i + t) % 2 == 0 {
                                limiter.check(&key).allowed
                            } else {
                                limiter.reserve_now(&key, 1).unwrap().unwrap().allowed
                            }
                        })
                        .count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(admitted, 10, "round {round}");
    }
    for round in 0..8u64 {
        let clock = SkewClock::at(Duration::from_secs(40_000));
        let limiter = KeyedRateLimiter::<String>::builder(Quota::per_second(10).unwrap())
            .clock(clock.clone())
            .build();
        let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
        let app = Router::new()
            .route("/r", get(|| async { "ok" }))
            .route_layer(RateLimitLayer::new(policy).without_admitted_headers());
        let key = format!("fresh-{round}");
        // Each racing thread reads at a near skew (race_http sets SKEWS; override per request).
        let results = race_http(app, 8, 4, move |t, _| {
            set_skew(NEAR_SKEWS[(t + round as usize) % 8]);
            request(&key, "-", 1)
        });
        assert_eq!(ok_count(&results), 10, "round {round}");
    }
}

/// A one-policy layer without admitted headers and with them, raced by 8 threads reading the
/// clock out of step: exactly the rest of the burst is admitted, every 429 says
/// `retry-after: 1`, and the limiter is left with nothing.
#[test]
fn http_layer_admits_exactly_the_limit_under_contention_and_stale_clocks() {
    for headers in [false, true] {
        for round in 0..10 {
            let clock = SkewClock::at(Duration::from_secs(20_000));
            let limiter = KeyedRateLimiter::<String>::builder(Quota::per_second(10).unwrap())
                .clock(clock.clone())
                .build();
            set_skew(49 * MS);
            assert!(limiter.check(&"t".to_string()).allowed);
            set_skew(0);
            let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
            let layer = RateLimitLayer::new(policy);
            let layer = with_admitted_headers(layer, headers);
            let app = Router::new()
                .route("/r", get(|| async { "ok" }))
                .route_layer(layer);
            let results = race_http(app, 8, 6, |_, _| request("t", "-", 1));
            assert_eq!(ok_count(&results), 9, "headers {headers}, round {round}");
            for (status, retry, _) in &results {
                if *status != StatusCode::OK {
                    assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
                    assert_eq!(retry.as_deref(), Some("1"));
                }
            }
            set_skew(49 * MS);
            assert_eq!(drain(&limiter, "t"), 0, "headers {headers}, round {round}");
            set_skew(0);
        }
    }
}

/// The fast path with costs above one (`cost_by`), raced: the costs of the admitted requests
/// plus what is left make exactly the burst; a cost above the burst is refused without
/// touching the budget.
#[test]
fn http_fast_path_with_costs_spends_exactly_the_burst() {
    for round in 0..12u64 {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(3));
        let limiter = KeyedRateLimiter::<String>::builder(Quota::per_second(30).unwrap())
            .clock(clock.clone())
            .build();
        let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone())
            .unwrap()
            .cost_by(header_cost("x-cost"));
        let app = Router::new()
            .route("/r", get(|| async { "ok" }))
            .route_layer(RateLimitLayer::new(policy).without_admitted_headers());
        // A cost of 31 can never fit: refused, nothing spent.
        let too_big = paused_runtime()
            .block_on(app.clone().oneshot(request("t", "-", 31)))
            .unwrap();
        assert_eq!(too_big.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(too_big.headers().get("retry-after").is_none());
        let costs: Arc<Vec<u32>> = {
            let mut rng = Rng(0xC0FFEE + round);
            Arc::new((0..64).map(|_| 1 + rng.below(4) as u32).collect())
        };
        let c = Arc::clone(&costs);
        let results = race_http(app, 8, 8, move |t, i| request("t", "-", c[t * 8 + i]));
        // The results come back grouped by thread, in order: thread t's i-th is costs[t*8+i].
        let spent: u64 = results
            .iter()
            .zip(costs.iter())
            .filter(|((s, ..), _)| *s == StatusCode::OK)
            .map(|(_, c)| u64::from(*c))
            .sum();
        let left = drain(&limiter, "t");
        assert_eq!(
            spent + left,
            30,
            "round {round}: spent {spent}, left {left}"
        );
    }
}

/// The fast path with a quota that waits (max_wait): the raced requests get exactly
/// `burst + max_wait / T` 200s, the waiting ones after their wait.
#[test]
fn http_fast_path_with_waits_is_exact_under_contention() {
    for headers in [false, true] {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(5));
        let quota = Quota::per_second(10)
            .unwrap()
            .with_max_wait(Duration::from_millis(400))
            .unwrap();
        let limiter = KeyedRateLimiter::<String>::builder(quota)
            .clock(clock.clone())
            .build();
        let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
        let layer = RateLimitLayer::new(policy);
        let layer = with_admitted_headers(layer, headers);
        let app = Router::new()
            .route("/r", get(|| async { "ok" }))
            .route_layer(layer);
        let results = race_http(app, 8, 4, |_, _| request("t", "-", 1));
        assert_eq!(ok_count(&results), 14, "headers {headers}");
        // Each admitted request waited exactly its reservation: 0 for ten, then 100 ms to
        // 400 ms, once each; refusals at once.
        let mut waits: Vec<Duration> = results
            .iter()
            .filter(|(s, ..)| *s == StatusCode::OK)
            .map(|(.., took)| *took)
            .collect();
        waits.sort_unstable();
        let mut expected = vec![Duration::ZERO; 10];
        expected.extend((1..=4).map(|k| Duration::from_millis(100 * k)));
        assert_eq!(waits, expected, "headers {headers}");
        assert!(results
            .iter()
            .all(|(s, _, took)| *s == StatusCode::OK || took.is_zero()));
        assert_eq!(drain(&limiter, "t"), 0);
    }
}

/// Two policies, the second refusing (a closed gate): racing requests are all refused, and the
/// first policy's budget is exactly as if they never came, costs above one included. Then
/// with an open gate of 3 the first policy is charged for exactly the 3 that went through.
#[test]
fn a_veto_leaves_the_first_policy_untouched_under_contention() {
    for cost in [1u32, 5] {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(100));
        let tenants = KeyedRateLimiter::<String>::builder(Quota::per_hour(100).unwrap())
            .clock(clock.clone())
            .build();
        let gates = KeyedRateLimiter::<String>::builder(Quota::per_hour(3).unwrap())
            .clock(clock.clone())
            .build();
        // The closed gate is spent before the race.
        while gates.check(&"closed".to_string()).allowed {}
        let policies = Policy::new("tenant", header_key("x-tenant"), tenants.clone())
            .unwrap()
            .cost(cost)
            .and(Policy::new("gate", header_key("x-gate"), gates.clone()).unwrap());
        for headers in [false, true] {
            let layer = RateLimitLayer::new(policies.clone());
            let layer = with_admitted_headers(layer, headers);
            let app = Router::new()
                .route("/r", get(|| async { "ok" }))
                .route_layer(layer);
            let results = race_http(app.clone(), 8, 5, |_, _| request("t", "closed", 1));
            assert_eq!(ok_count(&results), 0);
            let results = race_http(app, 8, 5, move |_, _| {
                request("t", if headers { "open-h" } else { "open" }, 1)
            });
            assert_eq!(ok_count(&results), 3, "cost {cost}, headers {headers}");
        }
        // Two open gates, 3 each: 6 requests of `cost` spent, the 74 vetoed ones given back.
        assert_eq!(
            drain(&tenants, "t"),
            100 - 6 * u64::from(cost),
            "cost {cost}"
        );
    }
}

/// Sequential model check of the layer against a twin limiter, with time moving, costs of 1
/// and 2 and waiting reservations: one policy alone (without headers), or followed by a second
/// policy that vetoes some requests (which must leave the first deciding exactly as a twin that
/// only ever saw the requests that were not vetoed).
/// Each admitted request waits exactly the twin's wait.
#[test]
fn the_layer_decides_as_a_twin_that_saw_only_unvetoed_requests() {
    for seed in 1..=12u64 {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(1));
        let quota = Quota::per_second(4)
            .unwrap()
            .with_burst(3)
            .unwrap()
            .with_max_wait(Duration::from_millis(600))
            .unwrap();
        let tenants = KeyedRateLimiter::<String>::builder(quota)
            .clock(clock.clone())
            .build();
        let twin = KeyedRateLimiter::<String>::builder(quota)
            .clock(clock.clone())
            .build();
        let gates = KeyedRateLimiter::<String>::builder(Quota::per_hour(1).unwrap())
            .clock(clock.clone())
            .build();
        assert!(gates.check(&"closed".to_string()).allowed);
        let headers = seed % 2 == 0;
        let gated = seed % 4 < 2;
        let tenant = Policy::new("tenant", header_key("x-tenant"), tenants.clone())
            .unwrap()
            .cost_by(header_cost("x-cost"));
        let app = Router::new().route("/r", get(|| async { "ok" }));
        let app = if gated {
            let policies = tenant.and(
                Policy::new("gate", header_key("x-gate"), gates.clone())
                    .unwrap()
                    .cost_by(|head: &RequestHead<'_>| u32::from(head.headers["x-gate"] != "open")),
            );
            let layer = RateLimitLayer::new(policies);
            app.route_layer(if headers {
                layer
            } else {
                layer.without_admitted_headers()
            })
        } else {
            let layer = RateLimitLayer::new(tenant);
            app.route_layer(if headers {
                layer
            } else {
                layer.without_admitted_headers()
            })
        };
        let rt = paused_runtime();
        let mut rng = Rng(seed * 0x1234_5678_9ABC);
        for step in 0..60 {
            clock.advance(Duration::from_millis(rng.below(400)));
            let veto = gated && rng.below(3) == 0;
            let cost = 1 + rng.below(2) as u32;
            let gate = if veto { "closed" } else { "open" };
            let started = rt.block_on(async { tokio::time::Instant::now() });
            let response = rt
                .block_on(app.clone().oneshot(request("t", gate, cost)))
                .unwrap();
            let waited = rt.block_on(async { started.elapsed() });
            if veto {
                assert_eq!(
                    response.status(),
                    StatusCode::TOO_MANY_REQUESTS,
                    "seed {seed} step {step}"
                );
                continue;
            }
            let expected = twin.reserve_now(&"t".to_string(), cost).unwrap().unwrap();
            let status = if expected.allowed {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            assert_eq!(
                response.status(),
                status,
                "seed {seed} step {step}: {expected:?}"
            );
            if expected.allowed {
                // tokio's timer rounds a wait up to the millisecond.
                assert!(
                    waited >= expected.wait && waited <= expected.wait + Duration::from_millis(1),
                    "seed {seed} step {step}: waited {waited:?}, twin says {:?}",
                    expected.wait
                );
            }
        }
        let (a, b) = (
            tenants.check(&"t".to_string()),
            twin.check(&"t".to_string()),
        );
        assert_eq!(
            (a.allowed, a.remaining, a.retry_after, a.reset_after),
            (b.allowed, b.remaining, b.retry_after, b.reset_after),
            "seed {seed}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 2. The response future: permits released exactly once
// ---------------------------------------------------------------------------------------------

/// An inner service that counts its calls and answers 200 (or, per the `x-answer` header, a
/// given status, a panic in its future, or an error).
#[derive(Clone, Default)]
struct Inner {
    calls: Arc<AtomicUsize>,
}

impl Service<Request<Body>> for Inner {
    type Response = Response<Body>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = request
            .headers()
            .get("x-answer")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_else(|| "200".into());
        if answer == "call-panic" {
            panic!("the inner service's call panicked");
        }
        Box::pin(async move {
            YieldOnce::default().await;
            match answer.as_str() {
                "panic" => panic!("the handler panicked"),
                "error" => Err(std::io::Error::other("the handler failed")),
                status => Ok(Response::builder()
                    .status(status.parse::<u16>().unwrap())
                    .body(Body::from("inner"))
                    .unwrap()),
            }
        })
    }
}

fn req(answer: &str) -> Request<Body> {
    Request::get("/r")
        .header("x-tenant", "t")
        .header("x-gate", "g")
        .header("x-answer", answer)
        .body(Body::empty())
        .unwrap()
}

/// A [`Slow`] limiter of 5 per minute on `clock`, pending `pendings` polls, failing if `fails`.
fn slow_per_minute(clock: &ManualClock, pendings: usize, fails: bool) -> Slow<String> {
    Slow::new(keyed(Quota::per_minute(5).unwrap(), clock), pendings, fails)
}

fn debug_state(future: &impl std::fmt::Debug) -> String {
    format!("{future:?}")
}

/// A real policy then a slow one: the future waits on the slow limiter holding the first
/// policy's permit. Dropped before its first poll, or after any number of pending polls, it
/// gives that permit back (exactly once: the budget is whole again, not more), the slow
/// limiter's future never decided, and the inner service was never called.
#[test]
fn dropped_while_a_limiter_is_pending_gives_back_exactly_once() {
    for polls in 0..4 {
        for headers in [false, true] {
            let clock = ManualClock::new();
            let fast = keyed(Quota::per_minute(5).unwrap(), &clock);
            let slow = slow_per_minute(&clock, 5, false);
            let policies = Policy::new("fast", header_key("x-tenant"), fast.clone())
                .unwrap()
                .and(Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap());
            let layer = RateLimitLayer::new(policies);
            let layer = with_admitted_headers(layer, headers);
            let inner = Inner::default();
            let mut service = layer.layer(inner.clone());
            let mut future = Box::pin(service.call(req("200")));
            let debug = debug_state(&future);
            assert!(
                debug.contains("reserving") && debug.contains("permits_held: 1"),
                "{debug}"
            );
            for _ in 0..polls {
                assert!(poll_once(future.as_mut()).is_pending());
                let debug = debug_state(&future);
                assert!(debug.contains("reserving"), "{debug}");
            }
            drop(future);
            assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
            assert_eq!(slow.decided.load(Ordering::SeqCst), 0);
            assert_eq!(
                drain(&fast, "t"),
                5,
                "polls {polls}: the fast permit given back once"
            );
            assert_eq!(drain(&slow.inner, "g"), 5);
        }
    }
}

/// The same pair driven to the end: both permits spent exactly once, the inner service called
/// once; the future's Debug tells each state; headers only when asked for.
#[test]
fn a_deferred_admission_spends_each_permit_once() {
    for headers in [false, true] {
        let clock = ManualClock::new();
        let fast = keyed(Quota::per_minute(5).unwrap(), &clock);
        let slow = slow_per_minute(&clock, 2, false);
        let policies = Policy::new("fast", header_key("x-tenant"), fast.clone())
            .unwrap()
            .and(Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap());
        let layer = RateLimitLayer::new(policies);
        let layer = with_admitted_headers(layer, headers);
        let inner = Inner::default();
        let mut service = layer.layer(inner.clone());
        let mut future = Box::pin(service.call(req("200")));
        let response = loop {
            match poll_once(future.as_mut()) {
                Poll::Ready(response) => break response.unwrap(),
                Poll::Pending => {
                    let debug = debug_state(&future);
                    assert!(
                        debug.contains("reserving") || debug.contains("calling"),
                        "{debug}"
                    );
                }
            }
        };
        let _ = debug_state(&future);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers().contains_key("ratelimit"), headers);
        assert_eq!(response.headers().contains_key("ratelimit-policy"), headers);
        drop(future);
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
        assert_eq!(drain(&fast, "t"), 4);
        assert_eq!(drain(&slow.inner, "g"), 4);
    }
}

/// A slow limiter that fails: closed, the request is answered 503 and the first policy's
/// permit given back; open, it goes through and that permit is spent, once.
#[test]
fn a_failing_limiter_gives_back_or_spends_exactly_once() {
    for (mode, status, left) in [
        (FailMode::Closed, StatusCode::SERVICE_UNAVAILABLE, 5),
        (FailMode::Open, StatusCode::OK, 4),
    ] {
        for slow_first in [false, true] {
            let clock = ManualClock::new();
            let fast = keyed(Quota::per_minute(5).unwrap(), &clock);
            let slow = slow_per_minute(&clock, 2, true);
            let fast_policy = Policy::new("fast", header_key("x-tenant"), fast.clone()).unwrap();
            let slow_policy = Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap();
            let inner = Inner::default();
            let response = if slow_first {
                let layer =
                    RateLimitLayer::new(slow_policy.and(fast_policy)).limiter_error_mode(mode);
                let mut service = layer.layer(inner.clone());
                block_on(service.call(req("200"))).unwrap()
            } else {
                let layer =
                    RateLimitLayer::new(fast_policy.and(slow_policy)).limiter_error_mode(mode);
                let mut service = layer.layer(inner.clone());
                block_on(service.call(req("200"))).unwrap()
            };
            assert_eq!(
                response.status(),
                status,
                "{mode:?}, slow first {slow_first}"
            );
            assert_eq!(
                inner.calls.load(Ordering::SeqCst),
                usize::from(status == StatusCode::OK)
            );
            assert_eq!(drain(&fast, "t"), left, "{mode:?}, slow first {slow_first}");
            assert_eq!(drain(&slow.inner, "g"), 5);
        }
    }
}

/// A waiting reservation (the Wait state) dropped before its first poll, or half-way through
/// its sleep: the reservation is given back, so the next caller gets the very same slot. Driven
/// to the end, the inner service runs exactly when the slot falls due.
#[tokio::test(start_paused = true)]
async fn dropped_during_the_wait_gives_the_slot_back() {
    for (polls, sleep_ms) in [(0u64, 0u64), (1, 0), (1, 300), (3, 999)] {
        for headers in [false, true] {
            let clock = TokioClock::new();
            let quota = Quota::per_second(1)
                .unwrap()
                .with_max_wait(Duration::from_secs(5))
                .unwrap();
            let limiter = KeyedRateLimiter::<String>::builder(quota)
                .clock(clock)
                .build();
            let layer = RateLimitLayer::new(
                Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap(),
            );
            let layer = with_admitted_headers(layer, headers);
            let inner = Inner::default();
            let mut service = layer.layer(inner.clone());
            let first = service
                .ready()
                .await
                .unwrap()
                .call(req("200"))
                .await
                .unwrap();
            assert_eq!(first.status(), StatusCode::OK);
            let start = tokio::time::Instant::now();
            let mut waiting = Box::pin(service.ready().await.unwrap().call(req("200")));
            let debug = debug_state(&waiting);
            assert!(
                debug.contains("waiting") && debug.contains("permits_held: 1"),
                "{debug}"
            );
            for _ in 0..polls {
                tokio::time::advance(Duration::from_millis(sleep_ms / polls.max(1))).await;
                assert!(poll_once(waiting.as_mut()).is_pending());
                assert!(debug_state(&waiting).contains("waiting"));
            }
            let elapsed = start.elapsed();
            drop(waiting);
            assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
            // The slot at start + 1 s is free again: a new reservation waits exactly until it.
            let again = limiter.reserve_now(&"t".to_string(), 1).unwrap().unwrap();
            assert!(again.allowed);
            assert_eq!(
                again.wait,
                Duration::from_secs(1) - elapsed,
                "polls {polls}, headers {headers}"
            );
            limiter.refund(&"t".to_string(), 1, again);
            // Driven to the end, the next waiter is called when its slot falls due.
            let response = service
                .ready()
                .await
                .unwrap()
                .call(req("200"))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers().contains_key("ratelimit"), headers);
            assert_eq!(start.elapsed(), Duration::from_secs(1), "polls {polls}");
            assert_eq!(inner.calls.load(Ordering::SeqCst), 2);
            // Now start + 2 s is the next slot.
            let next = limiter.reserve_now(&"t".to_string(), 1).unwrap().unwrap();
            assert_eq!(next.wait, Duration::from_secs(1));
            tokio::time::advance(Duration::from_secs(10)).await;
        }
    }
}

/// A slow limiter that grants a waiting reservation: the future goes Reserve -> Wait; dropped in
/// the Wait state, both policies' permits are given back (the slow one's slot is free again).
#[tokio::test(start_paused = true)]
async fn dropped_in_a_wait_reached_through_a_pending_limiter_gives_both_back() {
    let clock = ManualClock::new();
    let fast = keyed(Quota::per_minute(5).unwrap(), &clock);
    let waiting_quota = Quota::per_second(1)
        .unwrap()
        .with_max_wait(Duration::from_secs(3))
        .unwrap();
    let slow = Slow::new(keyed(waiting_quota, &clock), 2, false);
    assert!(slow.inner.check(&"g".to_string()).allowed);
    let policies = Policy::new("fast", header_key("x-tenant"), fast.clone())
        .unwrap()
        .and(Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap());
    let inner = Inner::default();
    let mut service = RateLimitLayer::new(policies).layer(inner.clone());
    let mut future = Box::pin(service.call(req("200")));
    let mut states = Vec::new();
    for _ in 0..4 {
        assert!(poll_once(future.as_mut()).is_pending());
        states.push(debug_state(&future));
    }
    assert!(states.last().unwrap().contains("waiting"), "{states:?}");
    assert!(
        states.last().unwrap().contains("permits_held: 2"),
        "{states:?}"
    );
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(poll_once(future.as_mut()).is_pending());
    drop(future);
    assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
    assert_eq!(drain(&fast, "t"), 5);
    // The slow limiter's key is back to one spent permit: a reservation waits one interval.
    let again = slow
        .inner
        .reserve_now(&"g".to_string(), 1)
        .unwrap()
        .unwrap();
    assert_eq!(again.wait, Duration::from_secs(1));
}

/// The inner service panics (inside its future) or fails: the request reached it, so its permit
/// is spent, exactly once, on every path (fast path, headers, two policies, `count_if` whose
/// predicate would not count the response), and the future's Debug still works afterwards.
#[test]
fn an_inner_panic_or_error_spends_the_permit_exactly_once() {
    for answer in ["panic", "error"] {
        for shape in 0..4 {
            let clock = ManualClock::new();
            let limiter = keyed(Quota::per_minute(5).unwrap(), &clock);
            let other = keyed(Quota::per_minute(5).unwrap(), &clock);
            let inner = Inner::default();
            let one = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
            let mut future: Pin<Box<dyn FutureDebug>> = match shape {
                0 => Box::pin(IsErr(
                    RateLimitLayer::new(one)
                        .without_admitted_headers()
                        .layer(inner.clone())
                        .call(req(answer)),
                )),
                1 => Box::pin(IsErr(
                    RateLimitLayer::new(one)
                        .layer(inner.clone())
                        .call(req(answer)),
                )),
                2 => Box::pin(IsErr(
                    RateLimitLayer::new(
                        one.and(Policy::new("gate", header_key("x-gate"), other.clone()).unwrap()),
                    )
                    .layer(inner.clone())
                    .call(req(answer)),
                )),
                _ => Box::pin(IsErr(
                    RateLimitLayer::new(one.count_if(|parts| parts.status.is_server_error()))
                        .without_admitted_headers()
                        .layer(inner.clone())
                        .call(req(answer)),
                )),
            };
            let debug = future.debug();
            assert!(debug.contains("calling"), "{debug}");
            if shape == 3 {
                assert!(debug.contains("settles_after_response: true"), "{debug}");
            }
            assert!(poll_once(future.as_mut()).is_pending());
            let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut())));
            match answer {
                "panic" => assert!(outcome.is_err(), "shape {shape}: the panic goes through"),
                _ => assert!(
                    matches!(outcome, Ok(Poll::Ready(true))),
                    "shape {shape}: the error goes through"
                ),
            }
            let _ = future.debug();
            drop(future);
            assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
            assert_eq!(drain(&limiter, "t"), 4, "{answer}, shape {shape}");
            if shape == 2 {
                assert_eq!(drain(&other, "g"), 4);
            }
        }
    }
}

/// A future over a `Result` that is `Debug` too, so different response futures fit one box;
/// its output says whether the result was an error.
trait FutureDebug: Future<Output = bool> {
    fn debug(&self) -> String;
}

struct IsErr<F>(F);

impl<F, T, E> Future for IsErr<F>
where
    F: Future<Output = Result<T, E>> + Unpin,
{
    type Output = bool;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        Pin::new(&mut self.0).poll(cx).map(|r| r.is_err())
    }
}

impl<F, T, E> FutureDebug for IsErr<F>
where
    F: Future<Output = Result<T, E>> + Unpin + std::fmt::Debug,
{
    fn debug(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// `count_if` on each path: a response that does not count gives its permit back exactly once
/// (the budget is whole, not more than whole), one that counts keeps it spent; a future dropped
/// after the inner service was called but before the response keeps it spent.
#[test]
fn count_if_settles_exactly_once() {
    for headers in [false, true] {
        for (answer, left) in [("200", 5u64), ("500", 4), ("drop", 4)] {
            let clock = ManualClock::new();
            let limiter = keyed(Quota::per_minute(5).unwrap(), &clock);
            let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone())
                .unwrap()
                .count_if(|parts| parts.status.is_server_error());
            let layer = RateLimitLayer::new(policy);
            let layer = with_admitted_headers(layer, headers);
            let inner = Inner::default();
            let mut service = layer.layer(inner.clone());
            let mut future =
                Box::pin(service.call(req(if answer == "drop" { "200" } else { answer })));
            let debug = debug_state(&future);
            assert!(debug.contains("settles_after_response: true"), "{debug}");
            if answer == "drop" {
                assert!(poll_once(future.as_mut()).is_pending());
                drop(future);
            } else {
                let response = block_on(future.as_mut()).unwrap();
                assert_eq!(response.status().as_u16(), answer.parse::<u16>().unwrap());
                assert_eq!(response.headers().contains_key("ratelimit"), headers);
                if headers && answer == "200" {
                    // The client is told the permit is back.
                    let value = response.headers()["ratelimit"].to_str().unwrap();
                    assert!(value.contains("r=5;"), "{value}");
                }
                let _ = debug_state(&future);
            }
            assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
            assert_eq!(drain(&limiter, "t"), left, "headers {headers}, {answer}");
        }
    }
}

/// Refusals and the Debug of the Answer state: a refused request never reaches the inner
/// service, spends nothing more, and its future's Debug works before and after completion.
#[test]
fn answered_futures_spend_nothing_and_debug_in_every_state() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_minute(1).unwrap(), &clock);
    let inner = Inner::default();
    let layer = RateLimitLayer::new(
        Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap(),
    )
    .without_admitted_headers();
    let mut service = layer.layer(inner.clone());
    let mut admitted = Box::pin(service.call(req("200")));
    let debug = debug_state(&admitted);
    assert!(
        debug.contains("calling") && debug.contains("settles_after_response: false"),
        "{debug}"
    );
    let mut refused = Box::pin(service.call(req("200")));
    let debug = debug_state(&refused);
    assert!(
        debug.contains("answering") && debug.contains("permits_held: 0"),
        "{debug}"
    );
    let response = block_on(refused.as_mut()).unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(debug_state(&refused).contains("answering"));
    let response = block_on(admitted.as_mut()).unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let _ = debug_state(&admitted);
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(60));
    assert_eq!(drain(&limiter, "t"), 1);
    // Futures of the fast path dropped before their first poll: the request was handed to
    // the inner service in `call`, so each admitted one is spent, once; refusals spend nothing.
    let limiter = keyed(Quota::per_minute(5).unwrap(), &clock);
    let inner = Inner::default();
    let mut service = RateLimitLayer::new(
        Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap(),
    )
    .without_admitted_headers()
    .layer(inner.clone());
    for _ in 0..7 {
        drop(service.call(req("200")));
    }
    assert_eq!(inner.calls.load(Ordering::SeqCst), 5);
    assert_eq!(drain(&limiter, "t"), 0);
}

/// A panic while deciding the rest of a request, after a pending limiter admitted it (a key
/// extractor or a cost function of the next policy): the future keeps what it holds (its
/// Debug says so) and, dropped, gives the admission back exactly once.
#[test]
fn a_panic_deciding_after_a_pending_limiter_gives_back() {
    for panicking_cost in [false, true] {
        let clock = ManualClock::new();
        let slow = slow_per_minute(&clock, 2, false);
        let other = keyed(Quota::per_minute(5).unwrap(), &clock);
        let boom = move |head: &RequestHead<'_>| -> Result<String, KeyError> {
            if !panicking_cost && head.headers.contains_key("x-boom") {
                panic!("the key extractor panicked");
            }
            Ok("o".to_string())
        };
        let next = Policy::new("other", boom, other.clone()).unwrap().cost_by(
            move |head: &RequestHead<'_>| {
                if panicking_cost && head.headers.contains_key("x-boom") {
                    panic!("the cost function panicked");
                }
                1
            },
        );
        let policies = Policy::new("slow", header_key("x-gate"), slow.clone())
            .unwrap()
            .and(next);
        let inner = Inner::default();
        let mut service = RateLimitLayer::new(policies).layer(inner.clone());
        let mut request = req("200");
        request.headers_mut().insert("x-boom", "1".parse().unwrap());
        let mut future = Box::pin(service.call(request));
        assert!(poll_once(future.as_mut()).is_pending());
        let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut())));
        assert!(outcome.is_err(), "the panic goes through");
        let debug = debug_state(&future);
        assert!(debug.contains("permits_held: 1"), "{debug}");
        drop(future);
        assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
        assert_eq!(drain(&slow.inner, "g"), 5, "cost panics {panicking_cost}");
        assert_eq!(drain(&other, "o"), 5);
    }
}

/// An inner service whose `call` itself panics: the request was handed over, so on every path
/// (the fast path, headers on, two policies, a policy that decides later, `count_if`) its
/// permits are spent exactly once (never given back, never charged twice), and a future left
/// behind by the panic still shows its Debug and drops cleanly.
#[test]
fn an_inner_call_that_panics_spends_exactly_once() {
    for shape in 0..5 {
        let clock = ManualClock::new();
        let limiter = keyed(Quota::per_minute(5).unwrap(), &clock);
        let slow = slow_per_minute(&clock, 2, false);
        let inner = Inner::default();
        let one = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
        let called = catch_unwind(AssertUnwindSafe(|| -> Option<Pin<Box<dyn FutureDebug>>> {
            match shape {
                0 => {
                    let mut s = RateLimitLayer::new(one)
                        .without_admitted_headers()
                        .layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
                1 => {
                    let mut s = RateLimitLayer::new(one).layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
                2 => {
                    let mut s = RateLimitLayer::new(one.count_if(|p| p.status.is_server_error()))
                        .layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
                3 => {
                    let two =
                        one.and(Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap());
                    let mut s = RateLimitLayer::new(two).layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
                _ => {
                    let two = one
                        .count_if(|p| p.status.is_server_error())
                        .and(Policy::new("slow", header_key("x-gate"), slow.clone()).unwrap());
                    let mut s = RateLimitLayer::new(two)
                        .without_admitted_headers()
                        .layer(inner.clone());
                    Some(Box::pin(IsErr(s.call(req("call-panic")))))
                }
            }
        }));
        match called {
            // Decided in `call`: the panic came out of it.
            Err(_) => assert!(shape < 3, "shape {shape}"),
            Ok(future) => {
                assert!(
                    shape >= 3,
                    "shape {shape}: the inner call did not panic in `call`"
                );
                let mut future = future.unwrap();
                assert!(poll_once(future.as_mut()).is_pending());
                let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut())));
                assert!(outcome.is_err(), "shape {shape}: the panic goes through");
                let debug = future.debug();
                assert!(debug.contains("permits_held: 0"), "{debug}");
                drop(future);
                assert_eq!(drain(&slow.inner, "g"), 4, "shape {shape}");
            }
        }
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
        assert_eq!(drain(&limiter, "t"), 4, "shape {shape}");
    }
}
