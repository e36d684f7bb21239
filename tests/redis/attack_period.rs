//! Attacks on the Redis sliding counter's renumbering (`g`, a decision's `state_after`) and on
//! leases' window marks across changes of period: a give-back or a lease's end never frees more
//! than the admission or the lease took in the window that counted it.

use std::time::Duration;

use crate::common::manual_clock_at;
use crate::common::redis_server::RedisServer;
use crate::lease_hostile::strict;
use tower_bulwark::algorithm::SlidingCounter;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::redis::{Lease, RedisFailMode, RedisRateLimiter, RedisStore};
use tower_bulwark::Quota;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn per(permits: u32, period: Duration) -> Quota {
    Quota::with_period(permits, period).unwrap()
}

async fn sliding(url: &str, quota: Quota, clock: &ManualClock) -> RedisRateLimiter {
    let store = RedisStore::connect(url).await.unwrap();
    RedisRateLimiter::builder(quota, store)
        .algorithm::<SlidingCounter>()
        .client_clock(clock.clone())
        .prefix("attack-period:")
        .timeout(Duration::from_secs(5))
        .fail_mode(RedisFailMode::Propagate)
        .build()
        .unwrap()
}

async fn drain(l: &RedisRateLimiter, key: &str) -> u64 {
    let mut n = 0;
    while l.check(&key).await.unwrap().allowed {
        n += 1;
    }
    n
}

/// An admission under windows of 1 s; two windows on, its key ends: a give-back of another
/// admission leaves every count zero, so the script deletes the key (and its numbering `g`), or
/// the test deletes it, standing in for its expiry. The period becomes 100 s (the window
/// [1000 s, 1100 s) holds the first admission's instant); 10 are admitted there; then the first
/// admission is given back. It was counted in a window of 1 s long gone: nothing may come back.
async fn give_back_after_the_key_ended(tag: &str, expired: bool) {
    let Some(server) = RedisServer::start(tag) else {
        return;
    };
    let clock = manual_clock_at(Duration::from_millis(1_000_500));
    let l = sliding(&server.url(), per(10, secs(1)), &clock).await;
    let first = l.check(&"k").await.unwrap();
    let second = l.check(&"k").await.unwrap();
    assert!(first.allowed && second.allowed);
    clock.advance(secs(2));
    if expired {
        let mut conn = server.connection().await;
        let _: () = redis::cmd("DEL")
            .arg(l.redis_key(&"k"))
            .query_async(&mut conn)
            .await
            .unwrap();
    } else {
        // Two windows on: the counts weigh nothing; this give-back leaves them zero.
        l.settle_and_wait(&"k", 1, second, 0).await.unwrap();
    }
    l.set_quota(per(10, secs(100))).unwrap();
    let fresh = drain(&l, "k").await;
    l.settle_and_wait(&"k", 1, first, 0).await.unwrap();
    let more = drain(&l, "k").await;
    assert!(
        fresh + more <= 10,
        "{fresh} admitted at 1002.5 s under windows of 100 s, then {more} more once an admission \
         of a window of 1 s (1000 s) was given back, the key {} between (limit 10)",
        if expired { "expired" } else { "deleted" }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_period_give_back_after_the_key_was_deleted_and_the_period_changed() {
    give_back_after_the_key_ended("attack_period::deleted", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_period_give_back_after_the_key_expired_and_the_period_changed() {
    give_back_after_the_key_ended("attack_period::expired", true).await;
}

/// Windows of 100 s, then 10 s, then 100 s again, the key touched under each (two
/// renumberings); a request under each numbering, all given back after the last: at every step
/// the key has admitted (what stays admitted) no more than a twin key that never made them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_period_give_backs_across_two_changes_of_period() {
    let Some(server) = RedisServer::start("attack_period::two_changes") else {
        return;
    };
    let clock = manual_clock_at(secs(1010));
    let l = sliding(&server.url(), per(10, secs(100)), &clock).await;
    let (mut got, mut twin_got) = (0, 0);
    let mut given = vec![];
    for (cost, period, at) in [(3, 100, 1010), (2, 10, 1025), (1, 100, 1030)] {
        l.set_quota(per(10, secs(period))).unwrap();
        clock.set(secs(at));
        let d = l.check_n(&"k", cost).await.unwrap();
        if d.allowed {
            given.push((cost, d));
        }
        got += drain(&l, "k").await;
        twin_got += drain(&l, "twin").await;
        assert!(got <= twin_got, "at {at} s: {got} against {twin_got}");
    }
    for (cost, d) in given {
        l.settle_and_wait(&"k", cost, d, 0).await.unwrap();
    }
    for at in [1030, 1060, 1099, 1100, 1150, 1200] {
        clock.set(secs(at));
        got += drain(&l, "k").await;
        twin_got += drain(&l, "twin").await;
        assert!(
            got <= twin_got,
            "at {at} s: {got} admitted by a key whose requests (under three numberings) were \
             given back, {twin_got} by a twin that never made them"
        );
    }
}

/// A lease of windows of 100 s (shares of 1, 2 and 4: 7 counted, 4 spent), the period then
/// 400 s and back to 100 s, the key touched by another instance under each: once the share is
/// ended, the window [1000 s, 1100 s) never admits more than 10 in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_period_lease_ended_across_two_changes_of_period() {
    let Some(server) = RedisServer::start("attack_period::lease_two") else {
        return;
    };
    let lease = Lease::new().max_share(8).length(secs(50));
    let clock = manual_clock_at(secs(1000));
    let (a, b) = (
        strict::<SlidingCounter>(&server.url(), per(10, secs(100)), lease, &clock).await,
        strict::<SlidingCounter>(&server.url(), per(10, secs(100)), Lease::new(), &clock).await,
    );
    let mut admitted = 0;
    for _ in 0..4 {
        assert!(a.check(&"k").await.unwrap().allowed);
        admitted += 1;
    }
    for (period, at) in [(400, 1010), (100, 1020)] {
        a.set_quota(per(10, secs(period))).unwrap();
        b.set_quota(per(10, secs(period))).unwrap();
        clock.set(secs(at));
        admitted += u64::from(b.check(&"k").await.unwrap().allowed);
    }
    // Past the share's end: the next lease call ends it.
    clock.set(secs(1051));
    for _ in 0..12 {
        admitted += u64::from(a.check(&"k").await.unwrap().allowed);
        admitted += u64::from(b.check(&"k").await.unwrap().allowed);
    }
    assert!(
        admitted <= 10,
        "{admitted} admitted in [1000 s, 1100 s) through two changes of period (limit 10)"
    );
}
