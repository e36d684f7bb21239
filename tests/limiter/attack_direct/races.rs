//! Races and quota changes on a direct limiter (sections 1 to 6).

use super::*;

// 1. N threads racing for L get exactly L (clones on different threads, a frozen clock).

fn clones_racing_at_one_instant<A: Algorithm>() {
    let clock = ManualClock::new();
    clock.set(Duration::from_millis(1_234));
    let limiter = direct::<A, _>(quota(37, S, 37, 0), clock);
    let threads = 4u64;
    let barrier = Barrier::new(threads as usize);
    let taken: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (l, barrier) = (limiter.clone(), &barrier);
                s.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t + 1) * 7_919));
                    barrier.wait();
                    let mut got = 0u64;
                    for _ in 0..300 {
                        let cost = 1 + rng.below(4) as u32;
                        if l.check_n(cost).unwrap().allowed {
                            got += u64::from(cost);
                        }
                    }
                    got
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_taken_and_left_are(&limiter, taken, 37);
}

// 2. Differential: the direct limiter (rule in a sequence lock, GCRA word and reading in one
//    128-bit word) decides exactly as a keyed limiter's one key (rule behind a lock, word and
//    reading apart), under stale readings, reservations, refunds, settles and quota changes.

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Check { stale: u64, cost: u32 },
    Reserve { stale: u64, cost: u32 },
    Refund { n: usize, stale: u64, cost: u32 },
    Settle { n: usize, stale: u64, cost: u32 },
    Change { which: usize, stale: u64 },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let stale = prop_oneof![Just(0u64), 0..=40_000u64];
    prop::collection::vec(
        prop_oneof![
            (0..=30_000u64).prop_map(Op::Advance),
            (stale.clone(), 1..=9u32).prop_map(|(stale, cost)| Op::Check { stale, cost }),
            (stale.clone(), 1..=9u32).prop_map(|(stale, cost)| Op::Reserve { stale, cost }),
            (any::<usize>(), stale.clone(), 0..=12u32).prop_map(|(n, stale, cost)| Op::Refund {
                n,
                stale,
                cost
            }),
            (any::<usize>(), stale.clone(), 0..=20u32).prop_map(|(n, stale, cost)| Op::Settle {
                n,
                stale,
                cost
            }),
            (0..3usize, stale).prop_map(|(which, stale)| Op::Change { which, stale }),
        ],
        1..80,
    )
}

fn direct_matches_keyed<A: Algorithm>(
    quotas: &[Quota; 3],
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let (dc, kc) = (Dial::at(1_000_000), Dial::at(1_000_000));
    let d = direct::<A, _>(quotas[0], dc.clone());
    let k = KeyedRateLimiter::<u8>::builder(quotas[0])
        .algorithm::<A>()
        .clock(kc.clone())
        .build();
    let set = |n: u64| {
        dc.set(n);
        kc.set(n);
    };
    let mut fresh = 1_000_000u64;
    let mut held: Vec<(Decision, Decision, u32)> = Vec::new();
    let nm = name::<A>();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Advance(by) => fresh += by,
            Op::Check { stale, cost } => {
                set(fresh.saturating_sub(stale));
                let (a, b) = (d.check_n(cost), k.check_n(&0, cost));
                prop_assert_eq!(&a, &b, "{}: op {} {:?}", nm, i, op);
                if let (Ok(a), Ok(b)) = (a, b) {
                    if a.allowed {
                        held.push((a, b, cost));
                    }
                }
            }
            Op::Reserve { stale, cost } => {
                set(fresh.saturating_sub(stale));
                let a = reserve(&d, cost);
                let b = Limiter::<u8>::reserve_now(&k, &0, cost)
                    .unwrap()
                    .map_err(|e| e.to_string());
                prop_assert_eq!(&a, &b, "{}: op {} {:?}", nm, i, op);
                if let (Ok(a), Ok(b)) = (a, b) {
                    if a.allowed {
                        held.push((a, b, cost));
                    }
                }
            }
            Op::Refund { n, stale, cost } if !held.is_empty() => {
                let (a, b, _) = held.remove(n % held.len());
                set(fresh.saturating_sub(stale));
                let (ra, rb) = (refund(&d, cost, a), Limiter::<u8>::refund(&k, &0, cost, b));
                prop_assert_eq!(ra, rb, "{}: op {} {:?}", nm, i, op);
            }
            Op::Settle { n, stale, cost } if !held.is_empty() => {
                let (a, b, estimate) = held.remove(n % held.len());
                set(fresh.saturating_sub(stale));
                let sa = settle(&d, estimate, a, cost);
                let sb = Limiter::<u8>::settle(&k, &0, estimate, b, cost);
                prop_assert_eq!(sa, sb, "{}: op {} {:?}", nm, i, op);
            }
            Op::Change { which, stale } => {
                set(fresh.saturating_sub(stale));
                d.set_quota(quotas[which]);
                k.set_quota(quotas[which]);
                prop_assert_eq!(d.quota(), k.quota());
            }
            _ => {}
        }
    }
    // Whatever is left, both admit alike from here on.
    set(fresh);
    for _ in 0..40 {
        prop_assert_eq!(d.check(), k.check(&0), "{}: final drain", nm);
    }
    Ok(())
}

fn small_quota() -> impl Strategy<Value = Quota> {
    (1u32..8, 1_000u64..50_000, 1u32..10, 0u64..3)
        .prop_map(|(p, period, burst, waits)| quota(p, period, burst, waits * period + waits * 13))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn attack_direct_decides_as_a_keyed_limiters_one_key_through_quota_changes(
        q0 in small_quota(), q1 in small_quota(), q2 in small_quota(), which in 0usize..5,
        ops in ops(),
    ) {
        let qs = [q0, q1, q2];
        match which {
            0 => direct_matches_keyed::<Gcra>(&qs, &ops)?,
            1 => direct_matches_keyed::<FixedWindow>(&qs, &ops)?,
            2 => direct_matches_keyed::<SlidingLog>(&qs, &ops)?,
            3 => direct_matches_keyed::<SlidingCounter>(&qs, &ops)?,
            _ => direct_matches_keyed::<Metered>(&qs, &ops)?,
        }
    }
}

// 3. Decisions racing changes between two quotas that differ in every figure are each made by
//    one whole quota: limit, remaining, reset, wait and the capacity error all of one of them.

/// 10 per second, burst 4, waits up to 250 ms (T = 100 ms); 1 000 per 3 s, burst 700, waits up
/// to 20 ms (T = 3 ms).
fn two_quotas() -> [Quota; 2] {
    [quota(10, S, 4, 250 * MS), quota(1_000, 3 * S, 700, 20 * MS)]
}

/// The quota of `qs` whose limit `d` tells (GCRA: the burst; windows: the permits).
fn quota_of<A>(qs: &[Quota; 2], d: &Decision) -> Quota {
    let limit_of = |q: &Quota| {
        u64::from(if is_gcra::<A>() {
            q.burst()
        } else {
            q.permits()
        })
    };
    *qs.iter()
        .find(|q| limit_of(q) == d.limit)
        .unwrap_or_else(|| panic!("{}: a limit of neither quota: {d:?}", name::<A>()))
}

/// Asserts `d`, a decision on `cost` permits (`waiting`: it could wait), is one whole quota's.
fn assert_of_one_quota<A>(qs: &[Quota; 2], d: &Decision, cost: u32, waiting: bool) {
    let n = name::<A>();
    let q = quota_of::<A>(qs, d);
    let cap = if is_gcra::<A>() {
        q.burst()
    } else {
        q.permits()
    };
    assert!(
        cost <= cap,
        "{n}: cost {cost} decided by a quota of capacity {cap}: {d:?}"
    );
    assert!(d.remaining <= d.limit, "{n}: {d:?}");
    assert!(
        d.wait <= q.max_wait(),
        "{n}: waits past {:?}: {d:?}",
        q.max_wait()
    );
    if !waiting {
        assert!(d.wait.is_zero(), "{n}: a check that waits: {d:?}");
    }
    if !is_gcra::<A>() || name::<A>() == "Metered" {
        return;
    }
    // GCRA's figures all derive from one TAT by one interval and one horizon.
    let t = q.emission_interval().as_nanos() as u64;
    let horizon = t * u64::from(q.burst());
    let reset = d.reset_after.as_nanos() as u64;
    if d.allowed && d.wait.is_zero() {
        assert!(
            reset <= horizon,
            "{n}: reset past the horizon {horizon}: {d:?}"
        );
        assert_eq!(d.remaining, (horizon - reset) / t, "{n}: {d:?}");
    } else if d.allowed {
        assert_eq!(reset, d.wait.as_nanos() as u64 + horizon, "{n}: {d:?}");
    } else {
        assert_eq!(d.remaining, horizon.saturating_sub(reset) / t, "{n}: {d:?}");
        let retry = d.retry_after.as_nanos() as u64;
        assert_eq!(retry + horizon, reset + u64::from(cost) * t, "{n}: {d:?}");
    }
}

fn decisions_racing_changes_in_every_figure<A: Algorithm>() {
    let qs = two_quotas();
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(5));
    let limiter = direct::<A, _>(qs[0], clock.clone());
    let caps = [capacity(&limiter), {
        limiter.set_quota(qs[1]);
        capacity(&limiter)
    }];
    let costs = [1u32, 3, 4, 5, 9, 10, 11, 600, 700, 701, 999, 1_000, 1_001];
    let done = AtomicBool::new(false);
    let decided = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (l, clock, done, decided) = (limiter.clone(), &clock, &done, &decided);
            s.spawn(move || {
                let mut rng = Rng(0xDEAD_BEEF ^ ((t + 3) * 104_729));
                while !done.load(Ordering::Relaxed) {
                    clock.advance(Duration::from_nanos(rng.below(3 * MS)));
                    let cost = rng.pick(&costs);
                    let waiting = rng.below(2) == 0;
                    let d = if waiting {
                        reserve(&l, cost).map_err(|e| {
                            assert!(e.contains("capacity"), "{e}");
                        })
                    } else {
                        l.check_n(cost).map_err(|e: InsufficientCapacity| {
                            assert!(caps.contains(&e.capacity()), "{}: {e:?}", name::<A>());
                            assert!(e.requested() > e.capacity(), "{e:?}");
                        })
                    };
                    if let Ok(d) = d {
                        assert_of_one_quota::<A>(&qs, &d, cost, waiting);
                        // Give every other admission back, so that both quotas keep deciding.
                        if d.allowed && rng.below(2) == 0 {
                            refund(&l, cost, d);
                        } else if d.allowed && name::<A>() == "Metered" {
                            settle(&l, cost, d, cost / 2);
                        }
                    }
                    decided.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        wait_until(&decided, 100);
        let at_start = decided.load(Ordering::Relaxed);
        for i in 0..4_000 {
            limiter.set_quota(qs[i % 2]);
        }
        // Changes while decisions are made, however the threads were scheduled.
        let mut i = 0;
        while decided.load(Ordering::Relaxed) < at_start + 2_000 {
            limiter.set_quota(qs[i % 2]);
            i += 1;
        }
        done.store(true, Ordering::Relaxed);
    });
}

// 4. Once `set_quota` returns, every decision uses the new quota (or a later one).

fn once_returned_the_new_quota_decides<A: Algorithm>() {
    let clock = ManualClock::new();
    // The i-th quota: i + 1 permits per (i + 1) ms, burst i + 1 (its limit is i + 1 whatever the
    // algorithm), the same interval throughout.
    let nth = |i: u64| quota(i as u32 + 1, (i + 1) * MS, i as u32 + 1, 0);
    let limiter = direct::<A, _>(nth(0), clock.clone());
    let published = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let decided = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            let (l, published, done, decided) = (limiter.clone(), &published, &done, &decided);
            s.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    decided.fetch_add(1, Ordering::Relaxed);
                    let at_least = published.load(Ordering::Acquire);
                    let d = l.check();
                    assert!(
                        d.limit > at_least,
                        "{}: quota #{at_least} had returned, yet decided by limit {}",
                        name::<A>(),
                        d.limit
                    );
                    let q = l.quota();
                    assert!(u64::from(q.permits()) > at_least, "{}: {q:?}", name::<A>());
                    if d.allowed {
                        refund(&l, 1, d);
                    }
                }
            });
        }
        wait_until(&decided, 100);
        for i in 1..2_000u64 {
            limiter.set_quota(nth(i));
            published.store(i, Ordering::Release);
            if i % 64 == 0 {
                // Let the checkers catch up now and then, on two cores or one.
                let seen = decided.load(Ordering::Relaxed);
                wait_until(&decided, seen + 8);
            }
        }
        done.store(true, Ordering::Release);
    });
}

// 5. `check_n` with costs near the capacity while the capacity flips (6 <-> 10, one interval),
//    on a frozen clock: never more than the larger quota, and exactly it once it stays.

fn costs_near_a_flipping_capacity<A: Algorithm>() {
    let clock = ManualClock::new();
    clock.set(Duration::from_millis(250));
    let small = quota(6, 600 * MS, 6, 0);
    let large = quota(10, S, 10, 0);
    let limiter = direct::<A, _>(small, clock);
    let done = AtomicBool::new(false);
    let decided = AtomicU64::new(0);
    let costs = [1u32, 5, 6, 7, 9, 10, 11];
    let taken: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|t| {
                let (l, done, decided) = (limiter.clone(), &done, &decided);
                s.spawn(move || {
                    let mut rng = Rng(0x1234_5678 ^ ((t + 1) * 31));
                    let mut got = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        decided.fetch_add(1, Ordering::Relaxed);
                        let cost = rng.pick(&costs);
                        match l.check_n(cost) {
                            Ok(d) => {
                                assert!(
                                    u64::from(cost) <= d.limit,
                                    "{}: cost {cost} decided by a quota of limit {}",
                                    name::<A>(),
                                    d.limit
                                );
                                if d.allowed {
                                    got += u64::from(cost);
                                }
                            }
                            Err(e) => {
                                assert!(
                                    [6, 10].contains(&e.capacity()) && cost > e.capacity(),
                                    "{}: {e:?}",
                                    name::<A>()
                                );
                            }
                        }
                    }
                    got
                })
            })
            .collect();
        wait_until(&decided, 20);
        for i in 0..3_000 {
            limiter.set_quota(if i % 2 == 0 { large } else { small });
        }
        done.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(
        taken <= 10,
        "{}: {taken} taken while the capacity flipped",
        name::<A>()
    );
    limiter.set_quota(large);
    assert_taken_and_left_are(&limiter, taken, 10);
}

// 6. Settles and refunds of decisions made before a change, applied after it from several
//    threads at once (frozen clock; the interval kept, every other figure changed):
//    settled costs plus what is left is exactly the new quota.

fn settles_of_pre_change_decisions_after_it<A: Algorithm>() {
    let clock = ManualClock::new();
    clock.set(Duration::from_millis(4_321));
    let before = quota(10, S, 10, 0);
    // Twice the permits over twice the period: the same interval for GCRA, a new period for the
    // windows (the window in progress keeps its counts); burst and max_wait differ too.
    let after = quota(20, 2 * S, 20, 300 * MS);
    let limiter = direct::<A, _>(before, clock);
    let threads = 3usize;
    let (taken_all, changed) = (Barrier::new(threads + 1), Barrier::new(threads + 1));
    let spent: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|t| {
                let (l, taken_all, changed) = (limiter.clone(), &taken_all, &changed);
                s.spawn(move || {
                    let mut rng = Rng(0xFEED ^ ((t + 1) * 7_777));
                    let mut mine = Vec::new();
                    for _ in 0..20 {
                        let estimate = 1 + rng.below(4) as u32;
                        let d = l.check_n(estimate).unwrap();
                        if d.allowed {
                            mine.push((d, estimate));
                        }
                    }
                    taken_all.wait();
                    changed.wait();
                    let mut spent = 0u64;
                    for (d, estimate) in mine {
                        let cost = rng.below(2 * u64::from(estimate) + 1) as u32;
                        if rng.below(3) == 0 {
                            assert!(refund(&l, estimate, d));
                        } else {
                            assert!(settle(&l, estimate, d, cost));
                            spent += u64::from(cost);
                        }
                    }
                    spent
                })
            })
            .collect();
        taken_all.wait();
        // Whatever was not taken is taken now, so that the change lands on a full key.
        let rest = drain(&limiter);
        limiter.set_quota(after);
        changed.wait();
        handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>() + rest
    });
    let left = drain(&limiter);
    crate::common::assert_settled_plus_left_is_the_quota::<A>(20, spent, left);
}

attack_tests! {
    attack_clones_racing_at_one_instant_get_exactly_the_limit: five!(clones_racing_at_one_instant),
    attack_decisions_racing_changes_in_every_figure_are_each_of_one_whole_quota: five!(decisions_racing_changes_in_every_figure),
    attack_once_set_quota_returns_every_decision_uses_the_new_quota: five!(once_returned_the_new_quota_decides),
    attack_costs_near_a_flipping_capacity_never_exceed_the_larger_quota: five!(costs_near_a_flipping_capacity),
    attack_settles_of_pre_change_decisions_from_several_threads_after_the_change_are_exact: five!(settles_of_pre_change_decisions_after_it),
}
