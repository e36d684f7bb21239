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
