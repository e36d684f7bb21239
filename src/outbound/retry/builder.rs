//! [`Retry`], the handle every layer and clone of one dependency's retries shares, its
//! [`RetryBuilder`], and [`SettingError`].

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method};

use super::budget::{Budget, ONE};
use crate::bulkhead::adaptive::{ClassifiedLayer, HttpOverload};
use crate::clock::{saturating_nanos, Clock, SystemClock};
use crate::outbound::metrics::RetryMetrics;
use crate::setting::{ensure, SettingError};

/// What this builder builds, in its errors.
const OF: &str = "retry";

/// Decides whether a request may be sent twice, by its method and headers.
pub(super) type SafeToRetry = dyn Fn(&Method, &HeaderMap) -> bool + Send + Sync;

/// The retries of one dependency: their settings and the budget every clone shares.
///
/// Clones share the budget, as clones of a [`Pushback`](crate::outbound::Pushback) share what
/// the dependency said: build one per dependency and take its [`layer`](Self::layer) wherever a
/// client of it is built. See the [module docs](super) for what is retried, when, and how often.
#[derive(Clone)]
pub struct Retry {
    pub(super) shared: Arc<Shared>,
}

/// What every clone of a [`Retry`] shares.
pub(super) struct Shared {
    pub(super) name: Arc<str>,
    pub(super) base: Duration,
    pub(super) cap: Duration,
    pub(super) max_attempts: u32,
    pub(super) max_wait: Duration,
    pub(super) safe_to_retry: Arc<SafeToRetry>,
    pub(super) budget: Budget,
    pub(super) metrics: RetryMetrics,
}

impl Shared {
    /// The backoff before retry number `retry` (1 for the first): full jitter, a uniformly
    /// random span from zero to `base × 2^(retry − 1)`, capped at `cap`.
    pub(super) fn backoff(&self, retry: u32) -> Duration {
        let ceiling = saturating_nanos(self.base)
            .saturating_mul(1u64 << (retry - 1).min(63))
            .min(saturating_nanos(self.cap));
        // std's per-process random keys, a new one each call: randomness without a dependency.
        let random = RandomState::new().hash_one(retry);
        Duration::from_nanos(random % ceiling.saturating_add(1))
    }
}

impl fmt::Debug for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &self.shared;
        f.debug_struct("Retry")
            .field("name", &shared.name)
            .field("base", &shared.base)
            .field("cap", &shared.cap)
            .field("max_attempts", &shared.max_attempts)
            .field("max_wait", &shared.max_wait)
            .field("budget_available", &self.budget_available())
            .finish()
    }
}

impl Retry {
    /// A builder for the retries of the dependency `name` (named in events and metrics).
    pub fn builder(name: impl Into<Arc<str>>) -> RetryBuilder {
        RetryBuilder {
            name: name.into(),
            base: DEFAULT_BASE,
            cap: DEFAULT_CAP,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_wait: DEFAULT_MAX_WAIT,
            ratio: DEFAULT_RATIO,
            min_per_second: DEFAULT_MIN_PER_SECOND,
            window: DEFAULT_WINDOW,
            safe_to_retry: Arc::new(idempotent),
            clock: Box::new(SystemClock::new()),
        }
    }

    /// A layer that retries calls with [`HttpOverload`] judging which answers are transient.
    pub fn layer(&self) -> ClassifiedLayer<Self> {
        self.layer_with(HttpOverload::default())
    }

    /// A layer that retries calls whose answers `classifier` judges
    /// [`Overloaded`](crate::bulkhead::adaptive::Verdict::Overloaded).
    pub fn layer_with<K>(&self, classifier: K) -> ClassifiedLayer<Self, K> {
        ClassifiedLayer::new(self.clone(), classifier)
    }

    /// The dependency's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The whole retries the budget would grant now.
    pub fn budget_available(&self) -> u64 {
        self.shared.budget.available()
    }
}

/// The default [`backoff`](RetryBuilder::backoff) base: 50 ms.
pub(crate) const DEFAULT_BASE: Duration = Duration::from_millis(50);
/// The default [`backoff`](RetryBuilder::backoff) cap: 1 s.
pub(crate) const DEFAULT_CAP: Duration = Duration::from_secs(1);
/// The default [`max_attempts`](RetryBuilder::max_attempts): 3, the first and two retries.
pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The default [`max_wait`](RetryBuilder::max_wait): 5 s.
pub(crate) const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(5);
/// The default [`budget`](RetryBuilder::budget) ratio: a retry for every five first attempts.
pub(crate) const DEFAULT_RATIO: f64 = 0.2;
/// The default [`budget`](RetryBuilder::budget) floor: 3 retries a second.
pub(crate) const DEFAULT_MIN_PER_SECOND: u32 = 3;
/// The default [`budget`](RetryBuilder::budget) window: 10 s.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// The longest backoff cap, budget window and `max_wait`: an hour.
pub(crate) const LONGEST: Duration = Duration::from_secs(3600);

/// The default rule of what may be sent twice: the idempotent methods of RFC 9110 (GET, HEAD,
/// OPTIONS, TRACE, PUT, DELETE), and a request of any method that carries an
/// `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header: the dependency answers a
/// repeat of the key with the first answer).
pub fn idempotent(method: &Method, headers: &HeaderMap) -> bool {
    method.is_idempotent() || headers.contains_key("idempotency-key")
}

/// Builds a [`Retry`]; start with [`Retry::builder`].
pub struct RetryBuilder {
    name: Arc<str>,
    base: Duration,
    cap: Duration,
    max_attempts: u32,
    max_wait: Duration,
    ratio: f64,
    min_per_second: u32,
    window: Duration,
    safe_to_retry: Arc<SafeToRetry>,
    clock: Box<dyn Clock>,
}

impl fmt::Debug for RetryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBuilder")
            .field("name", &self.name)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl RetryBuilder {
    /// The backoff before each retry (defaults 50 ms and 1 s): full jitter, a
    /// random span from zero to `base × 2^(n − 1)` before retry `n`, at most `cap` (`base` at
    /// most `cap`, `cap` at most an hour). A retry waits longer when the answer asks for longer
    /// (see [`max_wait`](Self::max_wait)).
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        (self.base, self.cap) = (base, cap);
        self
    }

    /// The most attempts of one call, from 1 to 10, the first included (default
    /// 3; 1 makes no retry).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The longest a retry waits for the time an answer or a refusal asks for, at most an hour
    /// (default 5 s). When it asks for longer, no retry is made: the call ends
    /// with that answer or error, and the time it carries is the caller's to keep.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The retry budget (defaults 0.2, 3 and 10 s): each first attempt deposits `ratio` of a
    /// retry (from 0 to 10, to the millionth), `min_per_second` retries a second come with no
    /// deposit (the window's worth, there at once: 30 with the defaults); a deposit counts for
    /// `window` (from 10 ms to an hour) less at most a tenth of it, a retry from when it is
    /// granted until at least `window` after it is sent (see the [module docs](super)). A
    /// retry is granted from whole retries: with a window
    /// shorter than a second over `min_per_second`, the reserve alone is less than one and
    /// grants none until deposits make up the rest.
    pub fn budget(mut self, ratio: f64, min_per_second: u32, window: Duration) -> Self {
        (self.ratio, self.min_per_second, self.window) = (ratio, min_per_second, window);
        self
    }

    /// Which requests may be sent more than once, by method and headers (default
    /// [`idempotent`]). A request it refuses is sent once.
    pub fn safe_to_retry(
        mut self,
        rule: impl Fn(&Method, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.safe_to_retry = Arc::new(rule);
        self
    }

    /// Reads the budget's time from `clock` (default [`SystemClock`]). Backoffs and waits
    /// sleep on tokio's timer.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Builds the handle.
    ///
    /// # Errors
    ///
    /// A [`SettingError`] naming the first setting out of range: `max_attempts` of 0 or
    /// above 10, a `base` above `cap`, a `cap` or `max_wait` above an hour, a `ratio` that is
    /// not from 0 to 10 (NaN included), a `window` under 10 ms or above an hour.
    pub fn build(self) -> Result<Retry, SettingError> {
        let attempts = self.max_attempts;
        let within = (1..=10).contains(&attempts);
        ensure(OF, within, "max_attempts", attempts, "from 1 to 10")?;
        ensure(OF, self.base <= self.cap, "base", self.base, "at most cap")?;
        ensure(OF, self.cap <= LONGEST, "cap", self.cap, "at most 1h")?;
        let max_wait = self.max_wait;
        ensure(OF, max_wait <= LONGEST, "max_wait", max_wait, "at most 1h")?;
        let ratio = (0.0..=10.0).contains(&self.ratio);
        ensure(OF, ratio, "ratio", self.ratio, "from 0 to 10")?;
        let window = (Duration::from_millis(10)..=LONGEST).contains(&self.window);
        ensure(OF, window, "window", self.window, "from 10ms to 1h")?;
        // At most 10 × ONE: no rounding can reach the limits of u64.
        let deposit = (self.ratio * ONE as f64).round() as u64;
        let window = saturating_nanos(self.window);
        let budget = Budget::new(deposit, self.min_per_second, window, self.clock);
        Ok(Retry {
            shared: Arc::new(Shared {
                metrics: RetryMetrics::default(),
                name: self.name,
                base: self.base,
                cap: self.cap,
                max_attempts: self.max_attempts,
                max_wait: self.max_wait,
                safe_to_retry: self.safe_to_retry,
                budget,
            }),
        })
    }
}
