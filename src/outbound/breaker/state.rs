//! The state every clone of one breaker shares, under one mutex: closed with its window of
//! outcomes, open until an instant, or half-open with its probes; and the [`Ticket`] of one
//! admitted call, which reports its outcome once, when it is dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::builder::{BreakerState, Settings, Window};
use super::error::BreakerOpen;
use super::metrics::{BreakerMetrics, Outcome};
use crate::bulkhead::adaptive::future::Report;
use crate::bulkhead::adaptive::Verdict;
use crate::clock::{saturating_nanos, Clock, MAX_NOW};
use crate::sync::{lock, Mutex, MutexGuard};
use crate::waited::{Span, Waits};

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Counted calls: all of them, the failed ones, the slow ones (failed or not).
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    calls: u64,
    failures: u64,
    slow: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.calls += other.calls;
        self.failures += other.failures;
        self.slow += other.slow;
    }

    fn remove(&mut self, other: Tally) {
        self.calls -= other.calls;
        self.failures -= other.failures;
        self.slow -= other.slow;
    }

    fn rates(&self) -> (f64, f64) {
        let calls = self.calls.max(1) as f64;
        (self.failures as f64 / calls, self.slow as f64 / calls)
    }

    /// Whether either rate reaches its threshold.
    fn trips(&self, settings: &Settings) -> bool {
        let (failures, slow) = self.rates();
        failures >= settings.failure_rate || slow >= settings.slow_call_rate
    }
}

/// The outcomes of a closed breaker, in buckets keyed by call number (a count window: one call
/// each) or by whole second (a time window); a bucket whose key is `size` or more behind the
/// newest leaves the window.
#[derive(Debug, Default)]
struct Outcomes {
    buckets: VecDeque<(u64, Tally)>,
    total: Tally,
    calls: u64,
}

impl Outcomes {
    fn record(&mut self, window: Window, now: u64, call: Tally) {
        self.calls += 1;
        let (key, size) = match window {
            Window::Calls(n) => (self.calls, n),
            Window::Seconds(n) => (now / NANOS_PER_SECOND, n),
        };
        while let Some(&(oldest, tally)) = self.buckets.front() {
            if oldest + u64::from(size) > key {
                break;
            }
            self.total.remove(tally);
            self.buckets.pop_front();
        }
        match self.buckets.back_mut() {
            Some((newest, tally)) if *newest == key => tally.add(call),
            _ => self.buckets.push_back((key, call)),
        }
        self.total.add(call);
    }
}

#[derive(Debug)]
enum Phase {
    Closed(Outcomes),
    Open { until: u64 },
    HalfOpen { out: u32, ended: Tally },
}

struct Inner {
    phase: Phase,
    /// Moved on at each transition: an outcome counts only in the phase its call was admitted
    /// in (a call admitted while closed that ends after the breaker opened is no probe).
    epoch: u64,
}

/// One breaker: its settings, clock, state and counters.
pub(crate) struct Shared {
    pub(super) name: Arc<str>,
    pub(super) settings: Settings,
    clock: Box<dyn Clock>,
    inner: Mutex<Inner>,
    metrics: BreakerMetrics,
}

impl Shared {
    pub(super) fn new(name: Arc<str>, settings: Settings, clock: Box<dyn Clock>) -> Self {
        let inner = Inner {
            phase: Phase::Closed(Outcomes::default()),
            epoch: 0,
        };
        Self {
            metrics: BreakerMetrics::default(),
            name,
            settings,
            clock,
            inner: Mutex::new(inner),
        }
    }

    /// The state, with the clock read under the lock so that instants are seen in order. An
    /// open breaker whose time is up half-opens here.
    fn lock(&self) -> (MutexGuard<'_, Inner>, u64) {
        // Every change below is made whole before anything can panic: a poisoned lock still
        // guards a consistent state.
        let mut inner = lock(&self.inner);
        // Readings past `MAX_NOW` stand still there, as everywhere in the crate: an open
        // breaker stays open rather than its `until` wrapping.
        let now = self.clock.now().min(MAX_NOW);
        if matches!(inner.phase, Phase::Open { until } if now >= until) {
            let probes = Phase::HalfOpen {
                out: 0,
                ended: Tally::default(),
            };
            self.transition(&mut inner, probes, now, Tally::default());
        }
        (inner, now)
    }

    pub(super) fn state(&self) -> BreakerState {
        match self.lock().0.phase {
            Phase::Closed(_) => BreakerState::Closed,
            Phase::Open { until } => BreakerState::Open {
                until: Duration::from_nanos(until),
            },
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Admits a call (its ticket) or refuses it.
    pub(super) fn admit(self: &Arc<Self>) -> Result<Ticket, BreakerOpen> {
        let (mut inner, now) = self.lock();
        let epoch = inner.epoch;
        let retry_after = match &mut inner.phase {
            Phase::Closed(_) => None,
            Phase::Open { until } => Some(*until - now),
            Phase::HalfOpen { out, ended } => {
                let free = u64::from(*out) + ended.calls < u64::from(self.settings.half_open_calls);
                *out += u32::from(free);
                (!free).then(|| saturating_nanos(self.settings.open_for))
            }
        };
        drop(inner);
        if let Some(nanos) = retry_after {
            self.metrics.count(&self.name, Outcome::Refused);
            let retry_after = Duration::from_nanos(nanos);
            return Err(BreakerOpen::new(Arc::clone(&self.name), retry_after));
        }
        Ok(Ticket {
            shared: Arc::clone(self),
            epoch,
            started: now,
            waits: Waits::default(),
            verdict: Verdict::Ignored,
        })
    }

    /// Counts the end of a call admitted in `epoch` at `started`, and moves the breaker if the
    /// counts say so.
    fn end(&self, epoch: u64, started: u64, verdict: Verdict) {
        let (mut inner, now) = self.lock();
        let slow = now.saturating_sub(started) > saturating_nanos(self.settings.slow_call_duration);
        let call = Tally {
            calls: u64::from(verdict != Verdict::Ignored),
            failures: u64::from(verdict == Verdict::Overloaded),
            slow: u64::from(slow && verdict != Verdict::Ignored),
        };
        let settings = &self.settings;
        let current = epoch == inner.epoch;
        let next = match &mut inner.phase {
            _ if !current => None,
            Phase::Closed(outcomes) if call.calls == 1 => {
                outcomes.record(settings.window, now, call);
                let total = outcomes.total;
                let due = total.calls >= u64::from(settings.minimum_calls) && total.trips(settings);
                due.then(|| (self.opened(now), total))
            }
            Phase::HalfOpen { out, ended } => {
                *out -= 1;
                ended.add(call);
                let ended = *ended;
                (ended.calls == u64::from(settings.half_open_calls)).then(|| {
                    match ended.trips(settings) {
                        true => (self.opened(now), ended),
                        false => (Phase::Closed(Outcomes::default()), ended),
                    }
                })
            }
            Phase::Closed(_) | Phase::Open { .. } => None,
        };
        if let Some((phase, tally)) = next {
            self.transition(&mut inner, phase, now, tally);
        }
        drop(inner);
        if call.calls == 1 {
            let outcome = match (call.failures, call.slow) {
                (1, _) => Outcome::Failure,
                (_, 1) => Outcome::Slow,
                _ => Outcome::Success,
            };
            self.metrics.count(&self.name, outcome);
        }
    }

    fn opened(&self, now: u64) -> Phase {
        // At most 2^62 + 2^60 ns: no overflow.
        let until = now + saturating_nanos(self.settings.open_for);
        Phase::Open { until }
    }

    /// Moves to `phase`, with an event saying why (the rates of `tally`).
    fn transition(&self, inner: &mut Inner, phase: Phase, now: u64, tally: Tally) {
        inner.epoch += 1;
        let (from, _) = label(&inner.phase);
        inner.phase = phase;
        let (to, gauge) = label(&inner.phase);
        let (failure_rate, slow_call_rate) = tally.rates();
        let name = &*self.name;
        match inner.phase {
            Phase::Open { until } => tracing::warn!(
                target: "tower_bulwark::breaker", breaker = name, from, to, calls = tally.calls,
                failure_rate, slow_call_rate, open_for = ?Duration::from_nanos(until - now),
                until = ?Duration::from_nanos(until), "circuit breaker opened"
            ),
            _ => tracing::info!(
                target: "tower_bulwark::breaker", breaker = name, from, to, calls = tally.calls,
                failure_rate, slow_call_rate, "circuit breaker is {to}"
            ),
        }
        self.metrics.state(&self.name, gauge);
    }

    #[cfg(feature = "metrics")]
    pub(super) fn publish_state(&self) {
        let (_, gauge) = label(&self.lock().0.phase);
        self.metrics.state(&self.name, gauge);
    }
}

/// The state's name in events, and its value in the state gauge.
fn label(phase: &Phase) -> (&'static str, u8) {
    match phase {
        Phase::Closed(_) => ("closed", 0),
        Phase::Open { .. } => ("open", 1),
        Phase::HalfOpen { .. } => ("half-open", 2),
    }
}

/// One admitted call. Dropped, it reports its verdict, once: [`Verdict::Ignored`] unless the
/// call's future set another, so a call dropped before its answer (or that panicked) counts
/// for nothing and a probe frees its place.
pub struct Ticket {
    shared: Arc<Shared>,
    epoch: u64,
    started: u64,
    /// Its waits in the layers below, taken out of its time.
    waits: Waits,
    verdict: Verdict,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").finish_non_exhaustive()
    }
}

impl Report for Ticket {
    /// The call is timed without its waits below.
    fn waited(&mut self, spans: &[Span]) {
        let now = self.shared.clock.now().min(MAX_NOW);
        self.waits.add(spans, self.started, now);
    }

    fn end(mut self, verdict: Verdict, _ok: bool) {
        self.verdict = verdict;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let started = self.started.saturating_add(self.waits.total());
        self.shared.end(self.epoch, started, self.verdict);
    }
}
