//! Pushback: calls to a dependency held back for as long as the dependency asks.
//!
//! A partner API that answers `429 Too Many Requests` with `Retry-After: 30` has said what it
//! wants: no calls for thirty seconds. One that sends the draft-11 `RateLimit` field,
//! `"default";r=0;t=12`, has said it before any 429: nothing left for twelve seconds. A
//! [`Pushback`] reads these from every response that passes through its layer and holds further
//! calls to that dependency back until then, for every clone of the client that shares it.
//!
//! ```
//! use std::time::Duration;
//! use http::{Response, StatusCode};
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_bulwark::outbound::{self, Pushback, PushedBack};
//! use tower_bulwark::{BoxError, clock::ManualClock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let clock = ManualClock::new();
//! let partner = Pushback::builder("partner").clock(clock.clone()).build();
//! let client = partner.layer().layer(service_fn(|_: ()| async {
//!     Ok::<_, BoxError>(
//!         Response::builder()
//!             .status(StatusCode::TOO_MANY_REQUESTS)
//!             .header("retry-after", "30")
//!             .body(())?,
//!     )
//! }));
//!
//! // The first call reaches the partner and comes back with a 429 and `Retry-After: 30`...
//! let response = client.clone().oneshot(()).await?;
//! assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
//!
//! // ...so for thirty seconds no call is sent; each fails at once with the time left.
//! clock.advance(Duration::from_secs(10));
//! let err = client.clone().oneshot(()).await.unwrap_err();
//! assert!(err.is::<PushedBack>());
//! assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(20)));
//! assert_eq!(err.to_string(), "dependency `partner` asked for no calls for another 20s");
//!
//! clock.advance(Duration::from_secs(20));
//! assert_eq!(partner.held_for(), Duration::ZERO);
//! # Ok(())
//! # }
//! ```
//!
//! # What is read
//!
//! * **`Retry-After`** on a 429 or a 503, and on a 403 that carries rate-limit fields
//!   (GitHub's secondary limits): delta-seconds (decimal ones too, `2.0`, rounded up to the
//!   nanosecond) or an HTTP-date (RFC 9110 section 10.2.3). **`retry-after-ms`** (OpenAI,
//!   Azure) counts instead when readable: it is the same hold to the millisecond. A date is
//!   read against the response's own `Date` field when it has one (so the two clocks need not
//!   agree), otherwise against the system time; a date in the past holds nothing. A 429 with
//!   neither a readable `Retry-After` nor a rate-limit field holds for one second (a
//!   malformed `Retry-After` counts as none).
//! * Quotas, on any response, in each of these dialects; of all the quotas read, the most
//!   restrictive counts (the fewest calls left, and of those the longest window):
//!
//! | fields | who sends them | what is read |
//! |---|---|---|
//! | `RateLimit`, `RateLimit-Policy` | draft-ietf-httpapi-ratelimit-headers-11 | each item's `r` calls left for `t` seconds (or the `w` of the policy of the same name), then the policy's `q` per `w` |
//! | `X-RateLimit-Remaining` with `X-RateLimit-Reset-After` or `X-RateLimit-Reset` | GitHub, Discord, many more | what is left until the reset: `Reset-After` in decimal seconds when present, else the reset as below |
//! | `RateLimit-Remaining`, `RateLimit-Reset` | drafts before -07, GitLab | the same |
//! | `x-ratelimit-{limit,remaining,reset}-requests`, `-tokens` | OpenAI | the requests as a quota; spent tokens hold calls until they come back (at an even pace up to `-limit-tokens`, else at the reset), and a call of N tokens until N are left; resets are Go durations (`1s`, `6m0s`, `20ms`) |
//! | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}` | Anthropic | the requests as a quota; each family of tokens, once spent, holds calls until its tokens come back (at an even pace up to its `-limit`, else at the reset), and the family with fewest left a call of N tokens until N are left; resets are RFC 3339 times |
//!
//!   A reset is a Unix time in milliseconds from 10^12, in seconds from 10^9 (either with a
//!   fraction: Discord writes `1470173023.123`), and below that seconds (whole or decimal) or a
//!   Go duration from now: as seconds from now, 10^9 would be 31 years, and a Unix time below it
//!   would be before September 2001. `X-RateLimit-Limit` is not used: it says how many calls a
//!   window grants, not how long the window is. A family of tokens says how many calls are
//!   left only when it is spent; a call's own tokens count when the layer knows them
//!   ([`PushbackLayer::cost_by`]): a call of N tokens starts once N are left. Tokens come
//!   back at an even pace from the answer to the reset, up to the family's `-limit` when it is
//!   sent (OpenAI's reset is when the limit is whole again), and all at the reset without it.
//!   What calls in flight took is taken off what an answer says is left, as for calls.
//!
//!   **A limit:** of several families of tokens in one answer, the one with the fewest left
//!   (and of those the latest reset) is the one kept; a spent family that sends no `-limit`
//!   also holds calls until its reset, as a quota does. Two spent families that both send a
//!   `-limit` hold calls by one of them only, though the other's tokens may come back slower
//!   (found by attack).
//!
//! # How calls are held
//!
//! * After a `Retry-After`, no call starts until it has passed. A quota spent on the same
//!   answer comes back when the `Retry-After` has passed, even if its reset says later, for
//!   draft-11's `RateLimit` (its "Client Behavior": Retry-After "MUST take precedence"),
//!   OpenAI's and Anthropic's families; for `X-RateLimit-*`, `RateLimit-*` and dialects of the
//!   user's, the later of the two counts.
//! * With an advertised quota, at most `r` calls start within `t`, less the calls already in
//!   flight when the answer came (they may not have been counted in it yet). When they are
//!   spent, calls are held until `t` has passed; then the `q` calls of the policy of the same
//!   name (less those still in flight) may start within its `w`, and so on, or, without a
//!   policy, calls go freely by this quota until the next answer. Each of these windows starts
//!   with the first call that goes after the one before has passed and no hold lasts, as the
//!   dependency's does: a call refused (by another quota, say) and
//!   [`held_for`](Pushback::held_for) start none.
//!   [`Pacing::Spread`] also spaces the calls left evenly over `t`.
//! * An answer that advertises several quotas (several `RateLimit` items, or a quota in each of
//!   two dialects) holds calls by each of them: a call starts only when every one lets it, and
//!   counts against each. Of more than 16 in one answer, the 16 most restrictive are kept (the
//!   fewest calls left, and of those the longest window).
//! * A policy whose `q` is zero, or no more than the calls in flight, gives nothing in any
//!   window until something new is heard: then calls are held for
//!   [`max_hold`](PushbackBuilder::max_hold) from the last answer or call, and one call goes
//!   (a probe), so that its answer tells anew.
//! * Answers may arrive out of order, and a dependency may count concurrent calls in an order
//!   of its own (a pooled client sends a later call on a warm connection while earlier ones
//!   still connect). So an answer is newer than the one in force only if its call was sent
//!   after that one was received; it then replaces it. An answer to a call sent before may
//!   have been written first, whatever order the calls started in, so it may only tighten what
//!   is in force. Each of its quotas tightens the quota in force of the same dialect and name
//!   (a `RateLimit` item's name, a family of fields), field by field: no more calls left than
//!   either answer gave, a window no shorter, a policy no looser; when it has nothing left, no
//!   call goes until its window ends, and then the quotas in force apply as they stand. A
//!   quota of a name not in force is kept beside them. It never loosens or shortens a hold.
//! * A call that one of the crate's layers below refuses before sending it (a
//!   [`BulkheadFull`](crate::BulkheadFull), a client quota's refusal) reached nothing: the
//!   call it took of each advertised budget goes back, to each budget still in force that it
//!   took it from.
//! * A held call fails at once with [`PushedBack`], which carries the time until a call may
//!   actually go, with nothing new heard in between (the end of whichever of the hold, the
//!   spent window or the pacing ends last, past windows that give nothing, or the probe),
//!   unless that time comes within [`max_wait`](PushbackBuilder::max_wait): then it waits on
//!   tokio's timer (no thread parked) and is sent when the hold ends (a newer answer may end
//!   it sooner). A waiting call that is dropped (a timeout above it) simply goes away: it
//!   reached nothing and took nothing.
//!
//! Nothing is known before the first answer: pair the pushback with a
//! [client quota](super::ClientQuotaLayer) for the calls that go before it.
//!
//! # Hostile answers
//!
//! Whatever a response says, no hold is longer than [`max_hold`](PushbackBuilder::max_hold)
//! (ten minutes by default): a longer `Retry-After`, `t` or reset is cut to it and logged at
//! `warn` on the target `tower_bulwark::pushback`. Malformed values (negative, not numbers,
//! bytes that are not text, fields over 4 KiB or of more than 16 lines) are ignored (those of
//! the rate-limit fields and `Retry-After` logged); none panics. Several `Retry-After` lines are
//! not an error: the longest counts. Another field on several lines counts where they all say
//! the same (a proxy and the server may each add it) and is ignored, logged, where they differ.
//! `RateLimit` and `RateLimit-Policy` are parsed as Structured Fields (RFC 9651) with the `sfv`
//! crate, and a field that does not parse is ignored whole, as that RFC asks.

pub(crate) mod answer;
mod builder;
mod dependency;
mod error;
mod future;
mod layer;
mod schedule;
mod tokens;
mod trailers;

#[cfg(feature = "config")]
pub(crate) use self::builder::DEFAULT_MAX_HOLD;
pub use self::builder::{Pacing, PushbackBuilder};
pub use self::dependency::Pushback;
pub use self::error::PushedBack;
pub use self::future::ResponseFuture;
pub use self::layer::{PushbackLayer, PushbackService};
pub use self::trailers::PushbackBody;
