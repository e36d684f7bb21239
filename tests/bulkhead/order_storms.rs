//! Storms of resizes and calls on a multi-thread runtime: the limit holds and each permit is
//! released exactly once.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tower::{Layer, Service, ServiceExt};
use tower_bulwark::bulkhead::{Bulkhead, BulkheadBuilder, BulkheadFull};

use crate::common::Rng;

use super::order_support::*;

// ---------------------------------------------------------------------------------------------
// Storms on a multi-thread runtime.

/// The limits set, in order, with the number of the last set announced and the last returned.
struct Limits {
    values: Vec<AtomicUsize>,
    announced: AtomicUsize,
    returned: AtomicUsize,
}

impl Limits {
    /// The highest limit among the sets from `from` to the last announced.
    fn bound(&self, from: usize) -> usize {
        let to = self.announced.load(Ordering::SeqCst);
        (from..=to)
            .map(|i| self.values[i].load(Ordering::SeqCst))
            .max()
            .unwrap()
    }
}

/// A request: how long the inner call lasts (in yields) and the last set returned before the
/// call was made.
#[derive(Clone, Copy)]
struct Req {
    yields: u32,
    fail: bool,
    since_set: usize,
}

#[derive(Clone)]
struct Counting {
    live: Arc<AtomicUsize>,
    limits: Arc<Limits>,
    over: Arc<Mutex<Vec<String>>>,
}

impl Service<Req> for Counting {
    type Response = ();
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<(), io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let now = self.live.fetch_add(1, Ordering::SeqCst) + 1;
        let bound = self.limits.bound(req.since_set);
        if now > bound {
            self.over.lock().unwrap().push(format!(
                "{now} in flight, limits since the call was made at most {bound}"
            ));
        }
        let mut live = Live(self.live.clone(), false);
        Box::pin(async move {
            for _ in 0..req.yields {
                tokio::task::yield_now().await;
            }
            live.done();
            if req.fail {
                Err(io::Error::other("failed"))
            } else {
                Ok(())
            }
        })
    }
}

fn storm(builder: BulkheadBuilder, seed: u64) {
    const MAX_SETS: usize = 400_000;
    const CLIENTS: usize = 16;
    const CALLS_EACH: usize = 20_000;
    const FOR: Duration = Duration::from_millis(1500);
    let began = std::time::Instant::now();
    let permitted = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicU64::new(0));
    let bulkhead = counting_calls(builder, &permitted, &finished);
    let first = bulkhead.snapshot().max_allowed_concurrent_calls;
    let limits = Arc::new(Limits {
        values: (0..=MAX_SETS + 1).map(|_| AtomicUsize::new(0)).collect(),
        announced: AtomicUsize::new(0),
        returned: AtomicUsize::new(0),
    });
    limits.values[0].store(first, Ordering::SeqCst);
    let inner = Counting {
        live: Arc::new(AtomicUsize::new(0)),
        limits: limits.clone(),
        over: Arc::new(Mutex::new(Vec::new())),
    };
    let svc = bulkhead.layer().layer(inner.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let clients_done = Arc::new(AtomicBool::new(false));
    let bad_snapshots = Arc::new(Mutex::new(Vec::new()));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();

    // Resizes from another thread while the clients run, and a snapshot reader.
    let resizer = {
        let (bulkhead, limits, done) = (bulkhead.clone(), limits.clone(), clients_done.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(seed | 1);
            let mut i = 0;
            while i < MAX_SETS && !done.load(Ordering::SeqCst) {
                i += 1;
                let limit = rng.pick(&[0, 1, 1, 2, 3, 5, 8]);
                limits.values[i].store(limit, Ordering::SeqCst);
                limits.announced.store(i, Ordering::SeqCst);
                bulkhead.set_max_concurrent_calls(limit);
                limits.returned.store(i, Ordering::SeqCst);
                for _ in 0..rng.below(2000) {
                    std::hint::spin_loop();
                }
                if rng.below(4) == 0 {
                    std::thread::yield_now();
                }
            }
            // Last: a limit of 3.
            limits.values[i + 1].store(3, Ordering::SeqCst);
            limits.announced.store(i + 1, Ordering::SeqCst);
            bulkhead.set_max_concurrent_calls(3);
            limits.returned.store(i + 1, Ordering::SeqCst);
            i
        })
    };
    let reader = {
        let (bulkhead, stop, bad) = (bulkhead.clone(), stop.clone(), bad_snapshots.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let s = bulkhead.snapshot();
                if s.available_concurrent_calls > s.max_allowed_concurrent_calls {
                    bad.lock().unwrap().push(format!("{s:?}"));
                }
                std::thread::yield_now();
            }
        })
    };

    let outcome = runtime.block_on(async {
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let svc = svc.clone();
            let limits = limits.clone();
            clients.push(tokio::spawn(async move {
                let mut rng = Rng((seed ^ (c as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
                for _ in 0..CALLS_EACH {
                    if began.elapsed() > FOR {
                        break;
                    }
                    let req = Req {
                        yields: rng.below(6) as u32,
                        fail: rng.below(5) == 0,
                        since_set: limits.returned.load(Ordering::SeqCst),
                    };
                    let cut = Duration::from_micros(rng.below(1500));
                    let call = svc.clone().oneshot(req);
                    match rng.below(3) {
                        // Cut by a timeout: dropped waiting, handed a permit or running.
                        0 => drop(tokio::time::timeout(cut, call).await),
                        // Dropped after a few polls.
                        1 => {
                            let mut call = Box::pin(call);
                            for _ in 0..rng.below(4) {
                                if futures::poll!(call.as_mut()).is_ready() {
                                    break;
                                }
                                tokio::task::yield_now().await;
                            }
                            drop(call);
                        }
                        _ => drop(tokio::time::timeout(Duration::from_millis(20), call).await),
                    }
                }
            }));
        }
        let all = futures::future::join_all(clients);
        let joined = tokio::time::timeout(Duration::from_secs(5), all).await;
        clients_done.store(true, Ordering::SeqCst);
        let sets = resizer.join().unwrap();
        let s = bulkhead.snapshot();
        eprintln!(
            "storm {seed:#x}: {sets} resizes, {} permitted, {} refused",
            s.total_permitted, s.total_rejected
        );
        if joined.is_err() {
            return Err("clients did not finish".to_string());
        }
        for j in joined.unwrap() {
            j.map_err(|e| format!("client panicked: {e}"))?;
        }
        // With the storm over and the limit at 3, calls without timeouts all get through.
        let tail: Vec<_> = (0..24)
            .map(|_| {
                let svc = svc.clone();
                let since_set = limits.returned.load(Ordering::SeqCst);
                tokio::spawn(svc.oneshot(Req {
                    yields: 2,
                    fail: false,
                    since_set,
                }))
            })
            .collect();
        let tail = tokio::time::timeout(Duration::from_secs(2), futures::future::join_all(tail))
            .await
            .map_err(|_| {
                format!(
                    "calls after the storm hang; snapshot {:?}",
                    bulkhead.snapshot()
                )
            })?;
        for t in tail {
            let result = t.map_err(|e| e.to_string())?;
            if let Err(e) = result {
                if !e.is::<BulkheadFull>() {
                    return Err(format!("tail call failed: {e}"));
                }
            }
        }
        Ok(())
    });
    stop.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    drop(runtime);
    outcome.unwrap();
    let over = inner.over.lock().unwrap();
    assert!(
        over.is_empty(),
        "limit exceeded {} times, e.g. {:?}",
        over.len(),
        &over[..over.len().min(3)]
    );
    let bad = bad_snapshots.lock().unwrap();
    assert!(
        bad.is_empty(),
        "snapshots with available > max: {:?}",
        &bad[..bad.len().min(3)]
    );
    let s = bulkhead.snapshot();
    assert_eq!(s.max_allowed_concurrent_calls, 3);
    assert_eq!(s.available_concurrent_calls, 3, "{s:?}");
    assert_eq!(s.queue_depth, 0, "{s:?}");
    assert_eq!(s.total_permitted, s.total_finished, "{s:?}");
    assert_eq!(
        permitted.load(Ordering::SeqCst),
        finished.load(Ordering::SeqCst)
    );
    assert_eq!(permitted.load(Ordering::SeqCst), s.total_permitted);
    assert_eq!(inner.live.load(Ordering::SeqCst), 0);
}

#[test]
fn resize_storm_on_a_queue_keeps_the_limit_and_releases_each_permit_once() {
    for seed in [0x5EED_0001, 0xC0FF_EE02] {
        storm(Bulkhead::queue("storm-q", 2, 8), seed);
    }
}

#[test]
fn resize_storm_on_a_semaphore_keeps_the_limit_and_releases_each_permit_once() {
    for seed in [0xBEEF_0003, 0xFACE_0004] {
        storm(
            Bulkhead::semaphore("storm-s", 2).max_wait(Duration::from_micros(800)),
            seed,
        );
    }
}
