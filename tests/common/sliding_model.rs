//! The fixed windows of a sliding counter across changes of quota, for the attacks in
//! `tests/limiter/attack_sliding_period.rs` (memory) and `tests/redis/attack_sliding_period.rs`
//! (Redis): every admission at the instant it counts (an immediate one when decided, a
//! reservation when it falls due), give-backs and debts, and the changes; then what the
//! guarantee says of them (`SlidingCounter`, `KeyedRateLimiter::set_quota`, the CHANGELOG's
//! "Fixed (2026-12-06, last)"):
//!
//! * every admission decided under a quota keeps the window it counts in (numbered as the
//!   limiter numbered it then) within the larger limit in force over that window up to the
//!   decision, counting all that the window holds: admissions, reservations due in it and
//!   debts, less what came back;
//! * after a change of period with reservations standing ahead, nothing is admitted before the
//!   end of the new window the last of them falls due in.
//!
//! Memory numbers windows from the clock's zero; a change keeps the window in progress (its
//! start), which ends one new period after its start or at the change, whichever is later, and
//! the windows after it last the new period. Redis numbers windows as multiples of the period
//! in force from zero; a window of the change there counts only from the start of the old
//! window the change came in (the lenient reading; [`Model::violations`] names the strict one
//! apart).

use std::collections::BTreeMap;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Numbering {
    Memory,
    Redis,
}

#[derive(Clone, Copy, Debug)]
struct Change {
    at: u64,
    period: u64,
    limit: u64,
    /// The index of the first charge decided under it.
    seq: usize,
}

#[derive(Clone, Copy, Debug)]
struct Charge {
    decided: u64,
    instant: u64,
    cost: i64,
    /// An admission (what the guarantee bounds), not a give-back or a debt.
    admission: bool,
    /// For a give-back, the admission it gives back.
    of: Option<usize>,
}

#[derive(Clone, Copy, Debug)]
struct Admission {
    decided: u64,
    instant: u64,
    left: u64,
    /// The number of changes of period made before it.
    periods_before: usize,
    /// Its index in the charges.
    seq: usize,
}

/// One key's admissions, give-backs, debts and changes of quota, in the order decided.
pub struct Model {
    numbering: Numbering,
    changes: Vec<Change>,
    charges: Vec<Charge>,
    admissions: Vec<Admission>,
    pub log: Vec<String>,
}

/// A window `[start, end)`.
type Window = (u64, u64);

impl Model {
    pub fn new(numbering: Numbering, period: u64, limit: u64) -> Self {
        Self {
            numbering,
            changes: vec![Change {
                at: 0,
                period,
                limit,
                seq: 0,
            }],
            charges: Vec::new(),
            admissions: Vec::new(),
            log: Vec::new(),
        }
    }

    fn period_changes(&self) -> usize {
        self.changes
            .windows(2)
            .filter(|w| w[0].period != w[1].period)
            .count()
    }

    /// The quota becomes `limit` per `period` at `at`.
    pub fn change(&mut self, at: u64, period: u64, limit: u64) {
        self.log.push(format!(
            "#{} {at}: quota {limit} per {period}",
            self.charges.len()
        ));
        self.changes.push(Change {
            at,
            period,
            limit,
            seq: self.charges.len(),
        });
    }

    /// `cost` admitted, decided at `decided`, due `wait` later; its id.
    pub fn admit(&mut self, decided: u64, wait: u64, cost: u64) -> usize {
        let id = self.admissions.len();
        self.log.push(format!(
            "#{} {decided}: admission {id} of {cost}, wait {wait} (due {})",
            self.charges.len(),
            decided + wait
        ));
        self.admissions.push(Admission {
            decided,
            instant: decided + wait,
            left: cost,
            periods_before: self.period_changes(),
            seq: self.charges.len(),
        });
        self.charges.push(Charge {
            decided,
            instant: decided + wait,
            cost: cost as i64,
            admission: true,
            of: None,
        });
        id
    }

    /// Up to `cost` of admission `id` given back at `at`. The model counts the traffic that
    /// was: what is given back never ran, even where the limiter keeps it counted (a
    /// give-back of an admission made before a change of period gives nothing back).
    pub fn give_back(&mut self, at: u64, id: usize, cost: u64) {
        let periods = self.period_changes();
        let a = &mut self.admissions[id];
        let back = cost.min(a.left);
        a.left -= back;
        let instant = a.instant;
        let kept = if a.periods_before == periods {
            ""
        } else {
            " (made before a change of period: the limiter keeps it)"
        };
        self.log.push(format!(
            "#{} {at}: {back} of admission {id} given back{kept}",
            self.charges.len()
        ));
        self.charges.push(Charge {
            decided: at,
            instant,
            cost: -(back as i64),
            admission: false,
            of: Some(id),
        });
    }

    /// A settle's debt of `cost` at `at`.
    pub fn debt(&mut self, at: u64, cost: u64) {
        self.log
            .push(format!("#{} {at}: debt of {cost}", self.charges.len()));
        self.charges.push(Charge {
            decided: at,
            instant: at,
            cost: cost as i64,
            admission: false,
            of: None,
        });
    }

    /// How many quotas there were (the first and each change).
    pub fn quotas(&self) -> usize {
        self.changes.len()
    }

    /// The window of `t` as numbered under the first `k + 1` quotas.
    pub fn window_of(&self, t: u64, k: usize) -> Window {
        let changes = &self.changes[..=k];
        if self.numbering == Numbering::Redis {
            let p = changes[k].period;
            return (t / p * p, t / p * p + p);
        }
        // Segments: from `start`, a first window [start, first_end), then windows of `period`.
        let mut segs = vec![(0, changes[0].period, changes[0].period)];
        for w in changes.windows(2) {
            if w[0].period == w[1].period {
                continue;
            }
            let c = w[1].at;
            let (s, _) = window_in(&segs, c);
            let end = (s + w[1].period).max(c);
            segs.push((s, end, w[1].period));
        }
        window_in(&segs, t)
    }

    /// The larger limit in force over `window` up to `t`, under the first `k + 1` quotas.
    fn bound(&self, window: Window, t: u64, k: usize) -> u64 {
        let hi = t.max(self.changes[k].at);
        let lo = window.0.min(hi);
        let changes = &self.changes[..=k];
        // The quota in force just before the window (or the first), then every one changed
        // to within it up to `t`, at its very start too.
        let before = changes
            .iter()
            .rposition(|c| c.at < lo)
            .map_or(changes[0].limit, |i| changes[i].limit);
        changes
            .iter()
            .filter(|c| c.at >= lo && c.at <= hi)
            .map(|c| c.limit)
            .fold(before, u64::max)
    }

    /// Where a window of the change, numbered under the first `k + 1` quotas, starts counting
    /// in the lenient reading: the start of the old window each change in it came in.
    fn counts_from(&self, window: Window, k: usize) -> u64 {
        let mut from = window.0;
        for j in 1..=k {
            let c = self.changes[j].at;
            if self.changes[j].period != self.changes[j - 1].period && window.0 <= c && c < window.1
            {
                from = from.max(self.window_of(c, j - 1).0);
            }
        }
        from
    }

    /// What breaks the guarantee: each line names the rule, the window and its numbers.
    /// `strict` counts all of a Redis window of a change (not only from the old window's
    /// start).
    pub fn violations(&self, strict: bool) -> Vec<String> {
        let mut out = Vec::new();
        for k in 0..self.changes.len() {
            let (from, until) = (
                self.changes[k].seq,
                self.changes
                    .get(k + 1)
                    .map_or(self.charges.len(), |c| c.seq),
            );
            let mut counts: BTreeMap<Window, i64> = BTreeMap::new();
            for (seq, ch) in self.charges[..until].iter().enumerate() {
                let w = self.window_of(ch.instant, k);
                let start = if strict { w.0 } else { self.counts_from(w, k) };
                // In the lenient reading, what came before the start of counting is not held
                // against the window; its admissions are checked against the count from there.
                let (w, before) = if ch.instant < start {
                    ((w.0, start), true)
                } else {
                    (w, false)
                };
                let n = counts.entry(w).or_default();
                *n += ch.cost;
                if seq >= from && ch.admission && !before {
                    let bound = self.bound(w, ch.decided, k);
                    if *n > bound as i64 {
                        out.push(format!(
                            "count: #{seq} (decided at {}, counts at {}) makes the window \
                             [{}, {}) hold {n} under a limit of {bound} (quota #{k})",
                            ch.decided, ch.instant, w.0, w.1
                        ));
                    }
                }
            }
        }
        // The hold after a change of period with reservations standing ahead.
        for j in 1..self.changes.len() {
            let c = self.changes[j];
            if c.period == self.changes[j - 1].period {
                continue;
            }
            // The change takes effect at the next decision (Redis: the next script call).
            let effective = self.charges[c.seq..]
                .first()
                .map_or(c.at, |ch| ch.decided.max(c.at));
            let standing = (0..self.admissions.len())
                .filter(|&i| {
                    let a = self.admissions[i];
                    a.seq < c.seq
                        && a.instant > effective
                        && a.instant > a.decided
                        && self.given_back_before(i, c.seq) < self.charges[a.seq].cost
                })
                .map(|i| self.admissions[i].instant)
                .max();
            let Some(last) = standing else { continue };
            let until = (j..self.changes.len())
                .map(|k| self.window_of(last, k).1)
                .min()
                .unwrap();
            // Until the next change: a raised limit leaves room in a window that counts as
            // full, and a change of period holds the key by its own reservations ahead.
            let next = self
                .changes
                .get(j + 1)
                .map_or(self.charges.len(), |c| c.seq);
            for (seq, ch) in self.charges[..next].iter().enumerate().skip(c.seq) {
                // What counts before the end of the hold (a reservation due after it is not
                // held: the lenient reading of "admits nothing more until").
                if ch.admission && ch.instant < until {
                    out.push(format!(
                        "hold: #{seq} admitted at {} (counts at {}) after the change of period #{j} at {} \
                         with a reservation standing ahead due at {last} (held until {until})",
                        ch.decided, ch.instant, c.at
                    ));
                }
            }
        }
        out
    }

    /// What was given back of admission `id` by charges before `seq`.
    fn given_back_before(&self, id: usize, seq: usize) -> i64 {
        self.charges[..seq]
            .iter()
            .filter(|c| c.of == Some(id))
            .map(|c| -c.cost)
            .sum()
    }

    /// Panics with the violations and the schedule, if any.
    pub fn assert_kept(&self, what: &str) {
        let v = self.violations(false);
        assert!(
            v.is_empty(),
            "{what}: {}\nschedule:\n{}",
            v.join("\n"),
            self.log.join("\n")
        );
    }
}

fn window_in(segs: &[(u64, u64, u64)], t: u64) -> Window {
    let &(start, first_end, period) = segs.iter().rev().find(|s| s.0 <= t).unwrap();
    if t < first_end {
        (start, first_end)
    } else {
        let s = first_end + (t - first_end) / period * period;
        (s, s + period)
    }
}

// ---------------------------------------------------------------------------------------------
// Random schedules, run on any backend.

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
        let k = timeline.changes.len() - 1;
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
        let decided = step.reading.max(latest);
        latest = decided;
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
                said.push(format!(
                    "step {i} at {} (read {}): {:?}: allowed {} wait {:?} remaining {} \
                     retry {:?} reset {:?}",
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
                let debt = (c + more).min(limit).saturating_sub(c);
                if debt > 0 {
                    model.debt(decided, u64::from(debt));
                }
            }
            Op::Quota(p, l) => {
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
