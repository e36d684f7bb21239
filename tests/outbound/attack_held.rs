//! Attacks on held outbound calls: many tasks waiting through one `Pushback` and one
//! `ClientQuotaLayer`, waiters dropped half-way, newer and older answers arriving while calls
//! wait, and the exact instants at which held calls reach the dependency. Time is tokio's
//! paused timer (or a `ManualClock` where nothing waits); no test sleeps to pass.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Response;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::clock::{Clock, ManualClock};
use tower_bulwark::outbound::pushback::Pacing;
use tower_bulwark::outbound::{self, ClientQuotaLayer, Pushback, PushedBack, QuotaExhausted};
use tower_bulwark::{BoxError, Quota};

use super::hostile_support::{
    answer_call, on_tokio_clock_with, scripted_client, spent_for_a_second_under, start,
    tokio_waiting_up_to,
};
use crate::common::{direct_on, in_bursts_of, quota_ns, response, tokio_direct};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// When each call reached the dependency, as offsets from the test's start.
type Arrivals = Arc<Mutex<Vec<Instant>>>;

/// What a spawned call came to: when it ended, and how.
type Ended<T> = JoinHandle<(Instant, Result<T, BoxError>)>;

/// A dependency that records when each call reaches it and never answers: every call sent stays
/// in flight, so no answer changes what the pushback knows.
fn parked<R: Send + 'static>(
    arrivals: Arrivals,
) -> impl Service<R, Response = Response<()>, Error = BoxError, Future: Send> + Clone {
    service_fn(move |_: R| {
        arrivals.lock().unwrap().push(Instant::now());
        std::future::pending::<Result<Response<()>, BoxError>>()
    })
}

/// A client through `pushback` to a [`parked`] dependency of its own, and the arrivals that
/// dependency records.
fn parked_behind<R: Send + 'static, C: Clock + Clone + Send + Sync + 'static>(
    pushback: &Pushback<C>,
) -> (
    impl Service<R, Response = Response<()>, Error = BoxError, Future: Send> + Clone + Send + 'static,
    Arrivals,
) {
    let arrivals = Arrivals::default();
    let client = pushback.layer().layer(parked(arrivals.clone()));
    (client, arrivals)
}

/// The arrivals as offsets from `start`.
fn offsets(arrivals: &Arrivals, start: Instant) -> Vec<Duration> {
    let arrivals = arrivals.lock().unwrap();
    arrivals.iter().map(|at| at.duration_since(start)).collect()
}

/// Spawns `n` calls of `request` through `client`, all at once.
fn flood<S, R, T>(client: &S, n: usize, request: impl Fn(usize) -> R) -> Vec<Ended<T>>
where
    S: Service<R, Response = T, Error = BoxError, Future: Send> + Clone + Send + 'static,
    R: Send + 'static,
    T: Send + 'static,
{
    (0..n)
        .map(|i| {
            let call = client.clone().oneshot(request(i));
            tokio::spawn(async move {
                let result = call.await;
                (Instant::now(), result)
            })
        })
        .collect()
}

/// The calls of `tasks` that ended in a refusal of type `E`, as (when, retry_after) from
/// `start`; the calls still at the dependency are dropped. Panics on any other ending.
async fn refusals<E, T>(tasks: Vec<Ended<T>>, start: Instant) -> Vec<(Duration, Duration)>
where
    E: std::error::Error + 'static,
{
    let mut refused = Vec::new();
    for task in tasks {
        if !task.is_finished() {
            task.abort();
            continue;
        }
        let (at, result) = task.await.unwrap();
        let err = result.err().expect("no call is answered");
        assert!(err.is::<E>(), "{err}");
        let wait = outbound::retry_after(&*err).unwrap();
        refused.push((at.duration_since(start), wait));
    }
    refused
}

/// `n` of `at`.
fn times(n: usize, at: Duration) -> Vec<Duration> {
    vec![at; n]
}

/// `n` refusals at `at` (from the start), each telling `told` to wait, as [`refusals`] gives them.
fn refused_at(n: usize, at: Duration, told: Duration) -> Vec<(Duration, Duration)> {
    vec![(at, told); n]
}

/// "then the `q` calls of the policy of the same name (less those still in flight) may start
/// within its `w`" and "A held call fails at once with [`PushedBack`], which carries the time
/// until a call may actually go [...] past windows that give nothing, or the probe"
/// (src/outbound/pushback/mod.rs:86-87, 108-111).
///
/// Fifty tasks wait (`max_wait` 5 s) on a spent window that ends at 1 s under a policy of 5
/// per 10 s. When it ends, exactly 5 reach the dependency; the 5 stay in flight, so every
/// window after gives nothing and the others are told the probe: `max_hold` after the last
/// start.
#[tokio::test(start_paused = true)]
async fn fifty_waiters_on_a_spent_window_get_exactly_the_next_windows_q() {
    let pushback = tokio_waiting_up_to(S(5));
    let (client, arrivals) = parked_behind(&pushback);
    pushback.observe(&spent_for_a_second_under(r#""p";q=5;w=10"#));
    let start = Instant::now();
    let tasks = flood(&client, 50, |_| ());
    tokio::time::sleep(S(3)).await;
    assert_eq!(offsets(&arrivals, start), times(5, S(1)));
    let refused = refusals::<PushedBack, _>(tasks, start).await;
    assert_eq!(refused, refused_at(45, S(1), super::DEFAULT_MAX_HOLD));
}

/// "A policy whose `q` is zero [...] gives nothing in any window until something new is heard:
/// then calls are held for `max_hold` from the last answer or call, and one call goes (a
/// probe)" (src/outbound/pushback/mod.rs:92-95).
///
/// Fifty tasks wait up to 90 s on a dependency that grants nothing (`max_hold` 60 s): exactly
/// one reaches it, at 60 s; the next probe is 60 s after that start, past every waiter's
/// `max_wait`, so the others are refused then, told 60 s.
#[tokio::test(start_paused = true)]
async fn fifty_waiters_on_a_quota_of_nothing_send_exactly_one_probe() {
    let pushback = on_tokio_clock_with(|builder| builder.max_hold(S(60)).max_wait(S(90)));
    let (client, arrivals) = parked_behind(&pushback);
    pushback.observe(&spent_for_a_second_under(r#""p";q=0;w=10"#));
    let start = Instant::now();
    let tasks = flood(&client, 50, |_| ());
    tokio::time::sleep(S(200)).await;
    assert_eq!(offsets(&arrivals, start), [S(60)]);
    let refused = refusals::<PushedBack, _>(tasks, start).await;
    assert_eq!(refused, refused_at(49, S(60), S(60)));
}

/// "it waits on tokio's timer [...] and is sent when the hold ends (a newer answer may end it
/// sooner)" (src/outbound/pushback/mod.rs:111-113), and "without a policy, calls go freely until
/// the next answer" (mod.rs:87-88).
///
/// Fifty tasks wait on a spent 10 s window; at 1 s an answer obtained elsewhere (newer than
/// every call) says 5 are left for 10 s: exactly 5 go at 1 s, and the 45 others at 11 s, when
/// that window ends, not at 10 s (the old window's end) nor before.
#[tokio::test(start_paused = true)]
async fn a_newer_answer_frees_exactly_its_calls_among_fifty_waiters() {
    let pushback = tokio_waiting_up_to(S(20));
    let (client, arrivals) = parked_behind(&pushback);
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=0;t=10"#)]));
    let start = Instant::now();
    let tasks = flood(&client, 50, |_| ());
    tokio::time::sleep(S(1)).await;
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=5;t=10"#)]));
    tokio::time::sleep(S(15)).await;
    let mut expected = times(5, S(1));
    expected.extend(times(45, S(11)));
    assert_eq!(offsets(&arrivals, start), expected);
    assert!(refusals::<PushedBack, _>(tasks, start).await.is_empty());
}

/// "It never loosens or shortens a hold" (src/outbound/pushback/mod.rs:103) and "is sent when
/// the hold ends" (mod.rs:112-113).
///
/// Fifty waiters on a `Retry-After: 2`: at 200 ms a `Retry-After: 1` (shorter) changes nothing,
/// at 500 ms a `Retry-After: 3` moves the end to 3.5 s, within `max_wait`: all fifty reach the
/// dependency at 3.5 s exactly.
#[tokio::test(start_paused = true)]
async fn fifty_waiters_go_at_the_latest_retry_after_exactly() {
    let pushback = tokio_waiting_up_to(S(5));
    let (client, arrivals) = parked_behind(&pushback);
    let start = Instant::now();
    pushback.observe(&response(429, &[("retry-after", "2")]));
    let tasks = flood(&client, 50, |_| ());
    tokio::time::sleep(MS(200)).await;
    pushback.observe(&response(429, &[("retry-after", "1")]));
    tokio::time::sleep(MS(300)).await;
    pushback.observe(&response(429, &[("retry-after", "3")]));
    tokio::time::sleep(S(10)).await;
    assert_eq!(offsets(&arrivals, start), times(50, MS(3500)));
    assert!(refusals::<PushedBack, _>(tasks, start).await.is_empty());
}

/// "The longest hold any response can impose [...]: a longer `Retry-After` or window is cut to
/// this" (src/outbound/pushback/builder.rs:82-83).
///
/// `max_hold` 3 s, `max_wait` 5 s, `Retry-After: 1000000000`: fifty waiters reach the
/// dependency at 3 s exactly.
#[tokio::test(start_paused = true)]
async fn an_absurd_retry_after_releases_fifty_waiters_at_max_hold() {
    let pushback = on_tokio_clock_with(|builder| builder.max_hold(S(3)).max_wait(S(5)));
    let (client, arrivals) = parked_behind(&pushback);
    let start = Instant::now();
    pushback.observe(&response(429, &[("retry-after", "1000000000")]));
    let tasks = flood(&client, 50, |_| ());
    tokio::time::sleep(S(10)).await;
    assert_eq!(offsets(&arrivals, start), times(50, S(3)));
    assert!(refusals::<PushedBack, _>(tasks, start).await.is_empty());
}

/// "A waiting call that is dropped (a timeout above it) simply goes away: it reached nothing
/// and took nothing" (src/outbound/pushback/mod.rs:113-114), under [`Pacing::Spread`] ("the
/// calls left are spread evenly over the window: one every `t / r`", builder.rs:24-25).
///
/// Four calls left for 8 s, spread: five tasks; the second is dropped while it waits, at 1 s.
/// The other waiters take the slots at 2, 4 and 6 s: the dropped one held none.
#[tokio::test(start_paused = true)]
async fn a_spread_waiter_dropped_holds_no_slot() {
    let pushback = on_tokio_clock_with(|builder| builder.pacing(Pacing::Spread).max_wait(S(10)));
    let (client, arrivals) = parked_behind(&pushback);
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=4;t=8"#)]));
    let start = Instant::now();
    let tasks = flood(&client, 5, |_| ());
    tokio::time::sleep(S(1)).await;
    assert_eq!(offsets(&arrivals, start), [S(0)]);
    tasks[1].abort();
    tokio::time::sleep(S(20)).await;
    assert_eq!(offsets(&arrivals, start), [0, 2, 4, 6].map(S));
    for task in &tasks {
        task.abort();
    }
}

/// "A call whose permits come within the quota's `max_wait` reserves them and waits on tokio's
/// timer, then goes [...] One whose permits would come later fails at once with
/// [`QuotaExhausted`], which carries `retry_after`" (src/outbound/quota/mod.rs:41-45).
///
/// Fifty tasks race for a quota of 10 a second in bursts of 5 (`max_wait` 1 s): 5 go at once,
/// then one every 100 ms up to 1 s, exactly; the 35 others fail at once, each told 1.1 s.
#[tokio::test(start_paused = true)]
async fn fifty_tasks_on_a_client_quota_go_at_the_exact_instants_the_rate_allows() {
    let limiter = tokio_direct(quota_ns(1, 100_000_000, 5, 1_000_000_000));
    let arrivals = Arrivals::default();
    let client = ClientQuotaLayer::new("partner", limiter).layer(parked(arrivals.clone()));
    let start = Instant::now();
    let tasks = flood(&client, 50, |_| ());
    tokio::time::sleep(S(3)).await;
    let mut expected = times(5, S(0));
    expected.extend((1..=10).map(|k| MS(100 * k)));
    assert_eq!(offsets(&arrivals, start), expected);
    let refused = refusals::<QuotaExhausted, _>(tasks, start).await;
    assert_eq!(refused, refused_at(35, S(0), MS(1100)));
}

/// OpenAI's token fields: a limit of 100 tokens, `left` left, whole again in 10 s.
fn tokens_left_for_ten_seconds(left: &str) -> Response<()> {
    response(
        200,
        &[
            ("x-ratelimit-limit-tokens", "100"),
            ("x-ratelimit-remaining-tokens", left),
            ("x-ratelimit-reset-tokens", "10s"),
        ],
    )
}

/// "A call then starts only once the dependency's answers say that many tokens are left, or
/// have come back (at an even pace up to the limit they advertise, or at their reset)"
/// (src/outbound/pushback/layer.rs:67-69), and `max_wait` (builder.rs:74-76).
///
/// 100 tokens come back over 10 s, 10 a second. Fifty tasks of 10 tokens wait up to 5.5 s:
/// one reaches the dependency each second, at 1, 2, 3, 4 and 5 s (each takes the tokens back
/// so far), the 45 others are refused at 5 s, when the next 10 are a second away. With one
/// token left instead of none, a call of 10 is told 909.09 ms (9 of the 99 missing, at 9.9 a
/// second). A call that takes no tokens (no `cost_by`) waits while none are left: until the
/// first is back, 100 ms. (Found by this attack: the spent family held every call until its
/// reset, all fifty refused at once, told 10 s; with one token left, eleven times less.)
#[tokio::test(start_paused = true)]
async fn fifty_token_waiters_go_one_a_second_as_their_tokens_come_back() {
    let pushback = tokio_waiting_up_to(MS(5500));
    let arrivals = Arrivals::default();
    let client = pushback
        .layer()
        .cost_by(|tokens: &u32| *tokens)
        .layer(parked(arrivals.clone()));
    let one_left = tokio_waiting_up_to(Duration::ZERO);
    let one_left_client = one_left.layer().cost_by(|tokens: &u32| *tokens);
    let one_left_client = one_left_client.layer(parked(arrivals.clone()));
    one_left.observe(&tokens_left_for_ten_seconds("1"));
    let err = crate::common::refusal(&one_left_client, 10).await;
    let nine_at_9_9_a_second = Duration::from_nanos(909_090_910);
    assert_eq!(outbound::retry_after(&*err), Some(nine_at_9_9_a_second));

    pushback.observe(&tokens_left_for_ten_seconds("0"));
    let start = Instant::now();
    let tasks = flood(&client, 50, |_| 10);
    tokio::time::sleep(S(20)).await;
    assert_eq!(offsets(&arrivals, start), [1, 2, 3, 4, 5].map(S));
    let refused = refusals::<PushedBack, _>(tasks, start).await;
    let expected = refused_at(45, S(5), S(1));
    assert_eq!(refused, expected);

    let free = tokio_waiting_up_to(Duration::ZERO);
    let free_client = free.layer().layer(parked(arrivals.clone()));
    free.observe(&tokens_left_for_ten_seconds("0"));
    let refused = tokio::time::timeout(S(1), crate::common::refusal(&free_client, 10));
    let err = refused.await.expect("refused at once, not sent");
    assert_eq!(outbound::retry_after(&*err), Some(MS(100)));
}

/// "An answer to a call sent before may have been written first [...] so it may only tighten
/// what is in force, field by field: [...] a window no shorter" and "is sent when the hold
/// ends" (src/outbound/pushback/mod.rs:99-103, 112-113).
///
/// A call is at the dependency when an answer obtained elsewhere says nothing is left for 2 s;
/// ten tasks wait. At 500 ms the older call's answer says nothing is left for 5 s: the window
/// now ends at 5.5 s, and the waiters reach the dependency then, not a nanosecond sooner.
#[tokio::test(start_paused = true)]
async fn an_older_answer_moves_fifty_waiters_to_its_later_window_end() {
    let pushback = tokio_waiting_up_to(S(10));
    let (client, calls) = scripted_client(&pushback);
    let start_at = Instant::now();
    let older = start(&client).await;
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=0;t=2"#)]));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..50).map(|_| oneshot::channel()).unzip();
    let receivers = Mutex::new(receivers);
    let tasks = flood(&client, 50, |_| receivers.lock().unwrap().pop().unwrap());
    tokio::time::sleep(MS(500)).await;
    answer_call(older, response(200, &[("ratelimit", r#""p";r=0;t=5"#)])).await;
    tokio::time::sleep_until(start_at + MS(5500) - Duration::from_nanos(1)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "none before 5.5 s");
    tokio::time::sleep(Duration::from_nanos(1)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 51, "all at 5.5 s");
    assert!(refusals::<PushedBack, _>(tasks, start_at).await.is_empty());
    drop(senders);
}

/// "Woken when an answer lets calls start sooner than before, so that waiters go then"
/// (src/outbound/pushback/dependency.rs:113) and "a newer answer may end it sooner"
/// (mod.rs:112-113), on four threads: fifty tasks start waiting on a 30 s hold while an answer
/// obtained elsewhere, racing them, grants fifty calls. Every task reaches the dependency at
/// once; one that missed the wake-up would sleep the 30 s (the test's real-time limit is 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_racing_a_newer_answer_never_miss_it() {
    for round in 0..40 {
        let pushback = tokio_waiting_up_to(S(60));
        let (client, arrivals) = parked_behind(&pushback);
        pushback.observe(&response(200, &[("ratelimit", r#""p";r=0;t=30"#)]));
        let tasks = flood(&client, 50, |_| ());
        for _ in 0..round % 8 {
            tokio::task::yield_now().await;
        }
        pushback.observe(&response(200, &[("ratelimit", r#""p";r=50;t=30"#)]));
        let all_sent = async {
            while arrivals.lock().unwrap().len() < 50 {
                tokio::time::sleep(MS(1)).await;
            }
        };
        let sent = tokio::time::timeout(S(10), all_sent).await;
        assert!(
            sent.is_ok(),
            "round {round}: a waiter missed the newer answer"
        );
        assert_eq!(arrivals.lock().unwrap().len(), 50);
        tasks.iter().for_each(JoinHandle::abort);
    }
}

/// "A call that one of the crate's layers below refuses before sending it (a
/// [`BulkheadFull`], a client quota's refusal) reached nothing: the call it took of the
/// advertised budget goes back" (src/outbound/pushback/mod.rs:104-107), raced on four threads.
///
/// Ten calls left for a minute, a client quota of 4 a second below: rounds of a hundred tasks,
/// the clock a second on between rounds. Exactly 4, 4 and 2 reach the dependency, then
/// none: the quota's refusals took nothing of the ten, and nothing went past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_budget_of_ten_sends_exactly_ten_through_a_quota_that_refuses_most() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("partner").clock(clock.clone()).build();
    let limiter = direct_on(in_bursts_of(Quota::per_second(4).unwrap(), 4), &clock);
    let arrivals = Arrivals::default();
    let quota = ClientQuotaLayer::new("partner", limiter).layer(parked(arrivals.clone()));
    let client = pushback.layer().layer(quota);
    pushback.observe(&response(200, &[("ratelimit", r#""p";r=10;t=60"#)]));
    let mut sent = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..5 {
        let before = arrivals.lock().unwrap().len();
        let tasks = flood(&client, 100, |_| ());
        // Every task either reached the dependency (and waits there) or was refused.
        while tasks.iter().filter(|t| t.is_finished()).count() + arrivals.lock().unwrap().len()
            - before
            < 100
        {
            tokio::task::yield_now().await;
        }
        sent.push(arrivals.lock().unwrap().len() - before);
        kept.extend(tasks);
        clock.advance(S(1));
    }
    assert_eq!(sent, [4, 4, 2, 0, 0]);
    kept.iter().for_each(JoinHandle::abort);
}

/// The documented stack, "retry → breaker → pushback → client quota → bulkhead → timeout →
/// client" (src/outbound/mod.rs:22-24): "a retry never leaves before the answer's
/// `Retry-After` [...] or an error's `retry_after`" (src/outbound/retry/mod.rs:27-31), and "A
/// retry is granted when the reserve (`min_per_second` for each second of the window) plus what
/// the live slots hold is at least one retry" (src/outbound/retry/budget.rs:9-11).
///
/// Fifty callers at once; the first answer is a 429 with `Retry-After: 2`, every later one a
/// 200. No attempt but the first reaches the dependency before 2 s; exactly 40 retries go (0.2
/// of fifty calls, plus the reserve of 3 a second over the 10 s window), all answered 200, and
/// the ten other callers end with the pushback's refusal.
#[cfg(feature = "adaptive")]
#[tokio::test(start_paused = true)]
async fn fifty_callers_through_the_whole_stack_wait_out_the_hold_without_a_storm() {
    use super::hostile_support::on_tokio_clock;
    use tower_bulwark::bulkhead::Bulkhead;
    use tower_bulwark::clock::TokioClock;
    use tower_bulwark::outbound::retry::Retry;
    use tower_bulwark::outbound::Breaker;

    let arrivals = Arrivals::default();
    let recorded = arrivals.clone();
    let dependency = service_fn(move |_: http::Request<String>| {
        let mut arrivals = recorded.lock().unwrap();
        arrivals.push(Instant::now());
        let status = if arrivals.len() == 1 { 429 } else { 200 };
        async move { Ok::<_, BoxError>(response(status, &[("retry-after", "2")])) }
    });
    let retry = Retry::builder("partner").clock(TokioClock::new());
    let breaker = Breaker::builder("partner").clock(TokioClock::new());
    let pushback = on_tokio_clock();
    let quota = tokio_direct(Quota::per_second(100).unwrap());
    let client = tower::ServiceBuilder::new()
        .layer(retry.build().unwrap().layer())
        .layer(breaker.build().unwrap().layer())
        .layer(pushback.layer())
        .layer(ClientQuotaLayer::new("partner", quota))
        .layer(Bulkhead::semaphore("partner", 16).build().layer())
        .timeout(S(5))
        .service(dependency);
    let start = Instant::now();
    let get = |_| http::Request::get("/").body(String::new()).unwrap();
    let (mut ok, mut refused) = (0, 0);
    for task in flood(&client, 50, get) {
        match task.await.unwrap().1 {
            Ok(answer) if answer.status() == 200 => ok += 1,
            Ok(answer) => panic!("{}", answer.status()),
            Err(err) if err.is::<PushedBack>() => refused += 1,
            Err(err) => panic!("{err}"),
        }
    }
    let offsets = offsets(&arrivals, start);
    eprintln!("{offsets:?} ok {ok} refused {refused}");
    assert!(offsets[1..].iter().all(|at| *at >= S(2)), "{offsets:?}");
    assert_eq!((offsets.len() - 1, ok, refused), (10 + 30, 40, 10));
}
