//! How a [`Pushback`] follows its dependency: [`PushbackBuilder`] and [`Pacing`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;

use super::answer::ReadQuota;
use super::dependency::Pushback;
use crate::clock::{Clock, SystemClock};

/// The default [`max_hold`](PushbackBuilder::max_hold): ten minutes.
pub(crate) const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(600);

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
#[derive(Clone)]
pub struct PushbackBuilder<C = SystemClock> {
    pub(super) name: Arc<str>,
    pub(super) max_wait: Duration,
    pub(super) max_hold: Duration,
    pub(super) pacing: Pacing,
    pub(super) clock: C,
    pub(super) dialects: Vec<Arc<ReadQuota>>,
}

impl<C: fmt::Debug> fmt::Debug for PushbackBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PushbackBuilder")
            .field("name", &self.name)
            .field("max_wait", &self.max_wait)
            .field("max_hold", &self.max_hold)
            .field("pacing", &self.pacing)
            .field("clock", &self.clock)
            .field("dialects", &self.dialects.len())
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
            dialects: Vec::new(),
        }
    }

    /// A pushback for `name` with the defaults: no waiting, holds of at most
    /// ten minutes, [`Pacing::UntilSpent`].
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self::builder(name).build()
    }
}

impl<C: Clock> PushbackBuilder<C> {
    /// How long a call may wait for a hold to end before it is sent (default zero: a held call
    /// fails at once with [`PushedBack`](super::PushedBack)). A call whose hold ends later is
    /// refused at once.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The longest hold any response can impose (default ten minutes): a longer
    /// `Retry-After` or window is cut to this, and logged. It is also the longest calls are held
    /// by a policy that gives nothing: this long after the last answer or call, one call goes.
    /// Zero holds nothing an answer asks (the config file refuses it there, as a likely slip).
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// How calls are paced by an advertised quota (default [`Pacing::UntilSpent`]).
    pub fn pacing(mut self, pacing: Pacing) -> Self {
        self.pacing = pacing;
        self
    }

    /// Reads a quota in fields of the dependency's own, beside the dialects the pushback knows
    /// (see the [module docs](super#what-is-read)): `read` returns the calls left and the span
    /// until they reset, or `None` when the fields are not there. The span is capped at
    /// [`max_hold`](Self::max_hold); every quota an answer gives holds calls, this one beside
    /// the others. Each call adds one more reader.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_bulwark::clock::ManualClock;
    /// use tower_bulwark::outbound::Pushback;
    ///
    /// // A partner that writes `x-partner-quota: 0/30` (calls left / seconds until reset).
    /// let partner = Pushback::builder("partner")
    ///     .clock(ManualClock::new())
    ///     .dialect(|headers| {
    ///         let value = headers.get("x-partner-quota")?.to_str().ok()?;
    ///         let (left, seconds) = value.split_once('/')?;
    ///         Some((left.parse().ok()?, Duration::from_secs(seconds.parse().ok()?)))
    ///     })
    ///     .build();
    /// let answer = http::Response::builder().header("x-partner-quota", "0/30").body(())?;
    /// partner.observe(&answer);
    /// assert_eq!(partner.held_for(), Duration::from_secs(30));
    /// # Ok::<(), http::Error>(())
    /// ```
    pub fn dialect(
        mut self,
        read: impl Fn(&HeaderMap) -> Option<(u64, Duration)> + Send + Sync + 'static,
    ) -> Self {
        self.dialects.push(Arc::new(read));
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
            dialects: self.dialects,
        }
    }

    /// Builds the pushback.
    pub fn build(self) -> Pushback<C> {
        Pushback::from_builder(self)
    }
}
