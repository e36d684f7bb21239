//! Named instances observed through metrics, tracing and the health report.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use metrics_util::debugging::DebugValue;
use metrics_util::MetricKind;
use tower::{service_fn, Service, ServiceExt};
use tower_bulwark::config::Registry;

use crate::common::recorded::{find, on_own_recorder, series};
use crate::orders::{get_orders, router, runtime, ORDERS_CONFIG};
use tower_bulwark::BulkheadFull;

/// The body of a GET of `url` through `client`, as text.
async fn get_text(client: &reqwest::Client, url: &str) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}

/// A call through the bulkhead that has not ended.
type PendingCall = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<&'static str, tower_bulwark::BoxError>> + Send>,
>;

/// Sends `n` calls through bulkhead `payment` of `registry` to a service that answers only once
/// the returned gate has permits, and polls each once: a refusal resolves at once, a permitted
/// call stays pending (holding its permit). Returns the gate, the pending calls and how many
/// were refused.
async fn calls_through_payment(
    registry: &Registry,
    n: usize,
) -> (Arc<tokio::sync::Semaphore>, Vec<PendingCall>, usize) {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let inner = {
        let gate = Arc::clone(&gate);
        service_fn(move |()| {
            let gate = Arc::clone(&gate);
            async move {
                let _ = gate.acquire().await;
                Ok::<_, std::io::Error>("paid")
            }
        })
    };
    let svc = tower::ServiceBuilder::new()
        .layer(registry.bulkhead("payment").unwrap().layer())
        .service(inner);
    let mut pending = Vec::new();
    let mut rejected = 0;
    for _ in 0..n {
        let mut svc = svc.clone();
        let mut call: PendingCall = Box::pin(svc.ready().await.unwrap().call(()));
        match futures::poll!(&mut call) {
            std::task::Poll::Ready(Err(e)) => {
                assert!(e.is::<BulkheadFull>(), "{e}");
                rejected += 1;
            }
            std::task::Poll::Ready(Ok(_)) => panic!("no call can finish before the gate opens"),
            std::task::Poll::Pending => pending.push(call),
        }
    }
    (gate, pending, rejected)
}

#[test]
fn eleven_requests_against_ten_and_a_bulkhead_run_give_exact_metrics() {
    let (during, after) = on_own_recorder(&runtime(), |snapshotter| async move {
        let registry = Registry::from_toml_str(ORDERS_CONFIG).unwrap();
        let app = router(&registry, "api", [203, 0, 113, 7]);
        let mut statuses = Vec::new();
        for _ in 0..11 {
            statuses.push(get_orders(&app).await);
        }
        assert_eq!(
            statuses.iter().filter(|s| **s == StatusCode::OK).count(),
            10
        );
        assert_eq!(statuses[10], StatusCode::TOO_MANY_REQUESTS);

        // Six calls against a bulkhead of two; the two admitted hold their permits until
        // the gate opens.
        let (gate, calls, rejected) = calls_through_payment(&registry, 6).await;
        assert_eq!((calls.len(), rejected), (2, 4));
        registry.publish_gauges();
        // The debugging recorder hands counters over when snapshotted: this one holds
        // everything up to here, the final one what happened after.
        let during = series(&snapshotter);
        {
            let gauge = |name, label| find(&during, MetricKind::Gauge, name, &[("name", label)]);
            assert_eq!(
                gauge("bulwark_bulkhead_available_concurrent_calls", "payment"),
                Some(&DebugValue::Gauge(0.0.into()))
            );
            assert_eq!(
                gauge("bulwark_bulkhead_max_allowed_concurrent_calls", "payment"),
                Some(&DebugValue::Gauge(2.0.into()))
            );
            assert_eq!(
                gauge("bulwark_bulkhead_queue_depth", "payment"),
                Some(&DebugValue::Gauge(0.0.into()))
            );
        }
        gate.add_permits(2);
        for call in calls {
            assert_eq!(call.await.unwrap(), "paid");
        }
        registry.publish_gauges();
        during
    });

    use DebugValue::{Counter, Gauge};
    let (counter, gauge) = (MetricKind::Counter, MetricKind::Gauge);
    let rl_calls = "bulwark_ratelimiter_calls_total";
    let bh_calls = "bulwark_bulkhead_calls_total";
    let (api, payment) = (("name", "api"), ("name", "payment"));
    #[rustfmt::skip]
    let expected: [(_, _, _, &[(&str, &str)], _); 8] = [
        (&during, counter, rl_calls, &[api, ("outcome", "allowed")], Counter(10)),
        (&during, counter, rl_calls, &[api, ("outcome", "limited")], Counter(1)),
        (&during, gauge, "bulwark_ratelimiter_available_permissions", &[api], Gauge(0.0.into())),
        (&during, gauge, "bulwark_ratelimiter_waiting_requests", &[api], Gauge(0.0.into())),
        (&during, counter, bh_calls, &[payment, ("outcome", "permitted")], Counter(2)),
        (&during, counter, bh_calls, &[payment, ("outcome", "rejected")], Counter(4)),
        (&after, counter, bh_calls, &[payment, ("outcome", "finished")], Counter(2)),
        (&after, gauge, "bulwark_bulkhead_available_concurrent_calls", &[payment], Gauge(2.0.into())),
    ];
    for (values, kind, name, labels, value_wanted) in expected {
        assert_eq!(
            find(values, kind, name, labels),
            Some(&value_wanted),
            "{name} {labels:?}"
        );
    }
    match find(
        &after,
        MetricKind::Histogram,
        "bulwark_bulkhead_call_duration_seconds",
        &[("name", "payment")],
    ) {
        Some(DebugValue::Histogram(samples)) => assert_eq!(samples.len(), 2),
        other => panic!("no duration histogram: {other:?}"),
    }
}

#[test]
fn health_stays_up_while_saturated_and_shows_the_saturation() {
    runtime().block_on(async {
        let registry = Registry::from_toml_str(ORDERS_CONFIG).unwrap();
        let before: serde_json::Value = serde_json::from_str(&registry.health().to_json()).unwrap();
        assert_eq!(before["status"], "UP");
        assert_eq!(before["rateLimiters"]["api"]["saturated"], false);
        let app = router(&registry, "api", [203, 0, 113, 8]);
        for _ in 0..12 {
            get_orders(&app).await;
        }
        let health = registry.health();
        assert_eq!(health.status(), "UP");
        let json: serde_json::Value = serde_json::from_str(&health.to_json()).unwrap();
        assert_eq!(json["status"], "UP");
        assert_eq!(json["rateLimiters"]["api"]["status"], "UP");
        assert_eq!(json["rateLimiters"]["api"]["saturated"], true);
        assert_eq!(json["rateLimiters"]["api"]["availablePermissions"], 0);
        assert_eq!(json["rateLimiters"]["api"]["allowedCalls"], 10);
        assert_eq!(json["rateLimiters"]["api"]["limitedCalls"], 2);
        assert_eq!(json["bulkheads"]["payment"]["maxAllowedConcurrentCalls"], 2);
        assert_eq!(json["bulkheads"]["payment"]["saturated"], false);
    });
}

#[test]
fn unknown_names_are_errors_and_file_instances_behave_like_code_instances() {
    use std::net::IpAddr;
    use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
    use tower_bulwark::{algorithm::SlidingLog, KeyedRateLimiter, Quota};

    let registry = Registry::from_toml_str(
        "[rate_limiters.api]\nlimit_for_period = 3\nlimit_refresh_period = \"1h\"\nalgorithm = \"sliding_log\"\n",
    )
    .unwrap();
    let err = registry.rate_limit_layer("orders").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no rate limiter named `orders` is configured"
    );
    assert!(registry.bulkhead("payment").is_err());

    runtime().block_on(async {
        let from_file = router(&registry, "api", [203, 0, 113, 9]);
        let limiter = KeyedRateLimiter::<IpAddr>::builder(Quota::per_hour(3).unwrap())
            .algorithm::<SlidingLog>()
            .build();
        let from_code = Router::new()
            .route("/orders", get(|| async { "ok" }))
            .route_layer(RateLimitLayer::new(
                Policy::new("api", PeerIp::new(), limiter).unwrap(),
            ))
            .layer(MockConnectInfo(SocketAddr::from(([203, 0, 113, 9], 4000))));
        for i in 0..5 {
            let req = || Request::get("/orders").body(Body::empty()).unwrap();
            let a = from_file.clone().oneshot(req()).await.unwrap();
            let b = from_code.clone().oneshot(req()).await.unwrap();
            assert_eq!(a.status(), b.status(), "request {i}");
            for h in ["ratelimit-policy", "ratelimit", "retry-after"] {
                assert_eq!(
                    a.headers().get(h),
                    b.headers().get(h),
                    "request {i} header {h}"
                );
            }
        }
    });
}

/// Stops the example server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_example_serves_metrics_that_match_what_the_client_saw() {
    // `cargo test` builds the examples next to the test binaries' folder.
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join("observability"))
        .unwrap();
    assert!(example.exists(), "{} was not built", example.display());
    let mut child = Command::new(&example)
        .env("ADDR", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let first_line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let base = first_line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .map(|a| a.trim_end_matches(';').to_owned())
        .unwrap_or_else(|| panic!("no address in {first_line:?}"));

    let client = reqwest::Client::new();
    let (mut ok, mut limited) = (0u64, 0u64);
    let burst: Vec<_> = (0..25)
        .map(|_| client.get(format!("http://{base}/orders")).send())
        .collect();
    for response in futures::future::join_all(burst).await {
        match response.unwrap().status() {
            reqwest::StatusCode::OK => ok += 1,
            reqwest::StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert!(
        limited > 0,
        "a burst of 25 against 10 per second is refused in part"
    );
    let text = get_text(&client, &format!("http://{base}/metrics")).await;
    let series = |outcome: &str| {
        let prefix = format!(
            "{}{{name=\"api\",outcome=\"{outcome}\"}} ",
            "bulwark_ratelimiter_calls_total"
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {outcome} series in\n{text}"))
    };
    assert_eq!(series("allowed"), ok);
    assert_eq!(series("limited"), limited);
    // The file's pushback has its gauge, published with the others: nothing held.
    let held = format!("{}{{name=\"partner\"}} 0", "bulwark_pushback_held_seconds");
    assert!(text.lines().any(|l| l == held), "no `{held}` in\n{text}");
    let health = get_text(&client, &format!("http://{base}/health")).await;
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "UP");
    assert_eq!(health["rateLimiters"]["api"]["limitedCalls"], limited);
    assert_eq!(health["pushbacks"]["partner"]["holding"], false);
    drop(server);
}

#[test]
fn hooks_a_user_adds_to_a_configured_bulkhead_run_beside_its_metrics() {
    let rejected_by = Arc::new(Mutex::new(Vec::new()));
    let ((), counters) = on_own_recorder(&runtime(), |_| async {
        let seen = Arc::clone(&rejected_by);
        let registry = Registry::from_toml_str_with(ORDERS_CONFIG, move |name, builder| {
            let seen = Arc::clone(&seen);
            let name = name.to_owned();
            builder.on_call_rejected(move |_: &tower_bulwark::bulkhead::CallRejected<'_>| {
                seen.lock().unwrap().push(name.clone());
            })
        })
        .unwrap();
        // Two calls hold the bulkhead's two permits; three more are refused.
        let (gate, held, rejected) = calls_through_payment(&registry, 5).await;
        assert_eq!(rejected, 3);
        assert_eq!(held.len(), 2);
        gate.add_permits(2);
        for call in held {
            assert_eq!(call.await.unwrap(), "paid");
        }
    });
    assert_eq!(*rejected_by.lock().unwrap(), vec!["payment"; 3]);
    let counter = |outcome| {
        find(
            &counters,
            MetricKind::Counter,
            "bulwark_bulkhead_calls_total",
            &[("name", "payment"), ("outcome", outcome)],
        )
    };
    assert_eq!(counter("permitted"), Some(&DebugValue::Counter(2)));
    assert_eq!(counter("rejected"), Some(&DebugValue::Counter(3)));
    assert_eq!(counter("finished"), Some(&DebugValue::Counter(2)));
}
