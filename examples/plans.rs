//! An API with plans: limits per client IP, per API key by plan, costs per route, a login route
//! that counts only failed attempts, and an exempt health check, all on one layer.
//!
//! ```sh
//! cargo run --example plans
//! # a free key: 20 permits a day; /search costs 5 of them, /items 1
//! curl -si -H 'x-api-key: free-alice' http://127.0.0.1:3002/search | grep -i ratelimit
//! # no key on a planned route: 401 problem+json
//! curl -si http://127.0.0.1:3002/items
//! # five wrong passwords a minute per IP; the sixth attempt is 429 even with the right one
//! for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' -d password=nope http://127.0.0.1:3002/login; done
//! curl -s -o /dev/null -w '%{http_code}\n' -d password=secret http://127.0.0.1:3002/login
//! # exempt: no policy, no headers
//! curl -si http://127.0.0.1:3002/health
//! ```
//!
//! `ADDR` overrides the address (`ADDR=0.0.0.0:8080 cargo run --example plans`).

use std::net::SocketAddr;

use axum::extract::MatchedPath;
use axum::routing::{get, post};
use axum::{Form, Router};
use http::header::HeaderName;
use http::{HeaderValue, Method, StatusCode};
use tokio::net::TcpListener;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{
    HeaderKey, KeyError, KeyExtractor, PeerIp, Policy, RateLimitLayer,
};
use tower_bulwark::{
    algorithm::Gcra,
    clock::{Clock, SystemClock},
    tiers::Tiers,
    KeyedRateLimiter, Quota,
};

const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The route a request matched (axum puts it in the extensions before a `route_layer` runs).
fn route<'a>(request: &RequestHead<'a>) -> Option<&'a str> {
    request
        .extensions
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
}

/// What a request costs on the routes that are counted per IP and per plan.
fn route_cost(request: &RequestHead) -> u32 {
    match (request.method, route(request)) {
        (&Method::GET, Some("/search")) => 5,
        _ => 1,
    }
}

/// The plan of an API key.
fn plan(key: &HeaderValue) -> &'static str {
    if key.as_bytes().starts_with(b"pro-") {
        "pro"
    } else {
        // Every other key, `free-` or not, gets the smallest plan.
        "free"
    }
}

/// The service: its routes and its one rate-limit layer, reading time from `clock` (the system
/// clock here; a manual clock in the test that drives this app).
pub fn app<C: Clock + Clone>(clock: C) -> Result<(Router, String), Box<dyn std::error::Error>> {
    let per_ip_quota = Quota::per_second(10)?;
    let free_quota = Quota::per_day(20)?;
    let pro_quota = Quota::per_day(10_000)?;
    let login_quota = Quota::per_minute(5)?;
    // One limiter per policy (and per plan), each keeping its keys' state in memory.
    fn keyed<K, C>(quota: Quota, clock: &C) -> KeyedRateLimiter<K, Gcra, C>
    where
        K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
        C: Clock + Clone,
    {
        KeyedRateLimiter::builder(quota)
            .clock(clock.clone())
            .build()
    }

    let per_ip =
        Policy::new("per-ip", PeerIp::new(), keyed(per_ip_quota, &clock))?.cost_by(route_cost);

    // The plan's key is the API key; a planned route without one is a 401.
    let api_key = HeaderKey::new(X_API_KEY)?;
    let plan_key = move |request: &RequestHead| {
        if request.headers.contains_key(X_API_KEY) {
            api_key.extract(request)
        } else {
            Err(KeyError::unauthorized(
                "this route needs an `x-api-key` header",
            ))
        }
    };
    let plans =
        Tiers::new(plan, "free", keyed(free_quota, &clock)).tier("pro", keyed(pro_quota, &clock));
    let plan_policy = Policy::new("plan", plan_key, plans)?.cost_by(|request| {
        match route(request) {
            Some("/items" | "/search") => route_cost(request),
            _ => 0, // not a planned route
        }
    });

    let login_failures = Policy::new("login-failures", PeerIp::new(), keyed(login_quota, &clock))?
        .cost_by(|request| u32::from(route(request) == Some("/login")))
        .count_if(|response| response.status == StatusCode::UNAUTHORIZED);

    let layer = RateLimitLayer::new(per_ip.and(plan_policy).and(login_failures))
        .exempt(|request| request.uri.path() == "/health");

    let app = Router::new()
        .route("/items", get(|| async { "items\n" }))
        .route("/search", get(|| async { "results\n" }))
        .route("/login", post(login))
        .route_layer(layer)
        .route("/health", get(|| async { "ok\n" }));

    let description = format!(
        "policies (one layer):\n\
         \x20 per-ip          {} per second per client IP, on /items, /search and /login\n\
         \x20 plan            per x-api-key, on /items and /search: free-* {} per day, pro-* {} per day; no key: 401\n\
         \x20 login-failures  {} failed POST /login per minute per client IP (successes never count)\n\
         costs: GET /items 1, GET /search 5 (of per-ip and plan); GET /health is exempt",
        per_ip_quota.permits(),
        free_quota.permits(),
        pro_quota.permits(),
        login_quota.permits(),
    );
    Ok((app, description))
}

#[derive(serde::Deserialize)]
struct Login {
    password: String,
}

async fn login(Form(form): Form<Login>) -> (StatusCode, &'static str) {
    if form.password == "secret" {
        (StatusCode::OK, "welcome\n")
    } else {
        (StatusCode::UNAUTHORIZED, "wrong password\n")
    }
}

#[allow(dead_code)] // The test that drives `app` includes this file without running `main`.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3002".to_owned());
    let (app, description) = app(SystemClock::new())?;
    let listener = TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("{description}");
    // `PeerIp` keys by the TCP peer: serve with connection info.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
