//! The HTTP layer's answers in every state: each response carries exactly its own `RateLimit`
//! text (across threads, from threads that exit, from thread-local destructors), every layer
//! shape (1, 2, 4, 5, 8 policies) decides all-or-nothing exactly as a twin model does, and every
//! state of a hand-driven response future behaves as documented.
//!
//! Complements `permit_accounting.rs` (exact limits under contention, permit release, keys,
//! clocks).

use crate::common::{block_on, paused_runtime, poll_once, Rng};
use crate::support::{header_cost, keyed, Slow};
use std::cell::RefCell;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::algorithm::Gcra;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::limiter::Decision;
use tower_bulwark::rate_limit::{FailMode, HeaderKey, Policy, RateLimitLayer};
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

// ---------------------------------------------------------------------------------------------
// Instruments
// ---------------------------------------------------------------------------------------------

type Keyed = KeyedRateLimiter<HeaderValue, Gcra, ManualClock>;

/// The header's values as text, joined as one list.
fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<_> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("a visible-ASCII header value").to_owned())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// `name` as a Structured Field String.
fn sf(name: &str) -> String {
    let mut out = String::from("\"");
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The status named by the request's `x-answer` header (200 without one).
async fn answer(headers: HeaderMap) -> StatusCode {
    headers
        .get("x-answer")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u16>().ok())
        .map_or(StatusCode::OK, |s| StatusCode::from_u16(s).unwrap())
}

// ---------------------------------------------------------------------------------------------
// 1. `RateLimit` values held, moved and dropped across threads
// ---------------------------------------------------------------------------------------------

/// A 64-character name of plain characters.
fn plain_name(tag: &str) -> String {
    let mut name = format!("{tag}-");
    while name.len() < 64 {
        name.push((b'a' + (name.len() % 26) as u8) as char);
    }
    name
}

/// A 64-character name that is mostly characters a Structured Field String escapes.
fn escaped_name(tag: &str) -> String {
    let mut name = tag.to_string();
    let mut i = 0;
    while name.len() < 64 {
        name.push(['"', '\\', ' ', '~'][i % 4]);
        i += 1;
    }
    name
}

/// The layers under attack, all on one frozen clock so that a fresh key's values depend only
/// on the request's cost:
/// * `/one`: one policy with a heavily escaped 64-character name (a value under 128 bytes,
///   built on the stack);
/// * `/three`: three policies with 64-character names (a value over 128 bytes, built on the
///   heap).
struct HeldApp {
    app: Router,
    one: String,
    three: [String; 3],
}

fn held_app() -> HeldApp {
    let clock = ManualClock::new();
    let one = escaped_name("one");
    let three = [
        plain_name("three-a"),
        escaped_name("three-b"),
        plain_name("three-c"),
    ];
    let key = || HeaderKey::new("x-k").unwrap();
    let cost = || header_cost("x-cost".to_owned());
    let single = Policy::new(
        one.as_str(),
        key(),
        keyed(Quota::per_minute(60).unwrap(), &clock),
    )
    .unwrap()
    .cost_by(cost());
    let chain = Policy::new(
        three[0].as_str(),
        key(),
        keyed(Quota::per_minute(60).unwrap(), &clock),
    )
    .unwrap()
    .cost_by(cost())
    .and(
        Policy::new(
            three[1].as_str(),
            key(),
            keyed(Quota::per_hour(3600).unwrap(), &clock),
        )
        .unwrap()
        .cost_by(cost()),
    )
    .and(
        Policy::new(
            three[2].as_str(),
            key(),
            keyed(Quota::per_second(100).unwrap(), &clock),
        )
        .unwrap()
        .cost_by(cost()),
    );
    let app = Router::new()
        .route(
            "/one",
            get(|| async { "one" }).route_layer(RateLimitLayer::new(single)),
        )
        .route(
            "/three",
            get(|| async { "three" }).route_layer(RateLimitLayer::new(chain)),
        );
    HeldApp { app, one, three }
}

impl HeldApp {
    /// Request `i`: a key of its own, a cost of `1 + i % 59`, on `/one` or `/three`.
    fn request(i: usize) -> Request<Body> {
        let path = if i % 2 == 0 { "/one" } else { "/three" };
        Request::get(path)
            .header("x-k", format!("held-{i}"))
            .header("x-cost", (1 + i % 59).to_string())
            .body(Body::empty())
            .unwrap()
    }

    /// The exact `(RateLimit-Policy, RateLimit)` of request `i` (a fresh key, on a frozen clock).
    fn expected(&self, i: usize) -> (String, String) {
        let c = (1 + i % 59) as u64;
        if i % 2 == 0 {
            let n = sf(&self.one);
            (
                format!("{n};q=60;w=60"),
                format!("{n};r={};t={}", 60 - c, c.max(60 - c)),
            )
        } else {
            let [a, b, d] = self.three.each_ref().map(|n| sf(n));
            (
                format!("{a};q=60;w=60, {b};q=3600;w=3600, {d};q=100;w=1"),
                format!(
                    "{a};r={};t={}, {b};r={};t={}, {d};r={};t=1",
                    60 - c,
                    c.max(60 - c),
                    3600 - c,
                    3600 - c,
                    100 - c
                ),
            )
        }
    }

    fn check(&self, i: usize, headers: &HeaderMap) {
        let (policy, ratelimit) = self.expected(i);
        assert_eq!(
            header_text(headers, "ratelimit-policy").as_deref(),
            Some(policy.as_str()),
            "request {i}"
        );
        assert_eq!(
            header_text(headers, "ratelimit").as_deref(),
            Some(ratelimit.as_str()),
            "request {i}"
        );
        // And it is a valid Structured Field list.
        for value in headers.get_all("ratelimit") {
            sfv::Parser::new(value.as_bytes())
                .parse::<sfv::List>()
                .unwrap_or_else(|e| panic!("request {i}: {value:?}: {e}"));
        }
    }
}

/// Thousands of responses in flight at once on four worker threads, held alive while thousands
/// of later requests are served, then moved to other threads and dropped there in scattered
/// order: each keeps exactly its own `RateLimit-Policy` and `RateLimit` text, the exact remaining
/// of its own key and cost, for values built on the stack (under 128 bytes) and on the heap
/// (over 128 bytes) alike.
#[test]
fn held_responses_keep_their_own_ratelimit_text_across_threads() {
    let held_app = Arc::new(held_app());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    const HELD: usize = 3_000;
    let held: Vec<(usize, Response<Body>)> = runtime.block_on(async {
        let tasks: Vec<_> = (0..HELD)
            .map(|i| {
                let app = held_app.app.clone();
                tokio::spawn(async move {
                    let response = app.oneshot(HeldApp::request(i)).await.unwrap();
                    tokio::task::yield_now().await;
                    (i, response)
                })
            })
            .collect();
        let mut held = Vec::with_capacity(HELD);
        for task in tasks {
            held.push(task.await.unwrap());
        }
        // Thousands of later requests, on every worker, their responses dropped at once.
        let churn: Vec<_> = (0..8_000)
            .map(|j| {
                let app = held_app.app.clone();
                tokio::spawn(async move {
                    let response = app.oneshot(HeldApp::request(HELD + j)).await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                })
            })
            .collect();
        for task in churn {
            task.await.unwrap();
        }
        held
    });
    for (i, response) in &held {
        assert_eq!(response.status(), StatusCode::OK, "request {i}");
        held_app.check(*i, response.headers());
    }
    // The main thread keeps clones of some values while the responses
    // go to four threads that drop them in scattered order.
    let kept: Vec<(usize, HeaderMap)> = held
        .iter()
        .filter(|(i, _)| i % 7 == 3)
        .map(|(i, r)| (*i, r.headers().clone()))
        .collect();
    let mut groups: Vec<Vec<(usize, Response<Body>)>> = (0..4).map(|_| Vec::new()).collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for entry in held {
        groups[rng.below(4) as usize].push(entry);
    }
    let threads: Vec<_> = groups
        .into_iter()
        .enumerate()
        .map(|(t, mut group)| {
            let held_app = Arc::clone(&held_app);
            std::thread::spawn(move || {
                let mut rng = Rng(t as u64 + 11);
                while !group.is_empty() {
                    let at = rng.below(group.len() as u64) as usize;
                    let (i, response) = group.swap_remove(at);
                    held_app.check(i, response.headers());
                    drop(response);
                    // Every so often, everything still held is checked again.
                    if group.len() % 97 == 0 {
                        for (i, response) in &group {
                            held_app.check(*i, response.headers());
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    drop(runtime);
    for (i, headers) in &kept {
        held_app.check(*i, headers);
    }
}

thread_local! {
    /// Serves requests from its destructor, after or before the layer's own thread-locals
    /// are gone.
    static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
    /// Registered after `LATE`: destroyed before it (thread-locals go in reverse order), as any
    /// thread-local first used after `LATE` was set would be.
    static PROBE: RefCell<Option<Box<u8>>> = const { RefCell::new(None) };
}

/// Whether `PROBE` was gone, and the responses; or the panic's message.
type LateResult = Result<(bool, Vec<(usize, Response<Body>)>), String>;

/// Requests decided by a thread-local's destructor, results sent back on `done`.
struct Late {
    held: Arc<HeldApp>,
    first: usize,
    done: mpsc::Sender<LateResult>,
}

impl Drop for Late {
    fn drop(&mut self) {
        let probe_gone = PROBE.try_with(|_| ()).is_err();
        let served = catch_unwind(AssertUnwindSafe(|| {
            (self.first..self.first + 40)
                .map(|i| {
                    let response =
                        block_on(self.held.app.clone().oneshot(HeldApp::request(i))).unwrap();
                    (i, response)
                })
                .collect::<Vec<_>>()
        }))
        .map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        });
        let _ = self.done.send(served.map(|s| (probe_gone, s)));
    }
}

/// A thread that serves requests after its thread-locals were destroyed (from a thread-local's
/// destructor that runs after the thread's other thread-locals are gone, or before), and threads
/// that exit while their responses live on: nothing panics, and every response carries its own exact
/// values, read after the thread that built them is gone.
#[test]
fn requests_served_in_thread_local_destructors_and_by_exited_threads() {
    let held = Arc::new(held_app());
    for chunk_first in [true, false] {
        let (done, results) = mpsc::channel();
        let first = if chunk_first { 0 } else { 1_000 };
        let before: Vec<(usize, Response<Body>)> = {
            let held = Arc::clone(&held);
            std::thread::spawn(move || {
                let serve = |range: std::ops::Range<usize>| -> Vec<(usize, Response<Body>)> {
                    range
                        .map(|i| {
                            (
                                i,
                                block_on(held.app.clone().oneshot(HeldApp::request(i))).unwrap(),
                            )
                        })
                        .collect()
                };
                let mut served = Vec::new();
                if chunk_first {
                    // Serving first: whatever the layer keeps per thread is set up before `LATE`,
                    // so destroyed after it, and still there while `LATE` serves.
                    served.extend(serve(first + 100..first + 110));
                }
                LATE.with(|late| {
                    *late.borrow_mut() = Some(Late {
                        held: Arc::clone(&held),
                        first,
                        done,
                    })
                });
                PROBE.with(|probe| *probe.borrow_mut() = Some(Box::new(1)));
                // Otherwise set up now: destroyed before `LATE` serves.
                served.extend(serve(first + 200..first + 210));
                served
            })
            .join()
            .expect("the thread exits cleanly")
        };
        let (probe_gone, late) = results.recv().unwrap().unwrap_or_else(|panic| {
            panic!("a request in a thread-local destructor panicked: {panic}")
        });
        assert!(probe_gone, "thread-locals set later are destroyed first");
        assert_eq!(late.len(), 40);
        for (i, response) in before.iter().chain(&late) {
            assert_eq!(response.status(), StatusCode::OK, "request {i}");
            held.check(*i, response.headers());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. The ledger: 1, 2, 4, 5 and 8 policies, against a twin model
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shadowing {
    Off,
    Silent,
    Advertised,
}

/// One policy of a layer under test.
#[derive(Clone, Debug)]
struct Spec {
    quota: Quota,
    /// The `q` its `RateLimit-Policy` advertises.
    q: u64,
    shadow: Shadowing,
    count_if: bool,
    /// Decided through a limiter that needs "I/O" (the response future's deferred way).
    slow: bool,
}

fn random_spec(rng: &mut Rng, plain: bool) -> Spec {
    let (quota, q) = match rng.below(3) {
        0 => {
            let permits = 2 + rng.below(4) as u32;
            (Quota::per_minute(permits).unwrap(), u64::from(permits))
        }
        // Waits: a burst of two, then reservations up to two seconds ahead.
        1 => (
            Quota::per_second(1)
                .unwrap()
                .with_burst(2)
                .unwrap()
                .with_max_wait(Duration::from_secs(2))
                .unwrap(),
            1,
        ),
        _ => (Quota::per_minute(3).unwrap().with_burst(5).unwrap(), 3),
    };
    let shadow = match rng.below(5) {
        0 => Shadowing::Silent,
        1 => Shadowing::Advertised,
        _ => Shadowing::Off,
    };
    Spec {
        quota,
        q,
        shadow,
        count_if: !plain && rng.below(4) == 0,
        slow: !plain && rng.below(4) == 0,
    }
}

/// What the twin model says one policy made of a request.
enum Modeled {
    Skipped,
    Admitted {
        decision: Decision,
        key: HeaderValue,
        cost: u32,
    },
    /// Refused, with what the policy has left (as its `r`).
    Refused(u64),
    Unadmittable,
    /// Admitted, then given back (vetoed, or not counted): took part, decides nothing.
    GivenBack,
}

/// A limiter's state for `key`, read without changing it: a one-permit reservation, given back.
fn peek(limiter: &Keyed, key: &str) -> (bool, u64, Duration, Duration, Duration) {
    let key = HeaderValue::from_str(key).unwrap();
    let d = limiter.reserve_now(&key, 1).unwrap().unwrap();
    let seen = (d.allowed, d.remaining, d.wait, d.retry_after, d.reset_after);
    if d.allowed {
        limiter.refund(&key, 1, d);
    }
    seen
}

/// `"name";r=<r>;t=<t>, ...` as `(name, r)` pairs; `"name";q=..;w=.., ...` as names.
fn items(value: &str) -> Vec<(String, u64)> {
    value
        .split(", ")
        .map(|item| {
            let (name, params) = item[1..].split_once('"').unwrap();
            let r = params
                .split(';')
                .find_map(|p| p.strip_prefix("r="))
                .map_or(u64::MAX, |r| r.parse().unwrap());
            (name.to_owned(), r)
        })
        .collect()
}

/// Layers of 1, 2, 4, 5 and 8 policies (inside and past the ledger's four inline slots), each
/// policy with a random quota (some that make requests wait), shadow mode (silent or advertised), `count_if`, a limiter that decides
/// later or at once; requests with random costs (0 skips, 9 can never be admitted), missing
/// keys (fail open or closed), exempt paths, and a clock that moves. After every request, every
/// policy's limiter state equals a twin's that saw only what the model says was spent: a
/// request refused by any policy spends nothing anywhere, the 429 names exactly the violated
/// policies, and the headers list exactly the policies that took part, with exact remainings.
#[test]
fn every_layer_shape_decides_all_or_nothing_as_the_model_does() {
    for n in [1usize, 2, 4, 5, 8] {
        for seed in 0..6u64 {
            let mut rng = Rng(0x5eed_0000 + 977 * n as u64 + seed);
            let mode = if seed % 2 == 0 {
                FailMode::Closed
            } else {
                FailMode::Open
            };
            let headers_on = seed % 3 != 2;
            // With one policy, half the seeds have neither `count_if` nor a limiter that decides
            // later.
            let specs: Vec<Spec> = (0..n)
                .map(|_| random_spec(&mut rng, n == 1 && seed < 3))
                .collect();
            let clock = ManualClock::new();
            clock.set(Duration::from_secs(1));
            let reals: Vec<Keyed> = specs.iter().map(|s| keyed(s.quota, &clock)).collect();
            let twins: Vec<Keyed> = specs.iter().map(|s| keyed(s.quota, &clock)).collect();
            let policies: Vec<Policy<HeaderKey, BoxLimiter<HeaderValue>>> = specs
                .iter()
                .zip(&reals)
                .enumerate()
                .map(|(i, (spec, real))| {
                    let limiter = if spec.slow {
                        BoxLimiter::new(Slow::new(real.clone(), 1, false))
                    } else {
                        BoxLimiter::new(real.clone())
                    };
                    let key = HeaderKey::new(format!("x-k{i}")).unwrap();
                    let mut policy = Policy::new(format!("p{i}"), key, limiter)
                        .unwrap()
                        .cost_by(header_cost(format!("x-c{i}")));
                    if spec.count_if {
                        policy = policy.count_if(|parts| parts.status.is_server_error());
                    }
                    match spec.shadow {
                        Shadowing::Off => policy,
                        Shadowing::Silent => policy.shadow(),
                        Shadowing::Advertised => policy.shadow_advertised(),
                    }
                })
                .collect();
            let layer = RateLimitLayer::new(policies)
                .key_error_mode(mode)
                .exempt(|head: &RequestHead<'_>| head.uri.path() == "/health");
            let layer = if headers_on {
                layer
            } else {
                layer.without_admitted_headers()
            };
            let app = Router::new()
                .route("/r", get(answer))
                .route("/health", get(answer))
                .layer(layer);
            let context =
                format!("{n} policies, seed {seed}, {mode:?}, headers {headers_on}, {specs:?}");
            paused_runtime().block_on(run_model(
                &mut rng, &app, &specs, &reals, &twins, &clock, mode, headers_on, &context,
            ));
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_model(
    rng: &mut Rng,
    app: &Router,
    specs: &[Spec],
    reals: &[Keyed],
    twins: &[Keyed],
    clock: &ManualClock,
    mode: FailMode,
    headers_on: bool,
    context: &str,
) {
    let n = specs.len();
    let (mut refusals, mut admissions) = (0, 0);
    for step in 0..250 {
        if rng.below(12) == 0 {
            clock.advance(Duration::from_millis(rng.below(20_000)));
        }
        let exempt = rng.below(20) == 0;
        let answer = if rng.below(3) == 0 { 500u16 } else { 200 };
        let mut request = Request::get(if exempt { "/health" } else { "/r" })
            .header("x-answer", answer.to_string());
        // Per policy: its cost and its key (`None`: the header is missing).
        let mut asks = Vec::new();
        for i in 0..n {
            let cost: u32 = match rng.below(16) {
                0 | 1 => 0,
                2 | 3 => 2,
                4 => 9,
                _ => 1,
            };
            let key = (rng.below(25) != 0).then(|| ["a", "b"][rng.below(2) as usize]);
            request = request.header(format!("x-c{i}"), cost.to_string());
            if let Some(key) = key {
                request = request.header(format!("x-k{i}"), key);
            }
            asks.push((cost, key));
        }
        let request = request.body(Body::empty()).unwrap();
        let ctx =
            format!("{context}, step {step}, asks {asks:?}, answer {answer}, exempt {exempt}");

        // The model.
        let mut modeled: Vec<Modeled> = Vec::new();
        let mut key_error = false;
        if !exempt {
            for (i, &(cost, key)) in asks.iter().enumerate() {
                if cost == 0 {
                    modeled.push(Modeled::Skipped);
                    continue;
                }
                let Some(key) = key else {
                    if mode == FailMode::Closed {
                        key_error = true;
                        break;
                    }
                    modeled.push(Modeled::Skipped);
                    continue;
                };
                let key = HeaderValue::from_static(key);
                modeled.push(match twins[i].reserve_now(&key, cost).unwrap() {
                    Ok(decision) if decision.allowed => Modeled::Admitted {
                        decision,
                        key,
                        cost,
                    },
                    Ok(decision) => Modeled::Refused(decision.remaining.min(specs[i].q)),
                    Err(error) => {
                        assert!(error
                            .downcast_ref::<tower_bulwark::limiter::InsufficientCapacity>()
                            .is_some());
                        Modeled::Unadmittable
                    }
                });
            }
        }
        let enforced = |i: usize| specs[i].shadow == Shadowing::Off;
        let violated: Vec<usize> = (0..modeled.len())
            .filter(|&i| {
                enforced(i) && matches!(modeled[i], Modeled::Refused(_) | Modeled::Unadmittable)
            })
            .collect();
        let refused = !key_error && !violated.is_empty();
        // What each admission reports, once settled; and the wait.
        let mut reported: Vec<Option<u64>> = vec![None; n];
        let mut wait = Duration::ZERO;
        if key_error || refused {
            for i in (0..modeled.len()).rev() {
                if let Modeled::Admitted { .. } = modeled[i] {
                    let Modeled::Admitted {
                        decision,
                        key,
                        cost,
                    } = std::mem::replace(&mut modeled[i], Modeled::GivenBack)
                    else {
                        unreachable!()
                    };
                    twins[i].refund(&key, cost, decision);
                }
            }
        } else {
            for i in (0..modeled.len()).rev() {
                let (remaining, limit, cost) = match &modeled[i] {
                    Modeled::Admitted { decision, cost, .. } => {
                        if enforced(i) {
                            wait = wait.max(decision.wait);
                        }
                        (decision.remaining, decision.limit, *cost)
                    }
                    _ => continue,
                };
                let mut remaining = remaining;
                if specs[i].count_if && answer != 500 {
                    remaining = (remaining + u64::from(cost)).min(limit);
                    let Modeled::Admitted {
                        decision,
                        key,
                        cost,
                    } = std::mem::replace(&mut modeled[i], Modeled::GivenBack)
                    else {
                        unreachable!()
                    };
                    twins[i].refund(&key, cost, decision);
                }
                reported[i] = Some(remaining.min(specs[i].q));
            }
        }

        // The layer.
        let started = tokio::time::Instant::now();
        let response = app.clone().oneshot(request).await.unwrap();
        let took = started.elapsed();
        let headers = response.headers().clone();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();

        let advertised = |i: usize| specs[i].shadow != Shadowing::Silent;
        let took_part = |i: usize| i < modeled.len() && !matches!(modeled[i], Modeled::Skipped);
        let policy_names: Vec<String> = (0..n)
            .filter(|&i| advertised(i) && took_part(i))
            .map(|i| format!("p{i}"))
            .collect();
        let got_policy = header_text(&headers, "ratelimit-policy").map(|v| {
            items(&v)
                .into_iter()
                .map(|(name, _)| name)
                .collect::<Vec<_>>()
        });
        let got_ratelimit = header_text(&headers, "ratelimit").map(|v| items(&v));
        if exempt {
            assert_eq!(status.as_u16(), answer, "{ctx}");
            assert_eq!(got_policy, None, "{ctx}");
            assert_eq!(got_ratelimit, None, "{ctx}");
        } else if key_error {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{ctx}");
            assert_eq!(got_ratelimit, None, "{ctx}");
        } else if refused {
            refusals += 1;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{ctx}");
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let names: Vec<String> = violated.iter().map(|i| format!("p{i}")).collect();
            assert_eq!(json["violated-policies"], serde_json::json!(names), "{ctx}");
            // No `Retry-After` only when a violated policy can never admit the request.
            let never = violated
                .iter()
                .any(|&i| matches!(modeled[i], Modeled::Unadmittable));
            assert_eq!(headers.contains_key("retry-after"), !never, "{ctx}");
            let listed: Vec<(String, u64)> = violated
                .iter()
                .filter_map(|&i| match modeled[i] {
                    // What the refusing policy has left, fewer than the request's cost.
                    Modeled::Refused(left) => Some((format!("p{i}"), left)),
                    _ => None,
                })
                .collect();
            assert_eq!(got_ratelimit.unwrap_or_default(), listed, "{ctx}");
            assert_eq!(
                got_policy.unwrap_or_default(),
                policy_names,
                "RateLimit-Policy of a refusal; {ctx}"
            );
        } else {
            admissions += 1;
            assert_eq!(status.as_u16(), answer, "{ctx}");
            assert_eq!(took, wait, "the request waits for its last permit; {ctx}");
            let listed: Vec<(String, u64)> = (0..modeled.len())
                .filter(|&i| advertised(i))
                .filter_map(|i| match (&modeled[i], reported[i]) {
                    (_, Some(r)) => Some((format!("p{i}"), r)),
                    (Modeled::Refused(left), None) => Some((format!("p{i}"), *left)),
                    _ => None,
                })
                .collect();
            if !headers_on || listed.is_empty() {
                assert_eq!(got_ratelimit, None, "{ctx}");
                assert_eq!(got_policy, None, "{ctx}");
            } else {
                assert_eq!(got_ratelimit, Some(listed), "{ctx}");
                assert_eq!(got_policy, Some(policy_names), "{ctx}");
            }
        }
        // Every limiter is where its twin is.
        for i in 0..n {
            for key in ["a", "b"] {
                assert_eq!(
                    peek(&reals[i], key),
                    peek(&twins[i], key),
                    "policy p{i}, key {key}; {ctx}"
                );
            }
        }
    }
    // The run exercised both ways (a layer of shadow policies alone never refuses).
    let any_enforced = specs.iter().any(|s| s.shadow == Shadowing::Off);
    assert!(
        admissions > 10 && (refusals > 10 || !any_enforced && refusals == 0),
        "{context}: {refusals} refusals, {admissions} admissions"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. The response future, driven by hand through every state
// ---------------------------------------------------------------------------------------------

/// An inner service whose futures are `std::future::Ready` (polled again after completion they
/// panic with std's own message), answering the status of `x-answer`, counting its calls.
#[derive(Clone, Default)]
struct ReadyInner {
    calls: Arc<AtomicUsize>,
}

impl Service<Request<Body>> for ReadyInner {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Response<Body>, std::convert::Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let status = request
            .headers()
            .get("x-answer")
            .map_or(200, |v| v.to_str().unwrap().parse().unwrap());
        std::future::ready(Ok(Response::builder()
            .status(status)
            .body(Body::empty())
            .unwrap()))
    }
}

const READY_AGAIN: &str = "`Ready` polled after completion";
const DOCUMENTED: &str = "ResponseFuture polled after completion";

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "<not a string>".into())
}

/// Polls a completed future once more: it must panic with exactly `expected`, and its Debug
/// must still work afterwards.
fn assert_poll_again_panics<F: Future + std::fmt::Debug>(mut future: Pin<&mut F>, expected: &str) {
    let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut()).is_ready()));
    match outcome {
        Ok(ready) => panic!("polled after completion, it did not panic (ready: {ready})"),
        Err(panic) => assert_eq!(panic_message(panic), expected),
    }
    let debug = format!("{future:?}");
    assert!(debug.starts_with("ResponseFuture"), "{debug}");
}

fn two_header_request(answer: u16) -> Request<Body> {
    Request::get("/r")
        .header("x-k0", "a")
        .header("x-k1", "a")
        .header("x-answer", answer.to_string())
        .body(Body::empty())
        .unwrap()
}

/// A limiter that decides later, then a policy that counts only server errors: the future goes
/// reserving -> waiting -> calling, never calls the inner service before the permit falls due,
/// then adds headers that describe the state after the `count_if` settled (the permit back for a
/// 200, spent for a 500), and spends exactly that. Without a wait, reserving -> calling with the
/// headers. Polled again after completion, it panics with the inner future's own message, and
/// its Debug works in every state.
#[tokio::test(start_paused = true)]
async fn deferred_reserve_wait_call_adds_headers_and_settles_after_the_wait() {
    for (answer, prespent) in [(200u16, true), (500, true), (200, false), (500, false)] {
        let clock = ManualClock::new();
        let slow_quota = Quota::per_second(1)
            .unwrap()
            .with_max_wait(Duration::from_secs(2))
            .unwrap();
        let slow = keyed(slow_quota, &clock);
        let fast = keyed(Quota::per_minute(5).unwrap(), &clock);
        let a = HeaderValue::from_static("a");
        if prespent {
            assert!(slow.check(&a).allowed);
        }
        let policies = Policy::new(
            "slow",
            HeaderKey::new("x-k0").unwrap(),
            Slow::new(slow.clone(), 2, false),
        )
        .unwrap()
        .and(
            Policy::new("fast", HeaderKey::new("x-k1").unwrap(), fast.clone())
                .unwrap()
                .count_if(|parts| parts.status.is_server_error()),
        );
        let inner = ReadyInner::default();
        let mut service = RateLimitLayer::new(policies).layer(inner.clone());
        let ctx = format!("answer {answer}, prespent {prespent}");
        let mut future = Box::pin(service.call(two_header_request(answer)));
        let debug = format!("{future:?}");
        assert!(
            debug.contains("\"reserving\"") && debug.contains("permits_held: 0"),
            "{ctx}: {debug}"
        );
        assert!(poll_once(future.as_mut()).is_pending(), "{ctx}");
        assert!(format!("{future:?}").contains("\"reserving\""), "{ctx}");
        let response = if prespent {
            assert!(poll_once(future.as_mut()).is_pending(), "{ctx}");
            let debug = format!("{future:?}");
            assert!(
                debug.contains("\"waiting\"") && debug.contains("permits_held: 2"),
                "{ctx}: {debug}"
            );
            tokio::time::advance(Duration::from_millis(999)).await;
            assert!(poll_once(future.as_mut()).is_pending(), "{ctx}");
            assert_eq!(
                inner.calls.load(Ordering::SeqCst),
                0,
                "{ctx}: called before the wait ended"
            );
            tokio::time::advance(Duration::from_millis(1)).await;
            match poll_once(future.as_mut()) {
                Poll::Ready(response) => response.unwrap(),
                Poll::Pending => panic!("{ctx}: not ready when the permit fell due"),
            }
        } else {
            match poll_once(future.as_mut()) {
                Poll::Ready(response) => response.unwrap(),
                Poll::Pending => panic!("{ctx}: not ready once both policies admitted"),
            }
        };
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1, "{ctx}");
        assert_eq!(response.status().as_u16(), answer, "{ctx}");
        let fast_left = if answer == 500 { 4 } else { 5 };
        // The slow key's one permit is spent either way (and its headers say so).
        let slow_left = 0;
        assert_eq!(
            header_text(response.headers(), "ratelimit-policy").as_deref(),
            Some("\"slow\";q=1;w=1, \"fast\";q=5;w=60"),
            "{ctx}"
        );
        let ratelimit = header_text(response.headers(), "ratelimit").unwrap();
        assert_eq!(
            items(&ratelimit),
            vec![
                ("slow".to_owned(), slow_left),
                ("fast".to_owned(), fast_left)
            ],
            "{ctx}: {ratelimit}"
        );
        let debug = format!("{future:?}");
        assert!(
            debug.contains("\"calling\"") && debug.contains("settles_after_response: false"),
            "{ctx}: {debug}"
        );
        assert_poll_again_panics(future.as_mut(), READY_AGAIN);
        drop(future);
        // Exactly what the headers said is left.
        assert_eq!(peek(&fast, "a").1, fast_left - 1, "{ctx}");
        let next = slow.reserve_now(&a, 1).unwrap().unwrap();
        assert_eq!(
            next.wait,
            Duration::from_secs(if prespent { 2 } else { 1 }),
            "{ctx}"
        );
    }
}

/// Every way a future completes, polled once more: the layer's own answers (a refusal decided
/// in `call`, one decided after a deferred reservation, a key error) panic with the documented
/// message; the inner service's answers (untouched, with headers, settled) pass the inner
/// future's own panic through. Debug works before, after, and after the panic.
#[tokio::test(start_paused = true)]
async fn poll_after_completion_panics_with_the_documented_message_only() {
    let clock = ManualClock::new();
    let key0 = || HeaderKey::new("x-k0").unwrap();
    let a = HeaderValue::from_static("a");
    // (layer shape, expected status, expected message)
    for shape in 0..7 {
        let limiter = keyed(Quota::per_hour(1).unwrap(), &clock);
        let inner = ReadyInner::default();
        let one = || Policy::new("one", key0(), limiter.clone()).unwrap();
        let slow = || Policy::new("slow", key0(), Slow::new(limiter.clone(), 1, false)).unwrap();
        let request = if shape == 4 {
            Request::get("/r").body(Body::empty()).unwrap()
        } else {
            two_header_request(200)
        };
        // Shapes 1, 3 and 5 find the key spent: refusals.
        if matches!(shape, 1 | 3 | 5) {
            assert!(limiter.check(&a).allowed);
        }
        type Boxed =
            Pin<Box<dyn FutureDebugOut<Output = Result<Response<Body>, std::convert::Infallible>>>>;
        let mut future: Boxed = match shape {
            // Untouched: one policy without headers.
            0 => Box::pin(
                RateLimitLayer::new(one())
                    .without_admitted_headers()
                    .layer(inner.clone())
                    .call(request),
            ),
            // A refusal decided in `call`.
            1 => Box::pin(
                RateLimitLayer::new(one())
                    .layer(inner.clone())
                    .call(request),
            ),
            // With headers.
            2 => Box::pin(
                RateLimitLayer::new(one())
                    .layer(inner.clone())
                    .call(request),
            ),
            // A refusal after a deferred reservation.
            3 => Box::pin(
                RateLimitLayer::new(slow())
                    .layer(inner.clone())
                    .call(request),
            ),
            // A key error.
            4 => Box::pin(
                RateLimitLayer::new(one())
                    .layer(inner.clone())
                    .call(request),
            ),
            // A refusal by the second of two policies.
            5 => Box::pin(
                RateLimitLayer::new(
                    Policy::new("free", key0(), keyed(Quota::per_hour(100).unwrap(), &clock))
                        .unwrap()
                        .and(one()),
                )
                .layer(inner.clone())
                .call(request),
            ),
            // Settled by `count_if`.
            _ => Box::pin(
                RateLimitLayer::new(one().count_if(|p| p.status.is_server_error()))
                    .layer(inner.clone())
                    .call(request),
            ),
        };
        let (status, message) = match shape {
            0 | 2 | 6 => (StatusCode::OK, READY_AGAIN),
            4 => (StatusCode::BAD_REQUEST, DOCUMENTED),
            _ => (StatusCode::TOO_MANY_REQUESTS, DOCUMENTED),
        };
        let _ = format!("{future:?}");
        let response = block_on(future.as_mut()).unwrap();
        assert_eq!(response.status(), status, "shape {shape}");
        let debug = format!("{future:?}");
        let state = if status == StatusCode::OK {
            "\"calling\""
        } else {
            "\"answering\""
        };
        assert!(debug.contains(state), "shape {shape}: {debug}");
        let outcome = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut()).is_ready()));
        match outcome {
            Ok(ready) => panic!("shape {shape}: polled again, no panic (ready: {ready})"),
            Err(panic) => assert_eq!(panic_message(panic), message, "shape {shape}"),
        }
        assert_eq!(format!("{future:?}"), debug, "shape {shape}");
        // And once more: still the same panic, nothing worse.
        let again = catch_unwind(AssertUnwindSafe(|| poll_once(future.as_mut()).is_ready()));
        assert_eq!(panic_message(again.unwrap_err()), message, "shape {shape}");
        drop(future);
        assert_eq!(
            inner.calls.load(Ordering::SeqCst),
            usize::from(status == StatusCode::OK),
            "shape {shape}"
        );
    }
}

/// A future that is `Debug` too, so the different response futures fit one box.
trait FutureDebugOut: Future + std::fmt::Debug {}

impl<F: Future + std::fmt::Debug> FutureDebugOut for F {}
