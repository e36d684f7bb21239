//! What a limiter decides when Redis cannot, and how it notices that Redis is failing.

use std::fmt;
use std::future::Ready;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::key::fingerprint;
use super::script::LimiterScript;
use super::RedisFailure;
use crate::algorithm::{Concurrency, Metered};
use crate::clock::{saturating_nanos, Clock};
use crate::decision::{Decision, LimiterId, Taken};
use crate::{BoxError, KeyedRateLimiter, Limiter, Quota};

/// What a limiter decides when Redis cannot: it timed out, the connection is down, or the reply
/// was not a decision.
///
/// Every such failure is counted (`failures` of [`RedisRateLimiter::counts`](super::RedisRateLimiter::counts))
/// and logged whatever the fail mode.
#[derive(Clone, Default)]
pub enum RedisFailMode {
    /// Decides with an in-memory limiter of the Redis limiter's own quota (the default), one
    /// per limiter and its clones, keyed by the Redis key, on the limiter's clock (its
    /// [`client_clock`](super::RedisRateLimiterBuilder::client_clock), else the system clock),
    /// following [`set_quota`](super::RedisRateLimiter::set_quota): GCRA, or
    /// [`Metered`](crate::algorithm::Metered) for a metered limiter (its admissions hold their
    /// estimates there, and settle there, as in Redis), or the limit of requests in flight
    /// per key for a [concurrent policy](crate::rate_limit::Policy::concurrent_in_redis).
    ///
    /// The bound of an outage: while Redis cannot answer, each instance admits a key at most
    /// its quota, as if it alone used it. `N` instances together admit at most `N` times the
    /// quota (`N` bursts at once, then `N` times the rate) where the quota alone would have
    /// been admitted: bounded, never more. For fewer, give each instance a share of the quota
    /// with [`fallback`](Self::fallback); for none, [`Closed`](Self::Closed). The local
    /// limiter knows nothing of what Redis admitted before the outage, and Redis nothing of
    /// what it admitted during it.
    #[default]
    Local,
    /// Admits the request: availability first, at any rate. The decision reports the full
    /// limit minus the cost as remaining, since nothing better is known.
    Open,
    /// Refuses the request, telling the client to come back after this long.
    Closed(Duration),
    /// Decides with a local limiter keyed by the Redis key of the request (see
    /// [`fallback`](Self::fallback) and [`fallback_to`](Self::fallback_to)).
    Fallback(Arc<LocalLimiter>),
    /// Hands the [`RedisFailure`] to the caller as the error of the decision.
    Propagate,
}

/// A local limiter that decides for Redis, keyed by the Redis key.
type LocalLimiter = dyn Limiter<String, Future = Ready<Result<Decision, BoxError>>>;

/// The local limiter of [`RedisFailMode::Local`].
pub(crate) type DefaultLocal = Arc<LocalLimiter>;

impl RedisFailMode {
    /// Decides with a local in-memory GCRA limiter of its own `quota`, for example the global
    /// quota divided by the expected number of instances.
    pub fn fallback(quota: Quota) -> Self {
        Self::fallback_to(KeyedRateLimiter::<String>::new(quota))
    }

    /// Decides with `limiter`, keyed by the Redis key of the request (a
    /// [`KeyedRateLimiter<String, _, _>`](crate::KeyedRateLimiter) of any algorithm and clock).
    /// Its own quota applies, `max_wait` included, for every decision it takes.
    pub fn fallback_to<L>(limiter: L) -> Self
    where
        L: Limiter<String, Future = Ready<Result<Decision, BoxError>>>,
    {
        Self::Fallback(Arc::new(limiter))
    }

    /// The decision on `cost` permits for `key` (its Redis key) when Redis failed with
    /// `failure`, for the limiter `limiter`; `limit` is the limit Redis would have reported. A
    /// local limiter's admission carries that limiter's mark, which tells it its own; `Open`'s,
    /// made by no limiter, is marked as `limiter`'s for `key`, as a Redis decision is.
    pub(crate) fn decide(
        &self,
        limiter: LimiterId,
        limit: u64,
        key: String,
        cost: u32,
        failure: RedisFailure,
    ) -> Result<Decision, BoxError> {
        let mut decision = match self {
            Self::Open => {
                Decision::allowed(limit, limit.saturating_sub(u64::from(cost)), Duration::ZERO)
                    .for_key(fingerprint(&key))
                    .made_by(limiter)
            }
            Self::Closed(retry_after) => Decision::refused(limit, 0, *retry_after, *retry_after),
            Self::Fallback(local) => local.reserve(&key, cost).into_inner()?,
            // A built limiter holds `Local` as the `Fallback` to its own local limiter
            // (`resolved`); this arm is never reached, and hands the failure on if it were.
            Self::Local | Self::Propagate => return Err(failure.into()),
        };
        decision.admission.taken = Taken::RedisFailMode(decision.charged());
        Ok(decision.of_cost(cost))
    }

    /// This fail mode as a limiter of `quota` on `clock` running `script` keeps it:
    /// [`Local`](Self::Local) as the [`Fallback`](Self::Fallback) to a local limiter of its
    /// own (the script's algorithm for `Metered` and `Concurrency`, else GCRA), which is
    /// returned too (the limiter hands it each new quota); any other as it is.
    pub(crate) fn resolved(
        self,
        quota: Quota,
        clock: &Arc<dyn Clock>,
        script: LimiterScript,
    ) -> (Self, Option<DefaultLocal>) {
        if !matches!(self, Self::Local) {
            return (self, None);
        }
        let builder = KeyedRateLimiter::<String>::builder(quota).clock(Arc::clone(clock));
        let local: DefaultLocal = match script {
            LimiterScript::Metered => Arc::new(builder.algorithm::<Metered>().build()),
            LimiterScript::Concurrency => Arc::new(builder.algorithm::<Concurrency>().build()),
            _ => Arc::new(builder.build()),
        };
        (Self::Fallback(Arc::clone(&local)), Some(local))
    }

    /// Settles a decision that this fail mode took, admitted for `estimate` permits, to `cost`
    /// with its local limiter, if it has one (a give-back, to zero, as its refund): whether the
    /// local limiter took it back (it tells its own admissions, for their key, from any other).
    /// `None` without a local limiter.
    pub(super) fn change(
        &self,
        key: String,
        mut decision: Decision,
        estimate: u32,
        cost: u32,
    ) -> Option<bool> {
        let Self::Fallback(local) = self else {
            return None;
        };
        decision.admission.taken = Taken::State(decision.charged());
        Some(if cost == 0 {
            local.refund(&key, estimate, decision)
        } else {
            local.settle(&key, estimate, decision, cost)
        })
    }
}

impl fmt::Debug for RedisFailMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local => f.write_str("RedisFailMode::Local"),
            Self::Open => f.write_str("RedisFailMode::Open"),
            Self::Closed(retry) => write!(f, "RedisFailMode::Closed({retry:?})"),
            Self::Fallback(limiter) => f
                .debug_tuple("RedisFailMode::Fallback")
                .field(&limiter.quota())
                .finish(),
            Self::Propagate => f.write_str("RedisFailMode::Propagate"),
        }
    }
}

/// Whether Redis is failing: counts the failures, logs the first of a streak as a warning and
/// the rest at debug level, and after a failure to reach Redis skips it for a probe interval
/// (its decisions, not its give-backs), so that a dead Redis does not cost every request a
/// timeout.
///
/// Redis is failing as the latest call sent says, of those that ended: calls end out of order (a
/// reply on its way when Redis died lands after a later call's failure; a call that times out
/// in a stall ends after a later one that found Redis back), and taking each as it ends told a
/// dead Redis "answers again" and then warned anew, several times an outage.
#[derive(Debug)]
pub(crate) struct Breaker {
    failures: AtomicU64,
    /// The latest-sent call of those that ended: the instant it was sent (nanoseconds since
    /// `origin`) shifted left by one, and in the low bit whether it failed.
    latest: AtomicU64,
    /// The origin of the breaker's own real-time clock: Redis availability is a matter of real
    /// time, whatever clock the decisions use.
    origin: Instant,
    /// How long after a failure to reach Redis it is not asked.
    pub(crate) probe_interval: Duration,
    /// Until when (nanoseconds since `origin`) decisions skip Redis.
    skip_until: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(probe_interval: Duration) -> Self {
        Self {
            failures: AtomicU64::new(0),
            latest: AtomicU64::new(0),
            origin: Instant::now(),
            probe_interval,
            skip_until: AtomicU64::new(0),
        }
    }

    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Now, on the breaker's clock: what a call's sending instant is read with.
    pub(crate) fn elapsed(&self) -> u64 {
        saturating_nanos(self.origin.elapsed())
    }

    /// Whether, at `now` (on the breaker's clock), Redis failed to answer less than a probe
    /// interval ago.
    pub(crate) fn skipping(&self, now: u64) -> bool {
        now < self.skip_until.load(Ordering::Relaxed)
    }

    /// Records the end of a call sent at `sent` that `failed` or not, if no call sent later has
    /// ended; says whether that changed whether Redis is failing (`None`: a later call had
    /// already said more).
    fn ended(&self, sent: u64, failed: bool) -> Option<bool> {
        let now = (sent << 1) | u64::from(failed);
        // Replaced unless a call sent later has ended.
        let newer = |latest: u64| (latest >> 1 <= sent).then_some(now);
        let latest = (self.latest).fetch_update(Ordering::Relaxed, Ordering::Relaxed, newer);
        latest.ok().map(|latest| (latest & 1 == 1) != failed)
    }

    /// Redis answered the limiter of `algorithm` under `prefix`, the call sent at `sent`.
    pub(crate) fn answered(&self, prefix: &str, algorithm: &str, sent: u64) {
        if self.ended(sent, false) == Some(true) {
            self.skip_until.store(0, Ordering::Relaxed);
            tracing::info!(
                target: "tower_bulwark::redis",
                prefix,
                algorithm,
                "redis answers again; decisions come from redis",
            );
        }
    }

    /// Redis failed to decide for the limiter under `prefix`, the call sent at `sent`;
    /// `fail_mode` decides instead.
    pub(crate) fn failed(
        &self,
        prefix: &str,
        failure: &RedisFailure,
        fail_mode: &RedisFailMode,
        sent: u64,
    ) {
        let count = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let ended = self.ended(sent, true);
        if ended.is_some() && failure.is_unavailable() {
            let until = self
                .elapsed()
                .saturating_add(saturating_nanos(self.probe_interval));
            self.skip_until.fetch_max(until, Ordering::Relaxed);
        }
        if ended != Some(true) {
            tracing::debug!(
                target: "tower_bulwark::redis",
                prefix, failures = count, error = %failure,
                "redis decision failed; the fail mode decides",
            );
        } else {
            tracing::warn!(
                target: "tower_bulwark::redis",
                prefix, failures = count, error = %failure, policy = ?fail_mode,
                "redis decision failed; the fail mode decides until redis answers again",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether Redis is failing follows the latest-sent call that ended, whatever order the
    /// calls end in; each change is told once.
    #[test]
    fn a_call_that_ends_after_a_later_sent_one_changes_nothing() {
        let breaker = Breaker::new(Duration::from_secs(1));
        assert_eq!(breaker.ended(20, true), Some(true), "down");
        assert_eq!(breaker.ended(10, false), None, "a reply on its way");
        assert_eq!(breaker.ended(25, true), Some(false), "still down");
        assert_eq!(breaker.ended(30, false), Some(true), "back");
        assert_eq!(breaker.ended(28, true), None, "a timeout of before");
        assert_eq!(breaker.ended(30, false), Some(false), "the same instant");
        // A stale failure neither warns nor makes the limiter skip Redis.
        let timeout = RedisFailure::Timeout(Duration::from_millis(5));
        breaker.failed("k", &timeout, &RedisFailMode::Propagate, 29);
        assert!(!breaker.skipping(breaker.elapsed()));
        assert_eq!(breaker.failures(), 1, "counted all the same");
    }
}
