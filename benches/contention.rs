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
//!
//! On a shared virtual machine, where the cost of moving a cache line between two vCPUs changes
//! from one second to the next, criterion's runs of one contender after the other can differ by
//! two times. `PAIRED=rounds` measures instead in rounds that alternate the two contenders on
//! the same threads (a batch of `PAIRED_CALLS` checks a thread each, 200 000 by default) and
//! prints each one's median throughput and the median and quartiles of the rounds' ratios:
//!
//! ```sh
//! PAIRED=40 THREADS=2 cargo bench --bench contention -- hot_key
//! ```

#[path = "support/threaded.rs"]
mod threaded;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::time::Instant;

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

/// One pair of contenders, bulwark's and governor's checks.
type Pair = [Check; 2];

/// A pair of checks: `ours` and `theirs`, each given the call's index.
fn pair(
    ours: impl Fn(u64) + Send + Sync + 'static,
    theirs: impl Fn(u64) + Send + Sync + 'static,
) -> Pair {
    [Arc::new(ours), Arc::new(theirs)]
}

fn direct() -> Pair {
    let ours = DirectRateLimiter::new(wide_quota());
    let gov = governor::RateLimiter::direct(governor_quota());
    pair(
        move |_| {
            black_box(ours.check());
        },
        move |_| {
            let _ = black_box(gov.check());
        },
    )
}

/// One hot key, on `ours` and `gov`.
fn hot_key(ours: KeyedRateLimiter<u32>, gov: governor::DefaultKeyedRateLimiter<u32>) -> Pair {
    pair(
        move |_| {
            black_box(ours.check(&7));
        },
        move |_| {
            let _ = black_box(gov.check_key(&7u32));
        },
    )
}

fn many_keys() -> Pair {
    // Keys visited in a scattered order so that caches flatter neither side.
    let key_of = |i: u64| ((i.wrapping_mul(2_654_435_761)) % u64::from(KEYS)) as u32;
    let ours = KeyedRateLimiter::<u32>::new(wide_quota());
    let gov = governor::RateLimiter::keyed(governor_quota());
    for k in 0..KEYS {
        ours.check(&k);
        let _ = gov.check_key(&k);
    }
    pair(
        move |i| {
            black_box(ours.check(&key_of(i)));
        },
        move |i| {
            let _ = black_box(gov.check_key(&key_of(i)));
        },
    )
}

/// Every group: a direct limiter, one hot key on a quota that never refuses, one hot key under
/// quotas the threads far exceed (most checks are refusals, which write nothing shared,
/// governor's and ours alike), and 100 000 keys.
fn contenders() -> Vec<(String, Pair)> {
    let mut groups = vec![
        ("contention_direct".to_owned(), direct()),
        (
            "contention_hot_key".to_owned(),
            hot_key(
                KeyedRateLimiter::new(wide_quota()),
                governor::RateLimiter::keyed(governor_quota()),
            ),
        ),
    ];
    for per_second in [5_000, 50_000, 500_000] {
        let ours = KeyedRateLimiter::new(Quota::per_second(per_second).unwrap());
        let gov = governor::RateLimiter::keyed(governor::Quota::per_second(
            NonZeroU32::new(per_second).unwrap(),
        ));
        groups.push((
            format!("contention_hot_key_{per_second}"),
            hot_key(ours, gov),
        ));
    }
    groups.push(("contention_100k_keys".to_owned(), many_keys()));
    groups
}

fn all(c: &mut Criterion) {
    for (group, [ours, theirs]) in contenders() {
        contend(c, &group, &[("bulwark", ours), ("governor", theirs)]);
    }
}

criterion_group!(benches, all);

/// Runs `rounds` rounds of `calls` checks a thread on `threads` threads, the two contenders
/// alternating; returns each contender's times of its rounds (its first two, a warm-up, left
/// out).
fn alternate(pair: Pair, threads: usize, rounds: usize, calls: u64) -> [Vec<f64>; 2] {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (barrier, pair) = (Arc::clone(&barrier), pair.clone());
            std::thread::spawn(move || {
                for round in 0..rounds * 2 {
                    barrier.wait();
                    let base = t as u64 * calls;
                    for i in 0..calls {
                        pair[round % 2](base + i);
                    }
                    barrier.wait();
                }
            })
        })
        .collect();
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..rounds * 2 {
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        if round >= 4 {
            times[round % 2].push(start.elapsed().as_secs_f64());
        }
    }
    for worker in workers {
        worker.join().unwrap();
    }
    times
}

/// The `q`-quantile of `values`.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// `PAIRED=rounds`: each group's contenders in alternating rounds (see the module's docs).
fn paired(rounds: usize, filter: Option<&str>) {
    let calls: u64 = std::env::var("PAIRED_CALLS").map_or(200_000, |n| n.parse().unwrap());
    let rounds = rounds.max(3);
    for (group, pair) in contenders() {
        if filter.is_some_and(|f| !group.contains(f)) {
            continue;
        }
        for threads in thread_counts() {
            let [ours, theirs] = alternate(pair.clone(), threads, rounds, calls);
            let checks = (calls * threads as u64) as f64;
            let ratios: Vec<f64> = theirs.iter().zip(&ours).map(|(t, o)| t / o).collect();
            println!(
                "{group}/{threads}: bulwark {:.1} M/s, governor {:.1} M/s; bulwark / governor, by round: median {:.2} (quartiles {:.2}-{:.2})",
                checks / quantile(&ours, 0.5) / 1e6,
                checks / quantile(&theirs, 0.5) / 1e6,
                quantile(&ratios, 0.5),
                quantile(&ratios, 0.25),
                quantile(&ratios, 0.75),
            );
        }
    }
}

fn main() {
    if let Ok(rounds) = std::env::var("PAIRED") {
        let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
        paired(rounds.parse().unwrap(), filter.as_deref());
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
