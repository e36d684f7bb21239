//! Attacks on the keyed store's gathered SipHash (`store/hash.rs`) and on the default clock read
//! in turn with other clocks (`clock.rs`), through the public API only.
//!
//! Keys: distinct keys of every shape (strings of 0 to 200 bytes crossing the 32-byte gathering
//! buffer, tuples whose parts concatenate to the same bytes, IPv4 and IPv6 addresses, IPv4 and
//! their IPv4-mapped IPv6 twins) must each get their own budget, and equal keys built apart
//! must share one, for admissions and for refunds alike.
//!
//! Clock: a thread alternating readings between several `SystemClock`s (created and dropped
//! as it goes) must see each clock's readings never go backwards, and each clock's readings
//! stay in its own time base (a clock created later never reads ahead of an older one).

use crate::common::manual_clock_at;
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use proptest::prelude::*;
use tower_bulwark::clock::{Clock, ManualClock, SystemClock};
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

fn one_per_hour<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
) -> KeyedRateLimiter<K, tower_bulwark::algorithm::Gcra, ManualClock> {
    let clock = manual_clock_at(Duration::from_secs(10));
    KeyedRateLimiter::<K>::builder(Quota::per_hour(1).unwrap())
        .clock(clock)
        .build()
}

/// Each distinct key gets exactly one admission, whatever order the keys come in and however
/// many other keys came before; a second ask of each (a clone built apart) is refused.
fn each_key_exactly_once<K>(keys: &[K], rebuild: impl Fn(&K) -> K) -> Result<(), TestCaseError>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    let limiter = one_per_hour::<K>();
    for key in keys {
        prop_assert!(
            limiter.check(key).allowed,
            "{key:?} was refused its first permit"
        );
    }
    for key in keys {
        let again = rebuild(key);
        prop_assert!(!limiter.check(&again).allowed, "{key:?} was admitted twice");
        prop_assert!(!limiter.check_n(&again, 1).unwrap().allowed);
        prop_assert!(!limiter.reserve_now(&again, 1).unwrap().unwrap().allowed);
    }
    prop_assert_eq!(limiter.len(), keys.len());
    Ok(())
}

/// Every way of splitting `s` into two parts, as tuple keys: the concatenation is the same
/// bytes for all of them, the keys are all different.
fn splits(s: &str) -> Vec<(String, String)> {
    (0..=s.len())
        .filter(|&i| s.is_char_boundary(i))
        .map(|i| (s[..i].to_string(), s[i..].to_string()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Strings of 0 to 200 bytes (ASCII and multi-byte), many around the 32-byte buffer.
    #[test]
    fn distinct_string_keys_never_share_a_budget(
        keys in prop::collection::hash_set(
            prop_oneof![
                "[a-z]{0,200}",
                "[a-c]{28,36}",
                ".{0,60}",
                prop::collection::vec(any::<u8>(), 0..40)
                    .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            ],
            1..120,
        )
    ) {
        let keys: Vec<String> = keys.into_iter().collect();
        // Rebuilt byte by byte: an equal key that shares nothing with the original.
        each_key_exactly_once(&keys, |k| k.chars().collect::<String>())?;
    }

    /// Tuples whose parts concatenate to the same bytes, and nested ones with numbers and
    /// addresses: all distinct keys.
    #[test]
    fn tuple_keys_split_anywhere_never_share_a_budget(s in "[a-z0-9]{0,70}", n in any::<u64>()) {
        let keys = splits(&s);
        each_key_exactly_once(&keys, |(a, b)| (a.chars().collect(), b.chars().collect()))?;

        let ip = IpAddr::V4(Ipv4Addr::from(n as u32));
        let nested: Vec<(u8, String, IpAddr, u64)> = splits(&s)
            .into_iter()
            .enumerate()
            .flat_map(|(i, (a, b))| {
                [
                    (i as u8, a.clone(), ip, n),
                    (i as u8, b.clone(), ip, n),
                    (i as u8, a + &b, IpAddr::V6(Ipv6Addr::from(u128::from(n))), n),
                ]
            })
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        each_key_exactly_once(&nested, Clone::clone)?;
    }

    /// IPv4 and IPv6 addresses, each IPv4 with its IPv4-mapped IPv6 twin (equal bytes after a
    /// different variant): all distinct keys; a v6 address reparsed from its text is the same.
    #[test]
    fn ip_keys_never_share_a_budget(v4 in prop::collection::hash_set(any::<u32>(), 1..60),
                                    v6 in prop::collection::hash_set(any::<u128>(), 1..60)) {
        let mut keys: Vec<IpAddr> = Vec::new();
        for &a in &v4 {
            let v4 = Ipv4Addr::from(a);
            keys.push(IpAddr::V4(v4));
            keys.push(IpAddr::V6(v4.to_ipv6_mapped()));
        }
        for &a in &v6 {
            let ip = IpAddr::V6(Ipv6Addr::from(a));
            if !keys.contains(&ip) {
                keys.push(ip);
            }
        }
        each_key_exactly_once(&keys, |ip| ip.to_string().parse().unwrap())?;
    }

    /// Refunds follow the key, not the hash's luck: an admission given back under an equal key
    /// built apart returns the permit; given back under any other key, nothing.
    #[test]
    fn refunds_go_to_the_key_and_only_the_key(
        keys in prop::collection::hash_set("[a-z]{0,90}", 2..30),
        prefix in "[a-z]{0,70}",
    ) {
        // Half the keys share a long prefix (past the 32-byte buffer) and differ only at the end.
        let keys: Vec<String> = keys
            .into_iter()
            .enumerate()
            .map(|(i, k)| if i % 2 == 0 { format!("{prefix}{k}") } else { k })
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        prop_assume!(keys.len() >= 2);
        let limiter = one_per_hour::<String>();
        for (i, key) in keys.iter().enumerate() {
            let decision = limiter.check(key);
            prop_assert!(decision.allowed);
            let other = &keys[(i + 1) % keys.len()];
            // Given back under another key: nothing comes back to either.
            limiter.refund(other, 1, decision);
            prop_assert!(!limiter.check(key).allowed, "{key:?} refunded through {other:?}");
        }
        let limiter = one_per_hour::<String>();
        for key in &keys {
            let decision = limiter.check(key);
            prop_assert!(decision.allowed);
            limiter.refund(&key.chars().collect::<String>(), 1, decision);
            prop_assert!(limiter.check(key).allowed, "{key:?} not given back");
            prop_assert!(!limiter.check(key).allowed);
        }
    }
}

/// Equal keys built apart, raced from 8 threads on a limit of 5: one shared budget of exactly
/// 5, for each of 200 keys (short, 32-byte and long), with every key's budget its own.
#[test]
fn equal_keys_share_exactly_one_budget_under_contention() {
    let clock = manual_clock_at(Duration::from_secs(10));
    let limiter = KeyedRateLimiter::<(String, IpAddr)>::builder(Quota::per_hour(5).unwrap())
        .clock(clock)
        .build();
    let lengths = [0usize, 1, 7, 31, 32, 33, 64, 150];
    let base: Vec<(String, IpAddr)> = (0..200u32)
        .map(|i| {
            let len = lengths[i as usize % lengths.len()];
            let s: String = format!("{i:04}").repeat(len / 4 + 1)[..len.max(4)].to_string();
            let ip = if i % 2 == 0 {
                IpAddr::V4(Ipv4Addr::from(i))
            } else {
                IpAddr::V6(Ipv6Addr::from(u128::from(i)))
            };
            (s, ip)
        })
        .collect();
    let distinct: HashSet<_> = base.iter().cloned().collect();
    assert_eq!(distinct.len(), base.len());
    let base = Arc::new(base);
    let barrier = Arc::new(Barrier::new(8));
    let admitted: Vec<Vec<usize>> = (0..8)
        .map(|t| {
            let (limiter, base, barrier) =
                (limiter.clone(), Arc::clone(&base), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let mut counts = vec![0usize; base.len()];
                for round in 0..2 {
                    for j in 0..base.len() {
                        let i = (j * 7 + t * 13 + round) % base.len();
                        let (s, ip) = &base[i];
                        let key = (
                            s.chars().collect::<String>(),
                            ip.to_string().parse().unwrap(),
                        );
                        if limiter.check(&key).allowed {
                            counts[i] += 1;
                        }
                    }
                }
                counts
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for i in 0..base.len() {
        let total: usize = admitted.iter().map(|c| c[i]).sum();
        assert_eq!(total, 5, "key {:?}", base[i]);
    }
    assert_eq!(limiter.len(), base.len());
}

/// A thread alternating readings between several `SystemClock`s, creating and dropping clocks
/// between readings (on 4 threads at once, each also reading clocks shared with the others):
/// each clock's readings never go backwards on the thread, and no clock's readings leak into
/// another's (a clock made later never reads ahead of an older one read after it; an older one
/// read before a newer one is never further ahead than their origins are apart).
#[test]
fn system_clocks_read_in_turn_stay_monotonic_and_apart() {
    let shared: Arc<Vec<SystemClock>> = Arc::new((0..3).map(|_| SystemClock::new()).collect());
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (shared, barrier) = (Arc::clone(&shared), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                // The thread's own clocks, oldest first, with their origins' distance from the
                // oldest bounded by readings of it taken around their creation.
                let oldest = SystemClock::new();
                let mut own: Vec<(SystemClock, u64, u64)> = vec![(oldest, 0, 0)];
                let mut last_own: Vec<u64> = vec![0];
                let mut last_shared = [0u64; 3];
                let mut steps = 0u64;
                for i in 0..60_000usize {
                    // Shared clocks, in turn.
                    let s = i % 3;
                    let r = shared[s].now();
                    assert!(
                        r >= last_shared[s],
                        "shared clock {s} went back: {} -> {r}",
                        last_shared[s]
                    );
                    last_shared[s] = r;
                    // Own clocks: read in a rotating order.
                    let j = (i * 7 + t) % own.len();
                    let r = own[j].0.now();
                    assert!(
                        r >= last_own[j],
                        "own clock {j} went back: {} -> {r}",
                        last_own[j]
                    );
                    last_own[j] = r;
                    // Pairs: the newer read, then the oldest; the oldest, then the newer.
                    if j > 0 {
                        let (newer, before, after) = own[j];
                        let b = newer.now();
                        let a = own[0].0.now();
                        assert!(b >= last_own[j] && a >= last_own[0], "a clock went back");
                        assert!(
                            a >= b,
                            "a newer clock read ahead of an older one: {b} > {a}"
                        );
                        assert!(
                            a - b >= before,
                            "origins {before}..{after} apart, read {a} - {b}"
                        );
                        let a = own[0].0.now();
                        let b = newer.now();
                        assert!(
                            a.saturating_sub(b) <= after,
                            "origins {before}..{after} apart, read {a} then {b}"
                        );
                        last_own[0] = a;
                        last_own[j] = b;
                    }
                    // Now and then a clock dies and another is born.
                    if i % 997 == 0 {
                        if own.len() > 4 {
                            let gone = 1 + (i / 997) % (own.len() - 1);
                            own.remove(gone);
                            last_own.remove(gone);
                        }
                        let before = own[0].0.now();
                        let clock = SystemClock::new();
                        let after = own[0].0.now();
                        // Clocks of the past, made and dropped without a reading kept.
                        for _ in 0..3 {
                            let temporary = SystemClock::new();
                            let _ = temporary.now();
                        }
                        last_own[0] = after;
                        own.push((clock, before, after));
                        last_own.push(0);
                        steps += 1;
                    }
                }
                assert!(steps > 50);
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
}

/// Readings alternating between a `SystemClock`, its copies and an `InstantClock`: the system
/// clock's readings never go backwards and keep pace with real time.
#[test]
fn system_clock_readings_interleaved_with_other_clocks_stay_monotonic() {
    use tower_bulwark::clock::InstantClock;
    let system = SystemClock::new();
    let copy = system;
    let instant = InstantClock::new();
    let started = std::time::Instant::now();
    let mut last = 0;
    for i in 0..200_000u32 {
        let r = if i % 2 == 0 { system.now() } else { copy.now() };
        assert!(r >= last, "{last} -> {r}");
        last = r;
        let _ = instant.now();
    }
    std::thread::sleep(Duration::from_millis(20));
    let elapsed = started.elapsed().as_nanos() as u64;
    let r = system.now();
    assert!(r >= last);
    assert!(
        r.abs_diff(elapsed) < 50_000_000,
        "system clock {r} ns, real {elapsed} ns"
    );
}
