//! The retry layer on top of the outbound stack, around a real `reqwest::Client` and a mock
//! server on 127.0.0.1:
//!
//! retry → breaker → pushback → bulkhead → timeout → client
//!
//! Waits here are the dependency's own (a second at most) and asserted only as lower bounds.

use std::time::{Duration, Instant};

use tower::ServiceExt;
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::outbound::retry::Retry;
use tower_bulwark::outbound::{Breaker, Pushback};
use tower_bulwark::BoxError;
use wiremock::matchers::{method, path};
use wiremock::{MockServer, ResponseTemplate};

use crate::common::assert_waited_since;
use crate::common::dependency::{mount, mount_fallback, mount_once, received};

struct Stack {
    server: MockServer,
    retry: Retry,
    breaker: Breaker,
}

impl Stack {
    async fn new() -> Self {
        let server = MockServer::start().await;
        let limited = ResponseTemplate::new(429).insert_header("retry-after", "1");
        mount_once(&server, path("/limited"), limited).await;
        mount_once(&server, path("/flaky"), ResponseTemplate::new(503)).await;
        let silent = ResponseTemplate::new(200).set_delay(Duration::from_secs(30));
        mount(&server, path("/silent"), silent).await;
        mount_fallback(&server, method("GET"), ResponseTemplate::new(200)).await;
        mount_fallback(&server, method("POST"), ResponseTemplate::new(503)).await;
        let retry = Retry::builder("partner").build().unwrap();
        let breaker = Breaker::builder("partner").build().unwrap();
        Self {
            server,
            retry,
            breaker,
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        route: &str,
    ) -> Result<reqwest::Response, BoxError> {
        // Built with `ServiceBuilder`, outermost first, as the `outbound` module documents.
        let client = tower::ServiceBuilder::new()
            .layer(self.retry.layer())
            .layer(self.breaker.layer())
            .layer(Pushback::builder("partner").build().layer())
            .layer(Bulkhead::semaphore("partner", 4).build().layer())
            .timeout(Duration::from_millis(200))
            .service(reqwest::Client::new());
        let url = format!("{}{route}", self.server.uri()).parse().unwrap();
        client.oneshot(reqwest::Request::new(method, url)).await
    }

    async fn received(&self, route: &str) -> usize {
        received(&self.server, route).await
    }
}

/// A 429 with `Retry-After: 1`: the retry leaves after that second, passes the pushback (which
/// holds calls for the same second) and succeeds; two calls reached the server.
#[tokio::test]
async fn a_429_is_retried_after_its_retry_after_through_the_pushback() {
    let stack = Stack::new().await;
    let start = Instant::now();
    let response = stack.call(reqwest::Method::GET, "/limited").await.unwrap();
    assert_eq!(response.status(), 200);
    assert_waited_since(start, Duration::from_secs(1));
    assert_eq!(stack.received("/limited").await, 2);
}

/// A 503 on a GET is retried; on a POST it is not.
#[tokio::test]
async fn a_503_is_retried_for_a_get_and_not_for_a_post() {
    let stack = Stack::new().await;
    let response = stack.call(reqwest::Method::GET, "/flaky").await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(stack.received("/flaky").await, 2);
    let response = stack.call(reqwest::Method::POST, "/order").await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(stack.received("/order").await, 1);
}

/// A dependency that accepts calls and never answers: the timeout at the bottom cuts each
/// attempt, its `Elapsed` is transient, and the call ends after its three attempts with it.
#[tokio::test]
async fn a_silent_dependency_is_cut_by_the_timeout_and_retried() {
    let stack = Stack::new().await;
    let err = stack
        .call(reqwest::Method::GET, "/silent")
        .await
        .unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    assert_eq!(stack.received("/silent").await, 3);
}

/// A retry never waits for the answer it retries: a 503 whose body was never read (a bulkhead
/// of one below holds its permit until the body ends) is let go before the retry is sent, so
/// the retry takes the permit and gets the 200, where it was refused by its own answer.
#[tokio::test]
async fn a_retry_is_not_blocked_by_the_unread_body_of_the_answer_it_retries() {
    let server = MockServer::start().await;
    let busy = ResponseTemplate::new(503).set_body_string("busy, try again");
    mount_once(&server, path("/busy"), busy).await;
    mount_fallback(&server, method("GET"), ResponseTemplate::new(200)).await;
    // The body layer watches an `http::Response`'s body: reqwest's answer, converted.
    let client = tower::ServiceBuilder::new()
        .layer(Retry::builder("partner").build().unwrap().layer())
        .layer(Bulkhead::semaphore("partner", 1).build().body_layer())
        .map_response(http::Response::<reqwest::Body>::from)
        .service(reqwest::Client::new());
    let url = format!("{}/busy", server.uri()).parse().unwrap();
    let response = client
        .oneshot(reqwest::Request::new(reqwest::Method::GET, url))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(received(&server, "/busy").await, 2);
}
