//! Stale clock readings in Redis (a client clock behind another instance's, a read that
//! waited, a change of quota between the read and the decision): each decided as of the latest
//! reading its key was written at, or as of the instance's last change of quota; a key left
//! holding nothing keeps its reading; a give-back on a key that is gone writes nothing.

use std::time::Duration;

use crate::common::dial::Dial;
use crate::common::for_every_algorithm;
use crate::common::redis_server::{key_state, or_skip, uncached, RedisServer};
use crate::common::waits_up_to;
use tower_bulwark::algorithm::FixedWindow;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::redis::{Lease, RedisAlgorithm, RedisStore};
use tower_bulwark::{Limiter, Quota};

const MS: u64 = 1_000_000;

/// A stale reading (an instance whose clock is behind, a read that waited) is decided as of the
/// latest reading the key has seen, as in memory: the same decision as a fresh read then, and the
/// same state after it.
async fn stale_reads_decide_as_of_the_latest<A: RedisAlgorithm>(server: &RedisServer, tag: &str) {
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut conn = server.connection().await;
    let quota = waits_up_to(Quota::per_second(3).unwrap(), Duration::from_secs(2));
    let fresh_clock = ManualClock::new();
    let stale_clock = ManualClock::new();
    let fresh = uncached::<A>(&store, quota, &fresh_clock, &format!("{tag}:s:"));
    let stale = uncached::<A>(&store, quota, &stale_clock, &format!("{tag}:s:"));
    let twin = uncached::<A>(&store, quota, &fresh_clock, &format!("{tag}:t:"));
    for (step, &(fresh_ms, stale_ms, cost)) in [
        (100, 0, 1),
        (1_200, 900, 1),
        (1_250, 1_100, 2),
        // A `ManualClock` never goes back: the stale clock's readings rise too, each behind.
        (2_600, 1_150, 1),
        (2_700, 2_650, 2),
    ]
    .iter()
    .enumerate()
    {
        fresh_clock.set(Duration::from_millis(fresh_ms));
        stale_clock.set(Duration::from_millis(stale_ms));
        let a = fresh.reserve(&"k", 1).await.unwrap();
        let b = twin.reserve(&"k", 1).await.unwrap();
        assert_eq!(a, b, "{tag} step {step}: the fresh reads agree");
        // The stale read on one key, a fresh read at the latest instant on the other.
        let s = stale.reserve(&"k", cost).await.unwrap();
        let t = twin.reserve(&"k", cost).await.unwrap();
        assert_eq!(
            s, t,
            "{tag} step {step}: a read at {stale_ms} ms after {fresh_ms} ms"
        );
        assert_eq!(
            key_state(&mut conn, &fresh.redis_key("k")).await,
            key_state(&mut conn, &twin.redis_key("k")).await,
            "{tag} step {step}: the same state"
        );
    }
}

#[tokio::test]
async fn stale_reads_are_decided_as_of_the_latest_reading_for_every_algorithm() {
    let server = or_skip!(RedisServer::start("stale_reads_every_algorithm"));
    for_every_algorithm!(tagged: stale_reads_decide_as_of_the_latest(&server).await);
}

/// Where a stale reading comes in, each story on its own key under 1 a second (a client
/// clock).
#[derive(Clone, Copy, Debug)]
enum Story {
    /// An admission at 100 ms, a change to 2 per 2 s at 1.5 s, made again at 1 s (a thread
    /// that read its clock first: the floor stays at the first change); then three checks.
    /// `RedisRateLimiter::set_quota`: a reading older than the change "is decided as of the
    /// change": 900 ms decides as 1.5 s does.
    AfterAChange,
    /// An admission at 1 s, given back at 2.5 s (which leaves the key holding nothing), then
    /// a check and one at 2.6 s. The `redis` module: with a client clock "a key that holds
    /// nothing more keeps that instant ... rather than being deleted": 1.5 s decides as 2.5 s
    /// does and counts there, so the check at 2.6 s is answered as after a fresh one.
    AfterEmptied,
}

impl Story {
    /// The stale reading and the fresh one it must decide as, in ms.
    fn readings(self) -> [u64; 2] {
        match self {
            Self::AfterAChange => [900, 1_500],
            Self::AfterEmptied => [1_500, 2_500],
        }
    }

    /// What the checks of the story say when the first reads `read_ms`.
    async fn checks<A: RedisAlgorithm>(
        self,
        store: &RedisStore,
        read_ms: u64,
        prefix: &str,
    ) -> Vec<(bool, u64, Duration, Duration)> {
        let said = |d: tower_bulwark::limiter::Decision| {
            (d.allowed, d.remaining, d.retry_after, d.reset_after)
        };
        let clock = Dial::default();
        let l = uncached::<A>(store, Quota::per_second(1).unwrap(), &clock, prefix);
        let reads = match self {
            Self::AfterAChange => {
                clock.set(100 * MS);
                assert!(l.check("k").await.unwrap().allowed);
                let two_per_two_s = Quota::with_period(2, Duration::from_secs(2)).unwrap();
                for at in [1_500, 1_000] {
                    clock.set(at * MS);
                    l.set_quota(two_per_two_s).unwrap();
                }
                [read_ms; 3].to_vec()
            }
            Self::AfterEmptied => {
                clock.set(1_000 * MS);
                let d = l.check("k").await.unwrap();
                assert!(d.allowed);
                clock.set(2_500 * MS);
                l.settle_and_wait("k", 1, d, 0).await.unwrap();
                vec![read_ms, 2_600]
            }
        };
        let mut checks = Vec::new();
        for at in reads {
            clock.set(at * MS);
            checks.push(said(l.check("k").await.unwrap()));
        }
        checks
    }
}

/// `story`'s stale reading is decided as its fresh one is, and what follows is the same.
async fn a_stale_reading_decides_as_a_fresh_one<A: RedisAlgorithm>(
    store: &RedisStore,
    story: Story,
    tag: &str,
) {
    let [stale, fresh] = story.readings();
    assert_eq!(
        story
            .checks::<A>(store, stale, &format!("{tag}stale:"))
            .await,
        story
            .checks::<A>(store, fresh, &format!("{tag}fresh:"))
            .await,
        "{tag} {story:?}"
    );
}

#[tokio::test]
async fn a_reading_older_than_a_change_of_quota_is_decided_as_of_the_change_for_every_algorithm() {
    let (_server, store) = or_skip!(RedisServer::with_store("stale_after_a_change").await);
    let story = Story::AfterAChange;
    for_every_algorithm!(tagged: a_stale_reading_decides_as_a_fresh_one(&store, story).await);
}

#[tokio::test]
async fn a_key_emptied_by_a_give_back_still_decides_a_stale_reading_as_of_it_for_every_algorithm() {
    let (_server, store) = or_skip!(RedisServer::with_store("stale_after_emptied").await);
    let story = Story::AfterEmptied;
    for_every_algorithm!(tagged: a_stale_reading_decides_as_a_fresh_one(&store, story).await);
}

/// A settle past the capacity of an admission that took all of it charges nothing, as in
/// memory (`settle_debt`): no script call is made, and the key is as it was.
#[tokio::test]
async fn a_settle_that_can_charge_nothing_more_makes_no_call() {
    let (server, store) = or_skip!(RedisServer::with_store("settle_charges_nothing").await);
    let clock = ManualClock::new();
    let l = uncached::<FixedWindow>(&store, Quota::per_second(2).unwrap(), &clock, "whole:");
    let d = l.check_n("k", 2).await.unwrap();
    assert!(d.allowed);
    let mut conn = server.connection().await;
    let (state, calls) = (
        key_state(&mut conn, &l.redis_key("k")).await,
        server.evalsha_calls(),
    );
    clock.set(Duration::from_millis(300));
    l.settle_and_wait("k", 2, d, 10).await.unwrap();
    assert_eq!(
        server.evalsha_calls(),
        calls,
        "a call for nothing to charge"
    );
    assert_eq!(key_state(&mut conn, &l.redis_key("k")).await, state);
}

/// A leased key after a change of quota: a reading older than the change takes a share as of
/// the change, and is admitted from it as a fresh reading is (the share's window and the
/// instance's own decision read the clock as the script was sent it).
#[tokio::test]
async fn a_stale_reading_after_a_change_is_admitted_from_the_share_it_leases() {
    let (_server, store) = or_skip!(RedisServer::with_store("stale_lease_after_a_change").await);
    let q = Quota::per_second(100).unwrap();
    let mut said = Vec::new();
    for (read_ms, prefix) in [(5, "stale:"), (10, "fresh:")] {
        let clock = Dial::at(MS);
        let l = crate::common::redis_server::propagating::<tower_bulwark::algorithm::Gcra>(
            &store,
            q,
            &clock,
            prefix,
            crate::common::redis_server::Refusals::Uncached,
        )
        .lease(Lease::new())
        .build()
        .unwrap();
        clock.set(10 * MS);
        l.set_quota(q).unwrap();
        clock.set(read_ms * MS);
        let d = l.check("k").await.unwrap();
        said.push((d.allowed, d.remaining, d.retry_after));
    }
    assert!(said[0].0, "a stale reading refused: {said:?}");
    assert_eq!(said[0], said[1]);
}

/// A give-back or settle of an admission whose key is gone (expired, or deleted) writes
/// nothing: no key is made for it, as in memory, whose give-backs never make a key.
async fn a_give_back_on_a_gone_key_writes_nothing<A: RedisAlgorithm>(
    server: &RedisServer,
    store: &RedisStore,
    tag: &str,
) {
    let clock = Dial::at(1_000 * MS);
    let l = uncached::<A>(store, Quota::per_second(5).unwrap(), &clock, tag);
    let key = l.redis_key("k");
    for to in [0, 1] {
        let d = l.check_n("k", 2).await.unwrap();
        assert!(d.allowed);
        server.command(&["DEL", &key]);
        clock.set(1_100 * MS);
        l.settle_and_wait("k", 2, d, to).await.unwrap();
        assert_eq!(
            server.command(&["EXISTS", &key]),
            ":0",
            "{tag} settled to {to}"
        );
    }
}

#[tokio::test]
async fn a_give_back_on_a_key_that_is_gone_writes_nothing_for_every_algorithm() {
    let (server, store) = or_skip!(RedisServer::with_store("give_back_on_a_gone_key").await);
    for_every_algorithm!(tagged: a_give_back_on_a_gone_key_writes_nothing(&server, &store).await);
}
