//! What moves an adaptive bulkhead's limit: each call's sample, fed to the algorithm under a
//! lock, and the limit it returns applied to the bulkhead's permits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::classify::Verdict;
use super::future::Report;
use super::limit::{LimitAlgorithm, Limits, Sample};
use crate::bulkhead::permits::Permit;
use crate::bulkhead::{Bulkhead, CallOutcome};
use crate::clock::Clock;
use crate::sync::{lock, Mutex};
use crate::waited::{Span, Waits};

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
pub(super) type OnLimitChanged = Box<dyn Fn(&LimitChanged<'_>) + Send + Sync>;

/// The state every clone of one adaptive bulkhead shares.
pub(super) struct Controller {
    pub(super) bulkhead: Bulkhead,
    pub(super) clock: Box<dyn Clock>,
    /// Calls holding a permit; raised after the permit is taken and lowered before it is given
    /// back, so it never counts more than the bulkhead's permits do.
    pub(super) in_flight: AtomicUsize,
    pub(super) limit: AtomicUsize,
    /// The bounds the algorithm moves the limit within.
    pub(super) limits: Limits,
    pub(super) algorithm: Mutex<Box<dyn LimitAlgorithm>>,
    /// What a call dropped before its end counts as.
    pub(super) cancelled: Verdict,
    pub(super) on_limit_changed: Vec<OnLimitChanged>,
    #[cfg(feature = "metrics")]
    pub(super) gauge: std::sync::OnceLock<metrics::Gauge>,
}

impl Controller {
    /// Feeds the sample of `call` to the algorithm and applies the limit it returns.
    fn record(&self, call: &Sampler, overloaded: bool) {
        // A hook or an algorithm that panicked leaves the limit as it was: still consistent.
        let mut algorithm = lock(&self.algorithm);
        let from = self.limit.load(Ordering::Relaxed);
        // The clock is read under the lock, so that the algorithm sees the instants of a
        // monotonic clock in order: a sample read before another but recorded after it would
        // otherwise look like a clock that went back, and start its round again.
        let sample = Sample::ended(&*self.clock, call.started, call.in_flight, from)
            .admitted_under(call.admitted_under)
            .overloaded(overloaded);
        let limits = &self.limits;
        let to = limits.clamp(algorithm.update(&sample, limits));
        if to == from {
            return;
        }
        self.limit.store(to, Ordering::Relaxed);
        self.bulkhead.set_max_concurrent_calls(to);
        #[cfg(feature = "metrics")]
        self.publish_limit(to);
        for hook in &self.on_limit_changed {
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

/// One admitted call: its permit and its sample, taken when it ends, with the classifier's
/// verdict given to [`end`](Report::end), or, when it is dropped first, as a cancelled call
/// (or, while the thread unwinds from a panic or after a panic in its future or classifier, as no
/// sample at all). The sample is taken, and the limit moved, before the permit is given back.
pub struct Sampler {
    controller: Arc<Controller>,
    started: u64,
    /// Its waits in the layers below, taken out of its latency.
    waits: Waits,
    in_flight: usize,
    /// The limit in force when the call was admitted.
    admitted_under: usize,
    /// Set at the call's first poll: a call dropped before it never reached the dependency
    /// (its future had not started), so it says nothing about it.
    polled: bool,
    verdict: Option<Verdict>,
    /// Left at `Panicked` while the call's future runs: dropped in that state, the call panicked
    /// (the panic was caught above and the future dropped after the unwinding).
    permit: Permit,
}

impl Sampler {
    /// Called right after `permit` was taken, before the inner service's `call` runs: the
    /// permit reports `Panicked` until it returns ([`Report::pending`]).
    pub(super) fn start(controller: Arc<Controller>, mut permit: Permit) -> Self {
        permit.outcome = CallOutcome::Panicked;
        let in_flight = controller.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        let admitted_under = controller.limit.load(Ordering::Relaxed);
        let started = controller.clock.now();
        Self {
            controller,
            started,
            waits: Waits::default(),
            in_flight,
            admitted_under,
            polled: false,
            verdict: None,
            permit,
        }
    }
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").finish_non_exhaustive()
    }
}

impl Report for Sampler {
    fn polling(&mut self) {
        self.permit.outcome = CallOutcome::Panicked;
        self.polled = true;
    }

    fn pending(&mut self) {
        self.permit.outcome = CallOutcome::Cancelled;
    }

    /// The latency sampled is the dependency's: without the call's waits below.
    fn waited(&mut self, spans: &[Span]) {
        let now = self.controller.clock.now();
        self.waits.add(spans, self.started, now);
    }

    fn end(mut self, verdict: Verdict, ok: bool) {
        self.permit.outcome = if ok {
            CallOutcome::Success
        } else {
            CallOutcome::Failure
        };
        self.verdict = Some(verdict);
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        let panicked = self.permit.outcome == CallOutcome::Panicked || std::thread::panicking();
        let verdict = match self.verdict {
            Some(verdict) => verdict,
            None if panicked || !self.polled => Verdict::Ignored,
            None => self.controller.cancelled,
        };
        self.controller.in_flight.fetch_sub(1, Ordering::Relaxed);
        if verdict != Verdict::Ignored {
            self.started = self.started.saturating_add(self.waits.total());
            self.controller.record(self, verdict == Verdict::Overloaded);
        }
    }
}
