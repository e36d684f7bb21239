//! An adaptive bulkhead against a dependency whose capacity changes, next to fixed limits.
//!
//! A simulated dependency on 127.0.0.1 has `C` workers, each serving one call at a time for a
//! random time (log-normal, median 20 ms, sigma 0.5), a FIFO queue of at most `C` waiting calls,
//! and answers `503` at once beyond that. `C` goes 16 → 4 → 16. The same offered load (more
//! than the dependency can serve) goes through each contender in turn, each against a fresh
//! dependency of its own: no limit; fixed bulkheads of 2, 4, 8, 16 and 32; an oracle whose fixed
//! limit is switched to the true `C` at each change; and the adaptive bulkhead with AIMD and with
//! Gradient. The calls are real HTTP calls made by `reqwest::Client`.
//!
//! ```text
//! cargo run --release --features adaptive,reqwest --example adaptive
//! ```
//!
//! Environment: `BULWARK_ADAPTIVE_PHASE_MS` (default 5000) sets each phase's length,
//! `BULWARK_ADAPTIVE_PARALLEL` (default 3) how many contenders run at once (each with its own
//! dependency, so they never share its capacity), `BULWARK_ADAPTIVE_SEED` the random seed.
//!
//! It prints a table per phase, draws both adaptive limits over time next to the true capacity
//! (in the terminal and in `target/adaptive.svg`), and ends with one `RESULT` line of measured
//! ratios to the oracle. `tests/bulkhead/adaptive_example.rs` runs it with phases of 400 ms.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::sync::Semaphore;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_bulwark::bulkhead::adaptive::{
    AdaptiveBulkhead, Aimd, Gradient, LimitAlgorithm, LimitChanged,
};
use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull};
use tower_bulwark::BoxError;

/// The dependency's capacity in each phase.
const PHASES: [usize; 3] = [16, 4, 16];
/// Median service time, and sigma of its logarithm.
const MEDIAN: Duration = Duration::from_millis(20);
const SIGMA: f64 = 0.5;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A small xorshift generator: the example needs no cryptographic randomness.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        // 53 random bits in [0, 1).
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A standard normal draw (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }
}

/// The simulated dependency: `capacity` workers and a queue of as many.
struct Dependency {
    workers: Semaphore,
    /// Worker permits in existence and the capacity they should come to.
    capacity: Mutex<(usize, usize)>,
    /// Calls being served or waiting.
    in_system: AtomicUsize,
    target: AtomicUsize,
    rng: Mutex<Rng>,
}

impl Dependency {
    fn new(capacity: usize, seed: u64) -> Self {
        Self {
            workers: Semaphore::new(capacity),
            capacity: Mutex::new((capacity, capacity)),
            in_system: AtomicUsize::new(0),
            target: AtomicUsize::new(capacity),
            rng: Mutex::new(Rng(seed | 1)),
        }
    }

    fn set_capacity(&self, target: usize) {
        let mut capacity = self.capacity.lock().unwrap();
        self.target.store(target, Ordering::SeqCst);
        capacity.1 = target;
        if target > capacity.0 {
            self.workers.add_permits(target - capacity.0);
            capacity.0 = target;
        } else {
            // Idle workers go now, busy ones when they finish their call.
            capacity.0 -= self.workers.forget_permits(capacity.0 - target);
        }
    }

    fn service_time(&self) -> Duration {
        let z = self.rng.lock().unwrap().normal();
        MEDIAN.mul_f64((SIGMA * z).exp())
    }
}

async fn serve(State(dependency): State<Arc<Dependency>>) -> StatusCode {
    let limit = 2 * dependency.target.load(Ordering::SeqCst);
    if dependency.in_system.fetch_add(1, Ordering::SeqCst) >= limit {
        dependency.in_system.fetch_sub(1, Ordering::SeqCst);
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let permit = dependency.workers.acquire().await.expect("never closed");
    tokio::time::sleep(dependency.service_time()).await;
    dependency.in_system.fetch_sub(1, Ordering::SeqCst);
    let mut capacity = dependency.capacity.lock().unwrap();
    if capacity.0 > capacity.1 {
        permit.forget();
        capacity.0 -= 1;
    }
    StatusCode::OK
}

async fn start_dependency(seed: u64) -> (Arc<Dependency>, String) {
    let dependency = Arc::new(Dependency::new(PHASES[0], seed));
    let app = Router::new()
        .route("/", get(serve))
        .with_state(dependency.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port on 127.0.0.1");
    let url = format!("http://{}/", listener.local_addr().expect("bound"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (dependency, url)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Unlimited,
    Fixed(usize),
    Oracle,
    Aimd,
    Gradient,
}

impl Kind {
    fn label(self) -> String {
        match self {
            Kind::Unlimited => "no limit".into(),
            Kind::Fixed(n) => format!("fixed {n}"),
            Kind::Oracle => "oracle".into(),
            Kind::Aimd => "adaptive AIMD".into(),
            Kind::Gradient => "adaptive Gradient".into(),
        }
    }
}

/// What happened in one phase to one contender.
#[derive(Default, Clone)]
struct PhaseStats {
    ok: u64,
    refused: u64,
    unavailable: u64,
    errors: u64,
    /// Latencies of the successful calls, in microseconds.
    latencies: Vec<u64>,
}

impl PhaseStats {
    fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Duration::from_micros(sorted[rank - 1])
    }
}

struct Outcome {
    kind: Kind,
    phases: Vec<PhaseStats>,
    /// The adaptive limit over time, from the run's start.
    limits: Vec<(Duration, usize)>,
}

type Client = BoxCloneService<reqwest::Request, reqwest::Response, BoxError>;

async fn run(kind: Kind, phase: Duration, rate: f64, seed: u64) -> Outcome {
    let (dependency, url) = start_dependency(seed).await;
    let url = reqwest::Url::parse(&url).expect("a valid URL");
    let http = reqwest::Client::new();
    let limits = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut oracle = None;
    let client: Client = match kind {
        Kind::Unlimited => BoxCloneService::new(http.map_err(BoxError::from)),
        Kind::Fixed(n) => {
            let bulkhead = Bulkhead::semaphore(kind.label(), n).build();
            BoxCloneService::new(ServiceBuilder::new().layer(bulkhead.layer()).service(http))
        }
        Kind::Oracle => {
            let bulkhead = Bulkhead::semaphore("oracle", PHASES[0]).build();
            oracle = Some(bulkhead.clone());
            BoxCloneService::new(ServiceBuilder::new().layer(bulkhead.layer()).service(http))
        }
        Kind::Aimd | Kind::Gradient => {
            let algorithm: Box<dyn LimitAlgorithm> = if kind == Kind::Aimd {
                Box::new(Aimd::default())
            } else {
                Box::new(Gradient::default())
            };
            let seen = limits.clone();
            let bulkhead = AdaptiveBulkhead::builder(kind.label())
                .algorithm(algorithm)
                .on_limit_changed(move |event: &LimitChanged<'_>| {
                    seen.lock().unwrap().push((started.elapsed(), event.to));
                })
                .build();
            limits
                .lock()
                .unwrap()
                .push((Duration::ZERO, bulkhead.limit()));
            BoxCloneService::new(ServiceBuilder::new().layer(bulkhead.layer()).service(http))
        }
    };

    let stats = Arc::new(Mutex::new(vec![PhaseStats::default(); PHASES.len()]));
    let in_flight = Arc::new(AtomicU64::new(0));
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for (index, &capacity) in PHASES.iter().enumerate() {
        dependency.set_capacity(capacity);
        if let Some(oracle) = &oracle {
            oracle.set_max_concurrent_calls(capacity);
        }
        let phase_start = Instant::now();
        let mut next = phase_start;
        while next < phase_start + phase {
            tokio::time::sleep_until(next.into()).await;
            next += Duration::from_secs_f64(rng.exponential(1.0 / rate));
            let client = client.clone();
            let request = reqwest::Request::new(reqwest::Method::GET, url.clone());
            let stats = stats.clone();
            let in_flight = in_flight.clone();
            in_flight.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let sent = Instant::now();
                let result = client.oneshot(request).await;
                let latency = sent.elapsed();
                let mut stats = stats.lock().unwrap();
                let stats = &mut stats[index];
                match result {
                    Ok(response) if response.status() == StatusCode::OK => {
                        stats.ok += 1;
                        stats.latencies.push(latency.as_micros() as u64);
                    }
                    Ok(response) if response.status() == StatusCode::SERVICE_UNAVAILABLE => {
                        stats.unavailable += 1;
                    }
                    Ok(_) => stats.errors += 1,
                    Err(err) if err.is::<BulkheadFull>() => stats.refused += 1,
                    Err(_) => stats.errors += 1,
                }
                in_flight.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }
    while in_flight.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let phases = stats.lock().unwrap().clone();
    let limits = limits.lock().unwrap().clone();
    Outcome {
        kind,
        phases,
        limits,
    }
}

/// The limit at `t`, from a series of changes.
fn limit_at(series: &[(Duration, usize)], t: Duration) -> usize {
    series
        .iter()
        .take_while(|(at, _)| *at <= t)
        .last()
        .map_or(0, |(_, limit)| *limit)
}

/// The first instant at or after `from` where the limit is within 2x of `capacity`.
fn within_2x(series: &[(Duration, usize)], from: Duration, capacity: usize) -> Option<Duration> {
    let ok = |limit: usize| limit <= 2 * capacity && 2 * limit >= capacity;
    if ok(limit_at(series, from)) {
        return Some(Duration::ZERO);
    }
    series
        .iter()
        .find(|(at, limit)| *at >= from && ok(*limit))
        .map(|(at, _)| *at - from)
}

fn svg(outcomes: &[&Outcome], phase: Duration) -> String {
    let (width, height, pad) = (900.0, 320.0, 40.0);
    let total = phase.as_secs_f64() * PHASES.len() as f64;
    let top = 40.0;
    let x = |t: f64| pad + (width - 2.0 * pad) * t / total;
    let y = |limit: f64| height - pad - (height - 2.0 * pad) * limit.min(top) / top;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{pad}\" y=\"20\">adaptive limit over time (s) next to the true capacity C</text>\n"
    );
    for tick in [0.0, 4.0, 8.0, 16.0, 32.0] {
        let _ = writeln!(
            out,
            "<line x1=\"{pad}\" x2=\"{}\" y1=\"{y0}\" y2=\"{y0}\" stroke=\"#ddd\"/><text x=\"5\" y=\"{y0}\">{tick}</text>",
            width - pad,
            y0 = y(tick)
        );
    }
    let mut capacity = String::new();
    for (i, c) in PHASES.iter().enumerate() {
        let t0 = phase.as_secs_f64() * i as f64;
        let _ = write!(
            capacity,
            "{},{} {},{} ",
            x(t0),
            y(*c as f64),
            x(t0 + phase.as_secs_f64()),
            y(*c as f64)
        );
    }
    let _ = writeln!(
        out,
        "<polyline fill=\"none\" stroke=\"black\" stroke-width=\"2\" stroke-dasharray=\"6 4\" points=\"{capacity}\"/>"
    );
    for (outcome, colour) in outcomes.iter().zip(["#d62728", "#1f77b4"]) {
        let mut points = String::new();
        let mut last = 0;
        for (at, limit) in &outcome.limits {
            let t = at.as_secs_f64().min(total);
            if !points.is_empty() {
                let _ = write!(points, "{},{} ", x(t), y(last as f64));
            }
            let _ = write!(points, "{},{} ", x(t), y(*limit as f64));
            last = *limit;
        }
        let _ = write!(points, "{},{}", x(total), y(last as f64));
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{points}\"/>"
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\">dashed: C   red: AIMD   blue: Gradient</text>\n</svg>",
        pad,
        height - 10.0
    );
    out
}

fn terminal_chart(outcomes: &[&Outcome], phase: Duration) {
    let total = phase * PHASES.len() as u32;
    let columns = 60;
    println!("\nlimit over time, one column per {:?}:", total / columns);
    for outcome in outcomes {
        let mut line = String::new();
        for column in 0..columns {
            let t = total * column / columns;
            let limit = limit_at(&outcome.limits, t);
            line.push(match limit {
                0..=2 => '_',
                3..=5 => '.',
                6..=8 => '-',
                9..=12 => '~',
                13..=20 => '=',
                _ => '#',
            });
        }
        println!("{:>18} |{line}|", outcome.kind.label());
    }
    let mut truth = String::new();
    for column in 0..columns {
        let t = total * column / columns;
        let index = ((t.as_secs_f64() / phase.as_secs_f64()) as usize).min(PHASES.len() - 1);
        truth.push(if PHASES[index] <= 5 { '.' } else { '=' });
    }
    println!("{:>18} |{truth}|", "true C");
    println!("{:>18}  _ ≤2  . 3-5  - 6-8  ~ 9-12  = 13-20  # >20", "");
}

#[tokio::main]
async fn main() {
    let phase = Duration::from_millis(env("BULWARK_ADAPTIVE_PHASE_MS", 5000));
    let parallel = env("BULWARK_ADAPTIVE_PARALLEL", 3).max(1) as usize;
    let seed = env("BULWARK_ADAPTIVE_SEED", 0x5EED);
    let result = compare(phase, parallel, seed).await;
    println!("\n{result}");
}

/// Runs every contender, prints the tables and charts, and returns the `RESULT` line.
pub(crate) async fn compare(phase: Duration, parallel: usize, seed: u64) -> String {
    // The dependency serves C / mean service time calls per second; offer 1.25 times its
    // largest capacity, so that every phase is overloaded without a limit.
    let mean = MEDIAN.as_secs_f64() * (SIGMA * SIGMA / 2.0).exp();
    let rate = 1.25 * PHASES[0] as f64 / mean;
    println!(
        "dependency: C = {PHASES:?}, service time log-normal (median {MEDIAN:?}, sigma {SIGMA}), \
         queue of C, 503 beyond; offered load {rate:.0} calls/s (Poisson); phases of {phase:?}; \
         {parallel} contenders at a time, each with its own dependency"
    );

    let kinds = [
        Kind::Unlimited,
        Kind::Fixed(2),
        Kind::Fixed(4),
        Kind::Fixed(8),
        Kind::Fixed(16),
        Kind::Fixed(32),
        Kind::Oracle,
        Kind::Aimd,
        Kind::Gradient,
    ];
    let mut outcomes = Vec::new();
    for (group, chunk) in kinds.chunks(parallel).enumerate() {
        let runs: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, &kind)| {
                let seed = seed.wrapping_add((group * parallel + i) as u64 * 7919);
                tokio::spawn(run(kind, phase, rate, seed))
            })
            .collect();
        for run in runs {
            outcomes.push(run.await.expect("a contender's run panicked"));
        }
    }

    let secs = phase.as_secs_f64();
    for (index, capacity) in PHASES.iter().enumerate() {
        println!("\nphase {} (C = {capacity}):", index + 1);
        println!(
            "{:>18} {:>10} {:>9} {:>8} {:>7} {:>9} {:>9}",
            "contender", "goodput/s", "refusals", "503s", "errors", "p50", "p99"
        );
        for outcome in &outcomes {
            let s = &outcome.phases[index];
            println!(
                "{:>18} {:>10.1} {:>9} {:>8} {:>7} {:>9.1?} {:>9.1?}",
                outcome.kind.label(),
                s.ok as f64 / secs,
                s.refused,
                s.unavailable,
                s.errors,
                s.percentile(0.50),
                s.percentile(0.99),
            );
        }
    }

    let find = |kind: Kind| {
        outcomes
            .iter()
            .find(|o| o.kind == kind)
            .expect("every contender ran")
    };
    let oracle = find(Kind::Oracle);
    let adaptive = [find(Kind::Aimd), find(Kind::Gradient)];
    terminal_chart(&adaptive, phase);
    let chart = svg(&adaptive, phase);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let path = dir.join("adaptive.svg");
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, chart)) {
        Ok(()) => println!("chart: {}", path.display()),
        Err(err) => println!("chart not written to {}: {err}", path.display()),
    }

    let mut result = String::from("RESULT");
    for outcome in adaptive {
        let name = match outcome.kind {
            Kind::Aimd => "aimd",
            _ => "gradient",
        };
        let _ = write!(result, " {name}:");
        for (index, capacity) in PHASES.iter().enumerate() {
            let ours = &outcome.phases[index];
            let best = &oracle.phases[index];
            let goodput = ours.ok as f64 / best.ok.max(1) as f64;
            let p99 =
                ours.percentile(0.99).as_secs_f64() / best.percentile(0.99).as_secs_f64().max(1e-9);
            let _ = write!(
                result,
                " c{}={capacity} goodput={goodput:.2}x p99={p99:.2}x",
                index + 1
            );
        }
        // Round trips are counted in the oracle's median latency at the new capacity: a call's
        // round trip without queueing, shorter than what the adaptive calls saw meanwhile.
        let drop_at = phase;
        let rtt = oracle.phases[1]
            .percentile(0.5)
            .max(Duration::from_micros(1));
        match within_2x(&outcome.limits, drop_at, PHASES[1]) {
            Some(took) => {
                let _ = write!(
                    result,
                    " within_2x_after_drop={:.1}rtt",
                    took.as_secs_f64() / rtt.as_secs_f64()
                );
            }
            None => result.push_str(" within_2x_after_drop=never"),
        }
        result.push(';');
    }
    result.pop();
    result
}
