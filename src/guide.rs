//! The guide: algorithms, guarantees and limits, written down once.
//!
//! # Choosing an algorithm
//!
//! | algorithm | memory per key | what it promises | where it is weak |
//! |---|---|---|---|
//! | [`Gcra`](crate::algorithm::Gcra) (default) | one 128-bit word: the TAT and the key's latest reading | over any span `S`, at most `burst + S / T` permits (`T = period / permits`) | nothing to speak of; it is a smoothed token bucket |
//! | [`Metered`](crate::algorithm::Metered) (for costs settled after the answer) | three `u64`s (settled TAT, permits held, latest reading) and a mutex | as GCRA, counting each request in flight at its estimate until it settles, then at its settled cost as of its admission: settles are exact | estimates in flight do not drain with time; every admission must be settled (the crate's layers see to it); in Redis, a live instance renews its holds, a hold no one renews (its instance died) stands after `hold_for` (30 s by default), its estimate charged, and a key keeps at most 256 holds |
//! | [`FixedWindow`](crate::algorithm::FixedWindow) | seven `u64`s (the cycle, the permits used, the latest reading, when its latest reservation falls due, a change of period's mark, the limit and period its reservations were slotted by) and a mutex | at most `permits` per cycle, cycles counted from the limiter's creation (Resilience4j) | up to `2 · permits` across a cycle boundary |
//! | [`SlidingLog`](crate::algorithm::SlidingLog) | one entry per admission instant, up to `permits` | at most `permits` in every interval of length `period` (exact), reservations included | memory grows with the limit |
//! | [`SlidingCounter`](crate::algorithm::SlidingCounter) | three counters, the window index, the latest reading, a change of period's mark, its reserved permits, the numbering its counts were laid out under and the end of a hold, and a mutex | at most `permits` per fixed window (reservations counted in the window they fall due in, across changes of period too); at most `2 · permits` in any sliding window; steady traffic below the rate is never refused | approximate when traffic bunches at a window's end |
//!
//! # Guarantees under hostile conditions
//!
//! Each row is proved by the named tests (in `tests/limiter/hostile.rs`,
//! `tests/limiter/hostile_props.rs` and `tests/limiter/in_memory.rs`).
//!
//! | | concurrency and stale clocks | key floods | refunds (a waiter gone, a veto by another policy) |
//! |---|---|---|---|
//! | GCRA | exact: N threads racing for L get exactly L, whatever order their readings arrive in; a reading older than the latest one the key's admissions have seen is decided as of it (a refusal records nothing) (`racing_threads_with_stale_readings_get_exactly_the_limit`, `stale_readings_get_exactly_the_limit`, `two_keys_of_one_shard_with_interleaved_stale_readings_get_exactly_their_quota_each`) | a key that used its quota ranks above any fresh key and is never evicted for one (`a_key_flood_never_hands_a_limited_client_a_fresh_quota`) | exact while the refunded admission is still the key's latest, its TAT unchanged and no give-back of the key's shard having moved a TAT back since it was made (a veto given back before the key admits anything else, a waiter with no later one behind it): the TAT goes back by the cost, never below the latest reading. When later admissions moved the TAT on but none of them is a reservation still ahead (a shared key, a tenant, with other requests admitted meanwhile), an immediate admission gives back its cost less the time elapsed since it was charged: exact at one instant, never more than the request added. Otherwise (a reservation ahead) nothing goes back: never over-granted, two permits never share a slot (`a_veto_leaves_every_limiter_as_if_never_made`, `a_veto_given_back_later_leaves_the_key_as_if_never_made`, `refusals_on_a_shared_gcra_key_drain_nothing_while_others_are_admitted`, `a_gcra_refund_never_hands_out_a_slot_a_later_reservation_holds`, `a_vetoed_gcra_admission_behind_a_later_reservation_stays_spent`, `a_late_gcra_refund_never_frees_a_later_admissions_slot`, `gcra_never_over_admits_whatever_is_given_back`, `attack_gcra_refunds_on_a_coarse_clock_are_never_more_generous_than_a_replay` and its reservations' and two keys' twins) |
//! | fixed window | exact, same tests; a stale reading never lands in a cycle that has ended | same test | exact for the last permits taken: every immediate admission while no reservation is outstanding, and a reservation of one permit due in the last cycle holding charges; an earlier charge (before later reservations, or of several permits straddling two cycles) is kept, never over-granted; a charge of an ended cycle is spent; after a change of period, only what the change's window kept comes back, and a reservation nothing after any change of its limit or period (`a_request_vetoed_by_another_policy_spends_nothing`, `a_veto_leaves_every_limiter_as_if_never_made`, `attack_period_random_changes_and_a_give_back_fixed_window`) |
//! | sliding log | exact, same tests; entries pruned for a later reading are never forgotten by an earlier one (`sliding_log_never_admits_over_the_limit_with_a_stale_reading`, `sliding_log_matches_a_list_under_stale_readings_waits_and_refunds`) | same test | exact, past or future: the entry is removed and its slot is free for the next caller (`sliding_log_reuses_a_refunded_reservation_slot`) |
//! | sliding counter | exact, same tests; a stale reading never panics nor drops the previous window's weight (`a_reading_older_than_the_state_is_decided_as_of_the_latest`) | same test | exact: the count of the window holding the charge shrinks (previous, current or next); after a change of period, only in a window the change kept, and never once the key's counts were numbered anew (`attack_period_random_changes_and_a_give_back_sliding_counter`) |
//!
//! Clock readings beyond 2^62 ns (146 years after the clock's origin) are taken as 2^62 ns:
//! time stands still there and every limit keeps holding
//! (`a_clock_near_u64_max_never_wraps_admits_everything_or_panics`). Quotas are bounded
//! so that every instant and count is computed exactly, in memory and in the Redis scripts:
//! periods and `max_wait` up to 2^60 ns (about 36.5 years), and at most 2^53 permits held per
//! key (see [`Quota`](crate::Quota); `absurd_periods_are_refused_and_the_longest_accepted_is_exact`).

//! # What a decision says
//!
//! Every algorithm answers with a [`Decision`](crate::limiter::Decision):
//!
//! * `retry_after` of a refusal is the exact time until the same request would be admitted if
//!   nothing else arrived in between; it is never zero. The HTTP layer sends
//!   `Retry-After: max(1, ceil(retry_after))` seconds.
//! * `remaining` is what is left after this decision, counted in requests of cost one.
//! * `reset_after` is the time until the key is back to its full limit.
//!
//! # Rate-limit headers
//!
//! The HTTP layer follows draft-ietf-httpapi-ratelimit-headers-11 (May 2026), which keeps the
//! syntax of -10 but defines `r` as the quota available and `t` as the effective window: the
//! seconds within which the client should use no more than `r`.
//!
//! **`RateLimit-Policy`** states each quota as a rate. The draft allows only whole seconds in
//! `w`, so `w` is the period rounded up to whole seconds (at least 1), and `q` is what the quota
//! grants in `w` seconds, `permits · w / period`, rounded down, at most 999,999,999,999,999 (the
//! largest Structured Field Integer). Rounding `q` down means `q/w` never states a faster rate
//! than the limiter enforces; it is exact whenever `permits · w / period` is whole (every period
//! of whole seconds; 5 per 200 ms is `q=25;w=1`), and slower otherwise (1 per 1.5 s is
//! `q=1;w=2`, three quarters of the real rate). A GCRA burst above `permits` is not advertised:
//! `q/w` is the rate a client may keep up, and how much may go at once is `r`. A client that
//! spaces its requests at least `w/q` apart (rounded up to the nanosecond, as GCRA rounds its
//! emission interval) is never refused, whatever the algorithm, with one exception: at the first
//! instant of a window the sliding counter weighs the whole previous window, so a client at
//! exactly `q/w` whose request falls on that instant is refused there; any slower client is not.
//!
//! **`RateLimit`**, on an admitted response, gives for every policy `r`, the permits left after
//! this request but at most `q`, and `t`, the later of two spans (at least a second): when the key
//! is whole again if nothing else arrives (`ceil(reset_after)`), and the time the advertised rate
//! takes to grant `r` (`ceil(r · w / q)`). Two properties follow for every algorithm, since the
//! layer sees only the [`Decision`](crate::limiter::Decision): any `r` requests sent within `t` are
//! admitted (`r` never exceeds what the limiter has left now), and `r/t` never states a faster
//! rate than `q/w`, which is the cap on the ratio of `r` to `t` that section 6 of the draft asks
//! for. The draft -10 reading of `t`, the time until the key is whole, fails the second: 1000 per
//! hour after one request said `r=999;t=4`, 250 requests a second.
//!
//! | algorithm | when the key is whole again | so `t` is | e.g. |
//! |---|---|---|---|
//! | GCRA | when the TAT is reached: at most `burst · period / permits` | almost always the time the rate takes to grant `r`; with nothing left, the time until the bucket is full, although a permit returns every `period / permits` (a request sent earlier gets a 429 with the exact `Retry-After`) | 1000 per hour: `r=999;t=3597` after one request, `r=0;t=3600` after a thousand |
//! | fixed window | at the end of the cycle | the end of the cycle, unless `r` permits before it would be faster than `q/w` | 10 per minute: `r=9;t=55` five seconds into a cycle, `r=8;t=48` at 50 s (8 in the last 10 s would be 48 a minute) |
//! | sliding log | when the newest permit leaves the window | at least that; with nothing left, later than the oldest permit leaving, when the next is admitted | 2 per minute: `r=1;t=60`, then `r=0;t=60` |
//! | sliding counter | when the current window's weight has slid out: up to two periods | at least that | 2 per minute: `r=1;t=120` |
//!
//! On a **refusal** `RateLimit` lists only the violated policies, each with `r` what it has left
//! (less than the request's cost: `"tokens";r=270;t=3` for a request of 410 tokens) and `t` its
//! own wait, `max(1, ceil(retry_after))`; `Retry-After` is the longest of those, so it never points
//! before the end of a listed window (section 6). A policy that admitted the request and was
//! vetoed by another is left out: its admission was given back, so its decision no longer
//! describes the key, and a window it listed would have had to end before `Retry-After`, which
//! could then no longer be the violated policies' own wait.
//!
//! No partition key (`pk`) is sent. It is optional; one derived from the client's address would
//! disclose it unless it were a keyed hash with a secret to manage; and each item names a policy
//! whose key the client can already tell (its address, its API key).
//!
//! Each requirement of the draft, what the layer sends, and the tests that check it
//! (`tests/rate_limit/headers.rs` unless named otherwise; `headers::tests` and `problem::tests`
//! are unit tests in `src/rate_limit/headers.rs` and `src/rate_limit/problem.rs`):
//!
//! | draft -11 | requirement | what the layer sends | checked by |
//! |---|---|---|---|
//! | 3 | `RateLimit-Policy` is a non-empty List; each Item's value MUST be a String | one String Item per policy, the name escaped; no field without policies | `headers_are_valid_and_consistent_for_any_quota`, `headers_are_valid_at_the_bounds`, `hostile_policy_names_survive_the_wire_and_head_gets_no_body` (`tests/rate_limit/layer_hostile.rs`), `the_policy_header_states_each_quota_at_its_real_rate_in_whole_seconds` (`headers::tests`) |
//! | 3 | the value SHOULD stay the same over responses | the same on admissions and refusals for the same policies: kept, once built, for each set of policies that took part (a policy that sat a request out, at a cost of zero or without a key, is not listed; a key whose quota is its own, a tier's, is listed at that quota) | `a_refusal_lists_the_violated_policies_and_retry_after_covers_their_windows` |
//! | 3.1, 4.1 | neither field in a trailer section (MUST NOT) | both are set in the response head only | by construction: the layer writes no trailers |
//! | 3.1.1 | `q` REQUIRED, a non-negative Integer | `permits · w / period` rounded down, at most 999,999,999,999,999 | `a_sub_second_period_is_advertised_at_its_real_rate`, `a_period_that_is_not_whole_seconds_rounds_w_up_and_q_down`, `advertised_quotas_round_down_and_stay_structured_field_integers` (`headers::tests`), the property test |
//! | 3.1.2 | `qu` OPTIONAL, `requests` by default | not sent for a rate (every request costs one permit, the default unit, or what `cost_by` says); `qu="concurrent-requests"`, with no `w`, for a [`Policy::concurrent`](crate::rate_limit::Policy::concurrent), in memory or in Redis | `four_of_six_streams_are_admitted_and_a_slot_frees_when_one_ends`, `two_instances_share_a_keys_slots_over_real_listeners` |
//! | 3.1.3 | `w` a non-zero Integer of seconds (MUST); no sub-second precision | the period rounded up to whole seconds, at least 1 | as for `q`; `a_client_pacing_itself_by_q_over_w_is_never_refused`, `a_client_faster_than_q_over_w_is_refused` |
//! | 3.1.4, 4.1.3, 6.1 | `pk` OPTIONAL, a Byte Sequence (MUST); servers should avoid keys with sensitive information | not sent (see above) | — |
//! | 3.1, 4.1 | other parameters SHOULD carry a vendor prefix | none sent | the property test (only `q`, `w`, `r`, `t`) |
//! | 4 | `RateLimit` is a List of Service Limit Items naming a policy | one String Item per policy that decided (a failed limiter that fails open is left out) | the property test, `a_failing_limiter_answers_503_or_fails_open` (`tests/rate_limit/layer.rs`) |
//! | 4.1.1 | `r` REQUIRED, a non-negative Integer: the quota available | the permits left, at most `q`; for a violated policy those left below the request's cost (`0` for a request of one permit) | `a_burst_above_the_permits_never_reports_more_than_q`, `r_requests_sent_at_once_are_admitted`, the property test (`0 ≤ r ≤ q`) |
//! | 4.1.2 | `t` OPTIONAL, a non-negative Integer: the effective window | always sent for a rate, at least 1: see above; not for slots of requests in flight (a concurrent policy, or a concurrency limiter in `Tiers`), which have no window | `a_concurrent_limiter_in_tiers_is_advertised_as_slots`, `tiers_of_redis_concurrency_limiters_are_advertised_as_slots`, `a_long_window_never_advertises_a_faster_rate_than_its_policy`, `a_fixed_window_reports_its_cycle_end_capped_by_the_rate`, `the_sliding_windows_report_exact_values` |
//! | 5.1, 10.2.1 | the `quota-exceeded` problem type: URI `https://iana.org/assignments/http-problem-types#quota-exceeded`, title `Quota Exceeded`, status 429, `violated-policies` an array of strings | exactly these, with a `detail` | `a_refusal_lists_the_violated_policies_and_retry_after_covers_their_windows`, `a_refusal_body_is_the_registered_problem` (`problem::tests`), `ten_pass_the_eleventh_is_refused_and_a_second_later_one_passes` (`tests/rate_limit/layer.rs`) |
//! | 6 | `Retry-After` SHOULD NOT point earlier than the end of the effective window | `max(1, ceil(retry_after))` of the longest violated policy, which is the longest `t` listed | `a_refusal_lists_the_violated_policies_and_retry_after_covers_their_windows`, the property test (`Retry-After ≥ t`, `≥ 1`, `≥` the limiter's own wait), `retry_after_rounds_up_and_is_never_zero` (`tests/rate_limit/layer.rs`) |
//! | 6, 8.5 | MUST NOT convey an unwanted volume; SHOULD cap the ratio of `r` to `t` | `r/t ≤ q/w` always, and `q/w` at most the quota's rate | `a_long_window_never_advertises_a_faster_rate_than_its_policy`, `a_fixed_window_reports_its_cycle_end_capped_by_the_rate`, the property test (`r · w ≤ q · t`) |
//! | 7 | a client SHOULD NOT exceed `r` within `t` | what a client following that is told is true: `r` requests within `t` are admitted | `r_requests_sent_at_once_are_admitted` |
//!
//! The property test is `headers_are_valid_and_consistent_for_any_quota`: any quota the crate
//! accepts (periods from 1 ns to [`Quota::MAX_SPAN`](crate::Quota::MAX_SPAN), any permits and
//! burst), every algorithm, requests at random clock offsets; every field is parsed with `sfv`.

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
//! million; `BENCHMARKS.md` measures about 69 bytes per key for IPv4 keys under GCRA, whose state
//! is one 128-bit word: the TAT and the key's latest reading). A
//! key whose state has gone idle (for GCRA: its
//! TAT is in the past) behaves exactly like a key never seen, so dropping it changes no decision;
//! the store drops idle keys first whenever a shard is full, and
//! [`retain_recent`](crate::KeyedRateLimiter::retain_recent) drops them on demand. When a shard
//! is full of live keys, [`Overflow`](crate::limiter::Overflow) decides: evict the keys whose loss gives
//! away least, by the permits that still weigh on each key (default), or
//! refuse new keys until room frees. Either way a flood of fresh keys never hands a client that
//! is being limited a fresh quota, not even a flood whose keys each spend a whole quota after
//! it, at its very reading or with readings older than its own: among keys holding as many
//! permits, GCRA and the sliding log keep the one that took them first, and where the state
//! cannot tell (counts, held estimates, equal records) the store keeps the key it made first
//! (`tests/limiter/eviction.rs`, the flood test of every algorithm above,
//! `a_limited_client_is_never_evicted_by_a_later_flood_spending_whole_quotas` and
//! `tests/limiter/attack_evict.rs`).
//!
//! An evicted key gives away what it held, and nothing more: a give-back of one of its
//! admissions that arrives after the key was made anew gives nothing (each key's entry says
//! which of the key's incarnations it is, and a decision carries it;
//! `attack_two_*_give_back_after_its_key_was_evicted_and_recreated`), while a settle's debt
//! still lands on it (below). A Redis key deleted outside the crate (by hand, or by a
//! `maxmemory` eviction policy) and written anew at the same instant is a known limit: a
//! give-back of an admission of the deleted key reaches the new state, up to that admission's
//! cost more than the new key's quota (`tests/redis/attack_two.rs`). A known limit as well, an
//! ignored test with its numbers in `tests/limiter/attack_direct/second.rs`: a sliding
//! counter's reservations ahead of a shortened period count in the windows the new period
//! spreads them to, not the ones they fall due in (up to the reserved permits more in one
//! window), in memory. A fixed window's count them in the cycles they fall due in, in memory
//! and in Redis: until the last of them falls due, the count frees their slots no faster than
//! the quota that slotted them (see [`FixedWindow`](crate::algorithm::FixedWindow);
//! `attack_two_*fixed_window_raised_limit_with_reservations_ahead`,
//! `attack_two_*fixed_window_shortened_period_with_reservations_ahead`, `attack_quota_*`).
//!
//! A settle's debt that comes for a key dropped since (idle) is charged to the key made afresh,
//! where the dropped state would have had it; only where the key's shard is full of live keys
//! under [`Overflow::RefuseNewKeys`](crate::limiter::Overflow::RefuseNewKeys) is there no room
//! to make it, and the debt is lost (up to the capacity; the ignored
//! `attack_reading_a_settle_charge_after_the_store_dropped_the_idle_key_is_not_lost`).

//! # Time
//!
//! Limiters read a [`Clock`](crate::clock::Clock): [`SystemClock`](crate::clock::SystemClock)
//! (quanta's) in production, or [`InstantClock`](crate::clock::InstantClock) (std's `Instant`);
//! [`ManualClock`](crate::clock::ManualClock) in tests (time moves only when the test moves it), and
//! [`TokioClock`](crate::clock::TokioClock) for tests that use `tokio::time::pause`, so that the
//! limiter's time and tokio's sleeping agree. Whatever the clock, readings that reach a limiter
//! out of order (threads on cores whose counters disagree) never make it admit more than its
//! quota (`tests/limiter/default_clock.rs`: sixteen threads on clocks up to 4 ms apart, each
//! up to 2 ms off, get exactly the burst of a quota too slow to refill during the race, in every
//! algorithm).
//!
//! # Concurrency
//!
//! GCRA updates a key with one compare-and-swap of one 128-bit word, its TAT and its latest
//! reading together (the shard's reading is the floor under its keys', raised before the store
//! drops keys); the window algorithms take
//! a per-key mutex for the few instructions of their transition. Threads read the clock before
//! they contend, so readings reach a key stale and out of order: every algorithm decides a
//! reading older than the latest its key has seen as of that latest reading (a real reading, a
//! little later at most; for GCRA a refusal changes nothing and records nothing), and one older
//! than a change of quota as of the change (`set_quota`'s own reading). N threads
//! racing for a limit of L get exactly L admissions (the test suite checks this for every
//! algorithm on OS threads released together, with readings handed out of order).
//!
//! The lock-free parts are also model-checked with [loom](https://docs.rs/loom) (`loom/src/lib.rs`,
//! run by `.ci/run`): every interleaving, within a preemption bound, of threads racing on one
//! GCRA or fixed-window state with readings from a clock that moves while they run, and of calls,
//! resizes and cancelled waiters on one bulkhead (its permits under its lock, and the counters
//! its snapshot reads apart).
//!
//! # Guarantees beyond the algorithms
//!
//! | part | promise under hostile conditions | proved by |
//! |---|---|---|
//! | `ForwardedIp` (feature `axum`) | behind trusted proxies, the key is the address the proxy appended whatever bytes the client wrote before it (on the same line or another); a hop that is not an address before the client's is a `400`, never the proxy's key nor a client-chosen one | `tests/http/forwarded.rs` (properties over arbitrary client bytes; the attacks over a real listener) |
//! | [`HeaderKey`](crate::rate_limit::HeaderKey) | a key owns a copy of its bytes (it never keeps a connection's read buffer alive) and is at most `max_len` bytes | `tests/rate_limit/key_memory.rs` (bytes per key over TCP within 2x of in process) |
//! | the HTTP layer | a request refused by one policy, or dropped at any await point (reserving, waiting), gives back every permit the others granted, once, newest first; so does one whose cost function, key extractor or refusal hook panics | `tests/rate_limit/layer_hostile.rs`, `tests/http/disconnect.rs`, `tests/rate_limit/policies/` (`model.rs`: a model of every key's permits over random sequences of policies, costs, outcomes, shadows, failures and drops; `vetoes.rs`: every order of a mixed chain; `cancellation.rs`, `panics.rs`) |
//! | policies | each policy counts against its own key at its own cost; a cost a policy can never admit is a 413 (`largest-cost` in its body) without `Retry-After` that spends nothing; a concurrent policy holds each admitted request's slots until its body ends, fails or is dropped, or the request ends without one (an error, a panic, a request dropped), and gives them back exactly once; N tasks racing for L slots get exactly L, and a request refused for want of a slot costs the other policies nothing (`every_way_a_request_ends_gives_its_slot_back_exactly_once`, `racing_requests_get_exactly_the_slots_and_a_refusal_costs_no_tokens`); a `count_if` policy gives the permit back exactly when the response does not count (never when the inner service fails or the future is dropped; a panicking predicate counts) and its `RateLimit` says so; a shadow policy never refuses, never waits, never answers `503`; N tasks racing for L with a `count_if` policy put exactly L in the handler | `tests/rate_limit/policies/router.rs`, `tests/rate_limit/policies/` (`concurrent.rs`, `costs.rs`, `count_if.rs`, `shadows.rs`, `vetoes.rs`), `tests/http/plans_example.rs` (over a real listener) |
//! | refunds through [`Limiter::refund`](crate::Limiter::refund) | a decision is given back at most once (a refund consumes it: giving it back twice does not compile); never more than it took, whatever cost the caller names, and whatever a `set_quota` changed between the decision and its refund (GCRA gives back each permit at the shorter of its old and new intervals); under another key (one whose hash under the limiter's hasher differs: with a hasher that makes two keys collide, they take back each other's decisions), or to another limiter (direct or keyed, another tier, a clone excepted since it shares the state; in Redis, one on another store, even with the same prefix), or built by hand, it gives nothing back (each algorithm, in memory and in Redis); `Observed` counts only what its limiter took back, and its gauge moves only for the latest decision | the `compile_fail` example on `Limiter::refund`, `tests/limiter/refund_misuse.rs`, `a_decision_given_back_under_another_key_frees_nothing_in_redis`, `a_refund_across_redis_servers_gives_nothing_back`, `observed_counts_only_what_its_limiter_takes_back`, `observed_available_tells_apart_decisions_that_left_the_same_figure` |
//! | settled costs ([`Limiter::settle`](crate::Limiter::settle), `Policy::settle_by`, `Policy::settle_from_body`, `ClientQuotaLayer::settle_by`) | tasks and instances racing with estimates and settles on one key get exactly the quota in what they used (each algorithm, in memory and in Redis); counted at what they finally cost, admitted requests never exceed the quota in any window; a cost beyond what is left is debt the key waits for, to the nanosecond, never lost nor counted twice, and a give-back behind another request's debt comes back whole, unless a waiter's reservation still holds a slot past the quota (then GCRA and the fixed window keep it: handing the slot out again would let two callers fall due in its place; GCRA keeps it until the key is within its burst again); a settle never gives back more than the request took, nor under another key or limiter; a request another policy refused settles nothing; under `Metered`, settled tokens plus what is left is exactly what a key charged the true costs at the admissions' instants has, for any number of requests in flight of any length (no more generous when settles come out of order), and whatever ends a request or a call (its body read, dropped or failing, the inner service failing or panicking, the future dropped, a settle rule that reads nothing, a veto) its estimate is settled exactly once (`settles_leave_the_key_where_true_costs_would`, `four_concurrent_streams_lose_nothing`, `every_way_a_request_ends_settles_its_hold_exactly_once`, `every_way_a_call_ends_settles_its_hold_exactly_once`); a body read by the layer passes unchanged in any chunks, and one dropped half-way settles to what it read; one `BodyUsage` reads an answer as events or JSON by its `Content-Type` (none in a content coding such as gzip: `a_body_in_a_content_coding_is_not_read`), and an error answer that reports no usage costs nothing (`one_policy_settles_json_and_event_streams_and_an_error_costs_nothing`, `the_content_type_names_the_shape_and_the_constructor_the_rest`) | `tests/limiter/metered.rs`, `tests/rate_limit/policies/metered.rs`, `tests/outbound/metered.rs`, `tests/limiter/settle.rs` (racing threads settling above and below their estimates; `a_give_back_behind_debt_is_exact_under_every_algorithm`, `a_give_back_behind_a_waiter_is_kept_under_gcra_and_the_fixed_window`, `settled_tokens_never_exceed_the_quota_in_any_window`, `gcra_debt_is_a_leaky_bucket_of_tokens`), `tests/redis/settle.rs`, `tests/redis/metered.rs` and `tests/redis/metered_layer.rs` (`Metered` in Redis: holds racing on two instances, a live hold renewed past `hold_for` while a dead instance's stands at its expiry, a settle after expiry, the layer's settles from event streams), `gcra_give_back_behind_debt_racing_a_later_reading` (`loom/`), `the_headers_after_a_settle_tell_when_the_key_is_whole_again`, `tests/redis/conformance.rs` (settles included), `tests/rate_limit/settle.rs`, `tests/rate_limit/usage_scan.rs`, `tests/outbound/client_quota.rs`, `tests/outbound/settle_from_body.rs` (a `reqwest` client settled from its answers' bodies, racing), `tests/rate_limit/llm_gateway_example.rs` (over a real listener) |
//! | tiers | a key is decided and advertised by its own tier; a refund goes to the tier that charged it, even after the key moved | `tests/limiter/tiers.rs` |
//! | quota changes | every key keeps what it used; the window of a change admits at most the larger quota; a sliding-counter key with reservations ahead at a change of period admits nothing more until the new window the last of them may fall due in has ended, through later changes too; a Redis lease's share granted under another quota is given back, not spent; a reload that cannot apply in place changes nothing | `tests/limiter/quota_change.rs`, `tests/limiter/attack_sliding_period.rs`, `tests/redis/attack_sliding_period.rs`, `tests/config/reload.rs`, `tests/config/routes.rs` |
//! | Redis limiters | the same refunds as in memory (a veto leaves the stored state as it was); a reading older than the key's latest is decided as of it; a script that runs after its caller was answered (a stalled server) changes nothing; a decision dropped while its script is on the way is given back; stored state that is not an exact count is an error; under the default fail mode (`RedisFailMode::Local`) an outage admits, per instance and key, at most the quota (the burst, then the rate), and its first failure is one `WARN` event | `tests/redis/refund.rs`, `tests/redis/deadline.rs`, `tests/redis/outage.rs`, `failures_are_logged_once_loudly_then_quietly_and_recovery_is_told`, `tests/redis/conformance.rs` (memory and Lua give the same decisions, refunds included, up to the bounds of exact arithmetic) |
//! | Redis leases (`RedisRateLimiterBuilder::lease`, feature `redis`) | what every instance admits together, replayed at its instants through one in-memory limiter of the same algorithm (GCRA, fixed window, sliding counter), is all admitted there: with random demand, floods after idle times, refunds, instances that die holding a share, a Redis that goes away and comes back; a share held through a refill is not counted twice, and one spent late counts until its lease ends; tasks racing on four instances for a permit each get exactly the burst (for several each, the last permits may wait for the key to refill: a share of which less than half can be had is leased whole, later); never more permits in leases than the burst; a lease reply of the wrong shape is an error naming what is wrong | `tests/redis/lease.rs` (each guarantee's mutation of the script fails it), `replies_of_the_wrong_shape_are_errors_that_say_what_is_wrong`, `tests/redis/hot_key_example.rs` (two instances over real listeners) |
//! | concurrent policies in Redis (`Policy::concurrent_in_redis`, feature `redis`: a Redis limiter on the concurrency script, its slots holds as `Metered`'s estimates are, renewed by the one task of the limiter's live holds) | tasks of two instances racing for L slots of a key never hold more than L at once and, all holding, get exactly L; each slot goes back once, by its id, whatever ends the request (its body read or dropped, an error, a failing body, a panic, the request dropped at any point of its decision; over real listeners with `reqwest` streams too), and a give-back that arrives after its slot expired and another request took one frees nothing of that one's; a decision given back to another instance or under another key frees nothing; a dead instance's slots come back exactly at `hold_for`, while a live request's are renewed past it, one call per renewal for all of its instance's keys; a decision that times out in a stalled Redis leaves no slot behind (it runs past its deadline and changes nothing); a give-back that cannot reach Redis is sent once and its slots come back at the expiry; with Redis down the fail mode decides (`Local`: the limit per instance, its slots taken back); a reply of the wrong shape or a key of another type is an error that says so | `tests/redis/concurrency.rs`, `tests/redis/concurrency_layer.rs` |
//! | [`Observed`](crate::observe::Observed) | memory and the cost of a decision are bounded by the reservations outstanding, not by past traffic; an admission given back is not counted as allowed | `observe::tests`, `tests/observe/memory.rs`, `tests/rate_limit/layer_hostile.rs` |
//! | bulkheads | a permit is released exactly once whatever happens to the call (panicking hooks, a waiter granted and dropped unpolled); a call is refused only when no permit is free, even during a resize; waiters start in arrival order, across changes of the limit too (a lowered limit takes back a permit handed to a waiter not yet started, which waits again in its place); a waiter handed a permit leaves the queue at once, so a call made right then is not refused for it; a waiter whose `max_wait` has passed, its future not polled since, is shed when its place in a full queue or a permit is wanted; a snapshot taken during a resize never shows more free permits than its limit; any `max_wait` is valid | `tests/bulkhead/hostile.rs`, the loom models, `a_waiter_whose_permit_pays_a_lowered_limit_waits_again_in_its_place_and_the_limit_holds`, `a_waiter_handed_the_permit_leaves_the_queue_at_once`, `a_waiter_whose_wait_ended_unpolled_gives_its_place_in_a_full_queue`, `a_permit_passes_a_waiter_whose_wait_ended_unpolled`, the models of `tests/bulkhead/order_model.rs`, `a_waiter_that_leaves_the_front_of_the_line_passes_its_place_on`, `tests/bulkhead/order_hostile.rs`, `a_snapshot_taken_during_resizes_never_shows_more_free_permits_than_its_limit` |
//! | config | every bad value, and every TOML error, names where it is (the field's path, or line and column) | `tests/config/hostile.rs`, `tests/config/files.rs` |
//!
//! # Adaptive bulkheads
//!
//! An adaptive bulkhead (feature `adaptive`, module `bulkhead::adaptive`) admits calls exactly
//! as a fixed semaphore bulkhead without waiting does, and moves its limit after each call that
//! gives a sample.
//!
//! **Samples.** A call gives one sample when it ends: its round trip (the time it held its
//! permit, on the bulkhead's clock), the calls holding a permit when it was admitted (itself
//! included) and the limit in force then, and the classifier's verdict. A call "was admitted
//! with the limit reached" when those calls were at least that limit: a call admitted under a
//! higher limit that ends after a backoff is not use of the lowered limit. `429`, `503`, `504`,
//! timeouts and refused or cut connections are overload; other answers are healthy; other
//! errors, the bulkhead's own refusals and panics are no sample. A call dropped before its end is overload by default
//! (behind a timeout layer that is how a timeout looks), or no sample when cancelled calls are
//! ignored; it is never a healthy sample, since its round trip is unknown and would read fast.
//!
//! **Rounds.** Both algorithms decide once per round, never per call. The first sample opens a
//! round as long as its own round trip; each later round lasts the previous round's mean healthy
//! round trip or the baseline, whichever is shorter, and closes with the first sample that
//! ends at or after its end; a sample that ends before the round began (a clock that went back,
//! or one reading at the end of time) starts the round again from its own instant. Round trips are capped at 2^40 ns (about 18 minutes) and a zero
//! round trip counts as 1 ns, so no round lasts for ages and samples at one frozen instant
//! never close more than one round. The **baseline** is the no-load round trip: the plain mean
//! of the first 16 rounds' means, then a slow average that moves 1/16 of the way to each round
//! within the latency tolerance. Rounds above it are queueing and are not learnt, except while
//! the limit is at its minimum: latency that stays high with nothing left to shed is the
//! dependency's new normal, learnt in a few dozen rounds.
//!
//! | algorithm | down | up | per round at most |
//! |---|---|---|---|
//! | AIMD (default) | × `backoff` (0.8) if a sample of the round was overload or its mean round trip exceeds `latency_tolerance` (1.3) × the baseline | + 1 if some call of the round was admitted with the limit reached | one step; with `probe_every(n)`, the baseline as Gradient's |
//! | Gradient | towards `limit × max(0.5, min(1, tolerance × baseline / mean))` (tolerance 1.1; 0.5 with an overload sample) | plus `sqrt(limit)` of headroom while in use and without overload | `smoothing` (0.3) of the way to the target; with `probe_every(n)`, the baseline is the lowest latency of uncrowded round trips over the last `2n`, probed for at the minimum limit when none was seen (for at most 10 round trips, whose lowest then stands in) |
//!
//! Limits are kept as fractions and shown rounded down; every result is clamped to
//! `min..=max`, which `Limits::new` checks (`1 <= min <= initial <= max <= 2^31 - 1`; anything
//! else is a `SettingError` naming the setting). Algorithm settings out of range
//! (a backoff outside (0, 1), a tolerance below 1 or not finite, a smoothing outside (0, 1]) are
//! errors too.
//!
//! **Guarantees**, each tried by the named tests:
//!
//! | guarantee | tests |
//! |---|---|
//! | a call is admitted only while the calls holding a permit, itself included, are at most the limit in force at that instant; a lowered limit admits nothing until enough calls in flight have ended | `tests/bulkhead/adaptive_stress.rs` (a ledger of every limit set, checked on every entry while the limit jumps on each sample), `lowering_the_limit_under_calls_in_flight_admits_nothing_until_they_end` |
//! | every permit is given back exactly once, whatever ends the call (answer, error, panic in `call` or in the future, task aborted, timeout above) | `tests/bulkhead/adaptive_stress.rs`, `a_panicking_call_gives_its_permit_back_and_is_no_sample` |
//! | every ending gives exactly one sample, except panics (in the future or the classifier, even caught above the bulkhead), calls dropped before their first poll (they never reached the dependency) and, when ignored, cancellations, which give none; a refusal gives none | `tests/bulkhead/adaptive_stress.rs`, `the_permit_is_taken_in_call_and_a_refusal_is_bulkhead_full_and_no_sample`, `a_cancelled_call_is_overload_by_default_and_never_a_fast_healthy_sample`, `a_panic_caught_above_the_bulkhead_is_no_sample`, `calls_dropped_before_their_first_poll_are_no_sample` |
//! | the permit is taken in `call`; a refusal is `BulkheadFull`, at once, never a timeout | `the_permit_is_taken_in_call_and_a_refusal_is_bulkhead_full_and_no_sample` |
//! | in a stack with the timeout above (retry → timeout → pushback → client quota → adaptive bulkhead → `reqwest::Client`), a call cut by the timeout above and a `503` are overload, an answer is healthy, every permit comes back | `in_the_documented_stack_a_timeout_above_and_503s_below_are_overload` |
//! | clones of the bulkhead, its layer and its services share one limit | `two_clones_share_one_adaptive_limit`, `tests/bulkhead/adaptive_stress.rs` (24 clones) |
//! | AIMD grows only while in use (a call admitted under a higher limit is not use of a lowered one) and at most once per round; backs off once per round on overload or on latency above its baseline; stays within its bounds | `aimd_*` tests in `tests/bulkhead/adaptive.rs`, figures computed by hand on a manual clock; `tests/bulkhead/adaptive_hostile.rs` |
//! | Gradient follows the baseline-to-latency ratio, grows only while in use, stays within its bounds | `gradient_*` tests |
//! | zero, enormous or backwards round trips and instants neither panic nor freeze the limit | `absurd_round_trips_and_instants_neither_panic_nor_freeze_the_limit_for_ages`, `one_absurd_instant_does_not_freeze_the_limit`, `samples_reach_the_algorithm_in_the_order_of_their_instants` |
//!
//! **Limits.** The algorithms see the dependency only through round trips and verdicts. A
//! dependency that queues without bound and never answers `503` is seen through its latency
//! alone, and the baseline learns from the first rounds: start the bulkhead when the
//! dependency is not already saturated, or the baseline includes queueing. The in-flight
//! figure of a sample is read from a counter kept next to the permits, never above the permits
//! held. How the defaults do against a dependency whose capacity changes is measured by
//! `examples/adaptive.rs` (see `BENCHMARKS.md`).

//! # Overload protection
//!
//! `overload::Overload` (feature `adaptive`) keeps the requests in flight of a
//! whole service at one adaptive limit and sheds the lowest class first
//! (`tests/overload/`):
//!
//! * **Ceilings.** A request of a class is admitted only while the requests in flight, all
//!   classes together and it excluded, are below its class's ceiling: the limit times
//!   `critical_borrowing` for `Critical` (3 by default, 1 holds it at the limit), the limit less
//!   the guarantees of the classes above for the others, and at least one, so a class whose
//!   guarantees above round to the whole limit is not shed for good (`attack.rs`). With the
//!   limit fixed at 10 and a guarantee of 0.2 for `Critical`, forty racing requests of each
//!   class, twenty times over, never give the lower classes more than 8 together, and
//!   `Critical` its 2 whatever the flood; borrowing 2.5 times the limit, exactly 25 are in
//!   flight, the lower classes still at most 8 (`classes.rs`).
//! * **A shed request spends nothing.** It never reaches the inner service, and is answered at
//!   once: `503` with `Retry-After` (the latency's slow average in whole seconds, at least 1) and
//!   a problem+json body, or gRPC `UNAVAILABLE` with the same delay (`answers.rs`); a queued one
//!   at most `max_wait` after its call (to the timer's millisecond), however late its future is
//!   polled, and a waiter whose wait has ended holds no place in the queue (`queue.rs`,
//!   `attack_queue.rs`, on tokio's paused clock).
//! * **The limit follows latency.** With `Gradient`, a service whose latency triples brings the
//!   limit below half of what it was, and latency back at its baseline brings it up again. With
//!   the default `Aimd` (tolerance 1.1, baseline probed for every 300 round trips), a flood from
//!   the start on a service that serves 8 at full speed is held at 8 to 10 in flight, where a
//!   baseline learnt slowly would take the flood's queueing for the service's latency (16 to
//!   21); after a step to twice the latency, the baseline is measured again within two periods;
//!   critical requests borrowing above a minimum of 2 keep a probe's round trips crowded, and it
//!   ends after 10 of them, the limit back where it was (`limit.rs`, on a manual clock). A request that fails gives no sample.
//! * **One permit, given back once.** Whatever ends a request (its body read, failed or dropped
//!   half way, an error, a panic, its future dropped before its first poll, in the queue, after
//!   it was granted a place but before it woke, or while the service runs), the requests in
//!   flight come back to zero, never below: `cancellation.rs`, with 400 requests cancelled at
//!   random points.
//!
//! # Outbound: pushback and client quotas
//!
//! [`Pushback`](crate::outbound::Pushback) obeys what a dependency says;
//! [`ClientQuotaLayer`](crate::outbound::ClientQuotaLayer) keeps to a quota of your own for it.
//! Both refuse with an error that carries the time to wait
//! ([`PushedBack`](crate::outbound::PushedBack),
//! [`QuotaExhausted`](crate::outbound::QuotaExhausted)), which
//! [`outbound::retry_after`](crate::outbound::retry_after) reads for a retry policy.
//!
//! **What the pushback reads, and how.** `Retry-After` on a 429 or 503: delta-seconds, or an
//! HTTP-date read against the response's `Date` (the server's own clock) or, without one, the
//! system time. `RateLimit` and `RateLimit-Policy` of draft-11 on any response, parsed as
//! Structured Fields (RFC 9651) by the `sfv` crate. `X-RateLimit-Remaining` with
//! `X-RateLimit-Reset`, whose value is seconds from now below 10^9 and a Unix time from there on:
//! 10^9 seconds from now would be 31 years, and 10^9 as a Unix time is September 2001, so no
//! value of either kind that a real server sends falls on the wrong side.
//!
//! **How it holds.** After a `Retry-After`, nothing starts until it has passed. With an
//! advertised quota, at most `r` calls start within `t`, less the calls in flight when the
//! answer came (conservative: they may or may not be counted in `r`); of several policies the
//! fewest remaining counts, and of those the longest window. When the window has passed, the
//! `q` of the policy of the same name is granted for each `w`, less the calls still in flight;
//! without a policy, calls go until the next answer. Every span is capped at `max_hold` (ten
//! minutes by default).
//!
//! **Where it stops.** Before the first answer nothing is known, so the first calls are bounded
//! only by a client quota. A call that has passed the pushback and then waits below it (in a
//! quota with `max_wait`, in a bulkhead's queue) is sent when its turn comes, even if a 429
//! arrived meanwhile: where a hold must be obeyed exactly, let the layers below refuse at once
//! and let a retry layer above the pushback do the waiting, as `examples/partner_api.rs` does.
//!
//! | part | promise under hostile conditions | proved by |
//! |---|---|---|
//! | pushback | no header, however malformed or absurd (arbitrary bytes, negative or 40-digit numbers, dates in year 9999 or 1970, 10 000 lines, fields over 4 KiB), panics or holds a call longer than `max_hold`; digits in `Retry-After` hold exactly that many seconds, capped | `tests/outbound/pushback_hostile.rs` |
//! | pushback | holds are exact to the nanosecond of the clock; a date in the past holds nothing; each of several quotas in one answer holds calls; calls in flight are counted against `r` | `tests/outbound/pushback.rs` |
//! | pushback | an answer replaces the quota in force only if its call was sent after the answer in force was received; any other answer only tightens what is in force, field by field (calls left, window end, refill, pacing); a refused call's `PushedBack` carries the first instant a call can go, past windows that give nothing, and a call made then goes (a probe after `max_hold` when every window gives nothing) | `an_older_spent_answer_does_not_shrink_a_newer_window`, `an_older_answer_tightens_field_by_field`, `a_refusal_carries_the_longest_of_the_holds` (`tests/outbound/hostile_refusal_times.rs`), `a_refusal_names_the_first_instant_a_call_can_go` (`tests/outbound/pushback_hostile.rs`), `tests/outbound/answer_order.rs` |
//! | pushback | after a 429, none of 64 tasks through clones of one layer reaches the dependency before `Retry-After` passes; with `max_wait` zero, all fail at once; a waiter cut by a timeout reaches nothing | `after_a_429_no_task_reaches_the_dependency_before_the_hold_ends` and its neighbours in `tests/outbound/pushback.rs`; `examples/partner_api.rs` over a real listener (`tests/outbound/partner_api_example.rs`) |
//! | client quota | N tasks racing for L permits get exactly L, and only L calls reach the dependency; a refusal spends nothing; a waiter dropped gives its reservation back, in memory and in Redis; a call the crate's own layers below refuse before sending it (a full bulkhead, a pushback hold, a nested quota) gives its permits back, and the dependency's own error keeps them (`calls_refused_below_the_quota_give_their_permits_back`); two instances built separately share one Redis quota exactly | `tests/outbound/client_quota.rs`, `tests/redis/client_quota.rs` |
//! | a stack with the timeout above | retry → timeout → pushback → client quota → bulkhead → `reqwest::Client`: a held call spends no quota and no bulkhead permit; a call waiting for its quota holds no bulkhead permit; the timeout cuts waits below it and everything is given back; a bulkhead refusal is neither retried nor a timeout, and gives its quota permit back | `tests/outbound/stack.rs` |
//! | adaptive bulkheads from config | any `min_limit`, `initial_limit`, `max_limit` is built exactly or refused naming the bound, never a panic; every layer of one name shares one limit; a configured limit falls under a dependency answering `503`; a reload refuses any change whole | `tests/config/adaptive.rs` |
//! | from config | every bad value of a `[pushbacks.*]` or `[client_quotas.*]` table (any text for a duration, a pacing or a limiter's name, under any instance name) is built or refused naming its path, never a panic; a client quota's layers and clones share one quota (in Redis, across registries); a reload changes its limiter's quota under the layers built and refuses any other change whole | `tests/config/outbound.rs` |
//! | metrics | each pushback and client quota outcome, and each reason for a hold, is counted once per event, built by hand or from a file; the admitted path of both layers allocates nothing | `tests/outbound/metrics.rs` |
//!
//! # Outbound: the circuit breaker
//!
//! `outbound::breaker::Breaker` (feature `adaptive`) counts each call's verdict from the
//! adaptive bulkhead's classifier over a window and fails calls fast while the dependency is
//! failing (`tests/outbound/breaker*.rs`, `tests/config/breaker.rs`):
//!
//! | guarantee | proved by |
//! |---|---|
//! | closed, it opens when the window holds at least `minimum_calls` and the failure rate or the slow-call rate reaches its threshold, not before: 35 % failures stay closed at 50 %, 5 failures of the last 10 open it, 4 do not; a `500` is an answer, not a failure | `thirty_five_percent_failures_stay_below_a_fifty_percent_threshold`, `it_opens_exactly_at_the_threshold_once_the_window_holds_minimum_calls`, `a_500_and_other_statuses_are_the_dependencys_answers_not_failures` |
//! | a call longer than `slow_call_duration` on the breaker's clock is slow (exactly the threshold is not), and slow calls open it at their own rate; a call's waits in the layers below (a pushback hold, a client quota's wait, a bulkhead's queue) are not its duration, through two breakers too, and a call slow after its wait is still slow | `slow_calls_open_it_at_the_slow_call_rate`, `tests/outbound/attack_breaker_waits.rs` |
//! | a time window counts the calls that ended in its last N whole seconds, and forgets them after | `a_time_window_forgets_calls_older_than_its_seconds` |
//! | open, every call fails at once with `BreakerOpen`, the dependency not called, carrying the time left to the nanosecond, which `outbound::retry_after` reads; a tonic client gets `UNAVAILABLE` with the delay in a `RetryInfo` and `grpc-retry-pushback-ms` | `open_it_fails_fast_without_the_dependency_and_says_until_when`, `a_tonic_client_behind_an_open_breaker_gets_unavailable_with_the_delay` |
//! | half-open, exactly `half_open_calls` probes go, whoever races: 64 tasks, 5 probes, 20 rounds; when they have all ended it closes with an empty window if their rates are below the thresholds, and opens again otherwise | `racing_tasks_get_exactly_the_half_open_calls`, `successful_probes_close_it_with_an_empty_window_and_failed_ones_reopen_it` |
//! | a call dropped before its answer, before or after its first poll, counts for nothing, and a probe's place is freed exactly once; so is one whose error the classifier ignores | `a_probe_dropped_at_any_point_frees_its_place_exactly_once`, `a_probe_whose_dependency_fails_without_a_verdict_frees_its_place`, `calls_ignored_by_the_classifier_are_not_counted` |
//! | a dependency that accepts calls and never answers is cut by the timeout below the breaker, and opens it as failures do, probes included | `a_dependency_that_never_answers_is_cut_by_the_timeout_and_opens_it`, `a_probe_that_never_answers_is_cut_by_the_timeout_below_and_reopens_it` |
//! | in the stack (breaker → pushback → client quota → bulkhead → timeout → `reqwest::Client`), the refusals of the layers below (`PushedBack`, `QuotaExhausted`, `BulkheadFull`) are not counted; a dead dependency gets no call while open, and probes close it once it is healthy | `refusals_of_the_layers_below_are_not_counted`, `a_dead_dependency_opens_it_then_probes_find_it_healthy_again` |
//! | every setting out of range (a rate that is NaN, infinite, 0 or above 1, a window of 0 or over 100 000, a zero or absurd duration, no probes), in code or in `[breakers.NAME]`, is refused naming it; a clock at the end of time keeps it open without wrapping | `bad_settings_are_refused_naming_the_setting`, `every_bad_value_is_refused_naming_its_field`, `a_clock_at_the_end_of_time_keeps_it_open_without_wrapping` |
//! | each transition is one `tracing` event with the rates; the state gauge and the calls by outcome follow | `each_transition_is_an_event_and_the_metrics_follow_the_calls` |
//!
//! The defaults (the last 100 calls, at least 20, 50 % failures, open for 1 s, 10 probes) let
//! at most 10 calls reach a dead dependency for each second it stays open, whatever the rate of
//! requests, and close it within about a second of the dependency being healthy again.
//!
//! # Outbound: retries
//!
//! With the `adaptive` feature, `outbound::retry::Retry` sends a call again when it is safe
//! (an idempotent method or an `Idempotency-Key`, or a rule of the user's, and a request that
//! can be copied) and its answer transient (the classifier says overload, or an error names
//! when to come back), never sooner than the dependency asked, within a budget every clone
//! shares. The stack order is `retry → breaker → pushback → client quota → bulkhead → timeout`
//! (reasons in the `outbound` module).
//!
//! | promise | proved by |
//! |---|---|
//! | a retry never leaves before a `Retry-After` (delta-seconds, HTTP-date, `retry-after-ms`; a 504's too) or a gRPC `RetryInfo` or `grpc-retry-pushback-ms` (the longer), nor before the `retry_after` of a refusal below; a wait longer than `max_wait` is not made and the answer comes back unchanged, at once; a negative or unreadable gRPC pushback ("do not retry", A6) is obeyed | `a_retry_never_leaves_before_retry_after`, `retry_after_as_a_date_or_in_milliseconds`, `a_retry_never_leaves_before_a_grpc_pushback`, `a_grpc_pushback_that_says_not_to_retry_is_obeyed`, `a_wait_longer_than_max_wait_ends_the_call_with_the_answer`, `refusals_below_are_retried_after_their_time_or_not_at_all` (`tests/outbound/retry.rs`); `a_429_is_retried_after_its_retry_after_through_the_pushback` (`tests/outbound/retry_stack.rs`, a `reqwest::Client` against wiremock) |
//! | a POST is sent once unless marked; a request that cannot be copied is sent once; a full bulkhead or an open breaker below is never retried (the call fails fast, the budget untouched); a classifier of the user's replaces the default; attempts stop at `max_attempts`, each backoff within its full-jitter bound | `a_post_is_not_retried_unless_marked`, `a_request_that_cannot_be_copied_is_sent_once`, `refusals_below_are_retried_after_their_time_or_not_at_all`, `an_open_breaker_below_is_not_retried`, `a_classifier_of_the_users_decides_what_is_transient`, `attempts_stop_at_max_attempts_after_bounded_backoffs`; `a_503_is_retried_for_a_get_and_not_for_a_post` |
//! | hostile `Retry-After` values (beyond any integer, a date in year 9999, negative, garbage, a date in 1970) never panic: a huge one is longer than any `max_wait`, an unreadable one is ignored as the pushback ignores it | `hostile_retry_after_values_are_handled_as_documented` |
//! | the budget: at 100 calls a second with 35 % of attempts failing, attempts stay under 1.25 per call (1.23 measured; 1.48 without the budget); with 10 % failing, at least 99 % of calls succeed, with at most 1.25 attempts a call on average; a ratio of 0.1 grants exactly one retry per ten calls; deposits expire after the window; a retry counts from when it is granted, through a wait longer than the window, until at least a window after it is sent; 200 calls on clones racing for L retries get exactly L | `with_35_percent_failing_attempts_stay_under_1_25_per_call`, `a_flaky_dependency_is_hidden_within_1_25_attempts_per_call`, `a_fractional_ratio_grants_exactly_its_share`, `deposits_expire_after_the_window_and_the_floor_comes_back`, `clones_racing_for_a_budget_of_l_retries_get_exactly_l` (`tests/outbound/retry_budget.rs`); `retries_waiting_longer_than_the_window_count_until_they_are_sent`, `a_withdrawal_from_the_reserve_counts_for_at_least_its_window` (`tests/outbound/attack_retries.rs`) |
//! | cancellation: a call deposits once when made; a retry withdrawn before its backoff is given back if the call is dropped before the retry is handed to the service (during the backoff, or while the service gets ready), and stays withdrawn once sent, unless a layer below refuses it unsent; no attempt follows a drop | `dropped_during_the_first_attempt`, `dropped_during_the_backoff`, `dropped_during_the_retry`, `dropped_while_the_service_gets_ready`, `a_retry_refused_below_before_it_was_sent_is_given_back` |
//! | in the documented stack (retry → breaker → pushback → bulkhead → timeout → `reqwest::Client`), the timeout cuts a dependency that never answers and its `Elapsed` is retried as overload; a 429 is retried after its `Retry-After` through the pushback | `a_silent_dependency_is_cut_by_the_timeout_and_retried`, `a_429_is_retried_after_its_retry_after_through_the_pushback` (`tests/outbound/retry_stack.rs`) |
//! | events, metrics and config: a retry not made is a `debug` event naming its reason; attempts by kind and retries not made by reason are counted; every setting out of range (NaN included) is refused by `build`, in code or in `[retries.NAME]`, naming it; the file's defaults are the builder's; a reload refuses any change; the largest settings count without overflow | `a_retry_not_made_is_a_debug_event_with_its_reason`, `attempts_and_retries_not_made_are_counted`, `bad_settings_are_refused_naming_the_setting`; `config::retry`'s unit tests |
//!
//! # gRPC
//!
//! With the `grpc` feature, the rate-limit layer's own answers to a gRPC call are gRPC statuses,
//! trailers-only; the outbound layers read a gRPC dependency's; a bulkhead's refusal is a status
//! tonic answers.
//!
//! | promise | proved by |
//! |---|---|
//! | tonic and grpcio (C-core, not ours) see `RESOURCE_EXHAUSTED`, the pushback in whole milliseconds, never 0, and a decodable `RetryInfo` on the sixth rapid call; grpcio does not retry a refusal when its policy lists only `UNAVAILABLE`, and with `RESOURCE_EXHAUSTED` waits at least the pushback | `tests/rate_limit/grpc.rs` (`grpcio_*`, `the_sixth_rapid_call_*`) |
//! | the refusal's `google.rpc.Status` decodes for any policy names and periods; its message is `grpc-message`, as grpcio requires | `the_refusals_details_decode_for_any_policy_names_and_delays` |
//! | hostile requests (any content type, `grpc-timeout` of any shape, metadata of any bytes, HTTP/1.1 claiming gRPC) get a gRPC answer exactly when they are gRPC, never a panic, and spend only what reached the handler | `hostile_grpc_requests_get_a_clear_answer_and_spend_only_what_was_admitted` |
//! | a call the crate refuses on the client comes back from tonic as a status with its wait: a spent client quota `RESOURCE_EXHAUSTED`, a held call `UNAVAILABLE`, each with a `RetryInfo` and `grpc-retry-pushback-ms`; a refusal hook falls back to the layer's gRPC answer with `default_response` | `a_tonic_client_behind_a_client_quota_gets_resource_exhausted_with_the_wait`, `a_tonic_client_behind_pushback_holds_calls_for_the_refusals_retry_delay`, `a_refusal_hook_falls_back_to_the_grpc_answer` |
//! | a streaming call (server-streaming, bidirectional) is decided once, at its start; a server bulkhead holds its permit until the stream is read to its end or dropped, and refuses others with `RESOURCE_EXHAUSTED` | `tests/rate_limit/grpc_streaming.rs` |
//! | a pushback holds calls for a gRPC answer's delay, trailers-only or (with `read_trailers`) in trailers; a negative, unreadable or absurd one holds nothing beyond what it says, never a panic | `a_pushback_reading_trailers_holds_calls_for_a_refusal_that_comes_last`, `hostile_grpc_answers_set_no_hold_beyond_what_they_say` |
//! | a client quota on a `Channel` gives back the permit of a call refused below it | `a_client_quota_on_a_channel_counts_calls_per_method_and_only_those_sent` |
