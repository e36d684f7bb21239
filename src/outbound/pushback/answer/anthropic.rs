//! Anthropic's fields (docs.anthropic.com/en/api/rate-limits, "Response headers"):
//! `anthropic-ratelimit-requests-remaining` and `anthropic-ratelimit-requests-reset`, the same
//! for `-tokens`, `-input-tokens` and `-output-tokens`, each reset an RFC 3339 time, and each
//! family's `-limit`. The requests are a quota of calls; each family of tokens holds every call
//! once it is spent, and a call of N tokens until N are back.

use http::header::{HeaderMap, HeaderName};

use super::{read_families, when, Dialect, Family, Read, Reader};

const fn family(
    limit: &'static str,
    remaining: &'static str,
    reset: &'static str,
    counts_calls: bool,
) -> Family {
    Family {
        limit: HeaderName::from_static(limit),
        remaining: HeaderName::from_static(remaining),
        reset: HeaderName::from_static(reset),
        counts_calls,
    }
}

const FAMILIES: [Family; 4] = [
    family(
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
        true,
    ),
    family(
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
        false,
    ),
    family(
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
        false,
    ),
    family(
        "anthropic-ratelimit-output-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
        false,
    ),
];

/// The binding quota of Anthropic's families.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Read {
    // A reset is an RFC 3339 instant, read as the span until it.
    let reset = |field: &str, value: &[u8]| {
        Some(reader.until(field, reader.parsed(field, value, when::rfc3339)?))
    };
    read_families(reader, headers, Dialect::Anthropic, &FAMILIES, reset)
}
