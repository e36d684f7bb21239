//! A blind attack on how the outbound layers give back and settle: a client quota settled
//! later (`SettleLater`/`Unsettled`) with its settles dropped, repeated, absurd or panicking,
//! over a `Metered` limiter whose holds must end exactly once; a quota above a full bulkhead;
//! and bulkhead permits released exactly once whatever ends a call. Figures come from the
//! quota and the rustdoc of `ClientQuotaLayer::settle_by`, `Unsettled` and `Bulkhead`.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http_body_util::{BodyExt, Full, StreamBody};
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::algorithm::Metered;
use tower_bulwark::bulkhead::{Bulkhead, BulkheadFull};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::quota::{SettleLater, Unsettled};
use tower_bulwark::outbound::ClientQuotaLayer;
use tower_bulwark::{BoxError, DirectRateLimiter, Quota};

use crate::common::poll_once;

type Tokens = DirectRateLimiter<Metered, ManualClock>;
const Q: u64 = 1_000;

/// A manual clock, and a limiter of `Q` tokens a minute on it, holding each estimate until it
/// is settled.
fn clock_and_tokens() -> (ManualClock, Tokens) {
    let clock = ManualClock::new();
    let l = DirectRateLimiter::builder(Quota::per_minute(Q as u32).unwrap())
        .algorithm::<Metered>()
        .clock(clock.clone())
        .build();
    (clock, l)
}

/// What `l` has left now (see [`crate::common::probe`]).
fn probe(l: &Tokens) -> u64 {
    crate::common::probe(l, &())
}

/// Asserts that `spent` of `l`'s `Q` are spent now and none a minute later: the hold of the
/// estimate ended, and nothing was charged past `Q`.
fn spent_then_whole(clock: &ManualClock, l: &Tokens, spent: u64) {
    assert_eq!(probe(l), Q - spent, "spent now");
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        probe(l),
        Q,
        "whole a minute later: no hold left, no charge past Q"
    );
}

async fn ok(_: ()) -> Result<http::Response<()>, BoxError> {
    Ok(http::Response::new(()))
}

/// One call of `estimate` through a `SettleLater` quota on `l`: its `Unsettled`.
async fn call_later(l: &Tokens, estimate: u32) -> Unsettled {
    let client = ClientQuotaLayer::new("llm", l.clone())
        .cost(estimate)
        .settle_by(SettleLater)
        .layer(service_fn(ok));
    let mut response = client.oneshot(()).await.unwrap();
    response.extensions_mut().remove::<Unsettled>().unwrap()
}

/// `Unsettled`: "Dropped (every clone of it) unsettled, the call's estimate stands", and the
/// settle "runs with the estimate standing, which a limiter holding the estimate until the
/// settle (`Metered`) needs to hear". While one clone lives the 300 stay held (a minute later
/// still 700 left: a hold does not drain); once the last is dropped the 300 are charged as of
/// the call and drain: a minute after that, the key is whole.
#[tokio::test]
async fn an_unsettled_dropped_clone_by_clone_ends_its_hold_with_the_last() {
    let (clock, l) = clock_and_tokens();
    let unsettled = call_later(&l, 300).await;
    let clone = unsettled.clone();
    drop(unsettled);
    assert_eq!(probe(&l), Q - 300);
    clock.advance(Duration::from_secs(60));
    assert_eq!(probe(&l), Q - 300, "still held while a clone lives");
    drop(clone);
    assert_eq!(
        probe(&l),
        Q,
        "charged as of the call, a minute ago: drained"
    );
}

/// `Unsettled::settle`: "Only the first settle of a call counts (clones share it): returns
/// whether this one did." An estimate of 300 settled to 40, then to 0 and to `u32::MAX` through
/// clones: only the 40 is charged, the hold ends, and the key is whole a minute later.
#[tokio::test]
async fn only_the_first_settle_of_a_call_counts_whatever_the_later_ones_say() {
    let (clock, l) = clock_and_tokens();
    let unsettled = call_later(&l, 300).await;
    assert!(unsettled.clone().settle(40));
    assert!(!unsettled.settle(0));
    assert!(!unsettled.clone().settle(u32::MAX));
    drop(unsettled);
    spent_then_whole(&clock, &l, 40);
}

/// `Limiter::settle`: "A cost above the most one request can take ... is charged as that
/// most." A call settled later to `u32::MAX` spends the whole `Q` and no more: whole again a
/// minute later.
#[tokio::test]
async fn a_call_settled_later_to_u32_max_is_charged_as_the_capacity() {
    let (clock, l) = clock_and_tokens();
    assert!(call_later(&l, 10).await.settle(u32::MAX));
    spent_then_whole(&clock, &l, Q);
}

/// Guide, settled costs: "whatever ends a request or a call ... its estimate is settled exactly
/// once"; `ClientQuotaLayer::settle_by`: `None` (nothing readable) keeps the estimate. A settle
/// function that panics on the response: the answer reaches the caller (`usage`: "a panic in
/// it reaches no caller"), the 250 of its estimate are spent, and the hold ends (a minute
/// later the key is whole), as when it reads nothing.
#[tokio::test]
async fn a_panicking_settle_function_keeps_the_estimate_and_ends_the_hold() {
    let (clock, l) = clock_and_tokens();
    let client = ClientQuotaLayer::new("llm", l.clone())
        .cost(250)
        .settle_by(|_: &http::Response<()>| -> Option<u32> { panic!("the settle panics") })
        .layer(service_fn(ok));
    assert!(client.oneshot(()).await.is_ok());
    spent_then_whole(&clock, &l, 250);
}

/// `ClientQuotaLayer::settle_by`: "a call that failed ... keep[s] the estimate"; the module
/// docs: "the dependency's own error keeps them". A `SettleLater` call whose dependency fails:
/// 200 spent, the hold ended (whole a minute later).
#[tokio::test]
async fn a_failed_call_settled_later_keeps_its_estimate_and_ends_the_hold() {
    let (clock, l) = clock_and_tokens();
    let client = ClientQuotaLayer::new("llm", l.clone())
        .cost(200)
        .settle_by(SettleLater)
        .layer(service_fn(|_: ()| async {
            Err::<http::Response<()>, BoxError>("the dependency failed".into())
        }));
    assert!(client.oneshot(()).await.is_err());
    spent_then_whole(&clock, &l, 200);
}

/// Module docs: "A call that one of the crate's layers below the quota refuses before sending
/// it (a `BulkheadFull` ...) reached nothing: its permits go back." A `SettleLater` call of 400
/// refused by a full bulkhead below spends nothing and leaves no hold; the bulkhead's one
/// permit is still the one call's.
#[tokio::test]
async fn a_call_refused_by_a_full_bulkhead_below_gives_back_its_whole_hold() {
    let (_, l) = clock_and_tokens();
    let bulkhead = Bulkhead::semaphore("dep", 1).build();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let rx = Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let dependency = service_fn(move |_: ()| {
        let rx = Arc::clone(&rx);
        async move {
            if let Some(rx) = rx.lock().await.take() {
                let _ = rx.await;
            }
            Ok::<_, BoxError>(http::Response::new(()))
        }
    });
    let client = ClientQuotaLayer::new("llm", l.clone())
        .cost(400)
        .settle_by(SettleLater)
        .layer(bulkhead.layer().layer(dependency));
    let mut first = Box::pin(client.clone().oneshot(()));
    assert!(poll_once(first.as_mut()).is_pending());
    let err = client.clone().oneshot(()).await.unwrap_err();
    assert!(err.is::<BulkheadFull>(), "{err}");
    assert_eq!(probe(&l), Q - 400, "only the first call's estimate");
    tx.send(()).unwrap();
    let mut response = first.await.unwrap();
    let unsettled = response.extensions_mut().remove::<Unsettled>().unwrap();
    assert!(unsettled.settle(0));
    assert_eq!(probe(&l), Q);
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
}

/// A body that sends `first`, then ends.
fn open_body(first: &'static str) -> Streamed {
    let (tx, rx) = futures::channel::mpsc::unbounded::<Frame>();
    tx.unbounded_send(Ok(http_body::Frame::data(Bytes::from(first))))
        .unwrap();
    StreamBody::new(rx)
}

type Frame = Result<http_body::Frame<Bytes>, Infallible>;
type Streamed = StreamBody<futures::channel::mpsc::UnboundedReceiver<Frame>>;

/// README, bulkheads: "given back exactly once when the call ends: response, error, panic, or
/// the future dropped. With `body_layer()` it is held until the `http::Response` body has been
/// read to its end." Two permits; every way a call ends, one after another on the same
/// bulkhead: a body dropped midway, a body read to its end, an error, a panic in the future, a
/// future dropped while waiting in the queue: after each, both permits are free and nobody
/// waits, and while a body is open its permit is held.
#[tokio::test]
async fn every_way_a_call_ends_frees_its_body_layer_permit_exactly_once() {
    let bulkhead = Bulkhead::queue("dep", 2, 4).build();
    let free = || bulkhead.snapshot().available_concurrent_calls;
    let streaming = bulkhead
        .body_layer()
        .layer(service_fn(|how: &'static str| async move {
            match how {
                "error" => Err::<http::Response<Streamed>, BoxError>("failed".into()),
                "panic" => panic!("the dependency panics"),
                _ => Ok(http::Response::new(open_body("data"))),
            }
        }));
    // A body dropped after its first frame, before its end was read.
    let mut midway = streaming
        .clone()
        .oneshot("stream")
        .await
        .unwrap()
        .into_body();
    assert!(midway.frame().await.unwrap().unwrap().is_data());
    assert_eq!(free(), 1, "the open body holds its permit");
    drop(midway);
    assert_eq!(free(), 2);
    assert!(streaming.clone().oneshot("error").await.is_err());
    assert_eq!(free(), 2);
    let panicked = AssertUnwindSafe(streaming.clone().oneshot("panic"))
        .catch_unwind()
        .await;
    assert!(panicked.is_err());
    assert_eq!(free(), 2);
    // Two open bodies fill it; a third call waits in the queue and is dropped there.
    let a = streaming.clone().oneshot("stream").await.unwrap();
    let b = streaming.clone().oneshot("stream").await.unwrap();
    assert_eq!(free(), 0);
    let mut waiter = Box::pin(streaming.clone().oneshot("stream"));
    assert!(poll_once(waiter.as_mut()).is_pending());
    assert_eq!(bulkhead.snapshot().queue_depth, 1);
    drop(waiter);
    assert_eq!(bulkhead.snapshot().queue_depth, 0);
    drop(a);
    drop(b);
    assert_eq!(free(), 2);
    let s = bulkhead.snapshot();
    assert_eq!((s.total_permitted, s.total_finished), (5, 5));
}

async fn full(_: ()) -> Result<http::Response<Full<Bytes>>, BoxError> {
    Ok(http::Response::new(Full::new(Bytes::from("ok"))))
}

/// Guide: "N tasks racing for L get exactly L" (client quota), and a bulkhead permit goes back
/// exactly once. 64 tasks on several threads through a quota of `Q` (each call 10) above a
/// semaphore of 3 whose bodies are read: every call ends, 640 spent, all 3 permits free.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn racing_calls_through_a_quota_and_a_body_bulkhead_leave_exact_counts() {
    let (_, l) = clock_and_tokens();
    let bulkhead = Bulkhead::semaphore("dep", 3).build();
    let client = ClientQuotaLayer::new("llm", l.clone())
        .cost(10)
        .layer(bulkhead.body_layer().layer(service_fn(full)));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                match client.oneshot(()).await {
                    Ok(response) => {
                        response.into_body().collect().await.unwrap();
                        true
                    }
                    Err(err) => {
                        assert!(err.is::<BulkheadFull>(), "{err}");
                        false
                    }
                }
            })
        })
        .collect();
    let mut sent = 0;
    for t in tasks {
        sent += u64::from(t.await.unwrap());
    }
    assert!(sent >= 3);
    assert_eq!(probe(&l), Q - 10 * sent, "refused calls gave their 10 back");
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 3);
}
