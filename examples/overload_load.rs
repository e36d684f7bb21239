//! Open-loop load on `examples/overload.rs`, issue 39's scenarios: how each class fares at 0.9, 4
//! and 10 times the service's capacity, and at 4 times without protection.
//!
//! Requests arrive at a fixed rate whatever the answers, each a `GET /work` of a class drawn at
//! random: 20 % critical, 50 % default, 30 % sheddable (at 10x: 8 / 50 / 42, so that critical
//! stays at 80 % of capacity); half of the default requests send no `x-priority`. Each scenario
//! starts a fresh service in this process (`CAPACITY` and `WORK_MS` as the example reads them)
//! on a free port, or drives the one at `ADDR` when that is set. A request not answered within
//! `TIMEOUT_MS` (default 20 × `WORK_MS`) fails. `SECS` (default 20) is each scenario's length;
//! `SCENARIOS` picks some of `0.9x,4x,10x,off-4x` (default all); `SEED` (a whole number)
//! draws another sequence of classes.
//!
//! ```sh
//! cargo run --release --all-features --example overload_load
//! SCENARIOS=10x SECS=10 cargo run --release --all-features --example overload_load
//! ```
//!
//! Per class it prints the requests offered, the share that succeeded (`200`), the p50 and p99
//! latency of those, and the requests shed (`503`) or failed otherwise; then the goodput as a
//! share of capacity, the p99 of the shed answers and whether each had a valid `Retry-After`,
//! and whether the driver kept to its schedule (if it fell behind, the load was not open-loop).
//! A line `TARGETS` checks the issue's "what must hold" for the scenario.
//!
//! A run of 20 s a scenario on a machine of 2 shared vCPUs, with the library's defaults (the
//! driver kept to its schedule in each), success / p99 of the successes:
//!
//! | load | critical | default | sheddable | goodput | shed answers' p99 |
//! |---|---|---|---|---|---|
//! | 0.9x | 100 % / 54 ms | 100 % / 54 ms | 100 % / 54 ms | 90.0 % | none shed |
//! | 4x | 99.88 % / 134 ms | 6.8 % / 91 ms | 0.88 % / 99 ms | 92.7 % | 2 ms |
//! | 10x | 100 % / 124 ms | 2.5 % / 107 ms | 0.27 % / 112 ms | 93.3 % | 2 ms |
//! | 4x, `PROTECT=off` | 0.16 % (the rest timed out at 1 s) | 0.09 % | 0.08 % | 0.4 % | none shed |
//!
//! Three runs on 2026-12-05, the machine otherwise idle (load average below 1): at 0.9x every
//! class 100 %; at 4x critical 99.84 to 99.88 % with a p99 of 128 to 137 ms and a goodput of
//! 92.7 to 93.0 %; at 10x critical 99.88 to 100 % with a p99 of 123 to 129 ms and a goodput of
//! 93.1 to 93.3 %. Two runs alongside of the settings before (critical guarantee 0.85,
//! `Gradient` at a tolerance of 1.3, the limit from 64): at 4x a critical p99 of 144 and 148 ms,
//! at 10x 128 and 148 ms with a goodput of 87 and 88 %, sheddable at 0.9x 99.09 % in both.
//! Earlier runs of nearly the same defaults with the machine busy building (load average 2 to
//! 8) gave at 4x a critical p99 of 123 to 137 ms in ten runs; runs in which the machine stalled
//! the driver (by 46 ms to 1.6 s) send its late requests at once, a burst the protection sheds
//! from, and were left out. With other draws of the classes (`SEED=1`, `SEED=12345`, idle
//! machine, after the merge into `main`): at 0.9x every class 100 %; at 4x critical 100 % and
//! 99.96 % with a p99 of 119 and 132 ms; at 10x 99.43 % and 99.96 % with a p99 of 137 and 131 ms;
//! goodput 93.1 to 94.2 %.
//!
//! Critical requests alone, arriving at random at 80 % of the capacity, queue to a p99 of about
//! 120 ms on this processor-sharing service (a simulation of the queue with the driver's draw of
//! classes): what the lower classes add to it is the rest. In that simulation the limit stays
//! near 9 (the service serves 8 at full speed), the lower classes below 0.7 of it, and critical
//! requests borrow above it for their bursts.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower_bulwark::BoxError;

#[path = "overload.rs"]
#[allow(dead_code)]
pub mod overload;

/// The classes, in the order of the figures: critical, default, sheddable.
pub const CLASSES: [&str; 3] = ["critical", "default", "sheddable"];

/// A request sent more than this after its due instant counts as late.
const LATE: Duration = Duration::from_millis(10);

/// One load: its rate, mix of classes and length.
#[derive(Clone, Debug)]
pub struct Load {
    /// Requests a second.
    pub rate: f64,
    /// The share of each class, critical, default, sheddable (summing to 1).
    pub mix: [f64; 3],
    /// How long requests are sent.
    pub run: Duration,
    /// How long a request may take before it counts as failed.
    pub timeout: Duration,
    /// The seed of the class draws: one seed, one sequence of classes.
    pub seed: u64,
}

/// How the requests of one class fared.
#[derive(Clone, Debug, Default)]
pub struct Class {
    /// The latencies of the requests answered `200`, from their due instant, in order.
    pub succeeded: Vec<Duration>,
    /// The latencies of the requests answered `503`, in order.
    pub shed: Vec<Duration>,
    /// Shed answers without a valid `Retry-After` (a whole number of seconds, at least 1).
    pub shed_without_retry_after: usize,
    /// Requests answered otherwise, failed or timed out.
    pub failed: usize,
}

impl Class {
    /// Requests sent in the class.
    pub fn offered(&self) -> usize {
        self.succeeded.len() + self.shed.len() + self.failed
    }

    /// The share of the class's requests that succeeded, in percent (100 when none was sent).
    pub fn success(&self) -> f64 {
        match self.offered() {
            0 => 100.0,
            offered => 100.0 * self.succeeded.len() as f64 / offered as f64,
        }
    }
}

/// What one load measured.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// By class: critical, default, sheddable.
    pub classes: [Class; 3],
    /// How long requests were sent.
    pub run: Duration,
    /// Requests sent more than 10 ms after their due instant, and the latest one's delay.
    pub late: (usize, Duration),
}

impl Figures {
    /// Requests answered `200` a second, over the run.
    pub fn goodput(&self) -> f64 {
        let ok: usize = self.classes.iter().map(|c| c.succeeded.len()).sum();
        ok as f64 / self.run.as_secs_f64()
    }

    /// The latencies of every shed answer, in order.
    pub fn shed(&self) -> Vec<Duration> {
        let mut shed: Vec<_> = self.classes.iter().flat_map(|c| c.shed.clone()).collect();
        shed.sort();
        shed
    }

    /// Whether the driver kept to its schedule: under 1 % of the requests late.
    pub fn on_schedule(&self) -> bool {
        let sent: usize = self.classes.iter().map(Class::offered).sum();
        self.late.0 * 100 <= sent
    }
}

/// The `q` quantile of `sorted` (zero when empty).
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    match sorted.len() {
        0 => Duration::ZERO,
        n => sorted[((n as f64 * q) as usize).min(n - 1)],
    }
}

/// Sends `load` to `GET /work` at `addr`, open loop: the i-th request is due at `i / rate`
/// seconds, whatever the answers; waits for the last answers (at most `load.timeout`).
pub async fn drive(addr: SocketAddr, load: &Load) -> Figures {
    // HTTP/1.1 with keep-alive: a connection per request in flight, reused afterwards.
    let client = reqwest::Client::builder()
        .timeout(load.timeout)
        .build()
        .expect("a client without TLS builds");
    let url = format!("http://{addr}/work");
    let results = Arc::new(Mutex::new(Figures::default()));
    // xorshift64 never leaves 0: a seed of 0 draws as 1.
    let mut random = load.seed.max(1);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0_u64.. {
        let due = start + Duration::from_secs_f64(i as f64 / load.rate);
        if due - start >= load.run {
            break;
        }
        tokio::time::sleep_until(due).await;
        let lag = Instant::now() - due;
        if lag > LATE {
            let mut figures = results.lock().unwrap();
            figures.late = (figures.late.0 + 1, figures.late.1.max(lag));
        }
        // xorshift64: a class, and for default whether it sends its header.
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let draw = (random >> 11) as f64 / (1_u64 << 53) as f64;
        let class = if draw < load.mix[0] {
            0
        } else if draw < load.mix[0] + load.mix[1] {
            1
        } else {
            2
        };
        let mut request = client.get(&url);
        if class != 1 || random & 1 == 0 {
            request = request.header("x-priority", CLASSES[class]);
        }
        let results = Arc::clone(&results);
        tasks.spawn(async move {
            let answer = match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let retry_after = response.headers().get("retry-after").cloned();
                    response.bytes().await.ok().map(|_| (status, retry_after))
                }
                Err(_) => None,
            };
            let latency = Instant::now() - due;
            let mut figures = results.lock().unwrap();
            let figures = &mut figures.classes[class];
            match answer {
                Some((200, _)) => figures.succeeded.push(latency),
                Some((503, retry_after)) => {
                    figures.shed.push(latency);
                    let seconds = retry_after.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                    if seconds.is_none_or(|s| s < 1) {
                        figures.shed_without_retry_after += 1;
                    }
                }
                _ => figures.failed += 1,
            }
        });
    }
    let run = start.elapsed();
    while tasks.join_next().await.is_some() {}
    let mut figures = std::mem::take(&mut *results.lock().unwrap());
    figures.run = run;
    for class in &mut figures.classes {
        class.succeeded.sort();
        class.shed.sort();
    }
    figures
}

/// One of the issue's scenarios.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Its name: `0.9x`, `4x`, `10x` or `off-4x`.
    pub name: &'static str,
    /// The rate, in times the capacity.
    pub times: f64,
    /// Critical, default, sheddable.
    pub mix: [f64; 3],
    /// Whether the service is protected.
    pub protect: bool,
}

/// The issue's scenarios.
pub const SCENARIOS: [Scenario; 4] = [
    Scenario {
        name: "0.9x",
        times: 0.9,
        mix: [0.2, 0.5, 0.3],
        protect: true,
    },
    Scenario {
        name: "4x",
        times: 4.0,
        mix: [0.2, 0.5, 0.3],
        protect: true,
    },
    Scenario {
        name: "10x",
        times: 10.0,
        mix: [0.08, 0.5, 0.42],
        protect: true,
    },
    Scenario {
        name: "off-4x",
        times: 4.0,
        mix: [0.2, 0.5, 0.3],
        protect: false,
    },
];

/// The issue's "what must hold" for `scenario`, each as (what, whether it held).
pub fn targets(
    scenario: &Scenario,
    figures: &Figures,
    work: Duration,
    capacity: f64,
) -> Vec<(String, bool)> {
    let [critical, default, sheddable] = &figures.classes;
    let mut held = Vec::new();
    if !scenario.protect {
        return held;
    }
    if scenario.times < 1.0 {
        for (name, class) in CLASSES.iter().zip(&figures.classes) {
            held.push((format!("{name} >= 99 %"), class.success() >= 99.0));
        }
        return held;
    }
    let p99 = quantile(&critical.succeeded, 0.99);
    held.push(("critical >= 99 %".into(), critical.success() >= 99.0));
    held.push((format!("critical p99 <= {:?}", 3 * work), p99 <= 3 * work));
    let goodput = figures.goodput() / capacity;
    held.push(("goodput >= 85 %".into(), goodput >= 0.85));
    let ordered =
        critical.success() >= default.success() && default.success() >= sheddable.success();
    held.push(("critical >= default >= sheddable".into(), ordered));
    let halved = sheddable.success() <= default.success() / 2.0;
    held.push(("sheddable <= default / 2".into(), halved));
    let valid = figures
        .classes
        .iter()
        .all(|c| c.shed_without_retry_after == 0);
    held.push(("every shed with Retry-After".into(), valid));
    let shed_p99 = quantile(&figures.shed(), 0.99);
    held.push((format!("shed p99 <= {work:?}"), shed_p99 <= work));
    held
}

/// Prints what `figures` measured, with the scenario's targets.
pub fn report(scenario: &Scenario, load: &Load, figures: &Figures, work: Duration, capacity: f64) {
    let protection = if scenario.protect { "on" } else { "off" };
    println!(
        "== {} ({:.0}/s for {:.1} s, protection {protection})",
        scenario.name,
        load.rate,
        figures.run.as_secs_f64()
    );
    println!("class      offered  succeeded   p50 ms   p99 ms    shed  failed");
    for (name, class) in CLASSES.iter().zip(&figures.classes) {
        let ms = |q| quantile(&class.succeeded, q).as_secs_f64() * 1e3;
        println!(
            "{name:<10} {:>7}  {:>8.2} % {:>8.1} {:>8.1} {:>7} {:>7}",
            class.offered(),
            class.success(),
            ms(0.5),
            ms(0.99),
            class.shed.len(),
            class.failed
        );
    }
    let shed = figures.shed();
    let without: usize = figures
        .classes
        .iter()
        .map(|c| c.shed_without_retry_after)
        .sum();
    println!(
        "goodput {:.1}/s = {:.1} % of capacity; shed answers: {}, p99 {:.1} ms, {} without a valid Retry-After",
        figures.goodput(),
        100.0 * figures.goodput() / capacity,
        shed.len(),
        quantile(&shed, 0.99).as_secs_f64() * 1e3,
        without
    );
    let (late, latest) = figures.late;
    let schedule = if figures.on_schedule() {
        "kept to its schedule (open loop)"
    } else {
        "FELL BEHIND its schedule: the load was not open-loop"
    };
    println!("driver {schedule}: {late} requests sent over 10 ms late, the latest by {latest:?}");
    let targets = targets(scenario, figures, work, capacity);
    if !targets.is_empty() {
        let line: Vec<_> = targets
            .iter()
            .map(|(what, ok)| format!("{what}: {}", if *ok { "met" } else { "NOT MET" }))
            .collect();
        println!("TARGETS {}", line.join("; "));
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = overload::Settings::from_env()?;
    let external = std::env::var_os("ADDR").is_some();
    let secs: u64 = match std::env::var("SECS") {
        Ok(value) => value
            .trim()
            .parse()
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| format!("SECS={value:?}: expected a whole number of seconds above 0"))?,
        Err(_) => 20,
    };
    let timeout = match std::env::var("TIMEOUT_MS") {
        Ok(value) => {
            Duration::from_millis(value.trim().parse().ok().filter(|&s| s > 0).ok_or_else(
                || format!("TIMEOUT_MS={value:?}: expected a whole number of milliseconds above 0"),
            )?)
        }
        Err(_) => 20 * settings.work,
    };
    let seed = match std::env::var("SEED") {
        Ok(value) => (value.trim().parse())
            .map_err(|_| format!("SEED={value:?}: expected a whole number"))?,
        Err(_) => 0x9E37_79B9_7F4A_7C15,
    };
    let names = std::env::var("SCENARIOS").unwrap_or_else(|_| "0.9x,4x,10x,off-4x".into());
    let mut scenarios = Vec::new();
    for name in names.split(',').map(str::trim) {
        let scenario = SCENARIOS.iter().find(|s| s.name == name).ok_or_else(|| {
            format!("SCENARIOS={names:?}: {name:?} is none of 0.9x, 4x, 10x and off-4x")
        })?;
        scenarios.push(*scenario);
    }
    let capacity = settings.capacity_per_second();
    println!(
        "capacity {} x 1000 / {} ms = {capacity:.0}/s; timeout {timeout:?}",
        settings.capacity,
        settings.work.as_millis()
    );
    for scenario in &scenarios {
        let addr = if external {
            settings.addr
        } else {
            let settings = overload::Settings {
                addr: SocketAddr::from(([127, 0, 0, 1], 0)),
                protect: scenario.protect,
                ..settings.clone()
            };
            overload::start(&settings).await?.0
        };
        let load = Load {
            rate: scenario.times * capacity,
            mix: scenario.mix,
            run: Duration::from_secs(secs),
            timeout,
            seed,
        };
        let figures = drive(addr, &load).await;
        report(scenario, &load, &figures, settings.work, capacity);
    }
    Ok(())
}
