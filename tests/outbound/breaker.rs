//! The circuit breaker's decisions, exact on a manual clock: it opens at its thresholds and not
//! below them, over a count or a time window; open, it fails fast without calling the
//! dependency and says until when; half-open probes close it or open it again; bad settings are
//! refused naming the setting; its events and metrics follow each transition.

use std::convert::identity;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::clock::{Clock, ManualClock, TokioClock};
use tower_bulwark::outbound::breaker::{
    Breaker, BreakerBuilder, BreakerOpen, BreakerState, Window,
};
use tower_bulwark::{outbound, BoxError};

/// A client whose request is the status the dependency answers with, and the count of calls
/// that reached the dependency.
pub(crate) type Client = BoxCloneService<u16, Response<()>, BoxError>;

/// `breaker` in front of a dependency answering each call with the status it is asked for;
/// the counter counts the calls that reached it.
pub(crate) fn answering(breaker: &Breaker) -> (Client, Arc<AtomicUsize>) {
    let reached = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&reached);
    let dependency = service_fn(move |status: u16| {
        seen.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(Response::builder().status(status).body(())?) }
    });
    (
        BoxCloneService::new(breaker.layer().layer(dependency)),
        reached,
    )
}

/// The breaker `partner` on `clock` with a window of the last `seconds`, opening once it holds
/// `minimum` calls.
fn time_window(clock: impl Clock, seconds: u32, minimum: u32) -> Breaker {
    Breaker::builder("partner")
        .window(Window::Seconds(seconds))
        .minimum_calls(minimum)
        .clock(clock)
        .build()
        .unwrap()
}

/// The breaker `partner` of [`builder`] on `clock` and `calls`, and an [`answering`] client
/// through it, with its counter.
fn answering_breaker(clock: &ManualClock, calls: u32) -> (Breaker, Client, Arc<AtomicUsize>) {
    let breaker = builder("partner", clock, calls).build().unwrap();
    let (client, reached) = answering(&breaker);
    (breaker, client, reached)
}

/// A breaker named `name` on `clock` with a count window of `calls`, all needed, and 2 probes.
pub(crate) fn builder(name: &str, clock: &ManualClock, calls: u32) -> BreakerBuilder {
    Breaker::builder(name)
        .window(Window::Calls(calls))
        .minimum_calls(calls)
        .half_open_calls(2)
        .clock(clock.clone())
}

/// The breaker `partner` of [`builder`] over `calls` calls on a new manual clock, `configure`d
/// further and built: the clock and the breaker.
pub(crate) fn partner_breaker(
    calls: u32,
    configure: impl FnOnce(BreakerBuilder) -> BreakerBuilder,
) -> (ManualClock, Breaker) {
    let clock = ManualClock::new();
    let breaker = configure(builder("partner", &clock, calls))
        .build()
        .unwrap();
    (clock, breaker)
}

/// Sends one call answering `status`, which must get through.
pub(crate) async fn through(client: &Client, status: u16) {
    let response = client.clone().oneshot(status).await.unwrap();
    assert_eq!(response.status(), status);
}

/// Sends one call, which must be refused; returns the refusal.
pub(crate) async fn refused(client: &Client) -> BreakerOpen {
    let err = client.clone().oneshot(200).await.unwrap_err();
    err.downcast_ref::<BreakerOpen>()
        .unwrap_or_else(|| panic!("not a BreakerOpen: {err}"))
        .clone()
}

/// The state of a breaker open until `secs` on its clock.
pub(crate) fn open_until(secs: f64) -> BreakerState {
    BreakerState::Open {
        until: Duration::from_secs_f64(secs),
    }
}

#[tokio::test]
async fn thirty_five_percent_failures_stay_below_a_fifty_percent_threshold() {
    let clock = ManualClock::new();
    let (breaker, client, reached) = answering_breaker(&clock, 20);
    // 7 failures in 20 calls, spread out, over and over: 35 %, never 50 %.
    for round in 0..5 {
        for i in 0..20 {
            through(&client, if i % 3 == 0 { 503 } else { 200 }).await;
        }
        assert_eq!(breaker.state(), BreakerState::Closed, "round {round}");
    }
    assert_eq!(reached.load(Ordering::SeqCst), 100);
}

#[tokio::test]
async fn it_opens_exactly_at_the_threshold_once_the_window_holds_minimum_calls() {
    let clock = ManualClock::new();
    let (breaker, client, _) = answering_breaker(&clock, 10);
    // Below `minimum_calls`, even nine failures in nine calls open nothing.
    for _ in 0..9 {
        through(&client, 503).await;
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    // Fresh breaker: 6 successes then 4 failures, 40 %; the next failure pushes the oldest
    // success out of the window of 10: 5 of 10, exactly 50 %.
    let (breaker, sliding, _) = answering_breaker(&clock, 10);
    for status in [200, 200, 200, 200, 200, 200, 503, 429, 504, 503] {
        through(&sliding, status).await;
    }
    assert_eq!(breaker.state(), BreakerState::Closed, "4 of 10");
    through(&sliding, 503).await;
    assert_eq!(breaker.state(), open_until(1.0), "5 of 10");
}

#[tokio::test]
async fn a_500_and_other_statuses_are_the_dependencys_answers_not_failures() {
    let clock = ManualClock::new();
    let (breaker, client, _) = answering_breaker(&clock, 4);
    for status in [500, 404, 400, 502, 500, 500] {
        through(&client, status).await;
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn slow_calls_open_it_at_the_slow_call_rate() {
    let breaker = Breaker::builder("partner")
        .window(Window::Calls(4))
        .minimum_calls(4)
        .slow_call_duration(Duration::from_secs(1))
        .slow_call_rate(0.5)
        .clock(TokioClock::new())
        .build()
        .unwrap();
    // A healthy dependency that takes the request's milliseconds to answer.
    let dependency = service_fn(|millis: u64| async move {
        tokio::time::sleep(Duration::from_millis(millis)).await;
        Ok::<_, BoxError>(Response::new(()))
    });
    let client = breaker.layer().layer(dependency);
    // Exactly the threshold is not slow; longer is.
    for millis in [1_000, 1_000, 1_001] {
        client.clone().oneshot(millis).await.unwrap();
    }
    assert_eq!(breaker.state(), BreakerState::Closed, "1 slow of 3");
    client.clone().oneshot(5).await.unwrap();
    assert_eq!(breaker.state(), BreakerState::Closed, "1 slow of 4");
    client.clone().oneshot(2_000).await.unwrap();
    // 3 001 + 5 + 2 000 ms have passed: open from then for 1 s.
    let opened_at = Duration::from_millis(1_000 + 1_000 + 1_001 + 5 + 2_000);
    assert_eq!(
        breaker.state(),
        BreakerState::Open {
            until: opened_at + Duration::from_secs(1)
        },
        "2 slow of 4"
    );
}

#[tokio::test]
async fn a_time_window_forgets_calls_older_than_its_seconds() {
    // A breaker of a 10 s window that saw three failures in second 0, its clock and client.
    let three_failed = || async {
        let clock = ManualClock::new();
        let breaker = time_window(clock.clone(), 10, 4);
        let (client, _) = answering(&breaker);
        for _ in 0..3 {
            through(&client, 503).await;
        }
        (clock, breaker, client)
    };
    // Three failures in second 0 are still in the window at 9.999 s: the fourth opens it.
    let (clock, breaker, client) = three_failed().await;
    clock.advance(Duration::from_millis(9_999));
    through(&client, 503).await;
    assert_eq!(breaker.state(), open_until(10.999));

    // At 10 s, second 0 has left the window: three more failures are three of three.
    let (clock, breaker, later) = three_failed().await;
    clock.advance(Duration::from_secs(10));
    for _ in 0..3 {
        through(&later, 503).await;
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    through(&later, 503).await;
    assert_eq!(breaker.state(), open_until(11.0));
}

#[tokio::test]
async fn open_it_fails_fast_without_the_dependency_and_says_until_when() {
    let (clock, breaker) = partner_breaker(2, |b| b.open_for(Duration::from_secs(30)));
    let (client, reached) = answering(&breaker);
    through(&client, 503).await;
    through(&client, 503).await;
    assert_eq!(breaker.state(), open_until(30.0));
    clock.advance(Duration::from_millis(12_500));
    for _ in 0..50 {
        let refusal = refused(&client).await;
        assert_eq!(refusal.retry_after(), Duration::from_millis(17_500));
        assert_eq!(refusal.breaker(), "partner");
    }
    assert_eq!(
        reached.load(Ordering::SeqCst),
        2,
        "no refused call reached it"
    );
    let err = client.clone().oneshot(200).await.unwrap_err();
    assert_eq!(
        outbound::retry_after(&*err),
        Some(Duration::from_millis(17_500))
    );
    assert_eq!(
        err.to_string(),
        "circuit breaker `partner` is open; next call in 17.5s"
    );
    // Until the last nanosecond.
    clock.advance(Duration::from_millis(17_500) - Duration::from_nanos(1));
    assert_eq!(
        refused(&client).await.retry_after(),
        Duration::from_nanos(1)
    );
    clock.advance(Duration::from_nanos(1));
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
}

#[tokio::test]
async fn successful_probes_close_it_with_an_empty_window_and_failed_ones_reopen_it() {
    let (clock, breaker) = partner_breaker(4, |b| b.half_open_calls(3));
    let (client, reached) = answering(&breaker);
    for _ in 0..4 {
        through(&client, 503).await;
    }
    clock.advance(Duration::from_secs(1));
    // One failed probe of three: a third, below the threshold.
    through(&client, 200).await;
    through(&client, 503).await;
    assert_eq!(breaker.state(), BreakerState::HalfOpen, "a probe is left");
    through(&client, 200).await;
    assert_eq!(breaker.state(), BreakerState::Closed);
    // The window starts empty: the four failures before are gone, three more open nothing.
    for _ in 0..3 {
        through(&client, 503).await;
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    through(&client, 503).await;
    assert_eq!(breaker.state(), open_until(2.0));

    // Two failed probes of three: open again, for `open_for` from the last probe's end.
    clock.advance(Duration::from_secs(1));
    through(&client, 503).await;
    through(&client, 200).await;
    clock.advance(Duration::from_millis(250));
    through(&client, 503).await;
    assert_eq!(breaker.state(), open_until(3.25));
    assert_eq!(reached.load(Ordering::SeqCst), 4 + 3 + 4 + 3);
}

#[tokio::test]
async fn calls_ignored_by_the_classifier_are_not_counted() {
    let (_, breaker) = partner_breaker(2, identity);
    // The dependency's own error that is neither a timeout nor a cut connection: no verdict.
    let dependency = service_fn(|fail: bool| async move {
        match fail {
            true => Err::<Response<()>, BoxError>("malformed request".into()),
            false => Ok(Response::builder().status(503).body(())?),
        }
    });
    let client = breaker.layer().layer(dependency);
    for _ in 0..10 {
        client.clone().oneshot(true).await.unwrap_err();
    }
    client.clone().oneshot(false).await.unwrap();
    assert_eq!(breaker.state(), BreakerState::Closed, "one counted call");
    client.clone().oneshot(false).await.unwrap();
    assert_eq!(breaker.state(), open_until(1.0));
}

#[test]
fn bad_settings_are_refused_naming_the_setting() {
    let base = || Breaker::builder("partner");
    let huge = Duration::from_nanos(1 << 60) + Duration::from_nanos(1);
    let cases: Vec<(BreakerBuilder, &str)> = vec![
        (base().window(Window::Calls(0)), "window_calls"),
        (base().window(Window::Calls(100_001)), "window_calls"),
        (base().window(Window::Seconds(0)), "window_seconds"),
        (base().window(Window::Seconds(u32::MAX)), "window_seconds"),
        (base().minimum_calls(0), "minimum_calls"),
        (base().minimum_calls(101), "minimum_calls"),
        (base().failure_rate(f64::NAN), "failure_rate"),
        (base().failure_rate(0.0), "failure_rate"),
        (base().failure_rate(-0.5), "failure_rate"),
        (base().failure_rate(1.000_001), "failure_rate"),
        (base().failure_rate(f64::INFINITY), "failure_rate"),
        (base().slow_call_rate(f64::NAN), "slow_call_rate"),
        (base().slow_call_rate(2.0), "slow_call_rate"),
        (
            base().slow_call_duration(Duration::ZERO),
            "slow_call_duration",
        ),
        (
            base().slow_call_duration(Duration::MAX),
            "slow_call_duration",
        ),
        (base().open_for(Duration::ZERO), "open_for"),
        (base().open_for(huge), "open_for"),
        (base().half_open_calls(0), "half_open_calls"),
    ];
    for (builder, setting) in cases {
        let shown = format!("{builder:?}");
        let err = builder.build().unwrap_err();
        assert_eq!(err.setting(), setting, "{shown}");
        assert!(err.to_string().contains(setting), "{err}");
    }
    // The bounds themselves are accepted.
    let longest = Duration::from_nanos(1 << 60);
    let edge = base()
        .window(Window::Seconds(100_000))
        .minimum_calls(u32::MAX)
        .failure_rate(1.0)
        .slow_call_rate(f64::MIN_POSITIVE)
        .slow_call_duration(longest)
        .open_for(longest)
        .half_open_calls(u32::MAX);
    edge.build().unwrap();
    let err = base().failure_rate(f64::NAN).build().unwrap_err();
    assert_eq!(
        err.to_string(),
        "circuit breaker: `failure_rate` must be above 0 and at most 1, got NaN"
    );
}

#[tokio::test]
async fn a_clock_at_the_end_of_time_keeps_it_open_without_wrapping() {
    let clock = ManualClock::new();
    clock.set(Duration::MAX);
    let breaker = builder("partner", &clock, 2)
        .open_for(Duration::from_nanos(1 << 60))
        .build()
        .unwrap();
    let (client, _) = answering(&breaker);
    through(&client, 503).await;
    through(&client, 503).await;
    let until = Duration::from_nanos((1 << 62) + (1 << 60));
    assert_eq!(breaker.state(), BreakerState::Open { until });
    assert_eq!(
        refused(&client).await.retry_after(),
        Duration::from_nanos(1 << 60)
    );
}

/// A clock the test sets to any reading, backwards too.
#[derive(Clone, Default)]
struct Jumpy(Arc<std::sync::atomic::AtomicU64>);

impl tower_bulwark::clock::Clock for Jumpy {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_clock_that_jumps_back_never_panics_nor_shortens_the_open_time() {
    let clock = Jumpy::default();
    let at = |secs: u64| clock.0.store(secs * 1_000_000_000, Ordering::SeqCst);
    let breaker = time_window(clock.clone(), 5, 3);
    let (client, _) = answering(&breaker);
    for secs in [100, 3, 50] {
        at(secs);
        through(&client, 503).await;
    }
    // Three failures, read at 100 s, 3 s and 50 s: the window holds them all, none panics.
    assert_eq!(breaker.state(), open_until(51.0));
    at(10);
    assert_eq!(
        refused(&client).await.retry_after(),
        Duration::from_secs(41)
    );
    at(51);
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
}
