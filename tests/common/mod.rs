//! Test helpers shared by every test binary: a deterministic pseudo-random sequence, a future
//! with one await point, polling by hand, a runtime with paused time and a dependency's answer
//! here; a clock that reads backwards too in [`dial`]; a mock dependency in [`dependency`]; an
//! HTTP listener and the rate-limit headers parsed in [`listener`]; the panic hook and the `tracing` dispatcher that a binary's tests share in
//! [`process`]; private Redis servers in [`redis_server`]; what a test's own `metrics` recorder
//! saw in `recorded`. Each binary's `main.rs` takes them with
//! `#[path = "../common/mod.rs"] mod common;`.

#![allow(dead_code)] // Not every test binary uses every helper.

pub mod dependency;
pub mod dial;
pub mod held_stream;
pub mod listener;
pub mod process;
#[cfg(feature = "metrics")]
pub mod recorded;
pub mod redis_server;
pub mod reservation_windows;
pub mod sliding_model;
pub mod sliding_schedules;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A deterministic pseudo-random sequence (xorshift), so a failing run replays from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `xs`.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// A future that is pending once (waking itself), then ready: one await point.
#[derive(Default)]
pub struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// Polls `future` once, with a waker that does nothing.
pub fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(std::task::Waker::noop()))
}

/// Polls `future` up to `polls` times, awaiting `between(i)` after the `i`th poll found it still
/// pending (to move time, say): its output if it was ready by then, `None` if it never was.
pub async fn poll_up_to<F, B>(
    mut future: Pin<&mut F>,
    polls: usize,
    mut between: impl FnMut(usize) -> B,
) -> Option<F::Output>
where
    F: Future + ?Sized,
    B: Future<Output = ()>,
{
    for i in 0..polls {
        if let Poll::Ready(output) = poll_once(future.as_mut()) {
            return Some(output);
        }
        between(i).await;
    }
    None
}

/// Polls `future` until it is ready (for futures that make progress on each poll).
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    for _ in 0..10_000 {
        if let Poll::Ready(output) = poll_once(future.as_mut()) {
            return output;
        }
    }
    panic!("a future that never finished");
}

/// A current-thread runtime with tokio's time paused (waits pass at once, exactly).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// The next racing request of a settle race, drawn from `seed` (a linear congruential
/// sequence, stepped once): its estimate, 1 to 50 tokens, and the cost it settles to, 0 to
/// twice the estimate.
pub fn next_estimate_and_cost(seed: &mut u64) -> (u32, u32) {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let estimate = 1 + (*seed >> 33) as u32 % 50;
    let cost = (*seed >> 13) as u32 % (2 * estimate + 1);
    (estimate, cost)
}

/// Moves `clock` to the reading of `nanos` nanoseconds.
pub fn at(clock: &tower_bulwark::clock::ManualClock, nanos: u64) {
    clock.set(std::time::Duration::from_nanos(nanos));
}

/// A manual clock already moved to `at` (a reading far from zero, as a real clock's is).
pub fn manual_clock_at(at: std::time::Duration) -> tower_bulwark::clock::ManualClock {
    let clock = tower_bulwark::clock::ManualClock::new();
    clock.set(at);
    clock
}

/// A response with `status`, the header fields `headers` and no body, as a dependency answers.
pub fn response(status: u16, headers: &[(&str, &str)]) -> http::Response<()> {
    let mut builder = http::Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap()
}

/// `quota` with a request waiting up to `max_wait` for its permits.
pub fn waits_up_to(
    quota: tower_bulwark::Quota,
    max_wait: std::time::Duration,
) -> tower_bulwark::Quota {
    quota.with_max_wait(max_wait).unwrap()
}

/// `permits` every `period` nanoseconds, in bursts of `burst`, a request waiting up to
/// `max_wait` nanoseconds.
pub fn quota_ns(permits: u32, period: u64, burst: u32, max_wait: u64) -> tower_bulwark::Quota {
    use std::time::Duration;
    tower_bulwark::Quota::with_period(permits, Duration::from_nanos(period))
        .unwrap()
        .with_burst(burst)
        .unwrap()
        .with_max_wait(Duration::from_nanos(max_wait))
        .unwrap()
}

/// `quota` in bursts of `burst` permits.
pub fn in_bursts_of(quota: tower_bulwark::Quota, burst: u32) -> tower_bulwark::Quota {
    quota.with_burst(burst).unwrap()
}

/// A limiter of one budget for `quota` on tokio's clock (paused time moves it).
pub fn tokio_direct(
    quota: tower_bulwark::Quota,
) -> tower_bulwark::DirectRateLimiter<
    tower_bulwark::algorithm::Gcra,
    tower_bulwark::clock::TokioClock,
> {
    tokio_direct_with::<tower_bulwark::algorithm::Gcra>(quota)
}

/// A limiter of algorithm `A` with one budget for `quota`, on tokio's clock (paused time moves
/// it).
pub fn tokio_direct_with<A: tower_bulwark::algorithm::Algorithm>(
    quota: tower_bulwark::Quota,
) -> tower_bulwark::DirectRateLimiter<A, tower_bulwark::clock::TokioClock> {
    tower_bulwark::DirectRateLimiter::builder(quota)
        .algorithm::<A>()
        .clock(tower_bulwark::clock::TokioClock::new())
        .build()
}

/// A GCRA limiter with a budget per key of type `K` for `quota`, on tokio's clock (paused time
/// moves it).
pub fn tokio_keyed<K: std::hash::Hash + Eq + Clone>(
    quota: tower_bulwark::Quota,
) -> tower_bulwark::KeyedRateLimiter<
    K,
    tower_bulwark::algorithm::Gcra,
    tower_bulwark::clock::TokioClock,
> {
    tokio_keyed_with::<K, tower_bulwark::algorithm::Gcra>(quota)
}

/// A limiter of algorithm `A` with a budget per key of type `K` for `quota`, on tokio's clock
/// (paused time moves it).
pub fn tokio_keyed_with<K: std::hash::Hash + Eq + Clone, A: tower_bulwark::algorithm::Algorithm>(
    quota: tower_bulwark::Quota,
) -> tower_bulwark::KeyedRateLimiter<K, A, tower_bulwark::clock::TokioClock> {
    tower_bulwark::KeyedRateLimiter::<K>::builder(quota)
        .algorithm::<A>()
        .clock(tower_bulwark::clock::TokioClock::new())
        .build()
}

/// The error `service` answers `request` with; panics if it answers `Ok`.
pub async fn refusal<S, R>(service: &S, request: R) -> tower_bulwark::BoxError
where
    S: tower::Service<R> + Clone,
    S::Error: Into<tower_bulwark::BoxError>,
{
    use tower::ServiceExt;
    match service.clone().oneshot(request).await {
        Ok(_) => panic!("answered where a refusal was expected"),
        Err(err) => err.into(),
    }
}

/// Calls the generic function `f` once for each algorithm, GCRA, fixed window, sliding log and
/// sliding counter in that order, with the same arguments: `for_every_algorithm!(f)`,
/// `for_every_algorithm!(f(a, b))`, `for_every_algorithm!(f(a, b).await)`. With
/// `prefixed "p": f(a).await` each call also gets a last argument naming its algorithm after
/// `p` ("p" then `gcra:`, `fw:`, `log:`, `sc:`), for Redis keys apart; with `tagged: f(a).await`
/// that name alone.
#[allow(unused_macros)]
macro_rules! for_every_algorithm {
    (tagged: $f:ident($($arg:expr),*).await) => {
        for_every_algorithm!(prefixed "": $f($($arg),*).await)
    };
    (prefixed $prefix:literal: $f:ident($($arg:expr),*).await) => {
        $f::<tower_bulwark::algorithm::Gcra>($($arg,)* concat!($prefix, "gcra:")).await;
        $f::<tower_bulwark::algorithm::FixedWindow>($($arg,)* concat!($prefix, "fw:")).await;
        $f::<tower_bulwark::algorithm::SlidingLog>($($arg,)* concat!($prefix, "log:")).await;
        $f::<tower_bulwark::algorithm::SlidingCounter>($($arg,)* concat!($prefix, "sc:")).await;
    };
    ($f:ident($($arg:expr),*).await) => {
        $f::<tower_bulwark::algorithm::Gcra>($($arg),*).await;
        $f::<tower_bulwark::algorithm::FixedWindow>($($arg),*).await;
        $f::<tower_bulwark::algorithm::SlidingLog>($($arg),*).await;
        $f::<tower_bulwark::algorithm::SlidingCounter>($($arg),*).await;
    };
    ($f:ident($($arg:expr),*)) => {
        $f::<tower_bulwark::algorithm::Gcra>($($arg),*);
        $f::<tower_bulwark::algorithm::FixedWindow>($($arg),*);
        $f::<tower_bulwark::algorithm::SlidingLog>($($arg),*);
        $f::<tower_bulwark::algorithm::SlidingCounter>($($arg),*);
    };
    ($f:ident) => {
        for_every_algorithm!($f())
    };
}
#[allow(unused_imports)]
pub(crate) use for_every_algorithm;

/// Asserts that the tokens a key still admits, `left`, and those its racing requests settled,
/// `spent`, add up to its quota of `quota` tokens (none when `spent` is more), for the
/// algorithm `A`.
pub fn assert_settled_plus_left_is_the_quota<A>(quota: u64, spent: u64, left: u64) {
    let name = std::any::type_name::<A>();
    assert_eq!(
        left,
        quota.saturating_sub(spent),
        "{name}: settled tokens ({spent}) plus what is left must be the quota"
    );
}

/// Asserts what refunds of requests refused elsewhere gave back, `gap_ms` after they were
/// decided: with them the key admitted `vetoed` more, its twin that never saw those requests
/// `twin`, and one that kept them `kept`. At one instant the refunds are exact; later they give
/// back something, never more than if the refused requests had never come.
pub fn assert_refunds_between(gap_ms: u64, vetoed: u64, twin: u64, kept: u64) {
    let (v, t, k) = (vetoed, twin, kept);
    if gap_ms == 0 {
        assert_eq!(v, t, "at one instant the refunds are exact");
    } else {
        assert!(
            v <= t,
            "never more than if the refused requests had never come: {v} > {t}"
        );
        assert!(
            v > k,
            "the refunds gave back something: {v} against {k} without them"
        );
    }
}

/// The `RateLimit-Policy` field of `response` (empty if it has none), and its status.
pub fn status_and_policy<B>(response: &http::Response<B>) -> (http::StatusCode, String) {
    let policy = response
        .headers()
        .get("ratelimit-policy")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (response.status(), policy)
}

/// A GCRA limiter of one budget for `quota` on `clock` (a clone of it: a manual or skewed
/// clock of the test's).
pub fn direct_on<C: tower_bulwark::clock::Clock + Clone>(
    quota: tower_bulwark::Quota,
    clock: &C,
) -> tower_bulwark::DirectRateLimiter<tower_bulwark::algorithm::Gcra, C> {
    tower_bulwark::DirectRateLimiter::builder(quota)
        .clock(clock.clone())
        .build()
}

/// A GCRA limiter with a budget per key of type `K` for `quota` on `clock` (a clone of it: a
/// manual or skewed clock of the test's).
pub fn keyed_on<K: std::hash::Hash + Eq + Clone, C: tower_bulwark::clock::Clock + Clone>(
    quota: tower_bulwark::Quota,
    clock: &C,
) -> tower_bulwark::KeyedRateLimiter<K, tower_bulwark::algorithm::Gcra, C> {
    tower_bulwark::KeyedRateLimiter::<K>::builder(quota)
        .clock(clock.clone())
        .build()
}

/// Asserts that each of `n` calls of `request()` through `service` is refused with
/// `BulkheadFull`.
pub async fn assert_bulkhead_full<S, R>(service: &S, request: impl Fn() -> R, n: usize)
where
    S: tower::Service<R> + Clone,
    S::Error: Into<tower_bulwark::BoxError>,
{
    for _ in 0..n {
        let err = refusal(service, request()).await;
        assert!(err.is::<tower_bulwark::BulkheadFull>(), "{err}");
    }
}

/// How many times in a row `admit` answers true: what a limiter whose check `admit` makes still
/// admits now (it takes them all).
pub fn admitted_until_refused(mut admit: impl FnMut() -> bool) -> u64 {
    let mut n = 0;
    while admit() {
        n += 1;
        assert!(n < 1_000_000, "a limiter that never refuses");
    }
    n
}

/// What `l` has left for `key` now, by an admission of one permit given back at once: exact at
/// one instant, and unlike taking them all it leaves the limiter as it found it (a `Metered`
/// admission held unsettled would change what it has left).
pub fn probe<K, L: tower_bulwark::Limiter<K>>(l: &L, key: &K) -> u64 {
    let d = l.reserve_now(key, 1).unwrap().unwrap();
    if !d.allowed {
        return 0;
    }
    let left = d.remaining + 1;
    assert!(l.refund(key, 1, d));
    left
}

/// What each of `threads` returned, once all of them have ended (a panic in one fails the test).
pub fn joined<T>(threads: Vec<std::thread::JoinHandle<T>>) -> Vec<T> {
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Asserts that at least `least` has passed since `start`: a wait the dependency asked for, kept.
pub fn assert_waited_since(start: std::time::Instant, least: std::time::Duration) {
    let waited = start.elapsed();
    assert!(waited >= least, "waited {waited:?}, not {least:?}");
}

/// The first `Some` that `attempt()` gives, trying again every 10 ms for at most ten seconds
/// (an answer admitted once a slot has come back, say); the panic past that says `what` never
/// came.
pub async fn first_within_ten_seconds<T, F>(what: &str, mut attempt: impl FnMut() -> F) -> T
where
    F: Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(found) = attempt().await {
            return found;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "{what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
