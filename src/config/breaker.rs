//! `[breakers.NAME]`: a circuit breaker in front of a dependency (feature `adaptive`).
//!
//! A field left out keeps the builder's default; the builder's own check is the validation, so
//! a bad value is refused by the same rule as in code, at the field of the same name.

use std::time::Duration;

use super::duration::optional;
use super::fields::Count;
use super::validate::InstancePath;
use super::ConfigError;

/// `[breakers.NAME]`.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct BreakerSettings {
    pub(super) window_calls: Option<Count>,
    pub(super) window_seconds: Option<Count>,
    pub(super) minimum_calls: Option<Count>,
    pub(super) failure_rate: Option<f64>,
    pub(super) slow_call_rate: Option<f64>,
    #[serde(default, deserialize_with = "optional")]
    pub(super) slow_call_duration: Option<Duration>,
    #[serde(default, deserialize_with = "optional")]
    pub(super) open_for: Option<Duration>,
    pub(super) half_open_calls: Option<Count>,
}

impl BreakerSettings {
    /// Checks what the builder would refuse, naming the field, and writes in the settings the
    /// builder filled in, so that writing a default out is no change.
    pub(super) fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        at.needs_adaptive("a circuit breaker needs")?;
        if self.window_calls.is_some() && self.window_seconds.is_some() {
            let both = "is given with window_calls; a window counts calls or seconds, not both";
            return Err(at.err("window_seconds", both));
        }
        #[cfg(feature = "adaptive")]
        {
            use crate::outbound::breaker::Window;
            let built = *build_breaker(at.name(), self)?.settings();
            let (calls, seconds) = match built.window {
                Window::Calls(n) => (Some(Count(n)), None),
                Window::Seconds(n) => (None, Some(Count(n))),
            };
            *self = Self {
                window_calls: calls,
                window_seconds: seconds,
                minimum_calls: Some(Count(built.minimum_calls)),
                failure_rate: Some(built.failure_rate),
                slow_call_rate: Some(built.slow_call_rate),
                slow_call_duration: Some(built.slow_call_duration),
                open_for: Some(built.open_for),
                half_open_calls: Some(Count(built.half_open_calls)),
            };
        }
        Ok(())
    }
}

/// The breaker `s` describes (validated); a setting the builder refuses is an error at its
/// field.
#[cfg(feature = "adaptive")]
pub(super) fn build_breaker(
    name: &str,
    s: &BreakerSettings,
) -> Result<crate::outbound::Breaker, ConfigError> {
    use super::build::Given;
    use crate::outbound::breaker::{Breaker, BreakerBuilder as B, Window};

    let builder = Breaker::builder(name)
        .given(s.window_calls, |b, n| b.window(Window::Calls(n.0)))
        .given(s.window_seconds, |b, n| b.window(Window::Seconds(n.0)))
        .given(s.minimum_calls, |b, n| b.minimum_calls(n.0))
        .given(s.failure_rate, B::failure_rate)
        .given(s.slow_call_rate, B::slow_call_rate)
        .given(s.slow_call_duration, B::slow_call_duration)
        .given(s.open_for, B::open_for)
        .given(s.half_open_calls, |b, n| b.half_open_calls(n.0));
    (builder.build()).map_err(|e| ConfigError::setting(&format!("breakers.{name}"), &e))
}
