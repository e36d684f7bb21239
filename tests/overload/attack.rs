//! A blind attack on the overload protection's documented promises: the queue when the limit
//! moves under it or a waiter leaves, latency measured from admission, the body's end, the
//! classes under a flood that comes and goes, hostile priority headers, absurd settings and a
//! reload.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};
use tower_bulwark::bulkhead::adaptive::{Aimd, Limits};
use tower_bulwark::clock::ManualClock;
#[cfg(feature = "config")]
use tower_bulwark::config::Registry;
use tower_bulwark::overload::{Overload, Priority};

use crate::support::{
    alternating, body_of_a_default_request, fixed, gated, held_inside, moving_limit, one_inside,
    queued, request, Svc,
};

const W: Duration = Duration::from_millis(50);

/// An inner service whose heads wait at `gate` and whose bodies stay open until the test drops
/// the sender it receives on `bodies` (one per request, in the order the heads were released).
struct Held {
    gate: Arc<Semaphore>,
    reached: Arc<AtomicUsize>,
    entered: mpsc::UnboundedReceiver<()>,
    bodies: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
}

fn held(overload: &Overload) -> (Svc, Held) {
    let gate = Arc::new(Semaphore::new(0));
    let reached = Arc::new(AtomicUsize::new(0));
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let (bodies_tx, bodies) = mpsc::unbounded_channel();
    let (g, r) = (Arc::clone(&gate), Arc::clone(&reached));
    let inner = tower::service_fn(move |_: http::Request<Body>| {
        let (gate, reached) = (Arc::clone(&g), Arc::clone(&r));
        let (entered_tx, bodies_tx) = (entered_tx.clone(), bodies_tx.clone());
        async move {
            reached.fetch_add(1, Ordering::SeqCst);
            let _ = entered_tx.send(());
            gate.acquire().await.unwrap().forget();
            let (end_tx, end_rx) = oneshot::channel::<()>();
            let _ = bodies_tx.send(end_tx);
            let chunks = futures::stream::once(async { Ok::<_, Infallible>(Bytes::from("a")) })
                .chain(futures::stream::once(end_rx).filter_map(|_| async { None }));
            Ok::<_, Infallible>(http::Response::new(Body::from_stream(chunks)))
        }
    });
    let service = overload
        .layer()
        .layer(inner)
        .map_response(|r| r.map(Body::new));
    let held = Held {
        gate,
        reached,
        entered,
        bodies,
    };
    (BoxCloneService::new(service), held)
}

/// `src/overload/mod.rs:47`-`49`: "with a queue, it waits until its ceiling lets it
/// in". Requests of one class, one at a time at a limit of 1 growing under Aimd: each finds the
/// limit reached, so the limit grows. A waiter queued behind one whose head is ready and whose
/// body still streams must be let in as soon as the limit rises above the one in flight, not
/// left waiting for the body's end or shed at `max_wait`.
#[tokio::test(start_paused = true)]
async fn a_waiter_is_admitted_when_the_limit_rises_above_the_requests_in_flight() {
    let (builder, clock) = moving_limit(fixed(1), (1, 1, 10), Aimd::default());
    let overload = builder.queue(4, Duration::from_secs(60)).unwrap().build();
    let (service, mut held) = held(&overload);
    for round in 0..40 {
        let n = overload.limit();
        let firsts: Vec<_> = (0..n)
            .map(|_| tokio::spawn(service.clone().oneshot(request(Priority::Default))))
            .collect();
        for _ in 0..n {
            held.entered.recv().await.unwrap();
        }
        let reached = held.reached.load(Ordering::SeqCst);
        let waiter = tokio::spawn(service.clone().oneshot(request(Priority::Default)));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(held.reached.load(Ordering::SeqCst), reached, "queued");
        clock.advance(W);
        held.gate.add_permits(n);
        let (mut open, mut ends) = (Vec::new(), Vec::new());
        for first in firsts {
            open.push(first.await.unwrap().unwrap());
            ends.push(held.bodies.recv().await.unwrap());
        }
        if overload.limit() > n {
            // The limit rose with these samples; their bodies still hold n places.
            let admitted = tokio::time::timeout(Duration::from_secs(30), held.entered.recv()).await;
            assert!(
                admitted.is_ok(),
                "limit {}, {} in flight, yet the waiter still waits after 30 s (round {round})",
                overload.limit(),
                overload.in_flight()
            );
            drop((open, ends));
            held.gate.add_permits(1);
            let _ = waiter.await.unwrap().unwrap();
            return;
        }
        drop((open, ends));
        // The waiter answers at once: its sample closes no round, the next wave's does.
        held.entered.recv().await.unwrap();
        held.gate.add_permits(1);
        drop(waiter.await.unwrap().unwrap());
        drop(held.bodies.recv().await.unwrap());
        assert_eq!(overload.in_flight(), 0);
    }
    panic!("the limit never rose: {}", overload.limit());
}

/// `src/overload/builder.rs:175`: "at most `capacity` wait". A waiter whose future was dropped (its
/// client gone) leaves the queue: a queue of one, whose waiter was cancelled, takes the next
/// request instead of shedding it as if it were full; a waiter shed at `max_wait` leaves it too.
#[tokio::test(start_paused = true)]
async fn a_cancelled_or_expired_waiter_frees_its_place_in_the_queue() {
    let (overload, service, gated, _entered, first) =
        one_inside(1, Duration::from_millis(100), Priority::Default).await;
    // Cancelled twice over: dropped after its first poll, and its task aborted.
    drop(queued(&service, Priority::Default));
    let aborted = tokio::spawn(service.clone().oneshot(request(Priority::Default)));
    tokio::task::yield_now().await;
    aborted.abort();
    assert!(aborted.await.unwrap_err().is_cancelled());
    // Expired: shed after max_wait.
    let expired = service.clone().oneshot(request(Priority::Default)).await;
    assert_eq!(expired.unwrap().status(), 503);
    // The queue of one is free: the next one waits, and is served when the first ends.
    let mut next = Box::pin(service.clone().oneshot(request(Priority::Sheddable)));
    assert!(
        (&mut next).now_or_never().is_none(),
        "shed at once: the queue still counts a waiter that left"
    );
    gated.gate.add_permits(2);
    drop(first.await.unwrap().unwrap());
    assert_eq!(next.await.unwrap().status(), 200);
    assert_eq!(overload.in_flight(), 0);
    assert_eq!(gated.reached.load(Ordering::SeqCst), 2);
}

/// `src/overload/mod.rs:58`: each admitted request's sample is "its latency from admission (not
/// from arrival: time in the queue is not the service's)", and `overload/mod.rs:69` the
/// `Retry-After` is "the slow average of the admitted requests' latency". Two requests answered at
/// once, one after 1000 s in the queue (on the latency clock): the wait stays 1 s.
#[tokio::test(start_paused = true)]
async fn time_in_the_queue_is_not_the_services_latency() {
    let clock = ManualClock::new();
    let overload = fixed(1)
        .clock(clock.clone())
        .queue(2, Duration::from_secs(60))
        .unwrap()
        .build();
    let (service, mut held) = held(&overload);
    held.gate.add_permits(2);
    let first = service.clone().oneshot(request(Priority::Default)).await;
    let first_end = held.bodies.recv().await.unwrap();
    let queued = tokio::spawn(service.clone().oneshot(request(Priority::Default)));
    tokio::task::yield_now().await;
    clock.advance(Duration::from_secs(1000));
    drop((first, first_end));
    let queued = queued.await.unwrap().unwrap();
    assert_eq!(queued.status(), 200);
    let _queued_end = held.bodies.recv().await.unwrap();
    let shed = service.oneshot(request(Priority::Critical)).await.unwrap();
    assert_eq!(shed.status(), 503);
    assert_eq!(
        shed.headers()["retry-after"],
        "1",
        "the queue's 1000 s counted"
    );
}

/// `src/overload/mod.rs:51`: "A request holds its permit until its response body ends, fails or is
/// dropped". A body read to its end, or one whose stream failed, gives its place back then, while
/// the caller still holds the body.
#[tokio::test]
async fn a_body_that_ended_or_failed_gives_its_place_back_before_it_is_dropped() {
    let overload = fixed(1).build();
    let (_, inner) = alternating(|failing, _| async move {
        let last: Result<Bytes, std::io::Error> = if failing {
            Err(std::io::Error::other("cut"))
        } else {
            Ok(Bytes::from("b"))
        };
        let chunks = futures::stream::iter([Ok(Bytes::from("a")), last]);
        Ok::<_, Infallible>(http::Response::new(Body::from_stream(chunks)))
    });
    let service = overload.layer().layer(inner);
    for failing in [false, true] {
        let mut body = body_of_a_default_request(&service).await;
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                assert!(failing);
                break;
            }
        }
        assert_eq!(
            overload.in_flight(),
            0,
            "a body that {} still holds its place",
            if failing { "failed" } else { "ended" }
        );
        drop(body);
    }
}

/// `src/overload/mod.rs:71`: "A gRPC call (feature `grpc`) gets `UNAVAILABLE` instead, with the
/// same wait", and `guide.rs:293`: "a queued one after at most `max_wait`". A gRPC call shed from
/// the queue, at `max_wait` or pushed out by a higher class, is answered as gRPC too.
#[cfg(feature = "grpc")]
#[tokio::test(start_paused = true)]
async fn a_grpc_call_shed_from_the_queue_gets_unavailable() {
    let (_overload, service, _gated, _entered, _first) =
        one_inside(1, Duration::from_millis(100), Priority::Critical).await;
    let grpc = || {
        http::Request::post("/pkg.Svc/Method")
            .header("content-type", "application/grpc")
            .header("x-priority", "sheddable")
            .body(Body::empty())
            .unwrap()
    };
    let expired = service.clone().oneshot(grpc()).await.unwrap();
    let pushed = tokio::spawn(service.clone().oneshot(grpc()));
    tokio::task::yield_now().await;
    let _critical = tokio::spawn(service.clone().oneshot(request(Priority::Critical)));
    let pushed = pushed.await.unwrap().unwrap();
    for (how, response) in [("at max_wait", expired), ("pushed out", pushed)] {
        assert_eq!(response.status(), 200, "{how}: trailers-only");
        assert_eq!(response.headers()["grpc-status"], "14", "{how}");
        assert_eq!(
            response.headers()["grpc-retry-pushback-ms"],
            "1000",
            "{how}"
        );
    }
}

/// The class a protection whose limit is fixed at 10 (guarantees 0.3 and 0.1, no borrowing:
/// ceilings 10, 7, 6) gives requests made by `make`: shed with 6 in flight is `Sheddable`,
/// admitted with 6 and shed with 7 is `Default`, admitted with 7 is `Critical`.
async fn class_of(overload: &Overload, make: impl Fn() -> http::Request<Body>) -> Priority {
    assert_eq!(
        [Priority::Critical, Priority::Default, Priority::Sheddable].map(|c| overload.ceiling(c)),
        [10, 7, 6]
    );
    let (service, gated, _entered) = gated(overload);
    let plain = || http::Request::get("/work").body(Body::empty()).unwrap();
    let mut calls: Vec<_> = (0..6)
        .map(|_| tokio::spawn(service.clone().oneshot(plain())))
        .collect();
    let mut class = Priority::Sheddable;
    for reached in 6..8 {
        while gated.reached.load(Ordering::SeqCst) < reached {
            tokio::task::yield_now().await;
        }
        let call = tokio::spawn(service.clone().oneshot(make()));
        while !call.is_finished() && gated.reached.load(Ordering::SeqCst) == reached {
            tokio::task::yield_now().await;
        }
        if call.is_finished() {
            assert_eq!(call.await.unwrap().unwrap().status(), 503);
            break;
        }
        calls.push(call);
        class = if reached == 6 {
            Priority::Default
        } else {
            Priority::Critical
        };
    }
    gated.gate.add_permits(calls.len());
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(overload.in_flight(), 0);
    class
}

fn with_priority(value: &'static [u8]) -> impl Fn() -> http::Request<Body> {
    move || {
        http::Request::get("/work")
            .header("x-priority", http::HeaderValue::from_bytes(value).unwrap())
            .body(Body::empty())
            .unwrap()
    }
}

/// `src/config/mod.rs:150`: `priority_header = "x-priority"  # critical | default | sheddable;
/// absent or other: default`. Hostile values (bytes that are not UTF-8, a megabyte-long one, a
/// list, look-alike letters) are `Default`, never a panic, never a higher class.
#[cfg(feature = "config")]
#[tokio::test]
async fn hostile_priority_headers_from_the_config_file_are_default() {
    let registry = Registry::from_toml_str(
        "[overload.api]\nmin_limit = 10\ninitial_limit = 10\nmax_limit = 10\n\
         critical_borrowing = 1\n",
    )
    .unwrap();
    let overload = registry.overload("api").unwrap();
    let long: &'static [u8] = "critical".repeat(1 << 17).leak().as_bytes();
    let cases: [(&'static [u8], Priority); 9] = [
        (b"CRITICAL", Priority::Critical),
        (b"sheddable", Priority::Sheddable),
        (b"\xffcritical", Priority::Default),
        (b"critical\xff", Priority::Default),
        (long, Priority::Default),
        (b"critical, critical", Priority::Default),
        (b"cr\xc4\xb1tical", Priority::Default),
        (b"critical;q=1", Priority::Default),
        (b"", Priority::Default),
    ];
    for (value, expected) in cases {
        let shown = String::from_utf8_lossy(&value[..value.len().min(24)]).into_owned();
        assert_eq!(
            class_of(overload, with_priority(value)).await,
            expected,
            "{shown:?}"
        );
    }
}

/// `src/overload/builder.rs:133`: "How a request's class is found (default: every request is
/// `Priority::Default`)": with no `priority_by`, a client's `x-priority: critical` takes no
/// critical place, and `sheddable` is not shed first either.
#[tokio::test]
async fn by_default_a_client_cannot_choose_its_class() {
    let overload = Overload::builder("api")
        .limits(Limits::new(10, 10, 10).unwrap())
        .critical_borrowing(1.0)
        .unwrap()
        .clock(ManualClock::new())
        .build();
    for value in [&b"critical"[..], b"sheddable"] {
        let class = class_of(&overload, with_priority(value)).await;
        assert_eq!(class, Priority::Default, "{value:?}");
    }
}

/// `src/overload/mod.rs:39`-`45` and `overload/mod.rs:102`-`108`: the ceilings at the defaults: the
/// limit times 3 for `Critical`, the limit less 0.3 of it for `Default` and less 0.4 for
/// `Sheddable`, rounded to the nearest whole request.
#[test]
fn the_default_ceilings_are_the_documented_shares_of_the_limit() {
    for (limit, ceilings) in [
        (16, [48, 11, 10]),
        (8, [24, 6, 5]),
        (10, [30, 7, 6]),
        (1000, [3000, 700, 600]),
    ] {
        let overload = Overload::builder("api")
            .limits(Limits::new(limit, limit, limit).unwrap())
            .build();
        let got = [Priority::Critical, Priority::Default, Priority::Sheddable]
            .map(|c| overload.ceiling(c));
        assert_eq!(got, ceilings, "limit {limit}");
    }
    assert_eq!(Overload::builder("api").build().limit(), 16);
}

/// `src/config/mod.rs:36`: "Unknown fields, zero limits and values out of range are errors that
/// name the instance and the field", with the ranges of `config/mod.rs:155`-`166`. Absurd
/// `[overload.NAME]` values (TOML's `nan` and `inf` among them) are refused at their field,
/// never a panic.
#[cfg(feature = "config")]
#[test]
fn absurd_overload_settings_in_the_file_are_refused_at_their_field() {
    let cases: [(&str, &[&str]); 22] = [
        ("critical_guarantee = nan", &["critical_guarantee"]),
        ("critical_guarantee = inf", &["critical_guarantee"]),
        ("critical_guarantee = -0.1", &["critical_guarantee"]),
        ("critical_guarantee = 1.0", &["critical_guarantee"]),
        ("default_guarantee = -inf", &["default_guarantee"]),
        ("default_guarantee = nan", &["default_guarantee"]),
        (
            "critical_guarantee = 0.7\ndefault_guarantee = 0.3",
            &["critical_guarantee", "default_guarantee"],
        ),
        ("critical_borrowing = nan", &["critical_borrowing"]),
        ("critical_borrowing = inf", &["critical_borrowing"]),
        ("critical_borrowing = 0.5", &["critical_borrowing"]),
        ("critical_borrowing = 1e9", &["critical_borrowing"]),
        ("queue_capacity = 1\nmax_wait = \"8760h\"", &["max_wait"]),
        ("queue_capacity = 0\nmax_wait = \"1s\"", &["queue_capacity"]),
        ("queue_capacity = 4", &["queue_capacity", "max_wait"]),
        ("max_wait = \"1s\"", &["queue_capacity", "max_wait"]),
        ("min_limit = 0", &["min_limit"]),
        ("max_limit = 2147483648", &["max_limit"]),
        (
            "initial_limit = 4\nmin_limit = 8",
            &["initial_limit", "min_limit"],
        ),
        ("probe_every = 0", &["probe_every"]),
        ("priority_header = \"not a header\"", &["priority_header"]),
        ("priority_header = \"\"", &["priority_header"]),
        ("critical_guarantee = \"0.3\"", &["critical_guarantee"]),
    ];
    let mut wrong = Vec::new();
    for (fields, at) in cases {
        let text = format!("[overload.api]\n{fields}\n");
        let outcome = std::panic::catch_unwind(|| Registry::from_toml_str(&text).map(|_| ()));
        match outcome {
            Err(_) => wrong.push(format!("{fields:?}: panicked")),
            Ok(Ok(())) => wrong.push(format!("{fields:?}: accepted")),
            Ok(Err(e)) if !at.iter().any(|f| e.path() == format!("overload.api.{f}")) => {
                wrong.push(format!("{fields:?}: at {:?}: {}", e.path(), e.message()))
            }
            Ok(Err(_)) => {}
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The two written are summed alone, whatever the builder's defaults: 0.95 and 0 stay below
    // 1 (the default guarantee of 0.1, still in place while the first was set, refused it).
    let text = "[overload.api]\ncritical_guarantee = 0.95\ndefault_guarantee = 0.0\n\
                min_limit = 20\ninitial_limit = 20\nmax_limit = 20\n";
    let registry = Registry::from_toml_str(text).expect("0.95 and 0 are below 1 together");
    let overload = registry.overload("api").unwrap();
    let ceilings =
        [Priority::Critical, Priority::Default, Priority::Sheddable].map(|c| overload.ceiling(c));
    assert_eq!(ceilings, [60, 1, 1], "19 of 20 kept for critical");
}

/// `src/config/mod.rs:210`-`214`: "a change that cannot apply in place (any setting ... of an
/// overload protection, whose limits move by themselves ...) ... is refused and changes
/// nothing".
#[cfg(feature = "config")]
#[test]
fn a_reload_that_changes_an_overload_protection_is_refused_and_changes_nothing() {
    let text = "[overload.api]\nmin_limit = 10\ninitial_limit = 10\nmax_limit = 10\n";
    let registry = Registry::from_toml_str(text).unwrap();
    assert!(registry.reload_toml_str(text).is_ok(), "no change");
    for change in [
        "critical_guarantee = 0.5",
        "critical_borrowing = 1",
        "priority_header = \"x-class\"",
        "queue_capacity = 2\nmax_wait = \"1s\"",
        "probe_every = 7",
    ] {
        let err = registry
            .reload_toml_str(&format!("{text}{change}\n"))
            .unwrap_err();
        assert!(err.path().starts_with("overload.api"), "{change}: {err}");
    }
    assert!(registry.reload_toml_str("").is_err(), "an instance removed");
    let overload = registry.overload("api").unwrap();
    let ceilings =
        [Priority::Critical, Priority::Default, Priority::Sheddable].map(|c| overload.ceiling(c));
    assert_eq!(ceilings, [30, 7, 6]);
}

/// `src/overload/builder.rs:142`-`144`: "`share` is at least 0 and the guarantees together stay
/// below 1"; `src/overload/builder.rs:158`-`160`: borrowing "At least 1 and at most 100";
/// `builder.rs:177`: "`max_wait` at most a minute". A guarantee set again replaces the first,
/// whichever class is set first the sum is checked, and absurd values are errors naming the
/// setting, never a panic.
#[test]
fn builder_settings_replace_each_other_and_absurd_ones_are_refused() {
    let replaced = fixed(10)
        .guarantee(Priority::Critical, 0.6)
        .unwrap()
        .guarantee(Priority::Critical, 0.2)
        .unwrap()
        .guarantee(Priority::Default, 0.7);
    let overload = replaced.expect("0.2 + 0.7 is below 1").build();
    assert_eq!(overload.ceiling(Priority::Default), 8);
    assert_eq!(overload.ceiling(Priority::Sheddable), 1);
    let reversed = fixed(10)
        .guarantee(Priority::Default, 0.9)
        .unwrap()
        .guarantee(Priority::Critical, 0.2);
    assert_eq!(reversed.unwrap_err().setting(), "guarantee");
    for share in [f64::INFINITY, f64::NEG_INFINITY, 1.0 + f64::EPSILON, 1e300] {
        let err = fixed(10).guarantee(Priority::Default, share).unwrap_err();
        assert_eq!(err.setting(), "guarantee", "{share}");
    }
    assert!(fixed(10).guarantee(Priority::Critical, -0.0).is_ok());
    for factor in [1e9, f64::NEG_INFINITY, 0.0, -1.0, f64::MIN_POSITIVE] {
        let err = fixed(10).critical_borrowing(factor).unwrap_err();
        assert_eq!(err.setting(), "critical_borrowing", "{factor}");
    }
    let year = Duration::from_secs(365 * 24 * 3600);
    for wait in [year, Duration::MAX, Duration::from_nanos(60_000_000_001)] {
        let err = fixed(10).queue(8, wait).unwrap_err();
        assert_eq!(err.setting(), "max_wait", "{wait:?}");
    }
    let borrowing_most = fixed(1)
        .limits(Limits::new(1, i32::MAX as usize, i32::MAX as usize).unwrap())
        .critical_borrowing(100.0)
        .unwrap()
        .build();
    assert_eq!(
        borrowing_most.ceiling(Priority::Critical),
        100 * i32::MAX as usize
    );
}

/// `src/overload/mod.rs:62`-`64`: "A sample 'found the limit reached' when it took the last place
/// under its class's ceiling ... so the lower classes' flood ... is what lets a delay-based limit
/// grow". Waves of sheddable requests only, each filling the sheddable ceiling, every one answered
/// after W: under Aimd (which grows while the limit is reached) the limit must grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_the_lowest_class_alone_lets_the_limit_grow() {
    let (builder, clock) = moving_limit(Overload::builder("api"), (4, 10, 100), Aimd::default());
    let overload = builder.priority_by(|_| Priority::Sheddable).build();
    let limits = waves_of(&overload, Priority::Sheddable, &clock).await;
    assert!(limits[29] > 10, "the limit never grew: {limits:?}");
}

/// `src/overload/mod.rs:43`-`44`: a ceiling is "at least one, so that no class is shed for
/// good". Guarantees of 0.95 for `Critical` and none for `Default` keep all 8 places of the
/// minimum limit above `Default` once rounded; `Default` still finds one, so its traffic alone
/// still gives samples and the limit still grows. It found none, and was shed for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_whose_guarantees_above_round_to_the_whole_limit_still_finds_one_place() {
    let builder = Overload::builder("api").guarantee(Priority::Default, 0.0);
    let builder = builder
        .unwrap()
        .guarantee(Priority::Critical, 0.95)
        .unwrap();
    let (builder, clock) = moving_limit(builder, (8, 8, 100), Aimd::default());
    let overload = builder.priority_by(|_| Priority::Default).build();
    assert_eq!(overload.ceiling(Priority::Default), 1);
    assert_eq!(overload.ceiling(Priority::Sheddable), 1);
    let limits = waves_of(&overload, Priority::Default, &clock).await;
    assert!(limits[29] > 8, "the limit never grew: {limits:?}");
}

/// Thirty waves of `class` alone on `overload`, each filling the class's ceiling and two more,
/// every admitted one answered after W; returns the limit after each.
async fn waves_of(overload: &Overload, class: Priority, clock: &ManualClock) -> Vec<usize> {
    let (service, gated, mut entered) = gated(overload);
    let mut limits = Vec::new();
    for _ in 0..30 {
        let n = overload.ceiling(class);
        let calls: Vec<_> = (0..n + 2)
            .map(|_| tokio::spawn(service.clone().oneshot(request(class))))
            .collect();
        for _ in 0..n {
            entered.recv().await.unwrap();
        }
        // The two beyond the ceiling are shed before any sample can move it.
        while calls.iter().filter(|c| c.is_finished()).count() < 2 {
            tokio::task::yield_now().await;
        }
        clock.advance(W);
        gated.gate.add_permits(n);
        let mut shed = 0;
        for call in calls {
            shed += usize::from(call.await.unwrap().unwrap().status() == 503);
        }
        assert_eq!(shed, 2, "the ceiling {n} admits exactly {n}");
        limits.push(overload.limit());
    }
    limits
}

/// `src/overload/mod.rs:69`-`71`: "The wait is the slow average of the admitted requests' latency
/// (each sample moves it a sixteenth of the way), in whole seconds rounded up, at least one." After
/// a sample of 2.5 s (`Retry-After: 3`, `answers.rs`), samples of no latency bring it down by 15/16
/// each: 2.06 s after 3 (3), 1.93 s after 4 (2), 1.01 s after 14 (2), 0.95 s after 15 (1). A sample
/// of 200 years later gives a finite wait, no panic.
#[tokio::test]
async fn retry_after_moves_a_sixteenth_of_the_way_per_sample() {
    let clock = ManualClock::new();
    let overload = fixed(1).clock(clock.clone()).build();
    let (service, gated, mut entered) = gated(&overload);
    sample(
        &service,
        &gated,
        &mut entered,
        &clock,
        Duration::from_millis(2_500),
    )
    .await;
    // Each reading gives one sample of no latency (the request it holds).
    let mut waits = Vec::new();
    for _ in 0..16 {
        waits.push(retry_after(&service, &gated, &mut entered).await);
    }
    // The first reading follows 1 sample (2.5 s), the k-th follows k - 1 samples of 0.
    assert_eq!(
        (waits[0], waits[3], waits[4], waits[14], waits[15]),
        (3, 3, 2, 2, 1),
        "{waits:?}"
    );
    let centuries = Duration::from_secs(200 * 365 * 24 * 3600);
    sample(&service, &gated, &mut entered, &clock, centuries).await;
    let wait = retry_after(&service, &gated, &mut entered).await;
    assert!(wait >= 1, "{wait}");
}

/// One request answered after `latency` on the latency clock.
async fn sample(
    service: &Svc,
    gated: &crate::support::Gated,
    entered: &mut mpsc::UnboundedReceiver<Priority>,
    clock: &ManualClock,
    latency: Duration,
) {
    let call = held_inside(service, entered, Priority::Critical).await;
    clock.advance(latency);
    gated.gate.add_permits(1);
    drop(call.await.unwrap().unwrap());
}

/// The `Retry-After` of a request shed while one (answered at once after) holds the limit of 1.
async fn retry_after(
    service: &Svc,
    gated: &crate::support::Gated,
    entered: &mut mpsc::UnboundedReceiver<Priority>,
) -> u64 {
    let held = held_inside(service, entered, Priority::Critical).await;
    let shed = service.clone().oneshot(request(Priority::Critical)).await;
    let shed = shed.unwrap();
    assert_eq!(shed.status(), 503);
    let wait = shed.headers()["retry-after"].to_str().unwrap().to_owned();
    gated.gate.add_permits(1);
    drop(held.await.unwrap().unwrap());
    wait.parse().unwrap()
}

/// How the request ahead of a waiter ends, in `every_way_a_request_ends_lets_the_next_waiter_in`.
#[derive(Clone, Copy, Debug)]
enum End {
    Error,
    Panic,
    Aborted,
    DroppedBeforeFirstPoll,
    GrantedWaiterDropped,
    TimedOutWaiterAhead,
}

/// `src/overload/mod.rs:48`-`54`: a queued request "waits until its ceiling lets it in", and "The
/// permit is given back exactly once whatever ends the request: ... an error of the inner service,
/// a panic, or the response future dropped at any await (in the queue, or while the inner service
/// runs)"; `cancellation.rs` checks the count comes back, not that the place given back goes to the
/// next waiter. For each way the request ahead ends, the waiter behind it must be let in at once,
/// not left to `max_wait`.
#[tokio::test(start_paused = true)]
async fn every_way_a_request_ends_lets_the_next_waiter_in() {
    for end in [
        End::Error,
        End::Panic,
        End::Aborted,
        End::DroppedBeforeFirstPoll,
        End::GrantedWaiterDropped,
        End::TimedOutWaiterAhead,
    ] {
        let overload = fixed(1).queue(4, Duration::from_secs(60)).unwrap().build();
        let gate = Arc::new(Semaphore::new(0));
        let reached = Arc::new(AtomicUsize::new(0));
        let (g, r) = (Arc::clone(&gate), Arc::clone(&reached));
        let inner = tower::service_fn(move |request: http::Request<Body>| {
            let (gate, reached) = (Arc::clone(&g), Arc::clone(&r));
            async move {
                reached.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                match request.headers().get("x-end").map(|v| v.as_bytes()) {
                    Some(b"error") => Err("broken".into()),
                    Some(b"panic") => panic!("the handler panicked"),
                    _ => Ok::<_, tower::BoxError>(http::Response::new(Body::from("done"))),
                }
            }
        });
        let service = overload.layer().layer(inner);
        let ahead = |how: &'static str| {
            let mut request = request(Priority::Default);
            request.headers_mut().insert("x-end", how.parse().unwrap());
            request
        };
        let settle = || async {
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
        };
        // The request ahead, and what ends it once a waiter is queued behind.
        let mut first = None;
        let mut unpolled = None;
        if let End::DroppedBeforeFirstPoll = end {
            let mut svc = service.clone();
            unpolled = Some(tower::Service::call(
                svc.ready().await.unwrap(),
                ahead("ok"),
            ));
        } else {
            let how = match end {
                End::Error => "error",
                End::Panic => "panic",
                _ => "ok",
            };
            first = Some(tokio::spawn(service.clone().oneshot(ahead(how))));
            settle().await;
        }
        assert_eq!(overload.in_flight(), 1, "{end:?}");
        let mut granted = Box::pin(service.clone().oneshot(request(Priority::Default)));
        let mut timed_out = None;
        match end {
            End::GrantedWaiterDropped => assert!((&mut granted).now_or_never().is_none()),
            End::TimedOutWaiterAhead => {
                let call = service.clone().oneshot(request(Priority::Critical));
                let call = tokio::time::timeout(Duration::from_secs(1), call);
                timed_out = Some(tokio::spawn(call));
            }
            _ => {}
        }
        settle().await;
        let waiter = tokio::spawn(service.clone().oneshot(request(Priority::Default)));
        settle().await;
        let before = reached.load(Ordering::SeqCst);
        match end {
            End::Error | End::Panic | End::TimedOutWaiterAhead => {
                if let Some(timed_out) = timed_out {
                    assert!(timed_out.await.unwrap().is_err(), "gave up after 1 s");
                }
                gate.add_permits(1);
                let _ = first.take().unwrap().await;
            }
            End::Aborted => first.as_ref().unwrap().abort(),
            End::DroppedBeforeFirstPoll => drop(unpolled.take()),
            End::GrantedWaiterDropped => {
                gate.add_permits(1);
                drop(first.take().unwrap().await.unwrap().unwrap());
                assert_eq!(reached.load(Ordering::SeqCst), before, "granted, not woken");
                drop(granted);
            }
        }
        let let_in = tokio::time::timeout(Duration::from_secs(30), async {
            while reached.load(Ordering::SeqCst) == before {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(
            let_in.is_ok(),
            "{end:?}: the waiter still waits after 30 s, {} in flight",
            overload.in_flight()
        );
        gate.add_permits(8);
        assert_eq!(waiter.await.unwrap().unwrap().status(), 200, "{end:?}");
        assert_eq!(overload.in_flight(), 0, "{end:?}");
    }
}

/// Peaks of requests running in the inner service, by class, updated as they enter and leave.
#[derive(Default)]
struct Peaks {
    now: [AtomicUsize; 3],
    peak: [AtomicUsize; 3],
}

impl Peaks {
    /// Enters `class`; counts it in every group it belongs to: all, lower (default and
    /// sheddable), sheddable.
    fn enter(&self, class: Priority) -> [bool; 3] {
        let groups = [
            true,
            class != Priority::Critical,
            class == Priority::Sheddable,
        ];
        for (i, _) in groups.iter().enumerate().filter(|(_, &g)| g) {
            let now = self.now[i].fetch_add(1, Ordering::SeqCst) + 1;
            self.peak[i].fetch_max(now, Ordering::SeqCst);
        }
        groups
    }

    fn leave(&self, groups: [bool; 3]) {
        for (i, _) in groups.iter().enumerate().filter(|(_, &g)| g) {
            self.now[i].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Leaves its groups when dropped.
struct Left(Arc<Peaks>, [bool; 3]);

impl Drop for Left {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}

/// `guide.rs:283`-`290` and `overload/mod.rs:39`-`49`: "A request of a class is admitted only while
/// the requests in flight, all classes together and it excluded, are below its class's ceiling",
/// through the queue too ("it waits until its ceiling lets it in"), and `guide.rs:303`-`306`:
/// whatever ends a request, "the requests in flight come back to zero". 60 tasks on 4 threads send
/// 20 requests each of random classes through a limit of 10 (guarantees 0.2 and 0.3: ceilings 25
/// with borrowing 2.5, 8, 5) and a queue of 6, some cancelled at random awaits, bodies read or
/// dropped: the requests running never pass a ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_ceiling_is_ever_passed_while_a_flood_comes_and_goes_through_the_queue() {
    let overload = fixed(10)
        .guarantee(Priority::Critical, 0.2)
        .unwrap()
        .guarantee(Priority::Default, 0.3)
        .unwrap()
        .critical_borrowing(2.5)
        .unwrap()
        .queue(6, Duration::from_millis(20))
        .unwrap()
        .build();
    let ceilings =
        [Priority::Critical, Priority::Default, Priority::Sheddable].map(|c| overload.ceiling(c));
    assert_eq!(ceilings, [25, 8, 5]);
    let peaks = Arc::new(Peaks::default());
    let seen = Arc::clone(&peaks);
    let inner = tower::service_fn(move |request: http::Request<Body>| {
        let peaks = Arc::clone(&seen);
        async move {
            let value = request.headers()["x-priority"].to_str().unwrap();
            let groups = peaks.enter(Priority::from_header_value(value));
            // Left even when the request is cancelled while it runs here.
            let _left = Left(Arc::clone(&peaks), groups);
            let spins = request.uri().query().map_or(0, |q| q.len() % 6);
            for _ in 0..spins {
                tokio::task::yield_now().await;
            }
            let chunks = ["a", "b"].map(|c| Ok::<_, Infallible>(Bytes::from(c)));
            Ok::<_, Infallible>(http::Response::new(Body::from_stream(
                futures::stream::iter(chunks),
            )))
        }
    });
    let service = overload.layer().layer(inner);
    let (admitted, shed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tasks: Vec<_> = (0..60u64)
        .map(|seed| {
            let service = service.clone();
            let (admitted, shed) = (Arc::clone(&admitted), Arc::clone(&shed));
            tokio::spawn(async move {
                let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move |n: u64| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % n) as usize
                };
                for _ in 0..20 {
                    let class = match next(6) {
                        0 => Priority::Critical,
                        1 | 2 => Priority::Default,
                        _ => Priority::Sheddable,
                    };
                    let mut request = request(class);
                    let query = format!("/work?{}", "s".repeat(next(6)));
                    *request.uri_mut() = query.parse().unwrap();
                    let call = service.clone().oneshot(request);
                    let patience = next(12);
                    let read_body = next(2) == 0;
                    let cancel = async {
                        for _ in 0..patience {
                            tokio::task::yield_now().await;
                        }
                    };
                    tokio::select! {
                        response = call => {
                            let response = response.unwrap();
                            let counter = if response.status() == 503 { &shed } else { &admitted };
                            counter.fetch_add(1, Ordering::SeqCst);
                            let mut body = response.into_body();
                            if read_body {
                                while body.frame().await.is_some() {}
                            }
                        }
                        () = cancel, if patience > 3 => {}
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let got = [0, 1, 2].map(|i| peaks.peak[i].load(Ordering::SeqCst));
    assert!(
        got[0] <= 25 && got[1] <= 8 && got[2] <= 5,
        "peaks (all, lower, sheddable) {got:?} against ceilings 25, 8, 5"
    );
    assert!(admitted.load(Ordering::SeqCst) > 0 && shed.load(Ordering::SeqCst) > 0);
    assert_eq!(overload.in_flight(), 0);
}
