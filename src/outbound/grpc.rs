//! When a gRPC dependency says to call again (feature `grpc`): a `RESOURCE_EXHAUSTED` or
//! `UNAVAILABLE` status with the delay in a `google.rpc.RetryInfo` of `grpc-status-details-bin`,
//! or in `grpc-retry-pushback-ms` (gRPC's retry design, A6).

use std::time::Duration;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::{alphabet, Engine};
use http::HeaderMap;
use prost::Message;
use tonic::Code;

use crate::head::{one_value, GRPC_STATUS, GRPC_STATUS_DETAILS_BIN};

/// `grpc-status-details-bin` as gRPC writes it: standard base64, padded or not.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// What an answer with a gRPC `status` says of when to call again: the longer of the
/// `RetryInfo` in its `details` (the serialized `google.rpc.Status`) and the
/// `grpc-retry-pushback-ms` of its `headers` (A6: milliseconds; a negative or unreadable value
/// means "do not retry", and names no time), so
/// that a call waits for both. Only a status that a wait can end counts: `RESOURCE_EXHAUSTED`
/// and `UNAVAILABLE`.
fn delay(code: Code, details: &[u8], headers: &HeaderMap) -> Option<Duration> {
    if !matches!(code, Code::ResourceExhausted | Code::Unavailable) {
        return None;
    }
    let pushback = crate::head::pushback_millis(headers).flatten();
    retry_info_delay(details).max(pushback.map(Duration::from_millis))
}

/// The delay of the first `google.rpc.RetryInfo` in `details` (a serialized `google.rpc.Status`),
/// if it has one: zero for a negative one, as gRPC reads it. Decoded here rather than by
/// `tonic_types::StatusExt`, whose conversion of the delay negates `i64::MIN` seconds (a panic
/// where overflow is checked, a hold of zero where not).
fn retry_info_delay(details: &[u8]) -> Option<Duration> {
    const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";
    let status = tonic_types::pb::Status::decode(details).ok()?;
    let info = status
        .details
        .iter()
        .find(|any| any.type_url == RETRY_INFO)?;
    let delay = tonic_types::pb::RetryInfo::decode(info.value.as_slice())
        .ok()?
        .retry_delay?;
    // In i128, whatever the two fields hold (their signs may even differ): exact, no overflow.
    let nanos = i128::from(delay.seconds) * 1_000_000_000 + i128::from(delay.nanos);
    let nanos = u64::try_from(nanos.max(0)).unwrap_or(u64::MAX);
    Some(Duration::from_nanos(nanos))
}

/// The delay a trailers-only gRPC answer's headers ask for, if they hold a `grpc-status` that
/// asks for one. A `grpc-status-details-bin` that is not base64 or not a `Status` is ignored;
/// the status is read as [`one_value`] reads a field.
pub(crate) fn hold(headers: &HeaderMap) -> Option<Duration> {
    let code = Code::from_bytes(one_value(headers, &GRPC_STATUS).ok()??);
    // Read whole, from its first line: a serialized `google.rpc.Status` may pass the 4 KiB of a
    // field of one short value (a `DebugInfo` beside the `RetryInfo`), as `status_delay` reads
    // a `tonic::Status`'s.
    let details = headers.get(GRPC_STATUS_DETAILS_BIN);
    let details = details.and_then(|value| BASE64.decode(value.as_bytes()).ok());
    delay(code, details.as_deref().unwrap_or_default(), headers)
}

/// The delay a `tonic::Status` asks for, as [`hold`] reads it from headers.
pub(crate) fn status_delay(status: &tonic::Status) -> Option<Duration> {
    delay(status.code(), status.details(), status.metadata().as_ref())
}
