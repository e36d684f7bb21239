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
use prost::encoding::{encode_key, encode_varint, WireType};
use tonic::Code;

use super::decide::Outcome;
use super::headers::refusal_headers;
use super::refusal::Refusal;
use crate::head::RequestHead;

/// gRPC's retry pushback (A6): milliseconds to wait, or a negative value for "do not retry".
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

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
/// made a refusal cost twice an HTTP refusal (`benches/grpc.rs`): the `google.rpc.Status`
/// is a few length-delimited fields, written with prost's own encoders.
pub(crate) fn refusal(refusal: &Refusal<'_>) -> Response<Bytes> {
    let violated: Vec<&str> = refusal.violated_policies().collect();
    let delay = retry_delay(refusal);
    let message = match delay {
        Some(delay) => format!(
            "rate limit exceeded: {}; retry in {} ms",
            violated.join(", "),
            delay.as_millis()
        ),
        None => format!(
            "rate limit exceeded: the call costs more than {} can ever admit",
            violated.join(", ")
        ),
    };
    let details = status_details(&message, delay, &violated);
    let mut response = Response::new(Bytes::new());
    // Room for the five gRPC fields and the rate-limit ones, without growing.
    *response.headers_mut() = http::HeaderMap::with_capacity(12);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static("8"));
    // Policy names are printable ASCII: of the message, only `%` needs escaping (gRPC's
    // percent-encoding of `grpc-message`).
    let escaped = message.replace('%', "%25");
    if let Ok(value) = HeaderValue::from_str(&escaped) {
        headers.insert("grpc-message", value);
    }
    let encoded = STANDARD_NO_PAD.encode(details);
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        headers.insert("grpc-status-details-bin", value);
    }
    // Negative: do not retry (A6), for a call that no wait lets through.
    let pushback = delay.map_or(-1, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(pushback));
    refusal_headers(refusal, headers);
    response
}

/// A `google.rpc.Status` of `RESOURCE_EXHAUSTED` with `message`, a `RetryInfo` of `delay` and a
/// `QuotaFailure` naming each `violated` policy, as protobuf.
fn status_details(message: &str, delay: Option<Duration>, violated: &[&str]) -> Vec<u8> {
    let mut status = Vec::with_capacity(160 + message.len());
    encode_key(1, WireType::Varint, &mut status);
    encode_varint(Code::ResourceExhausted as u64, &mut status);
    bytes_field(&mut status, 2, message.as_bytes());
    if let Some(delay) = delay {
        // google.protobuf.Duration { seconds = 1; nanos = 2 } inside RetryInfo { retry_delay = 1 }.
        let mut duration = Vec::with_capacity(12);
        encode_key(1, WireType::Varint, &mut duration);
        encode_varint(delay.as_secs(), &mut duration);
        encode_key(2, WireType::Varint, &mut duration);
        encode_varint(u64::from(delay.subsec_nanos()), &mut duration);
        let mut retry = Vec::with_capacity(16);
        bytes_field(&mut retry, 1, &duration);
        any(
            &mut status,
            "type.googleapis.com/google.rpc.RetryInfo",
            &retry,
        );
    }
    // QuotaFailure { repeated Violation violations = 1 }, Violation { subject = 1; description = 2 }.
    let mut failure = Vec::with_capacity(64 * violated.len());
    for name in violated {
        let mut violation = Vec::with_capacity(name.len() + QUOTA_SPENT.len() + 4);
        bytes_field(&mut violation, 1, name.as_bytes());
        bytes_field(&mut violation, 2, QUOTA_SPENT.as_bytes());
        bytes_field(&mut failure, 1, &violation);
    }
    any(
        &mut status,
        "type.googleapis.com/google.rpc.QuotaFailure",
        &failure,
    );
    status
}

/// What each violation of a refusal's `QuotaFailure` says.
const QUOTA_SPENT: &str = "the rate-limit policy's quota is spent";

/// A length-delimited field `tag` holding `bytes`.
fn bytes_field(buf: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}

/// A `google.protobuf.Any { type_url = 1; value = 2 }` of `value`, as `Status`'s field 3.
fn any(status: &mut Vec<u8>, type_url: &str, value: &[u8]) {
    let mut any = Vec::with_capacity(type_url.len() + value.len() + 6);
    bytes_field(&mut any, 1, type_url.as_bytes());
    bytes_field(&mut any, 2, value);
    bytes_field(status, 3, &any);
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
