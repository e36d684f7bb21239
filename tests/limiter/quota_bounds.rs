//! Quotas at the documented bounds (2^60 ns periods and `max_wait`, burst horizon 2^61 ns, 2^53
//! permits owed) and clocks at and beyond 2^62 ns, every algorithm, with costs up to the capacity,
//! reservations and refunds: no panic (debug builds check overflow), a refusal's `retry_after` is
//! never zero, and at one instant without waiting no more than the capacity is admitted.

use crate::common::for_every_algorithm;
use crate::common::Rng;
use std::time::Duration;

use tower_bulwark::{algorithm::Algorithm, clock::ManualClock, KeyedRateLimiter, Limiter, Quota};

fn quotas(rng: &mut Rng) -> Option<Quota> {
    let span = Quota::MAX_SPAN.as_nanos() as u64;
    let permits = rng.pick(&[1u32, 2, 3, 7, 1 << 20, u32::MAX - 1, u32::MAX]);
    let period = rng.pick(&[1u64, 3, 1 << 20, span / 3, span - 1, span]);
    let mut q = Quota::with_period(permits, Duration::from_nanos(period)).ok()?;
    let burst = rng.pick(&[1u32, 2, permits, u32::MAX]);
    q = q.with_burst(burst).unwrap_or(q);
    let wait = rng.pick(&[0u64, 1, period, span / 2, span]);
    Some(q.with_max_wait(Duration::from_nanos(wait)).unwrap_or(q))
}

fn run<A: Algorithm>(seed: u64) {
    let mut rng = Rng(seed);
    for _ in 0..300 {
        let Some(quota) = quotas(&mut rng) else {
            continue;
        };
        let clock = ManualClock::new();
        let start = rng.pick(&[
            0u64,
            1 << 61,
            (1 << 62) - 1,
            1 << 62,
            u64::MAX / 2,
            u64::MAX - 1,
        ]);
        clock.set(Duration::from_nanos(start));
        let l = KeyedRateLimiter::<u64>::builder(quota)
            .algorithm::<A>()
            .clock(clock.clone())
            .build();
        let capacity = u64::from(match std::any::type_name::<A>() {
            n if n.ends_with("Gcra") => quota.burst(),
            _ => quota.permits(),
        });
        let mut taken = Vec::new();
        let mut at_instant = 0u64;
        let mut refunded = false;
        for _ in 0..40 {
            let cost = rng.pick(&[1u32, 2, quota.burst().min(quota.permits()), u32::MAX]);
            let ctx = format!(
                "{} {quota:?} start {start} cost {cost}",
                std::any::type_name::<A>()
            );
            match l.check_n(&1, cost) {
                Err(_) => {}
                Ok(d) if d.allowed => {
                    if d.wait.is_zero() {
                        at_instant += u64::from(cost);
                    }
                    let _ = d.retry_after_secs();
                    taken.push((cost, d));
                }
                Ok(d) => {
                    assert!(!d.retry_after.is_zero(), "{ctx}: zero retry_after {d:?}");
                    let _ = d.retry_after_secs();
                }
            }
            if quota.max_wait().is_zero() && !refunded {
                assert!(at_instant <= capacity, "{ctx}: {at_instant} at once");
            }
            match rng.next() % 6 {
                0 if !taken.is_empty() => {
                    let (c, d) = taken.swap_remove((rng.next() % taken.len() as u64) as usize);
                    l.refund(&1, c, d);
                    refunded = true;
                }
                1 => {
                    let step = rng.pick(&[1u64, 1 << 30, 1 << 59, 1 << 61, u64::MAX / 4]);
                    let now = clock.elapsed().as_nanos() as u64;
                    clock.set(Duration::from_nanos(now.saturating_add(step)));
                    at_instant = 0;
                    refunded = false;
                }
                _ => {}
            }
        }
    }
}

#[test]
fn quotas_and_clocks_at_the_bounds_never_panic_nor_refuse_with_zero_retry_after() {
    for seed in 1..=8u64 {
        let s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for_every_algorithm!(run(s));
    }
}
