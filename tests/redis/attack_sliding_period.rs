//! Attacks on the sliding counter's fixed windows across changes of period, in Redis (windows
//! are multiples of the period from the clock's zero): the schedules and the model of
//! `tests/common/sliding_model.rs`, on a `RedisRateLimiter` reading a manual clock; the same
//! schedules against the in-memory limiter, decision for decision, where no period changes;
//! leases across a change of period.

use std::time::Duration;

use tower_bulwark::algorithm::SlidingCounter;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::limiter::Decision;
use tower_bulwark::redis::{RedisRateLimiter, RedisStore};
use tower_bulwark::{Limiter, Quota};

use crate::common::at;
use crate::common::dial::Dial;
use crate::common::redis_server::{or_skip, propagating, RedisServer, Refusals};
use crate::common::sliding_schedules::{
    assert_no_failures, back_and_forth, drive, failure, reserved_then_changed, schedule, shrink,
    sliding_quota, twins, Backend, InMemory, Mix, Model, Numbering, Op, Step, CHANGED_AT,
};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// One key of a Redis limiter of its own (its prefix), every decision asked of Redis.
struct Redis(RedisRateLimiter, Dial);

impl Redis {
    fn new(store: &RedisStore, q: Quota, prefix: &str) -> Self {
        let clock = Dial::default();
        let l = propagating::<SlidingCounter>(store, q, &clock, prefix, Refusals::Uncached)
            .build()
            .unwrap();
        Self(l, clock)
    }
}

impl Backend for Redis {
    fn read(&self, t: u64) {
        self.1.set(t);
    }
    async fn check(&self, cost: u32) -> Option<Decision> {
        self.0.check_n("k", cost).await.ok()
    }
    async fn reserve(&self, cost: u32) -> Option<Decision> {
        Limiter::reserve(&self.0, &"k", cost).await.ok()
    }
    async fn settle(&self, estimate: u32, d: Decision, cost: u32) {
        self.0
            .settle_and_wait("k", estimate, d, cost)
            .await
            .unwrap();
    }
    fn set_quota(&self, q: Quota) {
        self.0.set_quota(q).unwrap();
    }
    fn refusals_record(&self) -> bool {
        false
    }
}

/// The failures of `model`: of the count only. (The hold after a change of period is
/// memory's layout; Redis, whose windows of one length always lie at the same instants, holds
/// a key only where the length it was written under differs, and for that length's windows
/// exactly, so the model's hold does not apply.)
fn failed(what: &str, model: &Model) -> Option<String> {
    failure(what, model, true)
}

/// 1. Random schedules in Redis: every seed's model keeps the guarantee. Where `compare`, the
///    same schedule in memory decides the same until its first change of period (after it, the
///    first difference is only printed).
async fn random_schedules(name: &str, seeds: std::ops::Range<u64>, mix: Mix, compare: bool) {
    let (_server, store) = or_skip!(RedisServer::with_store(name).await);
    let mut failures = Vec::new();
    let (mut differ_after_a_change, mut parted) = (0, 0);
    for seed in seeds.clone() {
        let (first, steps) = schedule(Numbering::Redis, seed, 100, mix);
        let q = sliding_quota(first.0, first.1);
        let redis = Redis::new(&store, q, &format!("{name}:{seed}:"));
        let (model, said) = drive(&redis, Numbering::Redis, first, &steps).await;
        failures.extend(failed(&format!("seed {seed}"), &model));
        if !compare {
            continue;
        }
        let (_, in_memory) = drive(&InMemory::keyed(q), Numbering::Memory, first, &steps).await;
        let changed_at = steps
            .iter()
            .position(|s| matches!(s.op, Op::Quota(p, _) if p != first.0));
        if let Some((r, m)) = said.iter().zip(&in_memory).find(|(r, m)| r != m) {
            let step: usize = r[5..].split([' ', ':']).next().unwrap().parse().unwrap();
            fn as_of(said: &str) -> Option<&str> {
                said.split("as of ").nth(1)?.split(')').next()
            }
            if as_of(r) != as_of(m) {
                // A stale reading after a refusal: memory decides it as of the refusal, Redis
                // (which writes nothing for a refusal) as of the key's latest write.
                parted += 1;
                if parted == 1 {
                    eprintln!("seed {seed}: parted by a refusal, Redis {r}\nmemory {m}");
                }
            } else if changed_at.is_some_and(|c| c < step) {
                differ_after_a_change += 1;
                if differ_after_a_change == 1 {
                    eprintln!("seed {seed}: after a change of period, Redis {r}\nmemory {m}");
                }
            } else {
                failures.push(format!("seed {seed}: Redis {r}\nmemory {m}"));
            }
        }
    }
    eprintln!(
        "{name}: of {} seeds, {differ_after_a_change} differ from memory after a change of \
         period, {parted} from a stale reading after a refusal on",
        seeds.end - seeds.start
    );
    assert_no_failures(name, &failures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_random_schedules() {
    random_schedules("sliding_period_random", 0..200, Mix::ALL, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_random_schedules_spaced() {
    random_schedules("sliding_period_spaced", 0..200, Mix::SPACED, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_decides_as_memory_without_changes_of_period() {
    random_schedules("sliding_period_no_change", 0..200, Mix::NO_PERIODS, true).await;
}

/// A case of `reserved_then_changed`: period, limit, taken, reserved, and the changes
/// (instant, period, limit).
type Case = (u64, u32, u32, u32, Vec<(u64, u64, u32)>);

/// Each case of `reserved_then_changed` (4 or 5 per 2 s, the next window reserved, then the
/// changes) in Redis, every key under a prefix of its own: fails with all that broke the
/// guarantee.
async fn cases_keep_the_guarantee(name: &str, cases: &[Case]) {
    let (_server, store) = or_skip!(RedisServer::with_store(name).await);
    let mut failures = Vec::new();
    for (i, (period, limit, taken, reserved, changes)) in cases.iter().enumerate() {
        let first = (*period, *limit, *taken, *reserved);
        let steps = reserved_then_changed(first, changes, 50 * MS);
        let redis = Redis::new(
            &store,
            sliding_quota(*period, *limit),
            &format!("{name}:{i}:"),
        );
        let (model, _) = drive(&redis, Numbering::Redis, (*period, *limit), &steps).await;
        failures.extend(failed(&format!("{first:?} then {changes:?}"), &model));
    }
    assert!(
        failures.is_empty(),
        "{} of {} broke the guarantee:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// 2. One change of period, shorter or longer, at a window's start, 1 ns either side or within
///    it, the next window reserved: no window holds more than its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_one_change_with_reservations_ahead() {
    let mut cases = Vec::new();
    for p in [S, 750 * MS, 300 * MS, 3 * S, 1_100 * MS] {
        for at in CHANGED_AT {
            cases.push((2 * S, 4, 4, 4, vec![(at, p, 4)]));
            cases.push((2 * S, 4, 2, 4, vec![(at, p, 4)]));
        }
    }
    cases_keep_the_guarantee("sliding_period_one_change", &cases).await;
}

/// 3. Two changes of period in a row, at one instant or at two, reservations standing ahead of
///    both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_two_changes_in_a_row_with_reservations_ahead() {
    cases_keep_the_guarantee(
        "sliding_period_two_changes",
        &[
            (2 * S, 4, 4, 4, vec![(2 * S, S, 4), (2 * S, 750 * MS, 4)]),
            (
                2 * S,
                5,
                5,
                3,
                vec![(2 * S + 100 * MS, S, 3), (2 * S + 100 * MS, 1_100 * MS, 5)],
            ),
            (
                2 * S,
                4,
                4,
                4,
                vec![(4 * S, S, 4), (5 * S - 1, 750 * MS, 4)],
            ),
        ],
    )
    .await;
}

/// 5. The random schedule of seed 54, shrunk: 1 per 2 s from 13.24 s, a reservation at 13.72 s
///    falls due at 17.67 s; the period then changes four times (750 ms, 2 s, 750 ms, 2 s at
///    16.5 s, the limit 3, 2, 1, 1); a reservation at 16.5 s falls due at 17.67 s too: the
///    window [16 s, 18 s) holds 2 under a limit of 1 (counting from 16.5 s, the start of the
///    old window the last change came in). Memory, on the same steps, keeps the guarantee.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_four_changes_with_a_reservation_ahead() {
    let (_server, store) = or_skip!(RedisServer::with_store("sliding_period_seed_54").await);
    let steps: Vec<Step> = [
        (10000000000, 10000000000, Op::Reserve(3)),
        (11999999999, 11999999999, Op::Quota(2000000000, 2)),
        (12065209180, 12065209180, Op::Reserve(3)),
        (12065209180, 12065209180, Op::Reserve(2)),
        (12065209180, 12065209180, Op::Quota(1100000000, 5)),
        (12065209180, 10876825414, Op::Reserve(2)),
        (12100000001, 12100000001, Op::SettleMore(0, 1)),
        (13200000000, 13200000000, Op::Quota(500000000, 3)),
        (13200000000, 13200000000, Op::Reserve(3)),
        (13241104716, 13241104716, Op::Quota(2000000000, 1)),
        (13717019876, 13717019876, Op::Reserve(1)),
        (13717019876, 13717019876, Op::SettleMore(0, 1)),
        (13717019876, 13717019876, Op::Quota(750000000, 3)),
        (14250000000, 13700600672, Op::Refund(0)),
        (14999999999, 14999999999, Op::Quota(2000000000, 2)),
        (15442814625, 15031226666, Op::Refund(0)),
        (15929469271, 15929469271, Op::Quota(750000000, 1)),
        (16500000000, 16500000000, Op::Quota(2000000000, 1)),
        (16500000000, 16500000000, Op::Reserve(1)),
    ]
    .into_iter()
    .map(|(now, reading, op)| Step { now, reading, op })
    .collect();
    let first = (2 * S, 10);
    let q = sliding_quota(first.0, first.1);
    let (in_memory, _) = drive(&InMemory::keyed(q), Numbering::Memory, first, &steps).await;
    let in_memory = failed("memory", &in_memory);
    let redis = Redis::new(&store, q, "seed-54:");
    let (model, _) = drive(&redis, Numbering::Redis, first, &steps).await;
    let failures: Vec<String> = failed("redis", &model)
        .into_iter()
        .chain(in_memory)
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a tool: SEED=n RULE=count: cargo test debug_redis_seed -- --ignored --nocapture"]
async fn debug_redis_seed() {
    let seed: u64 = std::env::var("SEED").map_or(0, |s| s.parse().unwrap());
    let rule = std::env::var("RULE").unwrap_or_else(|_| "count:".into());
    let (_server, store) = or_skip!(RedisServer::with_store("debug_redis_seed").await);
    let (first, steps) = schedule(Numbering::Redis, seed, 100, Mix::ALL);
    let q = sliding_quota(first.0, first.1);
    let make = |n| Redis::new(&store, q, &format!("debug:{n}:"));
    let steps = shrink(make, Numbering::Redis, first, steps, &rule).await;
    let (model, said) = drive(&make(0), Numbering::Redis, first, &steps).await;
    println!("first {first:?}\n{}", said.join("\n"));
    println!(
        "{}\n{}",
        model.violations(false).join("\n"),
        model.log.join("\n")
    );
}

/// 4. A→B→A and A→B→C in a row (at one instant, or the second 1 ns before a window's end),
///    the next window reserved. No window holds more than its limit, but after A→B→A the key
///    admits (a reservation into the window its reservations fall due in) while they hold it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_back_and_forth_with_reservations_ahead() {
    let cases: Vec<Case> = (back_and_forth().into_iter())
        .map(|((period, limit, taken, reserved), changes)| {
            (period, limit, taken, reserved, changes.to_vec())
        })
        .collect();
    cases_keep_the_guarantee("sliding_period_back_and_forth", &cases).await;
}

/// 6. Twins in Redis: a request made and given back later, across changes of period and of
///    the limit, never leaves the limiter ahead of a twin that vetoed it at once. (In memory,
///    the same 150 schedules pass.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "found by attack, not promised: across changes of period while reservations stand \
            ahead, a hold lays the count out conservatively, and one more request can make a later \
            hold shorter (seed 25: 11 admitted in 8 s against the twin's 8; no window over its \
            limit); the give-back itself gives nothing back"]
async fn attack_sliding_period_redis_a_give_back_never_puts_a_limiter_ahead_of_its_twin() {
    let name = "sliding_period_twins";
    let (_server, store) = or_skip!(RedisServer::with_store(name).await);
    let mut failures = Vec::new();
    for seed in 0..150 {
        let (first, _) = schedule(Numbering::Redis, seed, 100, Mix::ALL);
        let q = sliding_quota(first.0, first.1);
        let a = Redis::new(&store, q, &format!("{name}:{seed}:a:"));
        let b = Redis::new(&store, q, &format!("{name}:{seed}:b:"));
        failures.extend(twins(&a, &b, Numbering::Redis, seed).await);
    }
    assert_no_failures(name, &failures);
}

/// 7. Hostile values in Redis: periods of 1 ns to 2^50 ns, limits of 1 to `u32::MAX`, a wait as
///    long as the bounds allow, changes between them, a clock up to 2^52 ns: the builder and
///    `set_quota` answer (an error names what cannot run), no decision fails, and no window
///    holds more than its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_hostile_values() {
    let name = "sliding_period_hostile";
    let (_server, store) = or_skip!(RedisServer::with_store(name).await);
    let periods = [1, 3, 1_000, 1_001, S, 1 << 50];
    let limits = [1, 2, 7, 1 << 20, u32::MAX];
    let hostile = |period: u64, permits: u32| {
        let most = ((1u64 << 53) - 1) / u64::from(permits);
        let wait = most.saturating_sub(3).saturating_mul(period).min(1 << 50);
        crate::common::quota_ns(permits, period, 1, wait)
    };
    let mut refused = std::collections::BTreeSet::new();
    for seed in 0..60u64 {
        let mut rng = crate::common::Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (p, l) = (rng.pick(&periods), rng.pick(&limits));
        let clock = Dial::default();
        let built = propagating::<SlidingCounter>(
            &store,
            hostile(p, l),
            &clock,
            &format!("{name}:{seed}:"),
            Refusals::Uncached,
        )
        .build();
        let Ok(limiter) = built else {
            refused.insert(format!("build {p} ns x {l}: {}", built.err().unwrap()));
            continue;
        };
        let redis = Redis(limiter, clock);
        let mut model = Model::new(Numbering::Redis, p, l.into());
        let (mut now, mut latest, mut limit) = (rng.below(1 << 40), 0, l);
        for _ in 0..40 {
            now = (now + rng.pick(&[0, 1, 1_000, S, 1 << 48])).min(1 << 52);
            redis.read(now);
            latest = now.max(latest);
            let cost = 1 + rng.below(u64::from(limit.min(3))) as u32;
            if rng.below(4) == 0 {
                let (p, l) = (rng.pick(&periods), rng.pick(&limits));
                match redis.0.set_quota(hostile(p, l)) {
                    Ok(()) => {
                        model.change(latest, p, l.into());
                        limit = l;
                    }
                    Err(e) => {
                        refused.insert(format!("set_quota {p} ns x {l}: {e}"));
                    }
                }
                continue;
            }
            let d = if rng.below(2) == 0 {
                redis.0.check_n("k", cost).await
            } else {
                Limiter::reserve(&redis.0, &"k", cost).await
            };
            let d = d.unwrap_or_else(|e| panic!("seed {seed}: {cost} at {now}: {e}"));
            if d.allowed {
                model.admit(latest, d.wait.as_nanos() as u64, cost.into());
            }
        }
        // The count only: hostile values are about the arithmetic.
        if let Some(failure) = failure(&format!("seed {seed}"), &model, true) {
            panic!("{failure}");
        }
    }
    eprintln!(
        "refused:\n{}",
        refused.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// Two instances leasing one key's permits (shares of at most 3), their requests alternating;
/// a give-back goes to the instance that made the admission.
struct Leased {
    instances: [RedisRateLimiter; 2],
    ids: [String; 2],
    clock: Dial,
    next: std::sync::atomic::AtomicUsize,
}

impl Leased {
    async fn new(store: &RedisStore, q: Quota, prefix: &str) -> Self {
        let clock = Dial::default();
        let make = || {
            propagating::<SlidingCounter>(store, q, &clock, prefix, Refusals::Uncached)
                .lease(tower_bulwark::redis::Lease::new().max_share(q.burst().min(3)))
                .build()
                .unwrap()
        };
        let instances = [make(), make()];
        // Each instance's id, as its decisions print it (a key of its own, never read after).
        let mut ids = [String::new(), String::new()];
        for (id, l) in ids.iter_mut().zip(&instances) {
            let d = format!("{:?}", l.check("id").await.unwrap());
            *id = d[d.find("LimiterId").unwrap()..]
                .split(')')
                .next()
                .unwrap()
                .to_string();
        }
        let next = Default::default();
        Self {
            instances,
            ids,
            clock,
            next,
        }
    }

    fn one(&self) -> &RedisRateLimiter {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.instances[n % 2]
    }
}

impl Backend for Leased {
    fn read(&self, t: u64) {
        self.clock.set(t);
    }
    async fn check(&self, cost: u32) -> Option<Decision> {
        self.one().check_n("k", cost).await.ok()
    }
    async fn reserve(&self, cost: u32) -> Option<Decision> {
        Limiter::reserve(self.one(), &"k", cost).await.ok()
    }
    async fn settle(&self, estimate: u32, d: Decision, cost: u32) {
        let i = usize::from(!format!("{d:?}").contains(&self.ids[0]));
        let l = &self.instances[i];
        l.settle_and_wait("k", estimate, d, cost).await.unwrap();
    }
    fn set_quota(&self, q: Quota) {
        for l in &self.instances {
            l.set_quota(q).unwrap();
        }
    }
    fn refusals_record(&self) -> bool {
        false
    }
}

/// 8. Leases across changes of period: two instances leasing shares of one key, the random
///    schedules (one change at a time, spaced; reservations decided in Redis): what they admit
///    together keeps every window within its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_leases_across_changes_of_period() {
    let name = "sliding_period_leases";
    let (_server, store) = or_skip!(RedisServer::with_store(name).await);
    // Fresh readings: a share admits at its instance's own reading, which the model does not
    // know to be later than the key's latest. No debts: one is paid from a share's permits,
    // already counted.
    let mix = Mix {
        spaced: true,
        stale: false,
        debts: false,
        ..Mix::ALL
    };
    let mut failures = Vec::new();
    for seed in 0..100 {
        let (first, steps) = schedule(Numbering::Redis, seed, 100, mix);
        let q = sliding_quota(first.0, first.1);
        let leased = Leased::new(&store, q, &format!("{name}:{seed}:")).await;
        let (model, _) = drive(&leased, Numbering::Redis, first, &steps).await;
        failures.extend(failed(&format!("seed {seed}"), &model));
    }
    assert_no_failures(name, &failures);
}

/// 9. A share leased before a change of period is not spent after it: its permits were counted
///    in a window of the old length, and spent later they would land in a new window that only
///    carries them as its previous one's. 10 per 1 s; one instance leases (shares up to 8) eight
///    permits at 1000.1 s, its share holding 2 more; the period becomes 500 ms; at 1000.99 s
///    another instance, deciding in Redis, is admitted what the window [1000.5 s, 1001 s) has,
///    and the first may admit nothing beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sliding_period_redis_a_share_from_before_a_change_of_period_is_not_spent() {
    let name = "sliding_period_old_share";
    let (_server, store) = or_skip!(RedisServer::with_store(name).await);
    let clock = ManualClock::new();
    let q = sliding_quota(S, 10);
    let leased = propagating::<SlidingCounter>(&store, q, &clock, name, Refusals::Uncached)
        .lease(
            tower_bulwark::redis::Lease::new()
                .max_share(8)
                .length(2 * Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let plain = propagating::<SlidingCounter>(&store, q, &clock, name, Refusals::Uncached)
        .build()
        .unwrap();
    at(&clock, 1000 * S + 100 * MS);
    for _ in 0..8 {
        assert!(leased.check("k").await.unwrap().allowed);
    }
    assert_eq!(
        leased.counts().lease_decisions,
        4,
        "three admitted from shares"
    );
    let shorter = sliding_quota(S / 2, 10);
    leased.set_quota(shorter).unwrap();
    plain.set_quota(shorter).unwrap();
    at(&clock, 1000 * S + 990 * MS);
    let mut admitted = 0;
    while plain.check("k").await.unwrap().allowed {
        admitted += 1;
    }
    while leased.check("k").await.unwrap().allowed {
        admitted += 1;
    }
    assert!(
        admitted <= 10,
        "{admitted} admitted in [1000.5 s, 1001 s) under 10 per 500 ms"
    );
}
