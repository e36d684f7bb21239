//! The error of a bad adaptive setting.

use std::fmt;

/// A setting of an adaptive bulkhead or of its algorithm was out of range; the message names the
/// setting, the value given and what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdaptiveConfigError {
    setting: &'static str,
    value: String,
    expected: &'static str,
}

impl AdaptiveConfigError {
    /// The name of the setting that was refused, such as `min_limit` or `backoff`.
    pub fn setting(&self) -> &str {
        self.setting
    }
}

impl fmt::Display for AdaptiveConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "adaptive bulkhead: `{}` must be {}, got {}",
            self.setting, self.expected, self.value
        )
    }
}

impl std::error::Error for AdaptiveConfigError {}

/// `Ok` if `ok`, otherwise the error that `setting`, given `value`, must be `expected`.
pub(super) fn ensure(
    ok: bool,
    setting: &'static str,
    value: impl fmt::Display,
    expected: &'static str,
) -> Result<(), AdaptiveConfigError> {
    if ok {
        return Ok(());
    }
    let value = value.to_string();
    Err(AdaptiveConfigError {
        setting,
        value,
        expected,
    })
}
