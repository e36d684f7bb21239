//! One dependency's word on when to call it: [`Pushback`] and its builder.

use std::cmp::Reverse;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;

use super::advice::{self, Advice};
use super::layer::PushbackLayer;
use super::metrics::PushbackMetrics;
use crate::clock::saturating_nanos;
use crate::clock::{Clock, SystemClock};
use crate::head::ResponseHead;

/// The default [`max_hold`](PushbackBuilder::max_hold): ten minutes.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(600);

/// How calls are paced by the quota a dependency advertises (`r` calls left within `t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pacing {
    /// Calls go as they come while the advertised quota lasts; once it is spent, they are held
    /// until its window ends. The default.
    #[default]
    UntilSpent,
    /// As [`UntilSpent`](Self::UntilSpent), and the calls left are spread evenly over the
    /// window: one every `t / r`.
    Spread,
}

/// Builds a [`Pushback`]; start with [`Pushback::builder`].
#[derive(Clone, Debug)]
pub struct PushbackBuilder<C = SystemClock> {
    name: Arc<str>,
    max_wait: Duration,
    max_hold: Duration,
    pacing: Pacing,
    clock: C,
}

impl<C: Clock> PushbackBuilder<C> {
    /// How long a call may wait for a hold to end before it is sent (default zero: a held call
    /// fails at once with [`PushedBack`](super::PushedBack)). A call whose hold ends later is
    /// refused at once.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The longest hold any response can impose (default [`DEFAULT_MAX_HOLD`]): a longer
    /// `Retry-After` or window is cut to this, and logged.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// How calls are paced by an advertised quota (default [`Pacing::UntilSpent`]).
    pub fn pacing(mut self, pacing: Pacing) -> Self {
        self.pacing = pacing;
        self
    }

    /// Reads time from `clock`. Waits sleep on tokio's timer, so a clock other than
    /// [`SystemClock`] or [`TokioClock`](crate::clock::TokioClock) suits only `max_wait` zero
    /// (a [`ManualClock`](crate::clock::ManualClock) in tests of holds that fail at once).
    pub fn clock<C2: Clock>(self, clock: C2) -> PushbackBuilder<C2> {
        PushbackBuilder {
            name: self.name,
            max_wait: self.max_wait,
            max_hold: self.max_hold,
            pacing: self.pacing,
            clock,
        }
    }

    /// Builds the pushback.
    pub fn build(self) -> Pushback<C> {
        Pushback {
            shared: Arc::new(Shared {
                metrics: PushbackMetrics::new(&self.name),
                name: self.name,
                max_wait: self.max_wait,
                max_hold: self.max_hold,
                pacing: self.pacing,
                clock: self.clock,
                state: Mutex::new(State::default()),
                sooner: Arc::new(Notify::new()),
            }),
        }
    }
}

/// What one dependency has said about when to call it, shared by every layer, service and clone
/// made from it.
///
/// Build one per dependency, wrap its client in [`layer`](Self::layer), and every call made
/// through it is held back as the dependency's responses ask (see the
/// [module docs](super)).
pub struct Pushback<C = SystemClock> {
    pub(crate) shared: Arc<Shared<C>>,
}

impl<C> Clone for Pushback<C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C> fmt::Debug for Pushback<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pushback")
            .field("name", &self.shared.name)
            .field("max_wait", &self.shared.max_wait)
            .field("max_hold", &self.shared.max_hold)
            .field("pacing", &self.shared.pacing)
            .field("state", &*self.shared.lock())
            .finish()
    }
}

impl Pushback {
    /// A builder for the dependency `name` (named in errors and logs).
    pub fn builder(name: impl Into<Arc<str>>) -> PushbackBuilder {
        PushbackBuilder {
            name: name.into(),
            max_wait: Duration::ZERO,
            max_hold: DEFAULT_MAX_HOLD,
            pacing: Pacing::default(),
            clock: SystemClock::new(),
        }
    }

    /// A pushback for `name` with the defaults: no waiting, holds of at most
    /// [`DEFAULT_MAX_HOLD`], [`Pacing::UntilSpent`].
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self::builder(name).build()
    }
}

impl<C: Clock> Pushback<C> {
    /// A layer that holds calls back as this dependency asks.
    pub fn layer(&self) -> PushbackLayer<C> {
        PushbackLayer::new(self.clone())
    }

    /// The dependency's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// How long from now until a call may be sent, by what the dependency said last: zero when
    /// one may go now.
    pub fn held_for(&self) -> Duration {
        let now = self.shared.clock.now();
        let mut state = self.shared.lock();
        // As a call would find it: a window that has passed gives way to the next one first.
        state.roll(now, self.shared.pacing);
        let at = state.free_at(now);
        drop(state);
        Duration::from_nanos(at.saturating_sub(now))
    }

    /// Records what `response` says, as the layer does for every response it passes on: for a
    /// client called without the layer, or a response obtained elsewhere from the same
    /// dependency. Calls in flight through the layer are counted against an advertised quota;
    /// this call is not one of them.
    pub fn observe<R: ResponseHead>(&self, response: &R) {
        self.shared.observe(response, None);
    }
}

pub(crate) struct Shared<C> {
    pub(crate) name: Arc<str>,
    pub(crate) max_wait: Duration,
    max_hold: Duration,
    pacing: Pacing,
    pub(crate) clock: C,
    state: Mutex<State>,
    pub(crate) metrics: PushbackMetrics,
    /// Woken when an answer lets calls start sooner than before, so that waiters go then.
    pub(crate) sooner: Arc<Notify>,
}

impl<C> Shared<C> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change to the state is a few assignments that cannot panic half-way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Clock> Shared<C> {
    /// Starts a call now, returning its place in the order of starts, or says from when one
    /// may start.
    pub(crate) fn try_start(&self) -> Result<u64, (u64, u64)> {
        let now = self.clock.now();
        self.lock()
            .try_start(now, self.pacing)
            .map_err(|at| (now, at))
    }

    /// A call started by [`try_start`](Self::try_start) has ended.
    pub(crate) fn finish(&self) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
    }

    /// Records `response`; `own` is the place of the call it answers (still counted in
    /// flight) in the order of starts, `None` for a response obtained elsewhere.
    pub(crate) fn observe<R: ResponseHead>(&self, response: &R, own: Option<u64>) {
        let advice = advice::read(
            &self.name,
            response.status(),
            response.headers(),
            SystemTime::now(),
            self.max_hold,
        );
        if advice == Advice::default() {
            return;
        }
        self.metrics.observed(response.headers(), &advice);
        let now = self.clock.now();
        let mut state = self.lock();
        let before = state.free_at(now);
        state.apply(advice, now, own, self.pacing);
        let sooner = state.free_at(now) < before;
        drop(state);
        if sooner {
            self.sooner.notify_waiters();
        }
    }
}

/// When calls may start. Instants are nanoseconds of the pushback's clock.
#[derive(Debug, Default)]
struct State {
    /// No call starts before this (a `Retry-After`).
    hold_until: u64,
    /// Calls that may still start before `window_end`; `None` while no quota is known.
    budget: Option<u64>,
    window_end: u64,
    /// The quota of each window after `window_end`, and the window's length, when the
    /// dependency advertised a policy.
    refill: Option<(u64, u64)>,
    /// Under [`Pacing::Spread`], the time between two calls, and the earliest next start.
    spacing: u64,
    next_slot: u64,
    /// Calls started through the layer and not yet answered.
    in_flight: u64,
    /// Calls started through the layer so far: the next call's place in the order of starts.
    started: u64,
    /// The answer whose quota is in force came after every call placed before this had
    /// started: an answer to one of those may have been written before it, and may only
    /// tighten it.
    in_force: u64,
}

impl State {
    /// Starts the window after `window_end` if it has passed: the advertised quota, less the
    /// calls still in flight (which may land in it); with nothing known, no quota.
    fn roll(&mut self, now: u64, pacing: Pacing) {
        if self.budget.is_some() && self.window_end <= now {
            self.spacing = 0;
            // The next window is taken to start now, which ends it no earlier than the
            // dependency's (whose window ended at `window_end` or before). When the calls in
            // flight spend its whole quota, calls wait for it to pass, unless their answers say
            // otherwise first.
            match self.refill {
                Some((quota, window)) => {
                    let budget = quota.saturating_sub(self.in_flight);
                    self.budget = Some(budget);
                    self.window_end = now.saturating_add(window.max(1));
                    // Under `Spread`, this window's calls are spread over it too.
                    if pacing == Pacing::Spread && budget > 0 {
                        self.spacing = window / budget;
                    }
                }
                None => self.budget = None,
            }
        }
    }

    fn try_start(&mut self, now: u64, pacing: Pacing) -> Result<u64, u64> {
        if self.hold_until > now {
            return Err(self.hold_until);
        }
        self.roll(now, pacing);
        if self.budget == Some(0) {
            return Err(self.window_end);
        }
        if self.spacing > 0 && self.next_slot > now {
            return Err(self.next_slot);
        }
        if let Some(budget) = &mut self.budget {
            *budget -= 1;
        }
        self.next_slot = now.max(self.next_slot).saturating_add(self.spacing);
        self.in_flight = self.in_flight.saturating_add(1);
        let place = self.started;
        self.started = self.started.saturating_add(1);
        Ok(place)
    }

    /// The earliest instant a call may start, without starting one.
    fn free_at(&self, now: u64) -> u64 {
        let mut at = self.hold_until.max(now);
        if self.budget == Some(0) && self.window_end > now {
            at = at.max(self.window_end);
        }
        if self.spacing > 0 && self.budget.is_some() && self.window_end > now {
            at = at.max(self.next_slot);
        }
        at
    }

    fn apply(&mut self, advice: Advice, now: u64, own: Option<u64>, pacing: Pacing) {
        if let Some(hold) = advice.hold {
            self.hold_until = self
                .hold_until
                .max(now.saturating_add(saturating_nanos(hold)));
        }
        if let Some(limit) = advice.limit {
            // Calls in flight other than this one may not have been counted in `r` yet.
            let others = self.in_flight.saturating_sub(u64::from(own.is_some()));
            let budget = limit.remaining.saturating_sub(others);
            let window = saturating_nanos(limit.window);
            let window_end = now.saturating_add(window);
            // An answer to a call that started before the one whose answer is in force may
            // have been written first: out of order, it counts only if it is more restrictive
            // (fewer calls left, or as few for longer), so that it never loosens a hold.
            self.roll(now, pacing);
            let stale = own.is_some_and(|place| place < self.in_force);
            if let (true, Some(current)) = (stale, self.budget) {
                if (budget, Reverse(window_end)) >= (current, Reverse(self.window_end)) {
                    return;
                }
            } else {
                self.in_force = self.in_force.max(own.unwrap_or(self.started));
            }
            self.budget = Some(budget);
            self.window_end = window_end;
            self.refill = limit
                .quota
                .map(|(quota, window)| (quota, saturating_nanos(window)));
            self.spacing = match pacing {
                Pacing::Spread if budget > 0 => window / budget,
                _ => 0,
            };
            if self.spacing == 0 {
                self.next_slot = 0;
            } else {
                // The slot a sparser pacing set is no later than one spacing of this answer.
                self.next_slot = self.next_slot.min(now.saturating_add(self.spacing));
            }
        }
    }
}
