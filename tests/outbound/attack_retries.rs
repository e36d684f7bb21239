//! Attacks on the retries by a helper that had not seen the code: retries that wait longer
//! than the budget's window, a withdrawal's lifetime, a gRPC status with both a `RetryInfo` and
//! a pushback, and a 504's `Retry-After`. Time is tokio's paused clock or a `ManualClock`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::clock::TokioClock;
use tower_bulwark::outbound::retry::Retry;
use tower_bulwark::BoxError;

use crate::retry::get;

/// `src/outbound/retry/mod.rs:41-47`: "`min_per_second` retries a second (default 3) come with
/// no deposit, and both expire after `window` ... Over any stretch, retries are at most `ratio`
/// times the calls plus that reserve once for each window the stretch spans"; and the module's
/// first line: retries "only as often as a budget shared by every clone allows" (a loop
/// without a budget "multiplies a dependency's load ... exactly when the dependency can least
/// take it").
///
/// A retry is granted when it is decided, but sent after the wait the answer asked, which may
/// be up to `max_wait` (1 h). A dependency down until t = 50 s answers every call `503` with a
/// `Retry-After` pointing at t = 50 s (as an HTTP-date would); 30 calls every 10 s, the default
/// budget (0.2, 3 a second, 10 s) and `max_wait` 60 s. A retry waiting counts against the
/// budget until it is sent, so the five rounds are granted the reserve once and the deposits of
/// the round before it: 36 retries, where each round took a fresh reserve while a withdrawal
/// expired in `window` whether sent or not, and all 150 retries reached the dependency within
/// 100 ms of t = 50 s.
#[tokio::test(start_paused = true)]
async fn retries_waiting_longer_than_the_window_count_until_they_are_sent() {
    let back_at = Duration::from_secs(50);
    let (dependency, seen) = timed_dependency(move |_, at| match back_at.checked_sub(at) {
        Some(wait) if !wait.is_zero() => (503, Some(wait.as_secs())),
        _ => (200, None),
    });
    // The defaults (ratio 0.2, 3 a second, a window of 10 s, backoff 50 ms to 1 s, three
    // attempts) but for `max_wait`: a minute, as an API that rate-limits by the minute asks.
    let partner = Retry::builder("partner")
        .clock(TokioClock::new())
        .max_wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let client = partner.layer().layer(dependency);
    let mut calls = tokio::task::JoinSet::new();
    for _round in 0..5 {
        for _ in 0..30 {
            calls.spawn(client.clone().oneshot(get()));
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    while let Some(call) = calls.join_next().await {
        call.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap();
    let burst = Duration::from_secs(50)..Duration::from_millis(50_100);
    let at_once = seen.iter().filter(|at| burst.contains(*at)).count();
    // The reserve of 30, and the 6 retries' worth of the 30 calls made at 10 s, while the
    // first round's deposits had expired and its 30 retries still waited.
    assert!(
        at_once <= 36,
        "{at_once} retries reached the dependency within 100 ms of t = 50 s; {} attempts in all",
        seen.len()
    );
}

/// `src/outbound/retry/mod.rs`: a retry counts "until at least `window` after it is sent". The
/// budget forgets a tenth of the window at a time: 30 retries taken from the reserve at
/// 0.999 s still count at 10.000 s, so 30 more calls then are retried not at all. (While a slot
/// of withdrawals was forgotten with its deposits, they no longer counted 9.001 s later, and
/// 60 retries went within 9.001 s, with no deposits, for a reserve of 30 per 10 s window.)
#[tokio::test(start_paused = true)]
async fn a_withdrawal_from_the_reserve_counts_for_at_least_its_window() {
    use crate::retry::scripted;
    use crate::retry_budget::reserve_only;
    use tower_bulwark::clock::ManualClock;

    let clock = ManualClock::new();
    let window = Duration::from_secs(10);
    let partner = reserve_only(&clock, 3, window, 2).build().unwrap();
    let (failing, calls) = scripted(vec![(503, vec![]); 1000]);
    let client = partner.layer().layer(failing);
    clock.set(Duration::from_millis(999));
    for _ in 0..30 {
        client.clone().oneshot(get()).await.unwrap();
    }
    assert_eq!((calls.count(), partner.budget_available()), (60, 0));
    clock.set(Duration::from_secs(10));
    let available = partner.budget_available();
    for _ in 0..30 {
        client.clone().oneshot(get()).await.unwrap();
    }
    // 60 attempts before, then 30 first attempts: the rest are retries.
    let retries = calls.count() - 60 - 30;
    assert_eq!(
        (available, 30 + retries),
        (0, 30),
        "9.001 s after 30 retries emptied the reserve: {available} available, \
         {} retries in 9.001 s",
        30 + retries
    );
}

/// `src/outbound/retry/mod.rs`: "a retry never leaves before the answer's `Retry-After` ...,
/// gRPC `RetryInfo` or `grpc-retry-pushback-ms` (feature `grpc`)". A gRPC `UNAVAILABLE` whose
/// `RetryInfo` says 1 s and whose `grpc-retry-pushback-ms` says 3 000 ms: the retry waits for
/// the longer (it left after the `RetryInfo`'s 1 s, read first).
#[cfg(feature = "grpc")]
#[tokio::test(start_paused = true)]
async fn a_retry_waits_for_a_grpc_pushback_longer_than_the_retry_info() {
    use crate::retry::scripted;
    use tonic_types::{ErrorDetails, StatusExt};

    let details = ErrorDetails::with_retry_info(Some(Duration::from_secs(1)));
    let mut status = tonic::Status::with_error_details(tonic::Code::Unavailable, "busy", details);
    let pushback = "3000".parse().unwrap();
    status
        .metadata_mut()
        .insert("grpc-retry-pushback-ms", pushback);
    // As a trailers-only answer: the status's fields in the headers of a 200.
    let trailers_only: Response<()> = status.into_http();
    let leak = |text: &str| &*String::leak(text.to_owned());
    let fields = (trailers_only.headers().iter())
        .map(|(name, value)| (leak(name.as_str()), leak(value.to_str().unwrap())))
        .collect();
    let (dependency, calls) = scripted(vec![(200, fields)]);
    let response = through_default_retries(dependency).await;
    assert_eq!(response.status(), 200);
    let at = calls.at();
    assert_eq!(at.len(), 2);
    assert!(
        at[1] >= Duration::from_millis(3000),
        "the retry left at {:?}, before the 3 000 ms of grpc-retry-pushback-ms",
        at[1]
    );
}

/// `src/outbound/retry/mod.rs`: "a retry never leaves before the answer's `Retry-After`";
/// guide: "a retry never leaves before a `Retry-After`". The default classifier retries a 504
/// (`HttpOverload`: 429, 503, 504): its `Retry-After: 5` is waited for (it was read only on a
/// 429 or 503, as the pushback reads it, and the 504 was retried after the backoff alone).
#[tokio::test(start_paused = true)]
async fn a_504_is_retried_after_its_retry_after() {
    use crate::retry::scripted;

    let (dependency, calls) = scripted(vec![(504, vec![("retry-after", "5")])]);
    let response = through_default_retries(dependency).await;
    assert_eq!(response.status(), 200);
    let at = calls.at();
    assert!(at[1] >= Duration::from_secs(5), "retried at {:?}", at[1]);
}

/// A retried 504's `Retry-After` is read as a 429's is, precedence included: with OpenAI's
/// requests spent for 30 s beside `Retry-After: 1`, OpenAI's reset yields to it (as the pushback
/// docs say of a 429), so the retry leaves after a second, not 30 (found by a review: the
/// `Retry-After` of a 504 was read beside the answer, not in it).
#[tokio::test(start_paused = true)]
async fn a_504s_retry_after_takes_precedence_as_a_429s_does() {
    use crate::retry::{after, scripted};

    for status in [429, 504] {
        let fields = vec![
            ("retry-after", "1"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "30s"),
        ];
        let (dependency, calls) = scripted(vec![(status, fields)]);
        let response = through_default_retries(dependency).await;
        assert_eq!(response.status(), 200);
        let at = calls.at();
        assert!(
            after(at[1], Duration::from_secs(1), 1),
            "{status}: retried at {:?}",
            at[1]
        );
    }
}

/// When each request reached a dependency, on tokio's clock from its start.
pub(crate) type Seen = Arc<Mutex<Vec<Duration>>>;

/// A dependency that answers each request with the status and the `Retry-After` (in seconds)
/// `answer` gives for it and the time it came (on tokio's clock, from now), and the times the
/// requests came.
pub(crate) fn timed_dependency(
    answer: impl Fn(&Request<String>, Duration) -> (u16, Option<u64>) + Clone + Send + 'static,
) -> (
    impl tower::Service<Request<String>, Response = Response<()>, Error = BoxError, Future: Send>
        + Clone
        + Send
        + 'static,
    Seen,
) {
    let start = Instant::now();
    let seen = Seen::default();
    let recorded = seen.clone();
    let dependency = service_fn(move |request: Request<String>| {
        let at = start.elapsed();
        recorded.lock().unwrap().push(at);
        let (status, retry_after) = answer(&request, at);
        async move {
            let mut response = Response::builder().status(status);
            if let Some(seconds) = retry_after {
                response = response.header("retry-after", seconds);
            }
            Ok::<_, BoxError>(response.body(())?)
        }
    });
    (dependency, seen)
}

/// A `GET` through retries of the defaults on tokio's clock, to `dependency`: its last answer.
async fn through_default_retries<S>(dependency: S) -> Response<()>
where
    S: tower::Service<Request<String>, Response = Response<()>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let partner = Retry::builder("partner")
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let client = partner.layer().layer(dependency);
    client.oneshot(get()).await.unwrap()
}
