//! The breaker in the outbound stack, around a real `reqwest::Client` and a mock server on
//! 127.0.0.1:
//!
//! breaker → pushback → client quota → bulkhead → timeout → client
//!
//! A dead dependency opens it and calls fail fast until probes find it healthy again; one that
//! never answers is cut by the timeout and opens it as failures do; the refusals of the layers
//! below are not counted.

use std::time::Duration;

use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::breaker::{Breaker, BreakerOpen, BreakerState, Window};
use tower_bulwark::outbound::{self, ClientQuotaLayer, Pushback, PushedBack, QuotaExhausted};
use tower_bulwark::{BoxError, DirectRateLimiter, Quota};
use wiremock::matchers::path;
use wiremock::{MockServer, ResponseTemplate};

use crate::common::dependency::{answering, mount};

type Client = BoxCloneService<reqwest::Request, reqwest::Response, BoxError>;

/// The stack around a `reqwest::Client`, the breaker opening on 4 calls of 4 counted; the
/// client quota grants `quota` calls an hour.
fn stack(breaker: &Breaker, quota: u32, timeout: Duration) -> Client {
    let quota = DirectRateLimiter::new(Quota::per_hour(quota).unwrap());
    let client = ServiceBuilder::new()
        .layer(breaker.layer())
        .layer(Pushback::builder("partner").build().layer())
        .layer(ClientQuotaLayer::new("partner", quota))
        .layer(Bulkhead::semaphore("partner", 8).build().layer())
        .timeout(timeout)
        .service(reqwest::Client::new());
    BoxCloneService::new(client)
}

fn breaker(clock: &ManualClock) -> Breaker {
    Breaker::builder("partner")
        .window(Window::Calls(4))
        .minimum_calls(4)
        .half_open_calls(3)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn get(server: &MockServer, route: &str) -> reqwest::Request {
    let url = format!("{}{route}", server.uri()).parse().unwrap();
    reqwest::Request::new(reqwest::Method::GET, url)
}

async fn received(server: &MockServer) -> usize {
    server.received_requests().await.unwrap().len()
}

/// Asserts that `client` refuses each of ten GETs of `route` with the error `E`.
async fn assert_ten_refused<E: std::error::Error + 'static>(
    client: &Client,
    server: &MockServer,
    route: &str,
) {
    for _ in 0..10 {
        let err = client
            .clone()
            .oneshot(get(server, route))
            .await
            .unwrap_err();
        assert!(err.is::<E>(), "{err}");
    }
}

#[tokio::test]
async fn a_dead_dependency_opens_it_then_probes_find_it_healthy_again() {
    let server = answering([("/", ResponseTemplate::new(503))]).await;
    let clock = ManualClock::new();
    let breaker = breaker(&clock);
    let client = stack(&breaker, 1_000, Duration::from_secs(5));
    for _ in 0..4 {
        let response = client.clone().oneshot(get(&server, "/")).await.unwrap();
        assert_eq!(response.status(), 503);
    }
    assert_eq!(
        breaker.state(),
        BreakerState::Open {
            until: Duration::from_secs(1)
        }
    );
    for _ in 0..20 {
        let err = client.clone().oneshot(get(&server, "/")).await.unwrap_err();
        assert!(err.is::<BreakerOpen>(), "{err}");
        assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(1)));
    }
    assert_eq!(received(&server).await, 4, "refused calls reach nothing");

    // Healthy again: after `open_for`, three probes succeed and it closes.
    server.reset().await;
    mount(&server, path("/"), ResponseTemplate::new(200)).await;
    clock.advance(Duration::from_secs(1));
    for _ in 0..10 {
        let response = client.clone().oneshot(get(&server, "/")).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test]
async fn a_dependency_that_never_answers_is_cut_by_the_timeout_and_opens_it() {
    let hang = ResponseTemplate::new(200).set_delay(Duration::from_secs(60));
    let server = answering([("/hang", hang)]).await;
    let clock = ManualClock::new();
    let breaker = breaker(&clock);
    let client = stack(&breaker, 1_000, Duration::from_millis(100));
    for _ in 0..4 {
        let cut = client
            .clone()
            .oneshot(get(&server, "/hang"))
            .await
            .unwrap_err();
        assert!(cut.is::<tower::timeout::error::Elapsed>(), "{cut}");
    }
    assert!(matches!(breaker.state(), BreakerState::Open { .. }));
    let err = client
        .clone()
        .oneshot(get(&server, "/hang"))
        .await
        .unwrap_err();
    assert!(err.is::<BreakerOpen>(), "{err}");
    assert_eq!(received(&server).await, 4);
}

#[tokio::test]
async fn refusals_of_the_layers_below_are_not_counted() {
    let server = answering([
        (
            "/limited",
            ResponseTemplate::new(429).insert_header("retry-after", "60"),
        ),
        ("/busy", ResponseTemplate::new(503)),
    ])
    .await;
    let clock = ManualClock::new();

    // One 429, then the pushback holds every call: one failure counted, no more.
    let limited = breaker(&clock);
    let client = stack(&limited, 1_000, Duration::from_secs(5));
    let response = client
        .clone()
        .oneshot(get(&server, "/limited"))
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_ten_refused::<PushedBack>(&client, &server, "/limited").await;
    assert_eq!(limited.state(), BreakerState::Closed);

    // One 503, then the client quota (one call an hour) refuses every call.
    let busy = breaker(&clock);
    let client = stack(&busy, 1, Duration::from_secs(5));
    let response = client.clone().oneshot(get(&server, "/busy")).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_ten_refused::<QuotaExhausted>(&client, &server, "/busy").await;
    assert_eq!(busy.state(), BreakerState::Closed);
    assert_eq!(received(&server).await, 2);
}
