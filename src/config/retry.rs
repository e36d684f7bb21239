//! `[retries.NAME]`: the retries of a dependency, with their budget (feature `adaptive`).

use std::time::Duration;

use super::duration::{optional, with_units};
use super::validate::InstancePath;
use super::ConfigError;

/// `[retries.NAME]`, each field named as the builder's setting.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a table of settings")]
pub(super) struct RetrySettings {
    pub(super) max_attempts: u32,
    /// `base` and `cap` are filled in by the validation.
    #[serde(deserialize_with = "optional")]
    pub(super) base: Option<Duration>,
    #[serde(deserialize_with = "optional")]
    pub(super) cap: Option<Duration>,
    #[serde(deserialize_with = "with_units")]
    pub(super) max_wait: Duration,
    pub(super) ratio: f64,
    pub(super) min_per_second: u32,
    #[serde(deserialize_with = "with_units")]
    pub(super) window: Duration,
}

/// The builder's default backoff, `base` and `cap`, which the validation brings within the
/// one written.
const BASE: Duration = Duration::from_millis(50);
const CAP: Duration = Duration::from_secs(1);
/// The longest `cap` the builder takes: a base beyond it is refused naming `base`.
const LONGEST: Duration = Duration::from_secs(3600);

/// The builder's defaults, spelled here so that the file parses without the `adaptive` feature
/// (the validation then refuses the section); a test checks that they agree.
impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base: None,
            cap: None,
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
        // Left out, each follows the other written: `cap = "10ms"` alone lowers the base.
        let base = (self.base).unwrap_or(BASE.min(self.cap.unwrap_or(Duration::MAX)));
        self.cap = Some(self.cap.unwrap_or(CAP.max(base).min(LONGEST)));
        self.base = Some(base);
        #[cfg(feature = "adaptive")]
        self.build(at.name())?;
        Ok(())
    }

    /// Retries `name`, or the error naming the field the builder refuses.
    #[cfg(feature = "adaptive")]
    pub(super) fn build(&self, name: &str) -> Result<crate::outbound::retry::Retry, ConfigError> {
        (crate::outbound::retry::Retry::builder(name))
            .max_attempts(self.max_attempts)
            .backoff(self.base.unwrap_or_default(), self.cap.unwrap_or_default())
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
        assert_eq!((super::BASE, super::CAP), (r::DEFAULT_BASE, r::DEFAULT_CAP));
        assert_eq!(super::LONGEST, r::LONGEST);
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

    /// A `base` or `cap` left out follows the one written, rather than refusing the section for
    /// a field the file does not have: the backoff is then `base` alone, at every retry.
    #[test]
    fn base_or_cap_left_out_follows_the_one_written() {
        for (written, base, cap) in [
            ("cap = \"10ms\"", 10, 10),
            ("base = \"2s\"", 2000, 2000),
            ("base = \"10ms\"", 10, 1000),
            ("cap = \"5s\"", 50, 5000),
        ] {
            let text = format!("[retries.partner]\n{written}\n");
            assert!(Registry::from_toml_str(&text).is_ok(), "{written}");
            let config = crate::config::file::Config::from_toml_str(&text).unwrap();
            let partner = &config.retries["partner"];
            let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_millis());
            assert_eq!(
                (ms(partner.base), ms(partner.cap)),
                (Some(base), Some(cap)),
                "{written}"
            );
        }
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let cases = [
            ("max_attempts = 0", "max_attempts"),
            ("max_attempts = 11", "max_attempts"),
            ("max_attempts = -1", "max_attempts"),
            ("base = \"2s\"\ncap = \"1s\"", "base"),
            ("cap = \"2h\"", "cap"),
            ("base = \"2h\"", "base"),
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
