use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

use super::Algorithm;
use crate::{Decision, Quota};

/// The Generic Cell Rate Algorithm: the default.
///
/// The state of a key is one number, its *theoretical arrival time* (TAT): the instant at which the
/// key's bucket would be full again. A request of cost `n` at `now` moves the TAT to
/// `max(TAT, now) + n·T` (T is the emission interval, `period / permits`) and is admitted if that
/// new TAT lies no more than `burst·T` ahead of `now`. A key whose TAT is in the past is
/// indistinguishable from a new key, which is what makes eviction free.
///
/// Guarantee: over any span of length `S`, a key is admitted at most `burst + S / T` permits.
#[derive(Clone, Copy, Debug)]
pub struct Gcra {
    interval: u64,
    /// `burst · interval`: how far ahead of now the TAT may run.
    horizon: u64,
    burst: u32,
    /// `floor((2^64 - 1) / interval)`, so that the hot path divides by multiplying (see
    /// [`Gcra::permits_in`]).
    magic: u64,
}

impl Gcra {
    /// `span / interval`, rounded down: how many whole permits fit in `span` nanoseconds.
    ///
    /// A 64-bit integer division costs tens of cycles, more than the rest of a check; instead the
    /// span is multiplied by `magic = floor((2^64 - 1) / interval)` and the high half taken. For
    /// spans below 2^50 that estimate falls short of the quotient by less than `span / 2^64`, so
    /// it is the quotient or one less, and one comparison settles which.
    #[inline]
    fn permits_in(&self, span: u64) -> u64 {
        if span >= 1 << 50 {
            // Spans of more than 13 days are rare: divide plainly.
            return span / self.interval;
        }
        let mut q = ((u128::from(span) * u128::from(self.magic)) >> 64) as u64;
        // q * interval <= span, so the subtraction cannot underflow.
        if span - q * self.interval >= self.interval {
            q += 1;
        }
        q
    }

    /// One step of the algorithm on a plain TAT: the decision, and the new TAT when admitted.
    ///
    /// Always inlined: returned through memory, the decision's fields are written narrow and
    /// read back wide, and the store-forwarding stall that follows costs more than the step.
    #[inline(always)]
    pub(crate) fn step(
        &self,
        tat: u64,
        now: u64,
        cost: u32,
        max_wait: u64,
    ) -> (Decision, Option<u64>) {
        let limit = u64::from(self.burst);
        let base = tat.max(now);
        let new_tat = base.saturating_add(self.interval.saturating_mul(u64::from(cost)));
        let allow_at = new_tat.saturating_sub(self.horizon);
        if allow_at <= now {
            let remaining = self.permits_in(now + self.horizon - new_tat);
            let reset = Duration::from_nanos(new_tat - now);
            return (Decision::allowed(limit, remaining, reset), Some(new_tat));
        }
        let wait = allow_at - now;
        if wait <= max_wait {
            let reset = Duration::from_nanos(new_tat - now);
            let d = Decision::reserved(limit, 0, reset, Duration::from_nanos(wait), allow_at);
            return (d, Some(new_tat));
        }
        let remaining = self.permits_in((now + self.horizon).saturating_sub(base));
        let d = Decision::refused(
            limit,
            remaining,
            Duration::from_nanos(wait),
            Duration::from_nanos(base - now),
        );
        (d, None)
    }
}

impl Algorithm for Gcra {
    type State = AtomicU64;

    fn new(quota: &Quota, _epoch: u64) -> Self {
        let interval = quota.emission_interval_nanos();
        Self {
            interval,
            horizon: interval * u64::from(quota.burst()),
            burst: quota.burst(),
            magic: u64::MAX / interval,
        }
    }

    fn capacity(&self) -> u32 {
        self.burst
    }

    #[inline(always)]
    fn decide(&self, state: &AtomicU64, now: u64, cost: u32, max_wait: u64) -> Decision {
        let mut tat = state.load(Ordering::Acquire);
        loop {
            let (decision, new_tat) = self.step(tat, now, cost, max_wait);
            let Some(new_tat) = new_tat else {
                return decision;
            };
            match state.compare_exchange_weak(tat, new_tat, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return decision,
                Err(actual) => tat = actual,
            }
        }
    }

    fn refund(&self, state: &AtomicU64, now: u64, cost: u32, _reserved_at: u64) {
        let give_back = self.interval.saturating_mul(u64::from(cost));
        let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
            // Only time still ahead of now can be given back; the past is spent.
            (tat > now).then(|| tat.saturating_sub(give_back).max(now))
        });
    }

    fn idle_at(&self, state: &AtomicU64) -> u64 {
        state.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(permits: u32, period_ms: u64, burst: u32) -> Gcra {
        let q = Quota::with_period(permits, Duration::from_millis(period_ms))
            .unwrap()
            .with_burst(burst)
            .unwrap();
        Gcra::new(&q, 0)
    }

    #[test]
    fn ten_per_second_then_refusal_then_recovery() {
        let g = gcra(10, 1000, 10);
        let s = AtomicU64::new(0);
        for i in 0..10 {
            let d = g.decide(&s, 0, 1, 0);
            assert!(d.allowed, "check {i}");
            assert_eq!(d.remaining, 9 - i);
        }
        let d = g.decide(&s, 0, 1, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(100));
        assert_eq!(d.reset_after, Duration::from_secs(1));
        assert_eq!(d.remaining, 0);
        assert!(g.decide(&s, 100_000_000, 1, 0).allowed);
    }

    #[test]
    fn division_by_multiplication_is_exact() {
        for interval in [1u64, 3, 7, 100, 333_333_334, 1_000_000_007, u64::MAX / 3] {
            let q = Quota::with_period(1, Duration::from_nanos(interval)).unwrap();
            let g = Gcra::new(&q, 0);
            let spans = [
                0,
                1,
                interval - 1,
                interval,
                interval + 1,
                3 * interval,
                u64::MAX / 2,
                u64::MAX,
            ];
            for span in spans {
                assert_eq!(g.permits_in(span), span / interval, "{span} / {interval}");
            }
        }
        // Pseudo-random intervals and spans below 2^50, and the spans on either side of a
        // multiple of the interval, where an estimate off by one would show.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let interval = 1 + next() % (1 << (next() % 50));
            let g = Gcra::new(
                &Quota::with_period(1, Duration::from_nanos(interval)).unwrap(),
                0,
            );
            let span = next() % (1 << 50);
            let k = span / interval;
            for span in [span, k * interval, (k * interval).saturating_sub(1)] {
                assert_eq!(g.permits_in(span), span / interval, "{span} / {interval}");
            }
        }
    }

    #[test]
    fn reservation_and_refund() {
        let g = gcra(1, 1000, 1);
        let s = AtomicU64::new(0);
        assert!(g.decide(&s, 0, 1, 0).allowed);
        let d = g.decide(&s, 0, 1, 2_000_000_000);
        assert!(d.allowed);
        assert_eq!(d.wait, Duration::from_secs(1));
        g.refund(&s, 10, 1, d.reserved_at);
        // After the refund, the next caller gets the same slot, not a later one.
        let again = g.decide(&s, 10, 1, 2_000_000_000);
        assert_eq!(again.wait, Duration::from_nanos(1_000_000_000 - 10));
    }
}
