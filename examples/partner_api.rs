//! A partner API that allows N calls per window, called by many tasks through a client quota
//! and a pushback layer.
//!
//! The mock partner (axum on 127.0.0.1) grants `LIMIT` calls per one-second window, answers
//! beyond that with `429` and `Retry-After`, and sends the draft-11 `RateLimit-Policy` and
//! `RateLimit` fields on every response. Sixteen tasks call it through
//!
//! ```text
//! retry → pushback → client quota → witness → reqwest::Client
//! ```
//!
//! where the client quota (40 per second, bursts of 20) is looser than the partner, so that what
//! keeps the calls within the partner's windows is the pushback reading its headers.
//!
//! * **Phase 1, pacing:** the tasks call as fast as the layers let them. Expected: no 429.
//! * **Phase 2, pushback:** an admin endpoint makes the partner refuse everything for two
//!   seconds; the next call gets a 429 with `Retry-After: 2`. Expected: after the client has
//!   seen it, no call reaches the partner until the two seconds have passed.
//!
//! The partner counts what reaches it, with timestamps. The `witness` layer, below the quota,
//! stamps each request with the newest 429 the client had received when the request left (the
//! partner numbers its 429s), so the partner can tell a call sent after the client knew of a
//! 429 (an *early call* if it arrives before that 429's `Retry-After` has passed) from one that
//! was already on its way.
//!
//! ```sh
//! cargo run --example partner_api --features reqwest
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use tokio::time::Instant;
use tower::retry::Policy;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_bulwark::outbound::{self, ClientQuotaLayer, Pushback};
use tower_bulwark::{BoxError, DirectRateLimiter, Quota};

/// What a run does; [`Settings::default`] is the example's.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Calls the partner grants per window.
    pub limit: u64,
    /// The partner's window.
    pub window: Duration,
    /// Tasks calling at once.
    pub tasks: usize,
    /// How long phase 1 lasts.
    pub pacing: Duration,
    /// How long the partner refuses everything in phase 2 (whole seconds).
    pub hold: Duration,
    /// How long phase 2 goes on after the hold.
    pub after_hold: Duration,
    /// Print what happens.
    pub verbose: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            limit: 20,
            window: Duration::from_secs(1),
            tasks: 16,
            pacing: Duration::from_secs(5),
            hold: Duration::from_secs(2),
            after_hold: Duration::from_secs(3),
            verbose: true,
        }
    }
}

/// What the partner counted.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Calls that reached the partner.
    pub calls: usize,
    /// 429s the partner sent.
    pub refusals: usize,
    /// 429s the partner sent in phase 1.
    pub pacing_refusals: usize,
    /// Calls that reached the partner before the `Retry-After` of a 429 the client had already
    /// received when it sent them.
    pub early_calls: usize,
    /// Calls that reached the partner during a hold but were sent before the client had seen the
    /// 429 that began it (on their way already).
    pub in_flight_at_429: usize,
    /// Calls the client made that ended in an error (retries exhausted).
    pub failed: usize,
}

/// One call as the partner saw it.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    at: Duration,
    refused: bool,
    /// The newest 429 (by number, 0 for none) the client had received when it sent this call.
    seen: u64,
    phase: u8,
}

/// The partner: fixed windows of `limit` calls, and holds forced by the admin endpoint.
struct Partner {
    origin: Instant,
    limit: u64,
    window: Duration,
    hold: Duration,
    state: Mutex<PartnerState>,
}

struct PartnerState {
    /// The start of the current window; in the future while a forced hold lasts.
    window_start: Instant,
    used: u64,
    phase: u8,
    arrivals: Vec<Arrival>,
    /// When each 429 (numbered from 1) was sent, the instant it said to come back at, and the
    /// phase.
    refusals: Vec<(Duration, Duration, u8)>,
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn header(value: impl ToString) -> HeaderValue {
    HeaderValue::from_str(&value.to_string()).expect("digits and quotes")
}

async fn data(State(partner): State<Arc<Partner>>, request: HeaderMap) -> (StatusCode, HeaderMap) {
    let now = Instant::now();
    let seen = request
        .get("x-seen-429")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let mut state = partner.state.lock().unwrap();
    let window_secs = ceil_secs(partner.window);
    let mut headers = HeaderMap::new();
    headers.insert(
        "ratelimit-policy",
        header(format!("\"partner\";q={};w={window_secs}", partner.limit)),
    );
    // Whole windows that have passed start a fresh one.
    if now >= state.window_start {
        let windows = now.duration_since(state.window_start).as_nanos() / partner.window.as_nanos();
        if windows > 0 {
            let windows = u32::try_from(windows).unwrap_or(u32::MAX);
            state.window_start += partner.window * windows;
            state.used = 0;
        }
    }
    let (refused, until) = if now < state.window_start {
        (true, state.window_start)
    } else if state.used < partner.limit {
        state.used += 1;
        (false, state.window_start + partner.window)
    } else {
        (true, state.window_start + partner.window)
    };
    let t = ceil_secs(until.duration_since(now)).max(1);
    let status = if refused {
        let sent = now.duration_since(partner.origin);
        let phase = state.phase;
        state
            .refusals
            .push((sent, sent + Duration::from_secs(t), phase));
        headers.insert("retry-after", header(t));
        headers.insert("x-429-id", header(state.refusals.len()));
        headers.insert("ratelimit", header(format!("\"partner\";r=0;t={t}")));
        StatusCode::TOO_MANY_REQUESTS
    } else {
        let r = partner.limit - state.used;
        headers.insert("ratelimit", header(format!("\"partner\";r={r};t={t}")));
        StatusCode::OK
    };
    let phase = state.phase;
    state.arrivals.push(Arrival {
        at: now.duration_since(partner.origin),
        refused,
        seen,
        phase,
    });
    (status, headers)
}

/// Refuses everything for `hold`, then starts a fresh window.
async fn exhaust(State(partner): State<Arc<Partner>>) -> StatusCode {
    let mut state = partner.state.lock().unwrap();
    state.window_start = Instant::now() + partner.hold;
    state.used = 0;
    state.phase = 2;
    StatusCode::NO_CONTENT
}

/// Stamps each request with the newest 429 the client has received, and notes the 429s of the
/// answers, before any layer above sees them.
#[derive(Clone)]
struct Witness {
    client: reqwest::Client,
    seen: Arc<AtomicU64>,
}

impl Service<reqwest::Request> for Witness {
    type Response = reqwest::Response;
    type Error = reqwest::Error;
    type Future = Pin<Box<dyn Future<Output = Result<reqwest::Response, reqwest::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.client.poll_ready(cx)
    }

    fn call(&mut self, mut request: reqwest::Request) -> Self::Future {
        let seen = self.seen.load(Ordering::SeqCst);
        request.headers_mut().insert("x-seen-429", header(seen));
        let call = self.client.call(request);
        let witness = Arc::clone(&self.seen);
        Box::pin(async move {
            let response = call.await?;
            let id = response
                .headers()
                .get("x-429-id")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            if let Some(id) = id {
                witness.fetch_max(id, Ordering::SeqCst);
            }
            Ok(response)
        })
    }
}

/// Retries a 429 at once (the pushback holds it) and a refusal after the time it carries.
#[derive(Clone)]
struct HonourRetryAfter {
    attempts: usize,
}

impl Policy<reqwest::Request, reqwest::Response, BoxError> for HonourRetryAfter {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _: &mut reqwest::Request,
        result: &mut Result<reqwest::Response, BoxError>,
    ) -> Option<Self::Future> {
        let wait = match result {
            Ok(response) if response.status() == StatusCode::TOO_MANY_REQUESTS => Duration::ZERO,
            Ok(_) => return None,
            Err(err) => outbound::retry_after(&**err)?,
        };
        self.attempts = self.attempts.checked_sub(1)?;
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, request: &reqwest::Request) -> Option<reqwest::Request> {
        request.try_clone()
    }
}

/// Runs both phases and returns what the partner counted.
pub async fn run(settings: Settings) -> Result<Outcome, BoxError> {
    let origin = Instant::now();
    let partner = Arc::new(Partner {
        origin,
        limit: settings.limit,
        window: settings.window,
        hold: settings.hold,
        state: Mutex::new(PartnerState {
            window_start: origin,
            used: 0,
            phase: 1,
            arrivals: Vec::new(),
            refusals: Vec::new(),
        }),
    });
    let app = Router::new()
        .route("/data", get(data))
        .route("/admin/exhaust", post(exhaust))
        .with_state(Arc::clone(&partner));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // Pushback and quota refuse at once; the retry layer above them does the waiting, so that
    // every attempt passes the pushback again.
    let pushback = Pushback::new("partner");
    let permits = u32::try_from(settings.limit)?;
    let quota = Quota::per_second(permits.saturating_mul(2))?.with_burst(permits)?;
    let witness = Witness {
        client: reqwest::Client::new(),
        seen: Arc::default(),
    };
    let client = ServiceBuilder::new()
        .retry(HonourRetryAfter { attempts: 1000 })
        .layer(pushback.layer())
        .layer(ClientQuotaLayer::new(
            "partner",
            DirectRateLimiter::new(quota),
        ))
        .service(witness);

    let say = |line: String| {
        if settings.verbose {
            println!("{line}");
        }
    };
    let url: reqwest::Url = format!("{base}/data").parse()?;
    let mut failed = 0;
    let phases = [
        (1u8, settings.pacing),
        (2u8, settings.hold + settings.after_hold),
    ];
    for (phase, length) in phases {
        if phase == 2 {
            reqwest::Client::new()
                .post(format!("{base}/admin/exhaust"))
                .send()
                .await?
                .error_for_status()?;
            say(format!(
                "{:>7.3}s phase 2: the partner refuses everything for {:?}",
                origin.elapsed().as_secs_f64(),
                settings.hold
            ));
        } else {
            say(format!(
                "{:>7.3}s phase 1: {} tasks pace themselves by the partner's headers ({} per {:?})",
                origin.elapsed().as_secs_f64(),
                settings.tasks,
                settings.limit,
                settings.window
            ));
        }
        let end = Instant::now() + length;
        let tasks: Vec<_> = (0..settings.tasks)
            .map(|_| {
                let client = client.clone();
                let url = url.clone();
                tokio::spawn(async move {
                    let mut failed = 0;
                    while Instant::now() < end {
                        let request = reqwest::Request::new(reqwest::Method::GET, url.clone());
                        if client.clone().oneshot(request).await.is_err() {
                            failed += 1;
                        }
                    }
                    failed
                })
            })
            .collect();
        for task in tasks {
            failed += task.await?;
        }
    }

    let state = partner.state.lock().unwrap();
    let mut outcome = Outcome {
        calls: state.arrivals.len(),
        failed,
        ..Outcome::default()
    };
    for arrival in &state.arrivals {
        if arrival.refused {
            outcome.refusals += 1;
            if arrival.phase == 1 {
                outcome.pacing_refusals += 1;
            }
        }
        // Early: sent after the client had received 429 number `seen`, and arrived before that
        // 429's Retry-After had passed.
        let seen = usize::try_from(arrival.seen).unwrap_or(usize::MAX);
        let early = seen
            .checked_sub(1)
            .and_then(|i| state.refusals.get(i))
            .is_some_and(|(_, deadline, _)| arrival.at < *deadline);
        if early {
            outcome.early_calls += 1;
        } else if state.refusals.iter().skip(seen).any(|(sent, deadline, _)| {
            // During a hold whose 429 the client had not received when it sent this call.
            *sent < arrival.at && arrival.at < *deadline
        }) {
            outcome.in_flight_at_429 += 1;
        }
    }
    for (phase, name) in [(1u8, "pacing"), (2, "pushback")] {
        let arrivals: Vec<_> = state.arrivals.iter().filter(|a| a.phase == phase).collect();
        say(format!(
            "phase {phase} ({name}): {} calls reached the partner, {} answered 429",
            arrivals.len(),
            arrivals.iter().filter(|a| a.refused).count(),
        ));
    }
    if let Some((sent, deadline, _)) = state.refusals.iter().find(|(_, _, phase)| *phase == 2) {
        let next = state
            .arrivals
            .iter()
            .find(|a| a.at > *sent && !a.refused)
            .map(|a| a.at);
        say(format!(
            "first 429 of phase 2 at {:.3}s said come back at {:.3}s; the next call the partner \
             admitted arrived at {}",
            sent.as_secs_f64(),
            deadline.as_secs_f64(),
            next.map_or("(none)".to_owned(), |at| format!(
                "{:.3}s",
                at.as_secs_f64()
            )),
        ));
    }
    say(format!(
        "calls on their way when a 429 was sent: {}; calls that failed after all retries: {}",
        outcome.in_flight_at_429, outcome.failed
    ));
    Ok(outcome)
}

#[allow(dead_code)] // The test that drives `run` includes this file without running `main`.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let outcome = run(Settings::default()).await?;
    println!(
        "RESULT calls={} 429s={} early_calls={}",
        outcome.calls, outcome.refusals, outcome.early_calls
    );
    Ok(())
}
