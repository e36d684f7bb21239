//! What a response says about when to call again: `Retry-After` (RFC 9110), the draft-11
//! `RateLimit` and `RateLimit-Policy` fields, and the common `X-RateLimit-*` fields.
//!
//! Every span read here is capped by the caller's `max_hold`; nothing read from a header can
//! panic, overflow or make a span longer than that.

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, DATE, RETRY_AFTER};
use http::StatusCode;

use super::sf::{self, Member};

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// An `X-RateLimit-Reset` of at least this many seconds is a Unix time (2001-09-09 or later);
/// a smaller one is a number of seconds from now. No window of a real API lasts 31 years, and
/// no API answering today sends a reset time before 2001.
pub(crate) const EPOCH_RESET_FROM: u64 = 1_000_000_000;

/// How long to hold after a 429 that says nothing about when to come back.
pub(crate) const HOLD_WITHOUT_TIME: Duration = Duration::from_secs(1);

/// The most header lines of one field that are read; the rest are ignored.
const MAX_LINES: usize = 16;

/// The most bytes of one field that are read; a longer field is ignored.
const MAX_FIELD_BYTES: usize = 4096;

/// What one response asks of its caller.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Advice {
    /// Hold every call for this long (`Retry-After` on a 429 or 503, or a 429 without it).
    pub(crate) hold: Option<Duration>,
    /// The most restrictive quota the response advertises.
    pub(crate) limit: Option<Limit>,
}

/// A quota the dependency advertised: `remaining` calls within `window`, and, when its policy is
/// known, `quota.0` calls in each `quota.1` after that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    pub(crate) remaining: u64,
    pub(crate) window: Duration,
    pub(crate) quota: Option<(u64, Duration)>,
}

/// Reads `status` and `headers` as of `wall_now` (the reader's system time), capping every span
/// at `max_hold`. `dependency` names the dependency in logs.
pub(crate) fn read(
    dependency: &str,
    status: StatusCode,
    headers: &HeaderMap,
    wall_now: SystemTime,
    max_hold: Duration,
) -> Advice {
    let reader = Reader {
        dependency,
        max_hold,
        // The server's own clock, when it sends one, so that dates are read without clock skew.
        reference: date_of(headers).unwrap_or(wall_now),
    };
    let limit = reader.limit(headers);
    let overloaded =
        status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
    let mut hold = if overloaded {
        reader.retry_after(headers)
    } else {
        None
    };
    if hold.is_none() && status == StatusCode::TOO_MANY_REQUESTS && limit.is_none() {
        tracing::debug!(
            target: "tower_bulwark::pushback",
            dependency,
            "429 without Retry-After or rate-limit fields; holding {HOLD_WITHOUT_TIME:?}",
        );
        hold = Some(HOLD_WITHOUT_TIME.min(max_hold));
    }
    Advice { hold, limit }
}

struct Reader<'a> {
    dependency: &'a str,
    max_hold: Duration,
    reference: SystemTime,
}

/// The `Date` of a response, if it has exactly one readable one.
fn date_of(headers: &HeaderMap) -> Option<SystemTime> {
    let mut values = headers.get_all(DATE).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    httpdate::parse_http_date(value.to_str().ok()?.trim()).ok()
}

/// A header value shortened and escaped for a log line.
fn shown(value: &[u8]) -> String {
    let end = value.len().min(64);
    let mut text = String::from_utf8_lossy(&value[..end])
        .escape_debug()
        .to_string();
    if value.len() > end {
        text.push('…');
    }
    text
}

/// Non-negative whole seconds, saturating: `None` unless `text` is one or more ASCII digits.
fn whole_seconds(text: &[u8]) -> Option<u64> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(text.iter().fold(0u64, |n, &d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

fn trim(value: &[u8]) -> &[u8] {
    value.trim_ascii()
}

impl Reader<'_> {
    /// `seconds` as a span, capped at `max_hold` (logged when capped).
    fn span(&self, field: &str, seconds: u64) -> Duration {
        let span = Duration::from_secs(seconds);
        if span > self.max_hold {
            tracing::warn!(
                target: "tower_bulwark::pushback",
                dependency = self.dependency,
                field,
                seconds,
                max_hold = ?self.max_hold,
                "the dependency asked for a longer hold than max_hold; capped",
            );
            self.max_hold
        } else {
            span
        }
    }

    /// The span until `at` from the reference time: zero for a time in the past.
    fn until(&self, field: &str, at: SystemTime) -> Duration {
        match at.duration_since(self.reference) {
            Ok(span) => {
                let seconds = span
                    .as_secs()
                    .saturating_add(u64::from(span.subsec_nanos() > 0));
                self.span(field, seconds)
            }
            Err(_) => {
                tracing::debug!(
                    target: "tower_bulwark::pushback",
                    dependency = self.dependency,
                    field,
                    "a time in the past; no hold",
                );
                Duration::ZERO
            }
        }
    }

    fn malformed(&self, field: &str, value: &[u8]) {
        tracing::warn!(
            target: "tower_bulwark::pushback",
            dependency = self.dependency,
            field,
            value = %shown(value),
            "malformed rate-limit field from the dependency; ignored",
        );
    }

    /// `Retry-After`: delta-seconds or an HTTP-date. Of several readable lines the longest wins.
    fn retry_after(&self, headers: &HeaderMap) -> Option<Duration> {
        let mut hold: Option<Duration> = None;
        for value in headers.get_all(RETRY_AFTER).iter().take(MAX_LINES) {
            let text = trim(value.as_bytes());
            let span = if let Some(seconds) = whole_seconds(text) {
                Some(self.span("retry-after", seconds))
            } else {
                std::str::from_utf8(text)
                    .ok()
                    .and_then(|text| httpdate::parse_http_date(text).ok())
                    .map(|at| self.until("retry-after", at))
            };
            match span {
                Some(span) => hold = Some(hold.map_or(span, |h| h.max(span))),
                None => self.malformed("retry-after", value.as_bytes()),
            }
        }
        hold
    }

    /// The field `name`, its lines joined by commas (RFC 9651), or `None` when it is absent or
    /// too long.
    fn joined(&self, headers: &HeaderMap, name: &HeaderName) -> Option<Vec<u8>> {
        let mut joined = Vec::new();
        for (i, value) in headers.get_all(name).iter().enumerate() {
            if i == MAX_LINES || joined.len() + value.len() + 2 > MAX_FIELD_BYTES {
                self.malformed(name.as_str(), value.as_bytes());
                return None;
            }
            if i > 0 {
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(value.as_bytes());
        }
        (!joined.is_empty()).then_some(joined)
    }

    fn list(&self, headers: &HeaderMap, name: &HeaderName) -> Vec<Member> {
        let Some(field) = self.joined(headers, name) else {
            return Vec::new();
        };
        sf::parse_list(&field).unwrap_or_else(|| {
            self.malformed(name.as_str(), &field);
            Vec::new()
        })
    }

    /// The most restrictive quota of `RateLimit` (with `RateLimit-Policy` for windows and
    /// quotas) and `X-RateLimit-*`: the fewest calls remaining, and of those the longest window.
    fn limit(&self, headers: &HeaderMap) -> Option<Limit> {
        let policies = self.list(headers, &RATELIMIT_POLICY);
        let policy = |name: &Option<String>| {
            policies
                .iter()
                .rev()
                .find(|p| p.name.is_some() && p.name == *name)
        };
        let mut limits = Vec::new();
        for item in self.list(headers, &RATELIMIT) {
            let Some(remaining) = item.int("r").and_then(|r| u64::try_from(r).ok()) else {
                tracing::warn!(
                    target: "tower_bulwark::pushback",
                    dependency = self.dependency,
                    "a RateLimit item without a non-negative `r`; ignored",
                );
                continue;
            };
            let policy = policy(&item.name);
            let quota = policy.and_then(|p| {
                let q = u64::try_from(p.int("q")?).ok()?;
                let w = u64::try_from(p.int("w")?).ok().filter(|&w| w > 0)?;
                Some((q, self.span("ratelimit-policy", w)))
            });
            let window = item
                .int("t")
                .or_else(|| policy.and_then(|p| p.int("w")))
                .and_then(|t| u64::try_from(t).ok());
            match window {
                Some(t) => limits.push(Limit {
                    remaining,
                    window: self.span("ratelimit", t),
                    quota,
                }),
                None if remaining == 0 => limits.push(Limit {
                    remaining,
                    window: HOLD_WITHOUT_TIME.min(self.max_hold),
                    quota,
                }),
                // Calls left, but no window to spread them over: nothing to pace by.
                None => {}
            }
        }
        limits.extend(self.x_limit(headers));
        limits
            .into_iter()
            .min_by(|a, b| a.remaining.cmp(&b.remaining).then(b.window.cmp(&a.window)))
    }

    /// One readable line of `name` as whole seconds or a count.
    fn x_number(&self, headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
        let mut values = headers.get_all(name).iter();
        let value = values.next()?;
        let number = if values.next().is_some() {
            None
        } else {
            whole_seconds(trim(value.as_bytes()))
        };
        if number.is_none() {
            self.malformed(name.as_str(), value.as_bytes());
        }
        number
    }

    /// `X-RateLimit-Remaining` with `X-RateLimit-Reset` (seconds from now, or a Unix time from
    /// [`EPOCH_RESET_FROM`] on). `X-RateLimit-Limit` says how many calls a window grants but not
    /// how long a window is, so it grants nothing after the reset.
    fn x_limit(&self, headers: &HeaderMap) -> Option<Limit> {
        let remaining = self.x_number(headers, &X_REMAINING)?;
        let reset = self.x_number(headers, &X_RESET)?;
        let window = if reset >= EPOCH_RESET_FROM {
            let at = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(reset));
            match at {
                Some(at) => self.until("x-ratelimit-reset", at),
                None => self.max_hold,
            }
        } else {
            self.span("x-ratelimit-reset", reset)
        };
        Some(Limit {
            remaining,
            window,
            quota: None,
        })
    }
}
