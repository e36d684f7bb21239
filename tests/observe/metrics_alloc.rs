//! With the `metrics` feature on, an observed limiter records every decision through handles it
//! registered once: deciding allocates nothing, admitted or refused.

use crate::counting;

use crate::common::recorded::{counter, find, gauge, recorded_by};
use metrics_util::debugging::DebugValue;
use metrics_util::MetricKind;
use tower_bulwark::observe::Observed;
use tower_bulwark::{clock::ManualClock, KeyedRateLimiter, Limiter, Quota};

#[test]
fn decisions_record_metrics_without_allocating() {
    const KEYS: u64 = 4;
    const PER_KEY: u64 = 1_000;
    let all = recorded_by(|| {
        // Time stands still: each key gets its 500 and is refused after that.
        let limiter = Observed::new(
            "api",
            KeyedRateLimiter::<u64>::builder(Quota::per_second(500).unwrap())
                .clock(ManualClock::new())
                .build(),
        );
        // The first decision registers the handles, and each key's first inserts it.
        for key in 0..KEYS {
            assert!(limiter.reserve_now(&key, 1).unwrap().unwrap().allowed);
        }
        let before = counting::allocations();
        for i in KEYS..PER_KEY * KEYS {
            limiter.reserve_now(&(i % KEYS), 1).unwrap().unwrap();
        }
        let spent = counting::allocations() - before;
        assert_eq!(
            spent,
            0,
            "{spent} allocations for {} decisions",
            PER_KEY * KEYS
        );
    });
    let calls = |outcome| {
        let labels = [("name", "api"), ("outcome", outcome)];
        counter(&all, "bulwark_ratelimiter_calls_total", &labels)
    };
    assert_eq!(calls("allowed"), 500 * KEYS, "the metrics were recorded");
    assert_eq!(calls("limited"), (PER_KEY - 500) * KEYS);
}

/// A bulkhead built by hand (not from a config file) counts its calls too, and a call through
/// it allocates nothing for its metrics.
#[test]
fn a_bulkhead_built_by_hand_records_its_calls_without_allocating() {
    use tower::{service_fn, Service, ServiceExt};
    use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull};
    use tower_bulwark::BoxError;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let all = recorded_by(|| {
        runtime.block_on(async {
            let payment = Bulkhead::semaphore("payment", 1).build();
            let mut client = tower::ServiceBuilder::new()
                .layer(payment.layer())
                .service(service_fn(|n: u32| async move { Ok::<_, BoxError>(n) }));
            // The first call registers the handles.
            assert_eq!(client.ready().await.unwrap().call(1).await.unwrap(), 1);
            let calls = 1_000;
            let before = counting::allocations();
            for n in 0..calls {
                client.ready().await.unwrap().call(n).await.unwrap();
            }
            let per_call = (counting::allocations() - before) / u64::from(calls);
            // One call in flight, another refused.
            let held = client.ready().await.unwrap().call(7);
            let refused = client.ready().await.unwrap().call(8).await.unwrap_err();
            assert!(refused.is::<BulkheadFull>());
            assert_eq!(held.await.unwrap(), 7);
            payment.publish_gauges();
            assert_eq!(per_call, 0, "allocations per call through the bulkhead");
        });
    });
    let payment = ("name", "payment");
    let calls = |outcome| {
        let labels = [payment, ("outcome", outcome)];
        counter(&all, "bulwark_bulkhead_calls_total", &labels)
    };
    assert_eq!(calls("permitted"), 1_002);
    assert_eq!(calls("finished"), 1_002);
    assert_eq!(calls("rejected"), 1);
    let durations = "bulwark_bulkhead_call_duration_seconds";
    match find(&all, MetricKind::Histogram, durations, &[payment]) {
        Some(DebugValue::Histogram(values)) => assert_eq!(values.len(), 1_002),
        other => panic!("duration: {other:?}"),
    }
    let size = "bulwark_bulkhead_max_allowed_concurrent_calls";
    assert_eq!(gauge(&all, size, &[payment]), 1.0);
}

/// Allocations per request through a `RateLimitLayer` whose policy's limiter is observed (the
/// metrics recorded), beyond those of the inner service alone; requests are built beforehand and
/// every one is admitted at once.
#[cfg(feature = "axum")]
fn layer_allocations_per_request(
    layer: impl tower::Layer<
        Inner,
        Service: tower::Service<
            http::Request<()>,
            Response = http::Response<http_body_util::Full<bytes::Bytes>>,
            Error = std::convert::Infallible,
        >,
    >,
) -> f64 {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tower::Service;

    const REQUESTS: usize = 1_000;
    let peer = std::net::SocketAddr::from(([192, 0, 2, 7], 40_000));
    let requests = |n: usize| -> Vec<http::Request<()>> {
        (0..n)
            .map(|_| {
                let mut request = http::Request::new(());
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                request
            })
            .collect()
    };
    let mut cx = Context::from_waker(Waker::noop());
    let run = |service: &mut dyn FnMut(http::Request<()>) -> bool, requests| {
        let before = counting::allocations();
        for request in requests {
            assert!(service(request), "every request is admitted at once");
        }
        counting::allocations() - before
    };
    let mut inner = Inner;
    let mut limited = layer.layer(Inner);
    // The first request registers the metrics handles and inserts the key.
    let mut through_layer = |request| {
        let mut future = std::pin::pin!(limited.call(request));
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(response)) => response.status() == http::StatusCode::OK,
            _ => false,
        }
    };
    run(&mut through_layer, requests(1));
    let with_layer = run(&mut through_layer, requests(REQUESTS));
    let mut cx = Context::from_waker(Waker::noop());
    let mut alone = |request| {
        let mut future = std::pin::pin!(inner.call(request));
        matches!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(_)))
    };
    let without = run(&mut alone, requests(REQUESTS));
    (with_layer as f64 - without as f64) / REQUESTS as f64
}

/// A service that answers `200` with an empty body, allocating nothing.
#[cfg(feature = "axum")]
#[derive(Clone, Copy)]
struct Inner;

#[cfg(feature = "axum")]
impl tower::Service<http::Request<()>> for Inner {
    type Response = http::Response<http_body_util::Full<bytes::Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(Default::default())))
    }
}

#[cfg(feature = "axum")]
#[test]
fn the_layers_admitted_path_allocates_nothing_but_its_headers() {
    use metrics_util::debugging::DebuggingRecorder;
    use tower_bulwark::rate_limit::{GlobalKey, PeerIp, Policy, RateLimitLayer};
    use tower_bulwark::DirectRateLimiter;

    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let per_ip = || {
            Policy::new(
                "per-ip",
                PeerIp::new(),
                Observed::new(
                    "per-ip",
                    KeyedRateLimiter::new(Quota::per_second(1_000_000).unwrap()),
                ),
            )
            .unwrap()
        };
        let all = || {
            Policy::new(
                "all",
                GlobalKey,
                Observed::new(
                    "all",
                    DirectRateLimiter::new(Quota::per_second(1_000_000).unwrap()),
                ),
            )
            .unwrap()
        };

        // Headers off: the decision, its metrics and the response future allocate nothing.
        let bare =
            layer_allocations_per_request(RateLimitLayer::new(per_ip()).without_admitted_headers());
        assert_eq!(bare, 0.0, "one policy, headers off");
        let two = layer_allocations_per_request(
            RateLimitLayer::new(per_ip().and(all())).without_admitted_headers(),
        );
        assert_eq!(two, 0.0, "two policies, headers off");
        let cost_by = layer_allocations_per_request(
            RateLimitLayer::new(per_ip().cost_by(|_| 2)).without_admitted_headers(),
        );
        assert_eq!(cost_by, 0.0, "a cost computed per request, headers off");

        // Headers on: the response's header map, which the inner service left empty, growing
        // to hold them (two allocations), and the `RateLimit` value, one allocation for its
        // bytes. `RateLimit-Policy` is built once and shared.
        let headers = layer_allocations_per_request(RateLimitLayer::new(per_ip()));
        assert_eq!(headers, 3.0, "one policy, default headers");

        // A policy that counts by outcome keeps the request's key until the response: one
        // allocation by design (see `Policy::count_if`).
        let count_if = layer_allocations_per_request(
            RateLimitLayer::new(per_ip().count_if(|r| r.status.is_server_error()))
                .without_admitted_headers(),
        );
        assert_eq!(count_if, 1.0, "a count_if policy, headers off");
    });
}
