//! Adversarial tests of policies (`Policy::cost`, `cost_by`, `count_if`, `shadow`,
//! `shadow_advertised`, `Policy::and`, `Vec<Policy>`): every promise of the layer's docs is
//! attacked with real in-memory limiters wrapped in an accounting limiter that records every
//! permit granted and given back, with limiters that decide later, fail, or wait, with futures
//! dropped after every poll, with panicking closures (cost functions, key extractors, refusal
//! hooks), and with a model of the permits each key has left checked after every request of
//! random sequences. Each test holds the promise it names.

use crate::common::{poll_once, YieldOnce};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, Request, Response, StatusCode};
use proptest::prelude::*;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::{BoxLimiter, BoxReserve};
use tower_bulwark::rate_limit::{
    FailMode, KeyError, KeyExtractor, PeerIp, Policy, PolicySet, RateLimit, RateLimitLayer,
};
use tower_bulwark::{
    algorithm::{Algorithm, FixedWindow, Gcra, SlidingLog},
    clock::{ManualClock, TokioClock},
    limiter::Decision,
    BoxError, DirectRateLimiter, KeyedRateLimiter, Limiter, Quota,
};

// ---------------------------------------------------------------------------------------------
// Instruments
// ---------------------------------------------------------------------------------------------

async fn yields(n: u8) {
    for _ in 0..n {
        YieldOnce::default().await;
    }
}

/// Polls `future` with a no-op waker until it is ready (every future here makes progress on
/// each poll, without a runtime).
fn run<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    for _ in 0..10_000 {
        if let Poll::Ready(out) = poll_once(future.as_mut()) {
            return out;
        }
    }
    panic!("the future never resolved");
}

/// How an accounting limiter decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// At once (`reserve_now`), as the in-memory limiters do.
    Now,
    /// `reserve_now` is `None`; the future decides after this many pending polls, like a remote
    /// limiter (the permit is taken when it resolves).
    Later(u8),
    /// Fails at once.
    Fail,
    /// Fails after this many pending polls.
    LaterFail(u8),
}

impl Mode {
    fn delay(self) -> u8 {
        match self {
            Mode::Now | Mode::Fail => 0,
            Mode::Later(n) | Mode::LaterFail(n) => n,
        }
    }

    fn fails(self) -> bool {
        matches!(self, Mode::Fail | Mode::LaterFail(_))
    }
}

/// What an accounting limiter saw.
#[derive(Default)]
struct Books {
    /// Per key: permits granted less permits given back.
    net: Mutex<HashMap<String, i64>>,
    asked: AtomicUsize,
    refunds: AtomicUsize,
    /// Refunds of decisions that were not admissions.
    bad_refunds: AtomicUsize,
}

/// A real limiter (boxed) with books: every admission adds its cost to the key's net, every
/// refund takes it away.
#[derive(Clone)]
struct Acct {
    inner: BoxLimiter<String>,
    mode: Mode,
    books: Arc<Books>,
    /// Moves this clock on by this much just before each decision (time passing while a remote
    /// limiter decides).
    tick: Option<(ManualClock, Duration)>,
}

impl Acct {
    fn new(inner: impl Limiter<String>, mode: Mode) -> Self {
        Self {
            inner: BoxLimiter::new(inner),
            mode,
            books: Arc::default(),
            tick: None,
        }
    }

    fn ticking(mut self, clock: &ManualClock, by: Duration) -> Self {
        self.tick = Some((clock.clone(), by));
        self
    }

    fn decide(&self, key: &String, cost: u32) -> Result<Decision, BoxError> {
        self.books.asked.fetch_add(1, Ordering::SeqCst);
        if let Some((clock, by)) = &self.tick {
            clock.advance(*by);
        }
        if self.mode.fails() {
            return Err("limiter down".into());
        }
        let result = self
            .inner
            .reserve_now(key, cost)
            .expect("in-memory limiters decide at once");
        if let Ok(d) = &result {
            if d.allowed {
                *self
                    .books
                    .net
                    .lock()
                    .unwrap()
                    .entry(key.clone())
                    .or_default() += i64::from(cost);
            }
        }
        result
    }

    fn net(&self, key: &str) -> i64 {
        self.books
            .net
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    fn asked(&self) -> usize {
        self.books.asked.load(Ordering::SeqCst)
    }

    fn refunds(&self) -> usize {
        self.books.refunds.load(Ordering::SeqCst)
    }

    fn bad_refunds(&self) -> usize {
        self.books.bad_refunds.load(Ordering::SeqCst)
    }

    /// The permits `key` can take now, without waiting, read by taking them and giving them
    /// back (exact for the sliding log and, given back newest first, for GCRA).
    fn probe(&self, key: &str) -> u32 {
        let key = key.to_owned();
        let mut taken = Vec::new();
        loop {
            let d = self.inner.reserve_now(&key, 1).unwrap().unwrap();
            if !d.allowed || !d.wait.is_zero() {
                if d.allowed {
                    self.inner.refund(&key, 1, d);
                }
                break;
            }
            taken.push(d);
            assert!(taken.len() < 100_000, "the probe never ends");
        }
        let n = taken.len() as u32;
        for d in taken.into_iter().rev() {
            self.inner.refund(&key, 1, d);
        }
        n
    }
}

impl Acct {
    /// The time until `key` is whole again (to the nanosecond), read by taking one permit and
    /// giving it back at once.
    fn full_in(&self, key: &str) -> Duration {
        let key = key.to_owned();
        let d = self.inner.reserve_now(&key, 1).unwrap().unwrap();
        assert!(d.allowed && d.wait.is_zero(), "full_in needs a free permit");
        let reset_after = d.reset_after;
        self.inner.refund(&key, 1, d);
        reset_after
    }
}

impl Limiter<String> for Acct {
    type Future = BoxReserve;

    fn quota(&self) -> Quota {
        self.inner.quota()
    }

    fn reserve(&self, key: &String, cost: u32) -> BoxReserve {
        let (this, key, delay) = (self.clone(), key.clone(), self.mode.delay());
        Box::pin(async move {
            yields(delay).await;
            this.decide(&key, cost)
        })
    }

    fn reserve_now(&self, key: &String, cost: u32) -> Option<Result<Decision, BoxError>> {
        match self.mode {
            Mode::Now | Mode::Fail => Some(self.decide(key, cost)),
            Mode::Later(_) | Mode::LaterFail(_) => None,
        }
    }

    fn refund(&self, key: &String, cost: u32, decision: Decision) {
        self.books.refunds.fetch_add(1, Ordering::SeqCst);
        if !decision.allowed {
            self.books.bad_refunds.fetch_add(1, Ordering::SeqCst);
        }
        *self
            .books
            .net
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default() -= i64::from(cost);
        self.inner.refund(key, cost, decision);
    }
}

/// A sliding log of `limit` per hour on a manual clock: exact refunds, frozen time.
fn log(limit: u32, clock: &ManualClock, mode: Mode) -> Acct {
    Acct::new(
        KeyedRateLimiter::<String>::builder(Quota::per_hour(limit).unwrap())
            .algorithm::<SlidingLog>()
            .clock(clock.clone())
            .build(),
        mode,
    )
}

/// The key of policy `i`: the `x-key` header (`k` without it). `x-nokey: 1,3` makes policies 1
/// and 3 find no key; `x-panic-key: 2` makes policy 2's extractor panic.
#[derive(Clone, Copy)]
struct K(usize);

fn names_index(headers: &HeaderMap, name: &str, i: usize) -> bool {
    headers.get(name).is_some_and(|v| {
        v.to_str()
            .unwrap()
            .split(',')
            .any(|s| s.trim() == i.to_string())
    })
}

impl KeyExtractor for K {
    type Key = String;

    fn extract(&self, head: &RequestHead<'_>) -> Result<String, KeyError> {
        if names_index(head.headers, "x-panic-key", self.0) {
            panic!("key extractor {} panics", self.0);
        }
        if names_index(head.headers, "x-nokey", self.0) {
            return Err(KeyError::bad_request("no key"));
        }
        Ok(head
            .headers
            .get("x-key")
            .map_or("k", |v| v.to_str().unwrap())
            .to_owned())
    }
}

/// The inner service: counts its calls; answers with the status of `x-status` (200 without it)
/// after `x-yield` pending polls and `x-sleep-ms` of a tokio sleep; fails (an error, not a response) with `x-fail`.
#[derive(Clone, Default)]
struct Inner {
    calls: Arc<AtomicUsize>,
    /// Responses returned (the future resolved to `Ok`).
    returned: Arc<AtomicUsize>,
}

impl Inner {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn returned(&self) -> usize {
        self.returned.load(Ordering::SeqCst)
    }
}

type InnerFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, &'static str>> + Send>>;

impl Service<Request<Body>> for Inner {
    type Response = Response<Body>;
    type Error = &'static str;
    type Future = InnerFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().parse::<u16>().unwrap())
        };
        let status = header("x-status").unwrap_or(200);
        let delay = header("x-yield").unwrap_or(0) as u8;
        let fail = request.headers().contains_key("x-fail");
        let sleep = header("x-sleep-ms").map(|ms| Duration::from_millis(ms.into()));
        let returned = self.returned.clone();
        Box::pin(async move {
            yields(delay).await;
            if let Some(sleep) = sleep {
                tokio::time::sleep(sleep).await;
            }
            if fail {
                return Err("the inner service failed");
            }
            returned.fetch_add(1, Ordering::SeqCst);
            Ok(Response::builder()
                .status(status)
                .body(Body::from("inner"))
                .unwrap())
        })
    }
}

fn req(headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::get("/r");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::empty()).unwrap()
}

fn policy(i: usize, acct: &Acct) -> Policy<K, Acct> {
    Policy::new(format!("p{i}"), K(i), acct.clone()).unwrap()
}

fn svc<P: PolicySet>(layer: RateLimitLayer<P>, inner: &Inner) -> RateLimit<Inner, P> {
    layer.layer(inner.clone())
}

/// Calls the service once and drives the response future to its end.
fn call<P: PolicySet>(
    svc: &RateLimit<Inner, P>,
    request: Request<Body>,
) -> Result<Response<Body>, &'static str> {
    let mut svc = svc.clone();
    run(svc.call(request))
}

fn body_json(response: Response<Body>) -> serde_json::Value {
    let bytes = run(to_bytes(response.into_body(), usize::MAX)).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The names in a `RateLimit` or `RateLimit-Policy` header, parsed as an RFC 9651 list (all
/// field lines joined); empty if there is none.
use crate::common::listener::{sf_entries, sf_names};

fn param(entry: &(String, Vec<(String, i64)>), name: &str) -> i64 {
    entry
        .1
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("{entry:?} has no {name}"))
        .1
}

fn violated(json: &serde_json::Value) -> Vec<String> {
    json["violated-policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

fn retry_after(response: &Response<Body>) -> Option<u64> {
    response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap())
}

// ---------------------------------------------------------------------------------------------
// All-or-nothing, and exactly once, whatever happens
// ---------------------------------------------------------------------------------------------

/// Promise: "permits are released/refunded exactly once whatever happens". A `cost_by` that
/// panics for the second policy, after the first admitted the request, while the layer decides
/// in `call` (in-memory limiters): the first policy's permit must not stay spent by a request
/// that never got anywhere.
#[test]
fn a_cost_by_panic_in_call_gives_back_what_earlier_policies_granted() {
    let clock = ManualClock::new();
    let first = log(5, &clock, Mode::Now);
    let second = log(5, &clock, Mode::Now);
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(policy(0, &first).and(policy(1, &second).cost_by(|parts| {
            assert!(!parts.headers.contains_key("x-boom"), "cost_by panics");
            1
        }))),
        &inner,
    );
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let mut s = service.clone();
        drop(s.call(req(&[("x-boom", "1")])));
    }));
    assert!(panicked.is_err(), "the cost function panicked");
    assert_eq!(inner.calls(), 0);
    assert_eq!(
        first.net("k"),
        0,
        "the first policy keeps the permit of a request that panicked before any decision"
    );
    assert_eq!(first.probe("k"), 5);
}

/// Same promise, with the panic in the second policy's key extractor.
#[test]
fn a_key_extractor_panic_in_call_gives_back_what_earlier_policies_granted() {
    let clock = ManualClock::new();
    let first = log(5, &clock, Mode::Now);
    let second = log(5, &clock, Mode::Now);
    let service = svc(
        RateLimitLayer::new(policy(0, &first).and(policy(1, &second))),
        &Inner::default(),
    );
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let mut s = service.clone();
        drop(s.call(req(&[("x-panic-key", "1")])));
    }));
    assert!(panicked.is_err());
    assert_eq!(first.net("k"), 0, "the first policy's permit leaked");
}

/// Same promise, with the panic in an `on_refusal` hook: the 429 is built before the other
/// policies' permits are given back.
#[test]
fn an_on_refusal_hook_panic_gives_back_what_the_other_policies_granted() {
    let clock = ManualClock::new();
    let admits = log(5, &clock, Mode::Now);
    let refuses = log(1, &clock, Mode::Now);
    let service = svc(
        RateLimitLayer::new(policy(0, &admits).and(policy(1, &refuses).cost(1))).on_refusal(
            |_: &tower_bulwark::rate_limit::Refusal<'_>| -> Response<bytes::Bytes> {
                panic!("the hook panics")
            },
        ),
        &Inner::default(),
    );
    // Use the refusing policy's only permit under another key of the first policy.
    assert_eq!(
        call(&service, req(&[])).unwrap().status(),
        StatusCode::OK,
        "the first request is admitted"
    );
    let before = admits.net("k");
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let mut s = service.clone();
        drop(s.call(req(&[])));
    }));
    assert!(panicked.is_err());
    assert_eq!(
        admits.net("k"),
        before,
        "the refused request's permit of the admitting policy leaked"
    );
}

/// Held: the same panics while the response future decides (a first policy that decides later)
/// give every permit back exactly once, when the future is dropped.
#[test]
fn a_panic_while_the_future_decides_gives_back_once_on_drop() {
    for panic_in in ["cost", "key"] {
        let clock = ManualClock::new();
        let first = log(5, &clock, Mode::Later(2));
        let second = log(5, &clock, Mode::Now);
        let inner = Inner::default();
        let service = svc(
            RateLimitLayer::new(policy(0, &first).and(policy(1, &second).cost_by(|parts| {
                assert!(!parts.headers.contains_key("x-boom"), "cost_by panics");
                1
            }))),
            &inner,
        );
        let header = if panic_in == "cost" {
            ("x-boom", "1")
        } else {
            ("x-panic-key", "1")
        };
        let mut s = service.clone();
        let mut future = Box::pin(s.call(req(&[header])));
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            for _ in 0..10 {
                let _ = poll_once(future.as_mut());
            }
        }));
        assert!(panicked.is_err(), "{panic_in}: the closure panicked");
        assert_eq!(first.net("k"), 1, "{panic_in}: granted, held by the future");
        drop(future);
        assert_eq!(first.net("k"), 0, "{panic_in}: given back on drop");
        assert_eq!(first.refunds(), 1, "{panic_in}: exactly once");
        assert_eq!(first.probe("k"), 5);
        assert_eq!(inner.calls(), 0);
    }
}

/// Promise: "count_if refunds exactly when the response does not count". A response that the
/// first count_if policy does not count, while a second policy's predicate panics: the first
/// policy's permit must come back whatever order they are in, and nothing is given back twice.
/// (A predicate that panics is taken to count the response, and the response goes out.)
#[test]
fn a_panicking_count_if_predicate_never_keeps_another_policys_permit() {
    for panicking_first in [false, true] {
        let clock = ManualClock::new();
        let never = log(5, &clock, Mode::Now);
        let boom = log(5, &clock, Mode::Now);
        let never_counts = policy(0, &never).count_if(|_| false);
        let panics = policy(1, &boom).count_if(|_| panic!("the predicate panics"));
        let layer = if panicking_first {
            RateLimitLayer::new(vec![panics, never_counts])
        } else {
            RateLimitLayer::new(vec![never_counts, panics])
        };
        let service = svc(layer, &Inner::default());
        let response = call(&service, req(&[])).unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            (0..=1).contains(&boom.net("k")),
            "panicking first = {panicking_first}: the panicking policy gave back twice or more"
        );
        assert_eq!(never.bad_refunds() + boom.bad_refunds(), 0);
        assert_eq!(
            never.net("k"),
            0,
            "panicking first = {panicking_first}: a response the policy does not count kept its \
             permit"
        );
    }
}

/// Held: a panicking predicate never gives anything back twice, and the policies before it are
/// settled.
#[test]
fn a_panicking_count_if_predicate_gives_nothing_back_twice() {
    let clock = ManualClock::new();
    let never = log(5, &clock, Mode::Now);
    let boom = log(5, &clock, Mode::Now);
    let plain = log(5, &clock, Mode::Now);
    let service = svc(
        RateLimitLayer::new(vec![
            policy(0, &never).count_if(|_| false),
            policy(1, &boom).count_if(|_| panic!("the predicate panics")),
            policy(2, &plain),
        ]),
        &Inner::default(),
    );
    for round in 1..=3 {
        let response = call(&service, req(&[])).unwrap();
        assert_eq!(response.status(), StatusCode::OK, "the response goes out");
        assert_eq!(never.net("k"), 0, "round {round}");
        assert_eq!(
            boom.net("k"),
            round,
            "round {round}: kept, as for a failed call"
        );
        assert_eq!(plain.net("k"), round, "round {round}");
        assert_eq!(never.refunds(), round as usize);
        assert_eq!(boom.refunds() + plain.refunds(), 0);
    }
    assert_eq!(boom.probe("k"), 2);
}

/// Promise: a cost above a policy's burst is a 429 "never admitted" without `Retry-After` that
/// spends nothing, anywhere: `u32::MAX`, exactly the capacity, and one above, with the policy
/// deciding at once or later, among other policies that admit.
#[test]
fn huge_costs_are_never_admitted_and_spend_nothing() {
    for mode in [Mode::Now, Mode::Later(1)] {
        for (cost, admitted) in [
            (u32::MAX, false),
            (4, true),
            (5, false),
            (u32::MAX - 1, false),
        ] {
            let clock = ManualClock::new();
            let before = log(9, &clock, Mode::Now);
            let costly = log(4, &clock, mode);
            let after = log(9, &clock, Mode::Later(1));
            let shadow = log(1, &clock, Mode::Now);
            let inner = Inner::default();
            let service = svc(
                RateLimitLayer::new(
                    policy(0, &before)
                        .and(policy(1, &costly).cost(cost))
                        .and(policy(2, &after))
                        .and(policy(3, &shadow).cost(u32::MAX).shadow_advertised()),
                ),
                &inner,
            );
            let response = call(&service, req(&[])).unwrap();
            let what = format!("{mode:?} cost {cost}");
            if admitted {
                assert_eq!(response.status(), StatusCode::OK, "{what}");
                assert_eq!(costly.net("k"), 4, "{what}");
                assert_eq!(
                    sf_names(response.headers(), "ratelimit"),
                    ["p0", "p1", "p2"],
                    "{what}: an unadmittable shadow is not described as deciding"
                );
                continue;
            }
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
            assert_eq!(retry_after(&response), None, "{what}: no Retry-After");
            assert!(
                sf_names(response.headers(), "ratelimit").is_empty(),
                "{what}: no policy refused with a wait"
            );
            assert_eq!(
                sf_names(response.headers(), "ratelimit-policy"),
                ["p0", "p1", "p2", "p3"],
                "{what}"
            );
            let json = body_json(response);
            assert_eq!(violated(&json), ["p1"], "{what}");
            let detail = json["detail"].as_str().unwrap();
            assert!(detail.contains("never"), "{what}: {detail}");
            assert!(
                detail.contains(&format!("{cost} permits asked")),
                "{detail}"
            );
            assert_eq!(inner.calls(), 0);
            for (name, acct, limit) in [
                ("before", &before, 9),
                ("costly", &costly, 4),
                ("after", &after, 9),
                ("shadow", &shadow, 1),
            ] {
                assert_eq!(acct.net("k"), 0, "{what}: {name} spent");
                assert_eq!(acct.probe("k"), limit, "{what}: {name}");
                assert_eq!(acct.bad_refunds(), 0);
            }
        }
    }
}

/// Promise: a refusal by any policy spends nothing anywhere, and a key error of the second of
/// three policies under `FailMode::Closed` gives back the first's permit and never asks the
/// third; under `Open` the second sits the request out and stays out of `RateLimit`.
#[test]
fn a_key_error_on_the_second_of_three_policies() {
    for shape in ["chain", "vec"] {
        for mode in [FailMode::Closed, FailMode::Open] {
            for first_mode in [Mode::Now, Mode::Later(1)] {
                let clock = ManualClock::new();
                let accts = [
                    log(3, &clock, first_mode),
                    log(3, &clock, Mode::Now),
                    log(3, &clock, Mode::Later(2)),
                ];
                let inner = Inner::default();
                let request = || req(&[("x-nokey", "1")]);
                let what = format!("{shape} {mode:?} {first_mode:?}");
                let response = if shape == "chain" {
                    let layer = RateLimitLayer::new(
                        policy(0, &accts[0])
                            .and(policy(1, &accts[1]))
                            .and(policy(2, &accts[2])),
                    )
                    .key_error_mode(mode);
                    call(&svc(layer, &inner), request()).unwrap()
                } else {
                    let layer = RateLimitLayer::new(
                        accts
                            .iter()
                            .enumerate()
                            .map(|(i, a)| policy(i, a))
                            .collect::<Vec<_>>(),
                    )
                    .key_error_mode(mode);
                    call(&svc(layer, &inner), request()).unwrap()
                };
                match mode {
                    FailMode::Closed => {
                        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{what}");
                        assert!(response.headers().get("ratelimit").is_none(), "{what}");
                        assert_eq!(inner.calls(), 0);
                        assert_eq!(accts[0].net("k"), 0, "{what}: the first kept its permit");
                        assert_eq!(accts[0].refunds(), 1, "{what}");
                        assert_eq!(accts[2].asked(), 0, "{what}: the third was asked");
                    }
                    _ => {
                        assert_eq!(response.status(), StatusCode::OK, "{what}");
                        assert_eq!(
                            sf_names(response.headers(), "ratelimit"),
                            ["p0", "p2"],
                            "{what}"
                        );
                        assert_eq!(accts[0].net("k"), 1, "{what}");
                        assert_eq!(accts[2].net("k"), 1, "{what}");
                    }
                }
                assert_eq!(accts[1].asked(), 0, "{what}: the keyless policy was asked");
            }
        }
    }
}

/// Promise: "a request refused by any policy spends nothing anywhere" and the 503 of a failing
/// enforced policy gives back what the others granted; a failing shadow never answers 503,
/// whichever position the failing policy is in, deciding at once or later.
#[test]
fn a_failing_policy_in_every_position() {
    for position in 0..3 {
        for fail in [Mode::Fail, Mode::LaterFail(1)] {
            for shadow in [false, true] {
                let clock = ManualClock::new();
                let accts: Vec<Acct> = (0..3)
                    .map(|i| {
                        let mode = if i == position {
                            fail
                        } else if i == 1 {
                            Mode::Later(1)
                        } else {
                            Mode::Now
                        };
                        log(3, &clock, mode)
                    })
                    .collect();
                let policies = accts
                    .iter()
                    .enumerate()
                    .map(|(i, a)| {
                        let p = policy(i, a).count_if(|r| r.status == StatusCode::OK);
                        if i == position && shadow {
                            p.shadow_advertised()
                        } else {
                            p
                        }
                    })
                    .collect::<Vec<_>>();
                let inner = Inner::default();
                let service = svc(RateLimitLayer::new(policies), &inner);
                let response = call(&service, req(&[])).unwrap();
                let what = format!("position {position} {fail:?} shadow {shadow}");
                if shadow {
                    assert_eq!(response.status(), StatusCode::OK, "{what}");
                    let expect: Vec<String> = (0..3)
                        .filter(|&i| i != position)
                        .map(|i| format!("p{i}"))
                        .collect();
                    assert_eq!(sf_names(response.headers(), "ratelimit"), expect, "{what}");
                } else {
                    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
                    assert_eq!(inner.calls(), 0, "{what}");
                    for (i, a) in accts.iter().enumerate() {
                        assert_eq!(a.net("k"), 0, "{what}: policy {i} spent");
                        if i > position {
                            assert_eq!(a.asked(), 0, "{what}: policy {i} asked after the 503");
                        }
                    }
                }
                for a in &accts {
                    assert_eq!(a.bad_refunds(), 0);
                }
            }
        }
    }
}

/// Held: a `Vec` of 0, 1 and 10 policies. None: everything passes without headers. One and
/// ten: the refusal by one of them (the 8th) spends nothing under the nine others, names only
/// it, and every header is an RFC 9651 list, with names that need escaping and long enough for
/// the header to outgrow its inline buffer.
#[test]
fn vecs_of_zero_one_and_ten_policies() {
    let clock = ManualClock::new();
    let inner = Inner::default();
    let none: Vec<Policy<K, Acct>> = Vec::new();
    let service = svc(RateLimitLayer::new(none), &inner);
    for _ in 0..5 {
        let response = call(&service, req(&[])).unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("ratelimit").is_none());
        assert!(response.headers().get("ratelimit-policy").is_none());
    }

    let one = log(2, &clock, Mode::Later(1));
    let service = svc(RateLimitLayer::new(vec![policy(0, &one)]), &inner);
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sf_names(refused.headers(), "ratelimit"), ["p0"]);
    assert_eq!(one.net("k"), 2);

    let name = |i: usize| format!("{i}\"quoted\\back{}", "x".repeat(64 - 17));
    let accts: Vec<Acct> = (0..10)
        .map(|i| {
            let mode = if i % 2 == 0 {
                Mode::Now
            } else {
                Mode::Later(1)
            };
            log(if i == 7 { 1 } else { 5 }, &clock, mode)
        })
        .collect();
    let policies: Vec<Policy<K, Acct>> = accts
        .iter()
        .enumerate()
        .map(|(i, a)| Policy::new(name(i), K(i), a.clone()).unwrap())
        .collect();
    let service = svc(RateLimitLayer::new(policies), &inner);
    let admitted = call(&service, req(&[])).unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    let all: Vec<String> = (0..10).map(name).collect();
    assert_eq!(sf_names(admitted.headers(), "ratelimit-policy"), all);
    let entries = sf_entries(admitted.headers(), "ratelimit");
    assert_eq!(entries.iter().map(|e| e.0.clone()).collect::<Vec<_>>(), all);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(param(e, "r"), if i == 7 { 0 } else { 4 }, "{e:?}");
    }
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sf_names(refused.headers(), "ratelimit"), [name(7)]);
    assert_eq!(sf_names(refused.headers(), "ratelimit-policy"), all);
    assert_eq!(violated(&body_json(refused)), [name(7)]);
    for (i, a) in accts.iter().enumerate() {
        assert_eq!(a.net("k"), 1, "policy {i}: only the admitted request spent");
        assert_eq!(a.bad_refunds(), 0);
    }
}

/// Promise: the 429 carries the longest `Retry-After` of the violated policies and its
/// `RateLimit` lists exactly the refusing ones (not the admitting ones, not an advertised
/// shadow that would have refused, not a policy the request cost nothing), each with its own
/// wait; the legacy headers name the policy with the longest wait.
#[test]
fn the_429_names_every_violated_policy_with_the_longest_retry_after() {
    let clock = ManualClock::new();
    let keyed = |quota: Quota| {
        Acct::new(
            KeyedRateLimiter::<String>::builder(quota)
                .algorithm::<SlidingLog>()
                .clock(clock.clone())
                .build(),
            Mode::Later(1),
        )
    };
    let second = keyed(Quota::per_second(1).unwrap());
    let hour = keyed(Quota::per_hour(1).unwrap());
    let minute = keyed(Quota::per_minute(1).unwrap());
    let roomy = keyed(Quota::per_hour(100).unwrap());
    let shadow = keyed(Quota::per_day(1).unwrap());
    let free = keyed(Quota::per_day(1).unwrap());
    let service = svc(
        RateLimitLayer::new(vec![
            policy(0, &second),
            policy(1, &roomy),
            policy(2, &hour),
            policy(3, &shadow).shadow_advertised(),
            policy(4, &minute),
            policy(5, &free).cost_by(|p| u32::from(!p.headers.contains_key("x-free"))),
        ])
        .with_legacy_headers(),
        &Inner::default(),
    );
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    let refused = call(&service, req(&[("x-free", "1")])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some(3600));
    assert_eq!(refused.headers()["x-ratelimit-reset"], "3600");
    assert_eq!(refused.headers()["x-ratelimit-limit"], "1");
    assert_eq!(refused.headers()["x-ratelimit-remaining"], "0");
    let entries = sf_entries(refused.headers(), "ratelimit");
    let summary: Vec<(String, i64, i64)> = entries
        .iter()
        .map(|e| (e.0.clone(), param(e, "r"), param(e, "t")))
        .collect();
    assert_eq!(
        summary,
        [
            ("p0".to_owned(), 0, 1),
            ("p2".to_owned(), 0, 3600),
            ("p4".to_owned(), 0, 60)
        ]
    );
    assert_eq!(violated(&body_json(refused)), ["p0", "p2", "p4"]);
    assert_eq!(roomy.net("k"), 1, "the refused request spent nothing");
    assert_eq!(roomy.probe("k"), 99);
    assert_eq!(shadow.net("k"), 1);
    assert_eq!(free.net("k"), 1);
}

/// Promise: "A cost of zero leaves the policy out of the request's decision and its headers".
/// A policy that a request costs nothing is still listed in that request's `RateLimit-Policy`.
#[test]
fn a_zero_cost_policy_is_left_out_of_the_requests_headers() {
    let clock = ManualClock::new();
    let paid = log(5, &clock, Mode::Now);
    let free = log(5, &clock, Mode::Now);
    let service = svc(
        RateLimitLayer::new(policy(0, &paid).and(policy(1, &free).cost(0))),
        &Inner::default(),
    );
    let response = call(&service, req(&[])).unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(sf_names(response.headers(), "ratelimit"), ["p0"]);
    assert_eq!(free.asked(), 0);
    assert_eq!(
        sf_names(response.headers(), "ratelimit-policy"),
        ["p0"],
        "the free policy is in the headers of a request it was left out of"
    );
}

/// Held: a request that costs every policy nothing is admitted uncounted and without headers.
#[test]
fn a_request_that_costs_nothing_anywhere_is_uncounted_and_headerless() {
    let clock = ManualClock::new();
    let a = log(1, &clock, Mode::Now);
    let b = log(1, &clock, Mode::Later(1));
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(policy(0, &a).cost(0).and(policy(1, &b).cost_by(|_| 0))),
        &inner,
    );
    for _ in 0..3 {
        let response = call(&service, req(&[])).unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("ratelimit").is_none());
        assert!(response.headers().get("ratelimit-policy").is_none());
    }
    assert_eq!(a.asked() + b.asked(), 0);
    assert_eq!(inner.calls(), 3);
}

/// Promise (`Refusal::decisions`): "Admissions listed here have been given back." An
/// `on_refusal` hook that looks at the admitting policy's limiter sees the refused request's
/// permit still taken: the 429 is built before the permits are given back.
#[test]
fn the_refusal_hook_sees_the_other_policies_permits_given_back() {
    let clock = ManualClock::new();
    let admits = log(5, &clock, Mode::Now);
    let refuses = log(1, &clock, Mode::Now);
    let seen = Arc::new(Mutex::new(None));
    let (watch, record) = (admits.clone(), seen.clone());
    let service = svc(
        RateLimitLayer::new(policy(0, &admits).and(policy(1, &refuses))).on_refusal(
            move |refusal: &tower_bulwark::rate_limit::Refusal<'_>| {
                let admitted = refusal
                    .decisions()
                    .filter(|(_, d)| d.is_some_and(|d| d.allowed))
                    .count();
                *record.lock().unwrap() = Some((admitted, watch.net("k"), watch.probe("k")));
                refusal.default_response()
            },
        ),
        &Inner::default(),
    );
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(admits.net("k"), 1, "given back after the hook");
    let (admitted, net, left) = seen.lock().unwrap().unwrap();
    assert_eq!(admitted, 1, "the hook sees the admitting policy's decision");
    assert_eq!(
        (net, left),
        (1, 4),
        "inside the hook, the listed admission has not been given back"
    );
}

/// Not a documented promise, but surprising: with one policy, a `cost_by` (and the key
/// extractor) runs twice for a request whose cost is zero, whose limiter decides later, or
/// whose key is missing. A cost function with side effects or that is not deterministic sees
/// each request twice.
#[test]
fn cost_by_runs_once_per_request() {
    let mut runs = Vec::new();
    for (mode, cost, nokey) in [
        (Mode::Now, 1, false),
        (Mode::Now, 0, false),
        (Mode::Later(1), 1, false),
        (Mode::Now, 1, true),
    ] {
        let clock = ManualClock::new();
        let acct = log(5, &clock, mode);
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let service = svc(
            RateLimitLayer::new(policy(0, &acct).cost_by(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
                cost
            }))
            .key_error_mode(FailMode::Open),
            &Inner::default(),
        );
        let headers: &[(&str, &str)] = if nokey { &[("x-nokey", "0")] } else { &[] };
        assert_eq!(
            call(&service, req(headers)).unwrap().status(),
            StatusCode::OK
        );
        runs.push((
            format!("{mode:?} cost {cost} nokey {nokey}"),
            calls.load(Ordering::SeqCst),
        ));
    }
    assert!(
        runs.iter().all(|(_, n)| *n == 1),
        "cost_by calls for one request: {runs:?}"
    );
}

/// Promise: "A cost above what the limiter can ever hold at once (its burst)" is never
/// admitted: a GCRA quota of 10 per second with a burst of 2 admits a cost of 2 and answers a
/// cost of 3 with a 429 without `Retry-After` that spends nothing.
#[test]
fn a_cost_above_a_gcra_burst_below_its_permits_is_never_admitted() {
    let clock = ManualClock::new();
    let gcra = Acct::new(
        KeyedRateLimiter::<String>::builder(Quota::per_second(10).unwrap().with_burst(2).unwrap())
            .clock(clock.clone())
            .build(),
        Mode::Now,
    );
    let other = log(5, &clock, Mode::Later(1));
    let service = svc(
        RateLimitLayer::new(policy(0, &other).and(policy(1, &gcra).cost_by(|p| {
            p.headers
                .get("x-cost")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        }))),
        &Inner::default(),
    );
    let refused = call(&service, req(&[("x-cost", "3")])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), None);
    assert_eq!(violated(&body_json(refused)), ["p1"]);
    assert_eq!((other.net("k"), gcra.net("k")), (0, 0));
    assert_eq!(gcra.probe("k"), 2);
    let admitted = call(&service, req(&[("x-cost", "2")])).unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(gcra.net("k"), 2);
}

/// Promise (guide, GCRA refunds): "exact while the refunded admission is still the key's
/// latest ... the TAT goes back by the cost": a GCRA admission vetoed by a policy that decides
/// later, while time passes, leaves the key as a twin that never saw the request.
#[test]
fn a_gcra_admission_vetoed_while_time_passes_is_given_back_exactly() {
    let clock = ManualClock::new();
    let quota = Quota::per_second(2).unwrap().with_burst(4).unwrap();
    let gcra = |c: &ManualClock| {
        Acct::new(
            KeyedRateLimiter::<String>::builder(quota)
                .clock(c.clone())
                .build(),
            Mode::Now,
        )
    };
    let vetoed = gcra(&clock);
    let twin = gcra(&clock);
    let veto = log(1, &clock, Mode::Later(2)).ticking(&clock, Duration::from_millis(120));
    let service = svc(
        RateLimitLayer::new(policy(0, &vetoed).and(policy(1, &veto))),
        &Inner::default(),
    );
    let key = "k".to_owned();
    assert!(twin.inner.reserve_now(&key, 1).unwrap().unwrap().allowed);
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    for _ in 0..3 {
        let refused = call(&service, req(&[])).unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            vetoed.probe("k"),
            twin.probe("k"),
            "at {:?}",
            clock.elapsed()
        );
        assert_eq!(
            vetoed.full_in("k"),
            twin.full_in("k"),
            "at {:?}",
            clock.elapsed()
        );
    }
    assert_eq!(vetoed.net("k"), 1);
}

/// Promise (module docs): a refused request "spends nothing (a GCRA policy keeps spent only what
/// the key's state cannot place: the time elapsed since, when other requests were admitted
/// meanwhile, ...)". Two policies of one request on one GCRA limiter and key (1 and 5 permits),
/// vetoed by a third that decides while 30 ms pass, with no other request on the key: the
/// layer gives back the older admission first, while the younger one (of the same request) is
/// the key's latest, so the older one is taken for another request's and loses the elapsed
/// time, and then the younger one, no longer the latest either, loses it again: each refusal
/// leaves the key 30 ms (of a 100 ms permit) short of a twin that never saw it. Given back
/// newest first, both would be exact.
#[test]
fn two_admissions_of_one_request_on_one_gcra_key_are_given_back_exactly() {
    let clock = ManualClock::new();
    let quota = Quota::per_second(10).unwrap();
    let make = || {
        Acct::new(
            KeyedRateLimiter::<String>::builder(quota)
                .clock(clock.clone())
                .build(),
            Mode::Now,
        )
    };
    let shared = make();
    let twin = make();
    let veto = log(1, &clock, Mode::Later(1)).ticking(&clock, Duration::from_millis(30));
    let key = "k".to_owned();
    assert!(veto.inner.reserve_now(&key, 1).unwrap().unwrap().allowed);
    let service = svc(
        RateLimitLayer::new(vec![
            policy(0, &shared),
            policy(1, &shared).cost(5),
            policy(2, &veto),
        ]),
        &Inner::default(),
    );
    for i in 0..3 {
        let refused = call(&service, req(&[])).unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(violated(&body_json(refused)), ["p2"]);
        assert_eq!(shared.net("k"), 0);
        assert_eq!(
            shared.full_in("k"),
            twin.full_in("k"),
            "refusal {i}: the shared key is whole again later than a key that never saw it"
        );
    }
}

/// Promise: count_if "gives others their permit back": two count_if policies of one request on
/// one GCRA key (1 and 5 permits), with time passing between the admissions and the response
/// (a later policy that decides while the clock moves), and no other request on the key: the
/// response that counts for neither leaves the key exactly as a twin that never saw it. Same
/// cause as `two_admissions_of_one_request_on_one_gcra_key_are_given_back_exactly`: the
/// settlement gives back in policy order, the older admission first.
#[test]
fn two_count_if_admissions_on_one_gcra_key_are_given_back_exactly() {
    let clock = ManualClock::new();
    let make = || {
        Acct::new(
            KeyedRateLimiter::<String>::builder(Quota::per_second(10).unwrap())
                .clock(clock.clone())
                .build(),
            Mode::Now,
        )
    };
    let shared = make();
    let twin = make();
    let slow = log(1000, &clock, Mode::Later(1)).ticking(&clock, Duration::from_millis(30));
    let service = svc(
        RateLimitLayer::new(vec![
            policy(0, &shared).count_if(|r| r.status != StatusCode::OK),
            policy(1, &shared)
                .cost(5)
                .count_if(|r| r.status == StatusCode::UNAUTHORIZED),
            policy(2, &slow),
        ]),
        &Inner::default(),
    );
    let key = "k".to_owned();
    assert!(twin.inner.reserve_now(&key, 1).unwrap().unwrap().allowed);
    let r = call(&service, req(&[("x-status", "500")])).unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(shared.net("k"), 1);
    for i in 0..4 {
        let r = call(&service, req(&[])).unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(shared.net("k"), 1);
        assert_eq!(
            shared.full_in("k"),
            twin.full_in("k"),
            "response {i}: the key kept part of a request that never counted"
        );
    }
}

/// Held: an empty `Vec` chained between two policies counts for nothing, and the indices of
/// the policies after it stay right.
#[test]
fn an_empty_vec_in_the_middle_of_a_chain() {
    let clock = ManualClock::new();
    let a = log(2, &clock, Mode::Now);
    let c = log(1, &clock, Mode::Later(1));
    let service = svc(
        RateLimitLayer::new(
            policy(0, &a)
                .and(Vec::<Policy<K, Acct>>::new())
                .and(Policy::new("p2", K(2), c.clone()).unwrap().cost(1)),
        ),
        &Inner::default(),
    );
    let ok = call(&service, req(&[("x-nokey", "1")])).unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(sf_names(ok.headers(), "ratelimit"), ["p0", "p2"]);
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sf_names(refused.headers(), "ratelimit"), ["p2"]);
    assert_eq!((a.net("k"), c.net("k")), (1, 1));
    let keyless = call(&service, req(&[("x-nokey", "2")])).unwrap();
    assert_eq!(keyless.status(), StatusCode::BAD_REQUEST);
    assert_eq!(a.net("k"), 1);

    // Nested to the right: p0 and (p1 and (p2 and p3)); the third refuses, the fourth has no key.
    let accts: Vec<Acct> = [4, 4, 1, 4]
        .iter()
        .map(|&limit| log(limit, &clock, Mode::Later(1)))
        .collect();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &accts[0])
                .and(policy(1, &accts[1]).and(policy(2, &accts[2]).and(policy(3, &accts[3])))),
        )
        .key_error_mode(FailMode::Open),
        &Inner::default(),
    );
    let ok = call(&service, req(&[("x-nokey", "3")])).unwrap();
    assert_eq!(sf_names(ok.headers(), "ratelimit"), ["p0", "p1", "p2"]);
    // p3 found no key and sat the request out: it is not advertised for it.
    assert_eq!(
        sf_names(ok.headers(), "ratelimit-policy"),
        ["p0", "p1", "p2"]
    );
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sf_names(refused.headers(), "ratelimit"), ["p2"]);
    let nets: Vec<i64> = accts.iter().map(|a| a.net("k")).collect();
    assert_eq!(nets, [1, 1, 1, 0]);
}

/// Documented limit (README, module docs and the guide's refund table): a fixed-window
/// reservation that straddles two cycles (one permit left in this cycle, one of the next) and is
/// vetoed by another policy stays spent: the window cannot tell which cycle's count to lower
/// without per-cycle counts. What the test holds is the direction: permits stay spent, never
/// over-granted (the next cycle's permit is not handed out twice).
#[test]
fn a_vetoed_fixed_window_reservation_straddling_two_cycles_stays_spent() {
    let clock = ManualClock::new();
    let quota = Quota::per_second(2)
        .unwrap()
        .with_max_wait(Duration::from_secs(2))
        .unwrap();
    let window = Acct::new(
        KeyedRateLimiter::<String>::builder(quota)
            .algorithm::<FixedWindow>()
            .clock(clock.clone())
            .build(),
        Mode::Now,
    );
    let veto = log(1, &clock, Mode::Now);
    let header_cost = |name: &'static str| {
        move |p: &RequestHead| {
            p.headers
                .get(name)
                .map_or(0, |v| v.to_str().unwrap().parse().unwrap())
        }
    };
    let service = svc(
        RateLimitLayer::new(
            policy(0, &window)
                .cost_by(header_cost("x-window"))
                .and(policy(1, &veto).cost_by(header_cost("x-veto"))),
        ),
        &Inner::default(),
    );
    let ok = call(&service, req(&[("x-window", "1"), ("x-veto", "1")])).unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(window.probe("k"), 1, "one permit left in this cycle");
    let refused = call(&service, req(&[("x-window", "2"), ("x-veto", "1")])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(violated(&body_json(refused)), ["p1"]);
    assert_eq!(
        window.probe("k"),
        0,
        "the straddling reservation stays spent (documented)"
    );
    // The next cycle admits its two permits less the one the vetoed reservation held: never more.
    clock.advance(Duration::from_secs(1));
    assert_eq!(window.probe("k"), 1);
}

/// Promise: "A shadow policy never makes a request wait", with a single policy and with an
/// enforced policy that does not wait beside it.
#[tokio::test(start_paused = true)]
async fn a_lone_waiting_shadow_never_makes_a_request_wait() {
    let waits = Quota::per_hour(1)
        .unwrap()
        .with_max_wait(Duration::from_secs(3 * 3600))
        .unwrap();
    let make = || {
        Acct::new(
            KeyedRateLimiter::<String>::builder(waits)
                .clock(TokioClock::new())
                .build(),
            Mode::Now,
        )
    };
    let lone = make();
    let inner = Inner::default();
    let alone = svc(
        RateLimitLayer::new(policy(0, &lone).shadow_advertised()),
        &inner,
    );
    let paired_shadow = make();
    let enforced = make();
    let paired = svc(
        RateLimitLayer::new(vec![
            policy(0, &paired_shadow).shadow(),
            policy(1, &enforced).cost_by(|p| u32::from(p.headers.contains_key("x-paid"))),
        ]),
        &inner,
    );
    let start = tokio::time::Instant::now();
    for i in 0..3 {
        let r = alone.clone().oneshot(req(&[])).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        let entries = sf_entries(r.headers(), "ratelimit");
        assert_eq!(entries.len(), 1);
        let r = paired.clone().oneshot(req(&[])).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        assert!(
            r.headers().get("ratelimit").is_none(),
            "only the silent shadow decided"
        );
    }
    let r = paired.clone().oneshot(req(&[("x-paid", "1")])).await;
    assert_eq!(r.unwrap().status(), StatusCode::OK);
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a shadow made a request wait"
    );
    assert_eq!(
        lone.net("k"),
        3,
        "the shadow counted (one now, two reservations)"
    );
    assert_eq!(paired_shadow.net("k"), 4);
}

// ---------------------------------------------------------------------------------------------
// Dropped at every poll
// ---------------------------------------------------------------------------------------------

/// Promise: permits are given back exactly once whatever happens: a chain of a count_if policy
/// that decides later, a waiting policy (`max_wait`), a shadow with a wait, and a policy that
/// decides after several polls, with the response future dropped after each poll in turn (time
/// moves between polls). Dropped before the inner service is called, nothing is spent; after,
/// everything is kept; run to the end, the count_if policy settles.
#[tokio::test(start_paused = true)]
async fn dropped_after_every_poll_gives_back_exactly_once() {
    let mut completed = false;
    for drop_after in 0..40 {
        let tokio_log = |quota: Quota, mode: Mode| {
            Acct::new(
                KeyedRateLimiter::<String>::builder(quota)
                    .algorithm::<SlidingLog>()
                    .clock(TokioClock::new())
                    .build(),
                mode,
            )
        };
        let waits = Quota::per_second(1)
            .unwrap()
            .with_max_wait(Duration::from_secs(2))
            .unwrap();
        let counted = tokio_log(Quota::per_hour(5).unwrap(), Mode::Later(2));
        let waiting = tokio_log(waits, Mode::Now);
        let shadow_wait = tokio_log(waits, Mode::Later(1));
        let slow = tokio_log(Quota::per_hour(5).unwrap(), Mode::Later(3));
        let all = [&counted, &waiting, &shadow_wait, &slow];
        // Use the waiting policies' permit, so that this request waits for the next one.
        let key = "k".to_owned();
        for acct in [&waiting, &shadow_wait] {
            let d = acct.inner.reserve_now(&key, 1).unwrap().unwrap();
            assert!(d.allowed && d.wait.is_zero());
        }
        let inner = Inner::default();
        let service = svc(
            RateLimitLayer::new(
                policy(0, &counted)
                    .count_if(|r| r.status == StatusCode::UNAUTHORIZED)
                    .and(policy(1, &waiting))
                    .and(policy(2, &shadow_wait).shadow())
                    .and(policy(3, &slow)),
            ),
            &inner,
        );
        let mut s = service.clone();
        let mut future = Box::pin(s.call(req(&[("x-yield", "2")])));
        let mut output = None;
        for _ in 0..drop_after {
            if let Poll::Ready(out) = poll_once(future.as_mut()) {
                output = Some(out);
                break;
            }
            tokio::time::advance(Duration::from_millis(400)).await;
        }
        drop(future);
        let what = format!("dropped after {drop_after} polls");
        for a in all {
            assert_eq!(a.bad_refunds(), 0, "{what}");
        }
        // What was reserved beforehand (outside the books) stays.
        let base = [0, 0, 0, 0];
        let nets: Vec<i64> = all.iter().map(|a| a.net("k")).collect();
        match (inner.calls(), output) {
            (0, None) => {
                assert_eq!(nets, base, "{what}: dropped before the call spends nothing");
            }
            (1, None) => {
                assert_eq!(
                    nets,
                    [1, 1, 1, 1],
                    "{what}: dropped after the call keeps everything"
                );
            }
            (1, Some(Ok(response))) => {
                assert_eq!(response.status(), StatusCode::OK, "{what}");
                assert_eq!(
                    nets,
                    [0, 1, 1, 1],
                    "{what}: a response that does not count gives the count_if permit back"
                );
                assert_eq!(counted.refunds(), 1, "{what}");
                completed = true;
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(counted.probe("k") as i64, 5 - nets[0], "{what}");
        assert_eq!(slow.probe("k") as i64, 5 - nets[3], "{what}");
    }
    assert!(completed, "some run reached the response");
}

/// A limiter that decides on another task after a delay and sends the decision back, as a
/// client of a remote store does: the future registers its waker with a channel (the first poll,
/// in `call`, with a no-op waker). A decision whose caller is gone is given back, as the Redis
/// limiter does.
#[derive(Clone)]
struct Remote {
    acct: Acct,
    delay: Duration,
}

impl Limiter<String> for Remote {
    type Future = BoxReserve;

    fn quota(&self) -> Quota {
        self.acct.quota()
    }

    fn reserve(&self, key: &String, cost: u32) -> BoxReserve {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (acct, task_key, delay) = (self.acct.clone(), key.clone(), self.delay);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let result = acct.decide(&task_key, cost);
            if let Err(Ok(d)) = tx.send(result) {
                if d.allowed {
                    Limiter::refund(&acct, &task_key, cost, d);
                }
            }
        });
        Box::pin(RemoteFuture {
            rx: Some(rx),
            acct: self.acct.clone(),
            key: key.clone(),
            cost,
        })
    }

    fn refund(&self, key: &String, cost: u32, decision: Decision) {
        Limiter::refund(&self.acct, key, cost, decision)
    }
}

/// The caller's side of a remote decision: dropped before it hands the decision over, it gives
/// back one that already arrived (and closes the channel, so that one arriving later is given
/// back by the sender).
struct RemoteFuture {
    rx: Option<tokio::sync::oneshot::Receiver<Result<Decision, BoxError>>>,
    acct: Acct,
    key: String,
    cost: u32,
}

impl Future for RemoteFuture {
    type Output = Result<Decision, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let rx = self.rx.as_mut().expect("polled after completion");
        let out = std::task::ready!(Pin::new(rx).poll(cx));
        self.rx = None;
        Poll::Ready(out.unwrap_or_else(|_| Err("remote task gone".into())))
    }
}

impl Drop for RemoteFuture {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if let Ok(Ok(d)) = rx.try_recv() {
                if d.allowed {
                    Limiter::refund(&self.acct, &self.key, self.cost, d);
                }
            }
        }
    }
}

/// Promise: permits are given back exactly once whatever happens, with a limiter whose future
/// resolves later on another task: requests complete (no lost wake-up from the first poll in
/// `call`), and a timeout above the layer that gives up while the remote policy decides, or
/// while a later policy makes the request wait, leaves nothing spent.
#[tokio::test(start_paused = true)]
async fn a_remote_policy_under_a_timeout_gives_everything_back() {
    let clock = ManualClock::new();
    let first = log(100, &clock, Mode::Now);
    let remote = Remote {
        acct: log(100, &clock, Mode::Now),
        delay: Duration::from_millis(50),
    };
    let waiting = Acct::new(
        KeyedRateLimiter::<String>::builder(
            Quota::per_second(1)
                .unwrap()
                .with_max_wait(Duration::from_secs(10))
                .unwrap(),
        )
        .algorithm::<SlidingLog>()
        .clock(TokioClock::new())
        .build(),
        Mode::Now,
    );
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &first)
                .count_if(|r| r.status != StatusCode::OK)
                .and(Policy::new("remote", K(1), remote.clone()).unwrap())
                .and(policy(2, &waiting).cost_by(|p| u32::from(p.headers.contains_key("x-wait")))),
        ),
        &inner,
    );
    for _ in 0..5 {
        let r = service.clone().oneshot(req(&[("x-status", "500")])).await;
        assert_eq!(r.unwrap().status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!((first.net("k"), remote.acct.net("k")), (5, 5));
    // Gives up while the remote policy decides.
    let timed_out = tokio::time::timeout(
        Duration::from_millis(10),
        service.clone().oneshot(req(&[("x-status", "500")])),
    )
    .await;
    assert!(timed_out.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(first.net("k"), 5, "the first policy's permit came back");
    assert_eq!(remote.acct.net("k"), 5, "the remote decision came back");
    // Gives up while waiting for the waiting policy's next permit.
    let r = service
        .clone()
        .oneshot(req(&[("x-wait", "1"), ("x-status", "500")]))
        .await;
    assert_eq!(r.unwrap().status(), StatusCode::INTERNAL_SERVER_ERROR);
    let timed_out = tokio::time::timeout(
        Duration::from_millis(400),
        service
            .clone()
            .oneshot(req(&[("x-wait", "1"), ("x-status", "500")])),
    )
    .await;
    assert!(timed_out.is_err());
    assert_eq!(
        (first.net("k"), remote.acct.net("k"), waiting.net("k")),
        (6, 6, 1),
        "everything the waiting request held came back"
    );
    assert_eq!(inner.calls(), 6);
    for a in [&first, &remote.acct, &waiting] {
        assert_eq!(a.bad_refunds(), 0);
    }
    assert_eq!(waiting.probe("k"), 0);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        waiting.probe("k"),
        1,
        "the reservation's slot is free again"
    );
}

/// Promise: permits are given back exactly once whatever happens, under concurrency: hundreds
/// of requests on two threads, each under a timeout of its own that fires at any await point
/// (while a remote policy decides, while a waiting policy waits, while the handler works), and
/// handlers that take a while. Afterwards the books of every policy add up: a plain policy keeps
/// exactly one permit per request that reached the handler, a count_if policy (whose responses
/// never count) exactly one per request dropped after the handler was called and before it
/// answered; nothing was given back twice, and no refusal was given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_at_every_await_point_under_concurrency_keep_the_books_exact() {
    const TASKS: u64 = 400;
    let clock = ManualClock::new();
    let counted = log(1_000_000, &clock, Mode::Now);
    let remote = Remote {
        acct: log(1_000_000, &clock, Mode::Now),
        delay: Duration::from_millis(3),
    };
    let waiting = Acct::new(
        KeyedRateLimiter::<String>::builder(
            Quota::with_period(4, Duration::from_millis(20))
                .unwrap()
                .with_max_wait(Duration::from_millis(30))
                .unwrap(),
        )
        .algorithm::<SlidingLog>()
        .clock(TokioClock::new())
        .build(),
        Mode::Now,
    );
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &counted)
                .count_if(|r| r.status == StatusCode::INTERNAL_SERVER_ERROR)
                .and(Policy::new("remote", K(1), remote.clone()).unwrap())
                .and(policy(2, &waiting)),
        ),
        &inner,
    );
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let service = service.clone();
            let timeout = Duration::from_millis(next(25));
            let sleep = next(15).to_string();
            let key = format!("key{}", i % 3);
            let start = Duration::from_millis(next(400));
            tokio::spawn(async move {
                tokio::time::sleep(start).await;
                let request = req(&[("x-sleep-ms", &sleep), ("x-key", &key)]);
                tokio::time::timeout(timeout, service.oneshot(request)).await
            })
        })
        .collect();
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        let label = match t.await.unwrap() {
            Ok(Ok(r)) => r.status().to_string(),
            Ok(Err(e)) => format!("error {e}"),
            Err(_) => "timed out".to_owned(),
        };
        *outcomes.entry(label).or_default() += 1;
    }
    // Let the remote decisions still on their way land (and be given back).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let total = |a: &Acct| -> i64 { (0..3).map(|k| a.net(&format!("key{k}"))).sum() };
    let (calls, returned) = (inner.calls() as i64, inner.returned() as i64);
    let what = format!("{outcomes:?}: {calls} calls, {returned} returned");
    assert!(
        calls > 0 && calls > returned,
        "{what}: the drops must hit the handler"
    );
    assert!(
        outcomes.get("timed out").copied().unwrap_or(0) > calls as usize - returned as usize,
        "{what}: the drops must also hit the decision"
    );
    assert_eq!(total(&remote.acct), calls, "{what}: the remote policy");
    assert_eq!(total(&waiting), calls, "{what}: the waiting policy");
    assert_eq!(
        total(&counted),
        calls - returned,
        "{what}: the count_if policy"
    );
    for a in [&counted, &remote.acct, &waiting] {
        assert_eq!(a.bad_refunds(), 0, "{what}");
    }
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for at in 0..=p.len() {
            let mut q = p.clone();
            q.insert(at, n - 1);
            out.push(q);
        }
    }
    out
}

/// Promise: all-or-nothing, in every order: a count_if policy that decides later, a shadow that
/// would refuse, a policy the request costs nothing, a waiting policy (`max_wait`), a failing
/// policy (the layer fails open), and, in half the runs, a policy the request costs more than it
/// can ever admit. With the unadmittable policy: a 429 without `Retry-After` naming only it, at
/// once (no wait), and nothing spent anywhere (the waiting policy's reservation comes back).
/// Without it: the request waits exactly for the waiting policy's permit, the count_if permit
/// comes back after a response that does not count, the shadow and the failing policy stay out
/// of the headers.
#[tokio::test(start_paused = true)]
async fn every_order_of_a_mixed_chain() {
    const NAMES: [&str; 6] = ["counted", "shadow", "free", "waiting", "failing", "huge"];
    for with_huge in [false, true] {
        let kinds = if with_huge { 6 } else { 5 };
        for order in permutations(kinds) {
            let clock = ManualClock::new();
            let accts: Vec<Acct> = (0..6)
                .map(|kind| match NAMES[kind] {
                    "counted" => log(5, &clock, Mode::Later(1)),
                    "waiting" => Acct::new(
                        KeyedRateLimiter::<String>::builder(
                            Quota::per_second(1)
                                .unwrap()
                                .with_max_wait(Duration::from_secs(2))
                                .unwrap(),
                        )
                        .algorithm::<SlidingLog>()
                        .clock(TokioClock::new())
                        .build(),
                        Mode::Now,
                    ),
                    "failing" => log(5, &clock, Mode::LaterFail(1)),
                    _ => log(1, &clock, Mode::Now),
                })
                .collect();
            let key = "k".to_owned();
            for kind in [1, 3] {
                // The shadow would refuse; the waiting policy waits for its next permit.
                let d = accts[kind].inner.reserve_now(&key, 1).unwrap().unwrap();
                assert!(d.allowed && d.wait.is_zero());
            }
            let policies: Vec<Policy<K, Acct>> = order
                .iter()
                .enumerate()
                .map(|(i, &kind)| {
                    let p = Policy::new(NAMES[kind], K(i), accts[kind].clone()).unwrap();
                    match NAMES[kind] {
                        "counted" => p.count_if(|r| r.status == StatusCode::UNAUTHORIZED),
                        "shadow" => p.shadow(),
                        "free" => p.cost(0),
                        "huge" => p.cost(u32::MAX),
                        _ => p,
                    }
                })
                .collect();
            let inner = Inner::default();
            let service = svc(
                RateLimitLayer::new(policies)
                    .limiter_error_mode(FailMode::Open)
                    .with_legacy_headers(),
                &inner,
            );
            let start = tokio::time::Instant::now();
            let response = service.oneshot(req(&[])).await.unwrap();
            let waited = start.elapsed();
            let what = format!(
                "order {:?}",
                order.iter().map(|&k| NAMES[k]).collect::<Vec<_>>()
            );
            let in_order = |kinds: &[&str]| -> Vec<String> {
                order
                    .iter()
                    .map(|&k| NAMES[k])
                    .filter(|n| kinds.contains(n))
                    .map(str::to_owned)
                    .collect()
            };
            let nets: Vec<i64> = accts.iter().map(|a| a.net("k")).collect();
            assert_eq!(accts[2].asked(), 0, "{what}: the free policy was asked");
            assert_eq!(accts[4].asked(), 1, "{what}: the failing policy");
            for a in &accts {
                assert_eq!(a.bad_refunds(), 0, "{what}");
            }
            if with_huge {
                assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
                assert_eq!(waited, Duration::ZERO, "{what}: a refused request waited");
                assert_eq!(retry_after(&response), None, "{what}");
                assert!(response.headers().get("x-ratelimit-limit").is_none());
                // (Whether the free policy is listed is `a_zero_cost_policy_is_left_out...`'s
                // business.)
                let mut listed = sf_names(response.headers(), "ratelimit-policy");
                listed.retain(|n| n != "free");
                assert_eq!(
                    listed,
                    in_order(&["counted", "waiting", "failing", "huge"]),
                    "{what}"
                );
                assert!(sf_names(response.headers(), "ratelimit").is_empty());
                assert_eq!(violated(&body_json(response)), ["huge"], "{what}");
                assert_eq!(nets, [0; 6], "{what}: spent by a refused request");
                assert_eq!(inner.calls(), 0);
            } else {
                assert_eq!(response.status(), StatusCode::OK, "{what}");
                assert_eq!(waited, Duration::from_secs(1), "{what}");
                assert_eq!(
                    sf_names(response.headers(), "ratelimit"),
                    in_order(&["counted", "waiting"]),
                    "{what}"
                );
                assert_eq!(nets, [0, 0, 0, 1, 0, 0], "{what}: what the request kept");
            }
        }
    }
}

/// Promise: shadow policies never make a request wait, never refuse and never answer 503; a
/// silent shadow stays out of every header (admitted, refused, legacy), an advertised one is in
/// them as if enforced on admitted responses.
#[tokio::test(start_paused = true)]
async fn shadows_never_refuse_never_wait_never_503_and_stay_out_of_headers() {
    let clock = ManualClock::new();
    let waits = Quota::per_hour(1)
        .unwrap()
        .with_max_wait(Duration::from_secs(7200))
        .unwrap();
    let waiting = |mode| {
        Acct::new(
            KeyedRateLimiter::<String>::builder(waits)
                .algorithm::<SlidingLog>()
                .clock(clock.clone())
                .build(),
            mode,
        )
    };
    let silent_wait = waiting(Mode::Now);
    let adv_wait = waiting(Mode::Later(1));
    let silent_full = log(3, &clock, Mode::Now);
    let silent_fail = log(1, &clock, Mode::LaterFail(1));
    let enforced = log(2, &clock, Mode::Later(1));
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &silent_wait)
                .shadow()
                .and(policy(1, &adv_wait).shadow_advertised())
                .and(policy(2, &silent_full).shadow().cost(3))
                .and(policy(3, &silent_fail).shadow())
                .and(policy(4, &enforced).count_if(|r| r.status != StatusCode::OK)),
        )
        .with_legacy_headers(),
        &inner,
    );
    let start = tokio::time::Instant::now();
    let mut statuses = Vec::new();
    for i in 0..4 {
        let status = if i < 2 { "500" } else { "200" };
        let response = service
            .clone()
            .oneshot(req(&[("x-status", status)]))
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO, "request {i} waited");
        statuses.push(response.status());
        for header in ["ratelimit-policy", "ratelimit"] {
            let names = sf_names(response.headers(), header);
            assert!(
                !names
                    .iter()
                    .any(|n| ["p0", "p2", "p3"].contains(&n.as_str())),
                "request {i}: a silent shadow in {header}: {names:?}"
            );
        }
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(sf_names(response.headers(), "ratelimit"), ["p4"]);
            assert_eq!(response.headers()["x-ratelimit-limit"], "2");
            assert_eq!(violated(&body_json(response)), ["p4"]);
        } else {
            let entries = sf_entries(response.headers(), "ratelimit");
            let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
            assert_eq!(names, ["p1", "p4"], "request {i}");
            assert_ne!(
                response.headers()["x-ratelimit-limit"],
                "3",
                "request {i}: the silent shadow binds the legacy headers"
            );
            if i >= 1 {
                assert_eq!(param(&entries[0], "r"), 0, "the advertised shadow is over");
            }
        }
    }
    assert_eq!(
        statuses,
        [
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(inner.calls(), 2);
    // The shadows counted the admitted requests only (the refused ones gave theirs back).
    assert_eq!(silent_full.net("k"), 3);
    assert_eq!(silent_wait.net("k"), 2, "one now, one reservation");
    assert_eq!(enforced.net("k"), 2);
    for a in [
        &silent_wait,
        &adv_wait,
        &silent_full,
        &silent_fail,
        &enforced,
    ] {
        assert_eq!(a.bad_refunds(), 0);
    }
}

/// Promise: count_if with a waiting policy: the request waits for its reservation, and when
/// the response does not count, the reservation is given back (exactly, with a sliding log);
/// when the wait is refused by a later policy, the reservation is given back at once.
#[tokio::test(start_paused = true)]
async fn a_waiting_count_if_reservation_is_given_back_when_it_does_not_count() {
    let clock = TokioClock::new();
    let waits = Quota::per_second(1)
        .unwrap()
        .with_max_wait(Duration::from_secs(5))
        .unwrap();
    let waiting = Acct::new(
        KeyedRateLimiter::<String>::builder(waits)
            .algorithm::<SlidingLog>()
            .clock(clock)
            .build(),
        Mode::Now,
    );
    let veto = Acct::new(
        KeyedRateLimiter::<String>::builder(Quota::per_hour(2).unwrap())
            .algorithm::<SlidingLog>()
            .clock(clock)
            .build(),
        Mode::Later(1),
    );
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &waiting)
                .count_if(|r| r.status == StatusCode::UNAUTHORIZED)
                .and(policy(1, &veto).cost_by(|p| u32::from(p.headers.contains_key("x-veto")))),
        ),
        &inner,
    );
    let start = tokio::time::Instant::now();
    let ok = service.clone().oneshot(req(&[("x-status", "401")])).await;
    assert_eq!(ok.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(waiting.net("k"), 1);
    // Over the limit: waits one second, then is not counted.
    let ok = service.clone().oneshot(req(&[])).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(waiting.net("k"), 1, "the reservation came back");
    // Two vetoes use the veto policy up; the third waits for nothing: refused at once.
    for _ in 0..2 {
        let r = service.clone().oneshot(req(&[("x-veto", "1")])).await;
        assert_eq!(r.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(waiting.net("k"), 1);
    let before = tokio::time::Instant::now();
    let refused = service
        .clone()
        .oneshot(req(&[("x-veto", "1")]))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        before.elapsed(),
        Duration::ZERO,
        "a refused request never waits"
    );
    assert_eq!(
        waiting.net("k"),
        1,
        "the reservation of a refused request came back"
    );
    assert_eq!(waiting.bad_refunds() + veto.bad_refunds(), 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(waiting.probe("k"), 1);
}

/// Promise: the permit stays spent when the inner service fails instead of answering, or when
/// the future is dropped after the call, and is given back exactly once when the response does
/// not count; the headers of the admitted response still parse.
#[test]
fn count_if_keeps_the_permit_on_error_and_drop_and_refunds_once_otherwise() {
    let clock = ManualClock::new();
    let a = log(10, &clock, Mode::Later(1));
    let b = log(10, &clock, Mode::Now);
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &a)
                .count_if(|r| r.status.is_server_error())
                .and(policy(1, &b).count_if(|r| r.status.is_client_error())),
        ),
        &inner,
    );
    // Inner error: both kept.
    assert!(call(&service, req(&[("x-fail", "1")])).is_err());
    assert_eq!((a.net("k"), b.net("k")), (1, 1));
    // 500: a keeps, b gives back. 404: b keeps, a gives back. 200: both give back.
    for (status, expect) in [("500", (2, 1)), ("404", (2, 2)), ("200", (2, 2))] {
        let r = call(&service, req(&[("x-status", status)])).unwrap();
        assert_eq!(r.status().as_str(), status);
        assert_eq!(sf_names(r.headers(), "ratelimit"), ["p0", "p1"]);
        assert_eq!((a.net("k"), b.net("k")), expect, "status {status}");
    }
    // Dropped after the call (the handler is still working): both kept.
    let mut s = service.clone();
    let mut future = Box::pin(s.call(req(&[("x-yield", "5")])));
    while inner.calls() < 5 {
        assert!(poll_once(future.as_mut()).is_pending());
    }
    drop(future);
    assert_eq!((a.net("k"), b.net("k")), (3, 3));
    assert_eq!(a.refunds(), 2);
    assert_eq!(b.refunds(), 2);
    assert_eq!(a.probe("k"), 7);
    assert_eq!(b.probe("k"), 7);
}

/// Promise (module docs): `RateLimit`'s `r` is the permits left. On a response that a count_if
/// policy does not count, the permit comes back before the client sees the header, so the header
/// must not describe the key as if the request had counted (it used to say one attempt fewer on
/// every successful login). `t` is draft -11's effective window: with the whole quota left, the
/// quota's own window (here an hour).
#[test]
fn the_headers_of_a_response_that_does_not_count_describe_what_is_left() {
    let clock = ManualClock::new();
    let failures = log(5, &clock, Mode::Now);
    let service = svc(
        RateLimitLayer::new(
            policy(0, &failures).count_if(|r| r.status == StatusCode::UNAUTHORIZED),
        ),
        &Inner::default(),
    );
    for i in 0..3 {
        let ok = call(&service, req(&[])).unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(failures.probe("k"), 5, "nothing counted");
        let entries = sf_entries(ok.headers(), "ratelimit");
        assert_eq!(
            (param(&entries[0], "r"), param(&entries[0], "t")),
            (5, 3600),
            "response {i}: the header says fewer permits are left than are"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------------------

/// Promise: with count_if, "a client over the limit is refused before the inner service runs":
/// many tasks racing on two threads for a limit of L, with every response counting, put exactly
/// L in the handler; once those responses do not count, their permits come back and exactly L
/// more get in. Through axum with `MockConnectInfo`, alongside a shadow and a second count_if
/// policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_with_count_if_put_exactly_the_limit_in_the_handler_fixed_window() {
    race::<FixedWindow>().await;
}

/// The same race on a sliding log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_with_count_if_put_exactly_the_limit_in_the_handler_sliding_log() {
    race::<SlidingLog>().await;
}

/// The same race on GCRA (refunds of admissions that are no longer the key's latest are exact
/// on a frozen clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_with_count_if_put_exactly_the_limit_in_the_handler_gcra() {
    race::<Gcra>().await;
}

/// The same race with the count_if limit decided later, as a remote limiter does (the layer
/// holds the first policy's admission while the second decides): exactly the limit reaches the
/// handler, and the first policy keeps exactly what the admitted requests counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_with_a_remote_count_if_policy_put_exactly_the_limit_in_the_handler() {
    const LIMIT: usize = 5;
    const TASKS: usize = 40;
    let clock = ManualClock::new();
    let wide = log(1000, &clock, Mode::Now);
    let remote = log(LIMIT as u32, &clock, Mode::Later(2));
    let (gate_tx, gate) = tokio::sync::watch::channel(None::<StatusCode>);
    let entered = Arc::new(AtomicUsize::new(0));
    let counter = entered.clone();
    let app = Router::new()
        .route(
            "/login",
            get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut gate = gate.clone();
                async move { gate.wait_for(Option::is_some).await.unwrap().unwrap() }
            }),
        )
        .route_layer(RateLimitLayer::new(
            policy(0, &wide)
                .count_if(|r| r.status != StatusCode::OK)
                .and(policy(1, &remote).count_if(|r| r.status == StatusCode::UNAUTHORIZED)),
        ));
    for (round, status) in [(0, StatusCode::OK), (1, StatusCode::UNAUTHORIZED)] {
        gate_tx.send_replace(None);
        entered.store(0, Ordering::SeqCst);
        let refused = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (app, refused) = (app.clone(), refused.clone());
                tokio::spawn(async move {
                    let request = Request::get("/login").body(Body::empty()).unwrap();
                    let response = app.oneshot(request).await.unwrap();
                    if response.status() == StatusCode::TOO_MANY_REQUESTS {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    response.status()
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while entered.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst) < TASKS {
            assert!(std::time::Instant::now() < deadline, "round {round} hangs");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(entered.load(Ordering::SeqCst), LIMIT, "round {round}");
        assert_eq!(
            wide.net("k"),
            LIMIT as i64,
            "round {round}: only the requests in the handler hold the wide policy's permits \
             (round 0's responses did not count; the refused gave theirs back)"
        );
        gate_tx.send_replace(Some(status));
        for t in tasks {
            t.await.unwrap();
        }
    }
    assert_eq!(remote.net("k"), LIMIT as i64);
    assert_eq!(wide.net("k"), LIMIT as i64);
    assert_eq!(remote.probe("k"), 0);
    assert_eq!(wide.bad_refunds() + remote.bad_refunds(), 0);
}

async fn race<A: Algorithm>() {
    const LIMIT: usize = 7;
    const TASKS: usize = 48;
    let clock = ManualClock::new();
    let per_ip = KeyedRateLimiter::<IpAddr>::builder(Quota::per_hour(LIMIT as u32).unwrap())
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    let shadow = KeyedRateLimiter::<IpAddr>::builder(Quota::per_hour(1).unwrap())
        .clock(clock.clone())
        .build();
    let global = tower_bulwark::DirectRateLimiter::builder(Quota::per_hour(1000).unwrap())
        .algorithm::<SlidingLog>()
        .clock(clock.clone())
        .build();
    let (gate_tx, gate) = tokio::sync::watch::channel(None::<StatusCode>);
    let entered = Arc::new(AtomicUsize::new(0));
    let counter = entered.clone();
    let app = Router::new()
        .route(
            "/login",
            get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut gate = gate.clone();
                async move {
                    let status = *gate.wait_for(Option::is_some).await.unwrap();
                    status.unwrap()
                }
            }),
        )
        .route_layer(RateLimitLayer::new(
            Policy::new("failures", PeerIp::new(), per_ip)
                .unwrap()
                .count_if(|r| r.status == StatusCode::UNAUTHORIZED)
                .and(
                    Policy::new("curious", PeerIp::new(), shadow)
                        .unwrap()
                        .shadow(),
                )
                .and(
                    Policy::global("all", global.clone())
                        .unwrap()
                        .count_if(|r| r.status != StatusCode::OK),
                ),
        ))
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 4], 1))));

    for (round, status) in [(0, StatusCode::OK), (1, StatusCode::UNAUTHORIZED)] {
        gate_tx.send_replace(None);
        entered.store(0, Ordering::SeqCst);
        let refused = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (app, refused) = (app.clone(), refused.clone());
                tokio::spawn(async move {
                    let request = Request::get("/login").body(Body::empty()).unwrap();
                    let response = app.oneshot(request).await.unwrap();
                    if response.status() == StatusCode::TOO_MANY_REQUESTS {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    response.status()
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while entered.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst) < TASKS {
            assert!(std::time::Instant::now() < deadline, "round {round} hangs");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(entered.load(Ordering::SeqCst), LIMIT, "round {round}");
        gate_tx.send_replace(Some(status));
        let mut got = HashMap::new();
        for t in tasks {
            *got.entry(t.await.unwrap()).or_insert(0) += 1;
        }
        assert_eq!(got[&status], LIMIT, "round {round}: {got:?}");
        assert_eq!(got[&StatusCode::TOO_MANY_REQUESTS], TASKS - LIMIT);
    }
    // Round 0's responses did not count; round 1's did: the failures policy is full.
    let request = Request::get("/login").body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        sf_names(response.headers(), "ratelimit"),
        ["failures"],
        "only the refusing policy"
    );
    // The global policy counted only round 1's 401s.
    let mut left = 0;
    while Limiter::<()>::reserve_now(&global, &(), 1)
        .unwrap()
        .unwrap()
        .allowed
    {
        left += 1;
    }
    assert_eq!(left, 1000 - LIMIT);
}

// ---------------------------------------------------------------------------------------------
// Random sequences against a model
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Count {
    All,
    If500,
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sh {
    Off,
    Silent,
    Advertised,
}

#[derive(Clone, Copy, Debug)]
enum Algo {
    Log,
    Gcra,
    Window,
}

#[derive(Clone, Debug)]
struct PCfg {
    algo: Algo,
    limit: u32,
    cost: u32,
    count: Count,
    shadow: Sh,
    mode: Mode,
}

#[derive(Clone, Debug)]
struct RCfg {
    key: u8,
    nokey: u8,
    status: u16,
    handler_yields: u8,
    inner_fails: bool,
    drop_after: Option<u8>,
}

fn pcfg() -> impl Strategy<Value = PCfg> {
    (
        prop_oneof![Just(Algo::Log), Just(Algo::Gcra), Just(Algo::Window)],
        1u32..=3,
        prop_oneof![4 => 1u32..=2, 2 => 0u32..=4, 1 => Just(u32::MAX)],
        prop_oneof![Just(Count::All), Just(Count::If500), Just(Count::Never)],
        prop_oneof![3 => Just(Sh::Off), 1 => Just(Sh::Silent), 1 => Just(Sh::Advertised)],
        prop_oneof![
            4 => Just(Mode::Now),
            3 => (0u8..3).prop_map(Mode::Later),
            1 => Just(Mode::Fail),
            1 => (0u8..2).prop_map(Mode::LaterFail),
        ],
    )
        .prop_map(|(algo, limit, cost, count, shadow, mode)| PCfg {
            algo,
            limit,
            cost,
            count,
            shadow,
            mode,
        })
}

fn rcfg() -> impl Strategy<Value = RCfg> {
    (
        0u8..2,
        prop_oneof![4 => Just(0u8), 1 => 0u8..16],
        prop_oneof![Just(200u16), Just(500u16)],
        0u8..3,
        prop::bool::weighted(0.1),
        prop_oneof![3 => Just(None), 2 => (0u8..8).prop_map(Some)],
    )
        .prop_map(
            |(key, nokey, status, handler_yields, inner_fails, drop_after)| RCfg {
                key,
                nokey,
                status,
                handler_yields,
                inner_fails,
                drop_after,
            },
        )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mo {
    Admitted,
    Refused,
    Unadmittable,
    Failed,
    Skipped,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    KeyError,
    Unavailable,
    TooMany,
    Admit,
}

/// What the layer should decide, from the permits spent per (policy, key).
fn model(
    cfgs: &[PCfg],
    spent: &HashMap<(usize, String), u32>,
    r: &RCfg,
    key_mode: FailMode,
    limiter_mode: FailMode,
) -> (Verdict, Vec<Mo>) {
    let key = key_name(r.key);
    let mut outcomes = Vec::new();
    for (i, c) in cfgs.iter().enumerate() {
        let enforced = c.shadow == Sh::Off;
        if c.cost == 0 {
            outcomes.push(Mo::Skipped);
            continue;
        }
        if r.nokey & (1 << i) != 0 {
            if key_mode == FailMode::Closed {
                return (Verdict::KeyError, outcomes);
            }
            outcomes.push(Mo::Skipped);
            continue;
        }
        if c.mode.fails() {
            if enforced && limiter_mode == FailMode::Closed {
                return (Verdict::Unavailable, outcomes);
            }
            outcomes.push(Mo::Failed);
            continue;
        }
        if c.cost > c.limit {
            outcomes.push(Mo::Unadmittable);
            continue;
        }
        let used = spent.get(&(i, key.clone())).copied().unwrap_or(0);
        outcomes.push(if used + c.cost <= c.limit {
            Mo::Admitted
        } else {
            Mo::Refused
        });
    }
    let refused = cfgs
        .iter()
        .zip(&outcomes)
        .any(|(c, o)| c.shadow == Sh::Off && matches!(o, Mo::Refused | Mo::Unadmittable));
    (
        if refused {
            Verdict::TooMany
        } else {
            Verdict::Admit
        },
        outcomes,
    )
}

fn key_name(k: u8) -> String {
    format!("key{k}")
}

fn build(cfgs: &[PCfg], clock: &ManualClock) -> (Vec<Acct>, Vec<Policy<K, Acct>>) {
    let accts: Vec<Acct> = cfgs
        .iter()
        .map(|c| {
            let builder = KeyedRateLimiter::<String>::builder(Quota::per_hour(c.limit).unwrap())
                .clock(clock.clone());
            match c.algo {
                Algo::Log => log(c.limit, clock, c.mode),
                Algo::Gcra => Acct::new(builder.build(), c.mode),
                Algo::Window => Acct::new(builder.algorithm::<FixedWindow>().build(), c.mode),
            }
        })
        .collect();
    let policies = cfgs
        .iter()
        .zip(&accts)
        .enumerate()
        .map(|(i, (c, a))| {
            let mut p = policy(i, a).cost(c.cost);
            p = match c.count {
                Count::All => p,
                Count::If500 => p.count_if(|r| r.status == StatusCode::INTERNAL_SERVER_ERROR),
                Count::Never => p.count_if(|_| false),
            };
            match c.shadow {
                Sh::Off => p,
                Sh::Silent => p.shadow(),
                Sh::Advertised => p.shadow_advertised(),
            }
        })
        .collect();
    (accts, policies)
}

fn run_sequence<P: PolicySet>(
    cfgs: &[PCfg],
    accts: &[Acct],
    layer: RateLimitLayer<P>,
    requests: &[RCfg],
    key_mode: FailMode,
    limiter_mode: FailMode,
) -> Result<(), TestCaseError> {
    let inner = Inner::default();
    let service = svc(
        layer
            .key_error_mode(key_mode)
            .limiter_error_mode(limiter_mode)
            .with_legacy_headers(),
        &inner,
    );
    let mut spent: HashMap<(usize, String), u32> = HashMap::new();
    for (n, r) in requests.iter().enumerate() {
        let key = key_name(r.key);
        let (verdict, outcomes) = model(cfgs, &spent, r, key_mode, limiter_mode);
        let spent_before = spent.clone();
        let nokey: Vec<String> = (0..cfgs.len())
            .filter(|i| r.nokey & (1 << i) != 0)
            .map(|i| i.to_string())
            .collect();
        let status = r.status.to_string();
        let handler_yields = r.handler_yields.to_string();
        let mut headers = vec![
            ("x-key", key.as_str()),
            ("x-status", status.as_str()),
            ("x-yield", handler_yields.as_str()),
        ];
        let nokey = nokey.join(",");
        if !nokey.is_empty() {
            headers.push(("x-nokey", &nokey));
        }
        if r.inner_fails {
            headers.push(("x-fail", "1"));
        }
        let calls_before = inner.calls();
        let mut s = service.clone();
        let mut future = Box::pin(s.call(req(&headers)));
        let limit = r.drop_after.map_or(10_000, usize::from);
        let mut output = None;
        for _ in 0..limit {
            if let Poll::Ready(out) = poll_once(future.as_mut()) {
                output = Some(out);
                break;
            }
        }
        drop(future);
        let called = inner.calls() - calls_before;
        let what = format!("request {n} {r:?}: verdict {verdict:?} {outcomes:?}");
        prop_assert!(called <= 1);
        if called == 1 {
            prop_assert_eq!(&verdict, &Verdict::Admit, "{}: called", what);
        }
        if r.drop_after.is_none() {
            prop_assert!(output.is_some(), "{}: never resolved", what);
        }
        // What the model keeps.
        let response_status = match &output {
            Some(Ok(response)) => Some(response.status()),
            _ => None,
        };
        if verdict == Verdict::Admit && called == 1 {
            for (i, (c, o)) in cfgs.iter().zip(&outcomes).enumerate() {
                if *o != Mo::Admitted {
                    continue;
                }
                let counts = match (c.count, response_status) {
                    (_, None) | (Count::All, _) => true,
                    (Count::If500, Some(s)) => s == StatusCode::INTERNAL_SERVER_ERROR,
                    (Count::Never, Some(_)) => false,
                };
                if counts {
                    *spent.entry((i, key.clone())).or_default() += c.cost;
                }
            }
        }
        // The books and the limiters agree with the model.
        for (i, (a, c)) in accts.iter().zip(cfgs).enumerate() {
            prop_assert_eq!(
                a.bad_refunds(),
                0,
                "{}: policy {} refunded a refusal",
                what,
                i
            );
            for k in 0..2 {
                let key = key_name(k);
                let expect = spent.get(&(i, key.clone())).copied().unwrap_or(0);
                prop_assert_eq!(
                    a.net(&key),
                    i64::from(expect),
                    "{}: policy {} key {} books",
                    what,
                    i,
                    key
                );
                prop_assert_eq!(
                    a.probe(&key),
                    c.limit - expect,
                    "{}: policy {} key {} state",
                    what,
                    i,
                    key
                );
            }
        }
        // The answer.
        let Some(Ok(response)) = output else {
            continue;
        };
        let headers = response.headers().clone();
        match verdict {
            Verdict::KeyError => {
                prop_assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{}", what);
                prop_assert!(headers.get("ratelimit").is_none());
            }
            Verdict::Unavailable => {
                prop_assert_eq!(
                    response.status(),
                    StatusCode::SERVICE_UNAVAILABLE,
                    "{}",
                    what
                );
                prop_assert!(headers.get("ratelimit").is_none());
            }
            Verdict::TooMany => {
                prop_assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{}", what);
                let enforced = |o: &[Mo]| -> Vec<String> {
                    cfgs.iter()
                        .zip(&outcomes)
                        .enumerate()
                        .filter(|(_, (c, out))| c.shadow == Sh::Off && o.contains(out))
                        .map(|(i, _)| format!("p{i}"))
                        .collect()
                };
                let json = body_json(response);
                prop_assert_eq!(
                    violated(&json),
                    enforced(&[Mo::Refused, Mo::Unadmittable]),
                    "{}",
                    what
                );
                let entries = sf_entries(&headers, "ratelimit");
                let names: Vec<String> = entries.iter().map(|e| e.0.clone()).collect();
                prop_assert_eq!(&names, &enforced(&[Mo::Refused]), "{}", what);
                let unadmittable = !enforced(&[Mo::Unadmittable]).is_empty();
                let retry = headers
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().parse::<i64>().unwrap());
                if unadmittable {
                    prop_assert_eq!(retry, None, "{}", what);
                } else {
                    let longest = entries.iter().map(|e| param(e, "t")).max();
                    prop_assert_eq!(retry, longest, "{}", what);
                    prop_assert!(retry.unwrap() >= 1);
                }
                for e in &entries {
                    prop_assert_eq!(param(e, "r"), 0);
                }
            }
            Verdict::Admit => {
                let expect_status = StatusCode::from_u16(r.status).unwrap();
                prop_assert_eq!(response.status(), expect_status, "{}", what);
                let entries = sf_entries(&headers, "ratelimit");
                let expect: Vec<(String, i64)> = cfgs
                    .iter()
                    .zip(&outcomes)
                    .enumerate()
                    .filter(|(_, (c, _))| c.shadow != Sh::Silent)
                    .filter_map(|(i, (c, o))| match o {
                        Mo::Admitted => {
                            let before = spent_before.get(&(i, key.clone())).copied().unwrap_or(0);
                            // A response the policy does not count gave its permits back
                            // before the header was written.
                            let counts = match c.count {
                                Count::All => true,
                                Count::If500 => r.status == 500,
                                Count::Never => false,
                            };
                            let spent = if counts { c.cost } else { 0 };
                            Some((format!("p{i}"), i64::from(c.limit - before - spent)))
                        }
                        Mo::Refused => Some((format!("p{i}"), 0)),
                        _ => None,
                    })
                    .collect();
                let got: Vec<(String, i64)> = entries
                    .iter()
                    .map(|e| (e.0.clone(), param(e, "r")))
                    .collect();
                prop_assert_eq!(&got, &expect, "{}", what);
                // RateLimit-Policy: the advertised policies, in order, at least those in
                // RateLimit and every one the request cost something (whether a policy it cost
                // nothing is listed is `a_zero_cost_policy_is_left_out...`'s business).
                let must: Vec<String> = cfgs
                    .iter()
                    .zip(&outcomes)
                    .enumerate()
                    .filter(|(_, (c, o))| c.shadow != Sh::Silent && !matches!(o, Mo::Skipped))
                    .map(|(i, _)| format!("p{i}"))
                    .collect();
                let may: Vec<String> = cfgs
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.shadow != Sh::Silent)
                    .map(|(i, _)| format!("p{i}"))
                    .collect();
                let mut policy_names = sf_names(&headers, "ratelimit-policy");
                if entries.is_empty() {
                    prop_assert!(policy_names.is_empty(), "{}", what);
                } else {
                    prop_assert!(
                        policy_names.iter().all(|n| may.contains(n)),
                        "{}: {:?}",
                        what,
                        policy_names
                    );
                    policy_names.retain(|n| must.contains(n));
                    prop_assert_eq!(policy_names, must, "{}", what);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Promise: all-or-nothing decisions, count_if refunds exactly when the response does not
    /// count, shadows never refuse nor answer 503, costs above the burst spend nothing, key
    /// errors give back what earlier policies granted, drops give back exactly once before the
    /// call and keep everything after: random policies and requests against a model of the
    /// permits each key has spent (sliding logs, GCRA and fixed windows on a frozen clock, one
    /// limiter per policy, refund exactly), with the
    /// 429's names, `RateLimit` entries and `Retry-After` checked against the model.
    #[test]
    fn random_sequences_match_the_model(
        cfgs in prop::collection::vec(pcfg(), 1..=4),
        requests in prop::collection::vec(rcfg(), 1..24),
        key_open in any::<bool>(),
        limiter_open in any::<bool>(),
        nested in any::<bool>(),
    ) {
        let clock = ManualClock::new();
        let (accts, mut policies) = build(&cfgs, &clock);
        let key_mode = if key_open { FailMode::Open } else { FailMode::Closed };
        let limiter_mode = if limiter_open { FailMode::Open } else { FailMode::Closed };
        if nested && policies.len() >= 2 {
            // A policy chained with a Vec of the others.
            let rest = policies.split_off(1);
            let first = policies.pop().unwrap();
            let layer = RateLimitLayer::new(first.and(rest));
            run_sequence(&cfgs, &accts, layer, &requests, key_mode, limiter_mode)?;
        } else {
            let layer = RateLimitLayer::new(policies);
            run_sequence(&cfgs, &accts, layer, &requests, key_mode, limiter_mode)?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One decision path
// ---------------------------------------------------------------------------------------------

/// Everything a client sees of an answer: status, every header, the body.
fn seen(response: Response<Body>) -> (StatusCode, Vec<(String, String)>, Vec<u8>) {
    let status = response.status();
    let mut headers: Vec<_> = response
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    let body = run(to_bytes(response.into_body(), usize::MAX)).unwrap();
    (status, headers, body.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// One policy alone, the same policy as a `Vec` of one, and the same policy chained after a
    /// policy that every request skips (a cost of zero) go through one decision path, so a client
    /// sees exactly the same answers from the three, request after request: admissions with their
    /// headers, refusals with their `Retry-After` and body, costs the policy can never admit,
    /// responses that `count_if` gives back, with headers on and off, with any algorithm.
    #[test]
    fn one_policy_a_vec_of_one_and_a_chain_answer_alike(
        algorithm in 0usize..3,
        headers_on in any::<bool>(),
        steps in proptest::collection::vec((0u8..5, 0u32..8, any::<bool>(), 0u64..400), 1..40),
    ) {
        let clock = ManualClock::new();
        let limiter = || {
            let quota = Quota::per_second(3).unwrap().with_burst(4).unwrap();
            let builder = KeyedRateLimiter::<String>::builder(quota);
            match algorithm {
                0 => BoxLimiter::new(builder.algorithm::<Gcra>().clock(clock.clone()).build()),
                1 => BoxLimiter::new(
                    builder.algorithm::<FixedWindow>().clock(clock.clone()).build(),
                ),
                _ => BoxLimiter::new(
                    builder.algorithm::<SlidingLog>().clock(clock.clone()).build(),
                ),
            }
        };
        let key = |head: &RequestHead<'_>| -> Result<String, KeyError> {
            let key = head.headers.get("x-key").ok_or_else(|| KeyError::bad_request("no key"))?;
            Ok(key.to_str().unwrap().to_owned())
        };
        let cost = |head: &RequestHead<'_>| -> u32 {
            head.headers.get("x-cost").map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        };
        let counted = |p: &http::response::Parts| p.status != StatusCode::NOT_FOUND;
        let one = || {
            Policy::new("api", key, limiter()).unwrap().cost_by(cost).count_if(counted)
        };
        let never = DirectRateLimiter::new(Quota::per_second(1).unwrap());
        let skipped = Policy::global("never", never).unwrap().cost(0);
        fn with_headers<P>(layer: RateLimitLayer<P>, on: bool) -> RateLimitLayer<P> {
            if on { layer } else { layer.without_admitted_headers() }
        }
        let inner = Inner::default();
        let alone = svc(with_headers(RateLimitLayer::new(one()), headers_on), &inner);
        let vec = svc(with_headers(RateLimitLayer::new(vec![one()]), headers_on), &inner);
        let chained = RateLimitLayer::new(skipped.and(one()));
        let chained = svc(with_headers(chained, headers_on), &inner);
        for (key, cost, not_found, advance_ms) in steps {
            clock.advance(Duration::from_millis(advance_ms));
            let key = ["a", "a", "a", "b", ""][usize::from(key)];
            let cost = [0, 1, 1, 1, 2, 2, 3, 9][cost as usize];
            let status = if not_found { "404" } else { "200" };
            let request = || {
                let mut headers = vec![("x-cost", cost.to_string()), ("x-status", status.into())];
                if !key.is_empty() {
                    headers.push(("x-key", key.into()));
                }
                let headers: Vec<(&str, &str)> =
                    headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                req(&headers)
            };
            let a = seen(call(&alone, request()).unwrap());
            let b = seen(call(&vec, request()).unwrap());
            let c = seen(call(&chained, request()).unwrap());
            prop_assert_eq!(&a, &b, "a Vec of one answers as the policy alone");
            prop_assert_eq!(&a, &c, "a chain with a skipped policy answers as the policy alone");
        }
    }
}
