//! A slow payment gateway must not take the capacity that inventory calls need.
//!
//! Starts a downstream server on 127.0.0.1 whose `/pay` answers after two seconds and whose
//! `/stock` answers at once, wraps one `reqwest::Client` per dependency in its own bulkhead
//! (`payment`: 2 concurrent calls, `inventory`: 8, neither waits), releases 6 payment calls and
//! 8 inventory calls together, and prints one line of counts.
//!
//! ```sh
//! cargo run --example bulkhead
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tokio::sync::Barrier;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull, CallFinished, CallPermitted};
use tower_bulwark::BoxError;

const PAYMENT_CALLS: usize = 6;
const INVENTORY_CALLS: usize = 8;

#[derive(Clone, Copy, PartialEq)]
enum Verdict {
    Accepted,
    Rejected,
    Other,
}

/// Counts permitted calls in flight through the bulkhead's events and keeps the highest count.
#[derive(Clone, Default)]
struct InFlight {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

fn bulkhead(name: &str, max_concurrent_calls: usize, in_flight: &InFlight) -> Bulkhead {
    let (up, down) = (in_flight.clone(), in_flight.clone());
    Bulkhead::semaphore(name, max_concurrent_calls)
        .on_call_permitted(move |_: &CallPermitted<'_>| {
            let now = up.now.fetch_add(1, Ordering::SeqCst) + 1;
            up.max.fetch_max(now, Ordering::SeqCst);
        })
        .on_call_finished(move |_: &CallFinished<'_>| {
            down.now.fetch_sub(1, Ordering::SeqCst);
        })
        .build()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The downstream dependencies.
    let app = Router::new()
        .route(
            "/pay",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                "paid"
            }),
        )
        .route("/stock", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // One client per dependency, each behind its own bulkhead.
    let payment_in_flight = InFlight::default();
    let payment = bulkhead("payment", 2, &payment_in_flight);
    let inventory = bulkhead("inventory", 8, &InFlight::default());
    let payment_client = payment.layer().layer(reqwest::Client::new());
    let inventory_client = inventory.layer().layer(reqwest::Client::new());

    let workers = PAYMENT_CALLS + INVENTORY_CALLS;
    let start = Arc::new(Barrier::new(workers));
    // Every worker calls (taking or being refused a permit) before any waits for its answer.
    let called = Arc::new(Barrier::new(workers));
    let mut tasks = Vec::with_capacity(workers);
    for i in 0..workers {
        let is_payment = i < PAYMENT_CALLS;
        let (mut client, url, expected) = if is_payment {
            (payment_client.clone(), format!("{base}/pay"), "paid")
        } else {
            (inventory_client.clone(), format!("{base}/stock"), "ok")
        };
        let (start, called) = (start.clone(), called.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let request = reqwest::Request::new(reqwest::Method::GET, url.parse()?);
            let response = client.ready().await?.call(request);
            called.wait().await;
            let verdict = match response.await {
                Ok(response) => match response.text().await {
                    Ok(body) if body == expected => Verdict::Accepted,
                    _ => Verdict::Other,
                },
                Err(err) if err.is::<BulkheadFull>() => Verdict::Rejected,
                Err(_) => Verdict::Other,
            };
            Ok::<_, BoxError>((is_payment, verdict))
        }));
    }

    let mut counts = [[0usize; 3]; 2];
    for task in tasks {
        let (is_payment, verdict) = task.await??;
        counts[usize::from(!is_payment)][verdict as usize] += 1;
    }
    let [payment_counts, inventory_counts] = counts;
    println!(
        "RESULT paymentAccepted={} paymentRejected={} paymentOther={} paymentMaxPermitted={} \
         inventoryAccepted={} inventoryRejected={} inventoryOther={} paymentAvailable={} \
         inventoryAvailable={}",
        payment_counts[Verdict::Accepted as usize],
        payment_counts[Verdict::Rejected as usize],
        payment_counts[Verdict::Other as usize],
        payment_in_flight.max.load(Ordering::SeqCst),
        inventory_counts[Verdict::Accepted as usize],
        inventory_counts[Verdict::Rejected as usize],
        inventory_counts[Verdict::Other as usize],
        payment.snapshot().available_concurrent_calls,
        inventory.snapshot().available_concurrent_calls,
    );
    Ok(())
}
