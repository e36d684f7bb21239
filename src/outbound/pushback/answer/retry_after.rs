//! `Retry-After` (RFC 9110, section 10.2.3): delta-seconds or an HTTP-date.

use std::time::Duration;

use http::header::{HeaderMap, RETRY_AFTER};

use super::{whole_number, Reader, MAX_LINES};

/// The hold a `Retry-After` asks for. Of several readable lines the longest counts.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Option<Duration> {
    let mut hold: Option<Duration> = None;
    for value in headers.get_all(RETRY_AFTER).iter().take(MAX_LINES) {
        let span = match whole_number(value.as_bytes()) {
            Some(seconds) => Some(reader.span("retry-after", seconds)),
            None => value
                .to_str()
                .ok()
                .and_then(|text| httpdate::parse_http_date(text.trim()).ok())
                .map(|at| reader.until("retry-after", at)),
        };
        match span {
            Some(span) => hold = Some(hold.map_or(span, |h| h.max(span))),
            None => reader.malformed("retry-after", value.as_bytes()),
        }
    }
    hold
}
