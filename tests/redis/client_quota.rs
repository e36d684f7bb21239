//! A client-side quota in Redis: two clients built separately (as two instances of a service
//! would be), each with its own connection and limiter, share one quota for the partner.

use crate::common::dependency::mount;
use crate::common::waits_up_to;
use std::time::Duration;

use crate::common::redis_server::{or_skip, RedisServer};
use tower::{Layer, ServiceExt};
use tower_bulwark::outbound::{self, ClientQuotaLayer, QuotaExhausted};
use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::{BoxError, Quota};
use wiremock::matchers::method;
use wiremock::{MockServer, ResponseTemplate};

/// One "instance": its own Redis connection, limiter and reqwest client.
async fn instance(
    server: &RedisServer,
    quota: Quota,
) -> impl tower::Service<
    reqwest::Request,
    Response = reqwest::Response,
    Error = BoxError,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect to the test server");
    let limiter = RedisRateLimiter::builder(quota, store)
        .prefix("partner-quota")
        .fail_mode(RedisFailMode::Propagate)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    ClientQuotaLayer::new("partner", limiter).layer(reqwest::Client::new())
}

fn get(server: &MockServer) -> reqwest::Request {
    reqwest::Request::new(reqwest::Method::GET, server.uri().parse().unwrap())
}

/// A partner API (a wiremock server) that answers every GET with a 200.
async fn partner_answering_200() -> MockServer {
    let partner = MockServer::start().await;
    mount(&partner, method("GET"), ResponseTemplate::new(200)).await;
    partner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_separately_built_clients_share_one_quota_exactly() {
    let redis = or_skip!(RedisServer::start(
        "two_separately_built_clients_share_one_quota_exactly"
    ));
    let partner = partner_answering_200().await;
    let quota = Quota::per_hour(25).unwrap();
    let first = instance(&redis, quota).await;
    let second = instance(&redis, quota).await;

    let tasks: Vec<_> = (0..120)
        .map(|i| {
            let client = if i % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            };
            let request = get(&partner);
            tokio::spawn(async move { client.oneshot(request).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(response) => {
                assert_eq!(response.status(), 200);
                admitted += 1;
            }
            Err(err) => {
                assert!(err.is::<QuotaExhausted>(), "{err}");
                let wait = outbound::retry_after(&*err).unwrap();
                assert!(
                    wait > Duration::ZERO && wait <= Duration::from_secs(144),
                    "{wait:?}"
                );
            }
        }
    }
    assert_eq!(admitted, 25);
    assert_eq!(partner.received_requests().await.unwrap().len(), 25);
    // Either instance, afterwards: refused, and the refusal spent nothing at the partner.
    assert!(first.oneshot(get(&partner)).await.is_err());
    assert!(second.oneshot(get(&partner)).await.is_err());
    assert_eq!(partner.received_requests().await.unwrap().len(), 25);
}

#[tokio::test]
async fn a_waiter_dropped_in_one_instance_leaves_its_permit_for_the_other() {
    let Some(redis) =
        RedisServer::start("a_waiter_dropped_in_one_instance_leaves_its_permit_for_the_other")
    else {
        return;
    };
    let partner = partner_answering_200().await;
    // One call per 2 s, and a caller may wait up to 3 s.
    let quota = waits_up_to(
        Quota::with_period(1, Duration::from_secs(2)).unwrap(),
        Duration::from_secs(3),
    );
    let first = instance(&redis, quota).await;
    let second = instance(&redis, quota).await;
    first.clone().oneshot(get(&partner)).await.unwrap();
    // The first instance reserves the permit due in 2 s and gives up after 200 ms.
    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        first.clone().oneshot(get(&partner)),
    )
    .await;
    assert!(cut.is_err());
    // The refund is sent in the background; then the second instance's wait is for the permit
    // the first gave back (under 2 s), not the one after it (about 3.8 s, beyond max_wait).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = std::time::Instant::now();
    second.oneshot(get(&partner)).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(partner.received_requests().await.unwrap().len(), 2);
}
