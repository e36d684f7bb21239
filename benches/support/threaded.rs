//! Calls spread over threads released together, for the multi-thread benchmarks
//! (`limiter.rs`, `contention.rs`).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Runs `iters` calls of `f` (given the call's index) split over `threads` threads released
/// together, and returns the wall time: the time per call is then wall / iters, the reciprocal
/// of the total throughput. Each thread makes `iters / threads` calls, rounded up.
pub fn threaded(iters: u64, threads: usize, f: impl Fn(u64) + Send + Sync + 'static) -> Duration {
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let per = iters.div_ceil(threads as u64);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (f, barrier) = (Arc::clone(&f), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let base = t as u64 * per;
                for i in 0..per {
                    f(base + i);
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
}
