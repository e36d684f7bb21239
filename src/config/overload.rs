//! `[overload.NAME]`: an overload protection of the whole service, each request's class read
//! from a header.

use std::time::Duration;

use super::duration::optional;
use super::fields::Count;
use super::file::MAX_LIMIT;
use super::validate::InstancePath;
use super::ConfigError;

/// `[overload.NAME]`.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a table of settings")]
pub(super) struct OverloadSettings {
    /// The three limits are filled in by the validation.
    pub(super) min_limit: Option<Count<MAX_LIMIT>>,
    pub(super) initial_limit: Option<Count<MAX_LIMIT>>,
    pub(super) max_limit: Option<Count<MAX_LIMIT>>,
    pub(super) probe_every: Count,
    pub(super) critical_guarantee: f64,
    pub(super) default_guarantee: f64,
    pub(super) critical_borrowing: f64,
    pub(super) priority_header: String,
    pub(super) queue_capacity: Option<Count>,
    #[serde(deserialize_with = "optional")]
    pub(super) max_wait: Option<Duration>,
}

/// A field left out keeps its default: the builder's (`overload::DEFAULT_*`, which a build
/// without `adaptive` cannot name; `an_overload_section_builds_with_its_defaults_or_its_settings`
/// checks they agree).
impl Default for OverloadSettings {
    fn default() -> Self {
        Self {
            min_limit: None,
            initial_limit: None,
            max_limit: None,
            probe_every: Count(300),
            critical_guarantee: 0.3,
            default_guarantee: 0.1,
            critical_borrowing: 3.0,
            priority_header: "x-priority".into(),
            queue_capacity: None,
            max_wait: None,
        }
    }
}

impl OverloadSettings {
    /// Fills in the limits left out, then checks what the builder would refuse by building it,
    /// naming the field: the builder's own checks are the validation.
    pub(super) fn validate(&mut self, at: &InstancePath<'_>) -> Result<(), ConfigError> {
        at.needs_adaptive("an overload protection needs")?;
        // A header name is case-insensitive: written in capitals, it is the same setting.
        self.priority_header.make_ascii_lowercase();
        #[cfg(feature = "adaptive")]
        at.limits(
            [
                &mut self.min_limit,
                &mut self.initial_limit,
                &mut self.max_limit,
            ],
            crate::overload::DEFAULT_LIMITS,
        )?;
        match (self.queue_capacity, self.max_wait) {
            (Some(_), None) => return Err(at.err("max_wait", "is required with queue_capacity")),
            (None, Some(_)) => return Err(at.err("queue_capacity", "is required with max_wait")),
            _ => {}
        }
        #[cfg(feature = "adaptive")]
        build_overload(at.name(), self)?;
        Ok(())
    }
}

/// The protection `s` describes (validated); a setting the builder refuses is an error at its
/// field.
#[cfg(feature = "adaptive")]
pub(super) fn build_overload(
    name: &str,
    s: &OverloadSettings,
) -> Result<crate::overload::Overload, ConfigError> {
    use crate::bulkhead::adaptive::Limits;
    use crate::overload::{default_algorithm, Overload, Priority};

    let path = format!("overload.{name}");
    // The builder names both guarantees `guarantee`; the file, each its own field.
    let at = |field: &'static str| {
        let path = &path;
        move |e: crate::SettingError| InstancePath(path).err(field, e.to_string())
    };
    let setting = |e: crate::SettingError| ConfigError::setting(&path, &e);
    let (min, initial, max) = super::validate::filled([s.min_limit, s.initial_limit, s.max_limit]);
    let header = http::HeaderName::from_bytes(s.priority_header.as_bytes()).map_err(|e| {
        InstancePath(&path).err("priority_header", format!("is not a header name: {e}"))
    })?;
    let mut builder = Overload::builder(name)
        .limits(Limits::new(min, initial, max).map_err(setting)?)
        .algorithm(default_algorithm(s.probe_every.0).map_err(setting)?)
        // The builder checks the guarantees together as each is set, against the others as
        // they stand: the defaults go first, so that the file's two are summed alone.
        .guarantee(Priority::Critical, 0.0)
        .and_then(|b| b.guarantee(Priority::Default, 0.0))
        .map_err(setting)?
        .guarantee(Priority::Critical, s.critical_guarantee)
        .map_err(at("critical_guarantee"))?
        .guarantee(Priority::Default, s.default_guarantee)
        .map_err(at("default_guarantee"))?
        .critical_borrowing(s.critical_borrowing)
        .map_err(setting)?
        .priority_by(move |head| {
            let value = head.headers.get(&header).and_then(|v| v.to_str().ok());
            value.map_or(Priority::Default, Priority::from_header_value)
        });
    if let (Some(capacity), Some(wait)) = (s.queue_capacity, s.max_wait) {
        builder = builder.queue(capacity.0 as usize, wait).map_err(setting)?;
    }
    Ok(builder.build())
}

#[cfg(feature = "adaptive")]
#[cfg(test)]
mod tests {
    use crate::config::Registry;
    use crate::overload::Priority;

    #[test]
    fn an_overload_section_builds_with_its_defaults_or_its_settings() {
        let text = "[overload.api]\n\
                    [overload.checkout]\nmin_limit = 4\ninitial_limit = 10\nmax_limit = 50\n\
                    critical_guarantee = 0.5\ndefault_guarantee = 0.2\npriority_header = \"x-class\"\n\
                    queue_capacity = 16\nmax_wait = \"100ms\"\ncritical_borrowing = 1.5\n\
                    probe_every = 50\n";
        let registry = Registry::from_toml_str(text).unwrap();
        let api = registry.overload("api").unwrap();
        assert_eq!(api.limit(), 16);
        assert_eq!(api.ceiling(Priority::Default), 16 - 5, "a guarantee of 0.3");
        assert_eq!(
            api.ceiling(Priority::Critical),
            48,
            "borrowing 3 times the limit"
        );
        let checkout = registry.overload("checkout").unwrap();
        assert_eq!(checkout.limit(), 10);
        assert_eq!(checkout.ceiling(Priority::Default), 5);
        assert_eq!(checkout.ceiling(Priority::Sheddable), 3);
        assert_eq!(checkout.ceiling(Priority::Critical), 15);
        assert!(registry.overload("nope").is_err());
    }

    /// The builder's checks are the file's: a value it refuses is an error at the file's field,
    /// with the builder's words.
    #[test]
    fn a_setting_the_builder_refuses_is_an_error_at_its_field() {
        for (written, path, message) in [
            (
                "critical_guarantee = 1.0",
                "overload.api.critical_guarantee",
                "overload: `guarantee` must be",
            ),
            (
                "critical_guarantee = 0.7\ndefault_guarantee = 0.3",
                "overload.api.default_guarantee",
                "for all classes together, got 1.0",
            ),
            (
                "critical_borrowing = 0.5",
                "overload.api.critical_borrowing",
                "must be from 1 to 100, got 0.5",
            ),
            (
                "queue_capacity = 1\nmax_wait = \"61s\"",
                "overload.api.max_wait",
                "must be at most 60 s, got 61s",
            ),
        ] {
            let text = format!("[overload.api]\n{written}\n");
            let err = Registry::from_toml_str(&text).unwrap_err();
            assert_eq!(err.path(), path, "{written}: {err}");
            assert!(err.message().contains(message), "{written}: {err}");
        }
    }

    #[tokio::test]
    async fn the_class_comes_from_the_configured_header() {
        use tower::{Layer, Service, ServiceExt};
        let text = "[overload.api]\nmin_limit = 3\ninitial_limit = 3\nmax_limit = 3\n\
                    critical_guarantee = 0.34\ndefault_guarantee = 0.0\npriority_header = \"X-Class\"\n";
        let registry = Registry::from_toml_str(text).unwrap();
        let overload = registry.overload("api").unwrap();
        assert_eq!(overload.ceiling(Priority::Default), 2);
        let held = tower::service_fn(|_: http::Request<String>| {
            std::future::pending::<Result<http::Response<String>, std::convert::Infallible>>()
        });
        let mut service = overload.layer().layer(held);
        let request = |name: &str, value: &str| {
            let request = http::Request::get("/").header(name, value);
            request.body(String::new()).unwrap()
        };
        let _first = service.call(request("x-class", "default"));
        let _second = service.call(request("x-other", "critical"));
        assert_eq!(overload.in_flight(), 2);
        let third = service
            .ready()
            .await
            .unwrap()
            .call(request("x-priority", "critical"));
        assert_eq!(
            third.await.unwrap().status(),
            503,
            "x-priority is not the header"
        );
        let _fourth = service.call(request("x-class", "critical"));
        assert_eq!(overload.in_flight(), 3, "critical by x-class");
    }

    /// Limits left out follow those written (the adaptive bulkhead's rule), rather than the
    /// section being refused for a field the file does not have: the initial limit is then its
    /// default, 16, brought within them.
    #[test]
    fn limits_left_out_follow_those_written() {
        for (written, limit) in [
            ("max_limit = 4", 4),
            ("min_limit = 20", 20),
            ("initial_limit = 2000", 2000),
            ("initial_limit = 3", 3),
            ("min_limit = 2\nmax_limit = 12", 12),
            ("min_limit = 1", 16),
        ] {
            let text = format!("[overload.api]\n{written}\n");
            let registry = Registry::from_toml_str(&text).unwrap();
            assert_eq!(
                registry.overload("api").unwrap().limit(),
                limit,
                "{written}"
            );
        }
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let cases = [
            ("min_limit = 0", "min_limit"),
            ("min_limit = 20\nmax_limit = 10", "min_limit"),
            ("initial_limit = 2000\nmax_limit = 1000", "initial_limit"),
            ("min_limit = 20\ninitial_limit = 10", "initial_limit"),
            ("critical_guarantee = 1.0", "critical_guarantee"),
            ("critical_guarantee = -0.1", "critical_guarantee"),
            (
                "critical_guarantee = 0.7\ndefault_guarantee = 0.3",
                "default_guarantee",
            ),
            ("priority_header = \"x priority\"", "priority_header"),
            ("queue_capacity = 4", "max_wait"),
            ("max_wait = \"1s\"", "queue_capacity"),
            ("queue_capacity = 4\nmax_wait = \"2m\"", "max_wait"),
            ("critical_guarantee = \"high\"", "critical_guarantee"),
            ("critical_borrowing = 0.5", "critical_borrowing"),
            ("critical_borrowing = 101.0", "critical_borrowing"),
            ("probe_every = 0", "probe_every"),
            ("limit = 3", "limit"),
        ];
        crate::config::tests::assert_refused_naming_field("overload.api", &cases);
    }

    #[test]
    fn a_reload_refuses_a_changed_overload_and_keeps_an_unchanged_one() {
        let registry = Registry::from_toml_str("[overload.api]\nmax_limit = 100\n").unwrap();
        let same = registry.reload_toml_str("[overload.api]\nmax_limit = 100\n");
        assert!(same.is_ok(), "{same:?}");
        let err = (registry.reload_toml_str("[overload.api]\nmax_limit = 200\n")).unwrap_err();
        assert_eq!(err.path(), "overload.api.max_limit");
        let err = registry.reload_toml_str("").unwrap_err();
        assert_eq!(err.path(), "overload.api");
    }
}
