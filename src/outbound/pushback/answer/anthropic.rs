//! Anthropic's fields (docs.anthropic.com/en/api/rate-limits, "Response headers"):
//! `anthropic-ratelimit-requests-remaining` and `anthropic-ratelimit-requests-reset`, the same
//! for `-tokens`, `-input-tokens` and `-output-tokens`, each reset an RFC 3339 time. The
//! requests are a quota of calls; each family of tokens holds calls only once it is spent.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName};

use super::{most_restrictive_family, when, AdvertisedQuota, Dialect, Family, Reader};

const fn family(remaining: &'static str, reset: &'static str, counts_calls: bool) -> Family {
    Family {
        remaining: HeaderName::from_static(remaining),
        reset: HeaderName::from_static(reset),
        counts_calls,
    }
}

const FAMILIES: [Family; 4] = [
    family(
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
        true,
    ),
    family(
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
        false,
    ),
    family(
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
        false,
    ),
    family(
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
        false,
    ),
];

/// The binding quota of Anthropic's families.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Option<AdvertisedQuota> {
    let reset = |field: &str, value: &[u8]| -> Option<Duration> {
        match when::rfc3339(value) {
            Some(at) => Some(reader.until(field, at)),
            None => {
                reader.malformed(field, value);
                None
            }
        }
    };
    most_restrictive_family(reader, headers, Dialect::Anthropic, &FAMILIES, reset)
}
