//! Attacks on the lanes of `Pushback` after every quota of an answer became one (found by a
//! helper that had not seen the code): a `Spread` slot that outlived its window, the look-ahead
//! walking every window up to it, and an older answer that started a window while a
//! `Retry-After` lasted. Time is a `ManualClock`; nothing sleeps.

use std::sync::mpsc;
use std::task::Poll;
use std::time::Duration;

use tower_bulwark::outbound::pushback::Pacing;
use tower_bulwark::outbound::Pushback;

use super::dialects_support::{answer_str, call, make, S, TEN_MIN};
use super::hostile_support::on_manual_clock;
use super::several_quotas::two_in_flight;
use crate::common::poll_once;

/// "When they are spent, calls are held until `t` has passed; then the `q` calls of the policy
/// ... may start within its `w`". Under `Spread`, one call left over 600 s spaces calls 600 s
/// apart; the call made at 599 s sets the next slot at 1199 s, and that slot outlives the window:
/// the policy's 100 calls a second are held for another 599 s.
#[test]
fn a_spread_slot_does_not_hold_calls_past_its_window() {
    let (pushback, clock) = on_manual_clock(Pushback::builder("attack").pacing(Pacing::Spread));
    pushback.observe(&answer_str(
        200,
        &[
            ("ratelimit", r#""a";r=1;t=600"#),
            ("ratelimit-policy", r#""a";q=100;w=1"#),
        ],
    ));
    clock.advance(S(599));
    assert_eq!(call(&pushback), Ok(()));
    clock.advance(S(1));
    // t has passed: the next window gives 100 calls, spread 10 ms apart.
    assert_eq!(call(&pushback), Ok(()), "held past the window's end");
}

/// The same stale slot, with a long `max_hold`: `free_at` walked the policy's windows one `w`
/// at a time up to the slot, 10^10 steps here, with the schedule's lock held. Run on a thread
/// of its own, so that a walk fails the test rather than hanging it.
#[test]
fn the_look_ahead_is_not_a_walk_over_every_window() {
    const T: u64 = 10_000_000_000; // 317 years, in seconds: below u64::MAX nanoseconds
    let (pushback, clock) = on_manual_clock(
        Pushback::builder("attack")
            .pacing(Pacing::Spread)
            .max_hold(Duration::from_secs(1 << 42)),
    );
    pushback.observe(&answer_str(
        200,
        &[
            ("ratelimit", &format!(r#""a";r=1;t={T}"#)),
            ("ratelimit-policy", r#""a";q=1;w=1"#),
        ],
    ));
    clock.advance(S(T - 1));
    assert_eq!(call(&pushback), Ok(()));
    clock.advance(S(1));
    let (tx, rx) = mpsc::channel();
    let looking = pushback.clone();
    std::thread::spawn(move || tx.send(looking.held_for()).ok());
    let held = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("held_for walked the windows for over a minute");
    assert_eq!(
        held,
        Duration::ZERO,
        "the window has passed: its policy gives a call"
    );
}

/// Admitted calls from the end of a `Retry-After` of 20 s over the next 30 s, under a policy
/// of 2 calls per 30 s, with or without an older answer arriving during the hold.
fn admitted_after_hold(older_answer_has_quota: bool) -> usize {
    let (pushback, clock) = make(TEN_MIN);
    let [(older, mut older_call), (newer, mut newer_call)] = two_in_flight(&pushback);
    // The newer call: 429, hold 20 s, "a" spent (for 5 s), then 2 calls per 30 s.
    newer
        .send(answer_str(
            429,
            &[
                ("retry-after", "20"),
                ("ratelimit", r#""a";r=0;t=5"#),
                ("ratelimit-policy", r#""a";q=2;w=30"#),
            ],
        ))
        .unwrap();
    assert!(matches!(poll_once(newer_call.as_mut()), Poll::Ready(Ok(_))));
    clock.advance(S(6));
    // The older call's answer, written before: one call was left of "a" for 5 s.
    let fields: &[(&str, &str)] = if older_answer_has_quota {
        &[
            ("ratelimit", r#""a";r=1;t=5"#),
            ("ratelimit-policy", r#""a";q=2;w=30"#),
        ]
    } else {
        &[]
    };
    older.send(answer_str(200, fields)).unwrap();
    assert!(matches!(poll_once(older_call.as_mut()), Poll::Ready(Ok(_))));
    clock.advance(S(14)); // 20 s: the hold ends; the next window starts with this call.
    let mut admitted = 0;
    for _ in 0..30 {
        while call(&pushback).is_ok() {
            admitted += 1;
        }
        clock.advance(S(1));
    }
    admitted
}

/// "Each of these windows starts with the first call ... after the one before has passed and
/// no hold lasts"; an older answer "never loosens or shortens a hold". The older answer, read
/// at 6 s while the `Retry-After` lasts, starts the policy's window then (ending at 36 s):
/// after the hold, one call goes at 20 s and two more at 36 s, three within 16 s of a policy of
/// two per 30 s; without that answer, two go at 20 s and the next waits for 50 s.
#[test]
fn an_older_answer_during_a_hold_does_not_start_the_next_window() {
    assert_eq!(admitted_after_hold(false), 2, "without the older answer");
    assert_eq!(admitted_after_hold(true), 2, "with the older answer");
}
