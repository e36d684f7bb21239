//! The guide: algorithms, guarantees and limits, written down once.
//!
//! # Choosing an algorithm
//!
//! | algorithm | memory per key | what it promises | where it is weak |
//! |---|---|---|---|
//! | [`Gcra`](crate::Gcra) (default) | one `u64` | over any span `S`, at most `burst + S / T` permits (`T = period / permits`) | nothing to speak of; it is a smoothed token bucket |
//! | [`FixedWindow`](crate::FixedWindow) | two `u64`s and a mutex | at most `permits` per cycle, cycles counted from the limiter's creation (Resilience4j) | up to `2 · permits` across a cycle boundary |
//! | [`SlidingLog`](crate::SlidingLog) | one entry per admission instant, up to `permits` | at most `permits` in every interval of length `period` (exact) | memory grows with the limit |
//! | [`SlidingCounter`](crate::SlidingCounter) | three counters and a mutex | at most `permits` per fixed window; under `2 · permits` in any sliding window | approximate when traffic bunches at a window's end |
//!
//! # What a decision says
//!
//! Every algorithm answers with a [`Decision`](crate::Decision):
//!
//! * `retry_after` of a refusal is the exact time until the same request would be admitted if
//!   nothing else arrived in between; it is never zero. The HTTP layer sends
//!   `Retry-After: max(1, ceil(retry_after))` seconds.
//! * `remaining` is what is left after this decision, counted in requests of cost one.
//! * `reset_after` is the time until the key is back to its full limit.
//!
//! # Waiting
//!
//! Waiting is opt-in through [`Quota::with_max_wait`](crate::Quota::with_max_wait). An `acquire`
//! whose permit arrives within `max_wait` reserves it, sleeps on tokio's timer (no thread is
//! parked) and proceeds; one whose permit would come later is refused at once and reserves
//! nothing. Dropping the future while it waits gives the reservation back:
//!
//! | algorithm | how a dropped waiter's reservation returns |
//! |---|---|
//! | GCRA | the key's TAT moves back by the reservation's cost; later waiters keep their slots and the next caller may use the freed one |
//! | fixed window | the permissions go back to the cycle's count (the debt shrinks) |
//! | sliding log | the reserved entry is removed |
//! | sliding counter | the count of the window the reservation falls in shrinks; reservations are possible only within the current and the next window |
//!
//! A reservation that has already fallen due is spent: there is nothing to give back.
//!
//! # Memory and eviction
//!
//! A [`KeyedRateLimiter`](crate::KeyedRateLimiter) holds at most `max_keys` keys (default one
//! million; about 36 bytes per key for IPv4 keys under GCRA, see `BENCHMARKS.md`). A key whose
//! state has gone idle (for GCRA: its TAT is in the past) behaves exactly like a key never seen,
//! so dropping it changes no decision; the store drops idle keys first whenever a shard is full,
//! and [`retain_recent`](crate::KeyedRateLimiter::retain_recent) drops them on demand. When a
//! shard is full of live keys, [`Overflow`](crate::Overflow) decides: evict the keys nearest to
//! idle (default) or refuse new keys until room frees.
//!
//! # Time
//!
//! Limiters read a [`Clock`](crate::Clock): [`SystemClock`](crate::SystemClock) in production,
//! [`ManualClock`](crate::ManualClock) in tests (time moves only when the test moves it), and
//! [`TokioClock`](crate::TokioClock) for tests that use `tokio::time::pause`, so that the
//! limiter's time and tokio's sleeping agree.
//!
//! # Concurrency
//!
//! GCRA updates a key with one compare-and-swap; the window algorithms take a per-key mutex for
//! the few instructions of their transition. N threads racing for a limit of L get exactly L
//! admissions (the test suite checks this for every algorithm on OS threads released together).
