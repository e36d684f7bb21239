//! The limiter core against governor and against the floor, in one run.
//!
//! ```sh
//! cargo bench --bench limiter -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! * `direct/*`: one check of a direct (single-key) limiter, uncontended and from 2 threads; the
//!   floor is one reading of the default clock plus one atomic compare-and-swap, the least any
//!   GCRA check on that clock can do.
//! * `bulwark` rows run on the default [`SystemClock`] (quanta's, as governor's default is);
//!   `bulwark_instant_clock` rows run the same limiter on [`InstantClock`] (std's `Instant`).
//! * `keyed/*`: one check of a keyed limiter over 100 000 keys already present, from 1 and 2
//!   threads.
//! * `clock/*`: one reading of a clock: quanta's `Clock::now` and `Clock::raw` (and `raw`
//!   scaled to nanoseconds, what [`SystemClock`] does), std's `Instant::now`, and the crate's
//!   two clocks.
//!
//! With `CHECKS=n` in the environment it runs no benchmark but `n` checks of the contender
//! named by `CHECK` (see [`count`]) on one thread, for valgrind to count instructions: run it
//! twice, with two values of `n`, and divide the difference in instructions by the difference
//! in checks, which leaves out start-up and set-up.
//!
//! ```sh
//! cargo bench --bench limiter --no-run
//! for n in 1000000 2000000; do
//!   CHECKS=$n CHECK=direct-manual valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/deps/limiter-* 2>&1 | grep 'Collected'
//! done
//! ```

#[path = "support/threaded.rs"]
mod threaded;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, BenchmarkId, Criterion};
use threaded::threaded;
use tower_bulwark::{
    clock::{Clock, InstantClock, ManualClock, SystemClock},
    DirectRateLimiter, KeyedRateLimiter, Quota,
};

const KEYS: u32 = 100_000;
/// The one key of the `hot` counts.
const HOT_KEY: u32 = 7;

fn wide_quota() -> Quota {
    // Never refuses during a bench run: every check takes the admitting (writing) path.
    Quota::per_second(u32::MAX).unwrap()
}

fn governor_quota() -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(u32::MAX).unwrap())
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
        let ours_instant = DirectRateLimiter::builder(wide_quota())
            .clock(InstantClock::new())
            .build();
        g.bench_function(BenchmarkId::new("bulwark_instant_clock", threads), |b| {
            let l = ours_instant.clone();
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
        let clock = SystemClock::new();
        let cell = Arc::new(AtomicU64::new(0));
        g.bench_function(BenchmarkId::new("floor", threads), |b| {
            let cell = Arc::clone(&cell);
            b.iter_custom(move |iters| {
                let cell = Arc::clone(&cell);
                threaded(iters, threads, move |_| {
                    let now = clock.now();
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
        let ours_instant = KeyedRateLimiter::<u32>::builder(wide_quota())
            .clock(InstantClock::new())
            .build();
        for k in 0..KEYS {
            ours_instant.check(&k);
        }
        g.bench_function(BenchmarkId::new("bulwark_instant_clock", threads), |b| {
            let l = ours_instant.clone();
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
        // The keyed floor: one clock read, one multiplicative hash, one load of a slot that holds
        // the key and its state together (a table of 2^17 slots, 2 MiB, at load 0.76), one
        // compare-and-swap. No lock, no probing beyond the home slot (keys 0..KEYS never
        // collide under this hash and table size), no decision: the least a keyed check over a
        // table of this size can cost, whatever its design.
        let slots: Arc<Vec<(u32, AtomicU64)>> = {
            let mut v: Vec<(u32, AtomicU64)> = (0..1u32 << 17)
                .map(|_| (u32::MAX, AtomicU64::new(0)))
                .collect();
            for k in 0..KEYS {
                v[floor_slot(k)].0 = k;
            }
            Arc::new(v)
        };
        let clock = SystemClock::new();
        g.bench_function(BenchmarkId::new("floor", threads), |b| {
            let slots = Arc::clone(&slots);
            b.iter_custom(move |iters| {
                let slots = Arc::clone(&slots);
                threaded(iters, threads, move |i| {
                    let now = clock.now();
                    let key = key_of(i);
                    let (k, state) = &slots[floor_slot(key)];
                    assert_eq!(*k, key);
                    let cur = state.load(Ordering::Relaxed);
                    let _ = black_box(state.compare_exchange(
                        cur,
                        now,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    ));
                })
            })
        });
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

/// The home slot of `key` in the keyed floor's table of 2^17 slots.
fn floor_slot(key: u32) -> usize {
    // Keys below 2^17 times an odd constant, modulo 2^17, are a permutation: no collisions.
    (key.wrapping_mul(0x9E37_79B1) & ((1 << 17) - 1)) as usize
}

/// Runs `checks` checks of contender `check` on this thread (see the module's docs): `direct`,
/// `keyed` (100 000 keys, visited as in `keyed_100k`), `hot` (one key) or `governor-direct`,
/// `governor-keyed`, `governor-hot`;
/// the bulwark ones take a clock suffix, `-system`, `-instant` or `-manual` (a clock that stands
/// still, to count the limiter's own instructions).
fn count(check: &str, checks: u64) {
    let key_of = |i: u64| ((i.wrapping_mul(2_654_435_761)) % u64::from(KEYS)) as u32;
    macro_rules! direct {
        ($l:expr) => {{
            let l = $l;
            for _ in 0..checks {
                black_box(l.check());
            }
        }};
    }
    macro_rules! keyed {
        ($l:expr) => {{
            let l = $l;
            for k in 0..KEYS {
                l.check(&k);
            }
            for i in 0..checks {
                black_box(l.check(&key_of(i)));
            }
        }};
    }
    macro_rules! hot {
        ($l:expr) => {{
            let l = $l;
            for _ in 0..checks {
                black_box(l.check(&HOT_KEY));
            }
        }};
    }
    let builder = || DirectRateLimiter::builder(wide_quota());
    let keyed_builder = || KeyedRateLimiter::<u32>::builder(wide_quota());
    match check {
        "direct-system" => direct!(builder().build()),
        "direct-instant" => direct!(builder().clock(InstantClock::new()).build()),
        "direct-manual" => direct!(builder().clock(ManualClock::new()).build()),
        "keyed-system" => keyed!(keyed_builder().build()),
        "keyed-instant" => keyed!(keyed_builder().clock(InstantClock::new()).build()),
        "keyed-manual" => keyed!(keyed_builder().clock(ManualClock::new()).build()),
        "hot-system" => hot!(keyed_builder().build()),
        "hot-manual" => hot!(keyed_builder().clock(ManualClock::new()).build()),
        "governor-direct" => {
            let l = governor::RateLimiter::direct(governor_quota());
            for _ in 0..checks {
                let _ = black_box(l.check());
            }
        }
        "governor-keyed" => {
            let l = governor::RateLimiter::keyed(governor_quota());
            for k in 0..KEYS {
                let _ = l.check_key(&k);
            }
            for i in 0..checks {
                let _ = black_box(l.check_key(&key_of(i)));
            }
        }
        "governor-hot" => {
            let l = governor::RateLimiter::keyed(governor_quota());
            for _ in 0..checks {
                let _ = black_box(l.check_key(&HOT_KEY));
            }
        }
        other => panic!("unknown CHECK {other:?}"),
    }
}

/// `checks` checks from each of `threads` threads on one limiter: `hot-system`, `direct-system`,
/// `governor-hot` or `governor-direct`.
fn count_shared(check: &str, checks: u64, threads: usize) {
    let run = |f: &(dyn Fn() + Sync)| {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| (0..checks).for_each(|_| f()));
            }
        })
    };
    match check {
        "hot-system" => {
            let l = KeyedRateLimiter::<u32>::new(wide_quota());
            run(&|| {
                black_box(l.check(&HOT_KEY));
            });
        }
        "direct-system" => {
            let l = DirectRateLimiter::new(wide_quota());
            run(&|| {
                black_box(l.check());
            });
        }
        "governor-hot" => {
            let l = governor::RateLimiter::keyed(governor_quota());
            run(&|| drop(black_box(l.check_key(&HOT_KEY))));
        }
        "governor-direct" => {
            let l = governor::RateLimiter::direct(governor_quota());
            run(&|| drop(black_box(l.check())));
        }
        other => panic!("unknown CHECK {other:?} for COUNT_THREADS"),
    }
}

fn clock(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    let quanta = quanta::Clock::new();
    g.bench_function("quanta_now", |b| b.iter(|| black_box(quanta.now())));
    g.bench_function("quanta_raw", |b| b.iter(|| black_box(quanta.raw())));
    let origin = quanta.raw();
    g.bench_function("quanta_raw_as_nanos", |b| {
        b.iter(|| black_box(quanta.delta_as_nanos(origin, quanta.raw())))
    });
    g.bench_function("instant_now", |b| b.iter(|| black_box(Instant::now())));
    let system = SystemClock::new();
    g.bench_function("system_clock", |b| b.iter(|| black_box(system.now())));
    let instant = InstantClock::new();
    g.bench_function("instant_clock", |b| b.iter(|| black_box(instant.now())));
    g.finish();
}

criterion_group!(benches, direct, keyed, clock);

fn main() {
    if let Ok(checks) = std::env::var("CHECKS") {
        let checks = checks.parse().expect("CHECKS is a number");
        let check = std::env::var("CHECK").unwrap_or_else(|_| "direct-manual".to_owned());
        // `COUNT_THREADS=n` runs the count on n threads at once, each `checks` checks on its own
        // limiter.s clone... of one shared limiter (for `perf stat` of cycles under contention).
        let threads: usize = std::env::var("COUNT_THREADS").map_or(1, |n| n.parse().unwrap());
        if threads == 1 {
            count(&check, checks);
        } else {
            count_shared(&check, checks, threads);
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
