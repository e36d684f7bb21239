//! Errors of the Redis store.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// A decision that Redis could not give: it timed out, failed, or answered something that is not
/// a decision.
///
/// The limiter's [`RedisFailMode`](super::RedisFailMode) turns it into a decision; only
/// [`RedisFailMode::Propagate`](super::RedisFailMode::Propagate) hands it to the caller, as the
/// `BoxError` of [`Limiter::reserve`](crate::Limiter::reserve) (test it with
/// `err.is::<RedisFailure>()`, then match the variant).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum RedisFailure {
    /// No answer within the limiter's timeout.
    Timeout(Duration),
    /// The client failed: no connection, a script error, ...
    Redis(redis::RedisError),
    /// A reply of the wrong shape, type or range, which says what is wrong.
    BadReply(String),
    /// A client clock beyond what the scripts can take exactly.
    ClockOutOfRange(u64),
    /// Not asked, since Redis failed less than a probe interval ago.
    Skipped,
    /// The script ran after the decision's deadline, so it changed nothing (Redis was too slow
    /// for this caller).
    Late,
}

impl RedisFailure {
    /// Whether the failure is about reaching Redis at all (a timeout, a refused or dropped
    /// connection), rather than about one key's state or one reply.
    pub(crate) fn is_unavailable(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Redis(err) => {
                err.is_io_error()
                    || err.is_connection_refusal()
                    || err.is_connection_dropped()
                    || err.is_timeout()
                    || err.is_unrecoverable_error()
                    || err.is_cluster_error()
            }
            Self::BadReply(_) | Self::ClockOutOfRange(_) | Self::Skipped | Self::Late => false,
        }
    }
}

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(after) => write!(f, "redis did not answer within {after:?}"),
            Self::Redis(err) => write!(f, "redis failed: {err}"),
            Self::BadReply(what) => write!(f, "redis replied with something else than a decision: {what}"),
            Self::Late => f.write_str(
                "redis ran the script after the decision's deadline, so it changed nothing",
            ),
            Self::Skipped => f.write_str(
                "redis failed a moment ago and is not asked again before the probe interval ends",
            ),
            Self::ClockOutOfRange(now) => write!(
                f,
                "redis scripts cannot take the client clock's time {now} exactly (at most 2^52 ticks)"
            ),
        }
    }
}

impl Error for RedisFailure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Redis(err) => Some(err),
            _ => None,
        }
    }
}

/// A Redis limiter that cannot be built as configured: the reason says which setting is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError {
    /// The builder's setting at fault (its method's name), where one is.
    setting: Option<&'static str>,
    reason: &'static str,
}

impl BuildError {
    pub(crate) fn new(reason: &'static str) -> Self {
        Self {
            setting: None,
            reason,
        }
    }

    /// An error of the builder's setting `setting` (its method's name).
    pub(crate) fn at(setting: &'static str, reason: &'static str) -> Self {
        Self {
            setting: Some(setting),
            reason,
        }
    }

    /// The builder's setting at fault, where one is: what the config file names by its field.
    #[cfg_attr(not(feature = "config"), allow(dead_code))]
    pub(crate) fn setting(&self) -> Option<&'static str> {
        self.setting
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid redis limiter: {}", self.reason)
    }
}

impl Error for BuildError {}
