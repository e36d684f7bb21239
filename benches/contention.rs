//! Checks per second under contention, against governor in the same run: a direct limiter, one
//! hot key of a keyed limiter (on a quota that never refuses, and on quotas of 5 000, 50 000 and
//! 500 000 a second that the threads far exceed), and 100 000 keys, from 1 thread up to 16 (as
//! many as the machine has cores, no more).
//!
//! ```sh
//! cargo bench --bench contention -- --warm-up-time 1 --measurement-time 2
//! python3 benches/contention_table.py   # the ratios, from criterion's estimates
//! ```
//!
//! Every thread calls the public API in a loop; on a quota that never refuses every check takes
//! the admitting (writing) path, the one that contends; criterion reports the time per
//! check over all threads together (its reciprocal is the throughput printed as elements per
//! second). `THREADS=1,2,4` in the environment picks the thread counts.

#[path = "support/threaded.rs"]
mod threaded;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use threaded::threaded;
use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Quota};

const KEYS: u32 = 100_000;

fn wide_quota() -> Quota {
    Quota::per_second(u32::MAX).unwrap()
}

fn governor_quota() -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(u32::MAX).unwrap())
}

/// The thread counts to run: `THREADS` if set, else 1, 2, 4, 8 and 16, up to the cores here.
fn thread_counts() -> Vec<usize> {
    if let Ok(list) = std::env::var("THREADS") {
        return list.split(',').map(|n| n.trim().parse().unwrap()).collect();
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    [1, 2, 4, 8, 16]
        .into_iter()
        .filter(|&n| n <= cores)
        .collect()
}

/// One contender's check, called with the index of the call.
type Check = Arc<dyn Fn(u64) + Send + Sync>;

/// Benchmarks each of `contenders` from each thread count in `group`, the contenders one after
/// the other at each count (so that a drift of the machine touches both alike).
fn contend(c: &mut Criterion, group: &str, contenders: &[(&str, Check)]) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    for threads in thread_counts() {
        for (name, check) in contenders {
            g.bench_function(BenchmarkId::new(*name, threads), |b| {
                b.iter_custom(|iters| {
                    let check = Arc::clone(check);
                    threaded(iters, threads, move |i| check(i))
                })
            });
        }
    }
    g.finish();
}

fn direct(c: &mut Criterion) {
    let ours = DirectRateLimiter::new(wide_quota());
    let gov = governor::RateLimiter::direct(governor_quota());
    let bulwark: Check = Arc::new(move |_| {
        black_box(ours.check());
    });
    let governor: Check = Arc::new(move |_| {
        let _ = black_box(gov.check());
    });
    contend(
        c,
        "contention_direct",
        &[("bulwark", bulwark), ("governor", governor)],
    );
}

fn hot_key(c: &mut Criterion) {
    let ours = KeyedRateLimiter::<u32>::new(wide_quota());
    let gov = governor::RateLimiter::keyed(governor_quota());
    let bulwark: Check = Arc::new(move |_| {
        black_box(ours.check(&7));
    });
    let governor: Check = Arc::new(move |_| {
        let _ = black_box(gov.check_key(&7u32));
    });
    contend(
        c,
        "contention_hot_key",
        &[("bulwark", bulwark), ("governor", governor)],
    );
}

/// One hot key under quotas the threads far exceed: most checks are refusals, which write
/// nothing shared (governor's and ours alike).
fn hot_key_at_quotas(c: &mut Criterion) {
    for per_second in [5_000, 50_000, 500_000] {
        let ours = KeyedRateLimiter::<u32>::new(Quota::per_second(per_second).unwrap());
        let gov = governor::RateLimiter::keyed(governor::Quota::per_second(
            NonZeroU32::new(per_second).unwrap(),
        ));
        let bulwark: Check = Arc::new(move |_| {
            black_box(ours.check(&7));
        });
        let governor: Check = Arc::new(move |_| {
            let _ = black_box(gov.check_key(&7u32));
        });
        let group = format!("contention_hot_key_{per_second}");
        contend(c, &group, &[("bulwark", bulwark), ("governor", governor)]);
    }
}

fn many_keys(c: &mut Criterion) {
    // Keys visited in a scattered order so that caches flatter neither side.
    let key_of = |i: u64| ((i.wrapping_mul(2_654_435_761)) % u64::from(KEYS)) as u32;
    let ours = KeyedRateLimiter::<u32>::new(wide_quota());
    let gov = governor::RateLimiter::keyed(governor_quota());
    for k in 0..KEYS {
        ours.check(&k);
        let _ = gov.check_key(&k);
    }
    let bulwark: Check = Arc::new(move |i| {
        black_box(ours.check(&key_of(i)));
    });
    let governor: Check = Arc::new(move |i| {
        let _ = black_box(gov.check_key(&key_of(i)));
    });
    contend(
        c,
        "contention_100k_keys",
        &[("bulwark", bulwark), ("governor", governor)],
    );
}

criterion_group!(benches, direct, hot_key, hot_key_at_quotas, many_keys);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
