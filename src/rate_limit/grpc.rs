//! The layer's own answers to gRPC requests (feature `grpc`): trailers-only gRPC responses
//! instead of HTTP statuses with problem+json, which a gRPC client would map to `UNAVAILABLE`
//! and retry at once.
//!
//! A refusal is `RESOURCE_EXHAUSTED` with the delay in `grpc-retry-pushback-ms` (gRPC's retry
//! design, A6) and in a `google.rpc.RetryInfo` of `grpc-status-details-bin`, beside a
//! `google.rpc.QuotaFailure` naming each violated policy; the draft-11 `RateLimit` and
//! `RateLimit-Policy` fields go in its metadata. The layer's other answers keep their meaning:
//! no key is `INVALID_ARGUMENT` (or `UNAUTHENTICATED`, or `INTERNAL` for a server-side cause), a
//! failing limiter `UNAVAILABLE`.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use tonic::Code;

use super::decide::Outcome;
use super::headers::refusal_headers;
use super::refusal::Refusal;
use crate::head::RequestHead;

/// gRPC's retry pushback (A6): milliseconds to wait, or a negative value for "do not retry".
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
// Named once: a name given as a `&str` is parsed again at each insert.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_STATUS_DETAILS_BIN: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// Whether `request` is a gRPC call: its content type is `application/grpc`, alone or with a
/// `+format` or parameters (whatever the HTTP version: an HTTP/1.1 request claiming gRPC is
/// answered as gRPC, which such a client reads, and no other client sends that type).
pub(crate) fn is_grpc(request: &RequestHead<'_>) -> bool {
    let Some(value) = request.headers.get(CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes();
    let prefix = b"application/grpc";
    value.len() >= prefix.len()
        && value[..prefix.len()].eq_ignore_ascii_case(prefix)
        && matches!(value.get(prefix.len()), None | Some(b'+' | b';'))
}

/// The exact wait of a refusal, the longest of the violated policies', rounded up to whole
/// milliseconds and never zero (as `Retry-After` is never zero); `None` when no wait helps.
fn retry_delay(refusal: &Refusal<'_>) -> Option<Duration> {
    refusal.retry_after_secs()?;
    let longest = (refusal.settings.policies.iter())
        .zip(refusal.outcomes)
        .filter(|(policy, _)| policy.enforced())
        .filter_map(|(_, outcome)| match outcome {
            Outcome::Refused(decision) => Some(decision.retry_after),
            _ => None,
        })
        .max()?;
    let millis = longest.as_nanos().div_ceil(1_000_000).max(1);
    Some(Duration::from_millis(
        u64::try_from(millis).unwrap_or(u64::MAX),
    ))
}

/// The gRPC answer to a refused call: `RESOURCE_EXHAUSTED`, trailers-only.
///
/// Written here rather than through tonic's `Status` and tonic-types' `ErrorDetails`, which
/// made a refusal cost twice an HTTP refusal (`benches/grpc.rs`): the message and the
/// `google.rpc.Status` are each written once into a buffer of their exact size, and handed to
/// their header values without a copy.
pub(crate) fn refusal(refusal: &Refusal<'_>) -> Response<Bytes> {
    let violated = refusal.violated_policies();
    let delay = retry_delay(refusal);
    let mut millis = itoa::Buffer::new();
    let (head, tail) = match delay {
        Some(delay) => (
            "rate limit exceeded: ",
            ["; retry in ", millis.format(delay.as_millis()), " ms"],
        ),
        None => (
            "rate limit exceeded: the call costs more than ",
            [" can ever admit", "", ""],
        ),
    };
    // Of the exact size: a `Bytes` made of a `String` with room to spare would allocate again.
    let names: usize = violated.clone().map(|name| name.len() + 2).sum();
    let mut message = String::with_capacity(
        head.len() + names.saturating_sub(2) + tail.iter().map(|part| part.len()).sum::<usize>(),
    );
    message.push_str(head);
    for (i, name) in violated.clone().enumerate() {
        if i > 0 {
            message.push_str(", ");
        }
        message.push_str(name);
    }
    tail.iter().for_each(|part| message.push_str(part));
    let details = status_details(&message, delay, violated);
    let mut response = Response::new(Bytes::new());
    // Room for the five gRPC fields and the rate-limit ones, without growing.
    *response.headers_mut() = http::HeaderMap::with_capacity(12);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from_static("8"));
    // Into a buffer of the exact size (`encode_string` goes through a chunked encoder).
    let mut encoded = vec![0; base64::encoded_len(details.len(), false).unwrap_or(0)];
    let written = STANDARD_NO_PAD
        .encode_slice(&details, &mut encoded)
        .unwrap_or(0);
    encoded.truncate(written);
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(encoded)) {
        headers.insert(GRPC_STATUS_DETAILS_BIN, value);
    }
    // Policy names are printable ASCII: of the message, only `%` needs escaping (gRPC's
    // percent-encoding of `grpc-message`).
    if message.contains('%') {
        message = message.replace('%', "%25");
    }
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(message)) {
        headers.insert(GRPC_MESSAGE, value);
    }
    // Negative: do not retry (A6), for a call that no wait lets through.
    let pushback = delay.map_or(-1, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(pushback));
    refusal_headers(refusal, headers);
    response
}

/// `google.rpc.RetryInfo` and `google.rpc.QuotaFailure`, as the type URLs of their `Any`.
const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";
const QUOTA_FAILURE: &str = "type.googleapis.com/google.rpc.QuotaFailure";

/// What each violation of a refusal's `QuotaFailure` says.
const QUOTA_SPENT: &str = "the rate-limit policy's quota is spent";

/// A `google.rpc.Status` of `RESOURCE_EXHAUSTED` with `message`, a `RetryInfo` of `delay` and a
/// `QuotaFailure` naming each `violated` policy, as protobuf: each message's size is known
/// before it is written, so one buffer of the exact size holds them all.
///
/// `Status { code = 1; message = 2; repeated Any details = 3 }`,
/// `Any { type_url = 1; value = 2 }`, `RetryInfo { Duration retry_delay = 1 }`,
/// `Duration { seconds = 1; nanos = 2 }`, `QuotaFailure { repeated Violation violations = 1 }`,
/// `Violation { subject = 1; description = 2 }`.
fn status_details<'a>(
    message: &str,
    delay: Option<Duration>,
    violated: impl Iterator<Item = &'a str> + Clone,
) -> Vec<u8> {
    let violation = |name: &str| field_len(name.len()) + field_len(QUOTA_SPENT.len());
    let failure: usize = violated
        .clone()
        .map(|name| field_len(violation(name)))
        .sum();
    let failure_any = field_len(QUOTA_FAILURE.len()) + field_len(failure);
    // The duration's size, the `RetryInfo`'s, and its `Any`'s.
    let retry = delay.map(|delay| {
        let duration = 2
            + encoded_len_varint(delay.as_secs())
            + encoded_len_varint(u64::from(delay.subsec_nanos()));
        let info = field_len(duration);
        (
            delay,
            duration,
            info,
            field_len(RETRY_INFO.len()) + field_len(info),
        )
    });
    let code = Code::ResourceExhausted as u64;
    let total = 1
        + encoded_len_varint(code)
        + field_len(message.len())
        + retry.map_or(0, |(.., any)| field_len(any))
        + field_len(failure_any);

    let mut status = Vec::with_capacity(total);
    encode_key(1, WireType::Varint, &mut status);
    encode_varint(code, &mut status);
    bytes_field(&mut status, 2, message.as_bytes());
    if let Some((delay, duration, info, any)) = retry {
        length(&mut status, 3, any);
        bytes_field(&mut status, 1, RETRY_INFO.as_bytes());
        length(&mut status, 2, info);
        length(&mut status, 1, duration);
        encode_key(1, WireType::Varint, &mut status);
        encode_varint(delay.as_secs(), &mut status);
        encode_key(2, WireType::Varint, &mut status);
        encode_varint(u64::from(delay.subsec_nanos()), &mut status);
    }
    length(&mut status, 3, failure_any);
    bytes_field(&mut status, 1, QUOTA_FAILURE.as_bytes());
    length(&mut status, 2, failure);
    for name in violated {
        length(&mut status, 1, violation(name));
        bytes_field(&mut status, 1, name.as_bytes());
        bytes_field(&mut status, 2, QUOTA_SPENT.as_bytes());
    }
    debug_assert_eq!(status.len(), total);
    status
}

/// The size of a length-delimited field of `len` bytes: its key (one byte: every tag here is
/// below 16), the length, the bytes.
fn field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// The key and length of a length-delimited field `tag` of `len` bytes, which follow.
fn length(buf: &mut Vec<u8>, tag: u32, len: usize) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// A length-delimited field `tag` holding `bytes`.
fn bytes_field(buf: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    length(buf, tag, bytes.len());
    buf.extend_from_slice(bytes);
}

/// The gRPC answer for what the layer answers over HTTP with `status` and `detail`: no key for
/// the request (`400`, `401`, `500`) or a failing limiter (`503`).
pub(crate) fn error(status: StatusCode, detail: &str) -> Response<Bytes> {
    let code = match status {
        StatusCode::BAD_REQUEST => Code::InvalidArgument,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
        _ => Code::Internal,
    };
    answer(tonic::Status::new(code, detail))
}

/// `status` as a trailers-only response: HTTP 200, the status in the headers, no body.
fn answer(status: tonic::Status) -> Response<Bytes> {
    let mut response = status.into_http::<Bytes>();
    // The status itself, which tonic keeps in the extensions, is not the layer's to hand on.
    response.extensions_mut().clear();
    response
}
