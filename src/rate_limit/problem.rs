//! The layer's answers as RFC 9457 problem details (`application/problem+json`): the refusal's
//! `quota-exceeded` problem, and the answer to a request it could not judge.

use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use crate::decision::InsufficientCapacity;

/// The problem type of a refusal, `quota-exceeded`, as draft-ietf-httpapi-ratelimit-headers-11
/// registers it in IANA's HTTP Problem Types registry (title `Quota Exceeded`, status 429).
pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The media type of a problem.
pub(crate) const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// A problem+json answer for a request the layer could not judge (no key, or a failed limiter).
pub(crate) fn problem_response(status: StatusCode, detail: &str) -> Response<Bytes> {
    let mut json = String::with_capacity(128 + detail.len());
    json.push_str("{\"type\":\"about:blank\",\"title\":");
    json_string(&mut json, status.canonical_reason().unwrap_or("Error"));
    let _ = write!(json, ",\"status\":{},\"detail\":", status.as_u16());
    json_string(&mut json, detail);
    json.push('}');
    let mut response = Response::new(Bytes::from(json));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// The body of a refusal, naming the `violated` policies. With `retry_after_secs`, a problem of
/// type [`QUOTA_EXCEEDED`] (status 429) whose detail says when to come back. Without, the request
/// costs more than the `unadmittable` policies can ever admit at once, which no wait mends: a
/// `413 Content Too Large` problem (type `about:blank`, as RFC 9457 gives a status with no more
/// semantics than its own) whose `largest-cost` is the most the strictest of them admits.
pub(crate) fn refusal_problem<'a>(
    violated: impl Iterator<Item = &'a str> + Clone,
    retry_after_secs: Option<u64>,
    unadmittable: impl Iterator<Item = (&'a str, InsufficientCapacity)> + Clone,
) -> Bytes {
    let mut detail = String::new();
    let mut json = String::with_capacity(256);
    // The types and titles need no escape.
    if let Some(retry) = retry_after_secs {
        detail.push_str("The request exceeds the quota of ");
        push_names(&mut detail, violated.clone());
        detail.push_str("; retry in ");
        detail.push_str(itoa::Buffer::new().format(retry));
        detail.push_str(if retry == 1 { " second." } else { " seconds." });
        json.push_str("{\"type\":\"");
        json.push_str(QUOTA_EXCEEDED);
        json.push_str("\",\"title\":\"Quota Exceeded\",\"status\":429,\"detail\":");
    } else {
        detail.push_str("The request costs more than ");
        push_names(&mut detail, unadmittable.clone().map(|(name, _)| name));
        detail.push_str(" can ever admit at once (");
        for (i, (_, e)) in unadmittable.clone().enumerate() {
            let separator = if i > 0 { "; " } else { "" };
            let (asked, most) = (e.requested(), e.capacity());
            let _ = write!(detail, "{separator}{asked} permits asked, at most {most}");
        }
        detail.push_str("); it will never be admitted.");
        let largest = unadmittable.map(|(_, e)| e.capacity()).min().unwrap_or(0);
        let _ = write!(
            json,
            "{{\"type\":\"about:blank\",\"title\":\"Content Too Large\",\"status\":413,\
             \"largest-cost\":{largest},\"detail\":"
        );
    }
    json_string(&mut json, &detail);
    json.push_str(",\"violated-policies\":[");
    for (i, name) in violated.enumerate() {
        if i > 0 {
            json.push(',');
        }
        json_string(&mut json, name);
    }
    json.push_str("]}");
    Bytes::from(json)
}

/// Appends `'a'`, `'a' and 'b'`, `'a', 'b' and 'c'`.
fn push_names<'a>(out: &mut String, names: impl Iterator<Item = &'a str> + Clone) {
    let count = names.clone().count();
    for (i, name) in names.enumerate() {
        if i > 0 {
            out.push_str(if i + 1 == count { " and " } else { ", " });
        }
        out.push('\'');
        out.push_str(name);
        out.push('\'');
    }
}

/// Appends `s` as a JSON string (RFC 8259 §7), quotes included.
pub(crate) fn json_string(out: &mut String, s: &str) {
    out.push('"');
    let mut rest = s;
    // Runs of text that need no escape are copied whole; every byte that needs one is ASCII, so
    // the text splits around it at character boundaries.
    while let Some(at) = rest
        .bytes()
        .position(|b| b == b'"' || b == b'\\' || b < 0x20)
    {
        out.push_str(&rest[..at]);
        match rest.as_bytes()[at] {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            control => {
                let _ = write!(out, "\\u{control:04x}");
            }
        }
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_read_back_as_written() {
        let mut samples: Vec<String> = (0u8..0x80).map(|b| format!("x{}y", b as char)).collect();
        samples.extend(
            [
                "",
                "plain",
                "é\"ü\\",
                "\u{1}\u{1f}\u{7f}",
                "tab\tnew\nline\r",
                "日本\"語",
            ]
            .map(String::from),
        );
        for sample in samples {
            let mut json = String::new();
            json_string(&mut json, &sample);
            let back: String = serde_json::from_str(&json).unwrap();
            assert_eq!(back, sample, "{json}");
        }
    }

    #[test]
    fn json_strings_escape() {
        let mut j = String::new();
        json_string(&mut j, "a\"\\\n\u{1}é");
        assert_eq!(j, "\"a\\\"\\\\\\n\\u0001é\"");
    }

    #[test]
    fn a_refusal_body_is_the_registered_problem() {
        let names = ["per-ip", "per \"key\""];
        let body = refusal_problem(names.into_iter(), Some(2), std::iter::empty());
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], QUOTA_EXCEEDED);
        assert_eq!(json["title"], "Quota Exceeded");
        assert_eq!(json["status"], 429);
        assert_eq!(
            json["detail"],
            "The request exceeds the quota of 'per-ip' and 'per \"key\"'; retry in 2 seconds."
        );
        assert_eq!(json["violated-policies"][1], "per \"key\"");
    }

    #[test]
    fn an_unadmittable_refusal_is_content_too_large_naming_each_capacity() {
        let too_costly = [
            ("a", InsufficientCapacity::new(11, 10)),
            ("b", InsufficientCapacity::new(5, 4)),
        ];
        let body = refusal_problem(["a", "b"].into_iter(), None, too_costly.into_iter());
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], "about:blank");
        assert_eq!(json["title"], "Content Too Large");
        assert_eq!(json["status"], 413);
        assert_eq!(json["largest-cost"], 4, "the strictest policy's capacity");
        assert_eq!(json["violated-policies"], serde_json::json!(["a", "b"]));
        assert_eq!(
            json["detail"],
            "The request costs more than 'a' and 'b' can ever admit at once (11 permits asked, \
             at most 10; 5 permits asked, at most 4); it will never be admitted."
        );
    }
}
