//! A circuit breaker (feature `adaptive`): calls to a failing dependency fail at once, for a
//! while, instead of adding to its load and waiting for its errors.
//!
//! A [`Breaker`] counts what each call's answer says of the dependency, judged by the same
//! [`Classify`](crate::bulkhead::adaptive::Classify) classifier as the adaptive bulkhead (by
//! default [`HttpOverload`](crate::bulkhead::adaptive::HttpOverload)). When too many of the
//! recent calls failed or were slow, it opens: every call fails at once with [`BreakerOpen`],
//! which says when to try again. After `open_for`, a few probe calls go through; if they
//! succeed, the breaker closes, otherwise it opens again.
//!
//! ```
//! use std::time::Duration;
//! use http::Response;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_bulwark::clock::ManualClock;
//! use tower_bulwark::outbound::breaker::{Breaker, BreakerOpen, BreakerState, Window};
//! use tower_bulwark::{outbound, BoxError};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let clock = ManualClock::new();
//! let partner = Breaker::builder("partner")
//!     .window(Window::Calls(10))
//!     .minimum_calls(4)
//!     .half_open_calls(2)
//!     .clock(clock.clone())
//!     .build()?;
//! // A dependency that is down: it answers every call with 503.
//! let client = partner.layer().layer(service_fn(|_: ()| async {
//!     Ok::<_, BoxError>(Response::builder().status(503).body(())?)
//! }));
//!
//! // Four calls, four failures: a failure rate of 1, at least the threshold (0.5).
//! for _ in 0..4 {
//!     assert_eq!(client.clone().oneshot(()).await?.status(), 503);
//! }
//! assert_eq!(partner.state(), BreakerState::Open { until: Duration::from_secs(1) });
//!
//! // Open: calls fail at once, without reaching the dependency, saying for how long.
//! clock.advance(Duration::from_millis(400));
//! let err = client.clone().oneshot(()).await.unwrap_err();
//! assert!(err.is::<BreakerOpen>());
//! assert_eq!(outbound::retry_after(&*err), Some(Duration::from_millis(600)));
//!
//! // After `open_for` (1 s), two probes go through; both fail, so it opens again.
//! clock.advance(Duration::from_millis(600));
//! assert_eq!(partner.state(), BreakerState::HalfOpen);
//! client.clone().oneshot(()).await?;
//! client.clone().oneshot(()).await?;
//! assert_eq!(partner.state(), BreakerState::Open { until: Duration::from_secs(2) });
//! # Ok(())
//! # }
//! ```
//!
//! # How it decides
//!
//! * **Closed.** Each call that ends is counted in the window ([`Window::Calls`]: the last N
//!   calls; [`Window::Seconds`]: those that ended in the last N seconds), as a failure when
//!   the classifier says [`Overloaded`](crate::bulkhead::adaptive::Verdict::Overloaded), and
//!   as slow when it took longer than `slow_call_duration` on the breaker's clock (failed or
//!   not), its waits below left out (see [Where it goes](#where-it-goes)). Once the window holds at least `minimum_calls`, the breaker opens as soon as the
//!   share of failures reaches `failure_rate` or the share of slow calls reaches
//!   `slow_call_rate` (with 50 %, 5 failures in 10 calls open it, 4 do not).
//! * **Open** for `open_for`: every call fails at once with [`BreakerOpen`], the inner
//!   service not called; its [`retry_after`](BreakerOpen::retry_after) is the time left.
//! * **Half-open**, from the first call or [`Breaker::state`] after that: exactly
//!   `half_open_calls` probes are let through, whoever races for them, and the other calls
//!   fail at once. When all the probes have ended, the breaker opens again if their rates
//!   reach a threshold, and closes otherwise, with an empty window.
//!
//! The classifier's [`Ignored`](crate::bulkhead::adaptive::Verdict::Ignored) calls are not
//! counted: the default classifier ignores the crate's own refusals below the breaker
//! ([`PushedBack`](super::PushedBack), [`QuotaExhausted`](super::QuotaExhausted),
//! [`BulkheadFull`](crate::BulkheadFull)) and errors that say nothing of the dependency. A
//! call dropped before its answer is not counted either (a probe frees its place for
//! another, once): put the timeout below the breaker, where a call it cuts ends with tower's
//! `Elapsed`, an overload, so that a dependency that never answers opens the breaker as
//! failures do. A call admitted before a transition counts for nothing after it (a call
//! admitted while closed is no probe).
//!
//! # Where it goes
//!
//! Below the retry layer and above the pushback:
//! `retry → breaker → pushback → client quota → bulkhead → timeout → client`. Above the
//! pushback, a call the dependency asked to hold is refused there and never counted; above
//! the retry layer, a breaker would count a call's attempts as one.
//!
//! A call is timed without its waits in this crate's layers below (the pushback's and the
//! client quota's `max_wait`, a bulkhead's queue), so calls that waited out the dependency's
//! advertised quota for 3 s and were answered at once are not slow. Waits that overlap (sub-calls
//! sent at once) count once, and only from the call's start. A layer that moves the call to
//! another task between them (tower's `Buffer`) hides those waits, which then count; a wait of
//! one branch of a hedge while another is with the dependency is taken out all the same; and a
//! wait of a future that calls share (a single flight) is taken out of one of them only.
//!
//! # The defaults, and why
//!
//! A window of the last 100 calls, at least 20 of them, a failure rate of 0.5, a slow-call rate
//! of 1 for calls over 10 s (slow calls alone open it only when all of them are slow), open for
//! 1 s, then 10 probes. At 100 requests a second against a dead dependency, it opens after 20
//! calls, and then lets 10 probes through about every second: a tenth of the calls offered.
//! When the dependency is healthy again, the next probes find it so within about a second,
//! and it closes. The open time does not grow: a dependency back from an outage is used again
//! at once, and 10 probes a second cost a dead one little.
//!
//! # Watching it
//!
//! [`Breaker::state`] says where it stands. Each transition is a `tracing` event on the target
//! `tower_bulwark::breaker` (`warn` when it opens, `info` otherwise) with the breaker's name,
//! the states, the calls counted with their failure and slow-call rates, and, when it opens,
//! `open_for` and `until` (as in [`BreakerState::Open`]). With the `metrics` feature, `bulwark_breaker_state{name}` (0 closed, 1 open, 2
//! half-open) and `bulwark_breaker_calls_total{name, outcome}` (`success`, `failure`, `slow`,
//! `refused`) follow it (see [the metric names](crate::observe#metric-names)). With the
//! `config` feature, breakers come from a file's `[breakers.NAME]` tables.

mod builder;
mod error;
mod metrics;
mod state;

pub use self::builder::{Breaker, BreakerBuilder, BreakerState, Window};
pub use self::error::BreakerOpen;
