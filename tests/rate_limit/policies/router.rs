//! Policies v2: each policy with its own key, cost, counting rule and shadow mode, on one layer,
//! through axum's router with `oneshot` and a manual clock (no listener, no sleeps).

use crate::common::direct_on;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::extract::MatchedPath;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use http::{HeaderValue, Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{FailMode, GlobalKey, HeaderKey, PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{
    algorithm::SlidingLog, clock::ManualClock, BoxError, DirectRateLimiter, KeyedRateLimiter,
    Limiter, Quota,
};

use crate::common::listener;
use crate::support::{json, keyed, peer, Broken};

fn api_key() -> HeaderKey {
    HeaderKey::new("x-api-key").unwrap()
}

async fn send(app: &Router, method: &str, path: &str, from: &str, key: Option<&str>) -> Response {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    if let Some(key) = key {
        request
            .headers_mut()
            .insert("x-api-key", HeaderValue::from_str(key).unwrap());
    }
    app.clone()
        .layer(MockConnectInfo(peer(from)))
        .oneshot(request)
        .await
        .unwrap()
}

fn names(response: &Response, header: &str) -> Vec<String> {
    listener::sf_names(response.headers(), header)
}

#[tokio::test]
async fn each_policy_counts_against_its_own_key() {
    let clock = ManualClock::new();
    let per_ip = keyed::<IpAddr>(Quota::per_hour(3).unwrap(), &clock);
    let per_key = keyed::<HeaderValue>(Quota::per_hour(4).unwrap(), &clock);
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("per-ip", PeerIp::new(), per_ip.clone())
                .unwrap()
                .and(Policy::new("per-key", api_key(), per_key.clone()).unwrap()),
        ));
    // One key from three addresses: the key's budget of 4 binds, not the addresses'.
    let mut admitted = 0;
    for ip in ["192.0.2.1", "192.0.2.2", "192.0.2.3"]
        .iter()
        .cycle()
        .take(9)
    {
        if send(&app, "GET", "/items", ip, Some("k1")).await.status() == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 4);
    // One address with fresh keys: the address's budget of 3 binds; it has spent 1 or 2 above
    // (4 admissions over three addresses, round robin: 2, 1, 1), and refusals spent nothing.
    let mut admitted = 0;
    for key in ["a", "b", "c", "d", "e"] {
        if send(&app, "GET", "/items", "192.0.2.3", Some(key))
            .await
            .status()
            == StatusCode::OK
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2, "192.0.2.3 had 1 of 3 spent");
    // What the limiters hold agrees: keys a and b spent one each, c, d, e nothing.
    let v = |s: &'static str| HeaderValue::from_static(s);
    assert_eq!(per_key.check(&v("a")).remaining, 2);
    assert_eq!(per_key.check(&v("c")).remaining, 3);
    assert_eq!(per_key.check(&v("k1")).remaining, 0, "k1 is spent");
}

#[tokio::test]
async fn a_refusal_by_one_key_spends_nothing_under_the_others() {
    let clock = ManualClock::new();
    let per_ip = keyed::<IpAddr>(Quota::per_hour(100).unwrap(), &clock);
    let per_key = keyed::<HeaderValue>(Quota::per_hour(1).unwrap(), &clock);
    let all = direct_on(Quota::per_hour(100).unwrap(), &clock);
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("per-ip", PeerIp::new(), per_ip.clone())
                .unwrap()
                .and(Policy::new("per-key", api_key(), per_key.clone()).unwrap())
                .and(Policy::new("all", GlobalKey, all.clone()).unwrap()),
        ));
    assert_eq!(
        send(&app, "GET", "/items", "192.0.2.9", Some("k"))
            .await
            .status(),
        StatusCode::OK
    );
    for _ in 0..50 {
        let refused = send(&app, "GET", "/items", "192.0.2.9", Some("k")).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            names(&refused, "ratelimit"),
            ["per-ip", "per-key", "all"][1..2]
        );
        assert_eq!(
            names(&refused, "ratelimit-policy"),
            ["per-ip", "per-key", "all"]
        );
    }
    // Fifty refusals later, the IP and the route have spent one permit each.
    assert_eq!(per_ip.check(&"192.0.2.9".parse().unwrap()).remaining, 98);
    assert_eq!(all.check().remaining, 98);
}

#[tokio::test]
async fn the_cost_comes_from_the_matched_route() {
    let clock = ManualClock::new();
    let per_ip = keyed::<IpAddr>(Quota::per_hour(10).unwrap(), &clock);
    let cost = |request: &RequestHead| match request
        .extensions
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
    {
        Some("/search") => 5,
        Some("/items/{id}") => 1,
        _ => 0,
    };
    let app = Router::new()
        .route("/search", get(|| async { "found" }))
        .route("/items/{id}", get(|| async { "item" }))
        .route("/free", get(|| async { "free" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("per-ip", PeerIp::new(), per_ip.clone())
                .unwrap()
                .cost_by(cost),
        ));
    let ip = "198.51.100.4";
    let search = send(&app, "GET", "/search", ip, None).await;
    assert_eq!(search.status(), StatusCode::OK);
    let state = listener::sf_list(search.headers()["ratelimit"].to_str().unwrap());
    assert_eq!(
        state[0].1[0],
        ("r".to_string(), 5),
        "a search costs 5 of 10"
    );
    assert_eq!(
        send(&app, "GET", "/items/7", ip, None).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, "GET", "/items/8", ip, None).await.status(),
        StatusCode::OK
    );
    // 3 left: a search (5) is refused, and spends nothing; three items (1 each) are admitted.
    let refused = send(&app, "GET", "/search", ip, None).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    for id in 0..3 {
        assert_eq!(
            send(&app, "GET", &format!("/items/{id}"), ip, None)
                .await
                .status(),
            StatusCode::OK
        );
    }
    assert_eq!(
        send(&app, "GET", "/items/9", ip, None).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // A route that costs nothing is outside the policy: admitted, and no headers for it.
    let free = send(&app, "GET", "/free", ip, None).await;
    assert_eq!(free.status(), StatusCode::OK);
    assert!(free.headers().get("ratelimit").is_none());
    assert!(free.headers().get("ratelimit-policy").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_cost_above_the_burst_is_refused_as_never_admissible_and_spends_nothing() {
    let clock = ManualClock::new();
    let small = keyed::<IpAddr>(Quota::per_second(10).unwrap(), &clock);
    let other = keyed::<IpAddr>(Quota::per_hour(1).unwrap(), &clock);
    let app = Router::new()
        .route("/bulk", post(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("small", PeerIp::new(), small.clone())
                .unwrap()
                .cost(11)
                .and(Policy::new("other", PeerIp::new(), other.clone()).unwrap()),
        ));
    let ip = "203.0.113.50";
    // `other` admits the first request, `small` can never admit it: the request is refused at
    // once, with a `413` that clients do not retry and no `Retry-After` (no wait would help),
    // and `other` keeps its permit.
    let start = tokio::time::Instant::now();
    let refused = send(&app, "POST", "/bulk", ip, None).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(refused.headers().get("retry-after").is_none());
    let problem = json(refused).await;
    assert_eq!(problem["status"], 413);
    assert_eq!(problem["largest-cost"], 10, "the most `small` ever admits");
    assert_eq!(problem["violated-policies"], serde_json::json!(["small"]));
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("never be admitted"), "{detail}");
    assert!(detail.contains("11 permits asked, at most 10"), "{detail}");
    assert_eq!(
        other.check(&ip.parse().unwrap()).remaining,
        0,
        "other was untouched"
    );
    assert_eq!(
        small.check(&ip.parse().unwrap()).remaining,
        9,
        "small was untouched"
    );
}

/// The login route of the issue: only failed attempts count, five per minute per IP.
fn login_app(limiter: impl Limiter<IpAddr> + Clone) -> (Router, Arc<AtomicUsize>) {
    let handled = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&handled);
    let app = Router::new()
        .route(
            "/login",
            post(move |body: String| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    if body == "password=secret" {
                        StatusCode::OK
                    } else {
                        StatusCode::UNAUTHORIZED
                    }
                }
            }),
        )
        .route_layer(RateLimitLayer::new(
            Policy::new("login-failures", PeerIp::new(), limiter)
                .unwrap()
                .count_if(|response| response.status == StatusCode::UNAUTHORIZED),
        ));
    (app, handled)
}

async fn login(app: &Router, ip: &str, password: &str) -> StatusCode {
    let request = Request::post("/login")
        .body(Body::from(format!("password={password}")))
        .unwrap();
    app.clone()
        .layer(MockConnectInfo(peer(ip)))
        .oneshot(request)
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn only_failed_logins_count_and_a_client_over_the_limit_never_reaches_the_handler() {
    for algorithm in ["gcra", "sliding-log"] {
        let clock = ManualClock::new();
        let quota = Quota::per_minute(5).unwrap();
        let (app, handled) = if algorithm == "gcra" {
            login_app(keyed::<IpAddr>(quota, &clock))
        } else {
            login_app(
                KeyedRateLimiter::<IpAddr>::builder(quota)
                    .algorithm::<SlidingLog>()
                    .clock(clock.clone())
                    .build(),
            )
        };
        let ip = "192.0.2.77";
        // Successes in between failures never count.
        for round in 0..4 {
            assert_eq!(login(&app, ip, "guess").await, StatusCode::UNAUTHORIZED);
            for _ in 0..10 {
                assert_eq!(
                    login(&app, ip, "secret").await,
                    StatusCode::OK,
                    "{algorithm} {round}"
                );
            }
        }
        assert_eq!(login(&app, ip, "guess").await, StatusCode::UNAUTHORIZED);
        // Five failures: the sixth attempt is refused, even with the right password, and the
        // handler does not run.
        let before = handled.load(Ordering::SeqCst);
        assert_eq!(
            login(&app, ip, "secret").await,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm}"
        );
        assert_eq!(handled.load(Ordering::SeqCst), before);
        // Another client is not affected.
        assert_eq!(login(&app, "192.0.2.78", "secret").await, StatusCode::OK);
        // A minute later the client may try again.
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            login(&app, ip, "secret").await,
            StatusCode::OK,
            "{algorithm}"
        );
    }
}

#[tokio::test]
async fn concurrent_attempts_over_the_limit_are_refused_before_the_handler() {
    // Fifty attempts at once, against a handler that answers only when released: five hold a
    // permit and reach it, the other 45 are refused before it runs.
    let clock = ManualClock::new();
    let limiter = keyed::<IpAddr>(Quota::per_minute(5).unwrap(), &clock);
    let gate = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(AtomicUsize::new(0));
    let (g, e) = (Arc::clone(&gate), Arc::clone(&entered));
    let app = Router::new()
        .route(
            "/login",
            post(move || {
                let (g, e) = (Arc::clone(&g), Arc::clone(&e));
                async move {
                    e.fetch_add(1, Ordering::SeqCst);
                    g.notified().await;
                    StatusCode::OK
                }
            }),
        )
        .route_layer(RateLimitLayer::new(
            Policy::new("login-failures", PeerIp::new(), limiter.clone())
                .unwrap()
                .count_if(|response| response.status == StatusCode::UNAUTHORIZED),
        ));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let request = Request::post("/login").body(Body::empty()).unwrap();
            app.layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 5], 1))))
                .oneshot(request)
                .await
                .unwrap()
                .status()
        }));
    }
    while entered.load(Ordering::SeqCst) < 5 {
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(entered.load(Ordering::SeqCst), 5);
    // Release the five: their logins succeed, so each gives its permit back.
    loop {
        gate.notify_waiters();
        tokio::task::yield_now().await;
        if tasks.iter().all(|t| t.is_finished()) {
            break;
        }
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 5);
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count(),
        45
    );
    assert_eq!(
        limiter.check(&"192.0.2.5".parse().unwrap()).remaining,
        4,
        "all five successes were given back"
    );
}

#[tokio::test]
async fn a_request_counts_unless_its_response_proves_otherwise() {
    use std::convert::Infallible;
    use tower::service_fn;

    let clock = ManualClock::new();
    let limiter = keyed::<IpAddr>(Quota::per_hour(10).unwrap(), &clock);
    let layer = RateLimitLayer::new(
        Policy::new("failures", PeerIp::new(), limiter.clone())
            .unwrap()
            .count_if(|response| response.status.is_server_error()),
    );
    let ip: IpAddr = "192.0.2.40".parse().unwrap();
    let request = || {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::new(ip, 1)));
        request
    };
    // An inner service that fails (no response at all): the permit stays spent.
    let failing = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: Request<Body>| async {
            Err::<http::Response<Body>, BoxError>("boom".into())
        }));
    assert!(failing.oneshot(request()).await.is_err());
    assert_eq!(limiter.check(&ip).remaining, 8, "the failed call counted");

    // A response future dropped while the inner service works: the permit stays spent.
    let slow = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: Request<Body>| async {
            std::future::pending::<Result<http::Response<Body>, Infallible>>().await
        }));
    let mut future = Box::pin(slow.oneshot(request()));
    assert!(futures::poll!(future.as_mut()).is_pending());
    drop(future);
    assert_eq!(
        limiter.check(&ip).remaining,
        6,
        "the abandoned call counted"
    );

    // A 200 is given back; a 503 is not.
    for (status, left) in [(StatusCode::OK, 5), (StatusCode::SERVICE_UNAVAILABLE, 3)] {
        let svc = tower::ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(move |_: Request<Body>| async move {
                let mut response = http::Response::new(Body::empty());
                *response.status_mut() = status;
                Ok::<_, Infallible>(response)
            }));
        assert_eq!(svc.oneshot(request()).await.unwrap().status(), status);
        assert_eq!(limiter.check(&ip).remaining, left, "{status}");
    }
}

#[tokio::test]
async fn a_shadow_policy_never_refuses_and_stays_out_of_the_headers() {
    let clock = ManualClock::new();
    let enforced = keyed::<IpAddr>(Quota::per_hour(5).unwrap(), &clock);
    let shadow = keyed::<IpAddr>(Quota::per_hour(2).unwrap(), &clock);
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("enforced", PeerIp::new(), enforced.clone())
                .unwrap()
                .and(
                    Policy::new("candidate", PeerIp::new(), shadow.clone())
                        .unwrap()
                        .shadow(),
                ),
        ));
    let ip = "192.0.2.60";
    for i in 0..5 {
        let response = send(&app, "GET", "/items", ip, None).await;
        assert_eq!(response.status(), StatusCode::OK, "request {i}");
        assert_eq!(names(&response, "ratelimit"), ["enforced"]);
        assert_eq!(names(&response, "ratelimit-policy"), ["enforced"]);
    }
    let refused = send(&app, "GET", "/items", ip, None).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        json(refused).await["violated-policies"],
        serde_json::json!(["enforced"])
    );
    // The shadow policy counted what it admitted (2), refused nothing for real.
    assert!(!shadow.check(&ip.parse().unwrap()).allowed);
}

#[tokio::test]
async fn an_advertised_shadow_policy_tells_the_client_what_would_happen() {
    let clock = ManualClock::new();
    let shadow = keyed::<IpAddr>(Quota::per_hour(1).unwrap(), &clock);
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("next-month", PeerIp::new(), shadow)
                .unwrap()
                .shadow_advertised(),
        ));
    let ip = "192.0.2.61";
    let first = send(&app, "GET", "/items", ip, None).await;
    assert_eq!(first.status(), StatusCode::OK);
    let second = send(&app, "GET", "/items", ip, None).await;
    assert_eq!(
        second.status(),
        StatusCode::OK,
        "a shadow policy never refuses"
    );
    let state = listener::sf_list(second.headers()["ratelimit"].to_str().unwrap());
    assert_eq!(state[0].0, "next-month");
    assert_eq!(state[0].1[0], ("r".to_string(), 0), "would have refused");
    assert!(second.headers().get("retry-after").is_none());
}

#[cfg(feature = "metrics")]
#[test]
fn shadow_refusals_are_counted_in_metrics() {
    use crate::common::recorded::{counter, recorded_by};
    let clock = ManualClock::new();
    let shadow = keyed::<IpAddr>(Quota::per_hour(3).unwrap(), &clock);
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new("candidate", PeerIp::new(), shadow)
                .unwrap()
                .shadow(),
        ));
    let all = recorded_by(|| {
        futures::executor::block_on(async {
            for _ in 0..10 {
                let response = send(&app, "GET", "/items", "192.0.2.62", None).await;
                assert_eq!(response.status(), StatusCode::OK);
            }
        })
    });
    let name = "bulwark_ratelimit_shadow_refusals_total";
    let counted = counter(&all, name, &[("name", "candidate")]);
    assert_eq!(counted, 7);
    assert_eq!(all.iter().filter(|(_, n, ..)| n == name).count(), 1);
}

#[tokio::test]
async fn a_failing_shadow_policy_never_answers_503() {
    let broken = Broken(Quota::per_second(1).unwrap());
    let shadow = Policy::new("broken", PeerIp::new(), broken)
        .unwrap()
        .shadow();
    let failing_closed = RateLimitLayer::new(shadow).limiter_error_mode(FailMode::Closed);
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(failing_closed);
    for _ in 0..3 {
        assert_eq!(
            send(&app, "GET", "/items", "192.0.2.63", None)
                .await
                .status(),
            StatusCode::OK
        );
    }
}

#[tokio::test]
async fn a_vec_of_configured_policies_decides_like_a_chain() {
    let clock = ManualClock::new();
    let limiters: Vec<_> = [3, 2, 4]
        .iter()
        .map(|n| keyed::<IpAddr>(Quota::per_hour(*n).unwrap(), &clock))
        .collect();
    let policies: Vec<_> = limiters
        .iter()
        .enumerate()
        .map(|(i, l)| Policy::new(format!("p{i}"), PeerIp::new(), l.clone()).unwrap())
        .collect();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(policies));
    let ip = "192.0.2.70";
    let mut admitted = 0;
    for _ in 0..10 {
        let response = send(&app, "GET", "/items", ip, None).await;
        if response.status() == StatusCode::OK {
            admitted += 1;
            assert_eq!(names(&response, "ratelimit"), ["p0", "p1", "p2"]);
        } else {
            assert_eq!(names(&response, "ratelimit"), ["p1"]);
        }
    }
    assert_eq!(admitted, 2);
    let left: Vec<_> = limiters
        .iter()
        .map(|l| l.check(&ip.parse().unwrap()).remaining)
        .collect();
    assert_eq!(
        left,
        [0, 0, 1],
        "two admitted spent two of each, checks one more"
    );
}

#[tokio::test]
async fn rate_limit_policy_names_the_policies_that_took_part_whatever_their_number() {
    // Beyond 64 policies the layer can no longer tell sets apart by one bit each: two requests
    // that differ only in whether policy 63 or policy 64 sat out must still be told apart.
    let limiters: Vec<_> = (0..66)
        .map(|_| DirectRateLimiter::new(Quota::per_hour(100).unwrap()))
        .collect();
    let policies: Vec<_> = limiters
        .iter()
        .enumerate()
        .map(|(i, l)| {
            Policy::new(format!("p{i}"), GlobalKey, l.clone())
                .unwrap()
                .cost_by(move |request| {
                    let skip = request.headers.get("x-skip").and_then(|v| v.to_str().ok());
                    u32::from(skip != Some(i.to_string().as_str()))
                })
        })
        .collect();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(policies));
    for skipped in [64, 63, 64] {
        let request = Request::get("/items")
            .header("x-skip", skipped.to_string())
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let advertised = names(&response, "ratelimit-policy");
        assert_eq!(advertised.len(), 65);
        assert!(
            !advertised.contains(&format!("p{skipped}")),
            "p{skipped} sat out but is advertised"
        );
    }
}
