//! Shed answers: `503` at once with a valid `Retry-After` from the latency and a problem body;
//! gRPC calls get `UNAVAILABLE` with the delay; and the same through a real listener and a
//! reqwest client, where a streaming answer holds its place until the client has read it.

use std::time::Duration;

use axum::{routing::get, Router};
use tower::ServiceExt;
use tower_bulwark::bulkhead::adaptive::Limits;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::overload::{Overload, Priority};

use crate::support::{fixed, gated, held_inside, request};

#[tokio::test]
async fn a_shed_request_gets_503_retry_after_and_a_problem() {
    let overload = fixed(1).build();
    let (service, _gated, mut entered) = gated(&overload);
    let _held = held_inside(&service, &mut entered, Priority::Critical).await;
    let response = service.oneshot(request(Priority::Critical)).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "about:blank");
    assert_eq!(problem["title"], "Service Unavailable");
    assert_eq!(problem["status"], 503);
    assert_eq!(
        problem["detail"],
        "'api' is overloaded and shed the request; retry in 1 second."
    );
}

#[tokio::test]
async fn retry_after_follows_the_latency_in_whole_seconds() {
    let clock = ManualClock::new();
    let overload = fixed(1).clock(clock.clone()).build();
    let (service, gated, mut entered) = gated(&overload);
    let first = held_inside(&service, &mut entered, Priority::Critical).await;
    clock.advance(Duration::from_millis(2_500));
    gated.gate.add_permits(1);
    drop(first.await.unwrap().unwrap());
    let _held = held_inside(&service, &mut entered, Priority::Critical).await;
    let response = service.oneshot(request(Priority::Critical)).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "3", "2.5 s, rounded up");
}

#[cfg(feature = "grpc")]
#[tokio::test]
async fn a_shed_grpc_call_gets_unavailable_with_the_delay() {
    use tonic_types::StatusExt;

    let overload = fixed(1).build();
    let (service, _gated, mut entered) = gated(&overload);
    let _held = held_inside(&service, &mut entered, Priority::Critical).await;
    let call = http::Request::post("/pkg.Svc/Method")
        .header("content-type", "application/grpc")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = service.oneshot(call).await.unwrap();
    assert_eq!(response.status(), 200, "trailers-only");
    let headers = response.headers();
    assert_eq!(headers["grpc-status"], "14");
    assert_eq!(headers["grpc-retry-pushback-ms"], "1000");
    let status = tonic::Status::from_header_map(headers).unwrap();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let delay = status.get_error_details().retry_info().unwrap().retry_delay;
    assert_eq!(delay, Some(Duration::from_secs(1)));
}

#[tokio::test]
async fn over_a_real_listener_a_stream_holds_its_place_until_read_and_the_rest_are_shed() {
    let overload = Overload::builder("api")
        .limits(Limits::new(2, 2, 2).unwrap())
        .guarantee(Priority::Critical, 0.5)
        .unwrap()
        .priority_by(|head| match head.headers.get("x-priority") {
            Some(value) => Priority::from_header_value(value.to_str().unwrap_or("")),
            None => Priority::Default,
        })
        .build();
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(1);
    let receiver = std::sync::Arc::new(std::sync::Mutex::new(Some(receiver)));
    let stream = move || {
        let receiver = receiver.lock().unwrap().take().unwrap();
        async move { axum::body::Body::from_stream(tokio_stream(receiver)) }
    };
    let app = Router::new()
        .route("/stream", get(stream))
        .route("/work", get(|| async { "done" }))
        .layer(overload.layer());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::new();
    let mut streaming = client
        .get(format!("http://{addr}/stream"))
        .send()
        .await
        .unwrap();
    sender.send(Ok("first".into())).await.unwrap();
    assert_eq!(streaming.chunk().await.unwrap().unwrap(), "first");
    assert_eq!(overload.in_flight(), 1);
    // The default class's ceiling (1) is reached; a critical request still has its place.
    let shed = client
        .get(format!("http://{addr}/work"))
        .send()
        .await
        .unwrap();
    assert_eq!(shed.status(), 503);
    assert_eq!(shed.headers()["retry-after"], "1");
    let critical = client
        .get(format!("http://{addr}/work"))
        .header("x-priority", "critical");
    assert_eq!(critical.send().await.unwrap().text().await.unwrap(), "done");
    drop(sender);
    assert!(streaming.chunk().await.unwrap().is_none());
    let admitted = client
        .get(format!("http://{addr}/work"))
        .send()
        .await
        .unwrap();
    assert_eq!(admitted.status(), 200);
}

/// The receiver as a stream of chunks.
fn tokio_stream(
    mut receiver: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}
