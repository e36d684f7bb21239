//! The README's outbound snippets in a new user's project (reqwest 0.13, tower-http 0.7), run
//! against a local server: the documented stack (timeout → pushback → client quota → bulkhead
//! → `reqwest::Client`), the adaptive bulkhead's default classifier on a `reqwest::Client`, and
//! a tower-http classifier on the same client. Each line it prints is checked as it goes.

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tower::{ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::adaptive::{AdaptiveBulkhead, Aimd, FromTowerHttp, Limits};
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::outbound::{self, ClientQuotaLayer, Pushback};
use tower_bulwark::{BoxError, DirectRateLimiter, Quota};
use tower_http::classify::StatusInRangeAsFailures;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The partner: `/v1/items` says nothing is left for a minute; `/v1/broken` fails.
    let app = Router::new()
        .route(
            "/v1/items",
            get(|| async { ([("ratelimit", r#""partner";r=0;t=60"#)], "items") }),
        )
        .route(
            "/v1/broken",
            get(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let get = |route: &str| -> Result<reqwest::Request, BoxError> {
        let url = format!("{base}{route}").parse()?;
        Ok(reqwest::Request::new(reqwest::Method::GET, url))
    };

    // Order: (retry →) timeout → pushback → client quota → bulkhead → client.
    let partner = Pushback::new("partner");
    let quota = DirectRateLimiter::new(Quota::per_hour(5_000)?);
    let client = ServiceBuilder::new()
        .timeout(Duration::from_secs(5))
        .layer(partner.layer())
        .layer(ClientQuotaLayer::new("partner", quota))
        .layer(Bulkhead::semaphore("partner", 16).build().layer())
        .service(reqwest::Client::new());
    let first = client.clone().oneshot(get("/v1/items")?).await?;
    assert_eq!(first.status(), 200);
    let held = client.clone().oneshot(get("/v1/items")?).await.unwrap_err();
    let wait = outbound::retry_after(&*held).ok_or("the second call was not held back")?;
    assert!(wait > Duration::from_secs(50), "held for {wait:?}");
    println!(
        "stack: first call {}, then held back for {}s",
        first.status(),
        wait.as_secs()
    );

    // The adaptive bulkhead's default classifier on a `reqwest::Client`. Its latency signal is
    // turned off: this checks what the classifier makes of a 500, and a round slowed by a busy
    // machine would count as overload (a mean latency past 1.3 times the baseline, by default).
    let payment = AdaptiveBulkhead::builder("payment")
        .limits(Limits::new(2, 8, 64)?)
        .algorithm(Aimd::default().latency_tolerance(1_000.0)?)
        .build();
    let adaptive = ServiceBuilder::new()
        .layer(payment.layer())
        .service(reqwest::Client::new());
    // The algorithm decides once per round trip: a few calls in a row close a round.
    let mut answer = None;
    for _ in 0..5 {
        answer = Some(adaptive.clone().oneshot(get("/v1/broken")?).await?.status());
    }
    let answer = answer.ok_or("no call")?;
    assert_eq!(answer, 500);
    // A 500 is the dependency's own failure, answered in its own time: not overload.
    assert!(payment.limit() >= 8, "limit {}", payment.limit());
    println!(
        "adaptive (default classifier): {} leaves the limit at {}",
        answer,
        payment.limit()
    );

    // A tower-http 0.7 classifier on the same client: a 500 is overload, the limit comes down.
    let judged = AdaptiveBulkhead::builder("judged")
        .limits(Limits::new(2, 8, 64)?)
        .build();
    let classified = ServiceBuilder::new()
        .layer(judged.layer_with(FromTowerHttp(StatusInRangeAsFailures::new(500..=599))))
        .service(reqwest::Client::new());
    // Calls in a row until a round trip's worth of them has closed a round (a few on a quiet
    // machine; calls on a warm connection can be shorter than the first one's round), at most
    // 200 calls or five seconds.
    let started = std::time::Instant::now();
    let mut answer = None;
    for _ in 0..200 {
        let call = classified.clone().oneshot(get("/v1/broken")?).await?;
        answer = Some(call.status());
        if judged.limit() < 8 || started.elapsed() > Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let answer = answer.ok_or("no call")?;
    assert!(judged.limit() < 8, "limit {}", judged.limit());
    println!(
        "adaptive (tower-http classifier): {} brings the limit to {}",
        answer,
        judged.limit()
    );
    Ok(())
}
