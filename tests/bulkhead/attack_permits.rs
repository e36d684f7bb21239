//! Attacks on the fixed bulkhead's permits under their own lock, by a helper that had not seen
//! the code: hooks that panic or drop other calls, wakers whose drop touches the bulkhead,
//! `max_wait` racing hand-offs on threads, huge limits, floods, a random model with panicking
//! hooks. Two faults found and mended: a waker dropped under the bulkhead's lock could end a
//! call of the same bulkhead there (a deadlock), and a call dropped by a panic of the caller's
//! own code was reported `Panicked` (the inner service's panic) rather than `Cancelled`.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use proptest::prelude::*;
use tower::{Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::{
    Bulkhead, BulkheadFull, CallFinished, CallOutcome, CallPermitted, CallRejected,
};
use tower_bulwark::BoxError;

use crate::common::process::quiet_panics_starting_with;
use crate::common::{paused_runtime, poll_once};

use super::order_support::*;

const PANIC: &str = "attack_permits";

/// Lowers a live count when the inner call completes or is dropped.
struct Down(Arc<AtomicUsize>);

impl Down {
    /// Raises `live` for a call that starts: the count with it, and what lowers it again.
    fn enter(live: &Arc<AtomicUsize>) -> (usize, Self) {
        (
            live.fetch_add(1, Ordering::SeqCst) + 1,
            Self(Arc::clone(live)),
        )
    }
}

impl Drop for Down {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------------
// Outcome of a call dropped while an unrelated panic unwinds.

/// A running call (inner future pending, never panicked) dropped while the *caller's* code
/// panics: the inner service did not panic, so the outcome must be `Cancelled`
/// (docs: `Panicked` = "The inner service panicked while it was being called or polled").
#[test]
fn a_call_dropped_while_its_caller_panics_is_cancelled_not_panicked() {
    quiet_panics_starting_with(PANIC);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let o = outcomes.clone();
    let (bulkhead, _inner, mut svc) = gated(Bulkhead::semaphore("s", 1).on_call_finished(
        move |e: &CallFinished<'_>| {
            o.lock().unwrap().push(e.outcome);
        },
    ));
    let mut running = call(&mut svc, 1);
    assert!(pending(&mut running));
    let result = catch_unwind(AssertUnwindSafe(move || {
        let _held = running;
        panic!("{PANIC}: the caller's own bug, not the inner service's");
    }));
    assert!(result.is_err());
    assert_idle(&bulkhead, 1, "after the caller's panic");
    assert_eq!(*outcomes.lock().unwrap(), vec![CallOutcome::Cancelled]);
}

/// The same in the `UntilBodyEnd` mode: a response body (not at its end) dropped while the
/// caller's code panics is reported `Panicked`, though no inner service panicked.
#[tokio::test]
async fn a_body_dropped_while_its_caller_panics_is_cancelled_not_panicked() {
    quiet_panics_starting_with(PANIC);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let o = outcomes.clone();
    let bulkhead = Bulkhead::semaphore("b", 1)
        .on_call_finished(move |e: &CallFinished<'_>| o.lock().unwrap().push(e.outcome))
        .build();
    let svc = bulkhead
        .body_layer()
        .layer(tower::service_fn(|_: ()| async {
            let body = http_body_util::StreamBody::new(futures::stream::pending::<
                Result<http_body::Frame<bytes::Bytes>, std::io::Error>,
            >());
            Ok::<_, BoxError>(http::Response::new(body))
        }));
    let response = svc.oneshot(()).await.unwrap();
    let result = catch_unwind(AssertUnwindSafe(move || {
        let _held = response;
        panic!("{PANIC}: the caller's own bug, while reading the body");
    }));
    assert!(result.is_err());
    assert_eq!(bulkhead.snapshot().available_concurrent_calls, 1);
    assert_eq!(*outcomes.lock().unwrap(), vec![CallOutcome::Cancelled]);
}

// ---------------------------------------------------------------------------------------------
// Wakers dropped under the bulkhead's lock.

/// A task of a simple executor: the waker is an `Arc` of the task, which owns its futures.
struct Task {
    #[allow(dead_code)]
    owned: Mutex<Vec<Call>>,
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {}
}

/// Runs `f` on a thread; `false` if it did not finish within 3 seconds (the thread is left).
fn finishes_in_time(f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(3)).is_ok()
}

/// A queue bulkhead of one permit held by call 1, and call 2 waiting, polled by task T which
/// owns call 1: the waker the queue keeps for call 2 is T's only reference.
fn a_waiter_polled_by_the_owner_of_a_call() -> (Bulkhead, Gated, Svc, Call) {
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("q", 1, 4));
    let mut one = call(&mut svc, 1);
    assert!(pending(&mut one));
    let mut two = call(&mut svc, 2);
    polled_by_a_task_owning(one, &mut two);
    (bulkhead, inner, svc, two)
}

/// Polls `waiter` with the waker of a task that owns `owned`, then drops every other reference
/// to that task: the waker `waiter`'s bulkhead keeps is the task's last.
fn polled_by_a_task_owning(owned: Call, waiter: &mut Call) {
    let task = Arc::new(Task {
        owned: Mutex::new(vec![owned]),
    });
    let waker = Waker::from(task);
    assert!(waiter
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
}

/// Task T owns a running call (1) of bulkhead B and polls a queued call (2) of B, whose entry in
/// B's queue keeps T's waker. Call 2 is then moved out and polled elsewhere (another waker): the
/// old waker, T's last reference, is dropped, which drops T and its running call 1, whose permit
/// goes back to B. That must not deadlock.
#[test]
fn a_waker_whose_drop_ends_a_call_of_the_same_bulkhead_does_not_deadlock_on_repoll() {
    let done = finishes_in_time(|| {
        let (bulkhead, _inner, _svc, mut two) = a_waiter_polled_by_the_owner_of_a_call();
        // Polled by another task: the bulkhead replaces the waker it keeps.
        let _ = poll_once(two.as_mut());
        // Call 1 ended (T dropped): call 2 is handed its permit and starts.
        assert!(pending(&mut two));
        drop(two);
        assert_idle(&bulkhead, 1, "queue");
    });
    assert!(
        done,
        "deadlock: a waker was dropped under the bulkhead's lock"
    );
}

/// Control: the same with the task owning a call of *another* bulkhead: no deadlock.
#[test]
fn control_a_waker_whose_drop_ends_a_call_of_another_bulkhead() {
    let done = finishes_in_time(|| {
        let (_other, _oi, mut other_svc) = gated(Bulkhead::queue("o", 1, 4));
        let mut one = call(&mut other_svc, 1);
        assert!(pending(&mut one));
        let (bulkhead, _inner, mut svc) = gated(Bulkhead::queue("q", 0, 4));
        let mut two = call(&mut svc, 2);
        polled_by_a_task_owning(one, &mut two);
        let _ = poll_once(two.as_mut());
        drop(two);
        assert_idle(&bulkhead, 0, "queue");
    });
    assert!(done, "control deadlocked");
}

/// Same, but call 2 is dropped (its caller gave up) instead of polled again.
#[test]
fn a_waker_whose_drop_ends_a_call_of_the_same_bulkhead_does_not_deadlock_on_leave() {
    let done = finishes_in_time(|| {
        let (bulkhead, _inner, _svc, two) = a_waiter_polled_by_the_owner_of_a_call();
        drop(two);
        assert_idle(&bulkhead, 1, "queue");
    });
    assert!(
        done,
        "deadlock: a waker was dropped under the bulkhead's lock"
    );
}

// ---------------------------------------------------------------------------------------------
// Hooks that drop other calls of the same bulkhead.

/// `on_call_finished` and `on_call_permitted` drop queued calls (handed a permit or not) of the
/// same bulkhead; every permit comes back once and the next waiters start in order.
#[tokio::test(start_paused = true)]
async fn hooks_that_drop_other_calls_release_each_permit_once() {
    for kind in ["queue", "semaphore"] {
        let slot: Arc<Mutex<Vec<Call>>> = Arc::new(Mutex::new(Vec::new()));
        let (s1, s2) = (slot.clone(), slot.clone());
        let builder = match kind {
            "queue" => Bulkhead::queue("q", 2, 16),
            _ => Bulkhead::semaphore("s", 2).max_wait(Duration::from_secs(600)),
        };
        let builder = builder
            .on_call_finished(move |_: &CallFinished<'_>| {
                let taken = std::mem::take(&mut *s1.lock().unwrap());
                drop(taken);
            })
            .on_call_permitted(move |_: &CallPermitted<'_>| {
                let taken = std::mem::take(&mut *s2.lock().unwrap());
                drop(taken);
            });
        let (bulkhead, inner, mut svc) = gated(builder);
        let mut calls = calls_of(&mut svc, 1..=8);
        assert_pending(&mut calls, 1..=8, kind);
        assert_eq!(inner.started(), vec![1, 2], "{kind}");
        // 3 and 4 go to the slot: dropped by the next hook that runs.
        slot.lock().unwrap().push(calls.remove(&3).unwrap());
        slot.lock().unwrap().push(calls.remove(&4).unwrap());
        // 1 ends: its finished hook drops 3 and 4 (3 was just handed 1's permit? no: the hook
        // runs before the permit comes back, so 3 is dropped unhanded), then 5 is handed.
        end(&inner, &mut calls, 1);
        assert_pending(&mut calls, 5..=8, kind);
        assert_eq!(inner.started(), vec![1, 2, 5], "{kind}");
        assert_eq!(bulkhead.snapshot().queue_depth, 3, "{kind}");
        // 7 goes to the slot; 2 ends: its finished hook drops 7 (unhanded), then 6 is handed
        // 2's permit. 8 goes to the slot; 6 is polled and its permitted hook drops 8.
        slot.lock().unwrap().push(calls.remove(&7).unwrap());
        end(&inner, &mut calls, 2);
        assert_eq!(bulkhead.snapshot().queue_depth, 1, "{kind}");
        slot.lock().unwrap().push(calls.remove(&8).unwrap());
        assert_pending(&mut calls, [6], kind);
        assert_eq!(inner.started(), vec![1, 2, 5, 6], "{kind}");
        assert!(slot.lock().unwrap().is_empty(), "{kind}");
        assert_eq!(bulkhead.snapshot().queue_depth, 0, "{kind}");
        end(&inner, &mut calls, 5);
        end(&inner, &mut calls, 6);
        assert!(calls.is_empty());
        assert_idle(&bulkhead, 2, kind);
    }
}

/// A handed-but-unpolled waiter dropped from inside another call's `on_call_finished` hook (its
/// permit was handed by an earlier end): its permit passes on once.
#[test]
fn a_handed_waiter_dropped_from_a_finished_hook_passes_its_permit_once() {
    let slot: Arc<Mutex<Vec<Call>>> = Arc::new(Mutex::new(Vec::new()));
    let s1 = slot.clone();
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("q", 2, 16).on_call_finished(
        move |_: &CallFinished<'_>| {
            let taken = std::mem::take(&mut *s1.lock().unwrap());
            drop(taken);
        },
    ));
    let mut calls = calls_of(&mut svc, 1..=5);
    assert_pending(&mut calls, 1..=5, "queue");
    // 1 ends: 3 is handed (not polled).
    end(&inner, &mut calls, 1);
    assert_eq!(bulkhead.snapshot().queue_depth, 2);
    slot.lock().unwrap().push(calls.remove(&3).unwrap());
    // 2 ends: its hook drops 3 (handed): 3's permit goes to 4, then 2's own to 5.
    end(&inner, &mut calls, 2);
    assert_pending(&mut calls, [5, 4], "queue");
    assert_eq!(inner.started(), vec![1, 2, 5, 4]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.available_concurrent_calls, 0);
    assert_eq!(snapshot.queue_depth, 0);
    end(&inner, &mut calls, 4);
    end(&inner, &mut calls, 5);
    assert_idle(&bulkhead, 2, "queue");
}

// ---------------------------------------------------------------------------------------------
// Huge limits.

#[test]
fn huge_limits_are_clamped_and_keep_their_count() {
    const MAX: usize = (u32::MAX >> 1) as usize;
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("q", 0, 1000));
    let mut calls = calls_of(&mut svc, 1..=100);
    assert_pending(&mut calls, 1..=100, "queue");
    assert_eq!(bulkhead.snapshot().queue_depth, 100);
    bulkhead.set_max_concurrent_calls(usize::MAX);
    let s = bulkhead.snapshot();
    assert_eq!(s.max_allowed_concurrent_calls, MAX);
    assert_eq!(s.queue_depth, 0);
    assert_eq!(s.available_concurrent_calls, MAX - 100);
    // Lower to 50 while all 100 are handed, none started: the latest 50 wait again.
    bulkhead.set_max_concurrent_calls(50);
    let s = bulkhead.snapshot();
    assert_eq!(s.available_concurrent_calls, 0);
    assert_eq!(s.queue_depth, 50);
    assert_pending(&mut calls, (1..=100).rev(), "queue");
    assert_eq!(inner.started(), (1..=50).rev().collect::<Vec<_>>());
    bulkhead.set_max_concurrent_calls(1 << 31);
    assert_eq!(bulkhead.snapshot().max_allowed_concurrent_calls, MAX);
    assert_pending(&mut calls, 51..=100, "queue");
    for id in 1..=100 {
        end(&inner, &mut calls, id);
    }
    assert_idle(&bulkhead, MAX, "queue");
    bulkhead.set_max_concurrent_calls(0);
    assert_idle(&bulkhead, 0, "queue");
    let semaphore = Bulkhead::semaphore("s", 1 << 31).build();
    assert_eq!(semaphore.snapshot().available_concurrent_calls, MAX);
}

/// Limit 0 and capacity 0 refuse everything; a raise admits.
#[tokio::test]
async fn limit_zero_capacity_zero_then_raise() {
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("q", 0, 0));
    let mut c = call(&mut svc, 1);
    let r = poll_call(&mut c).unwrap();
    assert!(matches!(r, Poll::Ready(Err(ref e)) if e.is::<BulkheadFull>()));
    bulkhead.set_max_concurrent_calls(1);
    let mut calls = calls_of(&mut svc, 2..=3);
    assert_pending(&mut calls, [2], "queue");
    let r = poll_call(calls.get_mut(&3).unwrap()).unwrap();
    assert!(matches!(r, Poll::Ready(Err(ref e)) if e.is::<BulkheadFull>()));
    calls.remove(&3);
    end(&inner, &mut calls, 2);
    assert_idle(&bulkhead, 1, "queue");
}

// ---------------------------------------------------------------------------------------------
// The sequential caller on one thread.

/// Limit 1, capacity 1: A runs, B waits (polled). A ends and, in the same poll, calls again:
/// B was handed A's permit and left the queue, so A's second call is queued (not refused), and
/// B starts before it.
#[test]
fn a_caller_that_ends_and_calls_again_queues_behind_the_waiter() {
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("q", 1, 1));
    let mut calls = calls_of(&mut svc, 1..=2);
    assert_pending(&mut calls, 1..=2, "queue");
    end(&inner, &mut calls, 1);
    let mut again = call(&mut svc, 3);
    assert!(pending(&mut again), "the second call was refused");
    assert_eq!(bulkhead.snapshot().queue_depth, 1);
    assert!(pending(&mut again));
    assert_pending(&mut calls, [2], "queue");
    assert_eq!(inner.started(), vec![1, 2]);
    calls.insert(3, again);
    end(&inner, &mut calls, 2);
    assert_pending(&mut calls, [3], "queue");
    end(&inner, &mut calls, 3);
    assert_idle(&bulkhead, 1, "queue");
}

// ---------------------------------------------------------------------------------------------
// A flood of waiters with cancellation, on tasks.

#[test]
fn a_flood_of_ten_thousand_waiters_with_cancellation_starts_in_order_under_the_limit() {
    const N: usize = 10_000;
    const LIMIT: usize = 7;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let bulkhead = Bulkhead::queue("flood", LIMIT, N).build();
        let live = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(Mutex::new(Vec::new()));
        let (l, p, o) = (live.clone(), peak.clone(), order.clone());
        let svc = bulkhead.layer().layer(tower::service_fn(move |id: usize| {
            let (l, p, o) = (l.clone(), p.clone(), o.clone());
            async move {
                let (now, _down) = Down::enter(&l);
                p.fetch_max(now, Ordering::SeqCst);
                o.lock().unwrap().push(id);
                for _ in 0..(id % 3) {
                    tokio::task::yield_now().await;
                }
                Ok::<_, BoxError>(id)
            }
        }));
        let mut handles = Vec::new();
        for id in 0..N {
            let mut svc = svc.clone();
            // The call is made synchronously here, in arrival order.
            let fut = svc.ready().await.unwrap().call(id);
            handles.push(tokio::spawn(fut));
        }
        // Cancel every third waiter not yet started, and some at random points.
        for (id, h) in handles.iter().enumerate() {
            if id % 3 == 1 || id % 7 == 0 {
                h.abort();
            }
            if id % 500 == 0 {
                tokio::task::yield_now().await;
            }
        }
        let mut ok = 0;
        for h in handles {
            match h.await {
                Ok(Ok(_)) => ok += 1,
                Ok(Err(e)) => panic!("unexpected error {e}"),
                Err(e) => assert!(e.is_cancelled()),
            }
        }
        let order = order.lock().unwrap().clone();
        assert!(order.len() >= ok, "{} started, {ok} ended", order.len());
        assert!(
            peak.load(Ordering::SeqCst) <= LIMIT,
            "peak {}",
            peak.load(Ordering::SeqCst)
        );
        let inversions: Vec<_> = order.windows(2).filter(|w| w[0] > w[1]).collect();
        assert!(
            inversions.is_empty(),
            "started out of arrival order: {:?}",
            &inversions[..inversions.len().min(10)]
        );
        assert_idle(&bulkhead, LIMIT, "flood");
    });
}

// ---------------------------------------------------------------------------------------------
// max_wait racing hand-offs, with resizes from another thread, on a multi-thread runtime.

fn storm(limit: usize, resize: bool, seed: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap();
    let hooks_permitted = Arc::new(AtomicUsize::new(0));
    let hooks_finished = Arc::new(AtomicUsize::new(0));
    let hooks_rejected = Arc::new(AtomicUsize::new(0));
    let (hp, hf, hr) = (
        hooks_permitted.clone(),
        hooks_finished.clone(),
        hooks_rejected.clone(),
    );
    let bulkhead = Bulkhead::semaphore("storm", limit)
        .max_wait(Duration::from_millis(1))
        .on_call_permitted(move |_: &CallPermitted<'_>| {
            hp.fetch_add(1, Ordering::SeqCst);
        })
        .on_call_finished(move |_: &CallFinished<'_>| {
            hf.fetch_add(1, Ordering::SeqCst);
        })
        .on_call_rejected(move |_: &CallRejected<'_>| {
            hr.fetch_add(1, Ordering::SeqCst);
        })
        .build();
    let live = Arc::new(AtomicUsize::new(0));
    let over = Arc::new(AtomicBool::new(false));
    let max_limit = Arc::new(AtomicUsize::new(limit));
    let (l, ov, ml) = (live.clone(), over.clone(), max_limit.clone());
    let svc = bulkhead.layer().layer(tower::service_fn(move |n: u64| {
        let (l, ov, ml) = (l.clone(), ov.clone(), ml.clone());
        async move {
            let (now, _down) = Down::enter(&l);
            if now > ml.load(Ordering::SeqCst) {
                ov.store(true, Ordering::SeqCst);
            }
            if n % 4 == 0 {
                tokio::time::sleep(Duration::from_micros(n % 1500)).await;
            } else {
                tokio::task::yield_now().await;
            }
            Ok::<_, BoxError>(n)
        }
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = (!resize).then(|| {
        let (b, stop) = (bulkhead.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut samples = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let s = b.snapshot();
                let in_flight = s.total_permitted - s.total_finished;
                assert!(
                    s.available_concurrent_calls as u64 + in_flight <= limit as u64,
                    "snapshot adds up to more than the limit: {s:?}"
                );
                samples += 1;
            }
            samples
        })
    });
    let resizer = resize.then(|| {
        let (b, stop, ml) = (bulkhead.clone(), stop.clone(), max_limit.clone());
        std::thread::spawn(move || {
            let mut x = seed | 1;
            while !stop.load(Ordering::SeqCst) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let n = (x % (limit as u64 + 3)) as usize;
                ml.fetch_max(n, Ordering::SeqCst);
                b.set_max_concurrent_calls(n);
                std::thread::sleep(Duration::from_micros(x % 300));
            }
            b.set_max_concurrent_calls(limit);
        })
    });
    let (ok, refused) = rt.block_on(async {
        let mut handles = Vec::new();
        for t in 0..16u64 {
            let svc = svc.clone();
            handles.push(tokio::spawn(async move {
                let (mut ok, mut refused) = (0usize, 0usize);
                let mut x = seed.wrapping_mul(t + 7) | 1;
                let deadline = std::time::Instant::now() + Duration::from_millis(1500);
                while std::time::Instant::now() < deadline {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let mut svc = svc.clone();
                    let fut = svc.ready().await.unwrap().call(x);
                    if x % 5 == 0 {
                        // Cut it short: a timeout racing the hand-off and the deadline.
                        match tokio::time::timeout(Duration::from_micros(x % 2000), fut).await {
                            Ok(Ok(_)) => ok += 1,
                            Ok(Err(e)) => {
                                assert!(e.is::<BulkheadFull>());
                                refused += 1;
                            }
                            Err(_) => {}
                        }
                    } else {
                        match fut.await {
                            Ok(_) => ok += 1,
                            Err(e) => {
                                assert!(e.is::<BulkheadFull>());
                                refused += 1;
                            }
                        }
                    }
                }
                (ok, refused)
            }));
        }
        let mut total = (0, 0);
        for h in handles {
            let (o, r) = h.await.unwrap();
            total.0 += o;
            total.1 += r;
        }
        total
    });
    stop.store(true, Ordering::SeqCst);
    if let Some(r) = resizer {
        r.join().unwrap();
    }
    if let Some(s) = sampler {
        assert!(s.join().unwrap() > 0);
    }
    drop(rt);
    assert!(
        !over.load(Ordering::SeqCst),
        "more calls ran than any limit set"
    );
    let s = bulkhead.snapshot();
    assert_eq!(s.max_allowed_concurrent_calls, limit);
    assert_eq!(s.available_concurrent_calls, limit, "{s:?}");
    assert_eq!(s.queue_depth, 0, "{s:?}");
    assert_eq!(s.total_permitted, s.total_finished, "{s:?}");
    assert_eq!(
        hooks_permitted.load(Ordering::SeqCst) as u64,
        s.total_permitted
    );
    assert_eq!(
        hooks_finished.load(Ordering::SeqCst) as u64,
        s.total_finished
    );
    assert_eq!(
        hooks_rejected.load(Ordering::SeqCst) as u64,
        s.total_rejected
    );
    assert_eq!(refused as u64, s.total_rejected);
    assert!(ok as u64 <= s.total_permitted);
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn max_wait_racing_hand_offs_on_threads_keeps_the_limit_and_counts() {
    storm(3, false, 0x9e37_79b9);
}

#[test]
fn max_wait_racing_hand_offs_and_resizes_on_threads_releases_every_permit_once() {
    storm(4, true, 0x1234_5678_9abc);
}

/// N threads racing for limit L with no waiting: exactly L get in, the rest are refused.
#[test]
fn racing_threads_get_exactly_the_limit() {
    for (n, l) in [(16usize, 5usize), (16, 1), (16, 16), (16, 0)] {
        let (bulkhead, inner, svc) = gated(Bulkhead::semaphore("race", l));
        let barrier = Arc::new(std::sync::Barrier::new(n));
        let results: Vec<_> = (0..n)
            .map(|i| {
                let (mut svc, barrier) = (svc.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut c = call(&mut svc, i as u32);
                    match poll_call(&mut c).unwrap() {
                        Poll::Pending => Some(c),
                        Poll::Ready(Err(e)) => {
                            assert!(e.is::<BulkheadFull>());
                            None
                        }
                        Poll::Ready(Ok(_)) => panic!("gated call ended"),
                    }
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let running: Vec<Call> = results.into_iter().flatten().collect();
        assert_eq!(running.len(), l, "n {n} l {l}");
        assert_eq!(inner.live.load(Ordering::SeqCst), l);
        drop(running);
        assert_idle(&bulkhead, l, "race");
    }
}

// ---------------------------------------------------------------------------------------------
// A random model under paused time: hooks that panic, max_wait expiry, resizes, drops.

#[derive(Clone, Debug)]
enum Op {
    Call,
    Poll(usize),
    Drop(usize),
    Finish(usize),
    Fail(usize),
    PanicInner(usize),
    Resize(usize),
    Advance(u64),
    PanicNextPermitted,
    PanicNextFinished,
    PanicNextRejected,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => Just(Op::Call),
        5 => any::<usize>().prop_map(Op::Poll),
        1 => any::<usize>().prop_map(Op::Drop),
        3 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Fail),
        1 => any::<usize>().prop_map(Op::PanicInner),
        2 => (0usize..5).prop_map(Op::Resize),
        2 => (0u64..8).prop_map(Op::Advance),
        1 => Just(Op::PanicNextPermitted),
        1 => Just(Op::PanicNextFinished),
        1 => Just(Op::PanicNextRejected),
    ]
}

struct Flags {
    permitted: AtomicBool,
    finished: AtomicBool,
    rejected: AtomicBool,
    last_reason: Mutex<Option<tower_bulwark::bulkhead::Rejection>>,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("ATTACK_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(400), ..ProptestConfig::default() })]
    #[test]
    fn random_calls_with_panicking_hooks_and_max_wait_keep_every_promise(
        limit in 0usize..4,
        queue in any::<bool>(),
        capacity in 0usize..4,
        wait_ms in prop_oneof![Just(None), (1u64..6).prop_map(Some)],
        ops in proptest::collection::vec(op(), 1..100),
    ) {
        quiet_panics_starting_with(PANIC);
        let rt = paused_runtime();
        rt.block_on(async move {
            let flags = Arc::new(Flags {
                permitted: AtomicBool::new(false),
                finished: AtomicBool::new(false),
                rejected: AtomicBool::new(false),
                last_reason: Mutex::new(None),
            });
            let (f1, f2, f3) = (flags.clone(), flags.clone(), flags.clone());
            let mut builder = if queue {
                Bulkhead::queue("m", limit, capacity)
            } else {
                Bulkhead::semaphore("m", limit).max_wait(Duration::from_secs(3600))
            };
            if let Some(ms) = wait_ms {
                builder = builder.max_wait(Duration::from_millis(ms));
            }
            let max_wait = if queue { wait_ms } else { Some(wait_ms.unwrap_or(3_600_000)) };
            let builder = builder
                .on_call_permitted(move |_: &CallPermitted<'_>| {
                    if f1.permitted.swap(false, Ordering::SeqCst) {
                        panic!("{PANIC}: permitted hook");
                    }
                })
                .on_call_finished(move |_: &CallFinished<'_>| {
                    if !std::thread::panicking() && f2.finished.swap(false, Ordering::SeqCst) {
                        panic!("{PANIC}: finished hook");
                    }
                })
                .on_call_rejected(move |e: &CallRejected<'_>| {
                    *f3.last_reason.lock().unwrap() = Some(e.reason);
                    if f3.rejected.swap(false, Ordering::SeqCst) {
                        panic!("{PANIC}: rejected hook");
                    }
                });
            let (bulkhead, inner, mut svc) = gated(builder);
            let mut cur_limit = limit;
            let mut calls: Vec<(u32, tokio::time::Instant, Call)> = Vec::new();
            let mut next = 0u32;
            let mut started_before = 0usize;
            for op in ops {
                match op {
                    Op::Call => {
                        next += 1;
                        let id = next;
                        let before = bulkhead.snapshot();
                        *flags.last_reason.lock().unwrap() = None;
                        let made = catch_unwind(AssertUnwindSafe(|| call(&mut svc, id)));
                        let refused = flags.last_reason.lock().unwrap().is_some();
                        if refused {
                            // Refused only with no permit free and no room to wait.
                            assert_eq!(before.available_concurrent_calls, 0, "refused with a permit free: {before:?}");
                            let no_room = if queue { before.queue_depth >= capacity || wait_ms == Some(0) } else { false };
                            assert!(no_room, "refused with room to wait: {before:?} capacity {capacity}");
                        } else if !inner.has_started(id) && made.is_ok() {
                            // Queued: only with no permit free.
                            assert_eq!(before.available_concurrent_calls, 0, "queued with a permit free: {before:?}");
                        }
                        if let Ok(c) = made {
                            calls.push((id, tokio::time::Instant::now(), c));
                        }
                    }
                    Op::Poll(i) | Op::Finish(i) | Op::Fail(i) | Op::PanicInner(i) if !calls.is_empty() => {
                        let i = i % calls.len();
                        let id = calls[i].0;
                        if inner.has_started(id) && inner.state.lock().unwrap().gates.contains_key(&id) {
                            match op {
                                Op::Finish(_) => inner.finish(id),
                                Op::Fail(_) => inner.fail(id),
                                Op::PanicInner(_) => inner.open(id, Gate::Panic),
                                _ => {}
                            }
                        }
                        let since = calls[i].1;
                        *flags.last_reason.lock().unwrap() = None;
                        match poll_call(&mut calls[i].2) {
                            Ok(Poll::Pending) => {
                                if !inner.has_started(id) {
                                    if let Some(ms) = max_wait {
                                        let waited = tokio::time::Instant::now() - since;
                                        assert!(waited <= Duration::from_millis(ms + 1), "call {id} still waits after {waited:?} > max_wait {ms}ms");
                                    }
                                }
                            }
                            Ok(Poll::Ready(Ok(got))) => {
                                assert_eq!(got, id);
                                let (_, _, c) = calls.remove(i);
                                let _ = catch_unwind(AssertUnwindSafe(move || drop(c)));
                            }
                            Ok(Poll::Ready(Err(e))) => {
                                if e.is::<BulkheadFull>() && inner.has_started(id) {
                                    panic!("call {id} started and then refused");
                                }
                                if e.is::<BulkheadFull>() && *flags.last_reason.lock().unwrap() == Some(tower_bulwark::bulkhead::Rejection::WaitElapsed) {
                                    // Refused after a wait: not before max_wait.
                                    let waited = tokio::time::Instant::now() - since;
                                    if let Some(ms) = max_wait {
                                        if !waited.is_zero() {
                                            assert!(waited >= Duration::from_millis(ms), "refused after {waited:?} < {ms}ms");
                                        }
                                    }
                                }
                                let (_, _, c) = calls.remove(i);
                                let _ = catch_unwind(AssertUnwindSafe(move || drop(c)));
                            }
                            Err(()) => {
                                // A hook or the inner service panicked; the call is spent.
                                let (_, _, c) = calls.remove(i);
                                let _ = catch_unwind(AssertUnwindSafe(move || drop(c)));
                            }
                        }
                    }
                    Op::Drop(i) if !calls.is_empty() => {
                        let i = i % calls.len();
                        let (_, _, c) = calls.remove(i);
                        let _ = catch_unwind(AssertUnwindSafe(move || drop(c)));
                    }
                    Op::Resize(n) => {
                        bulkhead.set_max_concurrent_calls(n);
                        cur_limit = n;
                    }
                    Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                    Op::PanicNextPermitted => flags.permitted.store(true, Ordering::SeqCst),
                    Op::PanicNextFinished => flags.finished.store(true, Ordering::SeqCst),
                    Op::PanicNextRejected => flags.rejected.store(true, Ordering::SeqCst),
                    _ => {}
                }
                let started_now = inner.started().len();
                let live = inner.live.load(Ordering::SeqCst);
                if started_now > started_before {
                    assert!(live <= cur_limit, "a call started with {live} live under limit {cur_limit}");
                }
                started_before = started_now;
                let s = bulkhead.snapshot();
                assert!(s.available_concurrent_calls <= s.max_allowed_concurrent_calls);
                assert!(s.total_finished <= s.total_permitted);
                // Waiters not handed a permit: never more than the calls still pending and not
                // started.
                let waiting = calls.iter().filter(|(id, _, _)| !inner.has_started(*id)).count();
                assert!(s.queue_depth <= waiting, "{s:?} waiting {waiting}");
                if s.available_concurrent_calls > 0 {
                    assert_eq!(s.queue_depth, 0, "a permit free while a call waits unhanded");
                }
            }
            for (_, _, c) in calls.drain(..) {
                let _ = catch_unwind(AssertUnwindSafe(move || drop(c)));
            }
            let s = bulkhead.snapshot();
            assert_eq!(s.max_allowed_concurrent_calls, cur_limit);
            assert_eq!(s.available_concurrent_calls, cur_limit, "{s:?}");
            assert_eq!(s.queue_depth, 0);
            assert_eq!(s.total_permitted, s.total_finished);
            assert_eq!(inner.live.load(Ordering::SeqCst), 0);
        });
    }
}

// ---------------------------------------------------------------------------------------------
// A waker that panics (found by a read-only review).

/// A waker that panics when woken.
struct PanicsWhenWoken;

impl Wake for PanicsWhenWoken {
    fn wake(self: Arc<Self>) {
        panic!("{PANIC}: a waker that panics");
    }
}

/// A waker that counts its wakes.
#[derive(Default)]
struct CountsWakes(AtomicUsize);

impl Wake for CountsWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Limit 0, two waiters: the first polled with a waker that panics, the second with one that
/// counts. Raising the limit to 2 hands both a permit; the first wake panics, and the second
/// waiter is still woken to take its permit (it was left handed a permit it was never woken
/// for, the limit one lower until it left).
#[test]
fn a_waker_that_panics_leaves_no_other_waiter_asleep_with_its_permit() {
    quiet_panics_starting_with(PANIC);
    let (bulkhead, inner, mut svc) = gated(Bulkhead::queue("q", 0, 4));
    let mut first = call(&mut svc, 1);
    let mut second = call(&mut svc, 2);
    let panics = Waker::from(Arc::new(PanicsWhenWoken));
    assert!(first
        .as_mut()
        .poll(&mut Context::from_waker(&panics))
        .is_pending());
    let counts = Arc::new(CountsWakes::default());
    let counting = Waker::from(counts.clone());
    assert!(second
        .as_mut()
        .poll(&mut Context::from_waker(&counting))
        .is_pending());
    let raised = catch_unwind(AssertUnwindSafe(|| bulkhead.set_max_concurrent_calls(2)));
    assert!(raised.is_err(), "the first waker panicked");
    assert_eq!(counts.0.load(Ordering::SeqCst), 1, "the second was woken");
    assert!(pending(&mut first));
    assert!(pending(&mut second));
    assert_eq!(inner.started(), vec![1, 2]);
    drop((first, second));
    assert_idle(&bulkhead, 2, "after both");
}
