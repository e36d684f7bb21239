//! A client quota in Redis when Redis is down or stalls: the quota's docs promise that a
//! limiter that fails fails the call (under `propagate`) or refuses it with a retry time (under
//! `closed`), that nothing reaches the dependency, and Redis's docs that no decision hangs past
//! the limiter's timeout. No Redis server is needed: a port nobody listens on, and a listener
//! that accepts and never answers.

use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::outbound::{self, ClientQuotaLayer, QuotaExhausted};
use tower_bulwark::redis::{RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::{BoxError, Quota};

/// A `redis://` URL whose server accepts connections and reads them, never answering.
fn stalled_redis() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut sink = [0u8; 1024];
                while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
            });
        }
    });
    format!("redis://127.0.0.1:{port}/")
}

/// A `redis://` URL on a port nobody listens on.
fn dead_redis() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("redis://127.0.0.1:{port}/")
}

fn client(
    url: &str,
    fail_mode: RedisFailMode,
    calls: Arc<AtomicUsize>,
) -> impl Service<u32, Response = u32, Error = BoxError, Future: Send> + Clone {
    let store = RedisStore::connect_lazy(url).unwrap();
    let limiter = RedisRateLimiter::builder(Quota::per_second(100).unwrap(), store)
        .prefix("attack")
        .fail_mode(fail_mode)
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    ClientQuotaLayer::new("partner", limiter).layer(service_fn(move |n: u32| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(n) }
    }))
}

#[tokio::test]
async fn a_stalled_or_dead_redis_fails_the_call_within_the_timeout_under_propagate() {
    for url in [stalled_redis(), dead_redis()] {
        let calls = Arc::new(AtomicUsize::new(0));
        let client = client(&url, RedisFailMode::Propagate, calls.clone());
        for _ in 0..3 {
            let started = Instant::now();
            let result = tokio::time::timeout(Duration::from_secs(5), client.clone().oneshot(1))
                .await
                .expect("the call hangs while Redis does not answer");
            let err = result.expect_err("admitted without Redis");
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{url}: {:?}",
                started.elapsed()
            );
            assert!(!err.is::<QuotaExhausted>(), "{err}");
            assert_eq!(outbound::retry_after(&*err), None, "{err}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0, "{url}");
    }
}

#[tokio::test]
async fn a_stalled_redis_under_closed_refuses_with_its_retry_time() {
    let calls = Arc::new(AtomicUsize::new(0));
    let client = client(
        &stalled_redis(),
        RedisFailMode::Closed(Duration::from_secs(7)),
        calls.clone(),
    );
    let result = tokio::time::timeout(Duration::from_secs(5), client.oneshot(1))
        .await
        .expect("the call hangs while Redis does not answer");
    let err = result.expect_err("admitted without Redis");
    assert!(err.is::<QuotaExhausted>(), "{err}");
    assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(7)));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
