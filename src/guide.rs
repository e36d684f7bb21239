//! The guide: algorithms, guarantees and limits, written down once.
//!
//! # Choosing an algorithm
//!
//! | algorithm | memory per key | what it promises | where it is weak |
//! |---|---|---|---|
//! | [`Gcra`](crate::Gcra) (default) | two `u64`s (TAT, latest reading) | over any span `S`, at most `burst + S / T` permits (`T = period / permits`) | nothing to speak of; it is a smoothed token bucket |
//! | [`FixedWindow`](crate::FixedWindow) | three `u64`s and a mutex | at most `permits` per cycle, cycles counted from the limiter's creation (Resilience4j) | up to `2 · permits` across a cycle boundary |
//! | [`SlidingLog`](crate::SlidingLog) | one entry per admission instant, up to `permits` | at most `permits` in every interval of length `period` (exact), reservations included | memory grows with the limit |
//! | [`SlidingCounter`](crate::SlidingCounter) | three counters, the window index and the latest reading, and a mutex | at most `permits` per fixed window; at most `2 · permits` in any sliding window; steady traffic below the rate is never refused | approximate when traffic bunches at a window's end |
//!
//! # Guarantees under hostile conditions
//!
//! Each row is proved by the named tests (in `tests/limiter_hardening.rs`,
//! `tests/limiter_model.rs` and `tests/limiter.rs`).
//!
//! | | concurrency and stale clocks | key floods | refunds (a waiter gone, a veto by another policy) |
//! |---|---|---|---|
//! | GCRA | exact: N threads racing for L get exactly L, whatever order their readings arrive in; a reading older than the latest one that changed the key is decided as of it (`racing_threads_with_stale_readings_get_exactly_the_limit`, `stale_readings_get_exactly_the_limit`) | a key that used its quota ranks above any fresh key and is never evicted for one (`a_key_flood_never_hands_a_limited_client_a_fresh_quota`) | exact while the refunded admission is still the key's latest, its TAT unchanged (a veto given back before the key admits anything else, a waiter with no later one behind it): the TAT goes back by the cost, never below the latest reading. When later admissions moved the TAT on but none of them is a reservation still ahead (a shared key, a tenant, with other requests admitted meanwhile), an immediate admission gives back its cost less the time elapsed since it was charged: exact at one instant, never more than the request added. Otherwise (a reservation ahead) nothing goes back: never over-granted, two permits never share a slot (`a_veto_leaves_every_limiter_as_if_never_made`, `a_veto_given_back_later_leaves_the_key_as_if_never_made`, `refusals_on_a_shared_gcra_key_drain_nothing_while_others_are_admitted`, `a_gcra_refund_never_hands_out_a_slot_a_later_reservation_holds`, `a_vetoed_gcra_admission_behind_a_later_reservation_stays_spent`, `a_late_gcra_refund_never_frees_a_later_admissions_slot`, `gcra_never_over_admits_whatever_is_given_back`) |
//! | fixed window | exact, same tests; a stale reading never lands in a cycle that has ended | same test | exact for the last permits taken: every immediate admission while no reservation is outstanding, and a reservation of one permit due in the last cycle holding charges; an earlier charge (before later reservations, or of several permits straddling two cycles) is kept, never over-granted; a charge of an ended cycle is spent (`a_request_vetoed_by_another_policy_spends_nothing`, `a_veto_leaves_every_limiter_as_if_never_made`) |
//! | sliding log | exact, same tests; entries pruned for a later reading are never forgotten by an earlier one (`sliding_log_never_admits_over_the_limit_with_a_stale_reading`, `sliding_log_matches_a_list_under_stale_readings_waits_and_refunds`) | same test | exact, past or future: the entry is removed and its slot is free for the next caller (`sliding_log_reuses_a_refunded_reservation_slot`) |
//! | sliding counter | exact, same tests; a stale reading never panics nor drops the previous window's weight (`a_reading_older_than_the_state_is_decided_as_of_the_latest`) | same test | exact: the count of the window holding the charge shrinks (previous, current or next) |
//!
//! Clock readings beyond 2^62 ns (146 years after the clock's origin) are taken as 2^62 ns:
//! time stands still there and every limit keeps holding
//! (`a_clock_near_u64_max_never_wraps_admits_everything_or_panics`). Quotas are bounded
//! so that every instant and count is computed exactly, in memory and in the Redis scripts:
//! periods and `max_wait` up to 2^60 ns (about 36.5 years), and at most 2^53 permits held per
//! key (see [`Quota`](crate::Quota); `absurd_periods_are_refused_and_the_longest_accepted_is_exact`).

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
//! nothing. Dropping the future while it waits gives the reservation back, and a request that
//! another policy refuses gives back what the others granted, immediate admissions included:
//!
//! | algorithm | how an admission returns |
//! |---|---|
//! | GCRA | the key's latest admission returns whole: the TAT moves back by its cost (never below the latest reading) and the next caller may use the freed slot; an immediate admission with only immediate ones after it returns its cost less the time elapsed since; one with a later reservation behind it stays spent, so later waiters keep their slots and no caller is handed one of theirs |
//! | fixed window | the permissions go back to the cycle's count (the debt shrinks) when they are the last taken; see the table above |
//! | sliding log | the entry is removed, and the next caller may take its slot even before later reservations |
//! | sliding counter | the count of the window the admission was charged to shrinks; reservations are possible only within the current and the next window |
//!
//! An admission charged in a past that no longer weighs on the key (a fixed window's ended
//! cycle, a sliding log entry older than the window) is spent: there is nothing to give back.

//! # Memory and eviction
//!
//! A [`KeyedRateLimiter`](crate::KeyedRateLimiter) holds at most `max_keys` keys (default one
//! million; `BENCHMARKS.md` measures about 52 bytes per key for IPv4 keys under GCRA, whose state
//! is two `u64`s: the TAT and the latest reading). A key whose state has gone idle (for GCRA: its
//! TAT is in the past) behaves exactly like a key never seen, so dropping it changes no decision;
//! the store drops idle keys first whenever a shard is full, and
//! [`retain_recent`](crate::KeyedRateLimiter::retain_recent) drops them on demand. When a shard
//! is full of live keys, [`Overflow`](crate::Overflow) decides: evict the keys whose loss gives
//! away least, by [`Algorithm::eviction_rank`](crate::Algorithm::eviction_rank) (default), or
//! refuse new keys until room frees. Either way a flood of fresh keys never hands a client that
//! is being limited a fresh quota (`tests/eviction_floods.rs`, and the flood test of every
//! algorithm above), with one exception: a quota of one request under the fixed window or the
//! sliding counter, where a limited client and a flood's key hold the same single permit of the
//! same window and either may be evicted (see [`Overflow`](crate::Overflow)).

//! # Time
//!
//! Limiters read a [`Clock`](crate::Clock): [`SystemClock`](crate::SystemClock) in production,
//! [`ManualClock`](crate::ManualClock) in tests (time moves only when the test moves it), and
//! [`TokioClock`](crate::TokioClock) for tests that use `tokio::time::pause`, so that the
//! limiter's time and tokio's sleeping agree.
//!
//! # Concurrency
//!
//! GCRA updates a key with one compare-and-swap, after publishing its reading; the window
//! algorithms take a per-key mutex for the few instructions of their transition. Threads read the
//! clock before they contend, so readings reach a key stale and out of order: every algorithm
//! decides a reading older than the latest its key has seen as of that latest reading. N threads
//! racing for a limit of L get exactly L admissions (the test suite checks this for every
//! algorithm on OS threads released together, with readings handed out of order).
//!
//! The lock-free parts are also model-checked with [loom](https://docs.rs/loom) (`loom/src/lib.rs`,
//! run by `.ci/run`): every interleaving, within a preemption bound, of threads racing on one
//! GCRA or fixed-window state with readings from a clock that moves while they run, and of calls,
//! resizes and cancelled waiters on one bulkhead.
//!
//! # Guarantees beyond the algorithms
//!
//! | part | promise under hostile conditions | proved by |
//! |---|---|---|
//! | [`ForwardedIp`](crate::rate_limit::ForwardedIp) | behind trusted proxies, the key is the address the proxy appended whatever bytes the client wrote before it (on the same line or another); a hop that is not an address before the client's is a `400`, never the proxy's key nor a client-chosen one | `tests/forwarded.rs` (properties over arbitrary client bytes; the attacks over a real listener) |
//! | [`HeaderKey`](crate::rate_limit::HeaderKey) | a key owns a copy of its bytes (it never keeps a connection's read buffer alive) and is at most `max_len` bytes | `tests/key_memory.rs` (bytes per key over TCP within 2x of in process) |
//! | the HTTP layer | a request refused by one policy, or dropped at any await point (reserving, waiting), gives back every permit the others granted, once | `tests/rate_limit_hostile.rs`, `tests/listener_disconnect.rs` |
//! | Redis limiters | the same refunds as in memory (a veto leaves the stored state as it was); a reading older than the key's latest is decided as of it; a script that runs after its caller was answered (a stalled server) changes nothing; a decision dropped while its script is on the way is given back; stored state that is not an exact count is an error | `tests/redis_refund.rs`, `tests/redis_deadline.rs`, `tests/redis_conformance.rs` (memory and Lua give the same decisions, refunds included, up to the bounds of exact arithmetic) |
//! | [`Observed`](crate::observe::Observed) | memory and the cost of a decision are bounded by the reservations outstanding, not by past traffic; an admission given back is not counted as allowed | `observe::tests`, `tests/observe_memory.rs`, `tests/rate_limit_hostile.rs` |
//! | bulkheads | a permit is released exactly once whatever happens to the call (panicking hooks, a waiter granted and dropped unpolled); a call is refused only when no permit is free, even during a resize; any `max_wait` is valid | `tests/bulkhead_hostile.rs`, the loom models |
//! | config | every bad value, and every TOML error, names where it is (the field's path, or line and column) | `tests/config_hostile.rs`, `tests/config.rs` |
