//! The instruments of the policy tests: an accounting limiter ([`Acct`]) that wraps a real
//! in-memory limiter and books every permit it grants and every one given back, decides at once
//! or after pending polls, or fails ([`Mode`]); a key extractor per policy that the request's
//! headers can make fail or panic ([`K`]); and an inner service that the request's headers make
//! answer any status, late, or fail ([`Inner`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, Request, Response};
use tower::{Layer, Service};
use tower_bulwark::algorithm::SlidingLog;
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::{BoxLimiter, BoxReserve};
use tower_bulwark::rate_limit::{
    KeyError, KeyExtractor, Policy, PolicySet, RateLimitLayer, RateLimitService,
};
use tower_bulwark::{
    clock::{Clock, ManualClock, TokioClock},
    limiter::Decision,
    BoxError, KeyedRateLimiter, Limiter, Quota,
};

use crate::common::{block_on, waits_up_to};
use crate::support::yields;

/// How an accounting limiter decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
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
    pub fn delay(self) -> u8 {
        match self {
            Mode::Now | Mode::Fail => 0,
            Mode::Later(n) | Mode::LaterFail(n) => n,
        }
    }

    pub fn fails(self) -> bool {
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
pub struct Acct {
    pub inner: BoxLimiter<String>,
    mode: Mode,
    books: Arc<Books>,
    /// Moves this clock on by this much just before each decision (time passing while a remote
    /// limiter decides).
    tick: Option<(ManualClock, Duration)>,
}

impl Acct {
    pub fn new(inner: impl Limiter<String>, mode: Mode) -> Self {
        Self {
            inner: BoxLimiter::new(inner),
            mode,
            books: Arc::default(),
            tick: None,
        }
    }

    pub fn ticking(mut self, clock: &ManualClock, by: Duration) -> Self {
        self.tick = Some((clock.clone(), by));
        self
    }

    pub fn decide(&self, key: &String, cost: u32) -> Result<Decision, BoxError> {
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

    pub fn net(&self, key: &str) -> i64 {
        self.books
            .net
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    pub fn asked(&self) -> usize {
        self.books.asked.load(Ordering::SeqCst)
    }

    pub fn refunds(&self) -> usize {
        self.books.refunds.load(Ordering::SeqCst)
    }

    pub fn bad_refunds(&self) -> usize {
        self.books.bad_refunds.load(Ordering::SeqCst)
    }

    /// The permits `key` can take now, without waiting, read by taking them and giving them
    /// back (exact for the sliding log and, given back newest first, for GCRA).
    pub fn probe(&self, key: &str) -> u32 {
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
    pub fn full_in(&self, key: &str) -> Duration {
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
            yields(delay.into()).await;
            this.decide(&key, cost)
        })
    }

    fn reserve_now(&self, key: &String, cost: u32) -> Option<Result<Decision, BoxError>> {
        match self.mode {
            Mode::Now | Mode::Fail => Some(self.decide(key, cost)),
            Mode::Later(_) | Mode::LaterFail(_) => None,
        }
    }

    fn refund(&self, key: &String, cost: u32, decision: Decision) -> bool {
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
        self.inner.refund(key, cost, decision)
    }

    /// As a limiter of its own that gives back only by refunds: the difference of a settle to
    /// less goes back through `refund`, and nothing is charged.
    fn settle(&self, key: &String, estimate: u32, decision: Decision, cost: u32) -> bool {
        cost < estimate && Limiter::refund(self, key, estimate - cost, decision)
    }
}

/// A sliding log of `limit` per hour on a manual clock: exact refunds, frozen time.
pub fn log(limit: u32, clock: &ManualClock, mode: Mode) -> Acct {
    sliding_log(Quota::per_hour(limit).unwrap(), clock.clone(), mode)
}

/// A sliding log of `quota` on tokio's clock whose requests wait up to `max_wait`, deciding at
/// once.
pub fn waiting_log(quota: Quota, max_wait: Duration) -> Acct {
    sliding_log(waits_up_to(quota, max_wait), TokioClock::new(), Mode::Now)
}

/// Two sliding logs on one new manual clock, of `first` and `second` permits an hour, deciding
/// as `first_mode` and `second_mode`.
pub fn two_logs(
    (first, first_mode): (u32, Mode),
    (second, second_mode): (u32, Mode),
) -> (Acct, Acct) {
    let clock = ManualClock::new();
    (
        log(first, &clock, first_mode),
        log(second, &clock, second_mode),
    )
}

/// A sliding log of `quota` on `clock` (exact refunds).
pub fn sliding_log(quota: Quota, clock: impl Clock, mode: Mode) -> Acct {
    Acct::new(
        KeyedRateLimiter::<String>::builder(quota)
            .algorithm::<SlidingLog>()
            .clock(clock)
            .build(),
        mode,
    )
}

/// A GCRA limiter of `quota` on `clock`.
pub fn gcra(quota: Quota, clock: impl Clock, mode: Mode) -> Acct {
    Acct::new(
        KeyedRateLimiter::<String>::builder(quota)
            .clock(clock)
            .build(),
        mode,
    )
}

/// The key of policy `i`: the `x-key` header (`k` without it). `x-nokey: 1,3` makes policies 1
/// and 3 find no key; `x-panic-key: 2` makes policy 2's extractor panic.
#[derive(Clone, Copy)]
pub struct K(pub usize);

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
pub struct Inner {
    calls: Arc<AtomicUsize>,
    /// Responses returned (the future resolved to `Ok`).
    returned: Arc<AtomicUsize>,
}

impl Inner {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn returned(&self) -> usize {
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
            yields(delay.into()).await;
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

pub fn req(headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::get("/r");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::empty()).unwrap()
}

pub fn policy(i: usize, acct: &Acct) -> Policy<K, Acct> {
    Policy::new(format!("p{i}"), K(i), acct.clone()).unwrap()
}

pub fn svc<P: PolicySet>(layer: RateLimitLayer<P>, inner: &Inner) -> RateLimitService<Inner, P> {
    layer.layer(inner.clone())
}

/// Calls the service once and drives the response future to its end.
pub fn call<P: PolicySet>(
    svc: &RateLimitService<Inner, P>,
    request: Request<Body>,
) -> Result<Response<Body>, &'static str> {
    let mut svc = svc.clone();
    block_on(svc.call(request))
}

/// The response's body parsed as JSON, read without a runtime.
pub fn body_json(response: Response<Body>) -> serde_json::Value {
    block_on(crate::support::json(response))
}
