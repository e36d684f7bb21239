//! Several tasks hammer one keyed limiter; per key, the example prints how many requests were
//! admitted and refused and the `retry_after` the refused ones were told.
//!
//! ```sh
//! cargo run --example limiter
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_bulwark::{KeyedRateLimiter, Quota};

#[derive(Default, Debug)]
struct Tally {
    allowed: u64,
    refused: u64,
    shortest_retry: Option<Duration>,
    longest_retry: Option<Duration>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Five requests per second per tenant, in bursts of up to five.
    let quota = Quota::per_second(5)?;
    let limiter = KeyedRateLimiter::<&'static str>::new(quota);
    let tallies: Arc<Mutex<BTreeMap<&'static str, Tally>>> = Arc::default();

    let tenants = ["acme", "globex", "initech"];
    let mut tasks = Vec::new();
    for worker in 0..8 {
        // Every worker sends for every tenant, the busiest tenant twice as often.
        let limiter = limiter.clone();
        let tallies = Arc::clone(&tallies);
        tasks.push(tokio::spawn(async move {
            for round in 0..60 {
                let tenant = tenants[(worker + round) % tenants.len()];
                let tenant = if round % 2 == 0 { "acme" } else { tenant };
                let decision = limiter.check(&tenant);
                {
                    let mut tallies = tallies.lock().unwrap();
                    let tally = tallies.entry(tenant).or_default();
                    if decision.allowed {
                        tally.allowed += 1;
                    } else {
                        tally.refused += 1;
                        let r = decision.retry_after;
                        tally.shortest_retry = Some(tally.shortest_retry.map_or(r, |s| s.min(r)));
                        tally.longest_retry = Some(tally.longest_retry.map_or(r, |s| s.max(r)));
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    for task in tasks {
        task.await?;
    }

    println!(
        "quota: {} per {:?}, burst {}",
        quota.permits(),
        quota.period(),
        quota.burst()
    );
    for (tenant, tally) in tallies.lock().unwrap().iter() {
        println!(
            "{tenant:<8} allowed={:<3} refused={:<3} retry_after: shortest={:?} longest={:?}",
            tally.allowed, tally.refused, tally.shortest_retry, tally.longest_retry
        );
    }
    Ok(())
}
