//! A load on `examples/llm_gateway.rs`: how much of the upstream's token quota the gateway
//! serves when its keys ask for more, and whether the upstream ever answers `429`.
//!
//! It starts the gateway in this process (`UPSTREAM_TPM` 120 000 and `STREAM_MS` 500 unless the
//! environment says otherwise; the other settings as the gateway reads them), then 16 keys send
//! streamed completions from 16 to 24 workers for 20 s (`max_tokens` 1000, of which the
//! upstream uses 500): 16 workers, one per key, send one after the other; 8 more, on keys 0 to
//! 7, rest `STREAM_MS` between theirs. A refused request (`429` or `503`) is tried again after
//! 100 ms. At the end it reads `GET /stats` and prints what the upstream served against what it
//! allows over the run: its minute's burst plus its rate times the run's length.
//!
//! ```sh
//! cargo run --release --all-features --example llm_gateway_load
//! # run: 20.0 s; in flight: 5 to 24, 11.0 on average
//! # gateway: 311 answered 200, 229 429, 2051 503, 0 other or failed
//! # upstream: 156500 tokens in 313 calls, 0 429; it allows 160004 over the run
//! # RESULT served=0.978 upstream_429=0 (the issue asks for served >= 0.95 and no 429)
//! ```
//!
//! "In flight" counts the requests sent and not yet answered in full, those the gateway holds
//! for the upstream's quota included; a refused worker's 100 ms pause is not.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tower_bulwark::BoxError;

#[path = "llm_gateway.rs"]
#[allow(dead_code)]
pub mod llm_gateway;

/// A load: how many keys and workers, the tokens of a request, and how long.
#[derive(Clone, Debug)]
pub struct Load {
    /// API keys, `key-0` and on.
    pub keys: usize,
    /// Workers that rest between their requests, on keys 0 and on, beside one busy worker a key.
    pub resting: usize,
    /// How long a resting worker waits between two requests.
    pub rest: Duration,
    /// The `max_tokens` of every request (the upstream uses half).
    pub max_tokens: u32,
    /// How long the load runs.
    pub run: Duration,
}

/// What a load measured.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// How long the load ran, from its first request to the reading of the upstream's counts.
    pub run: Duration,
    /// Tokens the upstream served.
    pub served: u64,
    /// Calls the upstream served.
    pub calls: u64,
    /// Calls the upstream refused with `429`.
    pub upstream_429: u64,
    /// Tokens the upstream allows over the run: its burst plus its rate times the run.
    pub allowed: u64,
    /// The gateway's answers: `200`, `429`, `503`, and any other status or failure.
    pub answers: [u64; 4],
    /// Requests in flight, sampled every 10 ms: least, mean, most.
    pub in_flight: (usize, f64, usize),
}

impl Figures {
    /// The share of the allowed tokens that the upstream served.
    pub fn served_share(&self) -> f64 {
        self.served as f64 / self.allowed as f64
    }
}

/// Requests in flight, and the counts of the gateway's answers.
#[derive(Default)]
struct Counts {
    in_flight: AtomicUsize,
    answers: [AtomicUsize; 4],
}

/// Runs `load` against the gateway at `addr`, whose upstream allows `upstream_tpm` tokens a
/// minute.
///
/// # Errors
///
/// `GET /stats` failed or did not answer its three counts.
pub async fn drive(
    addr: std::net::SocketAddr,
    upstream_tpm: u32,
    load: &Load,
) -> Result<Figures, BoxError> {
    let client = reqwest::Client::new();
    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    let mut workers = JoinSet::new();
    for worker in 0..load.keys + load.resting {
        let rest = (worker >= load.keys).then_some(load.rest);
        let key = format!("key-{}", worker % load.keys);
        let body = format!(
            r#"{{"max_tokens": {}, "prompt": "hi", "stream": true}}"#,
            load.max_tokens
        );
        let request = client
            .post(format!("http://{addr}/v1/complete"))
            .header("x-api-key", key)
            .body(body);
        workers.spawn(work(request, rest, Arc::clone(&counts)));
    }
    let sampler = tokio::spawn(sample(Arc::clone(&counts), load.run));

    tokio::time::sleep_until((start + load.run).into()).await;
    let stats = client.get(format!("http://{addr}/stats")).send().await?;
    let stats: serde_json::Value = serde_json::from_slice(&stats.bytes().await?)?;
    let run = start.elapsed();
    workers.abort_all();
    let count = |name: &str| stats[name].as_u64().ok_or(format!("no {name} in {stats}"));
    let per_second = f64::from(upstream_tpm) / 60.0;
    Ok(Figures {
        run,
        served: count("upstream_tokens")?,
        calls: count("upstream_calls")?,
        upstream_429: count("upstream_429")?,
        allowed: u64::from(upstream_tpm) + (per_second * run.as_secs_f64()) as u64,
        answers: counts.answers.each_ref().map(|a| a.load(Relaxed) as u64),
        in_flight: sampler.await.unwrap_or_default(),
    })
}

/// One worker: a request, read to its end, then the next (after `rest`, or 100 ms after a
/// refusal), until aborted.
async fn work(request: reqwest::RequestBuilder, rest: Option<Duration>, counts: Arc<Counts>) {
    loop {
        counts.in_flight.fetch_add(1, Relaxed);
        // The status, once the body is read to its end; 0 for a failure.
        let answer = match request.try_clone().expect("a body of bytes").send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                response.bytes().await.map_or(0, |_| status)
            }
            Err(_) => 0,
        };
        counts.in_flight.fetch_sub(1, Relaxed);
        let slot = match answer {
            200 => 0,
            429 => 1,
            503 => 2,
            _ => 3,
        };
        counts.answers[slot].fetch_add(1, Relaxed);
        if slot != 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        } else if let Some(rest) = rest {
            tokio::time::sleep(rest).await;
        }
    }
}

/// Samples the requests in flight every 10 ms for `run`: least, mean, most.
async fn sample(counts: Arc<Counts>, run: Duration) -> (usize, f64, usize) {
    let mut interval = tokio::time::interval(Duration::from_millis(10));
    let (mut least, mut sum, mut most, mut samples) = (usize::MAX, 0, 0, 0);
    let end = Instant::now() + run;
    while Instant::now() < end {
        interval.tick().await;
        let now = counts.in_flight.load(Relaxed);
        (least, most, sum, samples) = (least.min(now), most.max(now), sum + now, samples + 1);
    }
    (least, sum as f64 / samples.max(1) as f64, most)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut settings = llm_gateway::Settings::from_env()?;
    if std::env::var_os("ADDR").is_none() {
        settings.addr = "127.0.0.1:0".parse()?;
    }
    if std::env::var_os("UPSTREAM_TPM").is_none() {
        settings.upstream_tpm = 120_000;
    }
    if std::env::var_os("STREAM_MS").is_none() {
        settings.stream = Duration::from_millis(500);
    }
    let addr = llm_gateway::start(&settings).await?;
    let load = Load {
        keys: 16,
        resting: 8,
        rest: settings.stream,
        max_tokens: 1000,
        run: Duration::from_secs(20),
    };
    println!("{settings:?}");
    println!("{load:?}");
    let figures = drive(addr, settings.upstream_tpm, &load).await?;
    let (least, mean, most) = figures.in_flight;
    let [ok, refused, unavailable, other] = figures.answers;
    println!(
        "run: {:.1} s; in flight: {least} to {most}, {mean:.1} on average",
        figures.run.as_secs_f64()
    );
    println!(
        "gateway: {ok} answered 200, {refused} 429, {unavailable} 503, {other} other or failed"
    );
    println!(
        "upstream: {} tokens in {} calls, {} 429; it allows {} over the run",
        figures.served, figures.calls, figures.upstream_429, figures.allowed
    );
    println!(
        "RESULT served={:.3} upstream_429={} (the issue asks for served >= 0.95 and no 429)",
        figures.served_share(),
        figures.upstream_429
    );
    Ok(())
}
