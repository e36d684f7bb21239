//! Anthropic's fields (docs.anthropic.com/en/api/rate-limits, "Response headers"):
//! `anthropic-ratelimit-requests-remaining` and `anthropic-ratelimit-requests-reset`, the same
//! for `-tokens`, `-input-tokens` and `-output-tokens`, each reset an RFC 3339 time, and each
//! family's `-limit`. The requests are a quota of calls; each family of tokens holds every call
//! once it is spent, and a call of N tokens until N are back.

use http::header::{HeaderMap, HeaderName};

use super::{family, read_families, when, Dialect, Family, Read, Reader};

const FAMILIES: [Family; 4] = [
    family!("anthropic-ratelimit-requests-", "", counts_calls: true),
    family!("anthropic-ratelimit-tokens-", "", counts_calls: false),
    family!("anthropic-ratelimit-input-tokens-", "", counts_calls: false),
    family!("anthropic-ratelimit-output-tokens-", "", counts_calls: false),
];

/// What each field of the dialect begins with.
pub(super) const PREFIXES: &[&str] = &["anthropic-ratelimit-"];

/// The quotas of Anthropic's families.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Read {
    // A reset is an RFC 3339 instant, read as the span until it.
    let reset = |value: &[u8]| when::rfc3339(value).map(when::Reset::At);
    read_families(reader, headers, Dialect::Anthropic, &FAMILIES, reset)
}
