//! A slow dependency cannot take the capacity another one needs: real HTTP through
//! `reqwest::Client` against a `wiremock` server whose `/pay` answers after two seconds.
//!
//! Every worker takes (or is refused) its permit before any response is awaited, so the counts
//! do not depend on how fast the machine is; the two-second delay only keeps the payment calls
//! in flight while the inventory calls run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull, CallFinished, CallPermitted};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const PAYMENT_CALLS: usize = 6;
const INVENTORY_CALLS: usize = 8;

#[derive(Debug, PartialEq)]
enum Verdict {
    Accepted,
    Rejected,
    Other(String),
}

/// Raised by `on_call_permitted`, lowered by `on_call_finished`.
#[derive(Clone, Default)]
struct Peak {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

fn watched(name: &str, limit: usize, peak: &Peak) -> Bulkhead {
    let (up, down) = (peak.clone(), peak.clone());
    Bulkhead::semaphore(name, limit)
        .on_call_permitted(move |_: &CallPermitted<'_>| {
            let now = up.now.fetch_add(1, Ordering::SeqCst) + 1;
            up.max.fetch_max(now, Ordering::SeqCst);
        })
        .on_call_finished(move |_: &CallFinished<'_>| {
            down.now.fetch_sub(1, Ordering::SeqCst);
        })
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_payment_gateway_leaves_inventory_alone() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/pay"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_string("paid")
                .set_delay(Duration::from_secs(2)),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/stock"))
        .respond_with(ResponseTemplate::new(200).set_body_string("ok"))
        .mount(&server)
        .await;

    let payment_peak = Peak::default();
    let inventory_peak = Peak::default();
    let payment = watched("payment", 2, &payment_peak);
    let inventory = watched("inventory", 8, &inventory_peak);
    let payment_client = payment.layer().layer(reqwest::Client::new());
    let inventory_client = inventory.layer().layer(reqwest::Client::new());

    let workers = PAYMENT_CALLS + INVENTORY_CALLS;
    let start = Arc::new(Barrier::new(workers));
    // Passed once every worker has called (and so taken or been refused its permit).
    let called = Arc::new(Barrier::new(workers + 1));

    let mut tasks = Vec::new();
    for i in 0..workers {
        let is_payment = i < PAYMENT_CALLS;
        let (mut client, url, expected) = if is_payment {
            (
                payment_client.clone(),
                format!("{}/pay", server.uri()),
                "paid",
            )
        } else {
            (
                inventory_client.clone(),
                format!("{}/stock", server.uri()),
                "ok",
            )
        };
        let (start, called) = (start.clone(), called.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let request = reqwest::Request::new(reqwest::Method::GET, url.parse().unwrap());
            let response = client.ready().await.unwrap().call(request);
            called.wait().await;
            let verdict = match response.await {
                Ok(response) => match response.text().await {
                    Ok(body) if body == expected => Verdict::Accepted,
                    Ok(body) => Verdict::Other(format!("body {body:?}")),
                    Err(err) => Verdict::Other(err.to_string()),
                },
                Err(err) if err.is::<BulkheadFull>() => Verdict::Rejected,
                Err(err) => Verdict::Other(err.to_string()),
            };
            (is_payment, verdict)
        }));
    }

    called.wait().await;
    // Every call has been made: payment is full, inventory has all eight calls in flight.
    assert_eq!(payment.snapshot().available_concurrent_calls, 0);
    assert_eq!(payment.snapshot().total_permitted, 2);
    assert_eq!(payment.snapshot().total_rejected, 4);
    assert_eq!(inventory.snapshot().total_permitted, 8);
    assert_eq!(inventory.snapshot().total_rejected, 0);

    let mut payment_verdicts = Vec::new();
    let mut inventory_verdicts = Vec::new();
    for task in tasks {
        let (is_payment, verdict) = task.await.unwrap();
        if is_payment {
            payment_verdicts.push(verdict);
        } else {
            inventory_verdicts.push(verdict);
        }
    }
    let count = |verdicts: &[Verdict], wanted: &Verdict| {
        verdicts.iter().filter(|verdict| *verdict == wanted).count()
    };
    assert_eq!(
        count(&payment_verdicts, &Verdict::Accepted),
        2,
        "{payment_verdicts:?}"
    );
    assert_eq!(
        count(&payment_verdicts, &Verdict::Rejected),
        4,
        "{payment_verdicts:?}"
    );
    assert_eq!(
        count(&inventory_verdicts, &Verdict::Accepted),
        8,
        "{inventory_verdicts:?}"
    );

    assert_eq!(payment_peak.max.load(Ordering::SeqCst), 2);
    assert_eq!(payment_peak.now.load(Ordering::SeqCst), 0);
    assert_eq!(inventory_peak.max.load(Ordering::SeqCst), 8);

    let payment_after = payment.snapshot();
    let inventory_after = inventory.snapshot();
    assert_eq!(payment_after.available_concurrent_calls, 2);
    assert_eq!(payment_after.total_finished, 2);
    assert_eq!(inventory_after.available_concurrent_calls, 8);
    assert_eq!(inventory_after.total_finished, 8);
    // The refused payment calls never reached the server.
    let requests = server.received_requests().await.unwrap();
    let paid = requests.iter().filter(|r| r.url.path() == "/pay").count();
    assert_eq!(paid, 2);
}

#[tokio::test]
async fn the_permit_is_not_taken_by_an_idle_ready_client() {
    let bulkhead = Bulkhead::semaphore("payment", 1).build();
    let mut clients: Vec<_> = (0..4)
        .map(|_| bulkhead.layer().layer(reqwest::Client::new()))
        .collect();
    for client in &mut clients {
        ServiceExt::<reqwest::Request>::ready(client).await.unwrap();
    }
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    assert_eq!(bulkhead.snapshot().total_permitted, 0);
}

#[tokio::test]
async fn reqwest_calls_end_at_the_headers_unless_the_body_layer_holds_them() {
    use http_body_util::BodyExt;

    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/report"))
        .respond_with(ResponseTemplate::new(200).set_body_string("a report body"))
        .mount(&server)
        .await;
    let url: reqwest::Url = format!("{}/report", server.uri()).parse().unwrap();
    let get = || reqwest::Request::new(reqwest::Method::GET, url.clone());

    // Plain layer: the call ends when the headers arrive; the body is read outside the bulkhead.
    let plain = Bulkhead::semaphore("plain", 1).build();
    let response = plain
        .layer()
        .layer(reqwest::Client::new())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(plain.snapshot().available_concurrent_calls, 1);
    assert_eq!(response.text().await.unwrap(), "a report body");

    // Body layer: the permit lasts until the body has been read.
    let held = Bulkhead::semaphore("held", 1).build();
    let client = tower::ServiceBuilder::new()
        .layer(held.body_layer())
        .map_response(|response: reqwest::Response| http::Response::<reqwest::Body>::from(response))
        .service(reqwest::Client::new());
    let response = client.clone().oneshot(get()).await.unwrap();
    assert_eq!(held.snapshot().available_concurrent_calls, 0);
    let refused = client.clone().oneshot(get()).await.unwrap_err();
    assert!(refused.is::<BulkheadFull>());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"a report body");
    assert_eq!(held.snapshot().available_concurrent_calls, 1);
    assert_eq!(held.snapshot().total_finished, 1);
}
