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

use http::header::{HeaderMap, HeaderName};

use super::{most_restrictive, when, AdvertisedQuota, Dialect, Read, Reader};

const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET_AFTER: HeaderName = HeaderName::from_static("x-ratelimit-reset-after");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// The quota of `X-RateLimit-Remaining` with its reset, or of `RateLimit-Remaining` with its
/// reset, whichever binds, when readable.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Read {
    let x = quota(
        reader,
        headers,
        &X_REMAINING,
        Some(&X_RESET_AFTER),
        &X_RESET,
    );
    let drafts = quota(reader, headers, &REMAINING, None, &RESET);
    (most_restrictive(x.into_iter().chain(drafts)), None)
}

/// What is left in `remaining`, until `reset_after` (seconds from now, whatever their
/// magnitude) when it is readable, else until `reset`.
fn quota(
    reader: &Reader<'_>,
    headers: &HeaderMap,
    remaining: &HeaderName,
    reset_after: Option<&HeaderName>,
    reset: &HeaderName,
) -> Option<AdvertisedQuota> {
    let remaining = reader.single_number(headers, remaining)?;
    let after = reset_after.and_then(|name| {
        reader.reset(headers, name, |value| {
            when::seconds(value).map(when::Reset::In)
        })
    });
    let window = after.or_else(|| reader.reset(headers, reset, when::reset))?;
    Some(AdvertisedQuota::new(Dialect::XRateLimit, remaining, window))
}
