//! Calls through a tower service, for the benchmarks of services (`bulkhead.rs`,
//! `resilience.rs`, `overload.rs`): from several threads at once (over loopback with `reqwest`:
//! `loopback.rs`).

use std::sync::Barrier;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

/// Runs `iters` calls (`call` with the call's index) on each of `threads` threads, each on a
/// clone of `service` (one limit, budget or breaker for all), inside `runtime`; returns the
/// slowest thread's time, so the figure is the time per call while the others call too.
pub fn on_threads<S: Clone + Send>(
    runtime: &tokio::runtime::Handle,
    service: &S,
    threads: usize,
    iters: u64,
    call: impl Fn(&mut S, &mut Context<'_>, u64) + Sync,
) -> Duration {
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (mut service, barrier, call) = (service.clone(), &barrier, &call);
                scope.spawn(move || {
                    let _runtime = runtime.enter();
                    let mut cx = Context::from_waker(Waker::noop());
                    barrier.wait();
                    let start = Instant::now();
                    for n in 0..iters {
                        call(&mut service, &mut cx, n);
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .max()
            .unwrap()
    })
}

/// A tokio runtime on the calling thread, with its I/O and timers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
