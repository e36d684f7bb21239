//! A blind attack on the promises of the retry layer (its budget, its waits, cancellation) and
//! of the circuit breaker (its phases, its probes, its refusals), written from the docs only:
//! `src/guide.rs`, the module and item docs of `src/outbound/retry` and `src/outbound/breaker`.
//! Each test quotes the promise it checks; a test marked `BUG` fails on the code as it is.

use std::convert::identity;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tokio::sync::oneshot;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::clock::{ManualClock, TokioClock};
use tower_bulwark::outbound::breaker::{Breaker, BreakerOpen, BreakerState, Window};
use tower_bulwark::outbound::retry::Retry;
use tower_bulwark::{outbound, BoxError};

use crate::breaker::{answering, open_until, partner_breaker, refused, through};
use crate::breaker_probes::{held, open_then_half_open, Held};
use crate::common::{poll_once, refusal};
use crate::retry::{behind_an_opened_breaker, get, healthy_calls, retry, scripted};
use crate::retry_budget::{frozen, reserve_only};

/// A call through `client` admitted (polled once, inside the dependency) and the sender that
/// answers it.
async fn admitted(
    client: &Held,
) -> (
    oneshot::Sender<u16>,
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<()>, BoxError>> + Send>>,
) {
    let (answer, question) = oneshot::channel();
    let mut call = Box::pin(client.clone().ready_oneshot().await.unwrap().call(question));
    assert!(poll_once(call.as_mut()).is_pending(), "admitted");
    (answer, call)
}

/// Breaker docs, `src/outbound/breaker/builder.rs` (`half_open_calls`): "How many probe calls a
/// half-open breaker lets through (at least 1; default 10); their outcomes, all of them
/// counted, close it or open it again", and `failure_rate`: "at which failed probes open it
/// again". With the defaults (`minimum_calls` 20, 10 probes), `minimum_calls` is a rule of the
/// closed window: ten failed probes out of ten must open it again, and four of ten must not.
#[tokio::test]
async fn failed_probes_reopen_it_with_the_default_minimum_calls() {
    let clock = ManualClock::new();
    let breaker = Breaker::builder("partner")
        .clock(clock.clone())
        .build()
        .unwrap();
    let (client, _) = answering(&breaker);
    for _ in 0..20 {
        through(&client, 503).await;
    }
    assert_eq!(breaker.state(), open_until(1.0));
    clock.advance(Duration::from_secs(1));
    for _ in 0..10 {
        through(&client, 503).await;
    }
    assert_eq!(breaker.state(), open_until(2.0), "ten failed probes of ten");
    clock.advance(Duration::from_secs(1));
    for n in 0..10 {
        through(&client, if n < 4 { 503 } else { 200 }).await;
    }
    assert_eq!(breaker.state(), BreakerState::Closed, "four of ten");
}

/// `src/outbound/breaker/builder.rs` (`slow_call_rate`): "The share of slow calls ... at which
/// the breaker opens, and at which slow probes open it again"; slow is "longer than
/// `slow_call_duration`, on the breaker's clock". Two probes answering 200 after 2 s each, with
/// a slow-call duration of 1 s: the breaker opens again, though no probe failed.
#[tokio::test]
async fn slow_probes_open_it_again_though_they_succeed() {
    let (clock, breaker) = partner_breaker(2, |b| b.slow_call_duration(Duration::from_secs(1)));
    open_then_half_open(&breaker, &clock).await;
    let (probes, _) = held(&breaker);
    let (first, first_call) = admitted(&probes).await;
    let (second, second_call) = admitted(&probes).await;
    clock.advance(Duration::from_secs(2));
    first.send(200).unwrap();
    second.send(200).unwrap();
    assert_eq!(first_call.await.unwrap().status(), 200);
    assert_eq!(second_call.await.unwrap().status(), 200);
    assert_eq!(breaker.state(), open_until(4.0));
}

/// `src/outbound/breaker/mod.rs:78`: "A call admitted before a transition counts for nothing
/// after it (a call admitted while closed is no probe)." Two calls admitted while closed are
/// still in flight when the breaker opens and half-opens; they end 200 while the two probes are
/// out: the breaker stays half-open, the probes keep their places, and it is the probes' own
/// failures that decide (it opens again).
#[tokio::test]
async fn calls_admitted_while_closed_are_no_probes() {
    let (clock, breaker) = partner_breaker(2, identity);
    let (slow, reached) = held(&breaker);
    let (old_a, old_a_call) = admitted(&slow).await;
    let (old_b, old_b_call) = admitted(&slow).await;
    open_then_half_open(&breaker, &clock).await;
    let (probe_a, probe_a_call) = admitted(&slow).await;
    let (probe_b, probe_b_call) = admitted(&slow).await;
    old_a.send(200).unwrap();
    old_b.send(200).unwrap();
    old_a_call.await.unwrap();
    old_b_call.await.unwrap();
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    let (client, _) = answering(&breaker);
    assert_eq!(refused(&client).await.retry_after(), Duration::from_secs(1));
    probe_a.send(503).unwrap();
    probe_b.send(503).unwrap();
    probe_a_call.await.unwrap();
    probe_b_call.await.unwrap();
    assert_eq!(breaker.state(), open_until(2.0));
    assert_eq!(reached.load(Ordering::SeqCst), 4);
}

/// `src/outbound/breaker/error.rs:33`: `retry_after` is "How long from the refusal until the
/// breaker lets a call through: the rest of its open time, or, refused while the half-open
/// probes are out, `open_for`". With `open_for` of 7.25 s and the probe out for a while, every
/// refusal says exactly 7.25 s, and `outbound::retry_after` reads the same.
#[tokio::test]
async fn a_refusal_while_the_probes_are_out_says_open_for() {
    let clock = ManualClock::new();
    let open_for = Duration::from_millis(7_250);
    let breaker = Breaker::builder("partner")
        .window(Window::Calls(1))
        .half_open_calls(1)
        .open_for(open_for)
        .clock(clock.clone())
        .build()
        .unwrap();
    let (client, _) = answering(&breaker);
    through(&client, 503).await;
    clock.advance(open_for);
    let (probes, _) = held(&breaker);
    let (_probe, _probe_call) = admitted(&probes).await;
    for _ in 0..3 {
        clock.advance(Duration::from_millis(333));
        assert_eq!(refused(&client).await.retry_after(), open_for);
        let err = client.clone().oneshot(200).await.unwrap_err();
        assert_eq!(outbound::retry_after(&*err), Some(open_for));
    }
}

/// `src/outbound/retry/mod.rs:92`: a retry "stays withdrawn once it is handed to the service,
/// unless a layer of the crate below refuses it before sending it (a full bulkhead, a
/// pushback's hold): then it reached nothing and is given back"; guide: "an open breaker below
/// is never retried (the call fails fast, the budget untouched)". Retry over a breaker of one
/// call: the first attempt's 503 opens it, the retry meets `BreakerOpen` unsent, the dependency
/// is called once and the budget must hold what it held before the call.
#[tokio::test(start_paused = true)]
async fn a_retry_the_breaker_below_refuses_unsent_is_given_back() {
    let (dependency, calls) = scripted(vec![(503, vec![])]);
    let breaker = Breaker::builder("partner")
        .window(Window::Calls(1))
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let partner = retry()
        .budget(0.0, 1, Duration::from_secs(1))
        .build()
        .unwrap();
    assert_eq!(partner.budget_available(), 1);
    let client = partner.layer().layer(breaker.layer().layer(dependency));
    let outcome = client.oneshot(get()).await;
    assert_eq!(calls.count(), 1);
    assert!(matches!(breaker.state(), BreakerState::Open { .. }));
    match outcome {
        Ok(response) => assert_eq!(response.status(), 503),
        Err(err) => assert!(err.is::<BreakerOpen>(), "{err}"),
    }
    assert_eq!(
        partner.budget_available(),
        1,
        "the refused retry given back"
    );
}

/// `src/outbound/retry/mod.rs:94`: "A response future dropped during the backoff (or while the
/// service gets ready) gives that retry back and sends nothing more". The wait a `Retry-After`
/// asks comes before the backoff ("A retry waits what was asked, then a backoff"); a call
/// dropped during that wait has sent nothing either, so its retry must come back too.
#[tokio::test(start_paused = true)]
async fn dropped_while_waiting_out_retry_after() {
    let (dependency, calls) = scripted(vec![(429, vec![("retry-after", "3")])]);
    let partner = retry()
        .budget(1.0, 0, Duration::from_secs(10))
        .build()
        .unwrap();
    let mut call = Box::pin(partner.layer().layer(dependency).oneshot(get()));
    assert!(poll_once(call.as_mut()).is_pending());
    assert_eq!((calls.count(), partner.budget_available()), (1, 0));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(poll_once(call.as_mut()).is_pending());
    drop(call);
    assert_eq!(partner.budget_available(), 1);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(calls.count(), 1);
}

/// `src/outbound/retry/builder.rs:177`: `max_wait` is "The longest a retry waits for the time
/// an answer or a refusal asks for"; "When it asks for longer, no retry is made". A wait of
/// exactly `max_wait` is within it and is retried, not a moment early; with `max_wait` zero a
/// 429 naming no time asks one second (`mod.rs:31`) and is not retried, while a 503 naming no
/// time asks nothing and is.
#[tokio::test(start_paused = true)]
async fn a_wait_of_exactly_max_wait_is_made_and_zero_allows_only_no_wait() {
    let (dependency, calls) = scripted(vec![(429, vec![("retry-after", "5")])]);
    let partner = retry()
        .max_wait(Duration::from_secs(5))
        .backoff(Duration::ZERO, Duration::ZERO)
        .build()
        .unwrap();
    let response = partner.layer().layer(dependency).oneshot(get()).await;
    assert_eq!(response.unwrap().status(), 200);
    assert_eq!(calls.at(), [Duration::ZERO, Duration::from_secs(5)]);

    let zero = retry().max_wait(Duration::ZERO).build().unwrap();
    let (dependency, calls) = scripted(vec![(429, vec![])]);
    let response = zero.layer().layer(dependency).oneshot(get()).await;
    assert_eq!(
        (response.unwrap().status().as_u16(), calls.count()),
        (429, 1)
    );
    let (dependency, calls) = scripted(vec![(503, vec![])]);
    let response = zero.layer().layer(dependency).oneshot(get()).await;
    assert_eq!(
        (response.unwrap().status().as_u16(), calls.count()),
        (200, 2)
    );
}

/// `src/outbound/retry/mod.rs:48`: "a call makes at most [`max_attempts`] attempts (default 3)";
/// guide: "attempts stop at `max_attempts`". A pushback below that the dependency keeps
/// renewing (a 429 with `Retry-After: 1` every half second, seen on other calls) refuses each
/// retry unsent; whatever the retry layer does with such refusals (given back to the budget),
/// one call must not pass more than `max_attempts` attempts to the layers below, nor run on
/// forever.
#[tokio::test(start_paused = true)]
async fn a_pushback_renewed_forever_does_not_make_a_call_loop() {
    use tower_bulwark::outbound::PushedBack;
    let (dependency, calls) = scripted(vec![]);
    let pushback = crate::hostile_support::on_tokio_clock();
    let limited = Response::builder()
        .status(429)
        .header("retry-after", "1")
        .body(())
        .unwrap();
    pushback.observe(&limited);
    let renewing = pushback.clone();
    let renewer = tokio::spawn(async move {
        loop {
            renewing.observe(&limited);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let passed = Arc::new(AtomicUsize::new(0));
    let below = pushback.layer().layer(dependency);
    let counted = Arc::clone(&passed);
    let counting = service_fn(move |request| {
        counted.fetch_add(1, Ordering::SeqCst);
        below.clone().oneshot(request)
    });
    let partner = retry().max_attempts(2).build().unwrap();
    let client = partner.layer().layer(counting);
    let outcome = tokio::time::timeout(Duration::from_secs(600), client.oneshot(get())).await;
    renewer.abort();
    let attempts = passed.load(Ordering::SeqCst);
    let outcome = outcome.unwrap_or_else(|_| panic!("still running after 600 s, {attempts} tries"));
    assert!(outcome.unwrap_err().is::<PushedBack>());
    assert_eq!((attempts, calls.count()), (2, 0));
}

/// `src/outbound/retry/mod.rs:27`: "a retry never leaves before the answer's `Retry-After`
/// (delta-seconds, decimal seconds or an HTTP-date), `retry-after-ms`, ..., the window of a
/// quota it says is spent (all read as the pushback reads them ...)". A 429 whose
/// `X-RateLimit-*` or draft-11 `RateLimit` fields say the quota is spent for 4 s, with no
/// `Retry-After`; a 503 whose quota says 7 s and `Retry-After` 2 s (the longer counts);
/// `Retry-After: 1.5`. `max_wait` 10 s, backoff zero, so each retry leaves exactly when asked.
#[tokio::test(start_paused = true)]
async fn a_retry_waits_for_the_window_of_a_spent_quota() {
    type Case = (u16, Vec<(&'static str, &'static str)>, Duration);
    let cases: [Case; 4] = [
        (
            429,
            vec![("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "4")],
            Duration::from_secs(4),
        ),
        (
            429,
            vec![
                ("ratelimit", "\"default\";r=0;t=4"),
                ("ratelimit-policy", "\"default\";q=10;w=60"),
            ],
            Duration::from_secs(4),
        ),
        (
            503,
            vec![
                ("retry-after", "2"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "7"),
            ],
            Duration::from_secs(7),
        ),
        (
            503,
            vec![("retry-after", "1.5")],
            Duration::from_millis(1500),
        ),
    ];
    for (status, headers, wait) in cases {
        let shown = format!("{status} {headers:?}");
        let (dependency, calls) = scripted(vec![(status, headers)]);
        let partner = retry()
            .backoff(Duration::ZERO, Duration::ZERO)
            .max_wait(Duration::from_secs(10))
            .build()
            .unwrap();
        let response = partner.layer().layer(dependency).oneshot(get()).await;
        assert_eq!(response.unwrap().status(), 200, "{shown}");
        assert_eq!(calls.at(), [Duration::ZERO, wait], "{shown}");
    }
}

/// `src/outbound/retry` module docs: "a retry counts from when it is granted, through its wait
/// (which may be longer than the window), until at least `window` after it is sent"; a retry
/// dropped unsent is cancelled. A call is granted its retry at 0 s and waits out a
/// `Retry-After` of 100 s: a window later it still counts, so ten failing calls get nine
/// retries; the old call is then dropped, and its retry comes back once: an eleventh failing
/// call gets one retry, and the budget is empty again. (While a withdrawal expired with its
/// slot, the waiting retry stopped counting at 10 s.)
#[tokio::test(start_paused = true)]
async fn a_waiting_retry_counts_until_it_is_sent_and_comes_back_once_when_dropped() {
    let clock = ManualClock::new();
    let partner = reserve_only(&clock, 1, Duration::from_secs(10), 2)
        .max_wait(Duration::from_secs(3600))
        .build()
        .unwrap();
    let (waiting, _) = scripted(vec![(429, vec![("retry-after", "100")])]);
    let mut old = Box::pin(partner.layer().layer(waiting).oneshot(get()));
    assert!(poll_once(old.as_mut()).is_pending());
    assert_eq!(partner.budget_available(), 9);
    clock.advance(Duration::from_secs(10));
    assert_eq!(
        partner.budget_available(),
        9,
        "the waiting retry still counts"
    );
    let (failing, calls) = scripted(vec![(503, vec![]); 100]);
    let client = partner.layer().layer(failing);
    for _ in 0..10 {
        client.clone().oneshot(get()).await.unwrap();
    }
    assert_eq!((calls.count(), partner.budget_available()), (19, 0));
    drop(old);
    assert_eq!(partner.budget_available(), 1, "the dropped retry came back");
    client.clone().oneshot(get()).await.unwrap();
    assert_eq!((calls.count(), partner.budget_available()), (21, 0));
    client.oneshot(get()).await.unwrap();
    assert_eq!(calls.count(), 22, "no retry beyond the floor");
}

/// `src/outbound/breaker/mod.rs:61`: "Once the window holds at least `minimum_calls`, the
/// breaker opens as soon as the share of failures reaches `failure_rate`". Five failures then
/// five successes in a window of ten (minimum ten): the tenth call, a success, fills the window
/// at a share of 0.5, so it opens then, not at some later failure.
#[tokio::test]
async fn a_success_that_fills_the_window_at_the_threshold_opens_it() {
    let (_, breaker) = partner_breaker(10, identity);
    let (client, _) = answering(&breaker);
    for _ in 0..5 {
        through(&client, 503).await;
    }
    for _ in 0..4 {
        through(&client, 200).await;
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    through(&client, 200).await;
    assert_eq!(breaker.state(), open_until(1.0));
}

/// An error of a layer of the user's that keeps the error below as its source.
#[derive(Debug)]
struct Wrapped(BoxError);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "through a layer of ours: {}", self.0)
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// `src/outbound/retry/mod.rs:23`: "Nor is an open circuit breaker's [`BreakerOpen`], though it
/// names one: the breaker fails calls fast on purpose"; guide: "an open breaker below is never
/// retried (the call fails fast, the budget untouched)". The retry layer finds waits anywhere
/// in an error's chain (`outbound::retry_after`: "if `err` (or an error in its source chain)
/// is a refusal"), so a `BreakerOpen` wrapped by a layer of the user's between the two must be
/// recognised as well: one attempt, at once, the budget untouched.
#[tokio::test(start_paused = true)]
async fn a_wrapped_breaker_refusal_is_not_retried_either() {
    let (below, calls) =
        behind_an_opened_breaker(|breaker| breaker.open_for(Duration::from_secs(2))).await;
    let wrapping = below.map_err(|err: BoxError| -> BoxError { Box::new(Wrapped(err)) });
    let partner = retry().build().unwrap();
    let start = tokio::time::Instant::now();
    let err = refusal(&partner.layer().layer(wrapping), get()).await;
    assert!(err.is::<Wrapped>(), "{err}");
    let waited = start.elapsed();
    assert_eq!(
        (calls.count(), waited, partner.budget_available()),
        (2, Duration::ZERO, 30),
        "{err}"
    );
}

/// `src/outbound/breaker/mod.rs:66`: half-open, "exactly `half_open_calls` probes are let
/// through, whoever races for them, and the other calls fail at once. When all the probes have
/// ended, the breaker opens again ... or closes". Probes, not places: with two probes, one out
/// and one already ended (200), a third call is refused, not let into the ended probe's place;
/// when the one out fails, the two probes' rate (0.5) opens it again.
#[tokio::test]
async fn an_ended_probe_does_not_free_its_place() {
    let (clock, breaker) = partner_breaker(2, identity);
    let (client, reached) = answering(&breaker);
    through(&client, 503).await;
    through(&client, 503).await;
    clock.advance(Duration::from_secs(1));
    let (probes, _) = held(&breaker);
    let (out, out_call) = admitted(&probes).await;
    through(&client, 200).await;
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    for _ in 0..5 {
        refused(&client).await;
    }
    assert_eq!(reached.load(Ordering::SeqCst), 3);
    out.send(503).unwrap();
    out_call.await.unwrap();
    assert_eq!(breaker.state(), open_until(2.0));
}

/// `src/outbound/retry/budget.rs:11` (module docs): "over any stretch of time, retries are at
/// most `ratio` times the first attempts plus the reserve once for each window the stretch
/// spans"; guide: "200 calls on clones racing for L retries get exactly L". Here the clock
/// moves while four threads race: a floor of 5 retries a second over a window of one second
/// (a reserve of 5), no deposits, the clock moved 100 ms at a time for 5 s while every call
/// fails and wants retries. The 5 s span at most six windows: at most 30 retries, whatever the
/// interleaving.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn threads_racing_while_the_clock_moves_never_exceed_the_floor() {
    let clock = ManualClock::new();
    let window = Duration::from_secs(1);
    let partner = reserve_only(&clock, 5, window, 10).build().unwrap();
    let (failing, attempts) = scripted(vec![(503, vec![]); 1_000_000]);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (client, done, calls) = (
            partner.layer().layer(failing.clone()),
            done.clone(),
            calls.clone(),
        );
        racers.spawn(async move {
            while !done.load(Ordering::Relaxed) {
                calls.fetch_add(1, Ordering::Relaxed);
                client.clone().oneshot(get()).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
    }
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        clock.advance(Duration::from_millis(100));
    }
    done.store(true, Ordering::Relaxed);
    while let Some(racer) = racers.join_next().await {
        racer.unwrap();
    }
    let (calls, attempts) = (calls.load(Ordering::SeqCst), attempts.count());
    let retries = attempts - calls;
    assert!(calls > 100, "{calls} calls raced");
    assert!(retries <= 30, "{retries} retries for {calls} calls");
    assert!(retries >= 20, "{retries} retries: the floor was granted");
}

/// Guide, retries: "every setting out of range (NaN included) is refused by `build`, in code
/// or in `[retries.NAME]`, naming it"; `src/config/mod.rs` (the table of `[retries.NAME]`);
/// guide, breaker: "every setting out of range ..., in code or in `[breakers.NAME]`, is refused
/// naming it". Values the existing tests do not try (integers beyond `u32`, negative counts,
/// both windows, the largest windows plus one, unknown fields): each is refused with the path
/// of its field, none panics.
#[cfg(feature = "config")]
#[test]
fn bad_retry_and_breaker_tables_are_refused_naming_the_field() {
    use tower_bulwark::config::Registry;
    // Each line names the field it sets first: the error must name it.
    let retries: [&str; 21] = [
        "max_attempts = 0",
        "max_attempts = 11",
        "max_attempts = -1",
        "max_attempts = 4294967297",
        "max_attempts = 2.5",
        "base = \"2h\"",
        "cap = \"2h\"",
        "base = \"-1s\"",
        "max_wait = \"3601s\"",
        "max_wait = \"99999999999999999999s\"",
        "ratio = nan",
        "ratio = inf",
        "ratio = -inf",
        "ratio = 10.000001",
        "ratio = \"0.2\"",
        "min_per_second = -1",
        "min_per_second = 4294967296",
        "window = \"9ms\"",
        "window = \"3600001ms\"",
        "window = 10",
        "max_attempt = 3",
    ];
    let breakers: [&str; 6] = [
        "window_seconds = 100001",
        "window_seconds = 0",
        "window_calls = 100001",
        "minimum_calls = 4294967296",
        "half_open_calls = -3",
        "open_for = \"1152921504606846977ns\"",
    ];
    let cases = (retries.iter().map(|line| ("retries", line)))
        .chain(breakers.iter().map(|line| ("breakers", line)));
    for (table, body) in cases {
        let field = body.split(' ').next().unwrap();
        let text = format!("[{table}.partner]\n{body}\n");
        let err = Registry::from_toml_str(&text).unwrap_err();
        assert!(
            err.path().starts_with(&format!("{table}.partner")) && err.to_string().contains(field),
            "{table}: {body}: {} / {err}",
            err.path()
        );
    }
    let both = "[breakers.partner]\nwindow_calls = 10\nwindow_seconds = 10\n";
    let err = Registry::from_toml_str(both).unwrap_err();
    assert!(err.path().starts_with("breakers.partner"), "{err}");
    // The largest accepted values build.
    let largest = "[breakers.partner]\nwindow_seconds = 100000\nminimum_calls = 4294967295\n\
                   open_for = \"1152921504606846976ns\"\nhalf_open_calls = 4294967295\n\
                   [retries.partner]\nmax_attempts = 10\nbase = \"1h\"\ncap = \"1h\"\n\
                   max_wait = \"1h\"\nratio = 10\nmin_per_second = 4294967295\nwindow = \"1h\"\n";
    let registry = Registry::from_toml_str(largest).unwrap();
    registry.breaker("partner").unwrap();
    let retries = registry.retry("partner").unwrap();
    assert_eq!(retries.budget_available(), u64::from(u32::MAX) * 3600);
}

/// `src/outbound/breaker/builder.rs:28`: a time window counts "the current whole second since
/// the clock's origin and the `n − 1` before it". A window of three seconds and a minimum of two:
/// one failure each at 0 s, 3 s, 6 s, ..., 3 000 003 s (each second a multiple of the window,
/// the same place in a ring of three) never holds two calls, so it never opens; one more in the
/// same second opens it.
#[tokio::test]
async fn a_time_window_forgets_a_second_exactly_a_window_apart() {
    let (clock, breaker) = partner_breaker(2, |b| b.window(Window::Seconds(3)));
    let (client, _) = answering(&breaker);
    for second in (0..30).map(|n| n * 3).chain([3_000_003]) {
        clock.set(Duration::from_secs(second));
        through(&client, 503).await;
        assert_eq!(breaker.state(), BreakerState::Closed, "at {second} s");
    }
    through(&client, 503).await;
    assert!(matches!(breaker.state(), BreakerState::Open { .. }));
}

/// `src/outbound/breaker/mod.rs:68`: "When all the probes have ended, the breaker ... closes
/// ..., with an empty window" (guide: "it closes with an empty window"), with a time window:
/// the failures of the second that opened it are forgotten on closing. Two failures at 0.1 s
/// open it; a probe at 1.2 s closes it; one failure at 1.5 s is alone in the window (below the
/// minimum of two), so it stays closed.
#[tokio::test]
async fn a_time_window_is_empty_after_closing() {
    let (clock, breaker) = partner_breaker(2, |b| b.window(Window::Seconds(10)).half_open_calls(1));
    let (client, _) = answering(&breaker);
    clock.set(Duration::from_millis(100));
    through(&client, 503).await;
    through(&client, 503).await;
    clock.set(Duration::from_millis(1_200));
    through(&client, 200).await;
    assert_eq!(breaker.state(), BreakerState::Closed);
    clock.set(Duration::from_millis(1_500));
    through(&client, 503).await;
    assert_eq!(breaker.state(), BreakerState::Closed);
}

/// `src/outbound/retry/mod.rs:37`: each call deposits `ratio` of a retry, "counted to the
/// millionth in integers, so that five calls make exactly one retry"; `budget.rs:4`: "never a
/// little more (tower's budget rounds a fractional percentage up and grants more than asked,
/// tower#857)". A ratio of 0.3333331: three calls deposit 0.9999993 of a retry, less than one,
/// so the budget (no floor) holds no retry; rounded up to 0.333334 it would hold one. A
/// millionth less than a retry per call is never a retry either, however many calls.
#[tokio::test(start_paused = true)]
async fn a_ratio_between_millionths_never_grants_more_than_asked() {
    let clock = ManualClock::new();
    let budget = |ratio: f64| {
        Retry::builder("partner")
            .clock(clock.clone())
            .budget(ratio, 0, Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let partner = budget(0.333_333_1);
    healthy_calls(&partner, 3).await;
    assert_eq!(partner.budget_available(), 0, "0.9999993 of a retry");
    let partner = budget(0.000_000_4);
    healthy_calls(&partner, 1_000).await;
    assert_eq!(partner.budget_available(), 0, "0.0004 of a retry");
}

/// Guide, retries: "the largest settings count without overflow"; guide, time: "Clock readings
/// beyond 2^62 ns ... are taken as 2^62 ns: time stands still there and every limit keeps
/// holding"; breaker: "a clock at the end of time keeps it open without wrapping". The budget on
/// a clock at `u64::MAX` ns, with the largest window: calls deposit, failing calls take exactly
/// the retries held, nothing panics or wraps.
#[tokio::test(start_paused = true)]
async fn the_budget_at_the_end_of_time_neither_panics_nor_over_grants() {
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(u64::MAX - 1));
    let partner = frozen(&clock)
        .max_attempts(2)
        .budget(0.5, 0, Duration::from_secs(3600))
        .build()
        .unwrap();
    healthy_calls(&partner, 10).await;
    assert_eq!(partner.budget_available(), 5);
    clock.advance(Duration::MAX);
    let (failing, calls) = scripted(vec![(503, vec![]); 100]);
    let client = partner.layer().layer(failing);
    for _ in 0..20 {
        client.clone().oneshot(get()).await.unwrap();
    }
    // 5 held, and 20 × 0.5 deposited as the failing calls came: 15 retries, no more.
    assert_eq!(calls.count(), 20 + 15);
    assert_eq!(partner.budget_available(), 0);
}
