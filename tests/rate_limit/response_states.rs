//! The HTTP layer's answers in every state, across threads: each response carries exactly its
//! own `RateLimit` text, held and moved across threads, from threads that exit, from
//! thread-local destructors. Every layer shape against a twin model is in
//! `response_states_ledger.rs`, the hand-driven response future in `response_states_future.rs`.
//!
//! Complements `permit_accounting.rs` (exact limits under contention, permit release, keys,
//! clocks).

use crate::common::{block_on, Rng};
use crate::support::{header_cost, keyed};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, Request, Response, StatusCode};
use tower::ServiceExt;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{HeaderKey, Policy, RateLimitLayer};
use tower_bulwark::Quota;

use super::response_states_support::*;

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

// ---------------------------------------------------------------------------------------------
// `RateLimit` values held, moved and dropped across threads
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
    // A policy named `name` of `quota`, keyed by `x-k` and costing what `x-cost` says.
    let policy = |name: &str, quota: Quota| {
        let limiter = keyed(quota, &clock);
        Policy::new(name, HeaderKey::new("x-k").unwrap(), limiter)
            .unwrap()
            .cost_by(header_cost("x-cost".to_owned()))
    };
    let single = policy(&one, Quota::per_minute(60).unwrap());
    let chain = policy(&three[0], Quota::per_minute(60).unwrap())
        .and(policy(&three[1], Quota::per_hour(3600).unwrap()))
        .and(policy(&three[2], Quota::per_second(100).unwrap()));
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
