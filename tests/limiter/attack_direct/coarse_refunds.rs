//! GCRA give-backs on a coarse clock: admissions, reservations and refunds in any order, at
//! readings that repeat, never leave the key more generous than if the requests given back had
//! never been made (the others replayed through a fresh limiter at their readings).

use super::*;

#[derive(Clone, Debug)]
enum Step {
    /// Clock advance in half seconds, then a request of 1 to 3 permits.
    Ask(u64, u32),
    /// Clock advance in half seconds, then a refund of the n-th admission (mod how many).
    Refund(u64, usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3u64, 1..4u32).prop_map(|(a, c)| Step::Ask(a, c)),
        (0..3u64, 0..64usize).prop_map(|(a, n)| Step::Refund(a, n)),
    ]
}

/// Runs `steps` on a limiter of `q` (requests made with `reserve`, so within the quota's
/// `max_wait` they wait), then drains it and the replay at the last reading.
fn run(q: Quota, steps: &[Step]) {
    let clock = ManualClock::new();
    let a = direct::<Gcra, _>(q, clock.clone());
    let mut made: Vec<(u64, u32, Option<Decision>)> = Vec::new();
    let mut now = 0;
    for s in steps {
        let (Step::Ask(advance, _) | Step::Refund(advance, _)) = s;
        now += advance * 500 * MS;
        clock.set(Duration::from_nanos(now));
        match *s {
            Step::Ask(_, cost) => {
                let d = reserve(&a, cost).unwrap();
                if d.allowed {
                    made.push((now, cost, Some(d)));
                }
            }
            Step::Refund(_, n) if !made.is_empty() => {
                let i = n % made.len();
                if let Some(d) = made[i].2.take() {
                    assert!(refund(&a, made[i].1, d));
                }
            }
            Step::Refund(..) => {}
        }
    }
    let replay_clock = ManualClock::new();
    let replay = direct::<Gcra, _>(q, replay_clock.clone());
    for (at, cost, d) in &made {
        if d.is_some() {
            replay_clock.set(Duration::from_nanos(*at));
            let again = reserve(&replay, *cost).unwrap();
            assert!(
                again.allowed,
                "at {at} ns the replay refuses what the limiter admitted: {again:?}"
            );
        }
    }
    replay_clock.set(Duration::from_nanos(now));
    let (got, replayed) = (drain(&a), drain(&replay));
    assert!(
        got <= replayed,
        "{got} admitted at the end, {replayed} had the refunded requests never been made"
    );
}

/// The same on two keys of a keyed limiter (a shard's keys share what a give-back publishes):
/// even requests go to one key, odd ones to the other; each key against its own replay.
fn run_keyed(q: Quota, steps: &[Step]) {
    let keyed = |clock: &ManualClock| {
        KeyedRateLimiter::<u8>::builder(q)
            .clock(clock.clone())
            .build()
    };
    let clock = ManualClock::new();
    let a = keyed(&clock);
    let mut made: Vec<(u8, u64, u32, Option<Decision>)> = Vec::new();
    let mut now = 0;
    for (i, s) in steps.iter().enumerate() {
        let (Step::Ask(advance, _) | Step::Refund(advance, _)) = s;
        now += advance * 500 * MS;
        clock.set(Duration::from_nanos(now));
        match *s {
            Step::Ask(_, cost) => {
                let key = (i % 2) as u8;
                let d = Limiter::reserve_now(&a, &key, cost).unwrap().unwrap();
                if d.allowed {
                    made.push((key, now, cost, Some(d)));
                }
            }
            Step::Refund(_, n) if !made.is_empty() => {
                let i = n % made.len();
                if let Some(d) = made[i].3.take() {
                    assert!(Limiter::refund(&a, &made[i].0, made[i].2, d));
                }
            }
            Step::Refund(..) => {}
        }
    }
    let replay_clock = ManualClock::new();
    let replay = keyed(&replay_clock);
    for (key, at, cost, d) in &made {
        if d.is_some() {
            replay_clock.set(Duration::from_nanos(*at));
            let again = Limiter::reserve_now(&replay, key, *cost).unwrap().unwrap();
            assert!(
                again.allowed,
                "key {key} at {at} ns: the replay refuses {again:?}"
            );
        }
    }
    replay_clock.set(Duration::from_nanos(now));
    for key in 0..2u8 {
        let got = admitted_until_refused(|| a.check(&key).allowed);
        let replayed = admitted_until_refused(|| replay.check(&key).allowed);
        assert!(
            got <= replayed,
            "key {key}: {got} admitted at the end, {replayed} replayed"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// A burst no schedule fills: every admission is immediate.
    #[test]
    fn attack_gcra_refunds_on_a_coarse_clock_are_never_more_generous_than_a_replay(
        steps in proptest::collection::vec(step(), 1..30)
    ) {
        run(quota(1, S, 200, 0), &steps);
    }

    /// A burst of 3 and waits of up to 4 s: reservations, refused requests, waiters given back.
    #[test]
    fn attack_gcra_refunds_of_reservations_on_a_coarse_clock_are_never_more_generous_than_a_replay(
        steps in proptest::collection::vec(step(), 1..30)
    ) {
        run(quota(1, S, 3, 4 * S), &steps);
    }

    /// Two keys of a keyed limiter: immediate admissions, then reservations.
    #[test]
    fn attack_gcra_refunds_on_two_keys_of_a_coarse_clock_are_never_more_generous_than_a_replay(
        steps in proptest::collection::vec(step(), 1..40)
    ) {
        run_keyed(quota(1, S, 200, 0), &steps);
        run_keyed(quota(1, S, 3, 4 * S), &steps);
    }
}
