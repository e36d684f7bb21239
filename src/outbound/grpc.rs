//! When a gRPC dependency says to call again (feature `grpc`): a `RESOURCE_EXHAUSTED` or
//! `UNAVAILABLE` status with the delay in a `google.rpc.RetryInfo` of `grpc-status-details-bin`,
//! or in `grpc-retry-pushback-ms` (gRPC's retry design, A6).

use std::time::Duration;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::{alphabet, Engine};
use http::HeaderMap;
use tonic::Code;
use tonic_types::StatusExt;

/// `grpc-status-details-bin` as gRPC writes it: standard base64, padded or not.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// What an answer with a gRPC `status` says of when to call again: the `RetryInfo` in its
/// `details` (the serialized `google.rpc.Status`), else its `pushback` (A6: milliseconds; a
/// negative or unreadable value means "do not retry", so `None`). Only a status that a wait can
/// end counts: `RESOURCE_EXHAUSTED` and `UNAVAILABLE`.
fn delay(code: Code, details: &[u8], pushback: Option<&[u8]>) -> Option<Duration> {
    if !matches!(code, Code::ResourceExhausted | Code::Unavailable) {
        return None;
    }
    let status = tonic::Status::with_details(code, "", bytes::Bytes::copy_from_slice(details));
    if let Some(delay) = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
    {
        return Some(delay);
    }
    let millis = std::str::from_utf8(pushback?)
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(Duration::from_millis(millis))
}

/// The delay a trailers-only gRPC answer's headers ask for, if they hold a `grpc-status` that
/// asks for one. A `grpc-status-details-bin` that is not base64 or not a `Status` is ignored.
pub(crate) fn hold(headers: &HeaderMap) -> Option<Duration> {
    let code = Code::from_bytes(headers.get("grpc-status")?.as_bytes());
    let details = headers.get("grpc-status-details-bin");
    let details = details.and_then(|value| BASE64.decode(value.as_bytes()).ok());
    let pushback = headers.get("grpc-retry-pushback-ms").map(|v| v.as_bytes());
    delay(code, details.as_deref().unwrap_or_default(), pushback)
}

/// The delay a `tonic::Status` asks for, as [`hold`] reads it from headers.
pub(crate) fn status_delay(status: &tonic::Status) -> Option<Duration> {
    let pushback = status.metadata().get("grpc-retry-pushback-ms");
    delay(
        status.code(),
        status.details(),
        pushback.map(|v| v.as_bytes()),
    )
}
