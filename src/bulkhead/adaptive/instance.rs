//! One named adaptive bulkhead: its permits, its algorithm and its current limit.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::classify::Verdict;
use super::layer::AdaptiveBulkheadLayer;
use super::limit::{Aimd, Dyn, LimitAlgorithm, Limits, Sample};
use crate::bulkhead::{
    Bulkhead, BulkheadBuilder, BulkheadSnapshot, CallFinished, CallPermitted, CallRejected,
};
use crate::clock::{Clock, SystemClock};

/// The limit of an adaptive bulkhead moved.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct LimitChanged<'a> {
    /// The name of the bulkhead.
    pub bulkhead: &'a str,
    /// The limit before.
    pub from: usize,
    /// The limit now.
    pub to: usize,
    /// The sample that moved it.
    pub sample: &'a Sample,
}

/// Hook run when an adaptive limit moves.
type OnLimitChanged = Box<dyn Fn(&LimitChanged<'_>) + Send + Sync>;

struct Control {
    algorithm: Dyn,
    limits: Limits,
}

pub(super) struct Shared {
    pub(super) bulkhead: Bulkhead,
    clock: Box<dyn Clock>,
    /// Calls holding a permit; raised after the permit is taken and lowered before it is given
    /// back, so it never counts more than the semaphore does.
    in_flight: AtomicUsize,
    limit: AtomicUsize,
    control: Mutex<Control>,
    /// What a call dropped before its end counts as.
    cancelled: Verdict,
    on_limit_changed: Option<OnLimitChanged>,
    #[cfg(feature = "metrics")]
    gauge: std::sync::OnceLock<metrics::Gauge>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Control> {
        // A hook or an algorithm that panicked leaves the limit as it was: still consistent.
        self.control.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn nanos(&self) -> u64 {
        self.clock.now()
    }

    /// Feeds one sample to the algorithm and applies the limit it returns.
    fn record(&self, started: u64, in_flight: usize, admitted_under: usize, overloaded: bool) {
        let mut control = self.lock();
        // Read under the lock, so that the algorithm sees the instants of a monotonic clock in
        // order: a sample read before another but recorded after it would otherwise look like a
        // clock that went back, and start its round again.
        let now = self.nanos();
        let from = self.limit.load(Ordering::Relaxed);
        let sample = Sample::new(
            Duration::from_nanos(now),
            Duration::from_nanos(now.saturating_sub(started)),
            in_flight,
            from,
        )
        .admitted_under(admitted_under)
        .overloaded(overloaded);
        let Control { algorithm, limits } = &mut *control;
        let to = limits.clamp(algorithm.0.update(&sample, limits));
        if to == from {
            return;
        }
        self.limit.store(to, Ordering::Relaxed);
        self.bulkhead.set_max_concurrent_calls(to);
        #[cfg(feature = "metrics")]
        self.publish_limit(to);
        if let Some(hook) = &self.on_limit_changed {
            hook(&LimitChanged {
                bulkhead: self.bulkhead.name(),
                from,
                to,
                sample: &sample,
            });
        }
    }

    #[cfg(feature = "metrics")]
    fn publish_limit(&self, limit: usize) {
        self.gauge
            .get_or_init(|| {
                metrics::gauge!(
                    crate::observe::metric_names::BULKHEAD_MAX,
                    "name" => self.bulkhead.name().to_owned()
                )
            })
            .set(limit as f64);
    }
}

/// The sample of one admitted call, taken when it ends: by [`finish`](Self::finish) with the
/// classifier's verdict, or, when it is dropped first, as a cancelled call (or, while the thread
/// unwinds from a panic or after a panic in its future or classifier, as no sample at all).
pub(super) struct Sampler {
    shared: Arc<Shared>,
    started: u64,
    in_flight: usize,
    /// The limit in force when the call was admitted.
    admitted_under: usize,
    /// Set while the call's future or the classifier runs: dropped in that state, the call
    /// panicked (the panic was caught above and the future dropped after the unwinding).
    pub(super) in_poll: bool,
    /// Set at the call's first poll: a call dropped before it never reached the dependency
    /// (its future had not started), so it says nothing about it.
    pub(super) polled: bool,
    ended: bool,
}

impl Sampler {
    /// Called right after the permit was taken.
    pub(super) fn start(shared: Arc<Shared>) -> Self {
        let in_flight = shared.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        let admitted_under = shared.limit.load(Ordering::Relaxed);
        let started = shared.nanos();
        Self {
            shared,
            started,
            in_flight,
            admitted_under,
            in_poll: false,
            polled: false,
            ended: false,
        }
    }

    /// Ends the call with `verdict`.
    pub(super) fn finish(mut self, verdict: Verdict) {
        self.end(verdict);
    }

    fn end(&mut self, verdict: Verdict) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let shared = &*self.shared;
        shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        match verdict {
            Verdict::Healthy => {
                shared.record(self.started, self.in_flight, self.admitted_under, false)
            }
            Verdict::Overloaded => {
                shared.record(self.started, self.in_flight, self.admitted_under, true)
            }
            Verdict::Ignored => {}
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        let verdict = if self.in_poll || !self.polled || std::thread::panicking() {
            Verdict::Ignored
        } else {
            self.shared.cancelled
        };
        self.end(verdict);
    }
}

impl fmt::Debug for Sampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sampler")
            .field("bulkhead", &self.shared.bulkhead.name())
            .finish_non_exhaustive()
    }
}

/// A named bulkhead whose limit of concurrent calls follows the dependency, shared by every
/// clone and every service made from it.
///
/// Build one per dependency with [`AdaptiveBulkhead::builder`], keep a clone to read
/// [`limit`](Self::limit) or [`snapshot`](Self::snapshot), and wrap the client with
/// [`layer`](Self::layer).
#[derive(Clone)]
pub struct AdaptiveBulkhead {
    pub(super) shared: Arc<Shared>,
}

impl AdaptiveBulkhead {
    /// A builder for an adaptive bulkhead named `name`: [`Aimd`] between the default
    /// [`Limits`] (1 to 256, starting at 8) on the [`SystemClock`], until told otherwise.
    pub fn builder(name: impl Into<Arc<str>>) -> AdaptiveBulkheadBuilder {
        let limits = Limits::default();
        AdaptiveBulkheadBuilder {
            inner: Bulkhead::semaphore(name, limits.initial()),
            limits,
            algorithm: Dyn(Box::new(Aimd::default())),
            clock: Box::new(SystemClock::new()),
            cancelled: Verdict::Overloaded,
            on_limit_changed: None,
        }
    }

    /// The bulkhead's name, as given to its builder.
    pub fn name(&self) -> &str {
        self.shared.bulkhead.name()
    }

    /// The current limit of concurrent calls.
    pub fn limit(&self) -> usize {
        self.shared.limit.load(Ordering::Relaxed)
    }

    /// The bounds the limit moves within.
    pub fn limits(&self) -> Limits {
        self.shared.lock().limits
    }

    /// The current figures: free permits, the current limit (`max_allowed_concurrent_calls`) and
    /// the running totals of permitted, refused and finished calls.
    pub fn snapshot(&self) -> BulkheadSnapshot {
        self.shared.bulkhead.snapshot()
    }

    /// Sets this bulkhead's gauges in the `metrics` facade from its current state (the limit
    /// gauge is also set each time the limit moves).
    #[cfg(feature = "metrics")]
    pub fn publish_gauges(&self) {
        self.shared.bulkhead.publish_gauges();
    }

    /// A layer judging answers with [`HttpOverload`](super::HttpOverload); change it with
    /// [`AdaptiveBulkheadLayer::classifier`].
    pub fn layer(&self) -> AdaptiveBulkheadLayer {
        AdaptiveBulkheadLayer::new(self.clone())
    }

    /// A layer judging answers with `classifier`.
    pub fn layer_with<C>(&self, classifier: C) -> AdaptiveBulkheadLayer<C> {
        self.layer().classifier(classifier)
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
    algorithm: Dyn,
    clock: Box<dyn Clock>,
    cancelled: Verdict,
    on_limit_changed: Option<OnLimitChanged>,
}

impl AdaptiveBulkheadBuilder {
    /// The bounds and starting point of the limit (default: 1 to 256, starting at 8).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The algorithm that moves the limit (default: [`Aimd`]).
    pub fn algorithm(mut self, algorithm: impl LimitAlgorithm) -> Self {
        self.algorithm = Dyn(Box::new(algorithm));
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
    /// The default suits the documented order, `retry → timeout → pushback → client quota →
    /// adaptive bulkhead → client`, in which a timeout reaches the bulkhead only as a dropped
    /// call. Ignore them when calls are
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
        self.on_limit_changed = Some(match self.on_limit_changed.take() {
            Some(earlier) => Box::new(move |event: &LimitChanged<'_>| {
                earlier(event);
                hook(event);
            }),
            None => Box::new(hook),
        });
        self
    }

    /// Runs `hook` each time a call gets a permit (see [`crate::bulkhead::events`]).
    pub fn on_call_permitted(
        mut self,
        hook: impl Fn(&CallPermitted<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.inner = self.inner.on_call_permitted(hook);
        self
    }

    /// Runs `hook` each time a call is refused.
    pub fn on_call_rejected(
        mut self,
        hook: impl Fn(&CallRejected<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.inner = self.inner.on_call_rejected(hook);
        self
    }

    /// Runs `hook` each time a permitted call ends, after its sample has been taken and before
    /// its permit is given back.
    pub fn on_call_finished(
        mut self,
        hook: impl Fn(&CallFinished<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.inner = self.inner.on_call_finished(hook);
        self
    }

    /// Builds the bulkhead. With the `metrics` feature it counts its calls like any bulkhead and
    /// sets the limit gauge (`bulwark_bulkhead_max_allowed_concurrent_calls`) as the limit moves.
    pub fn build(self) -> AdaptiveBulkhead {
        let bulkhead = self.inner.build();
        let initial = self.limits.initial();
        bulkhead.set_max_concurrent_calls(initial);
        let shared = Shared {
            bulkhead,
            clock: self.clock,
            in_flight: AtomicUsize::new(0),
            limit: AtomicUsize::new(initial),
            control: Mutex::new(Control {
                algorithm: self.algorithm,
                limits: self.limits,
            }),
            cancelled: self.cancelled,
            on_limit_changed: self.on_limit_changed,
            #[cfg(feature = "metrics")]
            gauge: std::sync::OnceLock::new(),
        };
        AdaptiveBulkhead {
            shared: Arc::new(shared),
        }
    }
}

impl fmt::Debug for AdaptiveBulkheadBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveBulkheadBuilder")
            .field("inner", &self.inner)
            .field("limits", &self.limits)
            .field("algorithm", &self.algorithm)
            .field("cancelled", &self.cancelled)
            .field("on_limit_changed", &self.on_limit_changed.is_some())
            .finish_non_exhaustive()
    }
}
