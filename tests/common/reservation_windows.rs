//! The windows of a fixed window across changes of quota, for the attacks on its reservations
//! (`tests/limiter/attack_direct/second.rs`, in memory; `tests/redis/attack_two.rs`, in
//! Redis): what each window admitted at once, and the reservations that fall due in it, all of
//! them and those made under an earlier quota.

use std::collections::BTreeMap;

use tower_bulwark::Quota;

/// One window: the larger limit in force in it, the index in the changes of the quota in
/// force at its latest request, what it admitted at once, and the reservations due in it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    limit: u64,
    quota: usize,
    admitted: u64,
    due: u64,
    due_from_before: u64,
}

/// The windows of `changes` (the quotas in force from their instants, the first from 0), with
/// what was seen in each.
pub struct ReservationWindows {
    /// The periods in force, by the instant their windows start from.
    periods: Vec<(u64, u64)>,
    limits: Vec<u64>,
    seen: BTreeMap<(u64, u64), Seen>,
    /// The window each reservation falls due in, and the quota it was made under.
    reserved: Vec<((u64, u64), usize)>,
}

impl ReservationWindows {
    /// A change of period comes only at an instant both periods divide, so that the windows
    /// are whole periods of the one in force from there.
    pub fn new(changes: &[(u64, Quota)], what: &str) -> Self {
        let period = |q: Quota| q.period().as_nanos() as u64;
        let mut periods = vec![(0, period(changes[0].1))];
        for &(at, q) in &changes[1..] {
            let (new, old) = (period(q), periods.last().unwrap().1);
            if new != old {
                assert!(
                    at % new == 0 && at % old == 0,
                    "{what}: a change of period at {at} ns"
                );
                periods.push((at, new));
            }
        }
        let limits = changes
            .iter()
            .map(|(_, q)| u64::from(q.permits()))
            .collect();
        let (seen, reserved) = (BTreeMap::new(), Vec::new());
        Self {
            periods,
            limits,
            seen,
            reserved,
        }
    }

    fn window_of(&self, t: u64) -> (u64, u64) {
        let &(from, period) = self
            .periods
            .iter()
            .rev()
            .find(|(from, _)| *from <= t)
            .unwrap();
        let start = from + (t - from) / period * period;
        (start, start + period)
    }

    /// A request at `now` under the quota of index `quota`: the window's limit and quota.
    pub fn request(&mut self, now: u64, quota: usize) {
        let here = self.seen.entry(self.window_of(now)).or_default();
        here.limit = here.limit.max(self.limits[quota]);
        here.quota = quota;
    }

    /// One admitted at `now`, at once.
    pub fn admitted(&mut self, now: u64) {
        self.seen.entry(self.window_of(now)).or_default().admitted += 1;
    }

    /// A reservation at `now`, due after `wait` ns, under the quota of index `quota`.
    pub fn reserved(&mut self, now: u64, wait: u64, quota: usize) {
        self.reserved.push((self.window_of(now + wait), quota));
    }

    /// Asserts that every window that ends by `end` holds what falls due in it and what it
    /// admits at once, no more than its limit (the larger of two, in the window of a change) or
    /// the reservations made under an earlier quota that fall due in it, whichever is more: a
    /// lowered limit cannot take back what was promised under the old one, and nothing may be
    /// added to it.
    pub fn assert_kept(mut self, end: u64, what: &str) {
        for (window, made_under) in std::mem::take(&mut self.reserved) {
            let w = self.seen.entry(window).or_default();
            w.due += 1;
            if made_under < w.quota {
                w.due_from_before += 1;
            }
        }
        let seen = &self.seen;
        for (&(start, until), w) in seen.range(..(end, 0)) {
            assert!(
                until > end || w.due + w.admitted <= w.limit.max(w.due_from_before),
                "{what}: the window [{start}, {until}) ns holds {} reservations due in it ({} \
                 made under an earlier quota) and admits {} more at once, under a limit of {}; \
                 windows: {seen:?}",
                w.due,
                w.due_from_before,
                w.admitted,
                w.limit
            );
        }
    }
}

const S: u64 = 1_000_000_000;

/// `permits` per `period` ns, in one burst, waiting up to 3 s.
pub fn waiting(permits: u32, period: u64) -> Quota {
    super::quota_ns(permits, period, permits, 3 * S)
}

/// Six limits in a row, each from its instant: 10, 20, 8, 12, 30, 5 per 1 s.
pub fn limit_changes_in_a_row() -> [(u64, Quota); 6] {
    [
        (0, waiting(10, S)),
        (S / 2, waiting(20, S)),
        (7 * S / 2, waiting(8, S)),
        (15 * S / 4, waiting(12, S)),
        (21 * S / 4, waiting(30, S)),
        (17 * S / 2, waiting(5, S)),
    ]
}

/// Six quotas in a row, their periods changing at instants both periods divide: 10 per 1 s,
/// 10 per 500 ms, 20 per 2 s, 10 then 40 per 250 ms, 30 per 1 s.
pub fn period_changes_in_a_row() -> [(u64, Quota); 6] {
    [
        (0, waiting(10, S)),
        (S, waiting(10, S / 2)),
        (4 * S, waiting(20, 2 * S)),
        (6 * S, waiting(10, S / 4)),
        (13 * S / 2, waiting(40, S / 4)),
        (7 * S, waiting(30, S)),
    ]
}
