//! Attacks on client quotas: a cost above capacity, clones readied and never called, races for
//! the permits, refusals found through tower's wrappers, and waiters dropped half-way. Time is
//! tokio's paused timer; no test sleeps to pass.

use crate::common::direct_on;
use crate::common::{in_bursts_of, tokio_direct, waits_up_to};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_bulwark::outbound::{self, ClientQuotaLayer, QuotaExhausted};
use tower_bulwark::{
    clock::ManualClock, limiter::InsufficientCapacity, BoxError, DirectRateLimiter, Quota,
};

use super::hostile_support::*;

// ---------------------------------------------------------------------------------------------
// Client quotas.

/// A cost above what the quota can ever grant is an error at once, not a wait; nothing reaches
/// the dependency, and it carries no retry time (waiting would not help).
#[tokio::test(start_paused = true)]
async fn a_cost_above_capacity_fails_at_once_without_a_retry_time() {
    let quota = waits_up_to(
        in_bursts_of(Quota::per_second(1).unwrap(), 3),
        Duration::from_secs(3600),
    );
    let limiter = tokio_direct(quota);
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter)
        .cost(4)
        .layer(echo(calls.clone()));
    let started = tokio::time::Instant::now();
    let err = client.oneshot(1).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(err.is::<InsufficientCapacity>(), "{err}");
    assert_eq!(outbound::retry_after(&*err), None);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Permits are taken in `call`: a clone readied and never called holds none; a refusal spends
/// nothing; the refusal's time is the next permit's.
#[tokio::test]
async fn a_readied_clone_never_called_holds_nothing() {
    let clock = ManualClock::new();
    let limiter = direct_on(Quota::per_second(1).unwrap(), &clock);
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter).layer(echo(calls.clone()));
    for _ in 0..10 {
        let mut readied = client.clone();
        readied.ready().await.unwrap();
        drop(readied);
    }
    assert_eq!(client.clone().oneshot(1).await.unwrap(), 1);
    for _ in 0..3 {
        let err = client.clone().oneshot(2).await.unwrap_err();
        assert!(err.is::<QuotaExhausted>());
        assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(1)));
    }
    clock.advance(Duration::from_secs(1));
    assert_eq!(client.clone().oneshot(3).await.unwrap(), 3);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// N tasks on two threads racing for L permits: exactly L go, the rest are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_get_exactly_the_permits() {
    let clock = ManualClock::new();
    let limiter = DirectRateLimiter::builder(Quota::per_hour(1).unwrap().with_burst(37).unwrap())
        .clock(clock)
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter).layer(echo(calls.clone()));
    let tasks: Vec<_> = (0..200)
        .map(|n| tokio::spawn(client.clone().oneshot(n)))
        .collect();
    let mut ok = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => ok += 1,
            Err(err) => assert!(err.is::<QuotaExhausted>()),
        }
    }
    assert_eq!(ok, 37);
    assert_eq!(calls.load(Ordering::SeqCst), 37);
}

/// A wrapper error like tower's `buffer::error::ServiceError`: the refusal behind an `Arc`.
#[derive(Debug)]
struct Wrapped(Arc<BoxError>);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wrapped: {}", self.0)
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&**self.0)
    }
}

/// `retry_after` finds a refusal through tower's timeout and through a `source()` chain two
/// wrappers deep; a timeout of its own is not a refusal.
#[tokio::test(start_paused = true)]
async fn retry_after_through_tower_wrappers_and_source_chains() {
    let limiter = tokio_direct(Quota::per_second(2).unwrap().with_burst(1).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .layer(ClientQuotaLayer::new("partner", limiter))
        .service(echo(calls.clone()));
    client.clone().oneshot(1).await.unwrap();
    let err = client.clone().oneshot(2).await.unwrap_err();
    assert_eq!(
        outbound::retry_after(&*err),
        Some(Duration::from_millis(500))
    );
    let wrapped = Wrapped(Arc::new(Box::new(Wrapped(Arc::new(err)))));
    assert_eq!(
        outbound::retry_after(&wrapped),
        Some(Duration::from_millis(500))
    );

    let slow = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .service(service_fn(|()| {
            std::future::pending::<Result<(), BoxError>>()
        }));
    let err = slow.oneshot(()).await.unwrap_err();
    assert_eq!(outbound::retry_after(&*err), None);
}

/// A waiter dropped at its first poll, and one dropped after its timer was polled, each give
/// their reservation back exactly once: the permits after them are as if they never came.
#[tokio::test(start_paused = true)]
async fn dropped_waiters_give_back_exactly_once() {
    let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(10));
    let limiter = tokio_direct(quota);
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("partner", limiter).layer(echo(calls.clone()));
    client.clone().oneshot(0).await.unwrap();
    // Made but never polled: the permits are reserved in `call`.
    let unpolled = client.clone().oneshot(1);
    drop(unpolled);
    for _ in 0..5 {
        let mut waiting = Box::pin(client.clone().oneshot(2));
        assert!(futures::poll!(&mut waiting).is_pending());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(futures::poll!(&mut waiting).is_pending());
        drop(waiting);
    }
    // 500 ms have passed: the next permit is 500 ms away, as if no waiter had come; one more
    // second for the call after it, not less (nothing was given back twice).
    let start = tokio::time::Instant::now();
    client.clone().oneshot(3).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    client.clone().oneshot(4).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
