//! The one bounded table of per-key entries a Redis limiter keeps in its process: the refusals
//! it caches and the shares its leases hold. (The coalescer's table of keys with a call in
//! flight needs no bound: an entry lives only while its call does.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sync::{lock, Mutex, MutexGuard};

/// Entries by Redis key, at most `capacity` of them, behind one lock.
///
/// A new key finds room while the table has some; once it is full, the table is swept for
/// entries that no longer matter (each user says which) at the first new key turned away and
/// then once for each quarter of the capacity turned away, so that a table full of live entries
/// costs a new key one lookup, not a walk of every entry under the lock that every decision
/// needs. A key turned away is decided as if the table did not exist (in Redis).
#[derive(Debug)]
pub(crate) struct KeyTable<V> {
    entries: Mutex<HashMap<String, V>>,
    capacity: usize,
    /// New keys turned away since the table was last swept.
    turned_away: AtomicU64,
    /// How many times the table was swept (for the tests).
    #[cfg(test)]
    pub(crate) sweeps: AtomicU64,
}

impl<V> KeyTable<V> {
    /// An empty table of at most `capacity` keys.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity,
            turned_away: AtomicU64::new(0),
            #[cfg(test)]
            sweeps: AtomicU64::new(0),
        }
    }

    /// The entries, locked. A poisoned lock is used as it is: each entry is replaced whole.
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<String, V>> {
        lock(&self.entries)
    }

    /// The entry of `key` in `entries` (this table, locked), made by `make` if the key is new and
    /// there is room, after a sweep that keeps only the entries `live` says matter if it is
    /// the sweep's turn; `None` if the key is turned away.
    pub(crate) fn entry<'a>(
        &self,
        entries: &'a mut HashMap<String, V>,
        key: &str,
        make: impl FnOnce() -> V,
        mut live: impl FnMut(&V) -> bool,
    ) -> Option<&'a mut V> {
        if !entries.contains_key(key) && entries.len() >= self.capacity {
            let turned_away = self.turned_away.fetch_add(1, Ordering::Relaxed);
            if turned_away % (self.capacity as u64 / 4).max(1) != 0 {
                return None;
            }
            #[cfg(test)]
            self.sweeps.fetch_add(1, Ordering::Relaxed);
            entries.retain(|_, value| live(value));
            if entries.len() >= self.capacity {
                return None;
            }
            self.turned_away.store(0, Ordering::Relaxed);
        }
        Some(entries.entry(key.to_owned()).or_insert_with(make))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table full of live entries is swept at the first key turned away and then once for
    /// each quarter of its capacity turned away; an entry that stops mattering makes room at
    /// the next sweep.
    #[test]
    fn a_full_table_is_swept_once_for_a_quarter_of_its_capacity_turned_away() {
        let table = KeyTable::<u64>::new(8);
        let mut entries = table.lock();
        for k in 0..8 {
            assert!(table
                .entry(&mut entries, &format!("k{k}"), || k, |_| true)
                .is_some());
        }
        for k in 0..8 {
            let turned = table.entry(&mut entries, &format!("new{k}"), || 0, |_| true);
            assert!(turned.is_none(), "full of live entries");
        }
        // The first key turned away swept, then every second one (a quarter of 8).
        assert_eq!(table.sweeps.load(Ordering::Relaxed), 4);
        // A known key is found whatever the table holds.
        assert_eq!(
            table.entry(&mut entries, "k3", || 99, |_| true),
            Some(&mut 3)
        );
        // The next sweep drops what no longer matters and makes room.
        let made = table.entry(&mut entries, "late", || 7, |v| *v != 0);
        assert_eq!(made, Some(&mut 7));
        assert!(!entries.contains_key("k0"));
    }
}
