//! Response futures given up at any point: dropped after every poll in turn, timed out while a
//! remote policy decides on another task or while a policy makes the request wait, and hundreds
//! of timeouts racing on two threads. Every permit comes back exactly once, or stays spent once
//! the inner service was called.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::StatusCode;
use tower::{Service, ServiceExt};
use tower_bulwark::limiter::BoxReserve;
use tower_bulwark::rate_limit::{Policy, RateLimitLayer};
use tower_bulwark::{
    clock::{ManualClock, TokioClock},
    limiter::Decision,
    BoxError, Limiter, Quota,
};

use super::accounting::{log, policy, req, sliding_log, svc, waiting_log, Acct, Inner, Mode, K};
use crate::common::{poll_up_to, waits_up_to};

/// Promise: permits are given back exactly once whatever happens: a chain of a count_if policy
/// that decides later, a waiting policy (`max_wait`), a shadow with a wait, and a policy that
/// decides after several polls, with the response future dropped after each poll in turn (time
/// moves between polls). Dropped before the inner service is called, nothing is spent; after,
/// everything is kept; run to the end, the count_if policy settles.
#[tokio::test(start_paused = true)]
async fn dropped_after_every_poll_gives_back_exactly_once() {
    let mut completed = false;
    for drop_after in 0..40 {
        let tokio_log = |quota: Quota, mode: Mode| sliding_log(quota, TokioClock::new(), mode);
        let waits = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(2));
        let counted = tokio_log(Quota::per_hour(5).unwrap(), Mode::Later(2));
        let waiting = tokio_log(waits, Mode::Now);
        let shadow_wait = tokio_log(waits, Mode::Later(1));
        let slow = tokio_log(Quota::per_hour(5).unwrap(), Mode::Later(3));
        let all = [&counted, &waiting, &shadow_wait, &slow];
        // Use the waiting policies' permit, so that this request waits for the next one.
        let key = "k".to_owned();
        for acct in [&waiting, &shadow_wait] {
            let d = acct.inner.reserve_now(&key, 1).unwrap().unwrap();
            assert!(d.allowed && d.wait.is_zero());
        }
        let inner = Inner::default();
        let service = svc(
            RateLimitLayer::new(
                policy(0, &counted)
                    .count_if(|r| r.status == StatusCode::UNAUTHORIZED)
                    .and(policy(1, &waiting))
                    .and(policy(2, &shadow_wait).shadow())
                    .and(policy(3, &slow)),
            ),
            &inner,
        );
        let mut s = service.clone();
        let mut future = Box::pin(s.call(req(&[("x-yield", "2")])));
        let output = poll_up_to(future.as_mut(), drop_after, |_| {
            tokio::time::advance(Duration::from_millis(400))
        })
        .await;
        drop(future);
        let what = format!("dropped after {drop_after} polls");
        for a in all {
            assert_eq!(a.bad_refunds(), 0, "{what}");
        }
        // What was reserved beforehand (outside the books) stays.
        let base = [0, 0, 0, 0];
        let nets: Vec<i64> = all.iter().map(|a| a.net("k")).collect();
        match (inner.calls(), output) {
            (0, None) => {
                assert_eq!(nets, base, "{what}: dropped before the call spends nothing");
            }
            (1, None) => {
                assert_eq!(
                    nets,
                    [1, 1, 1, 1],
                    "{what}: dropped after the call keeps everything"
                );
            }
            (1, Some(Ok(response))) => {
                assert_eq!(response.status(), StatusCode::OK, "{what}");
                assert_eq!(
                    nets,
                    [0, 1, 1, 1],
                    "{what}: a response that does not count gives the count_if permit back"
                );
                assert_eq!(counted.refunds(), 1, "{what}");
                completed = true;
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(counted.probe("k") as i64, 5 - nets[0], "{what}");
        assert_eq!(slow.probe("k") as i64, 5 - nets[3], "{what}");
    }
    assert!(completed, "some run reached the response");
}

/// A limiter that decides on another task after a delay and sends the decision back, as a
/// client of a remote store does: the future registers its waker with a channel (the first poll,
/// in `call`, with a no-op waker). A decision whose caller is gone is given back, as the Redis
/// limiter does.
#[derive(Clone)]
struct Remote {
    acct: Acct,
    delay: Duration,
}

impl Remote {
    /// A remote limiter whose books are a [`log`] of `permits` on `clock`, its decisions
    /// arriving `delay` after they are asked for.
    fn new(permits: u32, clock: &ManualClock, delay: Duration) -> Self {
        Self {
            acct: log(permits, clock, Mode::Now),
            delay,
        }
    }
}

impl Limiter<String> for Remote {
    type Future = BoxReserve;

    fn quota(&self) -> Quota {
        self.acct.quota()
    }

    fn reserve(&self, key: &String, cost: u32) -> BoxReserve {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (acct, task_key, delay) = (self.acct.clone(), key.clone(), self.delay);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let result = acct.decide(&task_key, cost);
            if let Err(Ok(d)) = tx.send(result) {
                if d.allowed {
                    Limiter::refund(&acct, &task_key, cost, d);
                }
            }
        });
        Box::pin(RemoteFuture {
            rx: Some(rx),
            acct: self.acct.clone(),
            key: key.clone(),
            cost,
        })
    }

    fn refund(&self, key: &String, cost: u32, decision: Decision) -> bool {
        Limiter::refund(&self.acct, key, cost, decision)
    }

    /// As a limiter of its own that gives back only by refunds: the difference of a settle to
    /// less goes back through `refund`, and nothing is charged.
    fn settle(&self, key: &String, estimate: u32, decision: Decision, cost: u32) -> bool {
        cost < estimate && Limiter::refund(self, key, estimate - cost, decision)
    }
}

/// The caller's side of a remote decision: dropped before it hands the decision over, it gives
/// back one that already arrived (and closes the channel, so that one arriving later is given
/// back by the sender).
struct RemoteFuture {
    rx: Option<tokio::sync::oneshot::Receiver<Result<Decision, BoxError>>>,
    acct: Acct,
    key: String,
    cost: u32,
}

impl Future for RemoteFuture {
    type Output = Result<Decision, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let rx = self.rx.as_mut().expect("polled after completion");
        let out = std::task::ready!(Pin::new(rx).poll(cx));
        self.rx = None;
        Poll::Ready(out.unwrap_or_else(|_| Err("remote task gone".into())))
    }
}

impl Drop for RemoteFuture {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if let Ok(Ok(d)) = rx.try_recv() {
                if d.allowed {
                    Limiter::refund(&self.acct, &self.key, self.cost, d);
                }
            }
        }
    }
}

/// Promise: permits are given back exactly once whatever happens, with a limiter whose future
/// resolves later on another task: requests complete (no lost wake-up from the first poll in
/// `call`), and a timeout above the layer that gives up while the remote policy decides, or
/// while a later policy makes the request wait, leaves nothing spent.
#[tokio::test(start_paused = true)]
async fn a_remote_policy_under_a_timeout_gives_everything_back() {
    let clock = ManualClock::new();
    let first = log(100, &clock, Mode::Now);
    let remote = Remote::new(100, &clock, Duration::from_millis(50));
    let waiting = waiting_log(Quota::per_second(1).unwrap(), Duration::from_secs(10));
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &first)
                .count_if(|r| r.status != StatusCode::OK)
                .and(Policy::new("remote", K(1), remote.clone()).unwrap())
                .and(policy(2, &waiting).cost_by(|p| u32::from(p.headers.contains_key("x-wait")))),
        ),
        &inner,
    );
    for _ in 0..5 {
        let r = service.clone().oneshot(req(&[("x-status", "500")])).await;
        assert_eq!(r.unwrap().status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!((first.net("k"), remote.acct.net("k")), (5, 5));
    // Gives up while the remote policy decides.
    let timed_out = tokio::time::timeout(
        Duration::from_millis(10),
        service.clone().oneshot(req(&[("x-status", "500")])),
    )
    .await;
    assert!(timed_out.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(first.net("k"), 5, "the first policy's permit came back");
    assert_eq!(remote.acct.net("k"), 5, "the remote decision came back");
    // Gives up while waiting for the waiting policy's next permit.
    let r = service
        .clone()
        .oneshot(req(&[("x-wait", "1"), ("x-status", "500")]))
        .await;
    assert_eq!(r.unwrap().status(), StatusCode::INTERNAL_SERVER_ERROR);
    let timed_out = tokio::time::timeout(
        Duration::from_millis(400),
        service
            .clone()
            .oneshot(req(&[("x-wait", "1"), ("x-status", "500")])),
    )
    .await;
    assert!(timed_out.is_err());
    assert_eq!(
        (first.net("k"), remote.acct.net("k"), waiting.net("k")),
        (6, 6, 1),
        "everything the waiting request held came back"
    );
    assert_eq!(inner.calls(), 6);
    for a in [&first, &remote.acct, &waiting] {
        assert_eq!(a.bad_refunds(), 0);
    }
    assert_eq!(waiting.probe("k"), 0);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        waiting.probe("k"),
        1,
        "the reservation's slot is free again"
    );
}

/// Promise: permits are given back exactly once whatever happens, under concurrency: hundreds
/// of requests on two threads, each under a timeout of its own that fires at any await point
/// (while a remote policy decides, while a waiting policy waits, while the handler works), and
/// handlers that take a while. Afterwards the books of every policy add up: a plain policy keeps
/// exactly one permit per request that reached the handler, a count_if policy (whose responses
/// never count) exactly one per request dropped after the handler was called and before it
/// answered; nothing was given back twice, and no refusal was given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_at_every_await_point_under_concurrency_keep_the_books_exact() {
    const TASKS: u64 = 400;
    let clock = ManualClock::new();
    let counted = log(1_000_000, &clock, Mode::Now);
    let remote = Remote::new(1_000_000, &clock, Duration::from_millis(3));
    let waiting = waiting_log(
        Quota::with_period(4, Duration::from_millis(20)).unwrap(),
        Duration::from_millis(30),
    );
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &counted)
                .count_if(|r| r.status == StatusCode::INTERNAL_SERVER_ERROR)
                .and(Policy::new("remote", K(1), remote.clone()).unwrap())
                .and(policy(2, &waiting)),
        ),
        &inner,
    );
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let service = service.clone();
            let timeout = Duration::from_millis(next(25));
            let sleep = next(15).to_string();
            let key = format!("key{}", i % 3);
            let start = Duration::from_millis(next(400));
            tokio::spawn(async move {
                tokio::time::sleep(start).await;
                let request = req(&[("x-sleep-ms", &sleep), ("x-key", &key)]);
                tokio::time::timeout(timeout, service.oneshot(request)).await
            })
        })
        .collect();
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        let label = match t.await.unwrap() {
            Ok(Ok(r)) => r.status().to_string(),
            Ok(Err(e)) => format!("error {e}"),
            Err(_) => "timed out".to_owned(),
        };
        *outcomes.entry(label).or_default() += 1;
    }
    // Let the remote decisions still on their way land (and be given back).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let total = |a: &Acct| -> i64 { (0..3).map(|k| a.net(&format!("key{k}"))).sum() };
    let (calls, returned) = (inner.calls() as i64, inner.returned() as i64);
    let what = format!("{outcomes:?}: {calls} calls, {returned} returned");
    assert!(
        calls > 0 && calls > returned,
        "{what}: the drops must hit the handler"
    );
    assert!(
        outcomes.get("timed out").copied().unwrap_or(0) > calls as usize - returned as usize,
        "{what}: the drops must also hit the decision"
    );
    assert_eq!(total(&remote.acct), calls, "{what}: the remote policy");
    assert_eq!(total(&waiting), calls, "{what}: the waiting policy");
    assert_eq!(
        total(&counted),
        calls - returned,
        "{what}: the count_if policy"
    );
    for a in [&counted, &remote.acct, &waiting] {
        assert_eq!(a.bad_refunds(), 0, "{what}");
    }
}
