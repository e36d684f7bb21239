//! The `X-RateLimit-*` fields, which no standard defines, and the `RateLimit-Remaining` and
//! `RateLimit-Reset` fields of the drafts before -07, which GitLab sends.
//!
//! What is left is `X-RateLimit-Remaining` (or `RateLimit-Remaining`). When it resets is
//! `X-RateLimit-Reset-After` when present and readable (Discord: decimal seconds from now,
//! whatever their magnitude, which no clock skew moves), else `X-RateLimit-Reset` (or
//! `RateLimit-Reset`), read as `when::reset` says: a Unix time in seconds (GitHub) or
//! milliseconds, with or without a fraction (Discord), told apart by magnitude, or seconds or
//! a Go duration from now. `X-RateLimit-Limit` is not used:
//! it says how many calls a window grants but not how long the window is, so it grants
//! nothing after the reset.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName};

use super::{quota_name, when, AdvertisedQuota, Dialect, Read, Reader};

const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET_AFTER: HeaderName = HeaderName::from_static("x-ratelimit-reset-after");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// What each field of the dialect begins with.
pub(super) const PREFIXES: &[&str] = &["x-ratelimit-", "ratelimit-"];

/// The quota of `X-RateLimit-Remaining` with its reset, and of `RateLimit-Remaining` with its
/// reset, each when readable.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Read {
    let x = quota(reader, headers, &X_REMAINING, || {
        // Seconds from now, whatever their magnitude, when readable; else the reset.
        let seconds = |value: &[u8]| when::seconds(value).map(when::Reset::In);
        let after = reader.reset(headers, &X_RESET_AFTER, seconds);
        after.or_else(|| reader.reset(headers, &X_RESET, when::reset))
    });
    let drafts = quota(reader, headers, &REMAINING, || {
        reader.reset(headers, &RESET, when::reset)
    });
    (x.into_iter().chain(drafts).collect(), None)
}

/// What is left in `field`, until the span `window` reads, which is read only once what is
/// left has been.
fn quota(
    reader: &Reader<'_>,
    headers: &HeaderMap,
    field: &HeaderName,
    window: impl FnOnce() -> Option<Duration>,
) -> Option<AdvertisedQuota> {
    let remaining = reader.single_number(headers, field)?;
    let window = window()?;
    let name = quota_name(field.as_str());
    Some(AdvertisedQuota::new(
        Dialect::XRateLimit,
        name,
        remaining,
        window,
    ))
}
