//! Leases of a key's permits across instances (`RedisRateLimiterBuilder::lease`): several
//! limiters on one Redis, one manual clock, random demand, refunds and instances that die
//! holding a lease. Whatever they admit together, replayed in time order through one in-memory
//! GCRA of the same quota, must all be admitted there: no interval sees more than the quota
//! allows (rate × time + burst).

use std::time::Duration;

use crate::common::redis_server::{or_skip, RedisServer};
use crate::common::{in_bursts_of, manual_clock_at, Rng};
use crate::lease_hostile::{strict, strict_instances};
use tower_bulwark::algorithm::{Algorithm, FixedWindow, Gcra, SlidingCounter};
use tower_bulwark::clock::{Clock, ManualClock};
use tower_bulwark::limiter::Decision;
use tower_bulwark::redis::{Lease, RedisAlgorithm, RedisRateLimiter, RedisStore};
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

async fn instance(url: &str, quota: Quota, lease: Lease, clock: &ManualClock) -> RedisRateLimiter {
    strict::<Gcra>(url, quota, lease, clock).await
}

/// What one run admitted, in time order once sorted: (instant, cost).
struct Run {
    admitted: Vec<(u64, u32)>,
    asked: u64,
    local: u64,
}

/// `steps` requests on one key from `instances` limiters sharing `clock`, each of a random
/// cost, at random gaps; some admissions are vetoed (refunded) at once or a little later, and
/// now and then an instance dies holding its lease and a new one takes its place.
async fn run<A: RedisAlgorithm>(
    url: &str,
    quota: Quota,
    (lease, length): (Lease, Duration),
    seed: u64,
    steps: usize,
) -> Run {
    let clock = manual_clock_at(Duration::from_secs(1));
    let mut rng = Rng(seed);
    let mut instances = strict_instances::<A>(4, url, quota, lease, &clock).await;
    let key = format!("k{seed}");
    let interval = quota.period().as_nanos() as u64 / u64::from(quota.permits());
    // Admissions still standing: (instant, cost, the instance that made it, decision).
    let mut standing: Vec<(u64, u32, usize, Decision)> = Vec::new();
    let mut generation: Vec<usize> = (0..instances.len()).collect();
    let mut next_generation = instances.len();
    let horizon = interval * u64::from(quota.burst());
    let mut local = 0;
    let length = length.as_nanos() as u64;
    // The gaps to come before the random ones resume: an idle time (up to long enough to
    // refill the burst twice over), one call that takes a share from the refilled burst, a
    // shorter idle time within that lease, then a flood of three bursts at one instant, from
    // every instance: where a share held through a refill would show as an excess.
    let mut planned: Vec<u64> = Vec::new();
    for _ in 0..steps {
        let gap = match planned.pop() {
            Some(gap) => gap,
            None => match rng.below(20) {
                0 => {
                    planned = vec![0; 3 * quota.burst() as usize];
                    planned.push(rng.below(length));
                    horizon / 8 + rng.below(2 * horizon)
                }
                1..=5 => 0,
                6..=10 => rng.below(interval / 4 + 1),
                11..=15 => rng.below(interval + 1),
                _ => rng.below(4 * interval + 1),
            },
        };
        clock.advance(Duration::from_nanos(gap));
        let i = rng.below(instances.len() as u64) as usize;
        match rng.below(40) {
            0 => {
                // Dies holding whatever it leased; a new instance takes its place.
                // Its admissions stand: they happened.
                local += instances[i].counts().lease_decisions;
                instances[i] = strict::<A>(url, quota, lease, &clock).await;
                generation[i] = next_generation;
                next_generation += 1;
                continue;
            }
            1 | 2 if !standing.is_empty() => {
                // A veto of one of this instance's recent admissions.
                if let Some(at) = standing.iter().rposition(|entry| entry.2 == generation[i]) {
                    let (_, cost, _, decision) = standing.remove(at);
                    Limiter::refund(&instances[i], &key, cost, decision);
                }
                continue;
            }
            _ => {}
        }
        let cost = 1 + rng.below(3) as u32;
        let decision = instances[i].check_n(&key, cost).await.unwrap();
        if decision.allowed {
            standing.push((clock.now(), cost, generation[i], decision));
        }
    }
    local += instances
        .iter()
        .map(|l| l.counts().lease_decisions)
        .sum::<u64>();
    let mut admitted: Vec<(u64, u32)> = standing.iter().map(|e| (e.0, e.1)).collect();
    admitted.sort();
    Run {
        admitted,
        asked: steps as u64,
        local,
    }
}

/// Every admission of `admitted`, replayed at its instant through one in-memory GCRA of
/// `quota`, is admitted there too.
pub(crate) fn conforms(quota: Quota, admitted: &[(u64, u32)], what: &str) {
    conforms_to::<Gcra>(quota, admitted, what);
}

/// As [`conforms`], through one in-memory limiter of algorithm `A`.
fn conforms_to<A: Algorithm>(quota: Quota, admitted: &[(u64, u32)], what: &str) {
    let clock = ManualClock::new();
    let model = KeyedRateLimiter::<()>::builder(quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .build();
    let mut at = 0;
    for (n, &(instant, cost)) in admitted.iter().enumerate() {
        clock.advance(Duration::from_nanos(instant - at));
        at = instant;
        let decision = model.check_n(&(), cost).unwrap();
        if !decision.allowed {
            let horizon = quota.period().as_nanos() as u64 * u64::from(quota.burst())
                / u64::from(quota.permits());
            let recent: Vec<_> = (admitted[..=n].iter())
                .filter(|(at, _)| at + horizon >= instant)
                .collect();
            panic!(
                "{what}: admission {n} of {} ({cost} at {instant} ns) exceeds the quota; \
                 the admissions of the burst's horizon before it: {recent:?}",
                admitted.len()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_instances_together_never_exceed_the_quota() {
    let server = or_skip!(RedisServer::start(
        "leased_instances_together_never_exceed_the_quota"
    ));
    let url = server.url();
    let ms = Duration::from_millis;
    let lease = |share, length| (Lease::new().max_share(share).length(length), length);
    let cases = [
        (
            Quota::per_second(100).unwrap().with_burst(20).unwrap(),
            lease(5, ms(30)),
        ),
        (
            Quota::per_second(100).unwrap().with_burst(20).unwrap(),
            lease(10, ms(400)),
        ),
        (Quota::per_second(50).unwrap(), lease(6, ms(5))),
        (
            in_bursts_of(Quota::with_period(7, ms(300)).unwrap(), 9),
            lease(9, ms(100)),
        ),
        // The defaults: a quarter of the burst, a tenth of the period.
        (
            Quota::per_second(1000).unwrap().with_burst(100).unwrap(),
            (Lease::new(), ms(100)),
        ),
    ];
    let mut local = 0;
    for (n, (quota, lease)) in cases.into_iter().enumerate() {
        for seed in 1..=8 {
            let seed = n as u64 * 100 + seed;
            let run = run::<Gcra>(&url, quota, lease, seed, 600).await;
            conforms(quota, &run.admitted, &format!("case {n}, seed {seed}"));
            assert!(
                run.admitted.len() > 30,
                "case {n}, seed {seed}: {} admitted",
                run.admitted.len()
            );
            local += run.local;
            let _ = run.asked;
        }
    }
    assert!(local > 0, "no decision was made from a lease");
}

/// The same model for the window algorithms: a share of what the current window can still
/// admit, admitted from until the window ends. Replayed through one in-memory limiter of the
/// same algorithm, every admission of the four instances is admitted there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_window_instances_together_never_exceed_the_quota() {
    let server = or_skip!(RedisServer::start("leased_window_instances_together"));
    let url = server.url();
    let ms = Duration::from_millis;
    let lease = |share, length| (Lease::new().max_share(share).length(length), length);
    let cases = [
        (Quota::per_second(20).unwrap(), lease(5, ms(300))),
        (Quota::with_period(9, ms(250)).unwrap(), lease(9, ms(100))),
        (Quota::per_second(100).unwrap(), (Lease::new(), ms(100))),
    ];
    async fn window<A: RedisAlgorithm>(url: &str, cases: &[(Quota, (Lease, Duration))]) -> u64 {
        let mut local = 0;
        for (n, &(quota, lease)) in cases.iter().enumerate() {
            for seed in 1..=8 {
                let seed = 1000 + n as u64 * 100 + seed;
                let run = run::<A>(url, quota, lease, seed, 600).await;
                let what = format!("{} case {n}, seed {seed}", std::any::type_name::<A>());
                conforms_to::<A>(quota, &run.admitted, &what);
                assert!(
                    run.admitted.len() > 30,
                    "{what}: {} admitted",
                    run.admitted.len()
                );
                local += run.local;
            }
        }
        local
    }
    assert!(
        window::<FixedWindow>(&url, &cases).await > 0,
        "no decision from a lease"
    );
    assert!(
        window::<SlidingCounter>(&url, &cases).await > 0,
        "no decision from a lease"
    );
}

/// Uneven demand: one instance asks for a permit every millisecond, ten times the quota, and
/// another once every 50 ms. What the quiet one does not use goes to the busy one within a
/// lease's length: together they use at least 95 % of the quota over ten seconds, and every
/// admission keeps to the quota. The quiet one is not starved: it gets at least a fifth of its
/// calls, twice the tenth it would get if every call competed alike in one GCRA.
#[tokio::test]
async fn a_busy_instance_gets_what_a_quiet_one_leaves() {
    let server = or_skip!(RedisServer::start(
        "a_busy_instance_gets_what_a_quiet_one_leaves"
    ));
    let url = server.url();
    let quota = Quota::per_second(100).unwrap().with_burst(20).unwrap();
    let lease = Lease::new()
        .max_share(10)
        .length(Duration::from_millis(100));
    let clock = manual_clock_at(Duration::from_secs(1));
    let busy = instance(&url, quota, lease, &clock).await;
    let quiet = instance(&url, quota, lease, &clock).await;
    let (mut admitted, mut quiet_asked, mut quiet_admitted) = (Vec::new(), 0, 0);
    for step in 0..10_000u64 {
        clock.advance(Duration::from_millis(1));
        if busy.check(&"k").await.unwrap().allowed {
            admitted.push((clock.now(), 1));
        }
        if step % 50 == 0 {
            quiet_asked += 1;
            if quiet.check(&"k").await.unwrap().allowed {
                admitted.push((clock.now(), 1));
                quiet_admitted += 1;
            }
        }
    }
    conforms(quota, &admitted, "uneven demand");
    // 10 s at 100 a second, and the burst of 20 at the start.
    let allowed = 1_020;
    assert!(
        admitted.len() * 100 >= allowed * 95,
        "{} of {allowed} used ({quiet_admitted} by the quiet one)",
        admitted.len()
    );
    assert!(
        quiet_admitted * 5 >= quiet_asked,
        "the quiet one got {quiet_admitted} of {quiet_asked}"
    );
}

/// The excess leases would make if Redis forgot them: an instance takes a share from a full
/// burst, and before its lease ends the burst has had time to refill; then every instance
/// calls at one instant. Redis counts the share as taken all along, so the instant sees the
/// burst and no more.
#[tokio::test]
async fn a_share_held_through_a_refill_is_not_counted_twice() {
    let server = or_skip!(RedisServer::start(
        "a_share_held_through_a_refill_is_not_counted_twice"
    ));
    let url = server.url();
    let quota = Quota::per_second(100).unwrap().with_burst(20).unwrap();
    let lease = Lease::new().max_share(10).length(Duration::from_secs(1));
    let clock = manual_clock_at(Duration::from_secs(1));
    let (a, b) = (
        instance(&url, quota, lease, &clock).await,
        instance(&url, quota, lease, &clock).await,
    );
    // A flood on `a` grows its share to the most (1, 2, 4, 8, then 5 of the 10 it asks).
    let mut admitted = 0;
    for _ in 0..40 {
        admitted += u32::from(a.check(&"k").await.unwrap().allowed);
    }
    assert_eq!(admitted, 20, "the burst, from shares");
    // The burst refills; `a` takes a share of 10 for one call, and holds 9.
    clock.advance(Duration::from_millis(400));
    assert!(a.check(&"k").await.unwrap().allowed);
    // 100 ms: the 10 permits that come back are all Redis may hand out, the other 10 being in
    // `a`'s share. At one instant, `a` admits its 9 and `b` at most 10 (it takes shares of
    // 1, 2 and 4, then waits until 4 can be had): never more than the burst with the one
    // before. Were the share forgotten, this instant would see 29.
    clock.advance(Duration::from_millis(100));
    let mut at_once = 0;
    for _ in 0..40 {
        at_once += u32::from(a.check(&"k").await.unwrap().allowed);
        at_once += u32::from(b.check(&"k").await.unwrap().allowed);
    }
    assert!((16..=19).contains(&at_once), "{at_once} at one instant");
    assert!(a.counts().lease_decisions >= 9, "{:?}", a.counts());
}

/// An instance that spends its share late in its lease and dies: Redis keeps counting the
/// share until the lease ends, and then as taken at that end, not at the lease's start, so a
/// flood right after the end cannot add to permits spent just before it.
#[tokio::test]
async fn a_share_spent_late_by_an_instance_that_dies_counts_until_its_lease_ends() {
    let server = or_skip!(RedisServer::start(
        "a_share_spent_late_by_an_instance_that_dies"
    ));
    let url = server.url();
    // One permit every 10 ms, a burst of 20; leases of 20 ms, which Redis keeps for 40 ms.
    let quota = Quota::per_second(100).unwrap().with_burst(20).unwrap();
    let lease = Lease::new().max_share(10).length(Duration::from_millis(20));
    let clock = manual_clock_at(Duration::from_secs(1));
    let mut admitted = Vec::new();
    let dying = instance(&url, quota, lease, &clock).await;
    // Its share grows to 8 (shares of 1, 2, 4 and 8, each spent at once).
    for _ in 0..15 {
        assert!(dying.check(&"k").await.unwrap().allowed);
        admitted.push((clock.now(), 1));
    }
    // The burst refills; one call takes a share of 8 from it; 19 ms later, the 7 left of it
    // are spent, and the instance dies.
    clock.advance(Duration::from_millis(300));
    assert!(dying.check(&"k").await.unwrap().allowed);
    admitted.push((clock.now(), 1));
    clock.advance(Duration::from_millis(19));
    for _ in 0..7 {
        assert!(dying.check(&"k").await.unwrap().allowed);
        admitted.push((clock.now(), 1));
    }
    assert_eq!(dying.counts().lease_decisions, 18);
    drop(dying);
    // Just after Redis ends the lease: 12 permits can be had (20, less the 8 counted as taken
    // at its end), where counting them from its start would give 16, and 7 + 16 in 21 ms is
    // more than the quota allows (20 + 2).
    clock.advance(Duration::from_millis(21));
    let other = instance(&url, quota, lease, &clock).await;
    let big = other.check_n(&"k", 16).await.unwrap();
    assert!(!big.allowed, "{big:?}");
    let fits = other.check_n(&"k", 12).await.unwrap();
    assert!(fits.allowed, "{fits:?}");
    admitted.push((clock.now(), 12));
    conforms(quota, &admitted, "a share spent late");
}

/// Redis goes away and comes back (with its state: an append-only file written before each
/// answer): while it is away, the shares the instances hold are spent and then the fail mode
/// (closed) refuses; once it is back, leases go on from the state it kept. Every admission of
/// the three phases together keeps to the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_keep_to_the_quota_across_a_redis_restart() {
    use tower_bulwark::redis::RedisFailMode;

    let Some(mut server) =
        RedisServer::start_persistent("leases_keep_to_the_quota_across_a_redis_restart")
    else {
        return;
    };
    let quota = Quota::per_second(200).unwrap().with_burst(40).unwrap();
    let clock = manual_clock_at(Duration::from_secs(1));
    let mut instances = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let limiter = RedisRateLimiter::builder(quota, store)
            .client_clock(clock.clone())
            .prefix("lease-restart:")
            .timeout(Duration::from_millis(30))
            .probe_interval(Duration::ZERO)
            .fail_mode(RedisFailMode::Closed(Duration::from_secs(1)))
            .lease(Lease::new().max_share(8).length(Duration::from_millis(300)))
            .build()
            .unwrap();
        instances.push(limiter);
    }
    let mut rng = Rng(7);
    let mut admitted = Vec::new();
    let mut phase = |instances: &Vec<RedisRateLimiter>, steps: usize| {
        let mut calls = Vec::new();
        for _ in 0..steps {
            let gap = [0, 0, 1_000_000, 5_000_000][rng.below(4) as usize];
            calls.push((gap, rng.below(instances.len() as u64) as usize));
        }
        calls
    };
    for (step, calls) in [
        phase(&instances, 300),
        // Long enough for the shares held when Redis goes away to end (300 ms).
        phase(&instances, 300),
        phase(&instances, 300),
    ]
    .into_iter()
    .enumerate()
    {
        if step == 1 {
            server.kill();
        }
        if step == 2 {
            server.restart();
        }
        let counts = |instances: &Vec<RedisRateLimiter>| {
            let all = instances.iter().map(RedisRateLimiter::counts);
            all.fold((0, 0), |(local, taken), c| {
                (local + c.lease_decisions, taken + c.leases_taken)
            })
        };
        let (local_before, taken_before) = counts(&instances);
        for (gap, i) in calls {
            clock.advance(Duration::from_nanos(gap));
            let decision = instances[i].check(&"k").await.unwrap();
            if decision.allowed {
                admitted.push((clock.now(), 1));
            }
        }
        let (local_after, taken_after) = counts(&instances);
        if step == 1 {
            assert!(
                local_after > local_before,
                "no share was spent while Redis was away"
            );
            assert!(
                instances
                    .iter()
                    .map(|instance| instance.counts().failures)
                    .sum::<u64>()
                    > 0
            );
        }
        if step == 2 {
            assert!(
                local_after > local_before && taken_after > taken_before,
                "no lease after the restart"
            );
        }
    }
    conforms(quota, &admitted, "across a restart");
    assert!(admitted.len() > 100, "{} admitted", admitted.len());
}

/// 64 tasks on four instances (16 clones each) race at one instant for a burst of 20 that
/// does not refill in the test's time: together they never get more than 20. The permits a
/// share holds when its instance's tasks are done come back when its lease is over, and then
/// the others get them: exactly 20 in all, and no permit twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_on_leased_instances_get_exactly_the_burst() {
    let server = or_skip!(RedisServer::start(
        "racing_tasks_on_leased_instances_get_exactly_the_burst"
    ));
    let url = server.url();
    let quota = Quota::per_hour(20).unwrap();
    let lease = Lease::new().max_share(8).length(Duration::from_millis(100));
    let clock = manual_clock_at(Duration::from_secs(1));
    let mut instances = Vec::new();
    for _ in 0..4 {
        instances.push(instance(&url, quota, lease, &clock).await);
    }
    let race = |instances: &[RedisRateLimiter]| {
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..64 {
            let limiter = instances[n % 4].clone();
            tasks.spawn(async move { limiter.check(&"race").await.unwrap().allowed });
        }
        tasks
    };
    let first: usize = race(&instances)
        .join_all()
        .await
        .into_iter()
        .filter(|&a| a)
        .count();
    assert!(first <= 20, "{first} admitted at one instant");
    // The leases end (on the clock, and then by their timers): what they held comes back.
    clock.advance(Duration::from_millis(150));
    let ended = |instances: &[RedisRateLimiter]| {
        instances
            .iter()
            .map(|l| l.counts().leases_ended)
            .sum::<u64>()
    };
    let taken: u64 = instances.iter().map(|l| l.counts().leases_taken).sum();
    for _ in 0..300 {
        if ended(&instances) >= taken {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut total = first;
    for _ in 0..4 {
        total += race(&instances)
            .join_all()
            .await
            .into_iter()
            .filter(|&a| a)
            .count();
        clock.advance(Duration::from_millis(150));
        for _ in 0..300 {
            let taken: u64 = instances.iter().map(|l| l.counts().leases_taken).sum();
            if ended(&instances) >= taken {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert_eq!(total, 20, "first race {first}");
}

/// A quota lowered while shares are out, then a clock that jumps an hour ahead: nothing panics;
/// at the instant of the change, the instances admit no more than the shares they already held
/// (at most 8 each) and what the new burst allows; after the jump, what they admit keeps to
/// the new quota exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_changed_while_shares_are_out_and_a_clock_that_jumps() {
    let server = or_skip!(RedisServer::start("a_quota_changed_while_shares_are_out"));
    let url = server.url();
    let before = Quota::per_second(100).unwrap().with_burst(40).unwrap();
    let after = Quota::per_second(10).unwrap().with_burst(5).unwrap();
    let lease = Lease::new().max_share(8).length(Duration::from_millis(200));
    let clock = manual_clock_at(Duration::from_secs(1));
    let mut instances = Vec::new();
    for _ in 0..4 {
        instances.push(instance(&url, before, lease, &clock).await);
    }
    let flood = |instances: &[RedisRateLimiter], calls: usize| {
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..calls {
            let limiter = instances[n % instances.len()].clone();
            tasks.spawn(async move { limiter.check(&"q").await.unwrap().allowed });
        }
        tasks
    };
    // Shares out: each instance has taken some, and holds what it has not used.
    for (n, limiter) in instances.iter().enumerate() {
        for _ in 0..(2 + n) {
            assert!(limiter.check(&"q").await.unwrap().allowed);
        }
    }
    for limiter in &instances {
        limiter.set_quota(after).unwrap();
    }
    let at_change = flood(&instances, 200).join_all().await;
    let admitted = at_change.into_iter().filter(|&a| a).count();
    assert!(admitted <= 4 * 8 + 5, "{admitted} admitted at the change");

    clock.advance(Duration::from_secs(3600));
    let mut after_jump = Vec::new();
    for _ in 0..200 {
        clock.advance(Duration::from_millis(7));
        for (n, limiter) in instances.iter().enumerate() {
            if n % 2 == 0 && limiter.check(&"q").await.unwrap().allowed {
                after_jump.push((clock.now(), 1));
            }
        }
    }
    assert!(!after_jump.is_empty());
    conforms(after, &after_jump, "after the jump");
}

/// Settings a lease cannot have are refused by `build`, each naming what is wrong: the sliding
/// log, a share of nothing or beyond the burst, a length of zero or too long.
#[tokio::test]
async fn impossible_lease_settings_are_refused_naming_what_is_wrong() {
    use tower_bulwark::algorithm::SlidingLog;

    let store = RedisStore::connect_lazy("redis://127.0.0.1:1").unwrap();
    let quota = Quota::per_second(10).unwrap();
    let build = |builder: tower_bulwark::redis::RedisRateLimiterBuilder| {
        builder.build().map(drop).unwrap_err().to_string()
    };
    let builder = || RedisRateLimiter::builder(quota, store.clone());
    let err = build(builder().algorithm::<SlidingLog>().lease(Lease::new()));
    assert!(err.contains("sliding log"), "{err}");
    for window in [
        builder().algorithm::<FixedWindow>().lease(Lease::new()),
        builder().algorithm::<SlidingCounter>().lease(Lease::new()),
    ] {
        assert!(window.build().is_ok());
    }
    for share in [0, 11] {
        let err = build(builder().lease(Lease::new().max_share(share)));
        assert!(err.contains("max_share"), "{share}: {err}");
    }
    let err = build(builder().lease(Lease::new().length(Duration::ZERO)));
    assert!(err.contains("length"), "{err}");
    let long = Lease::new().length(Duration::from_secs(u64::MAX));
    assert!(build(builder().lease(long)).contains("length"));
    assert!(builder().lease(Lease::new().max_share(10)).build().is_ok());
}

/// `Lease::new`'s share and length "follow the quota in force: after a `set_quota`, the new
/// one's". A limiter built at 4 a second whose quota becomes 400 leases as one built at 400:
/// 200 admissions at one instant take the same few leases. Its share stayed a quarter of the
/// old burst, one permit, and each admission was a lease call (200 calls where 8 do).
#[tokio::test]
async fn a_default_share_follows_a_changed_quota() {
    let server = or_skip!(RedisServer::start("lease_default_share_follows"));
    let clock = manual_clock_at(Duration::from_secs(1000));
    let after = Quota::per_second(400).unwrap();
    let changed = instance(
        &server.url(),
        Quota::per_second(4).unwrap(),
        Lease::new(),
        &clock,
    )
    .await;
    changed.set_quota(after).unwrap();
    let built = instance(&server.url(), after, Lease::new(), &clock).await;
    for (limiter, key) in [(&changed, "changed"), (&built, "built")] {
        for i in 0..200 {
            assert!(limiter.check(&key).await.unwrap().allowed, "{key} {i}");
        }
    }
    let leases = |limiter: &RedisRateLimiter| limiter.counts().leases_taken;
    assert_eq!(leases(&changed), leases(&built));
    assert!(leases(&built) <= 10, "{}", leases(&built));
}
