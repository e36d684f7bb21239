//! OpenAI's fields (platform.openai.com/docs/guides/rate-limits, "Rate limits in headers"):
//! `x-ratelimit-remaining-requests` and `x-ratelimit-reset-requests`, the same for `-tokens`,
//! each reset a Go duration (`1s`, `6m0s`, `20ms`). The requests are a quota of calls; the
//! tokens hold calls only once they are spent.

use http::header::{HeaderMap, HeaderName};

use super::{most_restrictive_family, AdvertisedQuota, Dialect, Family, Reader};

const FAMILIES: [Family; 2] = [
    Family {
        remaining: HeaderName::from_static("x-ratelimit-remaining-requests"),
        reset: HeaderName::from_static("x-ratelimit-reset-requests"),
        counts_calls: true,
    },
    Family {
        remaining: HeaderName::from_static("x-ratelimit-remaining-tokens"),
        reset: HeaderName::from_static("x-ratelimit-reset-tokens"),
        counts_calls: false,
    },
];

/// The binding quota of OpenAI's families.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Option<AdvertisedQuota> {
    // The resets are durations; `Reader::reset` also takes the plain seconds some proxies send.
    let reset = |field: &str, value: &[u8]| reader.reset(field, value);
    most_restrictive_family(reader, headers, Dialect::OpenAi, &FAMILIES, reset)
}
