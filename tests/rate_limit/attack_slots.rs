//! Attacks on a `ConcurrencyLimiter` (a `Policy::concurrent`'s, which is `Clone`) served
//! elsewhere, as the CHANGELOG's Unreleased section says it now gives its slots back: in a
//! `Policy::new` (one pool of slots), in `Tiers` (a limit per plan, a plan that changes while a
//! stream is open), with `count_if` and `settle_by`, and in a client quota
//! (`outbound::quota::ClientQuotaLayer`, with `settle_by` and `SettleLater`). Each request ends
//! every way it can; the slots are counted after it by streams opened in a row.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::{Layer, ServiceExt};
use tower_bulwark::clock::TokioClock;
use tower_bulwark::outbound::quota::{QuotaExhausted, SettleLater, Unsettled};
use tower_bulwark::outbound::ClientQuotaLayer;
use tower_bulwark::rate_limit::{ConcurrencyLimiter, HeaderKey, Policy, RateLimitBody};
use tower_bulwark::tiers::Tiers;
use tower_bulwark::BoxError;

use crate::common::held_stream::{limited, plain_answer, request, Limited};
use crate::common::poll_once;

/// The limiter of `in_flight` streams per tenant.
fn slots(in_flight: u32) -> ConcurrencyLimiter<HeaderValue> {
    Policy::concurrent("streams", HeaderKey::new("x-tenant").unwrap(), in_flight)
        .unwrap()
        .limiter()
        .clone()
}

fn tenant() -> HeaderKey {
    HeaderKey::new("x-tenant").unwrap()
}

/// One plan of one slot for every tenant, as `Tiers`.
fn one_tier() -> Tiers<HeaderValue, &'static str, ConcurrencyLimiter<HeaderValue>> {
    Tiers::new(|_: &HeaderValue| "free", "free", slots(1))
}

/// How many streams of tenant `t` are admitted in a row now (each held open), and their ends:
/// the streams are let end and read whole before this returns.
async fn free_slots(service: &Limited, ends: &Arc<Semaphore>) -> usize {
    let mut open: Vec<Response<RateLimitBody<Body>>> = Vec::new();
    loop {
        let response = service.clone().oneshot(request("stream")).await.unwrap();
        if response.status() != StatusCode::OK {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            break;
        }
        open.push(response);
        assert!(open.len() < 10, "no slot limit at all");
    }
    let n = open.len();
    ends.add_permits(n);
    for response in open {
        response.into_body().collect().await.unwrap();
    }
    n
}

/// Each way a request of the handler (`x-how`) can end, ended: the response read whole, its
/// body dropped unread or after its first chunk, a body that fails, an inner service that
/// fails or panics, a request dropped while the handler hangs, one dropped before its first
/// poll.
async fn end_a_request(service: &Limited, ends: &Arc<Semaphore>, how: &str) {
    match how {
        "read" | "dropped unread" | "dropped after a chunk" | "cut" => {
            let wire = if how == "cut" { "cut" } else { "stream" };
            let response = service.clone().oneshot(request(wire)).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{how}");
            let mut body = response.into_body();
            match how {
                "read" => {
                    ends.add_permits(1);
                    body.collect().await.unwrap();
                }
                "dropped after a chunk" | "cut" => {
                    let first = body.frame().await.unwrap().unwrap();
                    assert_eq!(first.into_data().unwrap(), "a");
                    if how == "cut" {
                        assert!(body.frame().await.unwrap().is_err());
                    }
                }
                _ => {}
            }
        }
        "fail" => assert!(service.clone().oneshot(request("fail")).await.is_err()),
        "panic" => {
            let service = service.clone();
            let task = tokio::spawn(async move { service.oneshot(request("panic")).await });
            assert!(task.await.is_err(), "the handler panics");
        }
        "hang" => {
            let mut call = Box::pin(service.clone().oneshot(request("hang")));
            assert!(poll_once(call.as_mut()).is_pending());
        }
        "never polled" => drop(service.clone().oneshot(request("stream"))),
        _ => unreachable!(),
    }
}

const WAYS: [&str; 8] = [
    "read",
    "dropped unread",
    "dropped after a chunk",
    "cut",
    "fail",
    "panic",
    "hang",
    "never polled",
];

/// The services under attack: a tenant's one slot through a pool in `Policy::new` and
/// through `Tiers`, each plain, with a `count_if` that never counts and one that always does,
/// and with a settle to zero and to 9.
fn services(ends: &Arc<Semaphore>) -> Vec<(String, Limited)> {
    let mut all = Vec::new();
    for via in ["Policy::new(pool)", "Policy::new(Tiers)"] {
        for with in [
            "plain",
            "count_if never",
            "count_if always",
            "settle 0",
            "settle 9",
        ] {
            let service = if via == "Policy::new(pool)" {
                let p = Policy::new("streams", tenant(), slots(1)).unwrap();
                match with {
                    "plain" => limited(p, ends, plain_answer),
                    "count_if never" => limited(p.count_if(|_| false), ends, plain_answer),
                    "count_if always" => limited(p.count_if(|_| true), ends, plain_answer),
                    "settle 0" => limited(p.settle_by(|_| Some(0)), ends, plain_answer),
                    _ => limited(p.settle_by(|_| Some(9)), ends, plain_answer),
                }
            } else {
                let p = Policy::new("streams", tenant(), one_tier()).unwrap();
                match with {
                    "plain" => limited(p, ends, plain_answer),
                    "count_if never" => limited(p.count_if(|_| false), ends, plain_answer),
                    "count_if always" => limited(p.count_if(|_| true), ends, plain_answer),
                    "settle 0" => limited(p.settle_by(|_| Some(0)), ends, plain_answer),
                    _ => limited(p.settle_by(|_| Some(9)), ends, plain_answer),
                }
            };
            all.push((format!("{via}, {with}"), service));
        }
    }
    all
}

/// `ConcurrencyLimiter` (`src/rate_limit/concurrent.rs:17-25`): "every slot goes back exactly
/// once, also where a clone of it serves elsewhere: in [`Policy::new`] (one pool of slots for
/// two policies) it makes a concurrent policy; inside a [`Tiers`] (a limit per plan) or a client
/// quota, its admissions say they hold slots, so the layer gives them back whole when the
/// request ends"; `Policy::concurrent` (`src/rate_limit/concurrent.rs:99-101,113-115`): "an
/// admitted request holds its slot until its response body ends, fails or is dropped, or until
/// the inner service fails or the request is dropped before an answer"; "A concurrent policy
/// keeps its hold: `count_if`, `settle_by` ... leave it as it is". After every way a request
/// ends, the tenant has exactly its one slot: not none (kept), not two (given back twice).
#[tokio::test]
async fn every_way_a_request_ends_gives_a_pooled_or_tiered_slot_back_exactly_once() {
    let ends = Arc::new(Semaphore::new(0));
    crate::common::process::quiet_panics_starting_with("a handler that panics");
    let mut broken = Vec::new();
    for (what, service) in services(&ends) {
        for how in WAYS {
            end_a_request(&service, &ends, how).await;
            let free = free_slots(&service, &ends).await;
            if free != 1 {
                broken.push(format!("{what}, {how}: {free} slots after it (one)"));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The same promises, while a stream is open: its slot is held (a second stream of the tenant
/// is refused) until its body ends, then exactly one stream more fits.
#[tokio::test]
async fn an_open_stream_holds_its_pooled_or_tiered_slot_until_its_body_ends() {
    let ends = Arc::new(Semaphore::new(0));
    let mut broken = Vec::new();
    for (what, service) in services(&ends) {
        let a = service.clone().oneshot(request("stream")).await.unwrap();
        assert_eq!(a.status(), StatusCode::OK, "{what}");
        let b = service.clone().oneshot(request("stream")).await.unwrap();
        if b.status() != StatusCode::TOO_MANY_REQUESTS {
            broken.push(format!(
                "{what}: a second stream admitted while the first is open"
            ));
            ends.add_permits(1);
            b.into_body().collect().await.unwrap();
        }
        ends.add_permits(1);
        a.into_body().collect().await.unwrap();
        let free = free_slots(&service, &ends).await;
        if free != 1 {
            broken.push(format!("{what}: {free} slots after the stream ended (one)"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// `Tiers` (`src/guide.rs:209`): "a refund goes to the tier that charged it, even after the key
/// moved", and `ConcurrencyLimiter` (`src/rate_limit/concurrent.rs:17-25`), as above. Free
/// tenants have one slot, pro tenants two. Tenant `t` opens a stream on the free plan, moves to
/// pro, opens two (pro full), and its first stream ends: its slot goes back to the free plan,
/// not to pro (still full), and once `t` is free again it has exactly its one slot.
#[tokio::test]
async fn a_slot_goes_back_to_the_tier_that_granted_it_after_the_plan_changed() {
    let (pro, plan) = crate::attack_tier_slots::switched_plan();
    let plans = Tiers::new(plan, "free", slots(1)).tier("pro", slots(2));
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(
        Policy::new("streams", tenant(), plans).unwrap(),
        &ends,
        plain_answer,
    );
    let open = || service.clone().oneshot(request("stream"));
    let free_stream = open().await.unwrap();
    assert_eq!(free_stream.status(), StatusCode::OK);
    pro.store(true, Ordering::SeqCst);
    let (b, c) = (open().await.unwrap(), open().await.unwrap());
    assert_eq!((b.status(), c.status()), (StatusCode::OK, StatusCode::OK));
    ends.add_permits(1);
    free_stream.into_body().collect().await.unwrap();
    let pro_after = open().await.unwrap().status();
    pro.store(false, Ordering::SeqCst);
    let free_after = free_slots(&service, &ends).await;
    assert!(
        pro_after == StatusCode::TOO_MANY_REQUESTS && free_after == 1,
        "the free stream's slot went back to pro ({pro_after} for a third pro stream) or the \
         free plan has {free_after} slots after it (one)"
    );
    ends.add_permits(2);
    for r in [b, c] {
        r.into_body().collect().await.unwrap();
    }
}

/// A rate policy of one request a second per tenant on tokio's clock, waiting up to ten seconds.
fn waiting() -> Policy<
    HeaderKey,
    tower_bulwark::KeyedRateLimiter<HeaderValue, tower_bulwark::algorithm::Gcra, TokioClock>,
> {
    let quota = crate::common::waits_up_to(
        tower_bulwark::Quota::per_second(1).unwrap(),
        Duration::from_secs(10),
    );
    let limiter = tower_bulwark::KeyedRateLimiter::<HeaderValue>::builder(quota)
        .clock(TokioClock::new())
        .build();
    Policy::new("rate", tenant(), limiter).unwrap()
}

/// The guide (`src/guide.rs:205`): "a request refused by one policy, or dropped at any await
/// point (reserving, waiting), gives back every permit the others granted, once";
/// `ConcurrencyLimiter` (`src/rate_limit/concurrent.rs:17-25`): "every slot goes back exactly
/// once, also where a clone of it serves elsewhere: in `Policy::new` (one pool of slots for two
/// policies) ... inside a `Tiers`". One pool of four slots shared by two policies (each request
/// takes one slot of it for each: two), or `Tiers` of two slots, beside a rate policy that
/// waits, in either order. One stream is held; requests that wait for the rate are dropped
/// after 1 to 6 polls; then exactly one more stream fits.
#[tokio::test(start_paused = true)]
async fn requests_dropped_while_waiting_give_pooled_and_tiered_slots_back_once() {
    let ends = Arc::new(Semaphore::new(0));
    let pool = || Policy::new("pool", tenant(), slots(4)).unwrap();
    let shared = || {
        let a = pool();
        let b = Policy::new("again", tenant(), a.limiter().clone()).unwrap();
        (a, b)
    };
    let tiers = || {
        Policy::new(
            "tiers",
            tenant(),
            Tiers::new(|_: &HeaderValue| "t", "t", slots(2)),
        )
        .unwrap()
    };
    let cases: Vec<(&str, Limited)> = vec![
        ("pool, pool, rate", {
            let (a, b) = shared();
            limited(a.and(b).and(waiting()), &ends, plain_answer)
        }),
        ("rate, pool, pool", {
            let (a, b) = shared();
            limited(waiting().and(a).and(b), &ends, plain_answer)
        }),
        (
            "tiers, rate",
            limited(tiers().and(waiting()), &ends, plain_answer),
        ),
        (
            "rate, tiers",
            limited(waiting().and(tiers()), &ends, plain_answer),
        ),
    ];
    let mut broken = Vec::new();
    for (what, service) in cases {
        let held = service.clone().oneshot(request("stream")).await.unwrap();
        assert_eq!(held.status(), StatusCode::OK, "{what}");
        for polls in 1..=6 {
            let mut call = std::pin::pin!(service.clone().oneshot(request("stream")));
            for _ in 0..polls {
                assert!(poll_once(call.as_mut()).is_pending(), "{what}: waits");
                tokio::task::yield_now().await;
            }
        }
        let free = free_slots(&service, &ends).await;
        if free != 1 {
            broken.push(format!(
                "{what}: {free} streams fit beside the held one (one)"
            ));
        }
        ends.add_permits(1);
        held.into_body().collect().await.unwrap();
        tokio::time::advance(Duration::from_secs(20)).await;
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

// ---------------------------------------------------------------------------------------------
// A client quota of slots.

/// A call of the client: `Ok(true)` answers once `gate` lets it, `Ok(false)` fails.
type Client = tower::util::BoxCloneService<bool, Response<()>, BoxError>;

fn client_quota(gate: &Arc<Semaphore>, settle: &str) -> Client {
    let gate = gate.clone();
    let inner = tower::service_fn(move |answer: bool| {
        let gate = gate.clone();
        async move {
            gate.acquire().await.unwrap().forget();
            if answer {
                Ok(Response::new(()))
            } else {
                Err::<_, BoxError>("the dependency failed".into())
            }
        }
    });
    let layer =
        ClientQuotaLayer::new("slots", slots(1)).key(|_: &bool| HeaderValue::from_static("t"));
    match settle {
        "none" => tower::util::BoxCloneService::new(layer.layer(inner)),
        "settle 0" => tower::util::BoxCloneService::new(
            layer.settle_by(|_: &Response<()>| Some(0)).layer(inner),
        ),
        "settle 9" => tower::util::BoxCloneService::new(
            layer.settle_by(|_: &Response<()>| Some(9)).layer(inner),
        ),
        _ => tower::util::BoxCloneService::new(layer.settle_by(SettleLater).layer(inner)),
    }
}

/// How many calls of the client are admitted in a row now (each held at the gate): the calls
/// are dropped before this returns.
fn client_slots(client: &Client) -> usize {
    let mut held = Vec::new();
    loop {
        let mut call = Box::pin(client.clone().oneshot(true));
        match poll_once(call.as_mut()) {
            std::task::Poll::Pending => held.push(call),
            std::task::Poll::Ready(Err(e)) => {
                assert!(e.is::<QuotaExhausted>(), "{e}");
                return held.len();
            }
            std::task::Poll::Ready(Ok(_)) => unreachable!("the gate is shut"),
        }
        assert!(held.len() < 10, "no slot limit at all");
    }
}

/// `ConcurrencyLimiter` (`src/rate_limit/concurrent.rs:17-25`): "inside ... a client quota, its
/// admissions say they hold slots, so the layer gives them back whole when the request ends
/// (... a client quota, the answer's head)"; "every slot goes back exactly once";
/// `Unsettled::settle`: "Only the first settle of a call counts". A client of one slot, plain
/// and with settles to 0 and 9 and `SettleLater` (whose `Unsettled` is then settled to 0 and to
/// 9, twice): a call answered, one failed, one dropped while it waits for its answer, one never
/// polled. After each, exactly one call fits, and while a call waits, none.
#[tokio::test]
async fn a_client_quota_of_slots_gives_each_back_exactly_once() {
    let mut broken = Vec::new();
    for settle in ["none", "settle 0", "settle 9", "later"] {
        let gate = Arc::new(Semaphore::new(0));
        let client = client_quota(&gate, settle);
        for how in ["answered", "failed", "dropped waiting", "never polled"] {
            match how {
                "answered" | "failed" => {
                    let mut call = Box::pin(client.clone().oneshot(how == "answered"));
                    assert!(poll_once(call.as_mut()).is_pending());
                    let during = client_slots(&client);
                    if during != 0 {
                        broken.push(format!("{settle}, {how}: {during} free while it waits"));
                    }
                    gate.add_permits(1);
                    let result = call.await;
                    if let Ok(response) = result {
                        if let Some(unsettled) = response.extensions().get::<Unsettled>() {
                            unsettled.settle(0);
                            unsettled.settle(9);
                            unsettled.settle(0);
                        }
                    }
                }
                "dropped waiting" => {
                    let mut call = Box::pin(client.clone().oneshot(true));
                    assert!(poll_once(call.as_mut()).is_pending());
                }
                _ => drop(client.clone().oneshot(true)),
            }
            let free = client_slots(&client);
            if free != 1 {
                broken.push(format!("{settle}, {how}: {free} slots after it (one)"));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

// ---------------------------------------------------------------------------------------------
// Over a real listener.

/// Free tenants of one stream and pro tenants (`x-tenant: pro...`) of two, as `Tiers` in a
/// `Policy::new` with a `count_if` that never counts, on axum over 127.0.0.1: `/stream` answers
/// `a`, then `b` once `ends` lets it.
async fn serve_tiered_streams(ends: &Arc<Semaphore>) -> String {
    let plan = |key: &HeaderValue| {
        if key.as_bytes().starts_with(b"pro") {
            "pro"
        } else {
            "free"
        }
    };
    let plans = Tiers::new(plan, "free", slots(1)).tier("pro", slots(2));
    let policy = Policy::new("streams", tenant(), plans)
        .unwrap()
        .count_if(|_| false);
    crate::common::held_stream::serve_held_streams(policy, ends).await
}

/// `ConcurrencyLimiter` (`src/rate_limit/concurrent.rs:17-25`), `Policy::concurrent`
/// (`src/rate_limit/concurrent.rs:99-101,113-115`) and the guide (`src/guide.rs:206`: "N tasks
/// racing for L slots get exactly L"), over a real listener with `reqwest`: eight clients of a
/// pro tenant race for its two slots and exactly two stream; a free tenant's client reads the
/// first chunk and goes away: its one slot comes back (once the server notices), exactly one,
/// and while its next stream is open the tenant is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_real_listener_tiered_slots_race_exactly_and_a_disconnect_frees_one() {
    let ends = Arc::new(Semaphore::new(0));
    let url = serve_tiered_streams(&ends).await;
    let http = reqwest::Client::new();
    let get = |tenant: &'static str| http.get(&url).header("x-tenant", tenant).send();
    let racing: Vec<_> = (0..8).map(|_| tokio::spawn(get("pro-1"))).collect();
    let mut streaming = Vec::new();
    for task in racing {
        let response = task.await.unwrap().unwrap();
        if response.status() == StatusCode::OK {
            streaming.push(response);
        } else {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        }
    }
    assert_eq!(streaming.len(), 2, "pro: two slots, eight racing clients");
    let mut gone = get("free-1").await.unwrap();
    assert_eq!(gone.status(), StatusCode::OK);
    assert_eq!(gone.chunk().await.unwrap().unwrap(), "a");
    assert_eq!(
        get("free-1").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS,
        "free: one slot, held by the open stream"
    );
    drop(gone);
    let back = crate::common::first_within_ten_seconds("the free slot never came back", || {
        let sent = get("free-1");
        async move {
            let response = sent.await.ok()?;
            (response.status() == StatusCode::OK).then_some(response)
        }
    })
    .await;
    assert_eq!(
        get("free-1").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the disconnect gave its slot back twice: two free streams at once"
    );
    ends.add_permits(3);
    for response in streaming.into_iter().chain([back]) {
        assert_eq!(response.bytes().await.unwrap(), "ab");
    }
}
