//! `Retry-After` (RFC 9110, section 10.2.3): delta-seconds or an HTTP-date; decimal seconds
//! too (`2.0`, as Shopify writes it), rounded up to the nanosecond. And `retry-after-ms`
//! (OpenAI, Azure OpenAI): the same hold in milliseconds, which counts instead when readable,
//! since `Retry-After` beside it is the same time rounded to whole seconds.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, RETRY_AFTER};

use super::when::{self, Reset};
use super::Reader;

const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

/// The hold a `Retry-After` (or `retry-after-ms`) asks for. Of several readable lines the
/// longest counts.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Option<Duration> {
    let millis = longest(reader, headers, &RETRY_AFTER_MS, |value| {
        Some(Reset::In(when::seconds(value)? / 1_000))
    });
    millis.or_else(|| {
        longest(reader, headers, &RETRY_AFTER, |value| {
            let date = || httpdate::parse_http_date(std::str::from_utf8(value).ok()?.trim()).ok();
            (when::seconds(value).map(Reset::In)).or_else(|| date().map(Reset::At))
        })
    })
}

/// The longest span until what `read` gives the lines of `name`, capped; the lines it cannot
/// read are logged, and a field of more than 16 lines or 4 KiB is ignored whole.
fn longest(
    reader: &Reader<'_>,
    headers: &HeaderMap,
    name: &HeaderName,
    read: impl Fn(&[u8]) -> Option<Reset>,
) -> Option<Duration> {
    (reader.lines(headers, name)?.iter())
        .filter_map(|value| reader.parsed(name.as_str(), value.as_bytes(), &read))
        .map(|reset| reader.span(name.as_str(), reset))
        .max()
}
