//! The rate-limit headers against draft-ietf-httpapi-ratelimit-headers-11: exact values for every
//! algorithm under a manual clock, every header parsed as an RFC 9651 Structured Field, a
//! property over quotas and clock offsets, and clients that pace themselves by the advertised
//! policy.

use std::time::Duration;

use crate::common::listener::sf_entries;
use axum::body::{to_bytes, Body};
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use proptest::prelude::*;
use tower::ServiceExt;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
use tower_bulwark::{
    algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter, SlidingLog},
    clock::ManualClock,
    limiter::Decision,
    KeyedRateLimiter, Limiter, Quota,
};

/// The largest Structured Field Integer.
const SF_INTEGER_MAX: i64 = 999_999_999_999_999;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alg {
    Gcra,
    FixedWindow,
    SlidingLog,
    SlidingCounter,
}

const ALGORITHMS: [Alg; 4] = [
    Alg::Gcra,
    Alg::FixedWindow,
    Alg::SlidingLog,
    Alg::SlidingCounter,
];

/// One route behind one or more policies on a single key, with the limiters kept for checks.
struct Route {
    app: Router,
    limiters: Vec<BoxLimiter<()>>,
}

fn limiter_of<A: Algorithm>(quota: Quota, clock: &ManualClock) -> BoxLimiter<()>
where
    KeyedRateLimiter<(), A, ManualClock>: Limiter<()>,
{
    BoxLimiter::new(
        KeyedRateLimiter::<()>::builder(quota)
            .clock(clock.clone())
            .algorithm::<A>()
            .build(),
    )
}

fn limiter(alg: Alg, quota: Quota, clock: &ManualClock) -> BoxLimiter<()> {
    match alg {
        Alg::Gcra => limiter_of::<Gcra>(quota, clock),
        Alg::FixedWindow => limiter_of::<FixedWindow>(quota, clock),
        Alg::SlidingLog => limiter_of::<SlidingLog>(quota, clock),
        Alg::SlidingCounter => limiter_of::<SlidingCounter>(quota, clock),
    }
}

fn route(policies: &[(&str, Alg, Quota)], clock: &ManualClock) -> Route {
    let limiters: Vec<_> = policies
        .iter()
        .map(|&(_, alg, quota)| limiter(alg, quota, clock))
        .collect();
    let layer = RateLimitLayer::new(
        policies
            .iter()
            .zip(&limiters)
            .map(|(&(name, _, _), l)| Policy::new(name, GlobalKey, l.clone()).unwrap())
            .collect::<Vec<_>>(),
    );
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    Route { app, limiters }
}

/// What the limiter decides now on a request of one permit (only called where it refuses, so
/// nothing is spent).
fn decide_now(limiter: &BoxLimiter<()>) -> Decision {
    Limiter::reserve_now(limiter, &(), 1)
        .expect("an in-memory limiter answers at once")
        .expect("an in-memory limiter never fails")
}

fn one(alg: Alg, quota: Quota, clock: &ManualClock) -> Route {
    route(&[("p", alg, quota)], clock)
}

/// A parsed response: status, `Retry-After`, and both lists as `(name, params)`.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry_after: Option<i64>,
    policy: Vec<(String, Vec<(String, i64)>)>,
    ratelimit: Vec<(String, Vec<(String, i64)>)>,
    body: bytes::Bytes,
}

impl Answer {
    /// `(q, w)` of the named policy.
    fn qw(&self, name: &str) -> (i64, i64) {
        let (_, params) = self.policy.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(
            params.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["q", "w"],
            "{self:?}"
        );
        (params[0].1, params[1].1)
    }

    /// `(r, t)` of the named policy, if listed.
    fn rt(&self, name: &str) -> Option<(i64, i64)> {
        let (_, params) = self.ratelimit.iter().find(|(n, _)| n == name)?;
        assert_eq!(
            params.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["r", "t"],
            "{self:?}"
        );
        Some((params[0].1, params[1].1))
    }

    /// Asserts that this is a refusal by policy `p`, nothing left, whose `t` and `Retry-After`
    /// are both `secs`.
    fn assert_refused_for(&self, secs: i64) {
        assert_eq!(self.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(self.rt("p"), Some((0, secs)));
        assert_eq!(self.retry_after, Some(secs));
    }

    /// The whole `RateLimit` field as `(name, r, t)`.
    fn service_limits(&self) -> Vec<(&str, i64, i64)> {
        self.ratelimit
            .iter()
            .map(|(n, _)| {
                let (r, t) = self.rt(n).unwrap();
                (n.as_str(), r, t)
            })
            .collect()
    }
}

async fn call(app: &Router) -> Answer {
    let response = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let headers = response.headers().clone();
    let retry_after = headers.get("retry-after").map(|v| {
        v.to_str()
            .unwrap()
            .parse::<i64>()
            .expect("Retry-After in delay-seconds")
    });
    Answer {
        status: response.status(),
        retry_after,
        policy: sf_entries(&headers, "ratelimit-policy"),
        ratelimit: sf_entries(&headers, "ratelimit"),
        body: to_bytes(response.into_body(), usize::MAX).await.unwrap(),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn quota(permits: u32, period: Duration) -> Quota {
    Quota::with_period(permits, period).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Exact values
// ---------------------------------------------------------------------------------------------

/// Defect 1: 5 per 200 ms was advertised as `q=5;w=1` (a fifth of the real rate). It is now
/// `q=25;w=1` for every algorithm; `r` never exceeds it and `t` is at least a second.
#[tokio::test]
async fn a_sub_second_period_is_advertised_at_its_real_rate() {
    for alg in ALGORITHMS {
        let clock = ManualClock::new();
        let Route { app, .. } = one(alg, quota(5, ms(200)), &clock);
        for i in 0..5 {
            let a = call(&app).await;
            assert_eq!(a.status, StatusCode::OK, "{alg:?} request {i}");
            assert_eq!(a.qw("p"), (25, 1), "{alg:?}");
            // 4, 3, 2, 1, 0 left; the key is whole again within the period and 25 a second
            // grants 4 within a second, so t is 1.
            assert_eq!(a.rt("p"), Some((4 - i, 1)), "{alg:?} request {i}");
        }
        let refused = call(&app).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{alg:?}");
        assert_eq!(refused.qw("p"), (25, 1));
        assert_eq!(refused.rt("p"), Some((0, 1)), "{alg:?}");
        assert_eq!(refused.retry_after, Some(1), "{alg:?}");
    }
}

/// 3 per 1.5 s is 4 per 2 s: `w` is the period rounded up, `q` what that many seconds hold.
/// 1 per 1.5 s holds 1.33 in 2 s: `q` rounds down to 1, a slower rate than the real one.
#[tokio::test]
async fn a_period_that_is_not_whole_seconds_rounds_w_up_and_q_down() {
    for alg in ALGORITHMS {
        let clock = ManualClock::new();
        let a = call(&one(alg, quota(3, ms(1500)), &clock).app).await;
        assert_eq!(a.qw("p"), (4, 2), "{alg:?}");
        // Two left, which take 1 s at 4 per 2 s; the key is whole again in 0.5 s (GCRA), 1.5 s
        // (fixed window, sliding log) or 3 s (sliding counter, whose weight carries into the
        // next window).
        let t = match alg {
            Alg::Gcra => 1,
            Alg::FixedWindow | Alg::SlidingLog => 2,
            Alg::SlidingCounter => 3,
        };
        assert_eq!(a.rt("p"), Some((2, t)), "{alg:?}");

        let a = call(&one(alg, quota(1, ms(1500)), &clock).app).await;
        assert_eq!(a.qw("p"), (1, 2), "{alg:?}");
        // Nothing left until the key is whole again: 1.5 s, or 3 s for the sliding counter.
        let t = if alg == Alg::SlidingCounter { 3 } else { 2 };
        assert_eq!(a.rt("p"), Some((0, t)), "{alg:?}");
    }
}

/// Defect 2: 1 per second with a burst of 10 said `q=1` and `r=9`. `r` never exceeds `q`.
#[tokio::test]
async fn a_burst_above_the_permits_never_reports_more_than_q() {
    let clock = ManualClock::new();
    let bursty = Quota::per_second(1).unwrap().with_burst(10).unwrap();
    let Route { app, .. } = one(Alg::Gcra, bursty, &clock);
    let first = call(&app).await;
    assert_eq!(first.qw("p"), (1, 1));
    // Nine left in the bucket, one reported; whole again in a second.
    assert_eq!(first.rt("p"), Some((1, 1)));
    for _ in 0..8 {
        let a = call(&app).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.rt("p").unwrap().0, 1);
    }
    // The tenth empties the bucket: nothing left until it is whole again, 10 s later.
    let tenth = call(&app).await;
    assert_eq!(tenth.status, StatusCode::OK);
    assert_eq!(tenth.rt("p"), Some((0, 10)));
    call(&app).await.assert_refused_for(1);
}

/// Defect 3: 1000 per hour after one request said `r=999;t=4` (999 requests in 4 s, 250 a
/// second, against a policy of 0.28 a second). Draft -11's `t` is the window within which the
/// client uses no more than `r`; section 6 asks servers to cap `r/t`. `t` is now the time 999
/// permits take at 1000 per hour.
#[tokio::test]
async fn a_long_window_never_advertises_a_faster_rate_than_its_policy() {
    for alg in ALGORITHMS {
        let clock = ManualClock::new();
        let Route { app, .. } = one(alg, Quota::per_hour(1000).unwrap(), &clock);
        let a = call(&app).await;
        assert_eq!(a.qw("p"), (1000, 3600), "{alg:?}");
        // GCRA: whole again in 3.6 s; the rate needs 3596.4 s for 999. The windows: whole
        // again in an hour (a permit weighs for an hour), two for the sliding counter (its
        // weight carries into the next window), later than the 3596.4 s.
        let t = match alg {
            Alg::Gcra => 3597,
            Alg::FixedWindow | Alg::SlidingLog => 3600,
            Alg::SlidingCounter => 7200,
        };
        assert_eq!(a.rt("p"), Some((999, t)), "{alg:?}");
        let (r, t) = a.rt("p").unwrap();
        assert!(r * 3600 <= 1000 * t, "{alg:?}: r/t above q/w");
        if alg == Alg::Gcra {
            for _ in 0..998 {
                assert_eq!(call(&app).await.status, StatusCode::OK);
            }
            // The thousandth empties the bucket: nothing until it is full again, an hour on.
            let last = call(&app).await;
            assert_eq!(last.status, StatusCode::OK);
            assert_eq!(last.rt("p"), Some((0, 3600)));
            // A request sent earlier is told the exact wait: one permit, 3.6 s.
            let refused = call(&app).await;
            assert_eq!(refused.rt("p"), Some((0, 4)));
            assert_eq!(refused.retry_after, Some(4));
        }
    }
}

/// The fixed window late in its cycle: the cycle ends in 10 s with 8 left, but 8 in 10 s is
/// faster than 10 per minute, so `t` is the 48 s that 8 permits take at the policy's rate.
/// Early in a cycle `t` is the cycle's end, as in the draft's fixed-window example.
#[tokio::test]
async fn a_fixed_window_reports_its_cycle_end_capped_by_the_rate() {
    let clock = ManualClock::new();
    let Route { app, .. } = one(Alg::FixedWindow, Quota::per_minute(10).unwrap(), &clock);
    clock.advance(Duration::from_secs(5));
    let early = call(&app).await;
    assert_eq!(early.rt("p"), Some((9, 55)));
    clock.advance(Duration::from_secs(45));
    let late = call(&app).await;
    assert_eq!(late.rt("p"), Some((8, 48)));
    for _ in 0..8 {
        assert_eq!(call(&app).await.status, StatusCode::OK);
    }
    // All ten spent at 50 s: nothing left until the cycle ends at 60 s.
    call(&app).await.assert_refused_for(10);
}

/// The sliding log and the sliding counter late in their window: a permit taken 50 s ago
/// weighs on the key for 10 s more.
#[tokio::test]
async fn the_sliding_windows_report_exact_values() {
    for alg in [Alg::SlidingLog, Alg::SlidingCounter] {
        let clock = ManualClock::new();
        let Route { app, .. } = one(alg, Quota::per_minute(2).unwrap(), &clock);
        let first = call(&app).await;
        // One left; whole again in 60 s (the counter: once the window it sits in has slid past,
        // 120 s, since its weight is carried into the next window).
        let whole = if alg == Alg::SlidingLog { 60 } else { 120 };
        assert_eq!(first.rt("p"), Some((1, whole)), "{alg:?}");
        clock.advance(Duration::from_secs(50));
        let second = call(&app).await;
        assert_eq!(second.status, StatusCode::OK);
        let whole = if alg == Alg::SlidingLog { 60 } else { 70 };
        assert_eq!(second.rt("p"), Some((0, whole)), "{alg:?}");
        let refused = call(&app).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        // The log admits again when the first entry leaves, 10 s on; the counter when the
        // previous window's weight has shrunk enough.
        let (r, t) = refused.rt("p").unwrap();
        assert_eq!(r, 0);
        assert_eq!(refused.retry_after, Some(t), "{alg:?}");
        if alg == Alg::SlidingLog {
            assert_eq!(t, 10);
        }
    }
}

/// Defect 6 and the problem type: on a refusal the `RateLimit` field lists the violated
/// policies only, each with `r=0` and its own wait; `Retry-After` is the longest of them, so it
/// never points before the end of any listed window. A policy that admitted and was vetoed is
/// left out (its decision was given back and no longer describes the key), and the next admitted
/// response shows it spent nothing.
#[tokio::test]
async fn a_refusal_lists_the_violated_policies_and_retry_after_covers_their_windows() {
    let clock = ManualClock::new();
    let Route { app, limiters } = route(
        &[
            ("daily", Alg::Gcra, quota(1000, Duration::from_secs(86_400))),
            ("burst", Alg::SlidingLog, Quota::per_second(2).unwrap()),
            ("hourly", Alg::FixedWindow, Quota::per_hour(3).unwrap()),
        ],
        &clock,
    );
    let ok = call(&app).await;
    assert_eq!(
        ok.service_limits(),
        [("daily", 999, 86_314), ("burst", 1, 1), ("hourly", 2, 3600)]
    );
    assert_eq!(call(&app).await.status, StatusCode::OK);
    let refused = call(&app).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.service_limits(), [("burst", 0, 1)]);
    assert_eq!(refused.retry_after, Some(1));
    // The policy header is the same on every response.
    assert_eq!(refused.policy, ok.policy);
    let problem: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["title"], "Quota Exceeded");
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"], serde_json::json!(["burst"]));

    // A second on, the hourly policy has one left; the next request takes it, and the one
    // after is refused by it alone, for the rest of the hour.
    clock.advance(Duration::from_secs(1));
    let ok = call(&app).await;
    assert_eq!(ok.rt("daily").unwrap().0, 997, "the refusal spent nothing");
    assert_eq!(ok.rt("hourly"), Some((0, 3599)));
    clock.advance(Duration::from_secs(1));
    let refused = call(&app).await;
    assert_eq!(refused.service_limits(), [("hourly", 0, 3598)]);
    assert_eq!(refused.retry_after, Some(3598));
    let d = decide_now(&limiters[2]);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Duration::from_secs(3598));
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

fn alg_strategy() -> impl Strategy<Value = Alg> {
    prop_oneof![
        Just(Alg::Gcra),
        Just(Alg::FixedWindow),
        Just(Alg::SlidingLog),
        Just(Alg::SlidingCounter),
    ]
}

/// Periods from a nanosecond to `Quota::MAX_SPAN`, spread over every order of magnitude.
fn period_strategy() -> impl Strategy<Value = u64> {
    let max = Quota::MAX_SPAN.as_nanos() as u64;
    prop_oneof![
        1..=1_000u64,
        1_000..=1_000_000_000u64,
        1_000_000_000..=3_600_000_000_000u64,
        3_600_000_000_000..=max,
        Just(max),
        Just(1),
    ]
}

fn permits_strategy() -> impl Strategy<Value = u32> {
    prop_oneof![1..=20u32, 1..=100_000u32, 1..=u32::MAX, Just(u32::MAX)]
}

/// A quota from its parts; a burst the quota's bounds refuse is left at the default.
fn build_quota(permits: u32, period: u64, burst: Option<u32>) -> Quota {
    let q = Quota::with_period(permits, Duration::from_nanos(period)).unwrap();
    burst.and_then(|b| q.with_burst(b).ok()).unwrap_or(q)
}

/// Checks one answer against draft -11 and the limiter, given the decision the limiter gives
/// now (a refusal leaves every algorithm's state as it was, so a check at the same instant
/// is refused alike).
fn check_answer(a: &Answer, now: impl Fn() -> Decision) {
    let (q, w) = a.qw("p");
    assert!((0..=SF_INTEGER_MAX).contains(&q), "{a:?}");
    assert!((1..=SF_INTEGER_MAX).contains(&w), "{a:?}");
    let (r, t) = a.rt("p").expect("the deciding policy is listed");
    assert!((0..=q).contains(&r), "r outside 0..=q: {a:?}");
    assert!((0..=SF_INTEGER_MAX).contains(&t), "{a:?}");
    // r/t never a faster rate than q/w.
    assert!(
        i128::from(r) * i128::from(w) <= i128::from(q) * i128::from(t),
        "r/t above q/w: {a:?}"
    );
    match a.status {
        StatusCode::OK => assert_eq!(a.retry_after, None),
        StatusCode::TOO_MANY_REQUESTS => {
            let retry = a.retry_after.expect("a refusal carries Retry-After");
            assert!(retry >= 1, "{a:?}");
            assert_eq!(r, 0, "{a:?}");
            assert!(
                retry >= t,
                "Retry-After before the end of the window: {a:?}"
            );
            let d = now();
            assert!(
                !d.allowed,
                "the limiter admits what the layer refused: {a:?}"
            );
            let limiter_secs = d.retry_after.as_secs_f64().ceil().max(1.0);
            assert!(
                retry as f64 >= limiter_secs.min(SF_INTEGER_MAX as f64),
                "Retry-After {retry} below the limiter's {:?}",
                d.retry_after
            );
        }
        other => panic!("unexpected status {other}: {a:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any quota the crate accepts, any algorithm, requests at any clock offsets: both fields
    /// parse as Structured Field lists of String Items with Integer parameters, `0 ≤ r ≤ q`,
    /// `w ≥ 1`, `t ≥ 0`, `r/t ≤ q/w`, and a refusal's `Retry-After` is at least 1, at least
    /// every listed `t`, and at least the limiter's own wait.
    #[test]
    fn headers_are_valid_and_consistent_for_any_quota(
        alg in alg_strategy(),
        permits in permits_strategy(),
        period in period_strategy(),
        burst in proptest::option::of(1..=u32::MAX),
        steps in proptest::collection::vec((0..=4u8, 0..=u64::MAX), 1..12),
    ) {
        let quota = build_quota(permits, period, burst);
        let clock = ManualClock::new();
        let Route { app, limiters } = one(alg, quota, &clock);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            for (requests, offset) in steps {
                // Offsets spread from a nanosecond to twice the period.
                clock.advance(Duration::from_nanos(offset % period.saturating_mul(2).max(1)));
                for _ in 0..=requests {
                    let a = call(&app).await;
                    check_answer(&a, || decide_now(&limiters[0]));
                }
            }
        });
    }
}

/// The same invariants at the corners the strategies might miss.
#[tokio::test]
async fn headers_are_valid_at_the_bounds() {
    let max = Quota::MAX_SPAN;
    let quotas = [
        quota(u32::MAX, Duration::from_nanos(1)),
        quota(1, Duration::from_nanos(1)),
        quota(1, max),
        quota(u32::MAX, max),
        quota(3, max).with_burst(2).unwrap(),
        quota(7, Duration::from_nanos(999_999_999)),
        quota(7, Duration::from_nanos(1_000_000_001)),
    ];
    for alg in ALGORITHMS {
        for q in quotas {
            let clock = ManualClock::new();
            let Route { app, limiters } = one(alg, q, &clock);
            for _ in 0..5 {
                let a = call(&app).await;
                check_answer(&a, || decide_now(&limiters[0]));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Honesty
// ---------------------------------------------------------------------------------------------

/// The advertised policy is honest: a client that reads `q` and `w` from the first response and
/// then spaces its requests `w/q` apart (rounded up to the clock's nanosecond) is never refused,
/// whatever the algorithm, for sub-second and odd periods, from several starting offsets.
///
/// The sliding counter admits any rate below its quota's but, at the first instant of a window,
/// weighs the whole previous window: a client at exactly `q/w` whose request falls on that
/// instant is refused there (next test). Its client here is one nanosecond slower per request.
#[tokio::test]
async fn a_client_pacing_itself_by_q_over_w_is_never_refused() {
    let quotas = [
        quota(5, ms(200)),
        quota(3, ms(1500)),
        quota(1, ms(1500)),
        quota(7, ms(300)),
        quota(2, ms(333)),
        quota(3, Duration::from_secs(1)),
        quota(10, Duration::from_nanos(1_000_000_001)),
        quota(13, ms(2_700)),
        quota(1, ms(1)),
        Quota::per_minute(7).unwrap(),
        quota(3, Duration::from_secs(1)).with_burst(1).unwrap(),
        quota(7, ms(300)).with_burst(1).unwrap(),
    ];
    let starts = [Duration::ZERO, ms(137), Duration::from_nanos(999_999_999)];
    for alg in ALGORITHMS {
        for q in quotas {
            for start in starts {
                let clock = ManualClock::new();
                let Route { app, .. } = one(alg, q, &clock);
                clock.advance(start);
                let first = call(&app).await;
                assert_eq!(first.status, StatusCode::OK);
                let (advertised, w) = first.qw("p");
                let slack = u64::from(alg == Alg::SlidingCounter);
                let spacing = Duration::from_nanos(
                    (w as u64 * 1_000_000_000).div_ceil(advertised as u64) + slack,
                );
                // Three windows' worth after the first request.
                for i in 1..=3 * advertised {
                    clock.advance(spacing);
                    let a = call(&app).await;
                    assert_eq!(
                        a.status,
                        StatusCode::OK,
                        "{alg:?} {q:?} from {start:?}: request {i} at q={advertised};w={w} refused"
                    );
                }
            }
        }
    }
}

/// The sliding counter's one exception to the test above: at exactly `q/w`, a request on the
/// first instant of a window, after a full previous window, is refused.
#[tokio::test]
async fn the_sliding_counter_refuses_a_client_at_exactly_q_over_w_only_on_a_window_boundary() {
    let clock = ManualClock::new();
    let Route { app, .. } = one(Alg::SlidingCounter, quota(5, ms(200)), &clock);
    let (q, w) = call(&app).await.qw("p");
    assert_eq!((q, w), (25, 1));
    let mut refused_at = Vec::new();
    for i in 1..=50u64 {
        clock.advance(ms(40));
        if call(&app).await.status == StatusCode::TOO_MANY_REQUESTS {
            refused_at.push(i * 40);
        }
    }
    // Every refusal falls on a window's first instant (every 200 ms from the limiter's start).
    assert!(!refused_at.is_empty());
    assert!(refused_at.iter().all(|at| at % 200 == 0), "{refused_at:?}");
}

/// The converse of the test above, where `q/w` is the quota's exact rate: a client that sends
/// one request more than `q` per `w` is refused within a few windows, so `q` is not lower than
/// it needs to be (the old `q=5;w=1` for 5 per 200 ms was a fifth of the real rate).
#[tokio::test]
async fn a_client_faster_than_q_over_w_is_refused() {
    for alg in ALGORITHMS {
        for q in [
            quota(5, ms(200)),
            quota(3, ms(1500)),
            Quota::per_second(10).unwrap(),
        ] {
            let clock = ManualClock::new();
            let Route { app, .. } = one(alg, q, &clock);
            let first = call(&app).await;
            let (advertised, w) = first.qw("p");
            let spacing = Duration::from_nanos(w as u64 * 1_000_000_000 / (advertised as u64 + 1));
            let mut refused = false;
            // GCRA spends its burst first: each request gains `w/q - w/(q+1)` on the bucket, so
            // the refusal comes within `q · (q + 1)` requests (a burst of `permits ≤ q`).
            for _ in 0..(advertised + 1) * (advertised + 2) {
                clock.advance(spacing);
                if call(&app).await.status == StatusCode::TOO_MANY_REQUESTS {
                    refused = true;
                    break;
                }
            }
            assert!(
                refused,
                "{alg:?} {q:?}: q={advertised};w={w} understates the rate"
            );
        }
    }
}

/// `r` and `t` are honest too: right after any admitted response, a client may send `r`
/// requests at once and none is refused.
#[tokio::test]
async fn r_requests_sent_at_once_are_admitted() {
    for alg in ALGORITHMS {
        for q in [
            quota(5, ms(200)),
            Quota::per_hour(1000).unwrap(),
            Quota::per_second(1).unwrap().with_burst(10).unwrap(),
            quota(3, ms(1500)),
        ] {
            let clock = ManualClock::new();
            let Route { app, .. } = one(alg, q, &clock);
            for round in 0..4 {
                clock.advance(ms(70 * round));
                let a = call(&app).await;
                if a.status != StatusCode::OK {
                    continue;
                }
                let (r, _) = a.rt("p").unwrap();
                for i in 0..r {
                    let b = call(&app).await;
                    assert_eq!(b.status, StatusCode::OK, "{alg:?} {q:?}: {i} of r={r}");
                }
            }
        }
    }
}
