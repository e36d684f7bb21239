//! The handle of one named adaptive bulkhead, and its builder.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::classify::Verdict;
use super::controller::{Controller, LimitChanged, OnLimitChanged};
use super::layer::ClassifiedLayer;
use super::limit::{Aimd, LimitAlgorithm, Limits};
use crate::bulkhead::{Bulkhead, BulkheadBuilder, BulkheadSnapshot};
use crate::clock::{Clock, SystemClock};
use crate::sync::Mutex;

/// A named bulkhead whose limit of concurrent calls follows the dependency, shared by every
/// clone and every service made from it.
///
/// Build one per dependency with [`AdaptiveBulkhead::builder`], keep a clone to read
/// [`limit`](Self::limit) or [`snapshot`](Self::snapshot), and wrap the client with
/// [`layer`](Self::layer).
///
/// # Errors
///
/// Its services fail with [`BoxError`](crate::BoxError): a call that finds the limit reached
/// holds a [`BulkheadFull`](crate::bulkhead::BulkheadFull); any other error is the inner
/// service's. Building its [`Limits`] and algorithms checks their settings and returns an
/// [`SettingError`](crate::SettingError) for one out of range.
///
/// # Examples
///
/// ```
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_bulwark::bulkhead::adaptive::{AdaptiveBulkhead, Aimd, Limits};
/// use tower_bulwark::BoxError;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let payment = AdaptiveBulkhead::builder("payment")
///     .limits(Limits::new(2, 4, 64)?)
///     .algorithm(Aimd::default().backoff(0.5)?)
///     .build();
/// let client = ServiceBuilder::new()
///     .layer(payment.layer())
///     .service(service_fn(|_: ()| async {
///         Ok::<_, BoxError>(http::Response::new(()))
///     }));
/// client.oneshot(()).await?;
/// assert_eq!(payment.limit(), 4);
/// assert_eq!(payment.snapshot().total_finished, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AdaptiveBulkhead {
    pub(super) controller: Arc<Controller>,
}

impl AdaptiveBulkhead {
    /// A builder for an adaptive bulkhead named `name`: [`Aimd`] between the default
    /// [`Limits`] (1 to 256, starting at 8) on the [`SystemClock`], until told otherwise.
    pub fn builder(name: impl Into<Arc<str>>) -> AdaptiveBulkheadBuilder {
        let limits = Limits::default();
        AdaptiveBulkheadBuilder {
            inner: Bulkhead::semaphore(name, limits.initial()),
            limits,
            algorithm: Box::new(Aimd::default()),
            clock: Box::new(SystemClock::new()),
            cancelled: Verdict::Overloaded,
            on_limit_changed: Vec::new(),
        }
    }

    /// The bulkhead's name, as given to its builder.
    pub fn name(&self) -> &str {
        self.controller.bulkhead.name()
    }

    /// The current limit of concurrent calls.
    pub fn limit(&self) -> usize {
        self.controller.limit.load(Ordering::Relaxed)
    }

    /// The bounds the limit moves within.
    pub fn limits(&self) -> Limits {
        self.controller.limits
    }

    /// The current figures: free permits, the current limit (`max_allowed_concurrent_calls`) and
    /// the running totals of permitted, refused and finished calls.
    pub fn snapshot(&self) -> BulkheadSnapshot {
        self.controller.bulkhead.snapshot()
    }

    /// Sets this bulkhead's gauges in the `metrics` facade from its current state (the limit
    /// gauge is also set each time the limit moves).
    #[cfg(feature = "metrics")]
    pub fn publish_gauges(&self) {
        self.controller.bulkhead.publish_gauges();
    }

    /// A layer judging answers with [`HttpOverload`](super::HttpOverload); another classifier
    /// goes to [`layer_with`](Self::layer_with).
    pub fn layer(&self) -> ClassifiedLayer<Self> {
        self.layer_with(super::HttpOverload::default())
    }

    /// A layer judging answers with `classifier`.
    pub fn layer_with<C>(&self, classifier: C) -> ClassifiedLayer<Self, C> {
        ClassifiedLayer::new(self.clone(), classifier)
    }
}

impl fmt::Debug for AdaptiveBulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveBulkhead")
            .field("name", &self.name())
            .field("limit", &self.limit())
            .field("limits", &self.limits())
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

/// Settings of an [`AdaptiveBulkhead`] not built yet; every method consumes and returns the
/// builder.
#[must_use = "a builder does nothing until `build` is called"]
pub struct AdaptiveBulkheadBuilder {
    inner: BulkheadBuilder,
    limits: Limits,
    algorithm: Box<dyn LimitAlgorithm>,
    clock: Box<dyn Clock>,
    cancelled: Verdict,
    on_limit_changed: Vec<OnLimitChanged>,
}

impl AdaptiveBulkheadBuilder {
    /// The bounds and starting point of the limit (default: 1 to 256, starting at 8).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The algorithm that moves the limit (default: [`Aimd`]).
    pub fn algorithm(mut self, algorithm: impl LimitAlgorithm) -> Self {
        self.algorithm = Box::new(algorithm);
        self
    }

    /// The clock round trips are measured with (default: [`SystemClock`]); a
    /// [`ManualClock`](crate::clock::ManualClock) makes tests exact.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Calls dropped before their end (a timeout above the bulkhead, a `select!` that lost, a
    /// client that went away) are no sample at all, instead of the default: an overload signal.
    ///
    /// The default suits a timeout above the bulkhead (a deadline for the whole call), which
    /// reaches the bulkhead only as a dropped call. Ignore them when calls are
    /// often cancelled for reasons that have nothing to do with the dependency (hedged
    /// requests, say). A dropped call is never a healthy sample: its round trip is unknown.
    pub fn ignore_cancelled_calls(mut self) -> Self {
        self.cancelled = Verdict::Ignored;
        self
    }

    /// Runs `hook` each time the limit moves. Hooks added earlier keep running, before it.
    ///
    /// The hook runs under the bulkhead's lock of the algorithm, so the changes arrive in
    /// order; it must be quick and must not panic.
    pub fn on_limit_changed(
        mut self,
        hook: impl Fn(&LimitChanged<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.on_limit_changed.push(Box::new(hook));
        self
    }

    /// Adds call event hooks (see [`crate::bulkhead::events`]) to the bulkhead underneath:
    /// `hooks` gets its [`BulkheadBuilder`] and returns it with its
    /// [`on_call_permitted`](BulkheadBuilder::on_call_permitted),
    /// [`on_call_rejected`](BulkheadBuilder::on_call_rejected) and
    /// [`on_call_finished`](BulkheadBuilder::on_call_finished) hooks added (the last runs after
    /// the call's sample has been taken and before its permit is given back). Its
    /// [`max_wait`](BulkheadBuilder::max_wait) does not apply: an adaptive bulkhead never waits.
    ///
    /// ```
    /// use tower_bulwark::bulkhead::adaptive::AdaptiveBulkhead;
    /// use tower_bulwark::bulkhead::CallRejected;
    ///
    /// let payment = AdaptiveBulkhead::builder("payment")
    ///     .hooks(|events| {
    ///         events.on_call_rejected(|e: &CallRejected<'_>| eprintln!("{} is full", e.bulkhead))
    ///     })
    ///     .build();
    /// # drop(payment);
    /// ```
    pub fn hooks(mut self, hooks: impl FnOnce(BulkheadBuilder) -> BulkheadBuilder) -> Self {
        self.inner = hooks(self.inner);
        self
    }

    /// Builds the bulkhead. With the `metrics` feature it counts its calls like any bulkhead and
    /// sets the limit gauge (`bulwark_bulkhead_max_allowed_concurrent_calls`) as the limit moves.
    pub fn build(self) -> AdaptiveBulkhead {
        let bulkhead = self.inner.build();
        let initial = self.limits.initial();
        bulkhead.set_max_concurrent_calls(initial);
        let controller = Controller {
            bulkhead,
            clock: self.clock,
            in_flight: AtomicUsize::new(0),
            limit: AtomicUsize::new(initial),
            limits: self.limits,
            algorithm: Mutex::new(self.algorithm),
            cancelled: self.cancelled,
            on_limit_changed: self.on_limit_changed,
            #[cfg(feature = "metrics")]
            gauge: std::sync::OnceLock::new(),
        };
        AdaptiveBulkhead {
            controller: Arc::new(controller),
        }
    }
}

impl fmt::Debug for AdaptiveBulkheadBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveBulkheadBuilder")
            .field("inner", &self.inner)
            .field("limits", &self.limits)
            .field("cancelled", &self.cancelled)
            .field("on_limit_changed", &self.on_limit_changed.len())
            .finish_non_exhaustive()
    }
}
