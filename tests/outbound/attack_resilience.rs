//! A blind attack on the promises of the retry layer (its budget, its waits, cancellation) and
//! of the circuit breaker (its phases, its probes, its refusals), written from the docs only:
//! `src/guide.rs`, the module and item docs of `src/outbound/retry` and `src/outbound/breaker`.
//! Each test quotes the promise it checks; a test marked `BUG` fails on the code as it is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tokio::sync::oneshot;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::clock::{ManualClock, TokioClock};
use tower_bulwark::outbound::breaker::{Breaker, BreakerOpen, BreakerState, Window};
use tower_bulwark::{outbound, BoxError};

use crate::breaker::{answering, refused, through};
use crate::common::poll_once;
use crate::retry::{get, retry, scripted};

/// A client whose every call is answered when the test sends its status on the call's channel.
type Held = BoxCloneService<oneshot::Receiver<u16>, Response<()>, BoxError>;

fn held(breaker: &Breaker) -> (Held, Arc<AtomicUsize>) {
    let reached = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&reached);
    let dependency = service_fn(move |answer: oneshot::Receiver<u16>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let status = answer.await?;
            Ok::<_, BoxError>(Response::builder().status(status).body(())?)
        }
    });
    (
        BoxCloneService::new(breaker.layer().layer(dependency)),
        reached,
    )
}

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
    assert_eq!(
        breaker.state(),
        BreakerState::Open {
            until: Duration::from_secs(1)
        }
    );
    clock.advance(Duration::from_secs(1));
    for _ in 0..10 {
        through(&client, 503).await;
    }
    assert_eq!(
        breaker.state(),
        BreakerState::Open {
            until: Duration::from_secs(2)
        },
        "ten failed probes of ten"
    );
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
    let clock = ManualClock::new();
    let breaker = Breaker::builder("partner")
        .window(Window::Calls(2))
        .minimum_calls(2)
        .half_open_calls(2)
        .slow_call_duration(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let (client, _) = answering(&breaker);
    through(&client, 503).await;
    through(&client, 503).await;
    clock.advance(Duration::from_secs(1));
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    let (probes, _) = held(&breaker);
    let (first, first_call) = admitted(&probes).await;
    let (second, second_call) = admitted(&probes).await;
    clock.advance(Duration::from_secs(2));
    first.send(200).unwrap();
    second.send(200).unwrap();
    assert_eq!(first_call.await.unwrap().status(), 200);
    assert_eq!(second_call.await.unwrap().status(), 200);
    assert_eq!(
        breaker.state(),
        BreakerState::Open {
            until: Duration::from_secs(4)
        }
    );
}

/// `src/outbound/breaker/mod.rs:78`: "A call admitted before a transition counts for nothing
/// after it (a call admitted while closed is no probe)." Two calls admitted while closed are
/// still in flight when the breaker opens and half-opens; they end 200 while the two probes are
/// out: the breaker stays half-open, the probes keep their places, and it is the probes' own
/// failures that decide (it opens again).
#[tokio::test]
async fn calls_admitted_while_closed_are_no_probes() {
    let clock = ManualClock::new();
    let breaker = Breaker::builder("partner")
        .window(Window::Calls(2))
        .minimum_calls(2)
        .half_open_calls(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    let (slow, reached) = held(&breaker);
    let (old_a, old_a_call) = admitted(&slow).await;
    let (old_b, old_b_call) = admitted(&slow).await;
    let (client, _) = answering(&breaker);
    through(&client, 503).await;
    through(&client, 503).await;
    clock.advance(Duration::from_secs(1));
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    let (probe_a, probe_a_call) = admitted(&slow).await;
    let (probe_b, probe_b_call) = admitted(&slow).await;
    old_a.send(200).unwrap();
    old_b.send(200).unwrap();
    old_a_call.await.unwrap();
    old_b_call.await.unwrap();
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    assert_eq!(refused(&client).await.retry_after(), Duration::from_secs(1));
    probe_a.send(503).unwrap();
    probe_b.send(503).unwrap();
    probe_a_call.await.unwrap();
    probe_b_call.await.unwrap();
    assert_eq!(
        breaker.state(),
        BreakerState::Open {
            until: Duration::from_secs(2)
        }
    );
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

/// `src/outbound/retry/builder.rs:161`: backoff "at most `cap` (`base` at most `cap`, `cap` at
/// most an hour)", and `max_attempts` "from 1 to 10". At the extremes (ten attempts, `base` and
/// `cap` an hour, `Retry-After` of an hour with `max_wait` an hour), nothing overflows: ten
/// attempts, each gap at least the hour asked and at most two hours.
#[tokio::test(start_paused = true)]
async fn the_largest_settings_wait_within_their_bounds() {
    let hour = Duration::from_secs(3600);
    let (dependency, calls) = scripted(vec![(429, vec![("retry-after", "3600")]); 10]);
    let partner = retry()
        .max_attempts(10)
        .backoff(hour, hour)
        .max_wait(hour)
        .budget(10.0, 1, hour)
        .build()
        .unwrap();
    let response = partner.layer().layer(dependency).oneshot(get()).await;
    assert_eq!(response.unwrap().status(), 429);
    let at = calls.at();
    assert_eq!(at.len(), 10);
    for pair in at.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= hour && gap <= 2 * hour, "{at:?}");
    }
}
