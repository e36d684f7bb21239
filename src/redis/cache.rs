//! The local cache of refusals: a key that Redis refused is refused here until its retry time.

use std::time::Duration;

use super::key_table::KeyTable;
use crate::clock::saturating_nanos;
use crate::decision::Decision;

/// Refused keys, each with the instant (limiter clock, nanoseconds) until which it stays refused;
/// a full cache is swept for refusals that have ended (see [`KeyTable`]), and a refusal that
/// finds no room goes to Redis next time, which is still correct.
#[derive(Debug)]
pub(crate) struct RefusalCache {
    entries: KeyTable<Refusal>,
}

#[derive(Clone, Copy, Debug)]
struct Refusal {
    /// Until when a request of `cost` is refused.
    until: u64,
    /// When the key is back to its full limit.
    reset_at: u64,
    cost: u32,
    limit: u64,
    remaining: u64,
}

impl RefusalCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: KeyTable::new(capacity),
        }
    }

    /// The refusal of `cost` permits for `key` at `now`, if a known refusal still stands.
    ///
    /// A cached refusal stands for a request of the same cost only (a larger one would wait
    /// longer, by an amount only the algorithm's state tells), while its retry time is further
    /// away than `max_wait` (once it is within, Redis may grant a reservation).
    pub(crate) fn check(&self, key: &str, cost: u32, now: u64, max_wait: u64) -> Option<Decision> {
        let mut entries = self.entries.lock();
        let entry = *entries.get(key)?;
        if entry.until <= now {
            entries.remove(key);
            return None;
        }
        let left = entry.until - now;
        if cost != entry.cost || left <= max_wait {
            return None;
        }
        Some(Decision::refused(
            entry.limit,
            entry.remaining,
            Duration::from_nanos(left),
            Duration::from_nanos(entry.reset_at.saturating_sub(now)),
        ))
    }

    /// Remembers that Redis refused `cost` permits for `key`, with `decision`, at `now`.
    pub(crate) fn insert(&self, key: &str, cost: u32, now: u64, decision: &Decision) {
        let refusal = Refusal {
            until: now.saturating_add(saturating_nanos(decision.retry_after)),
            reset_at: now.saturating_add(saturating_nanos(decision.reset_after)),
            cost,
            limit: decision.limit,
            remaining: decision.remaining,
        };
        let mut entries = self.entries.lock();
        let live = |r: &Refusal| r.until > now;
        if let Some(entry) = self.entries.entry(&mut entries, key, || refusal, live) {
            // The latest refusal of the key, whatever its cost, replaces the one before.
            *entry = refusal;
        }
    }

    /// Forgets every refusal (the quota changed, so their retry times may be wrong).
    pub(crate) fn clear(&self) {
        self.entries.lock().clear();
    }

    /// Forgets `key` (its permits were given back, so a refusal may be too pessimistic).
    pub(crate) fn forget(&self, key: &str) {
        self.entries.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn refused(retry_ms: u64) -> Decision {
        Decision::refused(
            5,
            0,
            Duration::from_millis(retry_ms),
            Duration::from_millis(2 * retry_ms),
        )
    }

    #[test]
    fn a_refusal_stands_until_its_retry_time() {
        let cache = RefusalCache::new(10);
        assert!(cache.check("a", 1, 0, 0).is_none());
        cache.insert("a", 1, 0, &refused(100));
        let d = cache.check("a", 1, 40 * MS, 0).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(60));
        assert_eq!(d.reset_after, Duration::from_millis(160));
        assert!(cache.check("b", 1, 40 * MS, 0).is_none(), "other keys");
        assert!(cache.check("a", 1, 100 * MS, 0).is_none(), "retry time");
        assert!(
            cache.check("a", 1, 50 * MS, 0).is_none(),
            "expired entry gone"
        );
    }

    #[test]
    fn other_costs_and_waiting_callers_go_to_redis() {
        let cache = RefusalCache::new(10);
        cache.insert("a", 3, 0, &refused(100));
        assert!(cache.check("a", 2, 0, 0).is_none());
        assert!(
            cache.check("a", 4, 0, 0).is_none(),
            "a larger cost waits longer"
        );
        assert!(cache.check("a", 3, 0, 0).is_some());
        assert!(cache.check("a", 3, 0, 100 * MS).is_none());
        assert!(cache.check("a", 3, 50 * MS, 60 * MS).is_none());
        assert!(cache.check("a", 3, 50 * MS, 40 * MS).is_some());
        cache.forget("a");
        assert!(cache.check("a", 3, 0, 0).is_none());
    }

    #[test]
    fn the_cache_is_bounded() {
        let cache = RefusalCache::new(2);
        cache.insert("a", 1, 0, &refused(10));
        cache.insert("b", 1, 0, &refused(100));
        cache.insert("c", 1, 0, &refused(100));
        assert!(cache.check("c", 1, 0, 0).is_none(), "full of live entries");
        cache.insert("c", 1, 20 * MS, &refused(100));
        assert!(
            cache.check("c", 1, 20 * MS, 0).is_some(),
            "expired `a` made room"
        );
        assert!(cache.check("b", 1, 20 * MS, 0).is_some());
    }

    /// A flood of refused keys into a cache full of live refusals sweeps it once for each
    /// quarter of its capacity turned away, not once per refusal (each sweep holds the lock
    /// every decision needs); a refusal that has ended makes room at the next sweep.
    #[test]
    fn a_full_cache_is_swept_once_for_a_quarter_of_its_capacity_turned_away() {
        use std::sync::atomic::Ordering;
        let cache = RefusalCache::new(100);
        for k in 0..100 {
            cache.insert(&format!("held{k}"), 1, 0, &refused(1_000 + k));
        }
        for k in 0..10_000 {
            cache.insert(&format!("flood{k}"), 1, MS, &refused(1_000));
        }
        assert_eq!(cache.entries.sweeps.load(Ordering::Relaxed), 400);
        assert!(
            cache.check("held0", 1, MS, 0).is_some(),
            "the held refusals stand"
        );
        // Once the first refusal ends, a sweep takes its place.
        for k in 0..25 {
            cache.insert(&format!("late{k}"), 1, 1_000 * MS, &refused(1_000));
        }
        assert!((0..25).any(|k| cache.check(&format!("late{k}"), 1, 1_000 * MS, 0).is_some()));
        assert!(cache.check("held0", 1, 1_000 * MS, 0).is_none(), "ended");
    }
}
