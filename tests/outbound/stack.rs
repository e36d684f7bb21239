//! The outbound stack below the retry layer, around a real `reqwest::Client` and a mock server
//! on 127.0.0.1, with a hand-written `tower::retry::Policy` on top and the timeout above the
//! pushback, so that it bounds each attempt's waits below too:
//!
//! retry policy → timeout → pushback → client quota → bulkhead → client
//!
//! Each test shows one layer doing its part in that position, counted at the mock.
//! `retry_stack.rs` puts the crate's retry layer on the documented order, timeout innermost.

use crate::common::dependency::{mount, mount_fallback, mount_once, received};
use crate::common::{assert_waited_since, waits_up_to};
use std::time::{Duration, Instant};

use http::StatusCode;
use tower::retry::Policy;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::outbound::{self, ClientQuotaLayer, Pushback, PushedBack, QuotaExhausted};
use tower_bulwark::{BoxError, BulkheadFull, DirectRateLimiter, Quota};
use wiremock::matchers::{method, path};
use wiremock::{MockServer, ResponseTemplate};

/// Retries a 429 or 503 at once (the pushback below holds it), and a refusal that carries a
/// retry time after that time, if it is at most `longest`; at most `attempts` times.
#[derive(Clone)]
struct HonourRetryAfter {
    attempts: usize,
    longest: Duration,
}

impl Policy<reqwest::Request, reqwest::Response, BoxError> for HonourRetryAfter {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _: &mut reqwest::Request,
        result: &mut Result<reqwest::Response, BoxError>,
    ) -> Option<Self::Future> {
        let wait = match result {
            Ok(response) => match response.status() {
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Duration::ZERO,
                _ => return None,
            },
            Err(err) => outbound::retry_after(&**err).filter(|wait| *wait <= self.longest)?,
        };
        self.attempts = self.attempts.checked_sub(1)?;
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, request: &reqwest::Request) -> Option<reqwest::Request> {
        request.try_clone()
    }
}

struct Stack {
    client: BoxCloneService<reqwest::Request, reqwest::Response, BoxError>,
    limiter: DirectRateLimiter,
    bulkhead: Bulkhead,
    server: MockServer,
}

struct Settings {
    quota: Quota,
    pushback_wait: Duration,
    timeout: Duration,
    bulkhead: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            quota: Quota::per_hour(10).unwrap(),
            pushback_wait: Duration::ZERO,
            timeout: Duration::from_secs(5),
            bulkhead: 2,
        }
    }
}

async fn stack(settings: Settings) -> Stack {
    let server = MockServer::start().await;
    // `/limited` answers its first call with a 429 and `Retry-After: 1`, then 200s.
    let limited = ResponseTemplate::new(429).insert_header("retry-after", "1");
    mount_once(&server, path("/limited"), limited).await;
    let long = ResponseTemplate::new(429).insert_header("retry-after", "5");
    mount(&server, path("/long"), long).await;
    let slow = ResponseTemplate::new(200).set_delay(Duration::from_millis(700));
    mount(&server, path("/slow"), slow).await;
    mount_fallback(&server, method("GET"), ResponseTemplate::new(200)).await;

    let pushback = Pushback::builder("partner")
        .max_wait(settings.pushback_wait)
        .build();
    let limiter = DirectRateLimiter::new(settings.quota);
    let bulkhead = Bulkhead::semaphore("partner", settings.bulkhead).build();
    let client = ServiceBuilder::new()
        .retry(HonourRetryAfter {
            attempts: 3,
            longest: Duration::from_secs(2),
        })
        .timeout(settings.timeout)
        .layer(pushback.layer())
        .layer(ClientQuotaLayer::new("partner", limiter.clone()))
        .layer(bulkhead.layer())
        .service(reqwest::Client::new());
    Stack {
        client: BoxCloneService::new(client),
        limiter,
        bulkhead,
        server,
    }
}

impl Stack {
    fn get(&self, route: &str) -> reqwest::Request {
        let url = format!("{}{route}", self.server.uri()).parse().unwrap();
        reqwest::Request::new(reqwest::Method::GET, url)
    }

    async fn call(&self, route: &str) -> Result<reqwest::Response, BoxError> {
        self.client.clone().oneshot(self.get(route)).await
    }

    async fn received(&self, route: &str) -> usize {
        received(&self.server, route).await
    }

    /// The permits left in the client quota (taking one to read it).
    fn quota_left(&self) -> u64 {
        self.limiter.check().remaining + 1
    }
}

#[tokio::test]
async fn pushback_holds_the_retry_of_a_429_and_retry_sends_it_after_retry_after() {
    let stack = stack(Settings::default()).await;
    let start = Instant::now();
    let response = stack.call("/limited").await.unwrap();
    assert_eq!(response.status(), 200);
    // Three attempts: the 429, the retry refused by the pushback (it never left the process),
    // and the call after Retry-After.
    assert_waited_since(start, Duration::from_secs(1));
    assert_eq!(stack.received("/limited").await, 2);
    // Two permits spent: the refused attempt spent none.
    assert_eq!(stack.quota_left(), 8);
}

#[tokio::test]
async fn a_held_call_spends_no_quota_and_takes_no_bulkhead_permit() {
    let stack = stack(Settings::default()).await;
    // 429 with `Retry-After: 5`: longer than the retry policy waits, so it gives up.
    let err = stack.call("/long").await.unwrap_err();
    assert!(err.is::<PushedBack>(), "{err}");
    for _ in 0..20 {
        let err = stack.call("/other").await.unwrap_err();
        let wait = outbound::retry_after(&*err).unwrap();
        assert!(wait > Duration::from_secs(3) && wait <= Duration::from_secs(5));
    }
    assert_eq!(stack.received("/long").await, 1);
    assert_eq!(stack.received("/other").await, 0);
    assert_eq!(
        stack.quota_left(),
        9,
        "only the one call that reached the partner"
    );
    assert_eq!(stack.bulkhead.snapshot().available_concurrent_calls, 2);
}

#[tokio::test]
async fn the_quota_waits_without_a_bulkhead_permit_and_retry_waits_out_its_refusals() {
    let stack = stack(Settings {
        quota: waits_up_to(Quota::per_second(1).unwrap(), Duration::from_millis(1500)),
        ..Settings::default()
    })
    .await;
    stack.call("/a").await.unwrap();
    // The next permit is a second away: the call waits in the quota...
    let waiting = tokio::spawn(stack.client.clone().oneshot(stack.get("/b")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...holding no bulkhead permit, and not yet sent.
    assert_eq!(stack.bulkhead.snapshot().available_concurrent_calls, 2);
    assert_eq!(stack.received("/b").await, 0);
    // A third call's permit is 1.7 s away, past max_wait: refused with the time, which the
    // retry policy waits before trying again.
    let start = Instant::now();
    let third = stack.call("/c").await.unwrap();
    assert_eq!(third.status(), 200);
    assert_waited_since(start, Duration::from_millis(1500));
    waiting.await.unwrap().unwrap();
    assert_eq!(stack.received("/b").await, 1);
    assert_eq!(stack.received("/c").await, 1);
}

#[tokio::test]
async fn the_bulkhead_refuses_at_once_and_the_refusal_is_neither_retried_nor_a_timeout() {
    let stack = stack(Settings::default()).await;
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(stack.client.clone().oneshot(stack.get("/slow"))))
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let err = stack.call("/slow").await.unwrap_err();
    assert!(start.elapsed() < Duration::from_millis(300));
    assert!(err.is::<BulkheadFull>(), "{err}");
    assert!(!err.is::<tower::timeout::error::Elapsed>());
    assert!(!err.is::<QuotaExhausted>() && !err.is::<PushedBack>());
    for call in slow {
        call.await.unwrap().unwrap();
    }
    assert_eq!(stack.received("/slow").await, 2);
    // The refused call reached nothing: the quota above the bulkhead has its permit back.
    assert_eq!(stack.quota_left(), 8);
}

#[tokio::test]
async fn the_timeout_cuts_a_wait_in_the_pushback_and_a_slow_call_and_gives_everything_back() {
    let stack = stack(Settings {
        pushback_wait: Duration::from_secs(3),
        timeout: Duration::from_millis(400),
        ..Settings::default()
    })
    .await;
    // A slow answer: cut by the timeout, and its bulkhead permit comes back.
    let err = stack.call("/slow").await.unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    assert_eq!(stack.bulkhead.snapshot().available_concurrent_calls, 2);
    // A 429 with `Retry-After: 1`: the retry waits in the pushback (within its max_wait), and
    // the timeout cuts it there before it is sent.
    let start = Instant::now();
    let err = stack.call("/limited").await.unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    assert!(start.elapsed() < Duration::from_millis(900));
    assert_eq!(stack.received("/limited").await, 1);
    assert_eq!(stack.bulkhead.snapshot().available_concurrent_calls, 2);
}
