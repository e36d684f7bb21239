//! Second attack on the give-backs: GCRA's "the key's latest admission" test (its TAT and the
//! shard's moved-back mark) under settles to more, quota changes, stale readings, several keys of
//! one shard and threads; the window algorithms' renumbering under keyed limiters, threads, limit
//! changes, boundaries and a full shard; the fixed window's reservations across changes of its
//! limit and period. Each test asserts a promise a user relies on.

use crate::common::reservation_windows::{
    limit_changes_in_a_row, period_changes_in_a_row, waiting, ReservationWindows,
};

use super::*;

fn reserve<A: Algorithm, C: Clock>(
    l: &KeyedRateLimiter<u32, A, C>,
    key: u32,
    cost: u32,
) -> Option<Decision> {
    Limiter::reserve_now(l, &key, cost)
        .expect("in memory")
        .ok()
        .filter(|d| d.allowed)
}

fn drain_key<A: Algorithm, C: Clock>(l: &KeyedRateLimiter<u32, A, C>, key: u32) -> u64 {
    admitted_until_refused(|| l.check(&key).allowed)
}

// ---------------------------------------------------------------------------------------------
// 1. GCRA: any schedule of admissions, reservations, refunds, settles both ways, quota changes
//    (of the interval too) and stale readings, on three keys of one shard, is never more
//    generous than a replay of only what was not given back (settled ones at what they cost,
//    debts charged when they were).

#[derive(Clone, Debug)]
enum G {
    /// Advance (quarter seconds), staleness of the reading (quarter seconds), key, cost.
    Ask(u64, u64, u32, u32),
    /// Advance, staleness, which admission, settled to (0: a refund; more than the estimate:
    /// a debt, settled at the fresh reading).
    Back(u64, u64, usize, u32),
    /// Advance, staleness, which quota.
    Set(u64, u64, usize),
}

fn g_step() -> impl Strategy<Value = G> {
    prop_oneof![
        4 => (0..3u64, 0..3u64, 0..3u32, 1..4u32).prop_map(|(a, s, k, c)| G::Ask(a, s, k, c)),
        3 => (0..3u64, 0..3u64, 0..64usize, 0..6u32).prop_map(|(a, s, n, t)| G::Back(a, s, n, t)),
        1 => (0..3u64, 0..3u64, 0..4usize).prop_map(|(a, s, q)| G::Set(a, s, q)),
    ]
}

fn g_quotas() -> [Quota; 4] {
    [
        quota(1, S, 3, 2 * S),
        quota(2, S, 4, S),
        quota(1, 2 * S, 2, 4 * S),
        quota(1, S, 6, 0),
    ]
}

/// What the replay makes, at the (fresh) reading of the step that made it in the original.
enum Ev {
    Admit {
        id: usize,
        at: u64,
        key: u32,
    },
    Charge {
        id: usize,
        at: u64,
        estimate: u32,
        cost: u32,
    },
    Set {
        q: usize,
        at: u64,
    },
}

/// A GCRA limiter the schedules run on: a keyed one (keys of one shard) or a direct one (its
/// one key, its word beside the latest reading).
trait Subject {
    fn make(q: Quota, clock: Dial) -> Self;
    fn ask(&self, key: u32, cost: u32) -> Option<Decision>;
    fn settle(&self, key: u32, estimate: u32, d: Decision, cost: u32);
    fn set(&self, q: Quota);
    fn drain(&self, key: u32) -> u64;
}

impl Subject for KeyedRateLimiter<u32, Gcra, Dial> {
    fn make(q: Quota, clock: Dial) -> Self {
        keyed::<Gcra, _>(q, clock, 1000, Overflow::default())
    }
    fn ask(&self, key: u32, cost: u32) -> Option<Decision> {
        reserve(self, key, cost)
    }
    fn settle(&self, key: u32, estimate: u32, d: Decision, cost: u32) {
        Limiter::settle(self, &key, estimate, d, cost);
    }
    fn set(&self, q: Quota) {
        self.set_quota(q);
    }
    fn drain(&self, key: u32) -> u64 {
        drain_key(self, key)
    }
}

impl Subject for DirectRateLimiter<Gcra, Dial> {
    fn make(q: Quota, clock: Dial) -> Self {
        DirectRateLimiter::builder(q)
            .algorithm::<Gcra>()
            .clock(clock)
            .build()
    }
    fn ask(&self, _: u32, cost: u32) -> Option<Decision> {
        Limiter::<()>::reserve_now(self, &(), cost)
            .expect("in memory")
            .ok()
            .filter(|d| d.allowed)
    }
    fn settle(&self, _: u32, estimate: u32, d: Decision, cost: u32) {
        Limiter::<()>::settle(self, &(), estimate, d, cost);
    }
    fn set(&self, q: Quota) {
        self.set_quota(q);
    }
    fn drain(&self, _: u32) -> u64 {
        admitted_until_refused(|| self.check().allowed)
    }
}

fn run_gcra<L: Subject>(steps: &[G], keys: u32) {
    let quotas = g_quotas();
    let dial = Dial::default();
    let a = L::make(quotas[0], dial.clone());
    // (key, estimate, replayed cost (0: given back), the decision while not settled).
    let mut made: Vec<(u32, u32, u32, Option<Decision>)> = Vec::new();
    let mut evs = Vec::new();
    let mut log = Vec::new();
    let mut now = 0;
    // Each key's latest reading: what its admissions, give-backs and charges published.
    let mut latest = vec![0; keys as usize];
    let mut cur = 0;
    for s in steps {
        let (G::Ask(adv, stale, ..) | G::Back(adv, stale, ..) | G::Set(adv, stale, _)) = *s;
        now += adv * 250 * MS;
        let reading = now.saturating_sub(stale * 250 * MS);
        dial.set(reading);
        match *s {
            G::Ask(_, _, key, cost) => {
                let key = key % keys;
                if let Some(d) = a.ask(key, cost) {
                    log.push(format!(
                        "{now} (read {reading}): key {key} asks {cost}: {d:?}"
                    ));
                    // Decided as of the key's latest reading, where it is later.
                    let latest = &mut latest[key as usize];
                    *latest = (*latest).max(reading);
                    evs.push(Ev::Admit {
                        id: made.len(),
                        at: *latest,
                        key,
                    });
                    made.push((key, cost, cost, Some(d)));
                }
            }
            G::Back(_, _, n, to) if !made.is_empty() => {
                let i = n % made.len();
                let (key, estimate, _, ref mut d) = made[i];
                let Some(d) = d.take() else { continue };
                if to > estimate {
                    // A debt: at the fresh reading, as the replay charges it.
                    dial.set(now);
                    a.settle(key, estimate, d, to);
                    if to.min(quotas[cur].burst()) > estimate {
                        // A debt was charged (and its reading published).
                        latest[key as usize] = now;
                    }
                    evs.push(Ev::Charge {
                        id: i,
                        at: now,
                        estimate,
                        cost: to,
                    });
                } else {
                    a.settle(key, estimate, d, to);
                    if to < estimate {
                        // A give-back publishes its reading.
                        let latest = &mut latest[key as usize];
                        *latest = (*latest).max(reading);
                    }
                    made[i].2 = to;
                }
                log.push(format!(
                    "{now} (read {}): #{i} settled {estimate} -> {to}",
                    dial.now()
                ));
            }
            G::Back(..) => {}
            G::Set(_, _, q) => {
                cur = q;
                a.set(quotas[q]);
                // A reading older than the change is decided as of it, on every key.
                for latest in &mut latest {
                    *latest = (*latest).max(reading);
                }
                evs.push(Ev::Set { q, at: reading });
                log.push(format!("{now} (read {reading}): quota #{q}"));
            }
        }
    }
    let clock = Dial::default();
    let replay = L::make(quotas[0], clock.clone());
    let mut replayed: Vec<Option<Decision>> = (0..made.len()).map(|_| None).collect();
    for ev in &evs {
        match *ev {
            Ev::Admit { id, at, key } => {
                let cost = made[id].2;
                if cost > 0 {
                    clock.set(at);
                    let d = replay.ask(key, cost);
                    assert!(
                        d.is_some(),
                        "#{id} (key {key}, {cost} at {at}) refused by the replay:\n{}",
                        log.join("\n")
                    );
                    replayed[id] = d;
                }
            }
            Ev::Charge {
                id,
                at,
                estimate,
                cost,
            } => {
                clock.set(at);
                let d = replayed[id].take().unwrap();
                replay.settle(made[id].0, estimate, d, cost);
            }
            Ev::Set { q, at } => {
                clock.set(at);
                replay.set(quotas[q]);
            }
        }
    }
    dial.set(now);
    clock.set(now);
    for key in 0..keys {
        let (got, twin) = (a.drain(key), replay.drain(key));
        assert!(
            got <= twin,
            "key {key}: {got} admitted at the end, {twin} by the replay:\n{}",
            log.join("\n")
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn attack_two_gcra_settles_both_ways_quota_changes_and_stale_readings_on_one_key(
        steps in proptest::collection::vec(g_step(), 1..40)
    ) {
        run_gcra::<KeyedRateLimiter<u32, Gcra, Dial>>(&steps, 1);
    }

    #[test]
    fn attack_two_gcra_direct_settles_both_ways_quota_changes_and_stale_readings(
        steps in proptest::collection::vec(g_step(), 1..40)
    ) {
        run_gcra::<DirectRateLimiter<Gcra, Dial>>(&steps, 1);
    }

    #[test]
    fn attack_two_gcra_settles_both_ways_quota_changes_and_stale_readings_on_three_keys_of_a_shard(
        steps in proptest::collection::vec(g_step(), 1..50)
    ) {
        run_gcra::<KeyedRateLimiter<u32, Gcra, Dial>>(&steps, 3);
    }
}

/// Four workers, each calling `work` over and over with a generator of its own (seeded from
/// `seed`) and what it holds, while `meanwhile` runs on this thread; they stop once it returns.
fn while_workers<H>(
    seed: u64,
    work: impl Fn(&mut Rng, &mut Vec<H>) + Sync,
    meanwhile: impl FnOnce(),
) {
    let (done, start) = (AtomicBool::new(false), Barrier::new(5));
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let (work, done, start) = (&work, &done, &start);
            s.spawn(move || {
                let (mut rng, mut held) = (Rng(seed + w), Vec::new());
                start.wait();
                while !done.load(Ordering::Relaxed) {
                    work(&mut rng, &mut held);
                }
            });
        }
        start.wait();
        meanwhile();
        done.store(true, Ordering::Relaxed);
    });
}

// ---------------------------------------------------------------------------------------------
// 2. GCRA under threads: workers admit, refund and settle (both ways) on three keys of one
//    shard while another thread moves the clock on. What each key kept (admissions not given
//    back, settled ones at their cost) and what it admits at the end never exceed
//    burst + elapsed / T.

#[test]
fn attack_two_gcra_threads_refunding_while_others_admit_never_pass_the_rate() {
    const T: u64 = 10 * MS;
    const BURST: u32 = 4;
    for round in 0..20u64 {
        let clock = ManualClock::new();
        let l = keyed::<Gcra, _>(
            quota(1, T, BURST, 0),
            clock.clone(),
            1000,
            Overflow::default(),
        );
        let kept: [AtomicU64; 3] = Default::default();
        let end = 300 * MS;
        while_workers(
            round * 31 + 1,
            |rng, held: &mut Vec<(u32, u32, Decision)>| {
                let key = rng.below(3) as u32;
                let cost = 1 + rng.below(2) as u32;
                if let Ok(d) = l.check_n(&key, cost) {
                    if d.allowed {
                        kept[key as usize].fetch_add(u64::from(cost), Ordering::SeqCst);
                        held.push((key, cost, d));
                    }
                }
                if !held.is_empty() && rng.below(2) == 0 {
                    let i = rng.below(held.len() as u64) as usize;
                    let (key, cost, d) = held.swap_remove(i);
                    let to = rng.below(u64::from(cost) + 1) as u32;
                    Limiter::settle(&l, &key, cost, d, to);
                    let kept = &kept[key as usize];
                    // Settled to less (a debt may pass the rate: it is never refused).
                    kept.fetch_sub(u64::from(cost - to), Ordering::SeqCst);
                }
            },
            || {
                let mut now = 0;
                while now < end {
                    now += MS / 2;
                    clock.set(Duration::from_nanos(now));
                    std::thread::yield_now();
                }
            },
        );
        for key in 0..3u32 {
            let k = kept[key as usize].load(Ordering::SeqCst);
            let more = drain_key(&l, key);
            let bound = u64::from(BURST) + end / T;
            assert!(
                k + more <= bound,
                "round {round} key {key}: {k} kept + {more} admitted at the end, over \
                 {bound} (burst {BURST} + {end} ns / {T})"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Windows under threads at one instant: workers check, reserve and give back on 16 keys
//    while another thread changes the quota (periods and limits) over and over, the clock
//    standing still. No key keeps more immediate admissions, with what it admits afterwards,
//    than the largest limit.

fn threads_at_one_instant<A: Algorithm>() {
    // Each waiting up to 3 s, but the last, which never waits.
    let mut quotas = [
        (5, S),
        (8, 2 * S),
        (5, 700 * MS),
        (8, 10 * S),
        (3, S),
        (8, S),
    ]
    .map(|(permits, period)| quota(permits, period, permits, 3 * S));
    quotas[5] = quota(8, S, 8, 0);
    for round in 0..10u64 {
        let clock = ManualClock::new();
        // Past the first windows, so that a change can end the window in progress at once.
        clock.set(Duration::from_nanos(5 * S + 300 * MS + round * 37 * MS));
        let l = keyed::<A, _>(quotas[0], clock.clone(), 1000, Overflow::default());
        let kept: Vec<AtomicU64> = (0..16).map(|_| AtomicU64::new(0)).collect();
        while_workers(
            round * 131 + 7,
            |rng, held: &mut Vec<(u32, Decision)>| {
                let key = rng.below(16) as u32;
                if let Some(d) = reserve(&l, key, 1) {
                    if d.wait.is_zero() {
                        kept[key as usize].fetch_add(1, Ordering::SeqCst);
                    }
                    held.push((key, d));
                }
                if !held.is_empty() && rng.below(3) == 0 {
                    let i = rng.below(held.len() as u64) as usize;
                    let (key, d) = held.swap_remove(i);
                    if d.wait.is_zero() {
                        kept[key as usize].fetch_sub(1, Ordering::SeqCst);
                    }
                    Limiter::refund(&l, &key, 1, d);
                }
            },
            || {
                let mut rng = Rng(round + 1000);
                for _ in 0..200 {
                    l.set_quota(quotas[rng.below(quotas.len() as u64) as usize]);
                    std::thread::yield_now();
                }
            },
        );
        for key in 0..16u32 {
            let k = kept[key as usize].load(Ordering::SeqCst);
            let more = drain_key(&l, key);
            assert!(
                k + more <= 8,
                "{} round {round} key {key}: {k} kept + {more} admitted at one instant, the \
                 largest limit 8",
                name::<A>()
            );
        }
    }
}

attack_tests! {
    attack_two_fixed_window_threads_changing_quotas_at_one_instant: [(|| threads_at_one_instant::<FixedWindow>()) as fn()],
    attack_two_sliding_counter_threads_changing_quotas_at_one_instant: [(|| threads_at_one_instant::<SlidingCounter>()) as fn()],
}

// ---------------------------------------------------------------------------------------------
// 4. Windows, one thread: a keyed limiter against a twin that never made the requests given
//    back, through changes of period and of the limit alone, at window boundaries ±1 ns, with
//    reservations, refunds, settles and stale readings, on keys of a shard that may be full
//    (new keys refused, idle ones dropped). Drained at every step, the limiter never admits
//    more than the twin.

fn twin_schedule<A: Algorithm>(max_keys: usize, seeds: std::ops::RangeInclusive<u64>) {
    let quotas = [
        quota(10, S, 10, 3 * S),
        quota(4, S, 4, 3 * S),
        quota(10, 4 * S, 10, 3 * S),
        quota(6, 2 * S, 6, 3 * S),
        quota(10, 250 * MS, 10, 3 * S),
        quota(20, 4 * S, 20, 3 * S),
        quota(3, 2 * S, 3, 3 * S),
    ];
    for seed in seeds {
        let mut rng = Rng(seed);
        let dial = Dial::default();
        let a = keyed::<A, _>(quotas[0], dial.clone(), max_keys, Overflow::RefuseNewKeys);
        let twin = keyed::<A, _>(quotas[0], dial.clone(), 1000, Overflow::RefuseNewKeys);
        let mut now = rng.below(3 * S);
        let mut log = vec![];
        let (mut got, mut twin_got) = (0u64, 0u64);
        // Requests of the limiter the twin never makes, awaiting their give-back.
        let mut pending: Vec<(u32, u32, u32, Decision)> = vec![];
        for i in 0..14 {
            now += rng.pick(&[
                0,
                1,
                100 * MS,
                250 * MS - 1,
                500 * MS,
                S - 1,
                S,
                S + 1,
                2 * S,
            ]);
            let stale = rng.pick(&[0, 0, 0, 1, 300 * MS]);
            dial.set(now.saturating_sub(stale));
            match rng.below(6) {
                0 | 1 => {
                    let q = rng.pick(&quotas);
                    a.set_quota(q);
                    twin.set_quota(q);
                    log.push(format!(
                        "{now}-{stale}: set {}/{:?}",
                        q.permits(),
                        q.period()
                    ));
                }
                2 | 3 => {
                    let key = rng.below(3) as u32;
                    let cost = 1 + rng.below(3) as u32;
                    let immediate = rng.below(2) == 0;
                    let d = if immediate {
                        a.check_n(&key, cost).ok().filter(|d| d.allowed)
                    } else {
                        reserve(&a, key, cost)
                    };
                    log.push(format!("{now}-{stale}: key {key} asks {cost}: {d:?}"));
                    if let Some(d) = d {
                        // What it will keep; the twin asks for that alone, now.
                        let to = if immediate {
                            rng.pick(&[0, 0, cost / 2])
                        } else {
                            0
                        };
                        if to > 0 {
                            got += u64::from(to);
                            if twin.check_n(&key, to).unwrap().allowed {
                                twin_got += u64::from(to);
                            }
                        }
                        pending.push((key, cost, to, d));
                    }
                }
                _ => {
                    if !pending.is_empty() {
                        let j = rng.below(pending.len() as u64) as usize;
                        let (key, cost, to, d) = pending.swap_remove(j);
                        Limiter::settle(&a, &key, cost, d, to);
                        log.push(format!("{now}-{stale}: key {key} settles {cost} -> {to}"));
                    }
                }
            }
            dial.set(now);
            for key in 0..3u32 {
                got += drain_key(&a, key);
                twin_got += drain_key(&twin, key);
            }
            log.push(format!("{now}: {got} against {twin_got}"));
            assert!(
                got <= twin_got,
                "{} max_keys {max_keys} seed {seed} step {i}: {got} admitted, {twin_got} by a \
                 twin that never made the requests given back; schedule:\n{}",
                name::<A>(),
                log.join("\n")
            );
        }
    }
}

attack_tests! {
    attack_two_fixed_window_keyed_twin_through_changes_at_boundaries: [(|| twin_schedule::<FixedWindow>(1000, 1..=400)) as fn()],
    attack_two_sliding_counter_keyed_twin_through_changes_at_boundaries: [(|| twin_schedule::<SlidingCounter>(1000, 1..=400)) as fn()],
    attack_two_fixed_window_full_shard_twin_through_changes: [(|| twin_schedule::<FixedWindow>(2, 1..=400)) as fn()],
    attack_two_sliding_counter_full_shard_twin_through_changes: [(|| twin_schedule::<SlidingCounter>(2, 1..=400)) as fn()],
}

// ---------------------------------------------------------------------------------------------
// 5. A limit raised (same period) while reservations stand in the cycles ahead: each cycle
//    after the change holds what falls due in it and what it admits at once, no more than the
//    larger limit (the reservations' permits count against the new quota as used).

fn raised_limit_with_reservations_ahead<A: Algorithm>() {
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(S / 2));
    let l = keyed::<A, _>(
        quota(10, S, 10, 3 * S),
        clock.clone(),
        1000,
        Overflow::default(),
    );
    let mut due_in = [0u64; 6];
    due_in[0] += drain_key(&l, 0);
    // Reservations of one permit until refused, each counted in the cycle it falls due in.
    while let Some(d) = reserve(&l, 0, 1) {
        let at = S / 2 + d.wait.as_nanos() as u64;
        due_in[(at / S) as usize] += 1;
    }
    l.set_quota(quota(20, S, 20, 3 * S));
    for cycle in 1..5u64 {
        clock.set(Duration::from_nanos(cycle * S));
        let now = drain_key(&l, 0);
        let used = due_in[cycle as usize] + now;
        assert!(
            used <= 20,
            "{}: cycle {cycle} holds {} reservations due in it and admits {now} more at its \
             start: {used} under limits 10 then 20 (reservations due by cycle: {due_in:?})",
            name::<A>(),
            due_in[cycle as usize]
        );
    }
}

attack_tests! {
    attack_two_fixed_window_raised_limit_with_reservations_ahead: [(|| raised_limit_with_reservations_ahead::<FixedWindow>()) as fn()],
    attack_two_sliding_counter_raised_limit_with_reservations_ahead: [(|| raised_limit_with_reservations_ahead::<SlidingCounter>()) as fn()],
}

// ---------------------------------------------------------------------------------------------
// 6. A key evicted (its shard full of keys holding more) and recreated at the instant of an
//    admission it made before: that admission's give-back finds a state it never counted in,
//    and must give nothing (a twin key that never made it admits 10 there). (Found by this
//    attack: it gave back into the new state, 11 admitted. A key's entry now says which of
//    its incarnations it is, and a decision's fingerprint carries it.)

fn give_back_after_eviction<A: Algorithm>() {
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(1000 * S + S / 2));
    let l = keyed::<A, _>(quota(10, S, 10, 0), clock.clone(), 2, Overflow::default());
    let first = l.check(&0);
    assert!(first.allowed);
    assert_eq!(drain_key(&l, 1), 10);
    // Key 2 evicts key 0 (one permit held against ten), then key 0 evicts key 2.
    assert_eq!(drain_key(&l, 2), 10);
    let fresh = drain_key(&l, 0);
    Limiter::refund(&l, &0, 1, first);
    let more = drain_key(&l, 0);
    assert!(
        fresh + more <= 10,
        "{}: key 0 evicted and recreated at its admission's instant admits {fresh}, then {more} \
         more once that admission is given back (a twin key that never made it: 10)",
        name::<A>()
    );
}

attack_tests! {
    attack_two_gcra_give_back_after_its_key_was_evicted_and_recreated: [(|| give_back_after_eviction::<Gcra>()) as fn()],
    attack_two_fixed_window_give_back_after_its_key_was_evicted_and_recreated: [(|| give_back_after_eviction::<FixedWindow>()) as fn()],
    attack_two_sliding_counter_give_back_after_its_key_was_evicted_and_recreated: [(|| give_back_after_eviction::<SlidingCounter>()) as fn()],
}

// ---------------------------------------------------------------------------------------------
// 7. The period shortened (1 s to 500 ms, limit 10) while reservations stand ahead, in the
//    next window or in the current one: each new window holds what falls due in it and what it
//    admits after the change, no more than the limit.

/// The limiter made at `made_at` takes its ten at `drained_at`; at `changed_at` it reserves one
/// permit at a time until refused or one falls due at `due_before` or later, and its period
/// becomes 500 ms.
fn shortened_period_with_reservations<A: Algorithm>(
    made_at: u64,
    drained_at: u64,
    changed_at: u64,
    due_before: u64,
) {
    const HALF: u64 = S / 2;
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(made_at));
    let l = keyed::<A, _>(
        quota(10, S, 10, 3 * S),
        clock.clone(),
        1000,
        Overflow::default(),
    );
    clock.set(Duration::from_nanos(drained_at));
    drain_key(&l, 0);
    clock.set(Duration::from_nanos(changed_at));
    // By the new window (500 ms) they fall due in.
    let mut due_in = [0u64; 12];
    while let Some(d) = reserve(&l, 0, 1) {
        let due = changed_at + d.wait.as_nanos() as u64;
        due_in[(due / HALF) as usize] += 1;
        if due >= due_before {
            break;
        }
    }
    l.set_quota(quota(10, HALF, 10, 3 * S));
    let mut admitted = [0u64; 12];
    // Every 50 ms: a window's count is read near its end too.
    for step in 20..100u64 {
        let now = step * HALF / 10;
        clock.set(Duration::from_nanos(now));
        admitted[(now / HALF) as usize] += drain_key(&l, 0);
    }
    for w in 2..10 {
        assert!(
            due_in[w] + admitted[w] <= 10,
            "{}: the window of 500 ms from {} ms holds {} reservations due in it and admits {} \
             after the change (limit 10; due: {due_in:?}, admitted: {admitted:?})",
            name::<A>(),
            w as u64 * 500,
            due_in[w],
            admitted[w]
        );
    }
}

/// All at 500 ms: the reservations stand in the next window of 1 s.
fn shortened_period_with_reservations_ahead<A: Algorithm>() {
    shortened_period_with_reservations::<A>(S / 2, S / 2, S / 2, u64::MAX);
}

/// Ten taken at 900 ms, and at 1 s, the previous window's share still weighing, reservations
/// in the window in progress (due before 2 s).
fn shortened_period_with_reservations_in_the_window<A: Algorithm>() {
    shortened_period_with_reservations::<A>(0, 9 * S / 10, S, 2 * S);
}

attack_tests! {
    attack_two_fixed_window_shortened_period_with_reservations_ahead: [(|| shortened_period_with_reservations_ahead::<FixedWindow>()) as fn()],
    attack_two_sliding_counter_shortened_period_with_reservations_ahead: [(|| shortened_period_with_reservations_ahead::<SlidingCounter>()) as fn()],
    attack_two_sliding_counter_shortened_period_with_reservations_in_the_window: [(|| shortened_period_with_reservations_in_the_window::<SlidingCounter>()) as fn()],
}

/// A GCRA key keeps its latest reading beside its TAT; the shard's reading is the floor under a
/// key made afresh. A reading older than a drop that reaches the key made again after it is
/// decided as of the drop: two requests that both arrive after the drop, one carrying a reading
/// taken before it, get one permit between them with a burst of one, not two.
#[test]
fn a_stale_reading_that_reaches_a_key_made_again_after_a_drop_is_decided_as_of_the_drop() {
    let dial = Dial::default();
    let limiter = keyed::<Gcra, _>(quota(1, S, 1, 0), dial.clone(), 1000, Overflow::default());
    assert!(limiter.check(&1).allowed);
    dial.set(10 * S);
    limiter.retain_recent();
    assert!(limiter.is_empty(), "idle since 1 s");
    // A thread read the clock at 0.5 s and reaches the key only now.
    dial.set(S / 2);
    let stale = limiter.check(&1);
    assert!(stale.allowed);
    dial.set(10 * S);
    assert!(
        !limiter.check(&1).allowed,
        "the stale request took the permit of 10 s"
    );
}

/// A key whose latest reading runs past its TAT (a give-back with nothing left to give
/// publishes its reading) is not idle before that reading: a sweep by a thread whose reading is
/// older keeps it, so a stale reading that reaches it later is still decided as of the key's.
#[test]
fn a_key_is_not_dropped_before_its_latest_reading() {
    let dial = Dial::default();
    let limiter = keyed::<Gcra, _>(quota(1, S, 1, 0), dial.clone(), 1000, Overflow::default());
    let first = limiter.check(&1);
    assert!(first.allowed);
    dial.set(10 * S);
    // Nothing to give back at 10 s (the TAT, 1 s, has passed), but the key has seen 10 s.
    assert!(Limiter::refund(&limiter, &1, 1, first));
    dial.set(5 * S);
    limiter.retain_recent();
    assert_eq!(
        limiter.len(),
        1,
        "the key has seen 10 s; the sweep read 5 s"
    );
    dial.set(6 * S);
    assert!(limiter.check(&1).allowed, "decided as of 10 s");
    dial.set(10 * S);
    assert!(
        !limiter.check(&1).allowed,
        "the request read at 6 s took the permit of 10 s"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Reservations standing across changes of the limit (raised, lowered, several in a row) and
//    of the period, through a keyed limiter and a direct one: every window holds what falls due
//    in it and what it admits at once, no more than the limit in force (the larger of two, in
//    the window of a change), and, where a lowered limit left more due in it than that, admits
//    nothing (`FixedWindow`'s guarantee across a change of quota).

/// One key of a keyed limiter, or a direct limiter, on a manual clock.
struct Under {
    check: Box<dyn Fn() -> bool>,
    reserve: Box<dyn Fn() -> Option<Decision>>,
    set: Box<dyn Fn(Quota)>,
}

fn keyed_under(q: Quota, clock: &ManualClock) -> Under {
    let l = Arc::new(keyed::<FixedWindow, _>(
        q,
        clock.clone(),
        1000,
        Overflow::default(),
    ));
    let (a, b) = (l.clone(), l.clone());
    Under {
        check: Box::new(move || a.check(&0).allowed),
        reserve: Box::new(move || reserve(&b, 0, 1)),
        set: Box::new(move |q| l.set_quota(q)),
    }
}

fn direct_under(q: Quota, clock: &ManualClock) -> Under {
    let l = Arc::new(direct::<FixedWindow, _>(q, clock.clone()));
    let (a, b) = (l.clone(), l.clone());
    Under {
        check: Box::new(move || a.check().allowed),
        reserve: Box::new(move || {
            let d = Limiter::<()>::reserve_now(&*b, &(), 1).expect("in memory");
            d.ok().filter(|d| d.allowed)
        }),
        set: Box::new(move |q| l.set_quota(q)),
    }
}

/// From 0 to 10 s, every 250 ms: checks until one is refused, then reservations of one permit
/// until one is refused (each counted in the window it falls due in); at a change's instant, the
/// change, then the same again. `changes` are the quotas in force from their instants, the first
/// from 0 (the limiter's creation); a change of period comes only at an instant both periods
/// divide, so that the windows are whole periods of the one in force from there. Every window
/// that ends by 10 s holds what falls due in it and what it admits at once, no more than its
/// limit (the larger of two, in the window of a change) or the reservations made under an
/// earlier quota that fall due in it, whichever is more: a lowered limit cannot take back what
/// was promised under the old one, and nothing may be added to it.
fn windows_keep_their_reservations(
    make: fn(Quota, &ManualClock) -> Under,
    changes: &[(u64, Quota)],
    what: &str,
) {
    const STEP: u64 = S / 4;
    const END: u64 = 10 * S;
    let clock = ManualClock::new();
    let under = make(changes[0].1, &clock);
    let mut windows = ReservationWindows::new(changes, what);
    let requests = |now: u64, quota: usize, windows: &mut ReservationWindows| {
        windows.request(now, quota);
        while (under.check)() {
            windows.admitted(now);
        }
        while let Some(d) = (under.reserve)() {
            windows.reserved(now, d.wait.as_nanos() as u64, quota);
        }
    };
    let mut quota = 0;
    for now in (0..END).step_by(STEP as usize) {
        clock.set(Duration::from_nanos(now));
        requests(now, quota, &mut windows);
        while quota + 1 < changes.len() && changes[quota + 1].0 == now {
            quota += 1;
            (under.set)(changes[quota].1);
            requests(now, quota, &mut windows);
        }
    }
    windows.assert_kept(END, what);
}

/// [`windows_keep_their_reservations`] through a keyed limiter, then a direct one.
fn keyed_and_direct(changes: &[(u64, Quota)], what: &str) {
    let keyed = std::panic::catch_unwind(|| {
        windows_keep_their_reservations(keyed_under, changes, &format!("keyed, {what}"))
    });
    windows_keep_their_reservations(direct_under, changes, &format!("direct, {what}"));
    if let Err(e) = keyed {
        std::panic::resume_unwind(e);
    }
}

attack_tests! {
    attack_quota_fixed_window_raised_limit_with_reservations_ahead: [(|| keyed_and_direct(
        &[(0, waiting(10, S)), (S / 2, waiting(20, S))],
        "10 then 20 per 1 s from 0.5 s",
    )) as fn()],
    attack_quota_fixed_window_raised_limit_at_a_boundary: [(|| keyed_and_direct(
        &[(0, waiting(10, S)), (2 * S, waiting(30, S))],
        "10 then 30 per 1 s from 2 s",
    )) as fn()],
    attack_quota_fixed_window_lowered_limit_with_reservations_ahead: [(|| keyed_and_direct(
        &[(0, waiting(20, S)), (S / 2, waiting(5, S))],
        "20 then 5 per 1 s from 0.5 s",
    )) as fn()],
    attack_quota_fixed_window_limit_changes_in_a_row: [(|| keyed_and_direct(
        &limit_changes_in_a_row(),
        "10, 20, 8, 12, 30, 5 per 1 s",
    )) as fn()],
    attack_quota_fixed_window_period_changes_in_a_row: [(|| keyed_and_direct(
        &period_changes_in_a_row(),
        "10 per 1 s, 10 per 500 ms, 20 per 2 s, 10 then 40 per 250 ms, 30 per 1 s",
    )) as fn()],
}
