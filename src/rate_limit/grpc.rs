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

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

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
pub(crate) fn refusal(refusal: &Refusal<'_>) -> Response<Bytes> {
    let violated: Vec<&str> = refusal.violated_policies().collect();
    let delay = retry_delay(refusal);
    let mut details = ErrorDetails::new();
    for name in &violated {
        details.add_quota_failure_violation(*name, "the rate-limit policy's quota is spent");
    }
    let message = match delay {
        Some(delay) => {
            details.set_retry_info(Some(delay));
            format!(
                "rate limit exceeded: {}; retry in {} ms",
                violated.join(", "),
                delay.as_millis()
            )
        }
        None => format!(
            "rate limit exceeded: the call costs more than {} can ever admit",
            violated.join(", ")
        ),
    };
    let status = tonic::Status::with_error_details(Code::ResourceExhausted, message, details);
    let mut response = answer(status);
    // Negative: do not retry (A6), for a call that no wait lets through.
    let pushback = delay.map_or(-1, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let headers = response.headers_mut();
    headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(pushback));
    refusal_headers(refusal, headers);
    response
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
