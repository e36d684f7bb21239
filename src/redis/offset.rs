//! What the replies say about the server's clock, so that a script can tell that its caller has
//! stopped waiting.
//!
//! Every script reply ends with the server's `TIME` at the moment the script ran. That moment lies
//! between the instant the request was sent (`sent`, on the limiter's clock) and the instant the
//! reply was read (`received`), so the offset `server − local` lies in
//! `[time − received, time − sent]`. The estimator keeps the greatest lower bound seen, because
//! the safe error is an offset that is too *small*: the server deadline `local deadline + offset`
//! is then *earlier* than the true one, and a script that runs near the deadline answers "late"
//! to a caller that was perhaps still waiting (the fail mode decides for it: the same answer
//! it would have got a moment later). An offset too large would let a script spend permits for a
//! caller that the fail mode had already answered, which is the fault this exists to stop.
//!
//! * **Out of order.** Each reply is judged by its own `sent` and `received`, so the order in
//!   which replies are read does not matter: a reply read late only gives a looser lower bound.
//! * **Drift.** A bound loses [`DRIFT_PER_TICK`] of its value per tick of age (100 ppm, beyond
//!   what NTP lets a clock slew), so a bound measured long ago stays a lower bound.
//! * **Steps.** A reply whose upper bound lies below the kept lower bound proves the clocks moved
//!   apart (the server's clock was stepped back, or a manual test clock jumped ahead): the kept
//!   bound is dropped for the new one.
//! * **Unknown.** Before the first reply there is no bound: [`ClockOffset::server_deadline`]
//!   answers `None`, and the caller sends a deadline already past, which the script answers
//!   "late" without touching any state, with its `TIME`: a probe, after which the real request
//!   goes with a real deadline.

use crate::sync::{lock, Mutex};

/// The share of its age by which a bound is lowered: 1 / 10 000 (100 ppm).
pub(crate) const DRIFT_PER_TICK: u64 = 10_000;

/// A lower bound of the offset `server − local`, in nanoseconds, and the local instant it was
/// measured at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bound {
    offset: i128,
    at: u64,
}

impl Bound {
    /// The bound at local instant `t`, lowered for the drift since it was measured.
    fn at(self, t: u64) -> i128 {
        let age = t.saturating_sub(self.at);
        self.offset - i128::from(age.div_ceil(DRIFT_PER_TICK))
    }
}

/// The estimator of the offset between the limiter's clock and the server's `TIME`.
#[derive(Debug, Default)]
pub(crate) struct ClockOffset {
    bound: Mutex<Option<Bound>>,
}

impl ClockOffset {
    /// Takes in one reply: sent at `sent`, read at `received` (limiter clock, nanoseconds), run
    /// by the server at `server_micros` (its `TIME`).
    pub(crate) fn observe(&self, sent: u64, received: u64, server_micros: u64) {
        let server = i128::from(server_micros) * 1000;
        let received = received.max(sent);
        let new = Bound {
            offset: server - i128::from(received),
            at: received,
        };
        let upper = server - i128::from(sent);
        let mut bound = lock(&self.bound);
        *bound = Some(match *bound {
            None => new,
            // The clocks moved apart: what was known no longer holds.
            Some(old) if upper < old.at(sent) => new,
            // The tighter at the later of their instants; the new one if they tie.
            Some(old) => {
                let t = old.at.max(new.at);
                std::cmp::max_by_key(old, new, |bound| bound.at(t))
            }
        });
    }

    /// The server's `TIME` (microseconds, rounded down) that corresponds at the latest to the
    /// local instant `local`, or `None` before any reply.
    pub(crate) fn server_deadline(&self, local: u64) -> Option<u64> {
        let bound = (*lock(&self.bound))?;
        let server = i128::from(local) + bound.at(local);
        Some(u64::try_from(server.div_euclid(1000).max(0)).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn unknown_until_the_first_reply() {
        let c = ClockOffset::default();
        assert_eq!(c.server_deadline(5 * MS), None);
        // Sent at 10 ms, read at 12 ms, the server said 1 000 000 µs: offset in [988, 990] ms.
        c.observe(10 * MS, 12 * MS, 1_000_000);
        assert_eq!(c.server_deadline(12 * MS), Some(1_000_000));
        // 100 ms later in local time, minus the drift allowance (10 µs) of 100 ms of age.
        assert_eq!(c.server_deadline(112 * MS), Some(1_099_990));
    }

    #[test]
    fn the_tightest_lower_bound_wins_in_any_order() {
        let a = ClockOffset::default();
        let b = ClockOffset::default();
        // True offset 500 ms; two replies with different round trips, read in either order.
        let samples = [(10 * MS, 30 * MS, 520_000), (40 * MS, 41 * MS, 540_500)];
        for s in samples {
            a.observe(s.0, s.1, s.2);
        }
        for s in samples.iter().rev() {
            b.observe(s.0, s.1, s.2);
        }
        assert_eq!(a.server_deadline(41 * MS), Some(540_500));
        assert_eq!(a.server_deadline(41 * MS), b.server_deadline(41 * MS));
    }

    #[test]
    fn a_clock_stepped_back_replaces_the_bound() {
        let c = ClockOffset::default();
        c.observe(10 * MS, 11 * MS, 1_000_000);
        // The server's clock went back by 200 ms: this reply's upper bound is below the old one.
        c.observe(20 * MS, 21 * MS, 810_000);
        assert_eq!(c.server_deadline(21 * MS), Some(810_000));
    }

    proptest! {
        /// Whatever the order, the round trips and the skew, the server deadline is never later
        /// than the true one: a script run after its caller's deadline always sees it passed.
        #[test]
        fn the_deadline_is_never_later_than_the_truth(
            offset in -(1i64 << 50)..(1i64 << 50),
            replies in prop::collection::vec((0u64..1_000_000_000, 0u64..50_000_000, 0u64..50_000_000), 1..40),
            order in any::<prop::sample::Index>(),
            local in 0u64..2_000_000_000,
        ) {
            let c = ClockOffset::default();
            // Each reply: sent at `s`, run `up` later, read `down` after that; the server's TIME
            // is the true server time of the run (rounded down to µs, as TIME is).
            let mut samples: Vec<(u64, u64, u64)> = replies
                .iter()
                .filter_map(|&(s, up, down)| {
                    let run = i128::from(s + up) + i128::from(offset) + (1i128 << 52);
                    let micros = u64::try_from(run / 1000).ok()?;
                    Some((s, s + up + down, micros))
                })
                .collect();
            let k = order.index(samples.len().max(1));
            let len = samples.len();
            samples.rotate_left(k.min(len));
            for (s, r, t) in samples {
                c.observe(s, r, t);
            }
            if let Some(deadline) = c.server_deadline(local) {
                let truth = i128::from(local) + i128::from(offset) + (1i128 << 52);
                prop_assert!(i128::from(deadline) * 1000 <= truth, "{deadline} µs vs {truth} ns");
            }
        }
    }
}
