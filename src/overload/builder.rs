//! The handle of one overload protection, its builder, and the error of a bad setting.

use std::fmt;

use crate::setting::{ensure, SettingError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::service::OverloadLayer;
use super::state::{PriorityBy, QueueSettings, Shared};
use super::Priority;
use crate::bulkhead::adaptive::{Aimd, LimitAlgorithm, Limits};
use crate::clock::{Clock, SystemClock};
use crate::head::RequestHead;

/// The guarantee of `Critical` by default: the share of the limit lower classes never take.
const DEFAULT_CRITICAL_GUARANTEE: f64 = 0.3;
/// The guarantee of `Default` by default: the share of the limit `Sheddable` never takes.
const DEFAULT_DEFAULT_GUARANTEE: f64 = 0.1;

/// A named overload protection: one adaptive limit of requests in flight for a whole service,
/// shared by every clone and every service made from it. See the [module docs](super).
#[derive(Clone)]
pub struct Overload {
    pub(super) shared: Arc<Shared>,
}

/// The limits by default (minimum, initial, maximum), the builder's and the config file's: from
/// 8 to 1000, starting at 16.
pub(crate) const DEFAULT_LIMITS: [u32; 3] = [8, 16, 1000];

/// [`DEFAULT_LIMITS`] as the builder holds them.
fn default_limits() -> Limits {
    let [min, initial, max] = DEFAULT_LIMITS.map(|n| n as usize);
    Limits::new(min, initial, max).unwrap_or_default()
}

impl Overload {
    /// A builder for a protection named `name`, with the defaults the [module
    /// docs](super#defaults) give.
    pub fn builder(name: impl Into<Arc<str>>) -> OverloadBuilder {
        // By class, in the order of `Priority::ALL`.
        let guarantees = [DEFAULT_CRITICAL_GUARANTEE, DEFAULT_DEFAULT_GUARANTEE, 0.0];
        OverloadBuilder {
            name: name.into(),
            limits: default_limits(),
            algorithm: Box::new(default_algorithm(PROBE_EVERY).unwrap_or_default()),
            priority_by: Box::new(|_: &RequestHead<'_>| Priority::Default),
            guarantees,
            borrowing: DEFAULT_CRITICAL_BORROWING,
            queue: None,
            clock: Box::new(SystemClock::new()),
        }
    }

    /// The protection's name, as given to its builder.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The current limit of requests in flight, all classes together, which only `Critical` may
    /// go above ([`OverloadBuilder::critical_borrowing`]).
    pub fn limit(&self) -> usize {
        self.shared.limit.load(Ordering::Relaxed)
    }

    /// The requests in flight now: admitted, and whose response body has not ended.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The most requests in flight, all classes together, under which a request of `class` is
    /// admitted while the limit is what it is now.
    pub fn ceiling(&self, class: Priority) -> usize {
        self.shared.ceiling(class, self.limit())
    }

    /// A layer for HTTP services (axum routers and routes among them).
    pub fn layer(&self) -> OverloadLayer {
        OverloadLayer {
            overload: self.clone(),
        }
    }
}

impl fmt::Debug for Overload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Overload")
            .field("name", &self.name())
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

/// The algorithm by default: [`Aimd`] with a latency tolerance of 1.1, its baseline from periods
/// of `probe_every` round trips (300 by default).
pub(crate) fn default_algorithm(probe_every: u32) -> Result<Aimd, SettingError> {
    Aimd::default()
        .latency_tolerance(1.1)?
        .probe_every(probe_every)
}

/// The period of the default algorithm's baseline, in round trips ([`Aimd::probe_every`]).
const PROBE_EVERY: u32 = 300;

/// How far `Critical` may go above the limit by default: its ceiling is 3 times the limit.
const DEFAULT_CRITICAL_BORROWING: f64 = 3.0;

/// Settings of an [`Overload`] not built yet; every method consumes and returns the builder.
#[must_use = "a builder does nothing until `build` is called"]
pub struct OverloadBuilder {
    pub(super) name: Arc<str>,
    pub(super) limits: Limits,
    pub(super) algorithm: Box<dyn LimitAlgorithm>,
    pub(super) priority_by: PriorityBy,
    /// By class (by [`Priority::index`]), the share of the limit kept for it and those above.
    pub(super) guarantees: [f64; 3],
    pub(super) borrowing: f64,
    pub(super) queue: Option<QueueSettings>,
    pub(super) clock: Box<dyn Clock>,
}

impl OverloadBuilder {
    /// The bounds and starting point of the limit (default: 8 to 1000, starting at 16).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The algorithm that moves the limit (default: [`Aimd`] with a latency tolerance of 1.1 and
    /// its baseline probed for every 300 round trips).
    pub fn algorithm(mut self, algorithm: impl LimitAlgorithm) -> Self {
        self.algorithm = Box::new(algorithm);
        self
    }

    /// How a request's class is found (default: every request is [`Priority::Default`]).
    pub fn priority_by(
        mut self,
        priority_by: impl Fn(&RequestHead<'_>) -> Priority + Send + Sync + 'static,
    ) -> Self {
        self.priority_by = Box::new(priority_by);
        self
    }

    /// Keeps `share` of the limit for `class` and the classes above it: the classes below never
    /// take it (defaults: 0.3 for `Critical`, 0.1 for `Default`). It is kept in whole requests,
    /// the share of the limit rounded to the nearest but at most all places but one: each class
    /// keeps at least one, so that none is shed for good (a guarantee of 0.5 keeps nothing at a
    /// limit of 1, and 0.95 keeps 7 of 8). `share` is at least 0 and the
    /// guarantees together stay below 1, checked as each is set against the others as they
    /// stand (to move share from one class to another, lower one first); `Sheddable` has no
    /// class below it, so it takes none.
    pub fn guarantee(mut self, class: Priority, share: f64) -> Result<Self, SettingError> {
        let what = "at least 0 and below 1";
        ensure(OF, (0.0..1.0).contains(&share), "guarantee", share, what)?;
        let lowest = "0 for sheddable, which has no class below it";
        let sheddable_takes_none = class != Priority::Sheddable || share == 0.0;
        ensure(OF, sheddable_takes_none, "guarantee", share, lowest)?;
        self.guarantees[class.index()] = share;
        let total: f64 = self.guarantees.iter().sum();
        let together = "below 1 for all classes together";
        ensure(OF, total < 1.0, "guarantee", total, together)?;
        Ok(self)
    }

    /// How far `Critical` may go above the limit: its ceiling is `factor` times the limit,
    /// rounded (default 3; 1 holds it at the limit). At least 1
    /// and at most 100.
    ///
    /// The limit follows the latency of every class, so it settles where the service is barely
    /// busier than at its no-load latency; a burst of critical requests above it is better
    /// served slower than shed. On a service that shares its processors, `factor` times the
    /// limit in flight runs about `factor` times slower: the factor bounds how slow a burst of
    /// critical requests may make the service before they too are shed.
    pub fn critical_borrowing(mut self, factor: f64) -> Result<Self, SettingError> {
        let ok = (1.0..=100.0).contains(&factor);
        ensure(OF, ok, "critical_borrowing", factor, "from 1 to 100")?;
        self.borrowing = factor;
        Ok(self)
    }

    /// Lets a request that finds its class's ceiling reached wait, instead of being shed at once:
    /// at most `capacity` wait, highest class first and then in arrival order, each for at most
    /// `max_wait` (on tokio's clock) from its call, however late its future is first polled
    /// (answered at the timer's next millisecond: tokio's timer rounds a deadline up to one). A
    /// full queue sheds a waiter still in it a millisecond after its `max_wait` (whatever kept
    /// its timer from taking it out), then its lowest-class waiter for a newcomer of a higher
    /// class, else the newcomer; a slot freed goes to a waiter until then, as a bulkhead's
    /// permit does. Off by default; `max_wait` at most a minute.
    pub fn queue(mut self, capacity: usize, max_wait: Duration) -> Result<Self, SettingError> {
        let within = max_wait <= Duration::from_secs(60);
        ensure(OF, within, "max_wait", max_wait, "at most 60 s")?;
        self.queue = Some(QueueSettings { capacity, max_wait });
        Ok(self)
    }

    /// The clock latencies are measured with (default: [`SystemClock`]); a
    /// [`ManualClock`](crate::clock::ManualClock) makes tests exact.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Builds the protection.
    pub fn build(self) -> Overload {
        Overload {
            shared: Arc::new(Shared::new(self)),
        }
    }
}

impl fmt::Debug for OverloadBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadBuilder")
            .field("name", &self.name)
            .field("limits", &self.limits)
            .field("guarantees", &self.guarantees)
            .field("borrowing", &self.borrowing)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

/// What this builder builds, in its errors.
const OF: &str = "overload";
