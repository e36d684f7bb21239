//! Model checking, with loom, of the state that tower-bulwark's threads share without a lock of
//! their own: the bulkhead's permits (its lock and its counters, which a snapshot reads apart),
//! the GCRA compare-and-swap loop and the fixed-window transition, each under clock readings that threads take at different times.
//!
//! Loom runs each model under every interleaving of its threads (up to a bound on preemptions),
//! so an assertion here holds in all of them. From the repository's root:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p tower-bulwark-loom --profile loom
//! ```
//!
//! (`.ci/run` does; `-- --nocapture` shows how many interleavings each model explored). With
//! `--cfg loom` the library's atomics and mutex are loom's (its `src/sync.rs`).
//! `LOOM_MAX_PREEMPTIONS` overrides each model's bound on preemptions; `LOOM_LOG=1` and
//! `LOOM_LOCATION=1` explain a failure; `-- --ignored` runs the models that find known bugs
//! (none at present).
//!
//! Through the public API only: the bulkhead is driven through `BulkheadService` around an inner
//! service that counts the calls inside it, the algorithms through `Transitions`.
#![cfg(all(test, loom))]

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loom::future::block_on;
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use tower_bulwark::algorithm::{
    FixedWindow, FixedWindowState, Gcra, GcraState, LatestReading, Transitions,
};
use tower_bulwark::{bulkhead::BulkheadService, limiter::Decision, BoxError, Bulkhead, Quota};
use tower_layer::Layer;
use tower_service::Service;

/// Runs `model` under every interleaving with at most `preemptions` preemptions (unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise), and says how many there were and how long they took.
fn check(preemptions: usize, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let started = std::time::Instant::now();
    builder.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        model();
    });
    eprintln!(
        "{}: {} interleavings in {:.2?}",
        std::thread::current().name().unwrap_or("model"),
        runs.load(std::sync::atomic::Ordering::Relaxed),
        started.elapsed()
    );
}

/// The usual bound: each race below needs a thread stopped between a read and its write, once or
/// twice, and a third thread or a second stop on top. Some models take fewer where three would
/// cost minutes.
const PREEMPTIONS: usize = 3;

/// One second in nanoseconds: the algorithms' time unit here.
const S: u64 = 1_000_000_000;

/// A clock that threads read at different times: a thread may act on a reading that another
/// thread has already overtaken.
#[derive(Clone)]
struct Clock(Arc<AtomicU64>);

impl Clock {
    fn at(now: u64) -> Self {
        Self(Arc::new(AtomicU64::new(now)))
    }

    fn now(&self) -> u64 {
        self.0.load(SeqCst)
    }

    fn set(&self, now: u64) {
        self.0.store(now, SeqCst);
    }
}

/// One decision as its thread saw it.
#[derive(Clone, Copy, Debug)]
struct Seen {
    now: u64,
    allowed: bool,
    /// When the permit takes effect: the instant it was charged at (the thread's reading or the
    /// key's later one, or a reservation's due instant); for a refusal, the thread's reading.
    due: u64,
    remaining: u64,
    /// Given back after it was made.
    refunded: bool,
}

impl Seen {
    fn of(now: u64, d: &Decision) -> Self {
        Self {
            now,
            allowed: d.allowed,
            // A stale reading is decided as of the key's latest one, so an admission takes
            // effect at the instant it was charged at, not at its thread's own reading.
            due: if d.allowed { d.charge_instant() } else { now },
            remaining: d.remaining,
            refunded: false,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GCRA
// ---------------------------------------------------------------------------------------------

/// One permit a second, `burst` at once, under a quota that lets requests wait up to ten seconds
/// (the models reserve with waits of their own within that).
fn gcra(burst: u32) -> Gcra {
    let quota = Quota::with_period(1, Duration::from_secs(1))
        .unwrap()
        .with_burst(burst)
        .unwrap()
        .with_max_wait(Duration::from_secs(10))
        .unwrap();
    Gcra::new(&quota, 0)
}

const T: u64 = S;

/// The keys of one shard as the keyed store holds them: a GCRA state per key (its TAT and its
/// latest reading, which a stale reading is decided as of, in one word), and the shard's
/// `LatestReading` that they share (the floor under their readings, and give-backs' mark).
#[derive(Default)]
struct Shard {
    keys: [GcraState; 2],
    latest: LatestReading,
}

impl Shard {
    fn decide(&self, g: &Gcra, key: usize, now: u64, max_wait: u64) -> Decision {
        g.decide(&self.keys[key], &self.latest, now, 1, max_wait)
    }

    fn refund(&self, g: &Gcra, key: usize, now: u64, d: &Decision) {
        g.refund(&self.keys[key], &self.latest, now, 1, d);
    }

    fn tat(&self, g: &Gcra, key: usize) -> u64 {
        g.idle_at(&self.keys[key])
    }

    fn charge(&self, g: &Gcra, key: usize, now: u64, cost: u32) {
        g.charge(&self.keys[key], &self.latest, now, cost);
    }
}

/// GCRA's promise over the admitted decisions that were not given back (`seen`), whatever the
/// order and staleness of their clock reads:
///
/// * over any span `[a, b]` of due times, at most `burst + (b - a) / T` permits;
/// * the TAT is at least `a + n·T` for every due time `a`, where `n` counts the permits due at
///   `a` or later: what these decisions justify. A lower TAT lets the next caller share a slot
///   that one of them holds, which breaks the first promise.
fn assert_gcra_promise(burst: u64, tat: u64, seen: &[Seen]) {
    let mut due: Vec<u64> = seen
        .iter()
        .filter(|s| s.allowed && !s.refunded)
        .map(|s| s.due)
        .collect();
    due.sort_unstable();
    for i in 0..due.len() {
        for j in i..due.len() {
            let count = (j - i + 1) as u64;
            assert!(
                count * T <= burst * T + (due[j] - due[i]),
                "{count} permits due within {} ns, burst {burst}: {seen:#?}",
                due[j] - due[i]
            );
        }
        let justified = due[i] + (due.len() - i) as u64 * T;
        assert!(
            tat >= justified,
            "TAT {tat} below the {justified} that the admitted decisions justify: {seen:#?}"
        );
    }
}

/// The decisions of `seen` made for `key`.
fn of_key(seen: &[(usize, Seen)], key: usize) -> Vec<Seen> {
    seen.iter()
        .filter(|(k, _)| *k == key)
        .map(|&(_, s)| s)
        .collect()
}

/// Three threads, one instant, a burst of two: exactly two admitted (no update lost, no
/// refusal while a permit is free), with the remaining counts of a sequential run.
#[test]
fn gcra_racing_threads_get_exactly_the_burst() {
    check(PREEMPTIONS, || {
        let g = gcra(2);
        let shard = Arc::new(Shard::default());
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let shard = shard.clone();
                thread::spawn(move || shard.decide(&g, 0, 0, 0))
            })
            .collect();
        let decisions: Vec<Decision> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let mut remaining: Vec<u64> = decisions
            .iter()
            .filter(|d| d.allowed)
            .map(|d| d.remaining)
            .collect();
        remaining.sort_unstable();
        assert_eq!(remaining, [0, 1], "{decisions:#?}");
        assert_eq!(shard.tat(&g, 0), 2 * T);
    });
}

/// `threads` threads decide once for each of `waits` (their `max_wait`s) on clock readings that
/// the model moves on meanwhile, from 0 to T to 2T, so a thread may decide on a reading older
/// than the TAT (and the reading) another has already stored, and retry its compare-and-swap
/// on it. With `two_keys`, the threads take turns
/// between the two keys of the shard (thread `i`'s `j`-th decision is for key `(i + j) % 2`):
/// each key keeps its own promise while the other key's readings move the shared one on.
fn gcra_stale_reads(
    burst: u32,
    threads: usize,
    waits: &'static [u64],
    two_keys: bool,
    preemptions: usize,
) {
    check(preemptions, move || {
        let g = gcra(burst);
        let shard = Arc::new(Shard::default());
        let clock = Clock::at(0);
        let threads: Vec<_> = (0..threads)
            .map(|i| {
                let (shard, clock) = (shard.clone(), clock.clone());
                thread::spawn(move || {
                    let decide = |(j, &max_wait): (usize, &u64)| {
                        let key = if two_keys { (i + j) % 2 } else { 0 };
                        let now = clock.now();
                        (key, Seen::of(now, &shard.decide(&g, key, now, max_wait)))
                    };
                    waits.iter().enumerate().map(decide).collect::<Vec<_>>()
                })
            })
            .collect();
        clock.set(T);
        clock.set(2 * T);
        let seen: Vec<(usize, Seen)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        for key in 0..2 {
            assert_gcra_promise(u64::from(burst), shard.tat(&g, key), &of_key(&seen, key));
        }
    });
}

/// Stale readings are not refused for being stale. Burst 2, one permit a second: three threads
/// with fixed readings, T and 0 on key 0 and T on key 1 of the same shard. Decided at any
/// instant from 0 to T, in any order, each key's requests fit its burst, so all three are
/// admitted. Decided at its own reading after the reading T had set key 0's TAT to 2T, the
/// stale reading 0 would be refused (its permit due at T, a second ahead of it): it must be
/// decided as of T, the latest reading of its key, while the other key's reading moves on
/// beside it.
#[test]
fn gcra_stale_readings_on_two_keys_of_a_shard_are_decided_as_of_the_latest() {
    check(PREEMPTIONS, || {
        let g = gcra(2);
        let shard = Arc::new(Shard::default());
        let threads: Vec<_> = [(0, T), (0, 0), (1, T)]
            .into_iter()
            .map(|(key, now)| {
                let shard = shard.clone();
                thread::spawn(move || (key, Seen::of(now, &shard.decide(&g, key, now, 0))))
            })
            .collect();
        let seen: Vec<(usize, Seen)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(seen.iter().all(|(_, s)| s.allowed), "{seen:#?}");
        for key in 0..2 {
            assert_gcra_promise(2, shard.tat(&g, key), &of_key(&seen, key));
        }
    });
}

#[test]
fn gcra_stale_clock_reads_never_over_admit() {
    gcra_stale_reads(2, 2, &[0, 0], false, PREEMPTIONS);
}

#[test]
fn gcra_two_keys_of_a_shard_on_stale_clock_reads_never_over_admit() {
    gcra_stale_reads(1, 2, &[0, 0], true, PREEMPTIONS);
}

#[test]
fn gcra_three_threads_on_stale_clock_reads_never_over_admit() {
    // Two preemptions suffice for a compare-and-swap to fail twice; three take 20 s.
    gcra_stale_reads(2, 3, &[0], false, 2);
}

#[test]
fn gcra_reservations_on_stale_clock_reads_never_share_a_slot() {
    gcra_stale_reads(1, 2, &[0, 3 * T], false, PREEMPTIONS);
}

#[test]
fn gcra_reservations_on_two_keys_of_a_shard_never_share_a_slot() {
    gcra_stale_reads(1, 2, &[3 * T, 3 * T], true, PREEMPTIONS);
}

/// A waiter gives its reservation back while another caller reserves the slot after it. Burst
/// 1; a permit used at 0; A reserves (due T), B reserves (due 2T), A gives back. A refund that
/// moved the TAT from 3T back to 2T gave the next caller B's slot at 2T while A's slot at T
/// stayed unused (it did so with no race at all whenever a waiter that is not the last one
/// left). `Gcra::refund` gives back only an admission that is still the key's latest (the TAT
/// is still the one it left): A's permits stay spent when B reserved in between, and go back
/// exactly otherwise, so the next caller is due at 2T or 3T, never later (no more than A's slot
/// is lost).
#[test]
fn gcra_refund_racing_a_reservation() {
    check(PREEMPTIONS, || {
        let g = gcra(1);
        let max_wait = 2 * T;
        let shard = Arc::new(Shard::default());
        let first = Seen::of(0, &shard.decide(&g, 0, 0, 0));
        let leaver = {
            let shard = shard.clone();
            thread::spawn(move || {
                let d = shard.decide(&g, 0, 0, max_wait);
                let mut seen = Seen::of(0, &d);
                if seen.allowed && seen.due > 0 {
                    shard.refund(&g, 0, 0, &d);
                    seen.refunded = true;
                }
                seen
            })
        };
        let stayer = {
            let shard = shard.clone();
            thread::spawn(move || Seen::of(0, &shard.decide(&g, 0, 0, max_wait)))
        };
        let mut seen = vec![first, leaver.join().unwrap(), stayer.join().unwrap()];
        // Willing to wait for 3T: the slot after B's, if A's permits stayed spent.
        let next = Seen::of(0, &shard.decide(&g, 0, 0, 3 * T));
        seen.push(next);
        assert_gcra_promise(1, shard.tat(&g, 0), &seen);
        assert!(
            next.allowed && next.due <= 3 * T,
            "more than the refunded slot lost: {seen:#?}"
        );
    });
}

/// A give-back behind a settle's debt races an admission at a later reading (issue 35, item
/// 1). Burst 1: X admitted at 0 (TAT T), then a settle
/// charges one permit of debt (TAT 2T, past the horizon). A gives X back while B decides at T.
/// X comes back whole when A goes first (B is then admitted at T); after B's reading, the
/// second that passed has paid X's permit and nothing comes back. Either way the debt and the
/// admissions keep the promise.
#[test]
fn gcra_give_back_behind_debt_racing_a_later_reading() {
    give_back_behind_debt_racing(T, 0);
}

/// Burst 1: X admitted at 0 (TAT T), a settle's debt of one permit (TAT 2T); a thread gives X
/// back at 0 while another decides at `at`, waiting up to `max_wait`; then a third decision at
/// the same. X's permit is counted as the debt's (one permit charged at 0 either way), and the
/// debt and the admissions keep the promise.
fn give_back_behind_debt_racing(at: u64, max_wait: u64) {
    check(PREEMPTIONS, move || {
        let g = gcra(1);
        let shard = Arc::new(Shard::default());
        let x = shard.decide(&g, 0, 0, 0);
        assert!(x.allowed);
        shard.charge(&g, 0, 0, 1);
        let debt = Seen::of(0, &x);
        let giver = {
            let shard = shard.clone();
            thread::spawn(move || shard.refund(&g, 0, 0, &x))
        };
        let racer = {
            let shard = shard.clone();
            thread::spawn(move || Seen::of(at, &shard.decide(&g, 0, at, max_wait)))
        };
        giver.join().unwrap();
        let raced = racer.join().unwrap();
        let next = Seen::of(at, &shard.decide(&g, 0, at, max_wait));
        assert_gcra_promise(1, shard.tat(&g, 0), &[debt, raced, next]);
    });
}

/// A give-back behind a settle's debt races a waiter's reservation (issue 35, item 1). Burst 1:
/// X admitted at 0 (TAT T), a settle's debt of one permit (TAT 2T). A gives X back while W
/// reserves at 0. A first: X comes back whole and W falls due at T. W first: W holds the slot
/// from 2T and marks the key, so X's permit stays spent; moving the TAT back would let the next
/// waiter fall due at 2T beside W. Either way the next waiter falls due after W.
#[test]
fn gcra_give_back_behind_debt_racing_a_waiter() {
    give_back_behind_debt_racing(0, 5 * T);
}

/// A permit refused by another policy goes back (issue 11, item 5) while a caller whose clock
/// reading is newer takes the next one. Burst 1: A admitted at 0 (TAT T); B admitted at T (TAT
/// 2T); A's refund, reading T, moved the TAT to T although A's slot had passed (it read the
/// key's clock before B moved it, and kept back no time): a third caller at T was admitted
/// beside B. `Gcra::refund` gives back only an admission that is still the key's latest, so
/// once B is admitted A's permit stays spent.
#[test]
fn gcra_refund_of_an_admission_racing_a_newer_clock_read() {
    gcra_refund_racing_a_newer_reading(0);
}

/// The same race with B on the other key of the shard: B's newer reading is B's key's alone,
/// and A's key keeps its promise.
#[test]
fn gcra_refund_racing_a_newer_clock_read_on_another_key_of_the_shard() {
    gcra_refund_racing_a_newer_reading(1);
}

/// A decides on key 0 and gives its admission back; B decides on key `b_key`; the clock moves
/// from 0 to T meanwhile; then a third caller decides on key 0 at T.
fn gcra_refund_racing_a_newer_reading(b_key: usize) {
    check(PREEMPTIONS, move || {
        let g = gcra(1);
        let shard = Arc::new(Shard::default());
        let clock = Clock::at(0);
        let vetoed = {
            let (shard, clock) = (shard.clone(), clock.clone());
            thread::spawn(move || {
                let now = clock.now();
                let d = shard.decide(&g, 0, now, 0);
                let mut seen = Seen::of(now, &d);
                if seen.allowed {
                    shard.refund(&g, 0, clock.now(), &d);
                    seen.refunded = true;
                }
                (0, seen)
            })
        };
        let later = {
            let (shard, clock) = (shard.clone(), clock.clone());
            thread::spawn(move || {
                let now = clock.now();
                (b_key, Seen::of(now, &shard.decide(&g, b_key, now, 0)))
            })
        };
        clock.set(T);
        let mut seen = vec![vetoed.join().unwrap(), later.join().unwrap()];
        seen.push((0, Seen::of(T, &shard.decide(&g, 0, T, 0))));
        for key in 0..2 {
            assert_gcra_promise(1, shard.tat(&g, key), &of_key(&seen, key));
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Fixed window
// ---------------------------------------------------------------------------------------------

/// Cycles of ten seconds.
const P: u64 = 10 * S;

fn fixed_window(limit: u32) -> FixedWindow {
    FixedWindow::new(
        &Quota::with_period(limit, Duration::from_nanos(P)).unwrap(),
        0,
    )
}

/// The cycle an admission counts in: the one holding the instant it was charged at (its
/// thread's reading, or the key's later latest reading, or the instant a reservation falls due).
fn charged_cycle(s: &Seen) -> u64 {
    assert!(s.allowed, "only admissions are charged: {s:?}");
    s.due / P
}

/// Two threads decide twice each while the clock moves from cycle 0 to cycle 1, so a reading
/// from cycle 0 may reach the state after another thread moved it to cycle 1 (it is then
/// decided as of cycle 1). Each admission counts in a cycle no earlier than its own reading; no
/// cycle admits more than the limit; a refusal comes only when every cycle it could have been
/// decided in was full; and the remaining counts are those of a sequential run.
#[test]
fn fixed_window_stale_clock_reads_stay_within_each_cycle() {
    const LIMIT: u64 = 2;
    check(PREEMPTIONS, || {
        let fw = fixed_window(LIMIT as u32);
        let state = Arc::new(FixedWindowState::default());
        let clock = Clock::at(P / 2);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (state, clock) = (state.clone(), clock.clone());
                thread::spawn(move || {
                    [(); 2].map(|()| {
                        let now = clock.now();
                        Seen::of(
                            now,
                            &fw.decide(&state, &LatestReading::default(), now, 1, 0),
                        )
                    })
                })
            })
            .collect();
        clock.set(P + P / 2);
        let seen: Vec<Seen> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let admitted: Vec<&Seen> = seen.iter().filter(|s| s.allowed).collect();
        for cycle in 0..=1 {
            let mut remaining: Vec<u64> = admitted
                .iter()
                .filter(|s| charged_cycle(s) == cycle)
                .map(|s| s.remaining)
                .collect();
            remaining.sort_unstable();
            let count = remaining.len() as u64;
            assert!(count <= LIMIT, "cycle {cycle} over its limit: {seen:#?}");
            // No update lost: the remaining counts of a sequential run.
            let expected: Vec<u64> = (0..count).map(|k| LIMIT - count + k).collect();
            assert_eq!(remaining, expected, "cycle {cycle}: {seen:#?}");
        }
        for s in &admitted {
            assert!(
                charged_cycle(s) >= s.now / P,
                "counted in a cycle before its reading: {seen:#?}"
            );
        }
        // No refusal while there was room: a refused reading was decided as of itself or a
        // later reading (at most the last, in cycle 1), so some cycle from its own on was full.
        for s in seen.iter().filter(|s| !s.allowed) {
            let full = (s.now / P..=1).any(|cycle| {
                admitted
                    .iter()
                    .filter(|a| charged_cycle(a) == cycle)
                    .count() as u64
                    == LIMIT
            });
            assert!(
                full,
                "refused with room in every cycle it could be decided in: {seen:#?}"
            );
        }
    });
}

/// A waiter gives back its reservation of the next cycle while the clock moves into that cycle
/// and another caller decides there: no cycle ever has more than its limit in permits that
/// were admitted and not given back (a reservation already due when given back is spent).
#[test]
fn fixed_window_refund_racing_a_decide() {
    check(PREEMPTIONS, || {
        let fw = fixed_window(1);
        let state = Arc::new(FixedWindowState::default());
        let clock = Clock::at(P / 2);
        let first = Seen::of(
            P / 2,
            &fw.decide(&state, &LatestReading::default(), P / 2, 1, 0),
        );
        let leaver = {
            let (state, clock) = (state.clone(), clock.clone());
            thread::spawn(move || {
                let now = clock.now();
                let d = fw.decide(&state, &LatestReading::default(), now, 1, P);
                let mut seen = Seen::of(now, &d);
                let later = clock.now();
                if seen.allowed && seen.due > later {
                    fw.refund(&state, &LatestReading::default(), later, 1, &d);
                    seen.refunded = true;
                }
                seen
            })
        };
        let other = {
            let (state, clock) = (state.clone(), clock.clone());
            thread::spawn(move || {
                let now = clock.now();
                Seen::of(
                    now,
                    &fw.decide(&state, &LatestReading::default(), now, 1, 0),
                )
            })
        };
        clock.set(P + P / 2);
        let mut seen = vec![first, leaver.join().unwrap(), other.join().unwrap()];
        let now = clock.now();
        seen.push(Seen::of(
            now,
            &fw.decide(&state, &LatestReading::default(), now, 1, 0),
        ));
        for cycle in 0..=2 {
            let admitted = seen
                .iter()
                .filter(|s| s.allowed && !s.refunded && charged_cycle(s) == cycle)
                .count();
            assert!(admitted <= 1, "cycle {cycle}: {seen:#?}");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Bulkhead
// ---------------------------------------------------------------------------------------------

/// What the calls through a bulkhead did, counted by the callers and the inner service.
#[derive(Default)]
struct Counts {
    /// Calls about to be made.
    attempts: AtomicUsize,
    /// Calls that reached the inner service.
    entered: AtomicUsize,
    /// Calls inside the inner service now.
    inside: AtomicUsize,
    /// Calls whose inner service is done (their permit may not be back yet).
    left: AtomicUsize,
    /// Admitted calls whose response future has completed, permit given back.
    done: AtomicUsize,
}

/// An inner service that counts the calls inside it and fails the model when there are more
/// than `bound`: the limit in force when its caller was admitted.
#[derive(Clone)]
struct Probe {
    counts: Arc<Counts>,
    bound: usize,
}

/// The inner call: leaves when polled.
struct Inside(Arc<Counts>);

impl Future for Inside {
    type Output = Result<(), Infallible>;

    fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.inside.fetch_sub(1, SeqCst);
        self.0.left.fetch_add(1, SeqCst);
        Poll::Ready(Ok(()))
    }
}

impl Service<()> for Probe {
    type Response = ();
    type Error = Infallible;
    type Future = Inside;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, (): ()) -> Inside {
        self.counts.entered.fetch_add(1, SeqCst);
        let inside = self.counts.inside.fetch_add(1, SeqCst) + 1;
        assert!(
            inside <= self.bound,
            "{inside} calls inside a bulkhead of {}",
            self.bound
        );
        Inside(self.counts.clone())
    }
}

struct Rig {
    bulkhead: Bulkhead,
    counts: Arc<Counts>,
}

impl Rig {
    fn new(bulkhead: Bulkhead) -> Self {
        Self {
            bulkhead,
            counts: Arc::default(),
        }
    }

    fn service(&self, bound: usize) -> BulkheadService<Probe> {
        self.bulkhead.layer().layer(Probe {
            counts: self.counts.clone(),
            bound,
        })
    }

    /// Starts a call; the response future holds the permit.
    fn start(
        &self,
        svc: &mut BulkheadService<Probe>,
    ) -> impl Future<Output = Result<(), BoxError>> {
        let mut cx = Context::from_waker(Waker::noop());
        assert!(svc.poll_ready(&mut cx).is_ready());
        self.counts.attempts.fetch_add(1, SeqCst);
        let counts = self.counts.clone();
        let call = svc.call(());
        async move {
            let result = call.await;
            if result.is_ok() {
                counts.done.fetch_add(1, SeqCst);
            }
            result
        }
    }

    /// Makes a call to its end; `true` when it was admitted.
    fn call(&self, bound: usize) -> bool {
        let mut svc = self.service(bound);
        match block_on(self.start(&mut svc)) {
            Ok(()) => true,
            Err(e) => {
                assert!(e.is::<tower_bulwark::BulkheadFull>(), "{e}");
                false
            }
        }
    }

    /// A snapshot taken while calls run, checked against counts read just before and just
    /// after it: its totals are never behind what was counted before it, nor ahead of what was
    /// counted after it, and never show a call finished that was not permitted.
    fn snapshot_between(&self, max: usize) {
        let c = &self.counts;
        let (done, entered) = (c.done.load(SeqCst), c.entered.load(SeqCst));
        let snap = self.bulkhead.snapshot();
        let (left, attempts) = (c.left.load(SeqCst), c.attempts.load(SeqCst));
        let (permitted, finished) = (snap.total_permitted, snap.total_finished);
        assert!(
            done as u64 <= finished && finished <= left as u64,
            "done {done} left {left}: {snap:?}"
        );
        assert!(
            entered as u64 <= permitted && permitted <= attempts as u64,
            "{snap:?}"
        );
        assert!(finished <= permitted, "{snap:?}");
        let held = (permitted - finished) as usize;
        assert!(snap.available_concurrent_calls + held <= max, "{snap:?}");
    }

    /// After every call has ended: every permit is back, and the totals add up.
    fn assert_settled(&self, max: usize, admitted: usize) {
        let snap = self.bulkhead.snapshot();
        let c = &self.counts;
        assert_eq!(snap.max_allowed_concurrent_calls, max, "{snap:?}");
        assert_eq!(snap.available_concurrent_calls, max, "{snap:?}");
        assert_eq!(snap.queue_depth, 0, "{snap:?}");
        assert_eq!(snap.total_permitted, admitted as u64, "{snap:?}");
        assert_eq!(snap.total_finished, admitted as u64, "{snap:?}");
        assert_eq!(c.entered.load(SeqCst), admitted);
        assert_eq!(c.inside.load(SeqCst), 0);
        let attempts = c.attempts.load(SeqCst) as u64;
        assert!(
            snap.total_permitted + snap.total_rejected <= attempts,
            "{snap:?}"
        );
    }
}

/// Three callers against two permits, the third caller also reading a snapshot while the
/// others run: never more than two calls inside; a call is refused only when two are; every
/// permit comes back exactly once; and the snapshot's totals lie between the counts around it.
#[test]
fn bulkhead_never_more_calls_than_permits() {
    check(PREEMPTIONS, || {
        let rig = Arc::new(Rig::new(Bulkhead::semaphore("loom", 2).build()));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let rig = rig.clone();
                thread::spawn(move || rig.call(2))
            })
            .collect();
        let mut admitted = usize::from(rig.call(2));
        rig.snapshot_between(2);
        admitted += threads
            .into_iter()
            .map(|t| usize::from(t.join().unwrap()))
            .sum::<usize>();
        assert!(admitted >= 2, "refused with a permit free");
        rig.assert_settled(2, admitted);
        assert_eq!(rig.bulkhead.snapshot().total_rejected, 3 - admitted as u64);
    });
}

/// The limit goes from 2 to 1 while two calls may be in flight, then the thread that lowered it
/// makes a call of its own: that call never finds another inside (the excess of the lowering is
/// paid by the calls in flight before any new one is admitted), and once all have ended exactly
/// one permit is free: the excess was neither forgotten nor retired twice.
#[test]
fn bulkhead_lowering_the_limit_keeps_exact_excess() {
    check(PREEMPTIONS, || {
        let rig = Arc::new(Rig::new(Bulkhead::semaphore("loom", 2).build()));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let rig = rig.clone();
                thread::spawn(move || rig.call(2))
            })
            .collect();
        rig.bulkhead.set_max_concurrent_calls(1);
        let snap = rig.bulkhead.snapshot();
        assert!(snap.available_concurrent_calls <= 1, "{snap:?}");
        let mut admitted = usize::from(rig.call(1));
        for t in threads {
            admitted += usize::from(t.join().unwrap());
        }
        rig.assert_settled(1, admitted);
    });
}

/// A queue bulkhead of one permit, held by the model's own call, and two callers that wait while
/// the limit is raised to two: a waiter is let in at once (a lost wake-up would leave it parked,
/// which loom reports as a deadlock), the other when a permit comes back, never more than two
/// calls inside, and both permits free at the end.
#[test]
fn bulkhead_raising_the_limit_lets_a_waiter_in() {
    // Three preemptions take over three minutes here.
    check(2, || {
        let rig = Arc::new(Rig::new(Bulkhead::queue("loom", 1, 2).build()));
        let mut svc = rig.service(2);
        let held = rig.start(&mut svc);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let rig = rig.clone();
                thread::spawn(move || rig.call(2))
            })
            .collect();
        rig.bulkhead.set_max_concurrent_calls(2);
        block_on(held).unwrap();
        for t in threads {
            assert!(t.join().unwrap(), "a queued call was refused");
        }
        rig.assert_settled(2, 3);
    });
}

/// A queue bulkhead of two permits, both held by the model's own calls, and a caller waiting
/// on another thread. The model ends its first call (its permit may be handed to the waiter
/// before the waiter runs), lowers the limit to one, then ends its second call. A waiter whose
/// permit pays the lower limit waits again and is let in by the second call's permit: never
/// lost (loom reports a waiter left parked as a deadlock), never two calls inside once the
/// second has ended, one permit free at the end.
#[test]
fn bulkhead_a_waiter_holding_a_permit_a_lowered_limit_needs_is_let_in() {
    check(2, || {
        let rig = Arc::new(Rig::new(Bulkhead::queue("loom", 2, 1).build()));
        let mut svc = rig.service(2);
        let first = rig.start(&mut svc);
        let second = rig.start(&mut svc);
        let waiter = {
            let rig = rig.clone();
            thread::spawn(move || rig.call(2))
        };
        block_on(first).unwrap();
        rig.bulkhead.set_max_concurrent_calls(1);
        block_on(second).unwrap();
        assert!(waiter.join().unwrap(), "a queued call was refused");
        rig.assert_settled(1, 3);
    });
}

/// A queue bulkhead of one permit, held by the model's own call; one caller waits once and
/// gives up, another waits to the end, while the held permit comes back, possibly granted to
/// the one giving up just before it does. That permit is passed on, not lost (the other waiter
/// would stay parked: loom reports a deadlock) and not doubled (never two calls inside, one
/// permit free at the end).
#[test]
fn bulkhead_a_cancelled_waiter_passes_its_permit_on() {
    check(PREEMPTIONS, || {
        let rig = Arc::new(Rig::new(Bulkhead::queue("loom", 1, 2).build()));
        let mut svc = rig.service(1);
        let held = rig.start(&mut svc);
        let leaver = {
            let rig = rig.clone();
            thread::spawn(move || {
                let mut svc = rig.service(1);
                let mut call = pin!(rig.start(&mut svc));
                let mut cx = Context::from_waker(Waker::noop());
                // Dropped after one poll: a queued call leaves the queue.
                match call.as_mut().poll(&mut cx) {
                    Poll::Ready(result) => usize::from(result.is_ok()),
                    Poll::Pending => 0,
                }
            })
        };
        let stayer = {
            let rig = rig.clone();
            thread::spawn(move || rig.call(1))
        };
        block_on(held).unwrap();
        let admitted = leaver.join().unwrap() + 1;
        assert!(stayer.join().unwrap(), "a queued call was refused");
        rig.assert_settled(1, admitted + 1);
    });
}
/// A call while the limit goes from 1 to 2 and back to 1: a permit is free at every instant
/// until the call takes one, so the call is never refused; and one permit is free at the end.
#[test]
fn bulkhead_a_call_racing_a_resize_is_refused_only_when_no_permit_is_free() {
    check(PREEMPTIONS, || {
        let rig = Arc::new(Rig::new(Bulkhead::semaphore("loom", 1).build()));
        let caller = {
            let rig = rig.clone();
            thread::spawn(move || rig.call(2))
        };
        rig.bulkhead.set_max_concurrent_calls(2);
        rig.bulkhead.set_max_concurrent_calls(1);
        assert!(caller.join().unwrap(), "refused with a permit free");
        rig.assert_settled(1, 1);
    });
}
