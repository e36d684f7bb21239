//! What the tests of the HTTP layer's answers in every state share: a header's values as one
//! text, a handler that answers the status a request names, a limiter's state read without
//! changing it, and a `RateLimit` value's items.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};
use tower_bulwark::algorithm::Gcra;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::{KeyedRateLimiter, Limiter};

pub(crate) type Keyed = KeyedRateLimiter<HeaderValue, Gcra, ManualClock>;

/// The header's values as text, joined as one list.
pub(crate) fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<_> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("a visible-ASCII header value").to_owned())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// The status named by the request's `x-answer` header (200 without one).
pub(crate) async fn answer(headers: HeaderMap) -> StatusCode {
    headers
        .get("x-answer")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u16>().ok())
        .map_or(StatusCode::OK, |s| StatusCode::from_u16(s).unwrap())
}

/// A limiter's state for `key`, read without changing it: a one-permit reservation, given back.
pub(crate) fn peek(limiter: &Keyed, key: &str) -> (bool, u64, Duration, Duration, Duration) {
    let key = HeaderValue::from_str(key).unwrap();
    let d = limiter.reserve_now(&key, 1).unwrap().unwrap();
    let seen = (d.allowed, d.remaining, d.wait, d.retry_after, d.reset_after);
    if d.allowed {
        limiter.refund(&key, 1, d);
    }
    seen
}

/// `"name";r=<r>;t=<t>, ...` as `(name, r)` pairs; `"name";q=..;w=.., ...` as names.
pub(crate) fn items(value: &str) -> Vec<(String, u64)> {
    value
        .split(", ")
        .map(|item| {
            let (name, params) = item[1..].split_once('"').unwrap();
            let r = params
                .split(';')
                .find_map(|p| p.strip_prefix("r="))
                .map_or(u64::MAX, |r| r.parse().unwrap());
            (name.to_owned(), r)
        })
        .collect()
}
