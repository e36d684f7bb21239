//! The limiter core against governor and against the floor, in one run.
//!
//! ```sh
//! cargo bench --bench limiter -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! * `direct/*`: one check of a direct (single-key) limiter, uncontended and from 2 threads; the
//!   floor is one `Instant::now()` plus one atomic compare-and-swap, the least any GCRA check on
//!   the system clock can do.
//! * `keyed/*`: one check of a keyed limiter over 100 000 keys already present, from 1 and 2
//!   threads.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Quota};

const KEYS: u32 = 100_000;

fn wide_quota() -> Quota {
    // Never refuses during a bench run: every check takes the admitting (writing) path.
    Quota::per_second(u32::MAX).unwrap()
}

fn governor_quota() -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(u32::MAX).unwrap())
}

/// Runs `iters` calls of `f` split over `threads` threads released together, and returns the
/// wall time: the time per call is then wall / iters, i.e. the reciprocal of total throughput.
fn threaded(iters: u64, threads: usize, f: impl Fn(u64) + Send + Sync + 'static) -> Duration {
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let per = iters / threads as u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let f = Arc::clone(&f);
            let barrier = Arc::clone(&barrier);
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

fn direct(c: &mut Criterion) {
    let mut g = c.benchmark_group("direct");
    for threads in [1usize, 2] {
        let ours = DirectRateLimiter::new(wide_quota());
        g.bench_function(BenchmarkId::new("bulwark", threads), |b| {
            let l = ours.clone();
            b.iter_custom(move |iters| {
                let l = l.clone();
                threaded(iters, threads, move |_| {
                    black_box(l.check());
                })
            })
        });
        let gov = Arc::new(governor::RateLimiter::direct(governor_quota()));
        g.bench_function(BenchmarkId::new("governor", threads), |b| {
            let l = Arc::clone(&gov);
            b.iter_custom(move |iters| {
                let l = Arc::clone(&l);
                threaded(iters, threads, move |_| {
                    let _ = black_box(l.check());
                })
            })
        });
        let origin = Instant::now();
        let cell = Arc::new(AtomicU64::new(0));
        g.bench_function(BenchmarkId::new("floor", threads), |b| {
            let cell = Arc::clone(&cell);
            b.iter_custom(move |iters| {
                let cell = Arc::clone(&cell);
                threaded(iters, threads, move |_| {
                    let now = origin.elapsed().as_nanos() as u64;
                    let cur = cell.load(Ordering::Relaxed);
                    let _ = black_box(cell.compare_exchange(
                        cur,
                        now,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    ));
                })
            })
        });
    }
    g.finish();
}

fn keyed(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed_100k");
    // Visit keys in a scattered order so that caches do not flatter either side.
    let key_of = |i: u64| ((i.wrapping_mul(2_654_435_761)) % u64::from(KEYS)) as u32;
    for threads in [1usize, 2] {
        let ours = KeyedRateLimiter::<u32>::new(wide_quota());
        for k in 0..KEYS {
            ours.check(&k);
        }
        g.bench_function(BenchmarkId::new("bulwark", threads), |b| {
            let l = ours.clone();
            b.iter_custom(move |iters| {
                let l = l.clone();
                threaded(iters, threads, move |i| {
                    black_box(l.check(&key_of(i)));
                })
            })
        });
        let gov = Arc::new(governor::RateLimiter::keyed(governor_quota()));
        for k in 0..KEYS {
            let _ = gov.check_key(&k);
        }
        g.bench_function(BenchmarkId::new("governor", threads), |b| {
            let l = Arc::clone(&gov);
            b.iter_custom(move |iters| {
                let l = Arc::clone(&l);
                threaded(iters, threads, move |i| {
                    let _ = black_box(l.check_key(&key_of(i)));
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, direct, keyed);
criterion_main!(benches);
