//! `[retries.NAME]`: the retries of a dependency, with their budget (feature `adaptive`).

use std::time::Duration;

use super::duration::with_units;
use super::validate::InstancePath;
use super::ConfigError;

/// `[retries.NAME]`, each field named as the builder's setting.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a table of settings")]
pub(super) struct RetrySettings {
    pub(super) max_attempts: u32,
    #[serde(deserialize_with = "with_units")]
    pub(super) base: Duration,
    #[serde(deserialize_with = "with_units")]
    pub(super) cap: Duration,
    #[serde(deserialize_with = "with_units")]
    pub(super) max_wait: Duration,
    pub(super) ratio: f64,
    pub(super) min_per_second: u32,
    #[serde(deserialize_with = "with_units")]
    pub(super) window: Duration,
}

/// The builder's defaults, spelled here so that the file parses without the `adaptive` feature
/// (the validation then refuses the section); a test checks that they agree.
impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base: Duration::from_millis(50),
            cap: Duration::from_secs(1),
            max_wait: Duration::from_secs(5),
            ratio: 0.2,
            min_per_second: 3,
            window: Duration::from_secs(10),
        }
    }
}

impl RetrySettings {
    /// Checks what the builder would refuse, naming the field.
    pub(super) fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        at.needs_adaptive("retries need")?;
        #[cfg(feature = "adaptive")]
        self.build(at.name())?;
        Ok(())
    }

    /// Retries `name`, or the error naming the field the builder refuses.
    #[cfg(feature = "adaptive")]
    pub(super) fn build(&self, name: &str) -> Result<crate::outbound::retry::Retry, ConfigError> {
        (crate::outbound::retry::Retry::builder(name))
            .max_attempts(self.max_attempts)
            .backoff(self.base, self.cap)
            .max_wait(self.max_wait)
            .budget(self.ratio, self.min_per_second, self.window)
            .build()
            .map_err(|e| ConfigError::setting(&format!("retries.{name}"), &e))
    }
}

#[cfg(feature = "adaptive")]
#[cfg(test)]
mod tests {
    use crate::config::Registry;
    use crate::outbound::retry as r;

    #[test]
    fn the_files_defaults_are_the_builders() {
        let defaults: super::RetrySettings = toml::from_str("").unwrap();
        assert_eq!(defaults.max_attempts, r::DEFAULT_MAX_ATTEMPTS);
        assert_eq!(
            (defaults.base, defaults.cap),
            (r::DEFAULT_BASE, r::DEFAULT_CAP)
        );
        assert_eq!(defaults.max_wait, r::DEFAULT_MAX_WAIT);
        assert_eq!(defaults.ratio, r::DEFAULT_RATIO);
        assert_eq!(defaults.min_per_second, r::DEFAULT_MIN_PER_SECOND);
        assert_eq!(defaults.window, r::DEFAULT_WINDOW);
    }

    #[test]
    fn a_retries_section_builds_with_its_defaults_or_its_settings() {
        let text = "[retries.partner]\n\
                    [retries.search]\nmax_attempts = 2\nbase = \"10ms\"\ncap = \"100ms\"\n\
                    max_wait = \"2s\"\nratio = 0.5\nmin_per_second = 1\nwindow = \"4s\"\n";
        let registry = Registry::from_toml_str(text).unwrap();
        let partner = registry.retry("partner").unwrap();
        assert_eq!(
            (partner.name(), partner.budget_available()),
            ("partner", 30)
        );
        let search = registry.retry("search").unwrap();
        assert_eq!(search.budget_available(), 4);
        assert!(registry.retry("nope").is_err());
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let cases = [
            ("max_attempts = 0", "max_attempts"),
            ("max_attempts = 11", "max_attempts"),
            ("max_attempts = -1", "max_attempts"),
            ("base = \"2s\"\ncap = \"1s\"", "base"),
            ("cap = \"2h\"", "cap"),
            ("cap = 5", "cap"),
            ("max_wait = \"2h\"", "max_wait"),
            ("ratio = -0.1", "ratio"),
            ("ratio = nan", "ratio"),
            ("ratio = \"a fifth\"", "ratio"),
            ("min_per_second = -3", "min_per_second"),
            ("window = \"1ms\"", "window"),
            ("window = \"2h\"", "window"),
            ("attempts = 3", "attempts"),
        ];
        crate::config::tests::assert_refused_naming_field("retries.partner", &cases);
    }

    #[test]
    fn a_reload_refuses_changed_retries() {
        let registry = Registry::from_toml_str("[retries.partner]\nratio = 0.1\n").unwrap();
        assert!(registry
            .reload_toml_str("[retries.partner]\nratio = 0.1\n")
            .is_ok());
        let err = (registry.reload_toml_str("[retries.partner]\nratio = 0.3\n")).unwrap_err();
        assert_eq!(err.path(), "retries.partner.ratio");
    }
}
