//! Cancellation at every await: whatever ends a request (its future dropped before it ran, while
//! it waits in the queue, while the inner service runs, after it was granted a place but before
//! it woke; its body dropped half way; an error; a panic), its permit comes back exactly once.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::{Layer, ServiceExt};
use tower_bulwark::overload::Priority;

use crate::support::{
    alternating, body_of_a_default_request, fixed, gated, one_inside, queued, request,
};

#[tokio::test]
async fn a_future_dropped_before_its_first_poll_gives_its_place_back() {
    let overload = fixed(1).build();
    let (service, gated, _entered) = gated(&overload);
    let future = crate::support::called(&service, Priority::Default).await;
    assert_eq!(overload.in_flight(), 1, "admitted in call");
    drop(future);
    assert_eq!(overload.in_flight(), 0);
    assert_eq!(gated.reached.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_future_dropped_while_the_service_runs_gives_its_place_back() {
    let overload = fixed(1).build();
    let (service, _gated, mut entered) = gated(&overload);
    let call = tokio::spawn(service.oneshot(request(Priority::Default)));
    entered.recv().await.unwrap();
    assert_eq!(overload.in_flight(), 1);
    call.abort();
    let _ = call.await;
    assert_eq!(overload.in_flight(), 0);
}

#[tokio::test]
async fn a_queued_future_dropped_leaves_the_queue_and_takes_nothing() {
    let (overload, service, gated, _entered, first) =
        one_inside(4, Duration::from_secs(60), Priority::Default).await;
    // Waits: the limit is reached.
    drop(queued(&service, Priority::Critical));
    gated.gate.add_permits(1);
    drop(first.await.unwrap().unwrap());
    assert_eq!(overload.in_flight(), 0);
    assert_eq!(
        gated.reached.load(Ordering::SeqCst),
        1,
        "the dropped waiter never ran"
    );
}

#[tokio::test]
async fn a_waiter_granted_a_place_and_dropped_before_it_woke_gives_it_back() {
    let (overload, service, gated, _entered, first) =
        one_inside(4, Duration::from_secs(60), Priority::Default).await;
    let waiter = queued(&service, Priority::Default);
    gated.gate.add_permits(1);
    drop(first.await.unwrap().unwrap());
    // The first one's end handed its place to the waiter, which has not been polled since.
    assert_eq!(overload.in_flight(), 1);
    drop(waiter);
    assert_eq!(overload.in_flight(), 0);
}

#[tokio::test]
async fn a_body_dropped_half_way_gives_the_place_back_and_a_body_read_to_its_end_too() {
    let overload = fixed(2).build();
    let streaming = tower::service_fn(|_: http::Request<Body>| async {
        let chunks =
            futures::stream::iter(["a", "b", "c"].map(|c| Ok::<_, Infallible>(Bytes::from(c))));
        Ok::<_, Infallible>(http::Response::new(Body::from_stream(chunks)))
    });
    let service = overload.layer().layer(streaming);
    let mut body = body_of_a_default_request(&service).await;
    assert_eq!(
        overload.in_flight(),
        1,
        "the body holds the place while it streams"
    );
    body.frame().await.unwrap().unwrap();
    assert_eq!(overload.in_flight(), 1);
    drop(body);
    assert_eq!(overload.in_flight(), 0);
    let body = body_of_a_default_request(&service).await;
    assert_eq!(body.collect().await.unwrap().to_bytes(), "abc");
    assert_eq!(overload.in_flight(), 0);
}

#[tokio::test]
async fn an_error_or_a_panic_gives_the_place_back() {
    let overload = fixed(1).build();
    let (calls, failing) = alternating(|panics, request| async move {
        if panics {
            panic!("handler panicked on {}", request.uri());
        }
        Err::<http::Response<Body>, _>("broken")
    });
    let service = overload.layer().layer(failing);
    for _ in 0..10 {
        let call = tokio::spawn(service.clone().oneshot(request(Priority::Default)));
        let _ = call.await;
        assert_eq!(overload.in_flight(), 0);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        10,
        "every call was admitted: the place came back each time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_cancelled_at_random_points_all_give_their_places_back() {
    let overload = fixed(4).queue(8, Duration::from_secs(60)).unwrap().build();
    let (service, gated, _entered) = gated(&overload);
    gated.gate.add_permits(1 << 20);
    let mut tasks = Vec::new();
    for i in 0..400usize {
        let service = service.clone();
        let class = [Priority::Critical, Priority::Default, Priority::Sheddable][i % 3];
        tasks.push(tokio::spawn(async move {
            let call = service.oneshot(request(class));
            let cancel = async {
                for _ in 0..i % 7 {
                    tokio::task::yield_now().await;
                }
            };
            tokio::select! {
                response = call => {
                    let mut body = response.unwrap().into_body();
                    if i % 2 == 0 {
                        let _ = body.frame().await;
                    }
                }
                () = cancel, if i % 3 != 0 => {}
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(overload.in_flight(), 0);
}
