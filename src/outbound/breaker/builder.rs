//! [`Breaker`], the handle every layer, service and clone of one breaker shares, and its
//! [`BreakerBuilder`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::state::{Shared, Ticket};
use crate::bulkhead::adaptive::future::Admit;
use crate::bulkhead::adaptive::{ClassifiedLayer, HttpOverload};
use crate::clock::{Clock, SystemClock};
use crate::setting::{ensure, SettingError};
use crate::{BoxError, Quota};

/// What this builder builds, in its errors.
const OF: &str = "circuit breaker";

/// The default of [`BreakerBuilder::minimum_calls`].
const DEFAULT_MINIMUM_CALLS: u32 = 20;

/// The most calls, or seconds, a [`Window`] may span: a count window keeps one entry per call.
const MAX_WINDOW: u32 = 100_000;

/// Which calls the failure and slow-call rates are taken over while the breaker is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// The last `n` calls counted (from 1 to 100 000).
    Calls(u32),
    /// The calls counted that ended in the last `n` seconds of the breaker's clock (from 1 to
    /// 100 000): the current whole second since the clock's origin and the `n − 1`
    /// before it.
    Seconds(u32),
}

/// Where a breaker stands, as [`Breaker::state`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through, and their outcomes are counted in the window.
    Closed,
    /// Every call fails at once with [`BreakerOpen`](super::BreakerOpen) until `until`, a
    /// reading of the breaker's [`Clock`] (the time since its origin); the breaker is half-open
    /// from then on.
    Open {
        /// The instant, on the breaker's clock, at which the breaker half-opens.
        until: Duration,
    },
    /// `half_open_calls` probes are let through; their outcomes close the breaker or open it
    /// again.
    HalfOpen,
}

/// The settings of a breaker, checked by [`BreakerBuilder::build`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) window: Window,
    pub(crate) minimum_calls: u32,
    pub(crate) failure_rate: f64,
    pub(crate) slow_call_rate: f64,
    pub(crate) slow_call_duration: Duration,
    pub(crate) open_for: Duration,
    pub(crate) half_open_calls: u32,
}

impl Settings {
    fn check(&self) -> Result<(), SettingError> {
        let (field, size, count) = match self.window {
            Window::Calls(n) => ("window_calls", n, true),
            Window::Seconds(n) => ("window_seconds", n, false),
        };
        let within = (1..=MAX_WINDOW).contains(&size);
        ensure(OF, within, field, size, "from 1 to 100000")?;
        let minimum = self.minimum_calls;
        let (ok, expected) = match count {
            true => (minimum <= size, "at least 1 and at most the window's calls"),
            false => (true, "at least 1"),
        };
        ensure(OF, minimum >= 1 && ok, "minimum_calls", minimum, expected)?;
        let rate = |rate: f64| rate > 0.0 && rate <= 1.0;
        let expected = "above 0 and at most 1";
        let failure = self.failure_rate;
        ensure(OF, rate(failure), "failure_rate", failure, expected)?;
        let slow = self.slow_call_rate;
        ensure(OF, rate(slow), "slow_call_rate", slow, expected)?;
        let span = |span: Duration| !span.is_zero() && span <= Quota::MAX_SPAN;
        let expected = "above zero and at most 2^60 ns (about 36.5 years)";
        let slow = self.slow_call_duration;
        ensure(OF, span(slow), "slow_call_duration", slow, expected)?;
        ensure(OF, span(self.open_for), "open_for", self.open_for, expected)?;
        let probes = self.half_open_calls;
        ensure(OF, probes >= 1, "half_open_calls", probes, "at least 1")
    }
}

/// A circuit breaker in front of one dependency, shared by every clone and every layer and
/// service made from it.
///
/// Build one per dependency with [`Breaker::builder`], wrap its client with
/// [`layer`](Self::layer), and read [`state`](Self::state) where it helps (a health check, a
/// test). See the [module docs](super) for how it decides.
#[derive(Clone)]
pub struct Breaker {
    pub(super) shared: Arc<Shared>,
}

impl Breaker {
    /// A builder for a breaker named `name` (named in errors, events and metrics), with the
    /// defaults: a window of the last 100 calls, at least 20 of them, opening at a failure
    /// rate of 0.5 or a slow-call rate of 1 (calls over 10 s), open for 1 s, then 10 probes.
    pub fn builder(name: impl Into<Arc<str>>) -> BreakerBuilder {
        BreakerBuilder {
            name: name.into(),
            settings: Settings {
                window: Window::Calls(100),
                minimum_calls: DEFAULT_MINIMUM_CALLS,
                failure_rate: 0.5,
                slow_call_rate: 1.0,
                slow_call_duration: Duration::from_secs(10),
                open_for: Duration::from_secs(1),
                half_open_calls: 10,
            },
            minimum_calls: None,
            clock: Box::new(SystemClock::new()),
        }
    }

    /// Its settings as built, the defaults filled in.
    #[cfg(feature = "config")]
    pub(crate) fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// The breaker's name, as given to its builder.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Where the breaker stands now. An open breaker whose time is up is half-open (reading
    /// the state moves it there, as the next call would).
    pub fn state(&self) -> BreakerState {
        self.shared.state()
    }

    /// A layer judging answers with [`HttpOverload`]; another classifier goes to
    /// [`layer_with`](Self::layer_with).
    pub fn layer(&self) -> ClassifiedLayer<Self> {
        self.layer_with(HttpOverload::default())
    }

    /// A layer judging answers with `classifier` (any
    /// [`Classify`](crate::bulkhead::adaptive::Classify), as for an adaptive bulkhead).
    pub fn layer_with<K>(&self, classifier: K) -> ClassifiedLayer<Self, K> {
        ClassifiedLayer::new(self.clone(), classifier)
    }

    /// Sets the breaker's state gauge (`bulwark_breaker_state`) from its current state; the
    /// breaker also sets it at each transition.
    #[cfg(feature = "metrics")]
    pub fn publish_gauges(&self) {
        self.shared.publish_state();
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.name())
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`Breaker`] not built yet; every method consumes and returns the builder, and
/// [`build`](Self::build) checks them.
#[must_use = "a builder does nothing until `build` is called"]
pub struct BreakerBuilder {
    name: Arc<str>,
    settings: Settings,
    /// As set; by default [`DEFAULT_MINIMUM_CALLS`], or a smaller count window's calls.
    minimum_calls: Option<u32>,
    clock: Box<dyn Clock>,
}

impl BreakerBuilder {
    /// The calls the rates are taken over while closed (default: the last 100 calls).
    pub fn window(mut self, window: Window) -> Self {
        self.settings.window = window;
        self
    }

    /// The fewest calls in the window for the breaker to open (default 20, or the window's
    /// calls if a [`Window::Calls`] holds fewer; set, at most those): below it, no rate opens
    /// the breaker.
    pub fn minimum_calls(mut self, calls: u32) -> Self {
        self.minimum_calls = Some(calls);
        self
    }

    /// The share of failed calls (above 0, at most 1; default 0.5) at which the breaker opens,
    /// and at which failed probes open it again.
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.settings.failure_rate = rate;
        self
    }

    /// The share of slow calls (above 0, at most 1; default 1: every call counted) at which the
    /// breaker opens, and at which slow probes open it again.
    pub fn slow_call_rate(mut self, rate: f64) -> Self {
        self.settings.slow_call_rate = rate;
        self
    }

    /// How long a call must take, on the breaker's clock, to be slow: longer than this (above
    /// zero; default 10 s).
    pub fn slow_call_duration(mut self, duration: Duration) -> Self {
        self.settings.slow_call_duration = duration;
        self
    }

    /// How long the breaker stays open before it lets probes through (above zero; default
    /// 1 s).
    pub fn open_for(mut self, duration: Duration) -> Self {
        self.settings.open_for = duration;
        self
    }

    /// How many probe calls a half-open breaker lets through (at least 1; default 10); their
    /// outcomes, all of them counted, close it or open it again.
    pub fn half_open_calls(mut self, calls: u32) -> Self {
        self.settings.half_open_calls = calls;
        self
    }

    /// The clock of open times and slow calls (default [`SystemClock`]); a
    /// [`ManualClock`](crate::clock::ManualClock) makes tests exact, and a
    /// [`TokioClock`](crate::clock::TokioClock) follows tokio's paused time. The waits below
    /// that a call's time leaves out are measured on tokio's clock: under a paused tokio, time
    /// calls on a `TokioClock`.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Builds the breaker, closed.
    ///
    /// # Errors
    ///
    /// A [`SettingError`] naming the first setting out of range: a window of 0 calls or
    /// seconds or above 100 000, `minimum_calls` of 0 or above a count window, a rate
    /// that is not above 0 and at most 1 (NaN included), a duration of zero or above 2^60 ns,
    /// `half_open_calls` of 0.
    pub fn build(mut self) -> Result<Breaker, SettingError> {
        let fewest = match self.settings.window {
            Window::Calls(n) => n.min(DEFAULT_MINIMUM_CALLS),
            Window::Seconds(_) => DEFAULT_MINIMUM_CALLS,
        };
        self.settings.minimum_calls = self.minimum_calls.unwrap_or(fewest);
        self.settings.check()?;
        let shared = Shared::new(self.name, self.settings, self.clock);
        Ok(Breaker {
            shared: Arc::new(shared),
        })
    }
}

impl fmt::Debug for BreakerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerBuilder")
            .field("name", &self.name)
            .field("settings", &self.settings)
            .field("minimum_calls", &self.minimum_calls)
            .finish_non_exhaustive()
    }
}

impl Admit for Breaker {
    type Report = Ticket;

    /// A ticket for the call, or at once the breaker's refusal.
    fn admit(&self) -> Result<Ticket, BoxError> {
        self.shared.admit().map_err(Into::into)
    }
}
