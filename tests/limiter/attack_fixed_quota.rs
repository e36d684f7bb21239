//! Attack on `FixedWindow`'s reservations across changes of quota (CHANGELOG, "Fixed
//! (2026-12-06, later)") and on its decisions without a change (its Resilience4j cycles), in
//! memory: random schedules of checks, reservations, give-backs, settles both ways and changes of
//! limit, period and `max_wait`, stale readings, boundary instants, huge limits and tiny periods;
//! and idle keys dropped as before.

use std::collections::BTreeMap;
use std::time::Duration;

use tower_bulwark::algorithm::FixedWindow;
use tower_bulwark::limiter::Decision;
use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Limiter, Quota};

use crate::common::dial::Dial;
use crate::common::{quota_ns, Rng};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
/// The limiters are made at this reading, which no period below divides: cycles count from it.
const BORN: u64 = 1000 * S + 123_456_789;

type Keyed = KeyedRateLimiter<u32, FixedWindow, Dial>;
type Direct = DirectRateLimiter<FixedWindow, Dial>;

fn keyed(q: Quota, clock: &Dial) -> Keyed {
    KeyedRateLimiter::<u32>::builder(q)
        .algorithm::<FixedWindow>()
        .clock(clock.clone())
        .build()
}

fn direct(q: Quota, clock: &Dial) -> Direct {
    DirectRateLimiter::builder(q)
        .algorithm::<FixedWindow>()
        .clock(clock.clone())
        .build()
}

/// One key of a keyed limiter, or a direct limiter.
trait Subject {
    fn make(q: Quota, clock: &Dial) -> Self;
    /// `Limiter::reserve_now` of `cost`: `None` for a refusal or an error.
    fn reserve(&self, cost: u32) -> Option<Decision>;
    /// `check_n`: `None` for a refusal or an error.
    fn check(&self, cost: u32) -> Option<Decision>;
    fn settle(&self, estimate: u32, d: Decision, cost: u32) -> bool;
    fn refund(&self, cost: u32, d: Decision) -> bool;
    fn set(&self, q: Quota);
}

impl Subject for Keyed {
    fn make(q: Quota, clock: &Dial) -> Self {
        keyed(q, clock)
    }
    fn reserve(&self, cost: u32) -> Option<Decision> {
        let d = Limiter::reserve_now(self, &7, cost).expect("in memory");
        d.ok().filter(|d| d.allowed)
    }
    fn check(&self, cost: u32) -> Option<Decision> {
        self.check_n(&7, cost).ok().filter(|d| d.allowed)
    }
    fn settle(&self, estimate: u32, d: Decision, cost: u32) -> bool {
        Limiter::settle(self, &7, estimate, d, cost)
    }
    fn refund(&self, cost: u32, d: Decision) -> bool {
        Limiter::refund(self, &7, cost, d)
    }
    fn set(&self, q: Quota) {
        self.set_quota(q);
    }
}

impl Subject for Direct {
    fn make(q: Quota, clock: &Dial) -> Self {
        direct(q, clock)
    }
    fn reserve(&self, cost: u32) -> Option<Decision> {
        let d = Limiter::<()>::reserve_now(self, &(), cost).expect("in memory");
        d.ok().filter(|d| d.allowed)
    }
    fn check(&self, cost: u32) -> Option<Decision> {
        self.check_n(cost).ok().filter(|d| d.allowed)
    }
    fn settle(&self, estimate: u32, d: Decision, cost: u32) -> bool {
        Limiter::<()>::settle(self, &(), estimate, d, cost)
    }
    fn refund(&self, cost: u32, d: Decision) -> bool {
        Limiter::<()>::refund(self, &(), cost, d)
    }
    fn set(&self, q: Quota) {
        self.set_quota(q);
    }
}

fn set(clock: &Dial, at: u64) {
    clock.set(at);
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The cycles as the docs lay them out: from the limiter's creation, `period` each; a change of
// period keeps the cycle in progress (its start), which ends one new period after its start, or
// at the change if that instant has passed; the cycles after it last the new period
// (`KeyedRateLimiter::set_quota`, `FixedWindow`'s docs).

struct Timeline {
    /// (from, period): the windows from `from` on, the latest pushed winning.
    segments: Vec<(u64, u64)>,
    period: u64,
    /// (change instant, end of the window before it, end after it): a lengthened window,
    /// which swallows the start of the cycle after it as it was.
    lengthened: Vec<(u64, u64, u64)>,
}

impl Timeline {
    fn new(born: u64, period: u64) -> Self {
        Self {
            segments: vec![(born, period)],
            period,
            lengthened: Vec::new(),
        }
    }

    fn window_of(&self, t: u64) -> (u64, u64) {
        let &(from, p) = self.segments.iter().rev().find(|(f, _)| *f <= t).unwrap();
        let start = from + (t - from) / p * p;
        (start, start + p)
    }

    fn change(&mut self, t: u64, period: u64) {
        if period == self.period {
            return;
        }
        let (start, old_end) = self.window_of(t);
        let end = if start + period > t {
            start + period
        } else {
            t
        };
        if end > old_end {
            self.lengthened.push((t, old_end, end));
        }
        self.segments.push((start, end - start));
        self.segments.push((end, period));
        self.period = period;
    }
}

/// What a schedule did, tallied per window once it is over.
struct Tally {
    timeline: Timeline,
    /// (instant, version, limit): the quotas in force from their instants, version 0 from birth.
    changes: Vec<(u64, usize, u64)>,
    /// (window-of instant, permits still held, version made under, reservation, cost, made at).
    charges: Vec<(u64, u64, usize, bool, u64, u64)>,
}

impl Tally {
    fn new(q: Quota) -> Self {
        Self {
            timeline: Timeline::new(BORN, nanos(q.period())),
            changes: vec![(BORN, 0, u64::from(q.permits()))],
            charges: Vec::new(),
        }
    }
    fn version(&self) -> usize {
        self.changes.len() - 1
    }
    fn change(&mut self, at: u64, q: Quota) {
        self.timeline.change(at, nanos(q.period()));
        let v = self.changes.len();
        self.changes.push((at, v, u64::from(q.permits())));
    }
    /// An admission (`wait` zero) or reservation of `cost` decided at `at`: its index.
    fn charge(&mut self, at: u64, wait: u64, cost: u32) -> usize {
        let v = self.version();
        self.charges
            .push((at + wait, u64::from(cost), v, wait > 0, u64::from(cost), at));
        self.charges.len() - 1
    }
    /// `permits` of charge `i` given back (never more than it holds).
    fn given_back(&mut self, i: usize, permits: u64) {
        let c = &mut self.charges[i].1;
        *c = c.saturating_sub(permits);
    }

    /// Every window that has ended by `end` holds what falls due in it and what it admitted at
    /// once, no more than the largest limit in force in it or the reservations made under an
    /// earlier quota than the one in force at its end that fall due in it, whichever is more
    /// (beside the part of reservations of several permits drawn from the cycle before, up to
    /// the limit less one).
    fn assert_kept(&self, end: u64, log: &[String]) {
        #[derive(Default, Debug)]
        struct W {
            admitted: u64,
            due: u64,
            due_from_before: u64,
            /// Permits of reservations of several, which may lie in the cycle before.
            drawn_before: u64,
            swallowed: u64,
        }
        let mut windows: BTreeMap<(u64, u64), W> = BTreeMap::new();
        for &(at, permits, v, reservation, cost, made) in &self.charges {
            let w = self.timeline.window_of(at);
            let here = windows.entry(w).or_default();
            if reservation {
                here.due += permits;
                here.drawn_before += cost - 1;
                // Due at the start of the cycle after a window that a longer period then
                // stretched over it (see `attack_fixed_quota_lengthened_period_swallows_a_reservation`).
                if self
                    .timeline
                    .lengthened
                    .iter()
                    .any(|&(t, old, new)| made <= t && (old..new).contains(&at))
                {
                    here.swallowed += permits;
                }
                if v < self.version_at(w.1 - 1) {
                    here.due_from_before += permits;
                }
            } else {
                here.admitted += permits;
            }
        }
        for (&(start, until), w) in &windows {
            if until > end {
                continue;
            }
            let limit = self.largest_limit(start, until);
            // "that cycle may see, beside its own `permits`, the part of a reservation drawn
            // from the cycle before (up to `permits - 1`)".
            let drawn = w.drawn_before.min(limit - 1);
            assert!(
                w.admitted + w.due <= limit.max(w.due_from_before) + drawn + w.swallowed,
                "the window [{start}, {until}) ns ({} ns from birth) holds {w:?} under a largest \
                 limit of {limit}:\n{}",
                start - BORN,
                log.join("\n")
            );
        }
    }

    fn version_at(&self, t: u64) -> usize {
        self.changes.iter().rev().find(|c| c.0 <= t).unwrap().1
    }

    fn largest_limit(&self, start: u64, until: u64) -> u64 {
        // The quota in force as the window starts, before any change at that instant.
        let before = self.changes.iter().rev().find(|c| c.0 < start);
        let at_start = before.unwrap_or(&self.changes[0]).2;
        self.changes
            .iter()
            .filter(|c| c.0 >= start && c.0 < until)
            .map(|c| c.2)
            .fold(at_start, u64::max)
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Random schedules with changes of quota.

fn pool() -> [Quota; 9] {
    [
        quota_ns(10, S, 10, 3 * S),
        quota_ns(20, S, 20, 3 * S),
        quota_ns(3, S, 3, 5 * S),
        quota_ns(10, S / 2, 10, 2 * S),
        quota_ns(7, 700 * MS, 7, 4 * S),
        quota_ns(5, 300 * MS, 5, 3600 * S),
        quota_ns(10, S, 10, 0),
        quota_ns(30, 2 * S, 30, 6 * S),
        quota_ns(1, 250 * MS, 1, 3 * S),
    ]
}

/// A random schedule of `steps` on `L` from seed `seed`: reservations and checks of 1 to 3
/// permits, give-backs (refunds and settles to less, of admissions and of reservations before
/// they fall due), settles to more, changes of quota (of the pool, back to the first too; up to
/// three at one instant), stale readings, readings at and just before a cycle's boundary.
fn random_schedule<L: Subject>(seed: u64, steps: usize, changes: bool) {
    let pool = pool();
    let mut rng = Rng(seed);
    let first = pool[rng.below(pool.len() as u64) as usize];
    let clock = Dial::at(BORN);
    let l = L::make(first, &clock);
    let mut tally = Tally::new(first);
    let mut log = vec![format!("seed {seed}: born at {BORN} under {first:?}")];
    let mut latest = BORN;
    let mut now = BORN;
    let mut q = first;
    // (tally index, estimate, decision, due instant).
    let mut held: Vec<(usize, u32, Decision, u64)> = Vec::new();
    for _ in 0..steps {
        let period = nanos(q.period());
        // The reading: on, at the next boundary, just before it, or stale.
        match rng.below(10) {
            0..=2 => now += rng.below(period + period / 2),
            3 => now = tally.timeline.window_of(latest).1,
            4 => now = tally.timeline.window_of(latest).1 - 1,
            5 => now = latest.saturating_sub(rng.below(period)).max(BORN),
            _ => {}
        }
        now = now.max(BORN);
        set(&clock, now);
        // Decided as of the key's latest reading: of the steps that reached its state (a check
        // or reservation within the limit, a give-back, a settle that charges more).
        let at = latest.max(now);
        match rng.below(20) {
            0..=6 => {
                let cost = 1 + rng.below(3) as u32;
                if cost <= q.permits() {
                    latest = at; // (a cost above the limit is an error, decided by no state)
                }
                if let Some(d) = l.reserve(cost) {
                    let wait = nanos(d.wait);
                    log.push(format!(
                        "{}: reserve {cost} (read {}): wait {wait}",
                        at - BORN,
                        now - BORN
                    ));
                    let i = tally.charge(at, wait, cost);
                    held.push((i, cost, d, at + wait));
                } else {
                    log.push(format!(
                        "{}: reserve {cost} (read {}): refused",
                        at - BORN,
                        now - BORN
                    ));
                }
            }
            7..=10 => {
                let cost = 1 + rng.below(3) as u32;
                if cost <= q.permits() {
                    latest = at; // (a cost above the limit is an error, decided by no state)
                }
                if let Some(d) = l.check(cost) {
                    log.push(format!(
                        "{}: check {cost} (read {}): admitted",
                        at - BORN,
                        now - BORN
                    ));
                    let i = tally.charge(at, 0, cost);
                    held.push((i, cost, d, at));
                } else {
                    log.push(format!(
                        "{}: check {cost} (read {}): refused",
                        at - BORN,
                        now - BORN
                    ));
                }
            }
            11..=15 if !held.is_empty() => {
                let n = rng.below(held.len() as u64) as usize;
                let (i, estimate, d, due) = held.swap_remove(n);
                // Reservations are given back only before they fall due.
                if due > at || rng.below(2) == 0 {
                    let to = rng.below(u64::from(estimate) + 3) as u32;
                    let how = rng.below(2);
                    if to < estimate || to.min(q.permits()) > estimate {
                        latest = at;
                    }
                    if to == 0 && how == 0 {
                        l.refund(estimate, d);
                    } else {
                        l.settle(estimate, d, to);
                    }
                    if to < estimate {
                        tally.given_back(i, u64::from(estimate - to));
                    }
                    log.push(format!(
                        "{}: #{i} ({estimate}, due {}) settled to {to}{}",
                        at - BORN,
                        due as i64 - BORN as i64,
                        if to == 0 && how == 0 { " (refund)" } else { "" }
                    ));
                }
            }
            16 if changes => {
                // At the fresh reading: the change's instant is the latest.
                set(&clock, latest);
                for _ in 0..1 + rng.below(3) {
                    q = if rng.below(4) == 0 {
                        first
                    } else {
                        pool[rng.below(pool.len() as u64) as usize]
                    };
                    l.set(q);
                    tally.change(latest, q);
                    log.push(format!(
                        "{}: quota {} per {} ns, wait {} ns",
                        latest - BORN,
                        q.permits(),
                        nanos(q.period()),
                        nanos(q.max_wait())
                    ));
                }
            }
            _ => {}
        }
    }
    tally.assert_kept(latest, &log);
}

/// CHANGELOG "Fixed (2026-12-06, later)": "Reservations now keep the cycles they fall due in";
/// `FixedWindow`: "a cycle holds no more than the larger of its reservations and the new limit",
/// "So the cycle of the change admits at most the larger of the two limits" (`set_quota`). With
/// give-backs: `Limiter::refund`, "No more than the decision took is ever given back, whatever
/// ... set_quota changed since".
#[test]
fn attack_fixed_quota_random_schedules_keyed() {
    for seed in 1..=300u64 {
        random_schedule::<Keyed>(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 150, true);
    }
}

/// The same promise as [`attack_fixed_quota_random_schedules_keyed`], through a direct limiter.
#[test]
fn attack_fixed_quota_random_schedules_direct() {
    for seed in 1..=300u64 {
        random_schedule::<Direct>(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) + 1, 150, true);
    }
}

/// `FixedWindow`: "Guarantee: no cycle hands out more than its `permits`" (reservations due in
/// a cycle counted in it), with give-backs and settles and no change of quota.
#[test]
fn attack_fixed_quota_no_change_with_give_backs_keeps_permits() {
    for seed in 1..=300u64 {
        random_schedule::<Keyed>(seed.wrapping_mul(0x2545_F491_4F6C_DD1D), 150, false);
        random_schedule::<Direct>(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) + 7, 150, false);
    }
}

/// CHANGELOG, "Fixed (2026-12-06, later)" (the brief's words): a change of quota "must not let
/// any cycle hold more than its limit (the larger of two in the cycle of a change) or the
/// reservations promised under the earlier quota that fall due in it, whichever is more";
/// `set_quota`: "A new period keeps the cycle in progress (its number and its start) and makes
/// it end one new period after its start". 10 per 500 ms: 10 admitted at 0, one reserved (due at
/// 500 ms); the period becomes 1 s at 250 ms, so the cycle [0, 1 s) holds 10 + 1 under a limit
/// of 10 (and the reservation made under the earlier quota is 1).
#[test]
#[ignore = "found by attack: a lengthened period stretches the cycle of the change over the next one's reservations: 10 admitted + 1 due in [0, 1 s) under 10 per 500 ms then 10 per 1 s"]
fn attack_fixed_quota_lengthened_period_swallows_a_reservation() {
    let clock = Dial::at(BORN);
    let l = keyed(quota_ns(10, S / 2, 10, 2 * S), &clock);
    let mut in_cycle = 0;
    while l.check(&0).allowed {
        in_cycle += 1;
    }
    let d = Limiter::reserve_now(&l, &0, 1).unwrap().unwrap();
    assert!(d.allowed && d.wait == Duration::from_millis(500), "{d:?}");
    set(&clock, BORN + S / 4);
    l.set_quota(quota_ns(10, S, 10, 2 * S));
    // The reservation falls due at 500 ms, inside the cycle [0, 1 s) of the new period.
    in_cycle += 1;
    for at in [S / 2, 3 * S / 4, S - 1] {
        set(&clock, BORN + at);
        while l.check(&0).allowed {
            in_cycle += 1;
        }
    }
    assert!(
        in_cycle <= 10,
        "the cycle [0, 1 s) holds {in_cycle} under a limit of 10"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Without a change: every decision that of a reference model written from the docs.

/// `FixedWindow` as its docs tell it: cycles of `period` from the limiter's creation, `permits`
/// each, idle cycles building up nothing; an admission takes slots of the current cycle; a
/// reservation takes the slots left and the first of the next cycles' and falls due when the
/// cycle of its last slot begins, within `max_wait`; a stale reading is decided as of the latest.
struct Model {
    born: u128,
    period: u128,
    permits: u128,
    max_wait: u128,
    cycle: u128,
    used: u128,
    latest: u128,
}

impl Model {
    fn new(q: Quota, born: u64) -> Self {
        Self {
            born: born.into(),
            period: q.period().as_nanos(),
            permits: q.permits().into(),
            max_wait: q.max_wait().as_nanos(),
            cycle: 0,
            used: 0,
            latest: born.into(),
        }
    }

    /// `None`: refused; `Some(wait)`: admitted after `wait` ns.
    fn decide(&mut self, now: u64, cost: u32, may_wait: bool) -> Option<u128> {
        let now = self.latest.max(now.into());
        self.latest = now;
        let cycle = (now - self.born) / self.period;
        if cycle > self.cycle {
            let freed = (cycle - self.cycle).saturating_mul(self.permits);
            self.used = self.used.saturating_sub(freed);
            self.cycle = cycle;
        }
        let after = self.used + u128::from(cost);
        if after <= self.permits {
            self.used = after;
            return Some(0);
        }
        if !may_wait {
            return None;
        }
        let ahead = (after - 1) / self.permits;
        let wait = self.born + (cycle + ahead) * self.period - now;
        (wait <= self.max_wait).then(|| {
            self.used = after;
            wait
        })
    }
}

/// Random checks and reservations of `q` (costs up to `most`) from `seed`, through `L` and the
/// model: the same decisions (admitted or not, and the wait).
fn against_the_model<L: Subject>(q: Quota, most: u32, seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    let clock = Dial::at(BORN);
    let l = L::make(q, &clock);
    let mut model = Model::new(q, BORN);
    let period = nanos(q.period());
    let mut now = BORN;
    let mut log = vec![format!("seed {seed}, {q:?}")];
    for _ in 0..steps {
        let next_boundary = |now: u64| BORN + ((now - BORN) / period + 1) * period;
        let reading = match rng.below(8) {
            0 | 1 => {
                now = now.saturating_add(rng.below(period.saturating_mul(3).max(2)));
                now
            }
            2 => {
                now = next_boundary(now);
                now
            }
            3 => {
                now = next_boundary(now) - 1;
                now
            }
            4 => now
                .saturating_sub(rng.below(period.saturating_mul(2).max(2)))
                .max(BORN),
            _ => now,
        };
        set(&clock, reading);
        let cost = match rng.below(4) {
            0 => most,
            1 => 1,
            _ => 1 + rng.below(u64::from(most)) as u32,
        };
        let may_wait = rng.below(3) > 0;
        let got = if may_wait {
            l.reserve(cost).map(|d| d.wait.as_nanos())
        } else {
            l.check(cost).map(|_| 0)
        };
        let want = model.decide(reading, cost, may_wait);
        log.push(format!(
            "{} (read {}): {} {cost}: {got:?}",
            now - BORN,
            reading - BORN,
            if may_wait { "reserve" } else { "check" }
        ));
        assert_eq!(got, want, "the model says {want:?}:\n{}", log.join("\n"));
    }
}

/// `FixedWindow`: "Time is cut into cycles of `period` counted from the limiter's creation, and
/// each cycle brings `permits` permissions ... A caller willing to wait reserves a permission of
/// a future cycle ... a reservation takes the slots left in it and the first of the next
/// cycles', and falls due when the cycle of its last slot begins"; "A clock reading older than
/// the latest one the key has seen is decided as of that latest reading". Without a change of
/// quota, every decision is the model's: ordinary quotas, huge limits (up to `u32::MAX`), tiny
/// periods (1 ns, 1 µs), `max_wait` of hours.
#[test]
fn attack_fixed_quota_without_a_change_decisions_are_the_models() {
    let cases = [
        (quota_ns(3, S, 3, 5 * S / 2), 3),
        (quota_ns(10, 700 * MS, 10, 5 * S), 4),
        (quota_ns(1, 1, 1, 0), 1),
        (quota_ns(1, 1, 1, 7), 1),
        (quota_ns(5, 1_000, 5, 3600 * S), 5),
        (quota_ns(u32::MAX, 1, u32::MAX, 1_000_000), u32::MAX),
        (quota_ns(u32::MAX, S, u32::MAX, 3 * 3600 * S), u32::MAX),
        (quota_ns(7, 3 * 3600 * S, 7, 10 * 3600 * S), 3),
        (quota_ns(u32::MAX - 1, 3, u32::MAX - 1, 100), 5),
    ];
    for (n, &(q, most)) in cases.iter().enumerate() {
        for seed in 1..=40u64 {
            let seed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n as u64;
            against_the_model::<Keyed>(q, most, seed, 200);
            against_the_model::<Direct>(q, most, seed, 200);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Idle keys are dropped as before, and dropping them changes no decision.

/// `KeyedRateLimiter::retain_recent`: "Drops every key whose state carries no information any
/// more. No decision changes"; `len`: "The number of keys held in memory". Random checks and
/// reservations on 40 keys with changes of period and raised limits (a lowered one breaks it:
/// see `attack_fixed_quota_idle_key_kept_or_swept_across_a_lowered_limit`): a limiter swept at random makes
/// every decision of an unswept twin, and once every reservation has fallen due and a cycle
/// more has passed, the sweep leaves no key.
#[test]
fn attack_fixed_quota_retain_recent_drops_idle_keys_and_changes_no_decision() {
    let pool = pool();
    for seed in 1..=60u64 {
        let mut rng = Rng(seed.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        let clock = Dial::at(BORN);
        let (swept, twin) = (keyed(pool[0], &clock), keyed(pool[0], &clock));
        let mut now = BORN;
        let mut last_due = BORN;
        // (key or none, what): the calls, for the failure's message.
        let mut log: Vec<(Option<u32>, String)> = Vec::new();
        for step in 0..400 {
            now += rng.below(300 * MS);
            set(&clock, now);
            let key = rng.below(40) as u32;
            match rng.below(12) {
                0 => {
                    // Never a lower limit: see
                    // `attack_fixed_quota_idle_key_kept_or_swept_across_a_lowered_limit`.
                    let q = pool[rng.below(pool.len() as u64) as usize];
                    if q.permits() < swept.quota().permits() {
                        continue;
                    }
                    swept.set_quota(q);
                    twin.set_quota(q);
                    log.push((None, format!("{}: {q:?}", now - BORN)));
                }
                1 | 2 => {
                    swept.retain_recent();
                    log.push((None, format!("{}: sweep", now - BORN)));
                }
                _ => {
                    let cost = 1 + rng.below(2) as u32;
                    let a = Limiter::reserve_now(&swept, &key, cost).unwrap();
                    let b = Limiter::reserve_now(&twin, &key, cost).unwrap();
                    let (a, b) = (
                        a.ok().map(|d| (d.allowed, d.wait)),
                        b.ok().map(|d| (d.allowed, d.wait)),
                    );
                    log.push((
                        Some(key),
                        format!("{}: key {key} reserves {cost}: {b:?}", now - BORN),
                    ));
                    if a != b {
                        let mine = log.iter().filter(|(k, _)| k.is_none_or(|k| k == key));
                        let mine: Vec<_> = mine.map(|(_, l)| l.as_str()).collect();
                        panic!(
                            "seed {seed}, step {step}: {a:?} swept, {b:?} unswept:\n{}",
                            mine.join("\n")
                        );
                    }
                    if let Some((true, wait)) = a {
                        last_due = last_due.max(now + nanos(wait));
                    }
                }
            }
        }
        // Past every reservation and the longest period (2 s) twice.
        set(&clock, last_due.max(now) + 5 * S);
        swept.retain_recent();
        assert_eq!(swept.len(), 0, "seed {seed}: keys left once all are idle");
    }
}

/// `KeyedRateLimiter::retain_recent`: "Drops every key whose state carries no information any
/// more. No decision changes"; `FixedWindow`: "Idle cycles never build up more than `permits`",
/// "Without a reservation ahead, or without a change, none of this applies". 4 per 1 s: a key
/// takes 4 at 0.5 s and nothing since; at 1.2 s one limiter is swept (the key, idle since its
/// cycle ended, is dropped), the other not; at 1.5 s the limit becomes 1; at 1.6 s the key
/// reserves 1. Both must decide alike (the model: at once, the cycle of 0.5 s has ended).
#[test]
#[ignore = "found by attack: a lowered limit drains an idle key's count of an ended cycle at the new limit, so a swept key (dropped) is admitted at once and a kept one waits 2.4 s"]
fn attack_fixed_quota_idle_key_kept_or_swept_across_a_lowered_limit() {
    let clock = Dial::at(BORN);
    let q = quota_ns(4, S, 4, 3 * S);
    let (kept, swept) = (keyed(q, &clock), keyed(q, &clock));
    set(&clock, BORN + S / 2);
    assert!(kept.check_n(&1, 4).unwrap().allowed);
    assert!(swept.check_n(&1, 4).unwrap().allowed);
    set(&clock, BORN + 6 * S / 5);
    swept.retain_recent();
    set(&clock, BORN + 3 * S / 2);
    for l in [&kept, &swept] {
        l.set_quota(quota_ns(1, S, 1, 3 * S));
    }
    set(&clock, BORN + 8 * S / 5);
    let got = Limiter::reserve_now(&kept, &1, 1).unwrap().unwrap();
    let fresh = Limiter::reserve_now(&swept, &1, 1).unwrap().unwrap();
    assert_eq!(
        (got.allowed, got.wait),
        (fresh.allowed, fresh.wait),
        "kept: {got:?}; swept: {fresh:?}"
    );
    assert_eq!(got.wait, Duration::ZERO, "{got:?}");
}

/// The same as [`attack_fixed_quota_idle_key_kept_or_swept_across_a_lowered_limit`] across
/// two changes of period, each ending the cycle in progress at the change (`set_quota`: "makes
/// it end one new period after its start, or at the change if that instant has passed"): 4 per
/// 2 s, 4 taken at 0.5 s; 4 per 1 s from 3.2 s (the cycle [2 s, 4 s) ends there); 1 per 250 ms
/// from 3.7 s (the cycle [3.2 s, 4.2 s) ends there). At 3.75 s, three cycles after its last, the
/// key has its one permit at once.
#[test]
#[ignore = "found by attack: after two changes of period an idle key's count of a long-ended cycle still fills the cycle of 3.75 s (wait 200 ms, not 0)"]
fn attack_fixed_quota_idle_key_across_two_periods_ending_at_their_changes() {
    let clock = Dial::at(BORN);
    let l = keyed(quota_ns(4, 2 * S, 4, 3 * S), &clock);
    set(&clock, BORN + S / 2);
    assert!(l.check_n(&1, 4).unwrap().allowed);
    set(&clock, BORN + 3 * S + S / 5);
    l.set_quota(quota_ns(4, S, 4, 3 * S));
    set(&clock, BORN + 3 * S + 7 * S / 10);
    l.set_quota(quota_ns(1, S / 4, 1, 3 * S));
    set(&clock, BORN + 3 * S + 3 * S / 4);
    let got = Limiter::reserve_now(&l, &1, 1).unwrap().unwrap();
    assert_eq!(got.wait, Duration::ZERO, "{got:?}");
}

/// `FixedWindow`: "A raised limit applies from the cycle that last one falls due in (before it,
/// the key admits no more than the old limit would have let it); a lowered one at once (the
/// count, reservations included, drains by it, slower than they fall due, so a cycle holds no
/// more than the larger of its reservations and the new limit)"; `set_quota`: "a count above a
/// lowered limit is debt that the next cycles pay". 20 per 1 s: 7 taken at 3 s; 1 per 1 s (up
/// to 1 h) from 3.75 s, so the 6 above the limit are debt: reservations at 4 s and 4.25 s fall
/// due at 10, 11 and 12 s; 20 per 1 s from 4.5 s (requests refused from 4.75 s to 6.25 s); 7
/// then 1 per 1 s again from 6.25 s. A
/// reservation at 6.25 s falls due at 13 s, after the three (the debt was paid by then): the
/// count the raise laid out must not turn into more debt. Found by the Redis twin schedule
/// (`tests/redis/attack_fixed_quota.rs`), where memory said 120.75 s and Redis 158.75 s.
#[test]
#[ignore = "found by attack: a limit raised then lowered while reservations stand ahead turns the raise's laid-out count into debt (wait of minutes where 6.75 s is due)"]
fn attack_fixed_quota_raised_then_lowered_back_with_reservations_ahead() {
    let clock = Dial::at(BORN);
    let (twenty, one) = (quota_ns(20, S, 20, 3 * S), quota_ns(1, S, 1, 3600 * S));
    let l = keyed(twenty, &clock);
    let waits = |l: &Keyed| Limiter::reserve_now(l, &1, 1).unwrap().unwrap().wait;
    set(&clock, BORN + 3 * S);
    assert!(l.check_n(&1, 7).unwrap().allowed);
    set(&clock, BORN + 15 * S / 4);
    l.set_quota(one);
    set(&clock, BORN + 4 * S);
    assert_eq!(waits(&l), Duration::from_secs(6));
    set(&clock, BORN + 17 * S / 4);
    assert_eq!(waits(&l), Duration::from_millis(6750));
    assert_eq!(waits(&l), Duration::from_millis(7750));
    set(&clock, BORN + 9 * S / 2);
    l.set_quota(twenty);
    // Refused requests (the count is above 20 until 12 s), as the schedule made them.
    for (at, n) in [(19, 2), (20, 2), (21, 4), (22, 2), (23, 1), (25, 1)] {
        set(&clock, BORN + at * S / 4);
        for _ in 0..n {
            assert!(!Limiter::reserve_now(&l, &1, 1).unwrap().unwrap().allowed);
        }
    }
    set(&clock, BORN + 25 * S / 4);
    l.set_quota(quota_ns(7, S, 7, 0));
    l.set_quota(one);
    assert_eq!(waits(&l), Duration::from_millis(6750));
}
