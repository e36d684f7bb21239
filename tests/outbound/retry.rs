//! The retry layer around `service_fn` dependencies, on tokio's paused time: what is retried
//! (safe requests, transient answers), when (never before the dependency's `Retry-After` or
//! gRPC pushback, after a jittered backoff), what is not (a wait longer than `max_wait`, a full
//! bulkhead below), and hostile `Retry-After` values.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, Method, Request, Response};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::adaptive::Verdict;
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::clock::TokioClock;
use tower_bulwark::outbound::breaker::{Breaker, BreakerBuilder, Window};
use tower_bulwark::outbound::retry::{Retry, RetryBuilder, RetryRequest};
use tower_bulwark::{BoxError, BulkheadFull};

use tokio::time::Instant;

use crate::common::refusal;

/// The instants, from the test's start, at which a dependency received each call.
#[derive(Clone, Default)]
pub(crate) struct Calls(Arc<Mutex<Vec<Duration>>>);

impl Calls {
    pub(crate) fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    pub(crate) fn at(&self) -> Vec<Duration> {
        self.0.lock().unwrap().clone()
    }
}

/// A dependency that answers its calls with `answers` in turn (status and headers), then 200s,
/// recording when each came.
pub(crate) fn scripted(
    answers: Vec<(u16, Vec<(&'static str, &'static str)>)>,
) -> (
    impl Service<Request<String>, Response = Response<()>, Error = BoxError, Future: Send>
        + Clone
        + Send
        + 'static,
    Calls,
) {
    let calls = Calls::default();
    let (seen, start) = (calls.clone(), Instant::now());
    let answers = Arc::new(Mutex::new(answers.into_iter()));
    let service = service_fn(move |_: Request<String>| {
        seen.0.lock().unwrap().push(start.elapsed());
        let (status, headers) = answers.lock().unwrap().next().unwrap_or((200, vec![]));
        async move {
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            Ok::<_, BoxError>(response.body(())?)
        }
    });
    (service, calls)
}

/// Whether `waited` is what was `asked`, then a backoff of retry `n` (at most 50 ms · 2^(n−1)
/// with the default base).
pub(crate) fn after(waited: Duration, asked: Duration, n: u32) -> bool {
    waited >= asked && waited <= asked + Duration::from_millis(50 << (n - 1))
}

/// One GET through `partner`'s layer around `dependency`, which must answer.
async fn call<S>(partner: &Retry, dependency: S) -> Response<()>
where
    S: Service<Request<String>, Response = Response<()>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    send(partner, dependency, get()).await
}

/// `request` through `partner`'s layer around `dependency`, which must answer.
async fn send<S>(partner: &Retry, dependency: S, request: Request<String>) -> Response<()>
where
    S: Service<Request<String>, Response = Response<()>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    partner
        .layer()
        .layer(dependency)
        .oneshot(request)
        .await
        .unwrap()
}

pub(crate) fn get() -> Request<String> {
    Request::get("http://partner/").body(String::new()).unwrap()
}

pub(crate) fn retry() -> RetryBuilder {
    Retry::builder("partner").clock(TokioClock::new())
}

/// Makes `n` calls through `partner` to a [`scripted`] dependency of their own that answers each
/// with a 200: each deposits in the budget, none takes a retry.
pub(crate) async fn healthy_calls(partner: &Retry, n: usize) {
    let (dependency, _) = scripted(vec![]);
    let client = partner.layer().layer(dependency);
    for _ in 0..n {
        client.clone().oneshot(get()).await.unwrap();
    }
}

/// A [`scripted`] dependency answering two 503s, behind a breaker `partner` over two calls on
/// tokio's clock, `configure`d further, that those two calls have opened: the breaker's service
/// and the dependency's calls.
pub(crate) async fn behind_an_opened_breaker(
    configure: impl FnOnce(BreakerBuilder) -> BreakerBuilder,
) -> (
    BoxCloneService<Request<String>, Response<()>, BoxError>,
    Calls,
) {
    let (dependency, calls) = scripted(vec![(503, vec![]); 2]);
    let breaker = Breaker::builder("partner")
        .window(Window::Calls(2))
        .minimum_calls(2);
    let breaker = configure(breaker.clock(TokioClock::new())).build().unwrap();
    let below = breaker.layer().layer(dependency);
    for _ in 0..2 {
        below.clone().oneshot(get()).await.unwrap();
    }
    (BoxCloneService::new(below), calls)
}

/// A 429 with `Retry-After: 3`: the retry leaves three seconds after the answer, not a moment
/// sooner, then its backoff (at most 50 ms), and its answer is the call's.
#[tokio::test(start_paused = true)]
async fn a_retry_never_leaves_before_retry_after() {
    let (dependency, calls) = scripted(vec![(429, vec![("retry-after", "3")])]);
    let client = retry().build().unwrap().layer().layer(dependency);
    let response = client.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    let at = calls.at();
    assert_eq!((at.len(), at[0]), (2, Duration::ZERO));
    assert!(after(at[1], Duration::from_secs(3), 1), "{at:?}");
}

/// An HTTP-date and `retry-after-ms` are read as the pushback reads them.
#[tokio::test(start_paused = true)]
async fn retry_after_as_a_date_or_in_milliseconds() {
    let (dependency, calls) = scripted(vec![
        (503, vec![("retry-after-ms", "1500"), ("retry-after", "2")]),
        (
            429,
            vec![
                ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
                ("retry-after", "Sun, 06 Nov 1994 08:49:41 GMT"),
            ],
        ),
    ]);
    let client = retry().build().unwrap().layer().layer(dependency);
    let response = client.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    let at = calls.at();
    assert!(after(at[1], Duration::from_millis(1500), 1), "{at:?}");
    assert!(after(at[2] - at[1], Duration::from_secs(4), 2), "{at:?}");
}

/// An OpenAI 429 without `Retry-After` whose tokens are spent (20 s to their reset) while
/// requests are left: the retry waits for the tokens, as a pushback below holds a call for
/// them; it left after its backoff alone, into another 429 (found by a review).
#[tokio::test(start_paused = true)]
async fn a_retry_waits_for_spent_tokens() {
    let (dependency, calls) = scripted(vec![(
        429,
        vec![
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "5"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "20s"),
        ],
    )]);
    let client = retry()
        .max_wait(Duration::from_secs(60))
        .build()
        .unwrap()
        .layer()
        .layer(dependency);
    assert_eq!(client.oneshot(get()).await.unwrap().status(), 200);
    let at = calls.at();
    assert!(after(at[1], Duration::from_secs(20), 1), "{at:?}");
}

/// A trailers-only gRPC `UNAVAILABLE` with `grpc-retry-pushback-ms`: retried after the pushback.
#[cfg(feature = "grpc")]
#[tokio::test(start_paused = true)]
async fn a_retry_never_leaves_before_a_grpc_pushback() {
    let (dependency, calls) = scripted(vec![(
        200,
        vec![("grpc-status", "14"), ("grpc-retry-pushback-ms", "2500")],
    )]);
    let client = retry().build().unwrap().layer().layer(dependency);
    client.oneshot(get()).await.unwrap();
    let at = calls.at();
    assert_eq!((at.len(), at[0]), (2, Duration::ZERO));
    assert!(after(at[1], Duration::from_millis(2500), 1), "{at:?}");
}

/// A negative or unreadable `grpc-retry-pushback-ms` says not to retry (gRPC's A6): the call
/// ends with that answer.
#[cfg(feature = "grpc")]
#[tokio::test(start_paused = true)]
async fn a_grpc_pushback_that_says_not_to_retry_is_obeyed() {
    for value in ["-1", "soon"] {
        let (dependency, calls) = scripted(vec![(
            200,
            vec![("grpc-status", "14"), ("grpc-retry-pushback-ms", value)],
        )]);
        let client = retry().build().unwrap().layer().layer(dependency);
        let response = client.oneshot(get()).await.unwrap();
        assert_eq!(response.headers()["grpc-status"], "14");
        assert_eq!(calls.count(), 1, "{value}");
    }
}

/// A `grpc-retry-pushback-ms` on lines that differ names nothing, as the pushback reads it (a
/// `-1` beside a `5000`: it was read by its first line): the call is retried after its
/// backoff. On lines that agree, the `-1` is obeyed.
#[cfg(feature = "grpc")]
#[tokio::test(start_paused = true)]
async fn a_grpc_pushback_on_lines_that_differ_is_ignored() {
    for (lines, made) in [(["-1", "5000"], 2), (["-1", "-1"], 1)] {
        let pushback = lines.map(|line| ("grpc-retry-pushback-ms", line));
        let headers = [vec![("grpc-status", "14")], pushback.to_vec()].concat();
        let (dependency, calls) = scripted(vec![(200, headers)]);
        let client = retry().build().unwrap().layer().layer(dependency);
        client.oneshot(get()).await.unwrap();
        assert_eq!(calls.count(), made, "{lines:?}");
    }
}

/// The same said by a `tonic::Status` the dependency fails with (a tonic client's error): a
/// pushback that says not to retry wins over the delay of a `RetryInfo` in its details, as it
/// does on an answer's headers; without it, the `RetryInfo`'s second is waited for. (The status
/// was retried after its `RetryInfo` before.)
#[cfg(feature = "grpc")]
#[tokio::test(start_paused = true)]
async fn a_grpc_status_that_says_not_to_retry_is_obeyed_whatever_its_details_say() {
    use tonic_types::{ErrorDetails, StatusExt};

    for pushback in [Some("-1"), Some("soon"), None] {
        let calls = Calls::default();
        let (seen, start) = (calls.clone(), Instant::now());
        let dependency = service_fn(move |_: Request<String>| {
            seen.0.lock().unwrap().push(start.elapsed());
            let details = ErrorDetails::with_retry_info(Some(Duration::from_secs(1)));
            let mut status =
                tonic::Status::with_error_details(tonic::Code::Unavailable, "busy", details);
            if let Some(value) = pushback {
                let value = value.parse().unwrap();
                status
                    .metadata_mut()
                    .insert("grpc-retry-pushback-ms", value);
            }
            async move { Err::<Response<()>, BoxError>(status.into()) }
        });
        let client = retry().build().unwrap().layer().layer(dependency);
        let err = client.oneshot(get()).await.unwrap_err();
        assert!(err.is::<tonic::Status>(), "{err}");
        match pushback {
            Some(value) => assert_eq!(calls.count(), 1, "{value}"),
            None => {
                let at = calls.at();
                assert!(
                    at.len() >= 2 && after(at[1], Duration::from_secs(1), 1),
                    "{at:?}"
                );
            }
        }
    }
}

/// A wait asked beyond `max_wait` is not waited for: the answer comes back as it came, at once,
/// and the budget is untouched.
#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_max_wait_ends_the_call_with_the_answer() {
    let (dependency, calls) = scripted(vec![(429, vec![("retry-after", "6")])]);
    let partner = retry()
        .max_wait(Duration::from_secs(5))
        .budget(0.0, 2, Duration::from_secs(1))
        .build()
        .unwrap();
    let start = Instant::now();
    let response = call(&partner, dependency).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "6");
    assert_eq!((calls.count(), start.elapsed()), (1, Duration::ZERO));
    assert_eq!(partner.budget_available(), 2);
}

/// Always overloaded: exactly `max_attempts`, each retry after a backoff of full jitter (at
/// most `base × 2^(n − 1)`), then the last answer.
#[tokio::test(start_paused = true)]
async fn attempts_stop_at_max_attempts_after_bounded_backoffs() {
    let (dependency, calls) = scripted(vec![(503, vec![]); 10]);
    let partner = retry()
        .max_attempts(4)
        .backoff(Duration::from_millis(100), Duration::from_millis(300))
        .build()
        .unwrap();
    let response = call(&partner, dependency).await;
    assert_eq!(response.status(), 503);
    let at = calls.at();
    assert_eq!(at.len(), 4);
    for (n, ceiling) in [(1, 100), (2, 200), (3, 300)] {
        let gap = at[n] - at[n - 1];
        assert!(gap <= Duration::from_millis(ceiling), "{n}: {gap:?}");
    }
}

/// Only safe requests are sent twice: a POST is sent once, unless it carries an
/// `Idempotency-Key` or a rule of the user's says it may.
#[tokio::test(start_paused = true)]
async fn a_post_is_not_retried_unless_marked() {
    let post = || Request::post("http://partner/orders");
    let once = |builder: RetryBuilder, request: Request<String>| async move {
        let (dependency, calls) = scripted(vec![(503, vec![])]);
        let response = send(&builder.build().unwrap(), dependency, request).await;
        (response.status().as_u16(), calls.count())
    };
    let body = || "{}".to_owned();
    assert_eq!(once(retry(), post().body(body()).unwrap()).await, (503, 1));
    let keyed = post().header("idempotency-key", "8e03978e").body(body());
    assert_eq!(once(retry(), keyed.unwrap()).await, (200, 2));
    let rule = |method: &Method, _: &HeaderMap| method == Method::POST;
    let marked = once(retry().safe_to_retry(rule), post().body(body()).unwrap());
    assert_eq!(marked.await, (200, 2));
    let nothing = |_: &Method, _: &HeaderMap| false;
    assert_eq!(once(retry().safe_to_retry(nothing), get()).await, (503, 1));
}

/// A request that cannot be copied is sent once.
#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_copied_is_sent_once() {
    struct Streamed(Method, HeaderMap);
    impl RetryRequest for Streamed {
        fn method(&self) -> &Method {
            &self.0
        }
        fn headers(&self) -> &HeaderMap {
            &self.1
        }
        fn try_clone(&self) -> Option<Self> {
            None
        }
    }
    let (dependency, calls) = scripted(vec![(503, vec![])]);
    let dependency = dependency.map_request(|_: Streamed| get());
    let request = Streamed(Method::GET, HeaderMap::new());
    let response = retry()
        .build()
        .unwrap()
        .layer()
        .layer(dependency)
        .oneshot(request)
        .await;
    assert_eq!(
        (response.unwrap().status().as_u16(), calls.count()),
        (503, 1)
    );
}

/// A classifier of the user's replaces the default: here a 500 is transient and a 503 not.
#[tokio::test(start_paused = true)]
async fn a_classifier_of_the_users_decides_what_is_transient() {
    let judge = |result: Result<&Response<()>, &BoxError>| match result {
        Ok(response) if response.status() == 500 => Verdict::Overloaded,
        _ => Verdict::Healthy,
    };
    let (dependency, calls) = scripted(vec![(500, vec![]), (503, vec![])]);
    let client = retry().build().unwrap().layer_with(judge).layer(dependency);
    assert_eq!(client.oneshot(get()).await.unwrap().status(), 503);
    assert_eq!(calls.count(), 2);
}

/// A pushback below refuses the call with 2 s to go: the retry waits those 2 s and the call
/// goes through. A full bulkhead below names no time: never retried.
#[tokio::test(start_paused = true)]
async fn refusals_below_are_retried_after_their_time_or_not_at_all() {
    let (dependency, calls) = scripted(vec![]);
    let pushback = crate::hostile_support::on_tokio_clock();
    pushback.observe(
        &Response::builder()
            .status(429)
            .header("retry-after", "2")
            .body(())
            .unwrap(),
    );
    let client = retry()
        .build()
        .unwrap()
        .layer()
        .layer(pushback.layer().layer(dependency.clone()));
    client.oneshot(get()).await.unwrap();
    let at = calls.at();
    assert_eq!(at.len(), 1);
    assert!(after(at[0], Duration::from_secs(2), 1), "{at:?}");

    let bulkhead = Bulkhead::semaphore("partner", 1).build();
    let pending =
        service_fn(|_: Request<String>| std::future::pending::<Result<Response<()>, BoxError>>());
    let mut held = bulkhead.layer().layer(pending);
    let _holding = held.ready().await.unwrap().call(get());
    let partner = retry().build().unwrap();
    let client = partner.layer().layer(bulkhead.layer().layer(dependency));
    let err = client.oneshot(get()).await.unwrap_err();
    assert!(err.is::<BulkheadFull>(), "{err}");
    assert_eq!(calls.count(), 1);
    assert_eq!(partner.budget_available(), 30, "nothing withdrawn");
}

/// An open breaker below fails the call fast, and the retry layer does not wait out its time:
/// one attempt, at once, the budget untouched.
#[tokio::test(start_paused = true)]
async fn an_open_breaker_below_is_not_retried() {
    use tower_bulwark::outbound::breaker::BreakerOpen;
    let (below, calls) = behind_an_opened_breaker(std::convert::identity).await;
    let partner = retry().build().unwrap();
    let start = Instant::now();
    let err = refusal(&partner.layer().layer(below), get()).await;
    assert!(err.is::<BreakerOpen>(), "{err}");
    assert_eq!((calls.count(), start.elapsed()), (2, Duration::ZERO));
    assert_eq!(partner.budget_available(), 30);
}

/// Hostile `Retry-After` values: none panics. A huge delay or a far date is longer than any
/// `max_wait` (not retried); a negative or garbage one is ignored as the pushback ignores it (a
/// 429 then asks one second, a 503 nothing); a date in the past asks nothing.
#[tokio::test(start_paused = true)]
async fn hostile_retry_after_values_are_handled_as_documented() {
    let cases: [(u16, &'static str, Option<Duration>); 8] = [
        (429, "99999999999999999999999999", None),
        (503, "18446744073709551616", None),
        (429, "Fri, 31 Dec 9999 23:59:59 GMT", None),
        (429, "-5", Some(Duration::from_secs(1))),
        (429, "soon", Some(Duration::from_secs(1))),
        (503, "-1", Some(Duration::ZERO)),
        (503, "1e3", Some(Duration::ZERO)),
        (503, "Thu, 01 Jan 1970 00:00:00 GMT", Some(Duration::ZERO)),
    ];
    for (status, value, retried_after) in cases {
        let (dependency, calls) = scripted(vec![(status, vec![("retry-after", value)])]);
        let partner = retry()
            .backoff(Duration::ZERO, Duration::ZERO)
            .build()
            .unwrap();
        let response = call(&partner, dependency).await;
        let at = calls.at();
        match retried_after {
            None => assert_eq!(
                (response.status().as_u16(), at.len()),
                (status, 1),
                "{value}"
            ),
            Some(wait) => assert_eq!(at, [Duration::ZERO, wait], "{value}"),
        }
    }
}

/// Every setting out of range is refused by `build`, naming it and the value given.
#[test]
fn bad_settings_are_refused_naming_the_setting() {
    let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
    let cases: [(RetryBuilder, &str); 9] = [
        (
            retry().max_attempts(0),
            "`max_attempts` must be from 1 to 10, got 0",
        ),
        (
            retry().max_attempts(11),
            "`max_attempts` must be from 1 to 10, got 11",
        ),
        (
            retry().backoff(2 * second, second),
            "`base` must be at most cap, got 2s",
        ),
        (
            retry().backoff(second, hour * 2),
            "`cap` must be at most 1h, got 7200s",
        ),
        (
            retry().max_wait(Duration::MAX),
            "`max_wait` must be at most 1h",
        ),
        (
            retry().budget(f64::NAN, 3, second),
            "`ratio` must be from 0 to 10, got NaN",
        ),
        (
            retry().budget(-0.1, 3, second),
            "`ratio` must be from 0 to 10, got -0.1",
        ),
        (
            retry().budget(0.2, 3, Duration::from_millis(9)),
            "`window` must be from 10ms to 1h",
        ),
        (
            retry().budget(0.2, 3, hour + second),
            "`window` must be from 10ms to 1h",
        ),
    ];
    for (builder, message) in cases {
        let err = builder.build().unwrap_err();
        assert!(
            err.to_string().starts_with(&format!("retry: {message}")),
            "{err}"
        );
    }
    let extremes = retry().max_attempts(10).backoff(hour, hour).max_wait(hour);
    let extremes = extremes.budget(10.0, u32::MAX, hour).build().unwrap();
    // The floor of an hour at u32::MAX a second, counted without overflow.
    assert_eq!(extremes.budget_available(), u64::from(u32::MAX) * 3600);
}
