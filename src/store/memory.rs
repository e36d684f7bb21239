//! The in-memory keyed store: sharded, bounded, evicting.
//!
//! Keys are spread over a power-of-two number of shards, each a hash table behind a
//! reader-writer lock. A request for a key already present takes only the read lock; the
//! algorithm then updates that key's state through its own atomic or mutex, so two keys in one
//! shard never wait on each other for longer than a table lookup. Each shard also keeps a
//! latest clock reading ([`LatestReading`]): the floor under its keys' own, raised before keys
//! are dropped.
//!
//! What one request writes, it writes away from what every other request only reads: the lock
//! is crossbeam's `ShardedLock`, whose readers each take a lock of their own thread's (a write
//! takes them all, only to insert or evict), and the shard's reading has a cache line of its own.
//! With std's `RwLock`, one reader count and the latest reading beside the table's header, two
//! threads checking one hot key wrote the line that each of them reads for every lookup: a
//! quarter to a half of governor's checks a second; with them apart, 1.3 to 2 times
//! (`PAIRED=20 THREADS=2 cargo bench --bench contention -- hot_key`).
//!
//! The store holds at most `max_keys` keys. When a shard is full, it first drops every key whose
//! state carries no information any more (its idle instant has passed), which changes no
//! decision: the store first publishes its own reading to the
//! shard's latest reading, so that a reading older than the drop that reaches a fresh key is
//! decided as of the drop, where the dropped state weighed nothing. If the shard is still full
//! of live keys, the [`Overflow`] setting decides.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::sync::ShardedLock;

use hashbrown::HashTable;

use crate::algorithm::LatestReading;
use crate::sync::unpoisoned;

/// What the in-memory store does when a new key arrives and its shard is full of live keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overflow {
    /// Evict the keys whose loss gives away least (a sixteenth of the shard at a time), then
    /// admit the new key. The default.
    ///
    /// An evicted key starts afresh next time, so it may receive up to one extra quota. Keys are
    /// ranked first by the permits that still weigh on the key's decisions (for GCRA, how far
    /// its TAT runs ahead); among keys holding as many, the one that took them earliest is kept
    /// (GCRA and the sliding log by when their records end), and where the states cannot tell
    /// (the window algorithms' counts, `Metered`'s held estimates, equal records), the key made
    /// first. A key that has used its whole quota always ranks above a fresh key with one
    /// request, and above a later key that spent as much, so a flood of new keys, however large, evicts the flood's own keys and never wipes
    /// the record of the clients that are being limited (while fewer than fifteen sixteenths of
    /// a shard are such clients).
    #[default]
    EvictNearestIdle,
    /// Refuse requests from new keys until a slot frees; keys already present are unaffected.
    ///
    /// Never forgets a live key, at the price of locking out new clients while the table is full
    /// (at most until the nearest key goes idle, which the refusal's `retry_after` says; a
    /// refund that leaves a key idle frees its slot at once).
    RefuseNewKeys,
}

/// A shard full of live keys under [`Overflow::RefuseNewKeys`]: a slot frees at `free_at`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShardFull {
    pub(crate) free_at: u64,
}

/// A value on a cache line of its own (64 bytes on the machines this is tuned for), for what
/// every request writes. Not crossbeam's `CachePadded`, which pads to 128 bytes on x86-64: a
/// check of 100 000 keys on one thread then touches one more line pair per shard, and ran at
/// 0.77-0.80 of governor's checks a second against 0.83-0.85 with this one (the 0.84 it ran at
/// before either; `PAIRED=20 THREADS=1 cargo bench --bench contention -- 100k`), with no change
/// to a hot key from two threads.
#[repr(align(64))]
struct OwnLine<T>(T);

/// One shard, in this order (`repr(C)`): its lock (whose readers' counts live elsewhere, one per
/// thread) with the table's header, which a request for a known key only reads, on the first
/// cache line; its latest reading, which such a request reads (GCRA's keys hold their own;
/// loom's models and give-backs write the shard's), on the second; `full_until`, read only under
/// the write lock, on the third.
#[repr(C, align(64))]
struct Shard<K, S, G> {
    table: ShardedLock<Table<K, S, G>>,
    /// The floor under the latest readings of the shard's keys, raised before keys are
    /// dropped, and its give-backs' mark (see [`LatestReading`]).
    latest: OwnLine<LatestReading>,
    /// Under [`Overflow::RefuseNewKeys`], while the shard is full: the instant its first key goes
    /// idle. Until then new keys are refused without scanning the shard again.
    full_until: AtomicU64,
}

/// One shard's keys, and the context their states are read with (the limiter's quota and
/// algorithm), behind the shard's lock: whoever reads a state reads the context that goes with
/// it, and a new context replaces the old one only while nobody reads the shard.
struct Table<K, S, G> {
    context: G,
    keys: HashTable<Entry<K, S>>,
    /// How many keys the shard has made: the next key's incarnation.
    made: u32,
}

/// A key, its state, and which of the key's incarnations this is: a key dropped and made
/// again is another, so that what an admission of the first gives back never reaches the
/// second (see [`fingerprint`]). Four bytes that the state's alignment leaves free beside the
/// common keys (an `Ipv4Addr`'s GCRA entry stays 32 bytes).
struct Entry<K, S> {
    key: K,
    incarnation: u32,
    state: S,
}

impl<K, S, G> Shard<K, S, G> {
    /// Runs `f` on `entry`'s state under `context`, with the shard's latest reading and the
    /// fingerprint the entry's decisions carry, its key's hash being `hash` (see [`fingerprint`]).
    fn run<R>(
        &self,
        context: &G,
        entry: &Entry<K, S>,
        hash: u64,
        f: impl FnOnce(&G, &S, &LatestReading, u64) -> R,
    ) -> R {
        let fingerprint = fingerprint(hash, entry.incarnation);
        f(context, &entry.state, &self.latest.0, fingerprint)
    }
}

/// The bits of a key's fingerprint that name its incarnation: the low 24.
const INCARNATION_BITS: u64 = (1 << 24) - 1;

/// What the store hands with a key's state for its decisions to carry: the key's hash, its low
/// bits replaced by the incarnation's (the table indexes by the low bits; the fingerprint is
/// never used to find the key). A decision whose fingerprint matches but for those bits was
/// made on an earlier incarnation of the key ([`same_key`]); one made 2^24 incarnations earlier
/// in the shard, which nothing tells apart, is a risk of one in 16 million per such key.
fn fingerprint(hash: u64, incarnation: u32) -> u64 {
    (hash & !INCARNATION_BITS) | (u64::from(incarnation) & INCARNATION_BITS)
}

/// Whether two fingerprints name the same key, whatever its incarnations.
pub(crate) fn same_key(a: u64, b: u64) -> bool {
    a & !INCARNATION_BITS == b & !INCARNATION_BITS
}

/// A bounded, sharded map from key to algorithm state, with a context per shard (see
/// [`set_context`](Self::set_context)), hashing keys with `H`.
pub(crate) struct MemoryStore<K, S, G, H> {
    hasher: H,
    shards: Box<[Shard<K, S, G>]>,
    shard_bits: u32,
    shard_cap: usize,
    overflow: Overflow,
}

impl<K, S, G, H> fmt::Debug for MemoryStore<K, S, G, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("max_keys", &(self.shard_cap * self.shards.len()))
            .field("overflow", &self.overflow)
            .finish_non_exhaustive()
    }
}

impl<K, S, G, H> MemoryStore<K, S, G, H>
where
    K: Hash + Eq + Clone,
    S: Default,
    G: Clone,
    H: BuildHasher,
{
    /// A store for at most `max_keys` keys (at least one), every shard starting with `context`,
    /// hashing keys with `hasher`.
    pub(crate) fn new(max_keys: usize, overflow: Overflow, context: G, hasher: H) -> Self {
        let max_keys = max_keys.max(1);
        // Enough shards to keep lock contention low, few enough that each holds a useful number
        // of keys (eviction works per shard).
        let wanted = (max_keys / 1024).clamp(1, 64);
        let shard_bits = usize::BITS - 1 - wanted.leading_zeros();
        let count = 1usize << shard_bits;
        let shards = (0..count)
            .map(|_| Shard {
                table: ShardedLock::new(Table {
                    context: context.clone(),
                    keys: HashTable::new(),
                    made: 0,
                }),
                latest: OwnLine(LatestReading::default()),
                full_until: AtomicU64::new(0),
            })
            .collect();
        Self {
            hasher,
            shards,
            shard_bits,
            shard_cap: max_keys / count,
            overflow,
        }
    }

    fn shard(&self, hash: u64) -> &Shard<K, S, G> {
        // The table uses the low bits for its index and the top seven for its tags; take the
        // shard from bits above 32 so the three do not correlate.
        let idx = ((hash >> 32) as usize) & ((1 << self.shard_bits) - 1);
        &self.shards[idx]
    }

    /// Runs `f` on the shard's context, the state of `key`, the shard's latest reading and the
    /// key's hash, inserting a fresh state if the key is new; `full` instead, with the context
    /// and the time, if there is no room for a new key.
    ///
    /// A known key is found under the shard's read lock; a new one is inserted under its write
    /// lock. `now` reads the clock, only when room is needed: `idle_at` tells which states may
    /// be dropped at that time (first published as the shard's latest reading); `rank` which
    /// live ones to evict first (lowest first). A known key never reads it here, so `f` reads
    /// the clock itself, once its state is found (see `KeyedRateLimiter::decide` for why that
    /// order matters).
    pub(crate) fn with<R>(
        &self,
        key: &K,
        now: impl FnOnce() -> u64,
        idle_at: impl Fn(&G, &S) -> u64,
        rank: impl Fn(&G, &S, u64) -> u128,
        f: impl FnOnce(&G, &S, &LatestReading, u64) -> R,
        full: impl FnOnce(&G, ShardFull, u64) -> R,
    ) -> R {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let table = unpoisoned(shard.table.read());
            if let Some(e) = table.keys.find(hash, |e| e.key == *key) {
                return shard.run(&table.context, e, hash, f);
            }
        }
        // Not found under the read lock: under the write lock, found or inserted.
        let mut guard = unpoisoned(shard.table.write());
        let Table {
            context,
            keys,
            made,
        } = &mut *guard;
        let context = &*context;
        if let Some(e) = keys.find(hash, |e| e.key == *key) {
            return shard.run(context, e, hash, f);
        }
        let now = now();
        if keys.len() >= self.shard_cap {
            let free_at = shard.full_until.load(Ordering::Relaxed);
            if now < free_at {
                return full(context, ShardFull { free_at }, now);
            }
            // Nobody reads the shard meanwhile: a reading older than `now` that reaches a
            // fresh key from here on is decided as of `now`, where the dropped states weigh
            // nothing.
            shard.latest.0.publish(now);
            keys.retain(|e| idle_at(context, &e.state) > now);
        }
        if keys.len() >= self.shard_cap {
            match self.overflow {
                Overflow::RefuseNewKeys => {
                    let free_at = keys
                        .iter()
                        .map(|e| idle_at(context, &e.state))
                        .min()
                        .unwrap_or(now);
                    shard.full_until.store(free_at, Ordering::Relaxed);
                    return full(context, ShardFull { free_at }, now);
                }
                // The sixteenth of the shard (at least one key) whose states rank lowest: whose
                // loss gives away least; among equal ranks, the keys made last (`made` counts
                // the shard's keys made so far), so that a flood's fresh keys go before the
                // clients it floods, whatever their states can tell of when they took their
                // permits. Unique: no two live keys of a shard share an incarnation.
                Overflow::EvictNearestIdle => {
                    let order = |e: &Entry<K, S>| {
                        (
                            rank(context, &e.state, now),
                            made.wrapping_sub(e.incarnation),
                        )
                    };
                    let mut orders: Vec<_> = keys.iter().map(order).collect();
                    // The shard is full: it holds at least one key.
                    let nth = ((self.shard_cap / 16).max(1) - 1).min(orders.len() - 1);
                    let (_, &mut threshold, _) = orders.select_nth_unstable(nth);
                    keys.retain(|e| order(e) > threshold);
                }
            }
        }
        let hasher = &self.hasher;
        *made = made.wrapping_add(1);
        let entry = Entry {
            key: key.clone(),
            incarnation: *made,
            state: S::default(),
        };
        let entry = keys.insert_unique(hash, entry, |e| hasher.hash_one(&e.key));
        shard.run(context, entry.get(), hash, f)
    }

    /// Runs `f` on the shard's context, the state of `key`, the shard's latest reading and the
    /// key's hash, if the key is present: what a refund does.
    pub(crate) fn with_existing<R>(
        &self,
        key: &K,
        f: impl FnOnce(&G, &S, &LatestReading, u64) -> R,
    ) -> Option<R> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let table = unpoisoned(shard.table.read());
        let found = (table.keys.find(hash, |e| e.key == *key))
            .map(|e| shard.run(&table.context, e, hash, f));
        // A refund can make the key idle before the instant the full shard last found for its
        // first idle key: the next new key looks again.
        shard.full_until.store(0, Ordering::Relaxed);
        found
    }

    /// Drops every key whose state is idle at `now`, having published `now` as each shard's
    /// latest reading (see the module's docs).
    pub(crate) fn sweep(&self, now: u64, idle_at: impl Fn(&G, &S) -> u64) {
        for shard in self.shards.iter() {
            let mut guard = unpoisoned(shard.table.write());
            shard.latest.0.publish(now);
            let Table { context, keys, .. } = &mut *guard;
            keys.retain(|e| idle_at(context, &e.state) > now);
        }
    }

    /// Gives every shard `context`, one shard at a time, each while nobody reads it: a reader
    /// of a shard sees the old context or the new one, never a state without its context. The
    /// context is the rule of a change of quota read at `now`, first published as each shard's
    /// latest reading: a reading older than the change is decided as of it.
    pub(crate) fn set_context(&self, context: &G, now: u64) {
        for shard in self.shards.iter() {
            let mut table = unpoisoned(shard.table.write());
            shard.latest.0.publish(now);
            table.context = context.clone();
            // The instant a full shard frees was computed with the old context.
            shard.full_until.store(0, Ordering::Relaxed);
        }
    }

    /// The number of keys held.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| unpoisoned(s.table.read()).keys.len())
            .sum()
    }

    /// The most keys the store holds.
    pub(crate) fn capacity(&self) -> usize {
        self.shard_cap * self.shards.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::RandomState;

    use super::*;

    fn tat(_: &(), s: &AtomicU64) -> u64 {
        s.load(Ordering::Relaxed)
    }

    fn rank(_: &(), s: &AtomicU64, _now: u64) -> u128 {
        u128::from(tat(&(), s))
    }

    fn full(_: &(), full: ShardFull, _now: u64) -> Result<(), ShardFull> {
        Err(full)
    }

    fn set_tat(
        tat: u64,
    ) -> impl FnOnce(&(), &AtomicU64, &LatestReading, u64) -> Result<(), ShardFull> {
        move |_, s, _, _| {
            s.store(tat, Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    fn what_a_request_reads_of_a_shard_is_one_cache_line_and_what_it_writes_another() {
        type GcraTable = Table<
            u32,
            <crate::algorithm::Gcra as crate::algorithm::Transitions>::State,
            std::sync::Arc<()>,
        >;
        type GcraShard = Shard<
            u32,
            <crate::algorithm::Gcra as crate::algorithm::Transitions>::State,
            std::sync::Arc<()>,
        >;
        let read = size_of::<ShardedLock<GcraTable>>();
        assert!(
            read <= 64,
            "the lock and the table's header take {read} bytes"
        );
        let written = std::mem::offset_of!(GcraShard, latest);
        assert_eq!(written, 64, "the latest reading starts at byte {written}");
        assert_eq!(std::mem::offset_of!(GcraShard, full_until), 128);
    }

    /// A key's incarnation takes room its state's alignment leaves free: a GCRA entry is as
    /// large as the key and the state alone, for the common key types.
    #[test]
    fn an_incarnation_costs_common_keys_no_memory() {
        type Gcra = <crate::algorithm::Gcra as crate::algorithm::Transitions>::State;
        fn alone<K>() -> usize {
            size_of::<(K, Gcra)>()
        }
        assert_eq!(
            size_of::<Entry<std::net::Ipv4Addr, Gcra>>(),
            alone::<std::net::Ipv4Addr>()
        );
        assert_eq!(
            size_of::<Entry<std::net::IpAddr, Gcra>>(),
            alone::<std::net::IpAddr>()
        );
        assert_eq!(size_of::<Entry<u64, Gcra>>(), alone::<u64>());
        assert_eq!(size_of::<Entry<String, Gcra>>(), alone::<String>());
    }

    #[test]
    fn flood_of_keys_stays_within_bound_and_keeps_heavy_users() {
        let store: MemoryStore<u32, AtomicU64, (), RandomState> =
            MemoryStore::new(100, Overflow::EvictNearestIdle, (), RandomState::new());
        // A heavy user whose state runs far ahead.
        store
            .with(&u32::MAX, || 0, tat, rank, set_tat(1_000_000), full)
            .unwrap();
        for k in 0..1000u32 {
            store.with(&k, || 0, tat, rank, set_tat(10), full).unwrap();
            assert!(store.len() <= 100);
        }
        assert_eq!(
            store.with_existing(&u32::MAX, |g, s, _, _| tat(g, s)),
            Some(1_000_000)
        );
    }

    #[test]
    fn idle_keys_go_first_and_refuse_mode_reports_when_room_frees() {
        let store: MemoryStore<u32, AtomicU64, (), RandomState> =
            MemoryStore::new(2, Overflow::RefuseNewKeys, (), RandomState::new());
        store.with(&1, || 0, tat, rank, set_tat(50), full).unwrap();
        store.with(&2, || 0, tat, rank, set_tat(70), full).unwrap();
        let refused = store
            .with(&3, || 10, tat, rank, |_, _, _, _| Ok(()), full)
            .unwrap_err();
        assert_eq!(refused.free_at, 50);
        // At 60 key 1 is idle: it is dropped and key 3 fits.
        store
            .with(&3, || 60, tat, rank, |_, _, _, _| Ok(()), full)
            .unwrap();
        assert_eq!(store.with_existing(&1, |g, s, _, _| tat(g, s)), None);
        assert_eq!(store.len(), 2);
    }
}
