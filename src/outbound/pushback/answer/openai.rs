//! OpenAI's fields (platform.openai.com/docs/guides/rate-limits, "Rate limits in headers"):
//! `x-ratelimit-remaining-requests` and `x-ratelimit-reset-requests`, the same for `-tokens`,
//! each reset a Go duration (`1s`, `6m0s`, `20ms`), and `x-ratelimit-limit-{requests,tokens}`.
//! The requests are a quota of calls; the tokens hold every call once they are spent, and a
//! call of N tokens until N are back.

use http::header::{HeaderMap, HeaderName};

use super::{family, read_families, when, Dialect, Family, Read, Reader};

const FAMILIES: [Family; 2] = [
    family!("x-ratelimit-", "-requests", counts_calls: true),
    family!("x-ratelimit-", "-tokens", counts_calls: false),
];

/// What each field of the dialect begins with.
pub(super) const PREFIXES: &[&str] = &["x-ratelimit-"];

/// The quotas of OpenAI's families.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Read {
    // The resets are durations; `when::reset` also takes the plain seconds some proxies send.
    read_families(reader, headers, Dialect::OpenAi, &FAMILIES, when::reset)
}
