//! The error of a builder's setting out of its range (feature `adaptive`): one type for the
//! adaptive bulkhead, the overload protection, the retries and the circuit breaker.

use std::fmt;

/// A builder's setting was out of its range: the message names what was being built, the
/// setting, the value given and what was expected, such as "retry: `max_attempts` must be from
/// 1 to 10, got 0".
///
/// Made by the builders of [`AdaptiveBulkhead`](crate::bulkhead::adaptive::AdaptiveBulkhead)
/// and its algorithms, [`Overload`](crate::overload::Overload),
/// [`Retry`](crate::outbound::retry::Retry) and [`Breaker`](crate::outbound::breaker::Breaker);
/// the configuration file reports it at the field of the same name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingError {
    of: &'static str,
    setting: &'static str,
    value: String,
    expected: &'static str,
}

impl SettingError {
    /// The name of the setting that was refused, such as `min_limit`, `guarantee`,
    /// `max_attempts` or `failure_rate`: the argument of the builder's method, and the field of
    /// the configuration file.
    pub fn setting(&self) -> &str {
        self.setting
    }
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            of,
            setting,
            value,
            expected,
        } = self;
        write!(f, "{of}: `{setting}` must be {expected}, got {value}")
    }
}

impl std::error::Error for SettingError {}

/// `Ok` if `ok`, otherwise the error that `setting` of `of` (what is being built), given
/// `value`, must be `expected`.
pub(crate) fn ensure(
    of: &'static str,
    ok: bool,
    setting: &'static str,
    value: impl fmt::Debug,
    expected: &'static str,
) -> Result<(), SettingError> {
    if ok {
        return Ok(());
    }
    Err(SettingError {
        of,
        setting,
        value: format!("{value:?}"),
        expected,
    })
}
