//! Exact permit accounting on the request path: admissions at once and full decisions under
//! contention, stale and out-of-order clock readings, costs, waiting reservations and refunds on
//! veto. The layer's response future, whose permits are released exactly once whatever happens to
//! it, is in `permit_accounting_future.rs`.
//!
//! Every count is checked against the real limiter's state afterwards (what is left of the
//! budget, drained permit by permit), never against a fake.

use crate::common::keyed_on;
use crate::common::{in_bursts_of, manual_clock_at, paused_runtime, waits_up_to, Rng};
use crate::support::{drain, header_cost, header_key, with_admitted_headers};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::clock::Clock;
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::Decision;
use tower_bulwark::rate_limit::{Policy, RateLimitLayer};
use tower_bulwark::{Limiter, Quota};

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

/// An app answering "ok" at `/r` behind `layer`.
fn ok_at_r<L>(layer: L) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request<Body>> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<Request<Body>>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<Request<Body>>>::Error: Into<std::convert::Infallible> + 'static,
    <L::Service as tower::Service<Request<Body>>>::Future: Send + 'static,
{
    Router::new()
        .route("/r", get(|| async { "ok" }))
        .route_layer(layer)
}

// ---------------------------------------------------------------------------------------------
// Exact limits under contention
// ---------------------------------------------------------------------------------------------

/// `check` from 8 threads on one key of a frozen `ManualClock`: exactly `L` admissions, each
/// with a distinct `remaining` (L-1 down to 0), every refusal with the same exact retry-after.
#[test]
fn check_admits_exactly_the_limit_under_contention() {
    for (round, limit) in [1u32, 2, 7, 10, 64].repeat(20).into_iter().enumerate() {
        let clock = manual_clock_at(Duration::from_secs(1_000));
        let limiter = keyed_on::<String, _>(Quota::per_second(limit).unwrap(), &clock);
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
        let clock = manual_clock_at(Duration::from_secs(50));
        let limiter = keyed_on::<String, _>(Quota::per_second(25).unwrap(), &clock);
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
        let clock = manual_clock_at(Duration::from_secs(7));
        let quota = waits_up_to(Quota::per_second(10).unwrap(), Duration::from_millis(500));
        let limiter = keyed_on::<String, _>(quota, &clock);
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
        let limiter = keyed_on::<String, _>(Quota::per_second(10).unwrap(), &clock);
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
        let limiter = keyed_on::<String, _>(Quota::per_second(10).unwrap(), &clock);
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
        let limiter = keyed_on::<String, _>(Quota::per_second(10).unwrap(), &clock);
        let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
        let app = ok_at_r(RateLimitLayer::new(policy).without_admitted_headers());
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
            let limiter = keyed_on::<String, _>(Quota::per_second(10).unwrap(), &clock);
            set_skew(49 * MS);
            assert!(limiter.check(&"t".to_string()).allowed);
            set_skew(0);
            let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
            let app = ok_at_r(with_admitted_headers(RateLimitLayer::new(policy), headers));
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
        let clock = manual_clock_at(Duration::from_secs(3));
        let limiter = keyed_on::<String, _>(Quota::per_second(30).unwrap(), &clock);
        let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone())
            .unwrap()
            .cost_by(header_cost("x-cost"));
        let app = ok_at_r(RateLimitLayer::new(policy).without_admitted_headers());
        // A cost of 31 can never fit: refused, nothing spent.
        let too_big = paused_runtime()
            .block_on(app.clone().oneshot(request("t", "-", 31)))
            .unwrap();
        assert_eq!(too_big.status(), StatusCode::PAYLOAD_TOO_LARGE);
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
        let clock = manual_clock_at(Duration::from_secs(5));
        let quota = waits_up_to(Quota::per_second(10).unwrap(), Duration::from_millis(400));
        let limiter = keyed_on::<String, _>(quota, &clock);
        let policy = Policy::new("tenant", header_key("x-tenant"), limiter.clone()).unwrap();
        let app = ok_at_r(with_admitted_headers(RateLimitLayer::new(policy), headers));
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
        let clock = manual_clock_at(Duration::from_secs(100));
        let tenants = keyed_on::<String, _>(Quota::per_hour(100).unwrap(), &clock);
        let gates = keyed_on::<String, _>(Quota::per_hour(3).unwrap(), &clock);
        // The closed gate is spent before the race.
        while gates.check(&"closed".to_string()).allowed {}
        let policies = Policy::new("tenant", header_key("x-tenant"), tenants.clone())
            .unwrap()
            .cost(cost)
            .and(Policy::new("gate", header_key("x-gate"), gates.clone()).unwrap());
        for headers in [false, true] {
            let app = ok_at_r(with_admitted_headers(
                RateLimitLayer::new(policies.clone()),
                headers,
            ));
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
        let clock = manual_clock_at(Duration::from_secs(1));
        let quota = waits_up_to(
            in_bursts_of(Quota::per_second(4).unwrap(), 3),
            Duration::from_millis(600),
        );
        let tenants = keyed_on::<String, _>(quota, &clock);
        let twin = keyed_on::<String, _>(quota, &clock);
        let gates = keyed_on::<String, _>(Quota::per_hour(1).unwrap(), &clock);
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
