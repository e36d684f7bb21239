//! The layer's one decision path under contention and cancellation: tasks of a multi-threaded
//! runtime racing through clones of the service for one, two and three policies of different
//! keys (the tight one first, in the middle or last, so that the others are vetoed), with
//! `count_if`, and a waiting request whose response future is dropped after every poll. Every
//! count is checked against the real limiters afterwards, permit by permit.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::clock::{ManualClock, TokioClock};
use tower_bulwark::rate_limit::{Policy, RateLimitLayer};
use tower_bulwark::{algorithm::Gcra, KeyedRateLimiter, Quota};

use crate::common::manual_clock_at;
use crate::common::{paused_runtime, poll_once, waits_up_to};
use crate::support::{drain, header_key, keyed, Handler};

type Keyed<C> = KeyedRateLimiter<String, Gcra, C>;

/// The handler: counts the requests that reach it; `x-fail: 1` answers 500.
fn handler(reached: Arc<AtomicUsize>) -> Handler {
    Handler::new(service_fn(move |request: Request<Body>| {
        reached.fetch_add(1, Ordering::SeqCst);
        let fail = request.headers().contains_key("x-fail");
        async move {
            tokio::task::yield_now().await;
            let status = if fail {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::OK
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(Body::empty())
                    .unwrap(),
            )
        }
    }))
}

fn request(task: usize, fail: bool) -> Request<Body> {
    let mut builder = Request::get("/")
        .header("x-tenant", "t")
        .header("x-user", format!("u{}", task % 3))
        .header("x-gate", format!("g{}", task % 2));
    if fail {
        builder = builder.header("x-fail", "1");
    }
    builder.body(Body::empty()).unwrap()
}

/// Runs `tasks` requests at once, each a task of the multi-threaded runtime calling `oneshot`
/// on its own clone of `service`; returns the statuses.
async fn race<S>(service: S, tasks: usize, fail: impl Fn(usize) -> bool) -> Vec<StatusCode>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (service, barrier) = (service.clone(), Arc::clone(&barrier));
            let request = request(task, fail(task));
            tokio::spawn(async move {
                barrier.wait().await;
                service.oneshot(request).await.unwrap().status()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for handle in handles {
        statuses.push(handle.await.unwrap());
    }
    statuses
}

fn frozen(quota: Quota) -> (Keyed<ManualClock>, ManualClock) {
    let clock = manual_clock_at(Duration::from_secs(1_000));
    (keyed(quota, &clock), clock)
}

/// 96 tasks race for a limit of 7 held by one policy (keyed by a tenant shared by all), alone
/// or beside one or two looser policies of other keys (users `u0..u2`, gates `g0..g1`), in
/// every position. Exactly 7 are admitted; every looser policy is charged exactly the 7 that
/// went through, its admissions for the vetoed requests given back exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tasks_get_exactly_the_limit_through_one_two_and_three_policies() {
    const TASKS: usize = 96;
    const LIMIT: u64 = 7;
    const LOOSE: u64 = 50;
    for policies in 1..=3usize {
        for tight in 0..policies {
            for headers in [false, true] {
                let (tenants, _) = frozen(Quota::per_hour(LIMIT as u32).unwrap());
                let (users, _) = frozen(Quota::per_hour(LOOSE as u32).unwrap());
                let (gates, _) = frozen(Quota::per_hour(LOOSE as u32).unwrap());
                let tenant =
                    Policy::new("tenant", header_key("x-tenant"), tenants.clone()).unwrap();
                let user = Policy::new("user", header_key("x-user"), users.clone()).unwrap();
                let gate = Policy::new("gate", header_key("x-gate"), gates.clone()).unwrap();
                // The tight policy at position `tight` of `policies`; the vector decides as a
                // chain of one type.
                let mut chain = vec![user, gate];
                chain.truncate(policies - 1);
                chain.insert(tight, tenant);
                let mut layer = RateLimitLayer::new(chain);
                if !headers {
                    layer = layer.without_admitted_headers();
                }
                let reached = Arc::new(AtomicUsize::new(0));
                let service = layer.layer(handler(reached.clone()));
                let statuses = race(service, TASKS, |_| false).await;
                let case = format!("{policies} policies, tight at {tight}, headers {headers}");
                let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
                assert_eq!(admitted as u64, LIMIT, "{case}: {statuses:?}");
                assert!(
                    statuses
                        .iter()
                        .all(|s| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS),
                    "{case}: {statuses:?}"
                );
                assert_eq!(reached.load(Ordering::SeqCst) as u64, LIMIT, "{case}");
                assert_eq!(drain(&tenants, "t"), 0, "{case}");
                if policies >= 2 {
                    let left: u64 = (0..3).map(|u| drain(&users, &format!("u{u}"))).sum();
                    assert_eq!(left, 3 * LOOSE - LIMIT, "{case}: users");
                }
                if policies == 3 {
                    let left: u64 = (0..2).map(|g| drain(&gates, &format!("g{g}"))).sum();
                    assert_eq!(left, 2 * LOOSE - LIMIT, "{case}: gates");
                }
            }
        }
    }
}

/// `count_if` under a race: only the admitted requests whose response is a 500 stay counted;
/// every other admission is given back exactly once. 80 tasks, one in three failing, for a
/// limit of 10 with a second policy that counts every request: the first policy's limiter
/// ends with exactly `10 - failures admitted` left, the second with exactly `admitted` spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tasks_with_count_if_spend_exactly_the_counted_responses() {
    const TASKS: usize = 80;
    for round in 0..6 {
        let (failures, _) = frozen(Quota::per_hour(10).unwrap());
        let (users, _) = frozen(Quota::per_hour(1_000).unwrap());
        let policies = Policy::new("failures", header_key("x-tenant"), failures.clone())
            .unwrap()
            .count_if(|response| response.status.is_server_error())
            .and(Policy::new("user", header_key("x-user"), users.clone()).unwrap());
        let reached = Arc::new(AtomicUsize::new(0));
        let service = RateLimitLayer::new(policies).layer(handler(reached.clone()));
        let statuses = race(service, TASKS, |task| task % 3 == round % 3).await;
        let failed = statuses
            .iter()
            .filter(|s| **s == StatusCode::INTERNAL_SERVER_ERROR)
            .count() as u64;
        let admitted = statuses
            .iter()
            .filter(|s| **s != StatusCode::TOO_MANY_REQUESTS)
            .count() as u64;
        assert!(failed <= 10, "round {round}: {failed} failures admitted");
        assert_eq!(reached.load(Ordering::SeqCst) as u64, admitted);
        assert_eq!(drain(&failures, "t"), 10 - failed, "round {round}");
        let left: u64 = (0..3).map(|u| drain(&users, &format!("u{u}"))).sum();
        assert_eq!(left, 3_000 - admitted, "round {round}");
    }
}

/// A request that must wait for its permit (`max_wait`) behind other policies, its response
/// future polled `k` times (time moving 30 ms between polls) and then dropped, for every `k`
/// until it completes: each permit comes back exactly once. Dropped before the handler is
/// called, the limiters are as if the request never came (the waiting policy's reservation
/// included); once the handler is called (answered or not), exactly one permit of each is spent.
#[test]
fn a_waiting_request_dropped_after_any_poll_gives_each_permit_back_once() {
    let quota = waits_up_to(Quota::per_second(10).unwrap(), Duration::from_millis(500));
    for waiting_at in 0..3usize {
        let (mut completed_at, mut first_reached) = (None, None);
        for polls in 0..64usize {
            let rt = paused_runtime();
            let outcome = rt.block_on(async {
                let clock = TokioClock::new();
                let waiting: Keyed<TokioClock> =
                    KeyedRateLimiter::builder(quota).clock(clock).build();
                let users: Keyed<TokioClock> =
                    KeyedRateLimiter::builder(Quota::per_hour(50).unwrap())
                        .clock(clock)
                        .build();
                let gates: Keyed<TokioClock> =
                    KeyedRateLimiter::builder(Quota::per_hour(50).unwrap())
                        .clock(clock)
                        .build();
                // The waiting policy's burst is spent: the next request waits 100 ms.
                assert_eq!(drain(&waiting, "t"), 10);
                let mut chain = vec![
                    Policy::new("user", header_key("x-user"), users.clone()).unwrap(),
                    Policy::new("gate", header_key("x-gate"), gates.clone()).unwrap(),
                ];
                chain.insert(
                    waiting_at,
                    Policy::new("tenant", header_key("x-tenant"), waiting.clone()).unwrap(),
                );
                let reached = Arc::new(AtomicUsize::new(0));
                let service = RateLimitLayer::new(chain).layer(handler(reached.clone()));
                let start = tokio::time::Instant::now();
                let mut future = Box::pin(service.oneshot(request(0, false)));
                let mut answered = None;
                for _ in 0..polls {
                    if let Poll::Ready(response) = poll_once(future.as_mut()) {
                        answered = Some(response.unwrap().status());
                        break;
                    }
                    tokio::time::advance(Duration::from_millis(30)).await;
                }
                // Dropped here (or already answered).
                drop(future);
                // A second after the burst was spent the waiting key is whole again unless a
                // permit beyond it stayed spent (the reservation's TAT ends at 1.1 s).
                tokio::time::sleep_until(start + Duration::from_secs(1)).await;
                let left = (
                    drain(&waiting, "t"),
                    drain(&users, "u0"),
                    drain(&gates, "g0"),
                );
                (answered, left, reached.load(Ordering::SeqCst))
            });
            let (answered, left, reached) = outcome;
            let case = format!("waiting policy at {waiting_at}, {polls} polls: {answered:?}");
            if reached == 0 {
                // Dropped before the handler: as if the request never came.
                assert_eq!(answered, None, "{case}");
                assert_eq!(left, (10, 50, 50), "{case}");
            } else {
                // The handler was called (and perhaps answered): one permit of each, once.
                assert_eq!(reached, 1, "{case}");
                assert_eq!(left, (9, 49, 49), "{case}");
                first_reached.get_or_insert(polls);
            }
            if let Some(status) = answered {
                assert_eq!(status, StatusCode::OK, "{case}");
                completed_at.get_or_insert(polls);
            }
        }
        let first_reached = first_reached.expect("the handler was reached");
        assert!(
            first_reached >= 4,
            "it waited 100 ms: {first_reached} polls"
        );
        assert!(
            completed_at.is_some(),
            "the waiting request was never answered"
        );
    }
}
