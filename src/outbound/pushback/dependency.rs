//! [`Pushback`], the handle every layer, service and clone of one dependency shares, and the
//! [`Dependency`] record behind it.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

use super::answer::{self, Answer};
use super::builder::PushbackBuilder;
use super::error::PushedBack;
use super::layer::PushbackLayer;
use super::schedule::Schedule;
use crate::clock::{Clock, SystemClock};
use crate::head::ResponseHead;
use crate::outbound::metrics::{Outcome, PushbackMetrics};
use crate::sync::{lock, Mutex};

/// What one dependency has said about when to call it, shared by every layer, service and clone
/// made from it.
///
/// Build one per dependency, wrap its client in [`layer`](Self::layer), and every call made
/// through it is held back as the dependency's responses ask (see the
/// [module docs](super)).
pub struct Pushback<C = SystemClock> {
    pub(crate) dependency: Arc<Dependency<C>>,
}

impl<C> Clone for Pushback<C> {
    fn clone(&self) -> Self {
        Self {
            dependency: Arc::clone(&self.dependency),
        }
    }
}

impl<C> fmt::Debug for Pushback<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dependency = &self.dependency;
        f.debug_struct("Pushback")
            .field("name", &dependency.name)
            .field("max_wait", &dependency.max_wait)
            .field("max_hold", &dependency.max_hold)
            .field("schedule", &*lock(&dependency.schedule))
            .finish()
    }
}

impl<C: Clock> Pushback<C> {
    pub(super) fn from_builder(builder: PushbackBuilder<C>) -> Self {
        Self {
            dependency: Arc::new(Dependency {
                metrics: PushbackMetrics::default(),
                name: builder.name,
                max_wait: builder.max_wait,
                max_hold: builder.max_hold,
                clock: builder.clock,
                schedule: Mutex::new(Schedule::new(builder.pacing, builder.max_hold)),
                dialects: builder.dialects,
                sooner: Arc::new(Notify::new()),
            }),
        }
    }

    /// A layer that holds calls back as this dependency asks.
    pub fn layer(&self) -> PushbackLayer<C> {
        PushbackLayer {
            pushback: self.clone(),
            tokens: 0,
            mode: std::marker::PhantomData,
        }
    }

    /// The dependency's name.
    pub fn name(&self) -> &str {
        &self.dependency.name
    }

    /// How long from now until a call may be sent, by what the dependency said last: zero when
    /// one may go now.
    pub fn held_for(&self) -> Duration {
        let now = self.dependency.clock.now();
        span(now, lock(&self.dependency.schedule).free_at(now, 0))
    }

    /// Records what `response` says, as the layer does for every response it passes on: for a
    /// client called without the layer, or a response obtained elsewhere from the same
    /// dependency. Calls in flight through the layer are counted against an advertised quota;
    /// this call is not one of them.
    pub fn observe<R: ResponseHead>(&self, response: &R) {
        (self.dependency).observe(response.status(), response.headers(), None);
    }
}

/// The span from `from` to `to`, instants of the clock: zero when `to` is not later.
pub(super) fn span(from: u64, to: u64) -> Duration {
    Duration::from_nanos(to.saturating_sub(from))
}

/// One dependency as its pushback knows it: its name and settings, and the schedule its answers
/// have set.
pub(crate) struct Dependency<C> {
    pub(crate) name: Arc<str>,
    pub(crate) max_wait: Duration,
    max_hold: Duration,
    pub(crate) clock: C,
    /// Taken past a poisoning: every change to it is a few assignments that cannot panic
    /// half-way.
    schedule: Mutex<Schedule>,
    pub(crate) metrics: PushbackMetrics,
    /// The user's readers of dialects of their own.
    dialects: Vec<Arc<answer::ReadQuota>>,
    /// Woken when an answer lets calls start sooner than before, so that waiters go then.
    sooner: Arc<Notify>,
}

impl<C: Clock> Dependency<C> {
    /// Starts a call of `tokens` tokens now, returning its place in the order of starts and
    /// the quotas whose budget it took a call of (one bit each), or says from when one may start:
    /// `Err((now, at))`.
    pub(crate) fn try_start(&self, tokens: u64) -> Result<(u64, u32), (u64, u64)> {
        let now = self.clock.now();
        lock(&self.schedule)
            .try_start(now, tokens)
            .map_err(|at| (now, at))
    }

    /// Refuses a call at `now` that may start at `at` only, later than it may wait for.
    pub(crate) fn refuse(&self, now: u64, at: u64) -> PushedBack {
        self.metrics.count(&self.name, Outcome::Refused);
        PushedBack::new(self.name.clone(), span(now, at))
    }

    /// Ready at the next answer that lets calls start sooner.
    pub(crate) fn listen(&self) -> Pin<Box<OwnedNotified>> {
        Box::pin(Arc::clone(&self.sooner).notified_owned())
    }

    /// A call of `tokens` tokens started by [`try_start`](Self::try_start) has ended.
    pub(crate) fn finish(&self, tokens: u64) {
        lock(&self.schedule).finish(tokens);
    }

    /// A call of `tokens` tokens started at `place` was refused below the layer, unsent: what
    /// it took of the advertised budget goes back, and waiters look again.
    pub(crate) fn give_back(&self, place: u64, counted: u32, tokens: u64) {
        self.change(|schedule, _| schedule.give_back(place, counted, tokens));
    }

    /// Changes the schedule at the clock's now by `change`, and wakes the waiters if calls may
    /// start sooner than before, or more tokens are left.
    fn change(&self, change: impl FnOnce(&mut Schedule, u64)) {
        let now = self.clock.now();
        let mut schedule = lock(&self.schedule);
        let before = (schedule.free_at(now, 0), schedule.tokens_available(now));
        change(&mut schedule, now);
        let sooner =
            schedule.free_at(now, 0) < before.0 || schedule.tokens_available(now) > before.1;
        drop(schedule);
        if sooner {
            self.sooner.notify_waiters();
        }
    }

    /// Records an answer of `status` with the fields `headers` (its head's, or its trailers');
    /// `own` is the place in the order of starts and the tokens of the call it answers (still
    /// counted in flight), `None` for an answer obtained elsewhere.
    pub(crate) fn observe(
        &self,
        status: http::StatusCode,
        headers: &http::HeaderMap,
        own: Option<(u64, u64)>,
    ) {
        let answer = answer::read(&self.name, status, headers, self.max_hold, &self.dialects);
        if answer == Answer::default() {
            return;
        }
        self.metrics.observed(&self.name, &answer);
        self.change(|schedule, now| schedule.apply(answer, now, own));
    }
}
