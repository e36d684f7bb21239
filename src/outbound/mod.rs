//! Outbound calls: respect the dependency, and keep to your own quota for it.
//!
//! These layers complete the [bulkhead](crate::bulkhead) on the way out of a service:
//!
//! * [`Pushback`] ([`pushback`] module) obeys the dependency: after a `429` or `503` with
//!   `Retry-After`, or once the quota it advertises in `RateLimit` or `X-RateLimit-*` fields is
//!   spent, further calls are held back until the time it gave, failing at once with
//!   [`PushedBack`] or waiting up to `max_wait`.
//! * [`ClientQuotaLayer`] ([`quota`] module) keeps to a quota of your own for the dependency
//!   ("5 000 calls per hour to the partner"), in memory or in Redis so that every instance
//!   shares it, failing with [`QuotaExhausted`] or waiting up to the quota's `max_wait`.
//! * `Breaker` (`breaker` module, feature `adaptive`) is a circuit breaker: when too many
//!   recent calls failed or were slow, calls fail at once with `BreakerOpen` for a while, then
//!   a few probes decide whether it closes.
//! * `Retry` (`retry` module, feature `adaptive`) sends a call again when its answer was
//!   transient, never sooner than the dependency asked, within a budget every clone shares.
//!
//! # The order of layers
//!
//! From the caller down to the client:
//!
//! ```text
//! retry → breaker → pushback → client quota → bulkhead → timeout → client
//! ```
//!
//! * **retry** outermost, so that it sees every refusal and failure below and each of its
//!   attempts passes every layer below again: the breaker judges it, the pushback holds it, the
//!   quota charges it, as any call.
//! * **breaker** next: it judges each attempt, not the retried whole, and when it is open an
//!   attempt fails at once, spending nothing below.
//! * **pushback** before the quota: a call the dependency has asked you not to make spends no
//!   permit of your quota.
//! * **client quota** before the bulkhead: a call waiting for its permits holds no bulkhead
//!   permit, so the bulkhead counts only calls that are really on their way.
//! * **bulkhead** next: it caps the calls in flight at the dependency.
//! * **timeout** innermost: it bounds each attempt's time at the dependency, its `Elapsed` is
//!   a failure the breaker and the retry see (the default classifier takes it for overload),
//!   and cutting an attempt gives back the bulkhead permit it held. A deadline for the whole
//!   call, retries and waits included, is a second timeout above the retry.
//!
//! A call that has passed the pushback and then waits below it (for a quota permit within
//! `max_wait`, in a bulkhead's queue) is sent when its turn comes, even if the dependency asked
//! for a hold meanwhile. Where holds must be obeyed exactly, let the layers below the pushback
//! refuse at once and let the retry layer do the waiting: every attempt then passes the pushback
//! again (`examples/partner_api.rs` works this way).
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_bulwark::bulkhead::Bulkhead;
//! use tower_bulwark::outbound::{ClientQuotaLayer, Pushback};
//! use tower_bulwark::{DirectRateLimiter, Quota};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let partner = Pushback::builder("partner").max_wait(Duration::from_secs(2)).build();
//! let quota = DirectRateLimiter::new(
//!     Quota::per_hour(5_000)?.with_max_wait(Duration::from_secs(1))?,
//! );
//! let bulkhead = Bulkhead::semaphore("partner", 16).build();
//! let client = ServiceBuilder::new()
//!     .layer(partner.layer())
//!     .layer(ClientQuotaLayer::new("partner", quota))
//!     .layer(bulkhead.layer())
//!     .timeout(Duration::from_secs(5))
//!     .service(reqwest::Client::new());
//! // With the `adaptive` feature, the retries go on top.
//! # #[cfg(feature = "adaptive")]
//! let retries = tower_bulwark::outbound::retry::Retry::builder("partner").build()?;
//! # #[cfg(feature = "adaptive")]
//! let client = tower::Layer::layer(&retries.layer(), client);
//! # let _ = client;
//! # Ok(())
//! # }
//! ```
//!
//! `tests/outbound/stack.rs` builds the stack below the retry around a `reqwest::Client` and a
//! mock server and shows each layer doing its part there; `tests/outbound/retry_stack.rs` puts
//! the retry layer on top.
//!
//! # Retrying after the time the dependency gave
//!
//! Every refusal of these layers carries the time after which the call may go:
//! [`retry_after`] finds it in an error (or in any error whose [`source`](std::error::Error::source)
//! chain holds one). The retry layer waits for it (and for a `Retry-After` or gRPC pushback in
//! an answer) before it tries again; a `tower::retry::Policy` of your own can read the same
//! times through [`retry_after`].
//!
//! # Configuration and metrics
//!
//! With the `config` feature, they come from a TOML file by name (`[pushbacks.NAME]`,
//! `[client_quotas.NAME]`, `[retries.NAME]`; see the `config` module, feature `config`) and
//! its `Registry` builds their layers. With the `metrics` feature, every
//! pushback and client quota, built by hand or from a file, counts its calls by outcome, a
//! pushback the answers that asked it to hold and the time it holds for, and a retry layer its
//! attempts and the retries it did not make (names in
//! [the metric names](crate::observe#metric-names)).

#[cfg(feature = "adaptive")]
#[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
pub mod breaker;
#[cfg(feature = "grpc")]
pub(crate) mod grpc;
mod metrics;
pub mod pushback;
pub mod quota;
#[cfg(feature = "adaptive")]
#[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
pub mod retry;

use std::error::Error;
use std::time::Duration;

#[cfg(feature = "adaptive")]
pub use self::breaker::{Breaker, BreakerOpen};
pub use self::pushback::{Pushback, PushbackLayer, PushedBack};
pub use self::quota::{ClientQuotaLayer, QuotaExhausted};

/// The time after which a refused call may be sent again, if `err` (or an error in its
/// [`source`](Error::source) chain) is a refusal that carries one: [`PushedBack`],
/// [`QuotaExhausted`] or (feature `adaptive`) a circuit breaker's `BreakerOpen`, or (feature
/// `grpc`) a `tonic::Status` of `RESOURCE_EXHAUSTED` or
/// `UNAVAILABLE` with a `RetryInfo` or a non-negative `grpc-retry-pushback-ms` (with both, the
/// longer). `None` for any
/// other error: a timeout, a [`BulkheadFull`](crate::BulkheadFull), the dependency's own
/// failure, a gRPC pushback that says not to retry.
///
/// To recognise an error of your own as well, chain it:
/// `outbound::retry_after(err).or_else(|| err.downcast_ref::<MyError>().map(MyError::wait))`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tower_bulwark::outbound;
/// use tower_bulwark::BoxError;
///
/// fn when_to_retry(err: &BoxError) -> Option<Duration> {
///     outbound::retry_after(&**err)
/// }
///
/// let timeout: BoxError = "deadline passed".into();
/// assert_eq!(when_to_retry(&timeout), None);
/// ```
///
/// The `retry` module's layer (feature `adaptive`) waits for it before it tries again.
pub fn retry_after(err: &(dyn Error + 'static)) -> Option<Duration> {
    chain(err).find_map(|err| {
        // Each type to look for is the one its reader takes.
        let ours = (err.downcast_ref().map(PushedBack::retry_after))
            .or_else(|| err.downcast_ref().map(QuotaExhausted::retry_after));
        #[cfg(feature = "adaptive")]
        let ours = ours.or_else(|| err.downcast_ref().map(BreakerOpen::retry_after));
        #[cfg(feature = "grpc")]
        let ours = ours.or_else(|| err.downcast_ref().and_then(grpc::status_delay));
        ours
    })
}

/// `err` and the errors of its [`source`](Error::source) chain, outermost first.
pub(crate) fn chain<'e>(
    err: &'e (dyn Error + 'static),
) -> impl Iterator<Item = &'e (dyn Error + 'static)> {
    std::iter::successors(Some(err), |&err| err.source())
}

/// Whether `err` (or an error in its [`source`](Error::source) chain) is a refusal by one of
/// this crate's outbound layers, made before anything was sent: a [`PushedBack`], a
/// [`QuotaExhausted`], a [`BulkheadFull`](crate::BulkheadFull) or an
/// [`InsufficientCapacity`](crate::limiter::InsufficientCapacity) or (feature `adaptive`) a
/// `BreakerOpen`. A client quota above such a
/// layer gives the call's permits back, and a pushback the share of the advertised budget the
/// call took.
pub(crate) fn never_sent(err: &(dyn Error + 'static)) -> bool {
    chain(err).any(|err| {
        let ours = err.is::<PushedBack>()
            || err.is::<QuotaExhausted>()
            || err.is::<crate::BulkheadFull>()
            || err.is::<crate::limiter::InsufficientCapacity>();
        #[cfg(feature = "adaptive")]
        let ours = ours || err.is::<BreakerOpen>();
        ours
    })
}

/// The constructor, `Display` and `Error` of the refusal `$refusal`: `$message` with its field
/// `$name` and its `retry_after`, and (feature `grpc`) for source a `tonic::Status` of `$code`
/// carrying the wait.
macro_rules! refusal {
    ($refusal:ty, $name:ident, $code:ident, $message:literal) => {
        impl $refusal {
            /// The refusal of `name`, saying that the call may go after `retry_after`.
            pub(crate) fn new(name: std::sync::Arc<str>, retry_after: std::time::Duration) -> Self {
                Self {
                    $name: name,
                    retry_after,
                    #[cfg(feature = "grpc")]
                    status: Default::default(),
                }
            }
        }

        impl std::fmt::Display for $refusal {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, $message, self.$name, self.retry_after)
            }
        }

        impl std::error::Error for $refusal {
            #[cfg(feature = "grpc")]
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.status
                    .of(self, tonic::Code::$code, Some(self.retry_after))
            }
        }
    };
}
use refusal;
