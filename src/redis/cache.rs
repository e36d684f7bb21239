//! The local cache of refusals: a key that Redis refused is refused here until its retry time.

use std::collections::HashMap;
#[cfg(test)]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::decision::Decision;

/// Refused keys, each with the instant (limiter clock, nanoseconds) until which it stays refused.
#[derive(Debug)]
pub(crate) struct RefusalCache {
    entries: Mutex<HashMap<String, Refusal>>,
    capacity: usize,
    /// While the cache is full of live refusals: the instant the first of them ends. Until then
    /// a new refusal is not cached, without scanning the whole cache again (under a flood of
    /// refused keys every refusal would otherwise scan it, holding the lock every decision
    /// needs).
    full_until: AtomicU64,
    /// How many times the cache was scanned for ended refusals (for the tests).
    #[cfg(test)]
    scans: AtomicUsize,
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
            entries: Mutex::new(HashMap::new()),
            capacity,
            full_until: AtomicU64::new(0),
            #[cfg(test)]
            scans: AtomicUsize::new(0),
        }
    }

    /// The refusal of `cost` permits for `key` at `now`, if a known refusal still stands.
    ///
    /// A cached refusal stands for a request of the same cost only (a larger one would wait
    /// longer, by an amount only the algorithm's state tells), while its retry time is further
    /// away than `max_wait` (once it is within, Redis may grant a reservation).
    pub(crate) fn check(&self, key: &str, cost: u32, now: u64, max_wait: u64) -> Option<Decision> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
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
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let refusal = Refusal {
            until: now.saturating_add(nanos(decision.retry_after)),
            reset_at: now.saturating_add(nanos(decision.reset_after)),
            cost,
            limit: decision.limit,
            remaining: decision.remaining,
        };
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.capacity && !entries.contains_key(key) {
            if now < self.full_until.load(Ordering::Relaxed) {
                // Still full of live refusals: this one goes to Redis next time, which is
                // still correct.
                return;
            }
            #[cfg(test)]
            self.scans.fetch_add(1, Ordering::Relaxed);
            let mut first_end = u64::MAX;
            entries.retain(|_, r| {
                let live = r.until > now;
                if live {
                    first_end = first_end.min(r.until);
                }
                live
            });
            if entries.len() >= self.capacity {
                self.full_until.store(first_end, Ordering::Relaxed);
                return;
            }
        }
        // The latest refusal of the key, whatever its cost, replaces the one before.
        entries.insert(key.to_owned(), refusal);
    }

    /// Forgets every refusal (the quota changed, so their retry times may be wrong).
    pub(crate) fn clear(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.clear();
        self.full_until.store(0, Ordering::Relaxed);
    }

    /// Forgets `key` (its permits were given back, so a refusal may be too pessimistic).
    pub(crate) fn forget(&self, key: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.remove(key);
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

    /// A flood of refused keys into a cache full of live refusals costs one scan until the
    /// first of them ends, not one per refusal (each scan holds the lock every decision needs).
    #[test]
    fn a_full_cache_is_scanned_once_until_a_refusal_ends() {
        let cache = RefusalCache::new(100);
        for k in 0..100 {
            cache.insert(&format!("held{k}"), 1, 0, &refused(1_000 + k));
        }
        for k in 0..10_000 {
            cache.insert(&format!("flood{k}"), 1, MS, &refused(1_000));
        }
        assert_eq!(cache.scans.load(Ordering::Relaxed), 1);
        assert!(
            cache.check("held0", 1, MS, 0).is_some(),
            "the held refusals stand"
        );
        // Once the first refusal ends, the next insert scans again and takes its place.
        cache.insert("late", 1, 1_000 * MS, &refused(1_000));
        assert_eq!(cache.scans.load(Ordering::Relaxed), 2);
        assert!(cache.check("late", 1, 1_000 * MS, 0).is_some());
        assert!(cache.check("held0", 1, 1_000 * MS, 0).is_none(), "ended");
    }
}
