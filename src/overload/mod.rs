//! Overload protection (feature `adaptive`): one limit of requests in flight for the whole
//! service, following its measured latency, that sheds the least important requests first.
//!
//! Rate limits keep each client within its quota; nothing in them stops more well-behaved
//! traffic than the service can serve, all clients within their quotas together. Then latency
//! grows for everyone until timeouts turn it into an outage. An [`Overload`] keeps the requests
//! in flight at a limit that a delay-based [`LimitAlgorithm`](crate::bulkhead::adaptive::LimitAlgorithm)
//! moves with the latency it measures, and admits by [`Priority`]: each class below `Critical`
//! finds a lower ceiling, so when the service is full the lower classes are shed first, a class
//! keeps a guaranteed share of the limit that the lower ones never take, and `Critical` may
//! borrow above the limit.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tower_bulwark::overload::{Overload, Priority};
//!
//! let overload = Overload::builder("api")
//!     .priority_by(|head| {
//!         let value = head.headers.get("x-priority").and_then(|v| v.to_str().ok());
//!         value.map_or(Priority::Default, Priority::from_header_value)
//!     })
//!     .build();
//! let app: Router = Router::new()
//!     .route("/work", get(|| async { "done" }))
//!     .layer(overload.layer());
//! # drop(app);
//! ```
//!
//! # Why a layer of its own
//!
//! A rate-limit policy judges one client against its quota and answers `429`: the excess is the
//! client's own. Overload judges the whole service against what it can serve now and answers
//! `503`: the state is the service's. It needs a latency sample from every admitted request and
//! one limit shared by all of them, which no rate-limit policy has, so it is a layer of its own,
//! placed outside the rate limits (a request a quota refuses costs the service nothing).
//!
//! # Admission
//!
//! A request of class `c` is admitted if the requests in flight, all classes together and it
//! excluded, are below the ceiling of `c`: for [`Priority::Critical`] the limit times what it
//! may borrow above it ([`OverloadBuilder::critical_borrowing`], 3 by default), and for the
//! others the limit less the guarantees of the classes above, rounded to the nearest whole
//! request ([`OverloadBuilder::guarantee`]); at least one, so that no class is shed for good
//! (the limit learns only from what it admits). With a limit of 10 and a guarantee of 0.2 for
//! `Critical`, the lower classes never hold more than 8 together, and `Critical` always finds 2,
//! and up to 30 in flight with the others while it borrows.
//!
//! Otherwise the request is shed at once, never reaching the inner service and spending
//! nothing; or, with a [queue](OverloadBuilder::queue), it waits until its ceiling lets it in,
//! highest class first, or until `max_wait` passes.
//!
//! A request holds its permit until its response body ends, fails or is dropped, so a streaming
//! answer counts while it streams. The permit is given back exactly once whatever ends the
//! request: the body's end, its failure or drop, an error of the inner service, a panic, or the
//! response future dropped at any await (in the queue, or while the inner service runs).
//!
//! # The limit
//!
//! Each admitted request gives the algorithm one sample when its response head is ready: its
//! latency from admission (not from arrival: time in the queue is not the service's), the
//! requests in flight when it was admitted, and its class's ceiling then (at most the limit).
//! A request whose inner service fails or panics, or whose future is dropped first, gives none.
//! A sample "found the limit reached" when it took the last place under its class's ceiling, or
//! went above the limit, so the lower classes' flood, or critical requests borrowing, is what
//! lets a delay-based limit grow, until their latency rises above its tolerance.
//!
//! # Shed answers
//!
//! `503 Service Unavailable` with `Retry-After` and an RFC 9457 problem (`about:blank`, status
//! 503, a `detail` naming the protection and the wait). The wait is the slow average of the
//! admitted requests' latency (each sample moves it a sixteenth of the way), in whole seconds
//! rounded up, at least one. A gRPC call (feature `grpc`) gets `UNAVAILABLE` instead, with the
//! same wait in `grpc-retry-pushback-ms` and a `google.rpc.RetryInfo`, as the crate's other gRPC
//! answers give a delay.
//!
//! # Defaults
//!
//! They hold issue 39's targets on `examples/overload.rs`, which sets nothing else (its header
//! has the figures): a service that serves 8 requests at full speed and slows beyond as a
//! shared processor, flooded at 4 and 10 times what it serves with critical requests at 80 % of
//! it.
//!
//! * [`Aimd`](crate::bulkhead::adaptive::Aimd) with a latency tolerance of 1.1 (the adaptive
//!   bulkhead's is 1.3): the limit comes down whenever a round trip's mean latency is 10 % above
//!   the baseline, so the lower classes are kept where the service is barely busier than at no
//!   load. A bulkhead protects the caller and tolerates a busy dependency; here the service's
//!   own latency is what is protected, and every 10 % of it the lower classes add is paid by the
//!   critical requests too. `Gradient` settles with `sqrt(limit)` requests queued, 1.4 to 1.7
//!   times the baseline latency at the limits this service needs, which the critical requests'
//!   p99 cannot afford. The baseline is the lowest latency of the round trips run with at most
//!   the minimum limit in flight over two periods of 300 round trips, probed
//!   for at the minimum limit when there was none
//!   ([`Aimd::probe_every`](crate::bulkhead::adaptive::Aimd::probe_every)), so that a flood from
//!   the start does not pass its own queueing off as the service's latency.
//! * [`Limits`](crate::bulkhead::adaptive::Limits) from 8 to 1000, starting at 16. The minimum
//!   is at most what the service serves at full speed (above it, the lower classes are admitted
//!   into queueing). Far below it, critical requests borrowing above the minimum keep a probe's
//!   round trips crowded, and the probe ends after 10 of them with the lowest: a baseline
//!   measured under some load (in a simulation of the example with `CAPACITY=32`, a goodput of
//!   85 % at 4 and 10 times the capacity, critical requests 99.4 %). The limit grows by one
//!   request a round trip, so a service that serves many more than 16 at full speed sheds some
//!   of its lower classes in its first seconds under load.
//! * `Critical` borrows up to 3 times the limit: a limit
//!   that keeps the lower classes at no-load latency is far too low for a burst of critical
//!   requests, which arrive at random; 3 times the limit serves them at most about 3 times
//!   slower, and sheds the rare burst beyond.
//! * Guarantees: 0.3 of the limit for `Critical` and a tenth
//!   for `Default`: under a flood the lower classes keep to 0.7
//!   and 0.6 of the limit, leaving the rest for critical requests before they need to borrow.
//! * No queue; every request is `Default`.
//!
//! # Watching it
//!
//! [`Overload::limit`], [`Overload::in_flight`] and [`Overload::ceiling`]. With the `metrics`
//! feature, gauges of the limit, the requests in flight and the queue, and counters of the
//! requests admitted and shed by class (see [the metric names](crate::observe#metric-names)). A
//! `tracing` debug event for each shed request and each move of the limit.

mod answer;
mod builder;
#[cfg(feature = "metrics")]
mod metrics;
mod service;
mod state;

#[cfg(feature = "config")]
pub(crate) use builder::{default_algorithm, DEFAULT_LIMITS};
pub use builder::{Overload, OverloadBuilder};
pub use service::{OverloadBody, OverloadLayer, OverloadService};

/// How important a request is: lower classes are shed first.
///
/// Ordered: `Sheddable < Default < Critical`.
///
/// ```
/// use tower_bulwark::overload::Priority;
///
/// assert!(Priority::Critical > Priority::Default);
/// assert_eq!(Priority::from_header_value("CRITICAL"), Priority::Critical);
/// assert_eq!("sheddable".parse(), Ok(Priority::Sheddable));
/// assert_eq!(Priority::from_header_value("urgent!"), Priority::Default);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Shed first: prefetching, batch work, anything retried later at no cost.
    Sheddable,
    /// Everything not marked otherwise.
    #[default]
    Default,
    /// Shed last, with a guaranteed share of the limit: health checks, checkouts.
    Critical,
}

impl Priority {
    /// Every class, highest first, in the order of their indexes.
    pub(crate) const ALL: [Priority; 3] =
        [Priority::Critical, Priority::Default, Priority::Sheddable];

    /// The class a header value names, `critical`, `default` or `sheddable` in any case;
    /// anything else is `Default`.
    pub fn from_header_value(value: &str) -> Self {
        value.parse().unwrap_or_default()
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Priority::Critical => 0,
            Priority::Default => 1,
            Priority::Sheddable => 2,
        }
    }

    /// The name of the class, as metrics and events label it, and as it is parsed.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Default => "default",
            Priority::Sheddable => "sheddable",
        }
    }
}

impl std::str::FromStr for Priority {
    type Err = UnknownPriority;

    /// `critical`, `default` or `sheddable`, in any case.
    fn from_str(value: &str) -> Result<Self, UnknownPriority> {
        let value = value.trim();
        let named = |class: &Priority| value.eq_ignore_ascii_case(class.as_str());
        Priority::ALL.into_iter().find(named).ok_or(UnknownPriority)
    }
}

/// A name that is none of `critical`, `default` and `sheddable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownPriority;

impl std::fmt::Display for UnknownPriority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a priority is one of critical, default and sheddable")
    }
}

impl std::error::Error for UnknownPriority {}
