//! Random schedules of requests, give-backs, debts and changes of quota for a sliding counter
//! of one key, run on any backend (memory or Redis) into a [`Model`] of what it admitted; the
//! twins of a give-back; a shrinker of failing schedules. See `sliding_model.rs`.

use super::dial::Dial;
pub use super::sliding_model::{Model, Numbering};
use tower_bulwark::algorithm::SlidingCounter;
use tower_bulwark::limiter::Decision;
use tower_bulwark::Limiter;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// What a step does, at its reading.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// An immediate check of `cost`.
    Check(u32),
    /// A reservation of `cost` (waiting up to the quota's `max_wait`).
    Reserve(u32),
    /// The held admission of this index (modulo how many are held) given back.
    Refund(usize),
    /// The held admission of this index settled to this much less (at least 0).
    SettleLess(usize, u32),
    /// The held admission of this index settled to this much more.
    SettleMore(usize, u32),
    /// The quota becomes `permits` per `period` ns.
    Quota(u64, u32),
}

#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// The time now, and the reading the step's request carries (earlier when stale).
    pub now: u64,
    pub reading: u64,
    pub op: Op,
}

/// The periods a schedule changes between (whole microseconds, for Redis too).
pub const PERIODS: [u64; 6] = [S, S / 2, 300 * MS, 2 * S, 750 * MS, 1_100 * MS];
pub const LIMITS: [u32; 5] = [1, 2, 3, 5, 10];

/// A first quota, what is taken and reserved under it: period, limit, taken, reserved.
pub type First = (u64, u32, u32, u32);
/// A change of quota: instant, period, limit.
pub type Change = (u64, u64, u32);

/// The instants a single change of period comes at, of windows of 2 s: at a window's start, 1 ns
/// either side, or within it.
pub const CHANGED_AT: [u64; 7] = [
    2 * S - 1,
    2 * S,
    2 * S + 1,
    3 * S,
    4 * S - 1,
    4 * S,
    4 * S + 1,
];

/// `permits` per `period` ns, waiting up to two periods (a reservation reaches the next window).
pub fn sliding_quota(period: u64, permits: u32) -> tower_bulwark::Quota {
    super::quota_ns(permits, period, permits, 2 * period)
}

/// What a schedule may hold beyond checks, give-backs, debts and changes of the limit.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    pub reservations: bool,
    pub periods: bool,
    pub stale: bool,
    /// Changes of period one at a time, each at least 8 s after the last (so that what one
    /// holds has ended before the next).
    pub spaced: bool,
    /// Settles to more (else to less).
    pub debts: bool,
}

impl Mix {
    pub const ALL: Self = Self {
        reservations: true,
        periods: true,
        stale: true,
        spaced: false,
        debts: true,
    };
    /// No change of period.
    pub const NO_PERIODS: Self = Self {
        periods: false,
        ..Self::ALL
    };
    /// No reservation.
    pub const NO_RESERVATIONS: Self = Self {
        reservations: false,
        ..Self::ALL
    };
    /// Changes of period one at a time, far apart.
    pub const SPACED: Self = Self {
        spaced: true,
        ..Self::ALL
    };
}

/// A seeded schedule of `n` steps from 10 s: checks, reservations, give-backs, debts, stale
/// readings, changes of period (1 to 3 in a row, often at a window's boundary or 1 ns either
/// side) and of the limit, time moving to boundaries and 1 ns either side.
pub fn schedule(numbering: Numbering, seed: u64, n: usize, mix: Mix) -> ((u64, u32), Vec<Step>) {
    let mut rng = super::Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (mut period, mut limit) = (rng.pick(&PERIODS), rng.pick(&LIMITS));
    let first = (period, limit);
    let mut timeline = Model::new(numbering, period, u64::from(limit));
    let mut now = 10 * S;
    let mut last_change = 0;
    let mut steps = Vec::new();
    let cost = |rng: &mut super::Rng, limit: u32| 1 + rng.below(u64::from(limit.min(3))) as u32;
    while steps.len() < n {
        let k = timeline.quotas() - 1;
        let to_boundary = |rng: &mut super::Rng, now: u64| {
            let end = timeline.window_of(now, k).1;
            end + rng.below(3) - 1
        };
        let fresh = |op| Step {
            now,
            reading: now,
            op: match op {
                Op::Reserve(c) if !mix.reservations => Op::Check(c),
                Op::SettleMore(x, by) if !mix.debts => Op::SettleLess(x, by),
                op => op,
            },
        };
        match rng.below(24) {
            0..=4 => {
                now = match rng.below(4) {
                    0 => now + rng.below(period / 4),
                    1 => to_boundary(&mut rng, now),
                    2 => now + rng.below(3 * period / 2),
                    _ => now,
                };
            }
            5..=9 => steps.push(fresh(Op::Check(cost(&mut rng, limit)))),
            10..=13 => steps.push(fresh(Op::Reserve(cost(&mut rng, limit)))),
            14..=15 => {
                let stale = if mix.stale && rng.below(4) == 0 {
                    rng.below(period)
                } else {
                    0
                };
                steps.push(Step {
                    reading: now - stale,
                    ..fresh(Op::Refund(rng.next() as usize))
                });
            }
            16 => steps.push(fresh(Op::SettleLess(
                rng.next() as usize,
                1 + rng.below(3) as u32,
            ))),
            17 => steps.push(fresh(Op::SettleMore(
                rng.next() as usize,
                1 + rng.below(2) as u32,
            ))),
            18..=20 if mix.periods && (!mix.spaced || now >= last_change + 8 * S) => {
                if rng.below(2) == 0 {
                    now = to_boundary(&mut rng, now);
                }
                last_change = now;
                let in_a_row = if mix.spaced { 1 } else { 1 + rng.below(3) };
                for _ in 0..in_a_row {
                    let p = loop {
                        let p = rng.pick(&PERIODS);
                        if p != period {
                            break p;
                        }
                    };
                    (period, limit) = (p, rng.pick(&LIMITS));
                    timeline.change(now, period, u64::from(limit));
                    steps.push(Step {
                        now,
                        reading: now,
                        op: Op::Quota(period, limit),
                    });
                }
            }
            18..=21 => {
                limit = rng.pick(&LIMITS);
                timeline.change(now, period, u64::from(limit));
                steps.push(fresh(Op::Quota(period, limit)));
            }
            _ => {
                let c = cost(&mut rng, limit);
                let op = if rng.below(2) == 0 {
                    Op::Check(c)
                } else {
                    Op::Reserve(c)
                };
                let stale = if mix.stale {
                    rng.below(3 * period / 2)
                } else {
                    0
                };
                steps.push(Step {
                    reading: now.saturating_sub(stale),
                    ..fresh(op)
                });
            }
        }
    }
    (first, steps)
}

/// A step at `now`, its reading fresh.
pub fn step(now: u64, op: Op) -> Step {
    Step {
        now,
        reading: now,
        op,
    }
}

/// `limit` per `period`; at `period` (a window's start) `taken` permits taken at once and
/// `reserved` reserved one at a time; then `changes` of the quota (instant, period, limit),
/// each followed by a check and a reservation of 2 at its instant; then a check and a
/// reservation of one permit every `every` ns for four of the longest periods: the model of
/// steps.
pub fn reserved_then_changed(
    (period, _, taken, reserved): (u64, u32, u32, u32),
    changes: &[(u64, u64, u32)],
    every: u64,
) -> Vec<Step> {
    let mut steps = vec![step(period, Op::Check(taken))];
    steps.extend((0..reserved).map(|_| step(period, Op::Reserve(1))));
    for &(at, p, l) in changes {
        steps.push(step(at, Op::Quota(p, l)));
        steps.push(step(at, Op::Check(2)));
        steps.push(step(at, Op::Reserve(2)));
    }
    let from = changes.last().unwrap().0;
    let longest = changes.iter().map(|c| c.1).max().unwrap().max(period);
    let mut now = from;
    while now < from + 4 * longest {
        steps.push(step(now, Op::Check(1)));
        steps.push(step(now, Op::Reserve(1)));
        now += every;
    }
    steps
}

/// A limiter of one key that the schedules run on.
#[allow(async_fn_in_trait)]
pub trait Backend {
    fn read(&self, at: u64);
    /// The decision, `None` for an error (a cost above the limit).
    async fn check(&self, cost: u32) -> Option<tower_bulwark::limiter::Decision>;
    async fn reserve(&self, cost: u32) -> Option<tower_bulwark::limiter::Decision>;
    async fn settle(&self, estimate: u32, d: tower_bulwark::limiter::Decision, cost: u32);
    fn set_quota(&self, q: tower_bulwark::Quota);
    /// Whether a refusal records its reading as the key's latest (memory's window algorithms
    /// do; the Redis scripts write nothing for a refusal, as GCRA records nothing).
    fn refusals_record(&self) -> bool {
        true
    }
}

/// Runs `steps` on `b` (made with `first`): the model of what it admitted, and each decision
/// as text (for comparing two backends).
pub async fn drive<B: Backend>(
    b: &B,
    numbering: Numbering,
    first: (u64, u32),
    steps: &[Step],
) -> (Model, Vec<String>) {
    let mut model = Model::new(numbering, first.0, u64::from(first.1));
    let mut limit = first.1;
    let mut latest = 0;
    let mut held: Vec<(usize, u32, tower_bulwark::limiter::Decision)> = Vec::new();
    let mut said = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        b.read(step.reading);
        model.log.push(format!(
            "step {i}: now {} read {}: {:?}",
            step.now, step.reading, step.op
        ));
        // As of the key's latest reading: the latest of the steps that changed the limiter (a
        // give-back with nothing held does not, nor does a cost above the limit, nor, where
        // the backend says so, a refusal).
        let decided = step.reading.max(latest);
        let pick = |held: &mut Vec<_>, x: usize| {
            let n = held.len();
            (n > 0).then(|| held.swap_remove(x % n))
        };
        match step.op {
            Op::Check(c) | Op::Reserve(c) => {
                let d = if matches!(step.op, Op::Check(_)) {
                    b.check(c).await
                } else {
                    b.reserve(c).await
                };
                let Some(d) = d else {
                    said.push(format!("step {i}: {:?}: an error", step.op));
                    continue;
                };
                if d.allowed || b.refusals_record() {
                    latest = decided;
                }
                said.push(format!(
                    "step {i} at {} (read {}, as of {decided}): {:?}: allowed {} wait {:?} \
                     remaining {} retry {:?} reset {:?}",
                    step.now,
                    step.reading,
                    step.op,
                    d.allowed,
                    d.wait,
                    d.remaining,
                    d.retry_after,
                    d.reset_after
                ));
                if d.allowed {
                    let id = model.admit(decided, d.wait.as_nanos() as u64, u64::from(c));
                    held.push((id, c, d));
                }
            }
            Op::Refund(x) | Op::SettleLess(x, _) => {
                let Some((id, c, d)) = pick(&mut held, x) else {
                    continue;
                };
                latest = decided;
                let to = match step.op {
                    Op::SettleLess(_, by) => c.saturating_sub(by),
                    _ => 0,
                };
                b.settle(c, d, to).await;
                model.give_back(decided, id, u64::from(c - to));
            }
            Op::SettleMore(x, more) => {
                let Some((_, c, d)) = pick(&mut held, x) else {
                    continue;
                };
                b.settle(c, d, c + more).await;
                // A settle that charges nothing (the admission took the whole limit) leaves
                // the key as it was.
                let debt = (c + more).min(limit).saturating_sub(c);
                if debt > 0 {
                    latest = decided;
                    model.debt(decided, u64::from(debt));
                }
            }
            Op::Quota(p, l) => {
                latest = decided;
                b.set_quota(sliding_quota(p, l));
                limit = l;
                model.change(decided, p, u64::from(l));
            }
        }
    }
    (model, said)
}

/// The steps of `steps` that still break the rule named `rule` ("count:" or "hold:") once
/// every step that can go has gone (one at a time, from the end); `make(n)` makes the `n`th
/// limiter tried.
pub async fn shrink<B: Backend>(
    mut make: impl FnMut(usize) -> B,
    numbering: Numbering,
    first: (u64, u32),
    mut steps: Vec<Step>,
    rule: &str,
) -> Vec<Step> {
    let mut tries = 0;
    let mut fails = async |steps: &[Step]| {
        tries += 1;
        let b = make(tries);
        let (model, _) = drive(&b, numbering, first, steps).await;
        model.violations(false).iter().any(|v| v.starts_with(rule))
    };
    assert!(fails(&steps).await);
    let mut i = steps.len();
    while i > 0 {
        i -= 1;
        let mut fewer = steps.clone();
        fewer.remove(i);
        if fails(&fewer).await {
            steps = fewer;
            i = i.min(steps.len());
        }
    }
    steps
}

/// Twins: `a` makes one request more than `b` (at a random step of `seed`'s schedule; `b` makes
/// it too and gives it back at once) and gives it back later; between the two, only changes of quota and
/// time, and after it, drains of both at each request's reading, quota changes between. `a`
/// must never have admitted more than `b` since the give-back. The schedule and the first
/// drain where it did, if any.
pub async fn twins<B: Backend>(a: &B, b: &B, numbering: Numbering, seed: u64) -> Option<String> {
    let (_, steps) = schedule(numbering, seed, 100, Mix::ALL);
    let mut rng = super::Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let i = rng.below(40) as usize;
    let j = i + 1 + rng.below(30) as usize;
    let mut log = Vec::new();
    let mut held: [Vec<(u32, tower_bulwark::limiter::Decision)>; 2] = Default::default();
    let mut extra = None;
    let (mut got, mut twin) = (0u64, 0u64);
    // How many it admits now, and when the refusal that ends them says to come back.
    let drain = async |l: &B| {
        let mut n = 0;
        loop {
            match l.check(1).await {
                Some(d) if d.allowed => n += 1,
                d => return (n, d.map(|d| d.retry_after)),
            }
            assert!(n < 100_000);
        }
    };
    for (n, step) in steps.iter().enumerate() {
        a.read(step.reading);
        b.read(step.reading);
        let line = format!("step {n}: now {} read {}: ", step.now, step.reading);
        if n == i {
            // A refused request is no request made: the twins would be one.
            let d = a.reserve(1).await.filter(|d| d.allowed)?;
            log.push(format!("{line}the extra request: {d:?}"));
            extra = Some(d);
            // The twin makes it too and gives it back at once (a veto leaves the key as it
            // was): both keys are read at the same instants.
            let vetoed = b.reserve(1).await.filter(|d| d.allowed).unwrap();
            b.settle(1, vetoed, 0).await;
        }
        if n == j {
            // The quota of the step first: the give-back and the twin's drain that follows at
            // once then read the key under one quota.
            if let Op::Quota(p, l) = step.op {
                a.set_quota(sliding_quota(p, l));
                b.set_quota(sliding_quota(p, l));
            }
            a.settle(1, extra.take().unwrap(), 0).await;
            log.push(format!("{line}the extra request given back"));
        }
        match step.op {
            _ if n == j => {
                let ((x, rx), (y, ry)) = (drain(a).await, drain(b).await);
                (got, twin) = (x, y);
                log.push(format!("{line}drained {x} ({rx:?}), the twin {y} ({ry:?})"));
            }
            Op::Quota(p, l) => {
                a.set_quota(sliding_quota(p, l));
                b.set_quota(sliding_quota(p, l));
                log.push(format!("{line}quota {l} per {p}"));
            }
            _ if n >= i && n < j => {}
            Op::Check(c) | Op::Reserve(c) if n < i => {
                for (k, l) in [a, b].into_iter().enumerate() {
                    let d = if matches!(step.op, Op::Check(_)) {
                        l.check(c).await
                    } else {
                        l.reserve(c).await
                    };
                    if let Some(d) = d.filter(|d| d.allowed) {
                        held[k].push((c, d));
                    }
                }
                log.push(format!("{line}{:?} on both", step.op));
            }
            Op::Refund(x) | Op::SettleLess(x, _) | Op::SettleMore(x, _) if n < i => {
                let len = held[0].len();
                assert_eq!(len, held[1].len(), "the twins agreed so far");
                if len == 0 {
                    continue;
                }
                let to = |c: u32| match step.op {
                    Op::SettleLess(_, by) => c.saturating_sub(by),
                    Op::SettleMore(_, more) => c + more,
                    _ => 0,
                };
                let (c, d) = held[0].swap_remove(x % len);
                a.settle(c, d, to(c)).await;
                let (c, d) = held[1].swap_remove(x % len);
                b.settle(c, d, to(c)).await;
                log.push(format!("{line}{:?} on both", step.op));
            }
            _ if n < j => {}
            // Both drained at once after the give-back, at its reading, then at each request.
            Op::Check(_) | Op::Reserve(_) => {
                let ((x, rx), (y, ry)) = (drain(a).await, drain(b).await);
                got += x;
                twin += y;
                log.push(format!(
                    "{line}drained {x} (in all {got}; {rx:?}), the twin {y} ({twin}; {ry:?})"
                ));
                if got > twin {
                    return Some(format!(
                        "seed {seed}: the limiter that gave its request back admitted {got} \
                         since, the twin that never made it {twin}:\n{}",
                        log.join("\n")
                    ));
                }
            }
            _ => {}
        }
    }
    None
}

/// One key of an in-memory limiter, keyed (its key 0) or direct, reading a manual clock.
pub enum InMemory {
    Keyed(
        tower_bulwark::KeyedRateLimiter<u32, SlidingCounter, Dial>,
        Dial,
    ),
    Direct(tower_bulwark::DirectRateLimiter<SlidingCounter, Dial>, Dial),
}

impl InMemory {
    pub fn keyed(q: tower_bulwark::Quota) -> Self {
        let clock = Dial::default();
        let l = tower_bulwark::KeyedRateLimiter::<u32>::builder(q)
            .algorithm::<SlidingCounter>()
            .clock(clock.clone())
            .build();
        Self::Keyed(l, clock)
    }

    pub fn direct(q: tower_bulwark::Quota) -> Self {
        let clock = Dial::default();
        let l = tower_bulwark::DirectRateLimiter::builder(q)
            .algorithm::<SlidingCounter>()
            .clock(clock.clone())
            .build();
        Self::Direct(l, clock)
    }
}

impl Backend for InMemory {
    fn read(&self, at: u64) {
        let (Self::Keyed(_, clock) | Self::Direct(_, clock)) = self;
        clock.set(at);
    }
    async fn check(&self, cost: u32) -> Option<Decision> {
        match self {
            Self::Keyed(l, _) => l.check_n(&0, cost).ok(),
            Self::Direct(l, _) => l.check_n(cost).ok(),
        }
    }
    async fn reserve(&self, cost: u32) -> Option<Decision> {
        let decision = match self {
            Self::Keyed(l, _) => Limiter::reserve_now(l, &0, cost),
            Self::Direct(l, _) => Limiter::<()>::reserve_now(l, &(), cost),
        };
        decision.unwrap().ok()
    }
    async fn settle(&self, estimate: u32, d: Decision, cost: u32) {
        let settled = match self {
            Self::Keyed(l, _) => Limiter::settle(l, &0, estimate, d, cost),
            Self::Direct(l, _) => Limiter::<()>::settle(l, &(), estimate, d, cost),
        };
        assert!(settled);
    }
    fn set_quota(&self, q: tower_bulwark::Quota) {
        match self {
            Self::Keyed(l, _) => l.set_quota(q),
            Self::Direct(l, _) => l.set_quota(q),
        }
    }
}

/// What broke in `model` (of the count only where `counts_only`), one line each, with its
/// schedule, under `what`.
pub fn failure(what: &str, model: &Model, counts_only: bool) -> Option<String> {
    let v: Vec<String> = (model.violations(false).into_iter())
        .filter(|v| !counts_only || v.starts_with("count:"))
        .collect();
    (!v.is_empty()).then(|| {
        format!(
            "{what}: {}\nschedule:\n{}",
            v.join("\n"),
            model.log.join("\n")
        )
    })
}

/// Fails with the first of `failures` (of seeds, by `failure`), after saying how many broke
/// the count.
pub fn assert_no_failures(name: &str, failures: &[String]) {
    let counts: Vec<&String> = failures.iter().filter(|f| f.contains("count:")).collect();
    eprintln!(
        "{name}: {} seeds failed, {} of them the count: {:?}",
        failures.len(),
        counts.len(),
        counts
            .iter()
            .map(|f| f.split(':').next().unwrap())
            .collect::<Vec<_>>()
    );
    if let Some(f) = counts.first() {
        eprintln!("the first count failure:\n{f}");
    }
    assert!(
        failures.is_empty(),
        "{name}: {} seeds failed; the first:\n{}",
        failures.len(),
        failures[0]
    );
}

/// The cases of A→B→A and A→B→C in a row (at one instant, or the second 1 ns before a
/// window's end), the next window reserved: the first quota (period, limit), what is taken and
/// reserved, and the two changes (instant, period, limit).
pub fn back_and_forth() -> Vec<(First, [Change; 2])> {
    let mut cases = Vec::new();
    for (limit, taken, reserved) in [(1, 1, 1), (4, 4, 4), (4, 2, 4)] {
        for b in [S, 750 * MS, 300 * MS, 3 * S] {
            for c in [2 * S, 1_100 * MS] {
                for (at1, at2) in [
                    (3 * S, 3 * S),
                    (2 * S, 2 * S),
                    (3 * S, 4 * S - 1),
                    (4 * S, 4 * S),
                ] {
                    cases.push((
                        (2 * S, limit, taken, reserved),
                        [(at1, b, limit), (at2, c, limit)],
                    ));
                }
            }
        }
    }
    cases
}
