//! The common `X-RateLimit-Remaining` and `X-RateLimit-Reset` fields, which no standard
//! defines.
//!
//! `X-RateLimit-Reset` is read as seconds from now below [`EPOCH_RESET_FROM`] and as a Unix
//! time from there on. `X-RateLimit-Limit` is not used: it says how many calls a window grants
//! but not how long the window is, so it grants nothing after the reset.

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName};

use super::{AdvertisedQuota, Dialect, Reader};

const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// An `X-RateLimit-Reset` of at least this many seconds is a Unix time (2001-09-09 or later);
/// a smaller one is a number of seconds from now. No window of a real API lasts 31 years, and
/// no API answering today sends a reset time before 2001.
const EPOCH_RESET_FROM: u64 = 1_000_000_000;

/// The quota of `X-RateLimit-Remaining` with `X-RateLimit-Reset`, when both are readable.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Option<AdvertisedQuota> {
    let remaining = reader.single_number(headers, &X_REMAINING)?;
    let reset = reader.single_number(headers, &X_RESET)?;
    let window = if reset >= EPOCH_RESET_FROM {
        match SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(reset)) {
            Some(at) => reader.until("x-ratelimit-reset", at),
            None => reader.max_hold,
        }
    } else {
        reader.span("x-ratelimit-reset", reset)
    };
    Some(AdvertisedQuota {
        dialect: Dialect::XRateLimit,
        remaining,
        window,
        refill: None,
    })
}
