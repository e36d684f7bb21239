//! A client of a dependency through the whole outbound stack, offered a steady load whatever
//! the dependency does: what a team gets from retries with a budget and a circuit breaker.
//!
//! It offers `OFFERED` requests a second (default 100), open-loop (each leaves at its instant
//! whatever the answers before it), for `SECS` seconds (default 30), each a `GET` of
//! `DEPENDENCY_URL` (default `http://127.0.0.1:3007/`), through
//!
//! ```text
//! retry → breaker → pushback → client quota → bulkhead → timeout → reqwest::Client
//! ```
//!
//! then prints `RESULT offered=N succeeded=N failed=N failed_fast=N` and exits. A request
//! succeeded if its answer is a `2xx`; it failed fast if the crate refused it without a single
//! call reaching the client (the breaker open, the pushback holding, the client quota or the
//! bulkhead full); it failed otherwise. `RETRY=off` runs the same stack with neither retries
//! nor breaker.
//!
//! ```sh
//! cargo run --release --all-features --example outage
//! # RESULT offered=3000 succeeded=3000 failed=0 failed_fast=0
//! ```
//!
//! `examples/outage_load.rs` starts a dependency that is healthy, then flaky, dead,
//! rate-limited and healthy again, runs this client against it, and checks each phase.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::outbound::breaker::Breaker;
use tower_bulwark::outbound::retry::Retry;
use tower_bulwark::outbound::{ClientQuotaLayer, Pushback};
use tower_bulwark::{BoxError, DirectRateLimiter, Quota};

/// The example's settings, from the environment.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Requests offered a second (`OFFERED`).
    pub offered: u32,
    /// How long the load lasts (`SECS`).
    pub secs: u32,
    /// What each request gets (`DEPENDENCY_URL`).
    pub url: String,
    /// Whether retries and the breaker are on (`RETRY`, `on` or `off`).
    pub retry: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            offered: 100,
            secs: 30,
            url: "http://127.0.0.1:3007/".into(),
            retry: true,
        }
    }
}

impl Settings {
    /// The defaults, with each variable that is set read over its default.
    ///
    /// # Errors
    ///
    /// A message naming the variable whose value is not what it should be.
    pub fn from_env() -> Result<Self, BoxError> {
        let default = Self::default();
        // Bounded so that the schedule's interval stays above zero and the count fits.
        let count = |name: &str, default: u32, most: u32| -> Result<u32, BoxError> {
            match std::env::var(name) {
                Err(_) => Ok(default),
                Ok(value) => match value.trim().parse() {
                    Ok(n) if (1..=most).contains(&n) => Ok(n),
                    _ => Err(
                        format!("{name}={value:?}: expected a whole number from 1 to {most}")
                            .into(),
                    ),
                },
            }
        };
        let retry = match std::env::var("RETRY") {
            Err(_) => default.retry,
            Ok(value) if value.trim().eq_ignore_ascii_case("on") => true,
            Ok(value) if value.trim().eq_ignore_ascii_case("off") => false,
            Ok(value) => return Err(format!("RETRY={value:?}: expected on or off").into()),
        };
        let url = std::env::var("DEPENDENCY_URL").unwrap_or(default.url);
        reqwest::Url::parse(&url).map_err(|e| format!("DEPENDENCY_URL={url:?}: {e}"))?;
        let (offered, secs) = (
            count("OFFERED", default.offered, 100_000)?,
            count("SECS", default.secs, 86_400)?,
        );
        // Each request keeps a record until the end.
        if u64::from(offered) * u64::from(secs) > 10_000_000 {
            return Err(
                format!("OFFERED={offered} SECS={secs}: at most 10 000 000 requests").into(),
            );
        }
        Ok(Self {
            offered,
            secs,
            url,
            retry,
        })
    }
}

/// What became of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A `2xx` answer.
    Succeeded,
    /// Refused by the crate without a call reaching the client.
    FailedFast,
    /// Any other end: an answer that is not `2xx`, a timeout, a connection error.
    Failed,
}

/// One request offered: when it was due (since the start of the load), its attempts (calls
/// that reached the client) and what became of it.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// When the request was due, from the start of the load.
    pub due: Duration,
    /// Calls of this request that reached the client.
    pub attempts: u32,
    /// What became of it.
    pub outcome: Outcome,
}

/// The calls of one request that reached the client: the innermost service counts them, reading
/// the counter from the request's extensions, which every attempt carries.
#[derive(Clone, Debug, Default)]
struct Attempts(Arc<AtomicU32>);

/// A request as the stack sees it: an `http::Request`, converted to reqwest's at the bottom.
type Request = http::Request<String>;

/// The stack around `client`, with retries and the breaker when `retry` is on: their defaults,
/// a client quota and a bulkhead wide enough that only a dependency in trouble meets them, and
/// a timeout of 500 ms on each attempt.
fn stack(
    client: reqwest::Client,
    retry: bool,
) -> Result<BoxCloneService<Request, reqwest::Response, BoxError>, BoxError> {
    // Innermost: count the call, then send it.
    let send = tower::service_fn(move |request: Request| {
        let client = client.clone();
        async move {
            if let Some(attempts) = request.extensions().get::<Attempts>() {
                attempts.0.fetch_add(1, Ordering::Relaxed);
            }
            let request = reqwest::Request::try_from(request)?;
            Ok::<_, BoxError>(client.execute(request).await?)
        }
    });
    let retries = retry
        .then(|| Retry::builder("dependency").build())
        .transpose()?;
    let breaker = retry
        .then(|| Breaker::builder("dependency").build())
        .transpose()?;
    let quota = DirectRateLimiter::new(Quota::per_second(1_000)?);
    let stack = ServiceBuilder::new()
        .option_layer(retries.map(|retries| retries.layer()))
        .option_layer(breaker.map(|breaker| breaker.layer()))
        .layer(Pushback::builder("dependency").build().layer())
        .layer(ClientQuotaLayer::new("dependency", quota))
        .layer(Bulkhead::semaphore("dependency", 64).build().layer())
        .timeout(Duration::from_millis(500))
        .service(send);
    Ok(BoxCloneService::new(stack.map_err(BoxError::from)))
}

/// Offers the load of `settings`, open-loop, and returns each request's record, in the order
/// they were due.
///
/// # Errors
///
/// If the HTTP client cannot be built.
pub async fn run(settings: &Settings) -> Result<Vec<Record>, BoxError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    let service = stack(client, settings.retry)?;
    let total = settings.offered * settings.secs;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / settings.offered);
    // Open loop: a request that could not leave at its instant leaves at once after.
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut requests = tokio::task::JoinSet::new();
    for n in 0..total {
        tick.tick().await;
        let due = Duration::from_secs(1) / settings.offered * n;
        let attempts = Attempts::default();
        let mut request = http::Request::get(&settings.url).body(String::new())?;
        request.extensions_mut().insert(attempts.clone());
        let call = service.clone().oneshot(request);
        requests.spawn(async move {
            let answer = call.await;
            let calls = attempts.0.load(Ordering::Relaxed);
            let outcome = match answer {
                Ok(response) if response.status().is_success() => Outcome::Succeeded,
                _ if calls == 0 => Outcome::FailedFast,
                _ => Outcome::Failed,
            };
            (
                n,
                Record {
                    due,
                    attempts: calls,
                    outcome,
                },
            )
        });
    }
    let mut records = vec![None; total as usize];
    while let Some(done) = requests.join_next().await {
        let (n, record) = done?;
        records[n as usize] = Some(record);
    }
    Ok(records.into_iter().flatten().collect())
}

/// The `RESULT` line of `records`.
pub fn result_line(records: &[Record]) -> String {
    let count = |outcome| records.iter().filter(|r| r.outcome == outcome).count();
    format!(
        "RESULT offered={} succeeded={} failed={} failed_fast={}",
        records.len(),
        count(Outcome::Succeeded),
        count(Outcome::Failed),
        count(Outcome::FailedFast)
    )
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = Settings::from_env()?;
    let records = run(&settings).await?;
    println!("{}", result_line(&records));
    Ok(())
}
