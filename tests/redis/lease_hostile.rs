//! Hostile schedules against leases of a GCRA key (`RedisRateLimiterBuilder::lease`): costs
//! near the burst, refunds of admissions whose lease was replaced, settles to less and to more,
//! reservations, instances dropped mid-lease, a clock stepping exactly on lease ends and on the
//! starts of delayed shares, more instances than a key's 64 leases, racing clones and quota
//! changes. Whatever is admitted, replayed in time order through one GCRA (debts forced), must
//! be admitted there: no interval sees more than rate × time + burst. (Written by an attacker
//! who had not seen the code; its first run found four ways past the quota, all fixed.)

use crate::common::keyed_on;
use std::time::Duration;

use crate::common::manual_clock_at;
use crate::common::redis_server::{or_skip, propagating, RedisServer, Refusals};
use crate::common::{in_bursts_of, Rng};
use crate::lease::conforms;
use tower_bulwark::algorithm::Gcra;
use tower_bulwark::clock::{Clock, ManualClock};
use tower_bulwark::limiter::Decision;
use tower_bulwark::redis::{Lease, RedisAlgorithm, RedisRateLimiter, RedisStore};
use tower_bulwark::{Limiter, Quota};

const SEC: u64 = 1_000_000_000;

/// A leasing instance of algorithm `A` on the shared clock that never decides by its fail mode:
/// a Redis error is an error (so no admission here is the fail mode's), after a generous
/// timeout. The model tests of `lease.rs` use it too.
pub(crate) async fn strict<A: RedisAlgorithm>(
    url: &str,
    quota: Quota,
    lease: Lease,
    clock: &ManualClock,
) -> RedisRateLimiter {
    let store = RedisStore::connect(url).await.unwrap();
    // A prefix of the algorithm's own: the scripts keep different state under one key.
    let prefix = format!("lease-hostile:{}:", std::any::type_name::<A>());
    propagating::<A>(&store, quota, clock, &prefix, Refusals::Cached)
        .lease(lease)
        .build()
        .unwrap()
}

/// `n` instances of [`strict`], connected one after the other.
pub(crate) async fn strict_instances<A: RedisAlgorithm>(
    n: usize,
    url: &str,
    quota: Quota,
    lease: Lease,
    clock: &ManualClock,
) -> Vec<RedisRateLimiter> {
    let mut instances = Vec::new();
    for _ in 0..n {
        instances.push(strict::<A>(url, quota, lease, clock).await);
    }
    instances
}

fn per_second(permits: u32, burst: u32) -> Quota {
    in_bursts_of(Quota::per_second(permits).unwrap(), burst)
}

/// What happened on one key, in the order it happened: (instant, permits, forced). A forced
/// entry is a settle's debt (charged, never refused), or with 0 permits the quota's change;
/// the others are admissions, a refunded one at 0 permits, a settled one at what it cost.
type Events = Vec<(u64, u32, bool)>;

/// Replays `events` through one GCRA of `before`, then from the change (if any) of `after`,
/// forcing the admissions until `until` (those of shares taken before it). The first refused
/// admission, if any: its instant and what it was.
fn first_excess(
    before: Quota,
    after: Option<(Quota, u64)>,
    events: &Events,
) -> Option<(u64, String)> {
    let gcra = |q: Quota| {
        let i = q.emission_interval().as_nanos();
        (i, i * u128::from(q.burst()))
    };
    let ((mut interval, mut horizon), mut until) = (gcra(before), 0);
    let mut sorted: Vec<_> = (events.iter().copied())
        .filter(|e| e.1 > 0 || e.2)
        .collect();
    sorted.sort_by_key(|e| e.0); // stable: the call order within an instant
    let mut tat = 0u128;
    for (n, &(at, cost, forced)) in sorted.iter().enumerate() {
        if let Some((after, to)) = after.filter(|_| cost == 0) {
            ((interval, horizon), until) = (gcra(after), to);
        }
        let new = tat.max(u128::from(at)) + interval * u128::from(cost);
        if !forced && at >= until && new > u128::from(at) + horizon {
            let recent: Vec<_> = (sorted[..=n].iter())
                .filter(|e| u128::from(e.0) + horizon >= u128::from(at))
                .collect();
            let of = sorted.len();
            return Some((at, format!("admission {n} of {of} ({cost} at {at} ns) exceeds the quota; the burst's horizon before it (instant, permits, forced): {recent:?}")));
        }
        tat = new;
    }
    None
}

/// One hostile run: its quota, its leases and what it may do.
#[derive(Clone, Copy)]
struct Case {
    quota: Quota,
    share: u32,
    length: u64,
    keys: usize,
    instances: usize,
    reserve: bool,
    debts: bool,
    /// A quota every instance is given a third of the way through.
    switch: Option<Quota>,
}

fn case(quota: Quota, share: u32, length: Duration) -> Case {
    let length = length.as_nanos() as u64;
    let (keys, instances, reserve, debts, switch) = (1, 3, false, false, None);
    Case {
        quota,
        share,
        length,
        keys,
        instances,
        reserve,
        debts,
        switch,
    }
}

/// `steps` random calls of `case` from `seed`; every key's events then replayed. Panics with
/// the seed and the calls of the horizon before an excess. Returns the local decisions.
async fn hostile(url: &str, case: Case, seed: u64, steps: usize) -> u64 {
    let (mut quota, mut burst, length) = (case.quota, case.quota.burst(), case.length);
    let lease = Lease::new()
        .max_share(case.share)
        .length(Duration::from_nanos(length));
    let clock = ManualClock::new();
    if seed % 3 != 0 {
        clock.advance(Duration::from_nanos(seed * 7_777_777)); // else from zero
    }
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut instances = strict_instances::<Gcra>(case.instances, url, quota, lease, &clock).await;
    let mut generation: Vec<usize> = (0..case.instances).collect();
    let keys: Vec<String> = (0..case.keys).map(|k| format!("s{seed}k{k}")).collect();
    let mut events: Vec<Events> = vec![Vec::new(); case.keys];
    // Admissions standing: (key, event, instance, its generation, decision).
    let mut standing: Vec<(usize, usize, usize, usize, Decision)> = Vec::new();
    let mut log: Vec<(u64, String)> = Vec::new();
    let interval = quota.emission_interval().as_nanos() as u64;
    let horizon = interval * u64::from(burst);
    let (mut last_wait, mut flood, mut local, mut switched) = (0, 0, 0, None);
    for step in 0..steps {
        if let Some(after) = case.switch.filter(|_| step == steps / 3) {
            for limiter in &instances {
                limiter.set_quota(after).unwrap();
            }
            (quota, burst) = (after, after.burst());
            switched = Some((after, clock.now() + 2 * length));
            events
                .iter_mut()
                .for_each(|e| e.push((clock.now(), 0, true)));
            log.push((clock.now(), format!("{step}: the quota changes")));
        }
        // Now and then a flood: three bursts of single permits at one instant.
        flood = u32::saturating_sub(flood, 1);
        if flood == 0 && rng.below(40) == 0 {
            flood = 3 * burst;
        }
        // Gaps of a lease's length, twice that (Redis's end of it), a nanosecond either side,
        // and the last refusal's wait (when a delayed share starts), or random.
        let (l, w, pick) = (length, last_wait, rng.below(18));
        let gap = match pick {
            _ if flood > 0 => 0,
            0..=4 => 0,
            5 => 1,
            6..=8 => l + pick - 7,
            9..=11 => 2 * l + pick - 10,
            12..=14 => (w + pick).saturating_sub(13),
            15 => rng.below(interval + 1),
            16 => rng.below(horizon / 2 + 1),
            _ => rng.below(4 * interval + 1),
        };
        clock.advance(Duration::from_nanos(gap));
        let now = clock.now();
        let i = rng.below(instances.len() as u64) as usize;
        let k = rng.below(case.keys as u64) as usize;
        let key = &keys[k];
        let cost = match rng.below(10) {
            _ if flood > 0 => 1,
            0..=3 => 1,
            4 | 5 => 2 + rng.below(2) as u32,
            6 | 7 => burst.saturating_sub(rng.below(3) as u32),
            8 => case.share + 1,
            _ => 1 + rng.below(u64::from(burst)) as u32,
        }
        .clamp(1, burst);
        match rng.below(if flood > 0 { 1 } else { 100 }) {
            1 | 2 => {
                // Dies holding whatever it leased; its admissions stand. (A new instance of
                // a lowered burst must have a share within it.)
                local += instances[i].counts().lease_decisions;
                let lease = lease.max_share(case.share.min(burst));
                instances[i] = strict::<Gcra>(url, quota, lease, &clock).await;
                generation[i] = step + case.instances;
                log.push((now, format!("{step}: instance {i} replaced")));
            }
            3..=22 if !standing.is_empty() => {
                let at = match rng.below(2) {
                    0 => standing.len() - 1,
                    _ => rng.below(standing.len() as u64) as usize,
                };
                let (sk, event, si, sgen, decision) = standing.swap_remove(at);
                let (key, cost, limiter) = (&keys[sk], events[sk][event].1, &instances[si]);
                let waited = !decision.wait.is_zero();
                // Named as more than it took now and then: never more may come back.
                let named = cost + (step % 3) as u32;
                let what = match rng.below(3) {
                    _ if generation[si] != sgen => {
                        // A dead instance's decision, given to another: nothing comes back.
                        assert!(!Limiter::refund(&instances[i], key, cost, decision));
                        "refund elsewhere".to_owned()
                    }
                    0 => {
                        if waited {
                            limiter
                                .settle_and_wait(key, named, decision, 0)
                                .await
                                .unwrap();
                        } else {
                            assert!(Limiter::refund(limiter, key, named, decision));
                        }
                        events[sk][event].1 = 0;
                        "refund".to_owned()
                    }
                    1 => {
                        let to = rng.below(u64::from(cost)) as u32;
                        if waited {
                            limiter
                                .settle_and_wait(key, named, decision, to)
                                .await
                                .unwrap();
                        } else {
                            assert!(Limiter::settle(limiter, key, named, decision, to));
                        }
                        events[sk][event].1 = to;
                        format!("settle {cost} to {to}")
                    }
                    _ if !case.debts => {
                        standing.push((sk, event, si, sgen, decision));
                        continue;
                    }
                    _ => {
                        // Waited for, so that the debt is charged at this instant.
                        let to = cost + 1 + rng.below(u64::from(burst) + 2) as u32;
                        limiter
                            .settle_and_wait(key, named, decision, to)
                            .await
                            .unwrap();
                        // The documented limit (`RedisRateLimiterBuilder::lease`): a debt
                        // charged in Redis leaves the shares the other instances hold, at most
                        // `share` each, to be admitted from; the replay forces the debt less
                        // what they may hold, which is all the bound allows them.
                        let debt = to.min(burst).saturating_sub(cost);
                        let others = (case.instances as u32 - 1) * case.share;
                        events[sk].push((now, debt.saturating_sub(others), true));
                        format!("settle {cost} to {to}")
                    }
                };
                log.push((now, format!("{step}: {what} of event {event} (key {sk})")));
            }
            call => {
                let reserve = case.reserve && (23..=30).contains(&call);
                let before = instances[i].counts().lease_decisions;
                let decision = if reserve {
                    Limiter::reserve(&instances[i], key, cost).await.unwrap()
                } else {
                    instances[i].check_n(key, cost).await.unwrap()
                };
                let shared = instances[i].counts().lease_decisions > before;
                let wait = decision.wait.as_nanos() as u64;
                let (allowed, retry) = (decision.allowed, decision.retry_after);
                let what = if reserve { "reserves" } else { "checks" };
                log.push((now, format!("{step}: {i} {what} {cost} on key {k}: allowed {allowed} (from its share {shared}) wait {wait} retry {retry:?}")));
                if allowed {
                    events[k].push((now + wait, cost, false));
                    standing.push((k, events[k].len() - 1, i, generation[i], decision));
                } else {
                    last_wait = retry.as_nanos() as u64;
                }
            }
        }
    }
    for (k, events) in events.iter().enumerate() {
        if let Some((at, excess)) = first_excess(case.quota, switched, events) {
            let within = |t: u64| t <= at && t + 2 * horizon.max(length) >= at;
            let calls = log.iter().filter(|l| within(l.0));
            let calls: Vec<_> = calls.map(|(t, call)| format!("t={t} {call}")).collect();
            let calls = calls.join("\n");
            panic!("seed {seed}, {steps} steps, key {k}: {excess}\nthe calls before:\n{calls}");
        }
    }
    let admitted = events.iter().flatten().filter(|e| !e.2).count();
    assert!(
        admitted > steps / 40,
        "seed {seed}: only {admitted} admitted"
    );
    local
        + (instances.iter())
            .map(|l| l.counts().lease_decisions)
            .sum::<u64>()
}

async fn hostile_seeds(name: &str, case: Case, seeds: std::ops::RangeInclusive<u64>) {
    let server = or_skip!(RedisServer::start(name));
    let mut local = 0;
    for seed in seeds {
        local += hostile(&server.url(), case, seed, 2000).await;
    }
    assert!(local > 100, "{local} decisions made from a share");
}

/// Tests of [`hostile`], each on `case` for `seeds`.
macro_rules! hostile_tests {
    ($($(#[$attr:meta])* $name:ident: $case:expr, $seeds:expr;)*) => {$(
        $(#[$attr])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            hostile_seeds(stringify!($name), $case, $seeds).await;
        }
    )*};
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

hostile_tests! {
    hostile_whole_burst_leased_for_a_microsecond:
        case(per_second(100, 20), 20, Duration::from_micros(1)), 1..=4;
    hostile_long_leases_and_costs_near_the_burst:
        case(per_second(100, 20), 8, Duration::from_secs(10)), 11..=14;
    hostile_tiny_burst_and_delayed_shares:
        Case { instances: 4, ..case(per_second(10, 3), 3, ms(250)) }, 21..=24;
    hostile_default_share_on_three_keys:
        Case { keys: 3, instances: 4, ..case(per_second(1000, 100), 100 / 8, ms(100)) }, 31..=34;
    hostile_quota_lowered_while_shares_are_out:
        Case { switch: Some(per_second(20, 5)), ..case(per_second(100, 20), 8, ms(50)) }, 51..=54;
    hostile_quota_raised_while_shares_are_out:
        Case { switch: Some(per_second(400, 60)), ..case(per_second(100, 20), 8, ms(50)) }, 61..=64;
    hostile_reservations_among_shares:
        Case { reserve: true, ..case(per_second(100, 20).with_max_wait(ms(300)).unwrap(), 10, ms(50)) }, 41..=43;
    hostile_settles_to_more_than_the_estimate:
        Case { debts: true, ..case(per_second(100, 20), 8, Duration::from_secs(10)) }, 75..=76;
}

/// 70 instances on one key, more than the 64 leases a key holds: at one instant 64 take a
/// share of 1 and the 6 others are refused; once the leases end, those 6 are admitted first and
/// the burst is never exceeded (100 in all, the refill being under one permit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seventy_instances_on_one_key() {
    let server = or_skip!(RedisServer::start("lease_hostile_seventy_instances"));
    let quota = Quota::per_hour(100).unwrap();
    let lease = Lease::new().max_share(1).length(Duration::from_secs(10));
    let clock = manual_clock_at(Duration::from_secs(5));
    let instances = strict_instances::<Gcra>(70, &server.url(), quota, lease, &clock).await;
    let (mut admitted, mut refused) = (Vec::new(), Vec::new());
    for (n, limiter) in instances.iter().enumerate() {
        match limiter.check(&"hot").await.unwrap().allowed {
            true => admitted.push((clock.now(), 1)),
            false => refused.push(n),
        }
    }
    assert_eq!((admitted.len(), refused.len()), (64, 6), "{refused:?}");
    clock.advance(Duration::from_nanos(20 * SEC + 1));
    let (mut late, mut first) = (0, Vec::new());
    for n in refused.iter().copied().chain(0..70) {
        let allowed = instances[n].check(&"hot").await.unwrap().allowed;
        if allowed {
            admitted.push((clock.now(), 1));
            late += 1;
        }
        if first.len() < refused.len() {
            first.push(allowed);
        }
    }
    assert!(
        first.iter().all(|&a| a),
        "the 6 after the leases ended: {first:?}"
    );
    assert_eq!(late, 36, "after the leases ended");
    conforms(quota, &admitted, "seventy instances");
}

/// 32 tasks on clones of four instances race at one instant, then the clock moves on (by a
/// lease's length exactly, a nanosecond less or more, or a little); each admission may be
/// refunded or settled to less by its task at once. Whatever is kept conforms.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_clones_with_refunds_and_settles() {
    let server = or_skip!(RedisServer::start("lease_hostile_racing_clones"));
    let quota = per_second(1000, 50);
    let length = 5_000_000; // 5 ms: the background give-backs fire while tasks race.
    let lease = Lease::new()
        .max_share(8)
        .length(Duration::from_nanos(length));
    let clock = manual_clock_at(Duration::from_secs(1));
    let instances = strict_instances::<Gcra>(4, &server.url(), quota, lease, &clock).await;
    let (mut rng, mut admitted) = (Rng(99), Vec::new());
    for round in 0..60u64 {
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..32u64 {
            let limiter = instances[t as usize % 4].clone();
            tasks.spawn(async move {
                let (mut kept, mut rng) = (Vec::new(), Rng(round * 1000 + t + 1));
                for _ in 0..3 {
                    let cost = 1 + rng.below(3) as u32;
                    let decision = limiter.check_n(&"race", cost).await.unwrap();
                    if !decision.allowed {
                        continue;
                    }
                    match rng.below(3) {
                        0 => assert!(Limiter::refund(&limiter, &"race", cost, decision)),
                        1 => {
                            let to = rng.below(u64::from(cost)) as u32;
                            assert!(Limiter::settle(&limiter, &"race", cost, decision, to));
                            kept.push(to);
                        }
                        _ => kept.push(cost),
                    }
                }
                kept
            });
        }
        let now = clock.now();
        for kept in tasks.join_all().await {
            admitted.extend(kept.into_iter().filter(|&c| c > 0).map(|c| (now, c)));
        }
        let gap = [
            length,
            length - 1,
            length + 1,
            2 * length,
            rng.below(3_000_000),
            0,
        ];
        clock.advance(Duration::from_nanos(rng.pick(&gap)));
    }
    conforms(quota, &admitted, "racing clones");
    let local: u64 = instances.iter().map(|l| l.counts().lease_decisions).sum();
    // How many are admitted depends on when the real-time give-backs land: 120 to 155 on an
    // idle 2-vCPU machine, 56 to 140 with four busy loops beside the test. The floor only says
    // the race was run, with leases deciding locally.
    assert!(
        admitted.len() > 20 && local > 20,
        "{} admitted, {local} local",
        admitted.len()
    );
}

/// A permit every 10 s, a burst of 20, reservations up to 1000 s: scaled so that no lease's
/// background give-back (a real-time timer of the lease's length) fires while the test runs.
async fn slow_pair(url: &str, length: u64) -> (ManualClock, RedisRateLimiter, RedisRateLimiter) {
    let quota = Quota::with_period(20, Duration::from_secs(200)).unwrap();
    let quota = quota.with_max_wait(Duration::from_secs(1000)).unwrap();
    let lease = Lease::new()
        .max_share(10)
        .length(Duration::from_secs(length));
    let clock = manual_clock_at(Duration::from_secs(1000));
    let a = strict::<Gcra>(url, quota, lease, &clock).await;
    (
        clock.clone(),
        a,
        strict::<Gcra>(url, quota, lease, &clock).await,
    )
}

/// `a` takes a share of 10 with a call of 10 and gives back all but `spend` of the call's
/// permits at once: its share holds `10 - spend` unspent.
async fn hold_ten(a: &RedisRateLimiter, spend: u32) {
    let taken = a.check_n(&"k", 10).await.unwrap();
    assert!(taken.allowed && Limiter::refund(a, &"k", 10 - spend, taken));
}

/// `a` holds 10 unspent; a second later `b` reserves 16, more than a share may hold, so Redis
/// decides it as without leases and counts `a`'s 10 as spent at that call: due 60 s later.
/// `a` spends its 10 at 49 s, before its lease ends: 26 in 12 s, where 21 fit.
#[tokio::test]
async fn a_reservation_made_while_a_share_is_out_counts_it_spent_at_once() {
    let server = or_skip!(RedisServer::start("lease_hostile_reservation_share_out"));
    let (clock, a, b) = slow_pair(&server.url(), 50).await;
    let t = clock.now();
    hold_ten(&a, 0).await;
    clock.advance(Duration::from_secs(1));
    let reserved = Limiter::reserve(&b, &"k", 16).await.unwrap();
    assert!(reserved.allowed, "{reserved:?}");
    let mut admitted = vec![(clock.now() + reserved.wait.as_nanos() as u64, 16)];
    clock.set(Duration::from_nanos(t + 49 * SEC));
    assert!(a.check_n(&"k", 10).await.unwrap().allowed);
    admitted.insert(0, (clock.now(), 10));
    conforms(a.quota(), &admitted, "a reservation while a share is out");
}

/// As above with leases of 8 s, but `a` spends its 10 at 7.9 s and `b` gives its reservation
/// back at 17 s, before it is due (its caller stopped waiting), after `a`'s lease has ended
/// in Redis: the refund restores the TAT of before the reservation, where `a`'s share counted
/// as of the reservation's call. `b`'s next 11 at 17 s make 21 in 9.1 s, where 20 fit.
#[tokio::test]
async fn a_refunded_reservation_forgets_a_share_spent_after_it() {
    let server = or_skip!(RedisServer::start("lease_hostile_refunded_reservation"));
    let (clock, a, b) = slow_pair(&server.url(), 8).await;
    let t = clock.now();
    hold_ten(&a, 0).await;
    clock.advance(Duration::from_secs(1));
    let reserved = Limiter::reserve(&b, &"k", 16).await.unwrap();
    assert!(reserved.allowed && !reserved.wait.is_zero(), "{reserved:?}");
    clock.set(Duration::from_nanos(t + 7_900_000_000));
    assert!(a.check_n(&"k", 10).await.unwrap().allowed);
    let mut admitted = vec![(clock.now(), 10)];
    clock.set(Duration::from_nanos(t + 17 * SEC));
    b.settle_and_wait(&"k", 16, reserved, 0).await.unwrap();
    if b.check_n(&"k", 11).await.unwrap().allowed {
        admitted.push((clock.now(), 11));
    }
    conforms(a.quota(), &admitted, "after a refunded reservation");
}

/// `a` holds 10 and spends 1; `b` reserves 15 at once (due at 50 s). At 40 s `a` asks for a
/// share of 20, which gives its 9 unused back beneath the reservation and is refused; a third
/// instance then takes 8 of them at 40 s: 8 + 15 in 10 s, where 21 fit.
#[tokio::test]
async fn a_share_given_back_beneath_a_reservation_frees_permits_before_it() {
    let server = or_skip!(RedisServer::start("lease_hostile_give_back_beneath"));
    let (clock, a, b) = slow_pair(&server.url(), 50).await;
    let t = clock.now();
    hold_ten(&a, 1).await;
    let mut admitted = vec![(t, 1)];
    let reserved = Limiter::reserve(&b, &"k", 15).await.unwrap();
    assert!(reserved.allowed, "{reserved:?}");
    admitted.push((t + reserved.wait.as_nanos() as u64, 15));
    clock.set(Duration::from_nanos(t + 40 * SEC));
    assert!(!a.check_n(&"k", 20).await.unwrap().allowed);
    let c = strict::<Gcra>(&server.url(), a.quota(), Lease::new().max_share(10), &clock).await;
    if c.check_n(&"k", 8).await.unwrap().allowed {
        admitted.insert(1, (clock.now(), 8));
    }
    conforms(
        a.quota(),
        &admitted,
        "a share given back beneath a reservation",
    );
}

/// An instance settles an admission to far more than its share holds: the debt is charged in
/// Redis, yet the rest of its share is still admitted from, at the same instant. One in-memory
/// limiter given the same calls refuses it: the debt is what the key's next requests wait for.
#[tokio::test]
async fn a_debt_charged_in_redis_leaves_the_share_admitting() {
    let server = or_skip!(RedisServer::start("lease_hostile_debt_share"));
    let quota = per_second(100, 20);
    let lease = Lease::new().max_share(8).length(Duration::from_secs(10));
    let clock = manual_clock_at(Duration::from_secs(1000));
    let a = strict::<Gcra>(&server.url(), quota, lease, &clock).await;
    let memory = keyed_on::<(), _>(quota, &clock);
    let taken = memory.check_n(&(), 8).unwrap();
    assert!(taken.allowed && Limiter::refund(&memory, &(), 8, taken));
    let one = memory.check_n(&(), 1).unwrap();
    assert!(Limiter::settle(&memory, &(), 1, one, 20));
    let in_memory = memory.check_n(&(), 7).unwrap().allowed;
    let taken = a.check_n(&"k", 8).await.unwrap();
    assert!(taken.allowed && Limiter::refund(&a, &"k", 8, taken));
    let one = a.check(&"k").await.unwrap();
    assert!(one.allowed);
    a.settle_and_wait(&"k", 1, one, 20).await.unwrap();
    let leased = a.check_n(&"k", 7).await.unwrap().allowed;
    let now = clock.now();
    let events = vec![(now, 1, false), (now, 19, true), (now, 7, !leased)];
    let excess = first_excess(quota, None, &events).map(|e| e.1);
    assert_eq!(leased, in_memory, "7 more after the debt: {excess:?}");
}

/// A quota lowered while a share is out, then an admission from it settled to far more than
/// the new quota's burst: the settle's debt is capped at what one request may take (the burst,
/// less the estimate), as everywhere else, so the share keeps the rest and gives it back unused
/// when its lease ends. (It took the whole share as debt, beyond the cap.)
#[tokio::test]
async fn a_settle_from_a_share_charges_no_more_than_the_lowered_burst() {
    let server = or_skip!(RedisServer::start("lease_hostile_debt_lowered"));
    let lease = Lease::new().max_share(8).length(Duration::from_secs(10));
    let clock = manual_clock_at(Duration::from_secs(1000));
    let a = strict::<Gcra>(&server.url(), per_second(100, 20), lease, &clock).await;
    // A share of 8, all back in it; one admitted from it: 7 left.
    let taken = a.check_n(&"k", 8).await.unwrap();
    assert!(taken.allowed && Limiter::refund(&a, &"k", 8, taken));
    let one = a.check(&"k").await.unwrap();
    assert!(one.allowed);
    a.set_quota(per_second(10, 3)).unwrap();
    a.settle_and_wait(&"k", 1, one, 20).await.unwrap();
    // The lease ends: what the share still held comes back unused, 7 less a debt of 3 - 1.
    clock.advance(Duration::from_secs(11));
    let _ = a.check(&"k").await.unwrap();
    assert_eq!(a.counts().lease_unused_permits, 5);
}

/// A share of 8 at 10 ms each (all back in it), then 5 admitted beside it by an instance that
/// leases nothing: the key's TAT is 130 ms ahead. The quota becomes 10 a second (100 ms each,
/// burst 20), and the next admission ends the share. One GCRA that gave the 8 back at the
/// shorter interval would have 19 permits, 8 of them for the new share: the other instance
/// admits 11 at the same instant. In Redis the 8 give back 800 ms at the new interval, the 5
/// beside them are forgotten, and it admits 12.
#[tokio::test]
#[ignore = "a known limit, documented on RedisRateLimiterBuilder::lease: a GCRA share given back after a set_quota that lengthened the interval gives back at the new interval"]
async fn a_share_ended_after_a_longer_interval_gives_back_what_it_was_charged() {
    let server = or_skip!(RedisServer::start("lease_hostile_longer_interval"));
    let lease = Lease::new().max_share(8).length(Duration::from_secs(10));
    let clock = manual_clock_at(Duration::from_secs(1000));
    let a = strict::<Gcra>(&server.url(), per_second(100, 20), lease, &clock).await;
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let prefix = format!("lease-hostile:{}:", std::any::type_name::<Gcra>());
    let b = propagating::<Gcra>(
        &store,
        per_second(100, 20),
        &clock,
        &prefix,
        Refusals::Uncached,
    )
    .build()
    .unwrap();
    let taken = a.check_n(&"k", 8).await.unwrap();
    assert!(taken.allowed && Limiter::refund(&a, &"k", 8, taken));
    assert!(b.check_n(&"k", 5).await.unwrap().allowed);
    for limiter in [&a, &b] {
        limiter.set_quota(per_second(10, 20)).unwrap();
    }
    assert!(a.check(&"k").await.unwrap().allowed);
    let mut admitted = 0;
    while b.check(&"k").await.unwrap().allowed {
        admitted += 1;
        assert!(admitted < 100, "never refused");
    }
    assert_eq!(admitted, 11);
}
