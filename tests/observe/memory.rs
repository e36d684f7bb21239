//! Memory held by the observability wrapper under a flood of waiting requests, measured with a
//! counting allocator (per thread: the runtime runs on the test's own thread).

use crate::common::direct_on;
use crate::common::{in_bursts_of, waits_up_to};
use crate::counting;

use std::time::Duration;

use tower_bulwark::observe::Observed;
use tower_bulwark::{clock::ManualClock, Limiter, Quota};

/// Promise (task brief / DESIGN.md "Hostile conditions are the normal case ... key floods
/// arrive"; `observe` docs: `waiting_requests` counts "requests holding a reservation that has
/// not fallen due"): observing a limiter must not keep memory for requests that are long gone.
///
/// `Observed` keeps each outstanding reservation; a waiter that simply completes must leave
/// nothing behind, whether or not anybody ever takes a snapshot (this grew by one map entry per
/// waited request, forever, until ended waits were dropped on every decision).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn completed_waits_leave_no_memory_behind() {
    const N: u64 = 100_000;
    let clock = ManualClock::new();
    // One permit per millisecond, no burst, waits up to 10 ms.
    let quota = waits_up_to(
        in_bursts_of(Quota::per_second(1000).unwrap(), 1),
        Duration::from_millis(10),
    );
    let limiter = Observed::new("flood", direct_on(quota, &clock));
    // Warm up whatever is allocated once.
    for _ in 0..4 {
        clock.advance(Duration::from_millis(2));
        let _ = Limiter::<()>::reserve_now(&limiter, &(), 1);
        let _ = Limiter::<()>::reserve_now(&limiter, &(), 1);
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    let _ = limiter.snapshot();

    let before = counting::live_bytes();
    let mut waited = 0u64;
    for _ in 0..N {
        // The limiter's clock and tokio's timer (on which waiters sleep) move together.
        clock.advance(Duration::from_millis(2));
        tokio::time::advance(Duration::from_millis(2)).await;
        let now = Limiter::<()>::reserve_now(&limiter, &(), 1)
            .unwrap()
            .unwrap();
        assert!(now.allowed && now.wait.is_zero());
        // The next permit falls due in 1 ms: a waiting admission. Its caller waits and proceeds
        // (nothing is refunded), as the HTTP layer does.
        let later = Limiter::<()>::reserve_now(&limiter, &(), 1)
            .unwrap()
            .unwrap();
        assert!(later.allowed && !later.wait.is_zero());
        waited += 1;
    }
    // Every wait has long fallen due.
    tokio::time::advance(Duration::from_secs(60)).await;
    let grown = counting::live_bytes() - before;

    let snapshot = limiter.snapshot();
    assert_eq!(snapshot.waiting_requests, 0);
    let after_snapshot = counting::live_bytes() - before;
    eprintln!(
        "{waited} completed waits: {grown} bytes held before snapshot(), {after_snapshot} after"
    );
    assert!(
        grown < 64 * 1024,
        "{grown} bytes ({} per request) still held for {waited} requests whose waits ended \
         (snapshot() frees them: {after_snapshot} bytes after)",
        grown / waited as isize
    );
}
