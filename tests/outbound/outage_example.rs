//! `examples/outage.rs` against a dependency on a real listener that is healthy, dead or
//! rate-limited for the whole of a short run: its `RESULT` line, and what reached the
//! dependency, with and without retries and the breaker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::time::Instant;

#[path = "../../examples/outage.rs"]
#[allow(dead_code)]
mod outage;

use outage::{Outcome, Record, Settings};

/// When each call reached the dependency.
type Calls = Arc<Mutex<Vec<Instant>>>;

/// A dependency that answers every call with `status` (a `429` with `Retry-After: 3`), on a
/// free port of 127.0.0.1, noting when each call arrived.
async fn dependency(status: StatusCode) -> (String, Calls) {
    async fn answer(State((status, calls)): State<(StatusCode, Calls)>) -> Response {
        calls.lock().unwrap().push(Instant::now());
        if status == StatusCode::TOO_MANY_REQUESTS {
            (status, [("retry-after", "3")]).into_response()
        } else {
            status.into_response()
        }
    }
    let calls = Calls::default();
    let app = Router::new()
        .route("/", get(answer))
        .with_state((status, Arc::clone(&calls)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, calls)
}

/// Runs the example for 2 s at 100 requests a second against a dependency answering `status`:
/// each request's record, and when each call reached the dependency.
async fn run(status: StatusCode, retry: bool) -> (Vec<Record>, Vec<Instant>) {
    let (url, calls) = dependency(status).await;
    let settings = Settings {
        offered: 100,
        secs: 2,
        url,
        retry,
    };
    let records = outage::run(&settings).await.unwrap();
    assert_eq!(records.len(), 200);
    let calls = calls.lock().unwrap().clone();
    let attempts: u32 = records.iter().map(|r| r.attempts).sum();
    assert_eq!(
        attempts as usize,
        calls.len(),
        "each attempt counted is a call the dependency received"
    );
    (records, calls)
}

fn count(records: &[Record], outcome: Outcome) -> usize {
    records.iter().filter(|r| r.outcome == outcome).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_dependency_serves_every_request_once() {
    for retry in [true, false] {
        let (records, calls) = run(StatusCode::OK, retry).await;
        assert_eq!(calls.len(), 200);
        assert_eq!(
            outage::result_line(&records),
            "RESULT offered=200 succeeded=200 failed=0 failed_fast=0"
        );
    }
}

/// Dead: without retries and breaker every request reaches it; with them the breaker opens
/// after its 20 calls and the requests fail fast, the attempts far below the requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_dependency_opens_the_breaker_and_requests_fail_fast() {
    let (records, calls) = run(StatusCode::SERVICE_UNAVAILABLE, false).await;
    assert_eq!(calls.len(), 200);
    assert_eq!(count(&records, Outcome::Failed), 200);

    let (records, calls) = run(StatusCode::SERVICE_UNAVAILABLE, true).await;
    assert_eq!(count(&records, Outcome::Succeeded), 0);
    // The 20 calls that open it and their retries, then 10 probes a second of open time.
    assert!(
        calls.len() <= 80,
        "{} attempts for 200 requests",
        calls.len()
    );
    assert!(count(&records, Outcome::FailedFast) >= 140, "{records:?}");
}

/// Rate-limited: after the first `429` and its `Retry-After: 3`, no call arrives until the
/// three seconds have passed, other than those already on their way (within 20 ms of it).
/// Without retries the pushback fails the requests of the run fast; with them, the requests
/// it held are retried once the time has passed, as far as the budget goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_dependency_gets_no_call_before_its_retry_after() {
    for retry in [true, false] {
        let (records, calls) = run(StatusCode::TOO_MANY_REQUESTS, retry).await;
        let first = calls[0];
        let early = calls.iter().filter(|&&at| {
            at > first + Duration::from_millis(20) && at < first + Duration::from_secs(3)
        });
        assert_eq!(early.count(), 0, "retry {retry}: {calls:?}");
        assert_eq!(count(&records, Outcome::Succeeded), 0);
        if !retry {
            // Held by the pushback, the requests of the run never reached the dependency.
            assert!(count(&records, Outcome::FailedFast) >= 190, "{records:?}");
        }
    }
}
