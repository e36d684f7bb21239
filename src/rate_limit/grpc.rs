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

use std::sync::OnceLock;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine;
use bytes::{BufMut, Bytes};
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use tonic::Code;

use super::headers::{refusal_headers, set_index};
use super::refusal::Refusal;
use crate::head::{
    RequestHead, GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, GRPC_STATUS_DETAILS_BIN,
};

/// Whether `request` is a gRPC call: its content type is `application/grpc`, alone or with a
/// `+format` or parameters, which RFC 9110 lets whitespace precede (whatever the HTTP version: an
/// HTTP/1.1 request claiming gRPC is answered as gRPC, which such a client reads, and no other
/// client sends that type).
pub(crate) fn is_grpc(request: &RequestHead<'_>) -> bool {
    let prefix = b"application/grpc";
    let value = request.headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes);
    let Some((start, rest)) = value.and_then(|v| v.split_at_checked(prefix.len())) else {
        return false;
    };
    start.eq_ignore_ascii_case(prefix)
        && (rest.first() == Some(&b'+')
            || matches!(rest.trim_ascii_start().first(), None | Some(b';')))
}

/// `wait` in whole milliseconds, rounded up and never zero (as a `Retry-After` is never zero),
/// as `grpc-retry-pushback-ms` says it: an `i64`, so at most `i64::MAX` (about 292 million
/// years). The `RetryInfo` is made from the same figure, so that the two say one delay. Every
/// gRPC answer of the crate that names a wait.
fn as_pushback_millis(wait: Duration) -> i64 {
    i64::try_from(crate::decision::ceil_millis(wait))
        .unwrap_or(i64::MAX)
        .max(1)
}

/// The gRPC answer to a refused call: `RESOURCE_EXHAUSTED`, trailers-only.
///
/// Written here rather than through tonic's `Status` and tonic-types' `ErrorDetails` each time,
/// which made a refusal cost far more than an HTTP refusal. What all refusals of one set of
/// violated policies share (the message, and the `google.rpc.Status` up to its `RetryInfo`'s
/// delay, already in base64) is built once and kept by the layer, so that a refusal encodes only
/// its delay and costs no more than an HTTP refusal (figures in BENCHMARKS.md, "gRPC calls",
/// from `benches/grpc_instructions.sh`).
pub(crate) fn refusal(refusal: &Refusal<'_>) -> Response<Bytes> {
    // The exact wait, rounded up to whole milliseconds and never zero (as `Retry-After` is
    // never zero); `None` when no wait helps.
    let millis = (refusal.retry_after()).map(as_pushback_millis);
    let delay = millis.map(|millis| Duration::from_millis(millis.unsigned_abs()));
    let build = || Shared::new(refusal, delay.is_none());
    // A call that no wait lets through is rare, and said otherwise: its status is not kept.
    let kept = (delay.is_some())
        .then(|| (refusal.settings.grpc_refusals).get(set_index(refusal.violated()), build))
        .flatten();
    let mut fresh = None;
    let shared: &Shared = match kept {
        Some(shared) => shared,
        None => fresh.insert(build()),
    };
    let mut response = Response::new(Bytes::new());
    // Room for the five gRPC fields and the rate-limit ones, without growing.
    *response.headers_mut() = http::HeaderMap::with_capacity(12);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from_static("8"));
    if let Some(value) = shared.details(delay) {
        headers.insert(GRPC_STATUS_DETAILS_BIN, value);
    }
    if let Some(message) = &shared.message {
        headers.insert(GRPC_MESSAGE, message.clone());
    }
    // Negative: do not retry (A6), for a call that no wait lets through.
    headers.insert(
        GRPC_RETRY_PUSHBACK_MS,
        HeaderValue::from(millis.unwrap_or(-1)),
    );
    refusal_headers(refusal, headers);
    response
}

/// The message of a refusal: the violated policies, and for a call that no wait lets through
/// (`never`), that it costs too much. Policy names are printable ASCII: of the message, only `%`
/// needs escaping (gRPC's percent-encoding of `grpc-message`), which the caller does.
fn message(refusal: &Refusal<'_>, never: bool) -> String {
    let names = refusal.violated_policies().collect::<Vec<_>>().join(", ");
    match never {
        true => format!("rate limit exceeded: the call costs more than {names} can ever admit"),
        false => format!("rate limit exceeded: {names}"),
    }
}

/// What every refusal of one set of violated policies says alike: its `grpc-message`, and its
/// `google.rpc.Status` but for the `RetryInfo`'s delay (a decoder reads the fields in any order,
/// so the delay's can come last). The lengths before the delay depend only on the size of its
/// `Duration`, so the status up to the delay is kept for each size met, in base64.
#[derive(Clone, Debug)]
pub(crate) struct Shared {
    message: Option<HeaderValue>,
    /// The code, the message and the `QuotaFailure`.
    status: Box<[u8]>,
    /// For each size of a `Duration` ([`DURATION_MIN`] bytes and up), the status followed by a
    /// `RetryInfo` up to its `Duration`'s fields.
    before_duration: [OnceLock<Aligned>; DURATION_MAX - DURATION_MIN + 1],
}

impl Shared {
    /// What the refusals of `refusal`'s violated policies share; `never` when no wait lets the
    /// call through.
    fn new(refusal: &Refusal<'_>, never: bool) -> Self {
        let message = message(refusal, never);
        let status = status_prefix(&message, refusal.violated_policies()).into();
        let message = message.replace('%', "%25");
        Self {
            message: HeaderValue::from_maybe_shared(Bytes::from(message)).ok(),
            status,
            before_duration: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// `grpc-status-details-bin`: the status, with a `RetryInfo` of `delay` if there is one.
    fn details(&self, delay: Option<Duration>) -> Option<HeaderValue> {
        let Some(delay) = delay else {
            return Aligned::new(&self.status).followed_by(&[]);
        };
        let mut duration = [0; DURATION_MAX];
        let len = {
            let mut free = &mut duration[..];
            encode_key(1, WireType::Varint, &mut free);
            encode_varint(delay.as_secs(), &mut free);
            encode_key(2, WireType::Varint, &mut free);
            encode_varint(u64::from(delay.subsec_nanos()), &mut free);
            DURATION_MAX - free.len()
        };
        let before = self.before_duration[len - DURATION_MIN].get_or_init(|| {
            let mut status = self.status.to_vec();
            retry_info_up_to_duration(len, &mut status);
            Aligned::new(&status)
        });
        before.followed_by(&duration[..len])
    }
}

/// Bytes in base64 up to their last whole group of three, and the one or two bytes after, so
/// that what follows them can be added without encoding them again.
#[derive(Clone, Debug)]
struct Aligned {
    encoded: Box<[u8]>,
    rest: Box<[u8]>,
}

impl Aligned {
    fn new(bytes: &[u8]) -> Self {
        let whole = bytes.len() - bytes.len() % 3;
        Self {
            encoded: STANDARD_NO_PAD.encode(&bytes[..whole]).into_bytes().into(),
            rest: bytes[whole..].into(),
        }
    }

    /// The bytes followed by `tail` (at most a `Duration`), in base64, as a header value.
    fn followed_by(&self, tail: &[u8]) -> Option<HeaderValue> {
        let mut bytes = [0; 2 + DURATION_MAX];
        let bytes = bytes.get_mut(..self.rest.len() + tail.len())?;
        bytes[..self.rest.len()].copy_from_slice(&self.rest);
        bytes[self.rest.len()..].copy_from_slice(tail);
        // Into a buffer of the exact size (`encode_string` goes through a chunked encoder).
        let mut value = Vec::with_capacity(self.encoded.len() + 4 * bytes.len().div_ceil(3));
        value.extend_from_slice(&self.encoded);
        value.resize(value.capacity(), 0);
        let written =
            (STANDARD_NO_PAD.encode_slice(bytes, &mut value[self.encoded.len()..])).unwrap_or(0);
        value.truncate(self.encoded.len() + written);
        HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
    }
}

/// `google.rpc.RetryInfo`, as the type URL of its `Any`.
const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The sizes of a `Duration { seconds = 1; nanos = 2 }` with both fields: a key and a varint of
/// one byte each at least; at most ten bytes of seconds and five of nanoseconds.
const DURATION_MIN: usize = 4;
const DURATION_MAX: usize = 1 + 10 + 1 + 5;

/// What each violation of a refusal's `QuotaFailure` says.
const QUOTA_SPENT: &str = "the rate-limit policy's quota is spent";

/// A `google.rpc.Status` of `RESOURCE_EXHAUSTED` with `message` and a `QuotaFailure` naming each
/// `violated` policy, as protobuf, encoded by tonic-types (once per set of violated policies, see
/// [`Shared`]). A `RetryInfo` may follow: a decoder reads the repeated `details` in any order.
fn status_prefix<'a>(message: &str, violated: impl Iterator<Item = &'a str>) -> Vec<u8> {
    use tonic_types::{ErrorDetails, QuotaViolation, StatusExt};

    let violations: Vec<_> =
        (violated.map(|name| QuotaViolation::new(name, QUOTA_SPENT))).collect();
    let details = ErrorDetails::with_quota_failure(violations);
    let status = tonic::Status::with_error_details(Code::ResourceExhausted, message, details);
    status.details().to_vec()
}

/// A `Status` detail `RetryInfo { Duration retry_delay = 1 }` up to the fields of its
/// `Duration`, which are `duration` bytes and follow.
fn retry_info_up_to_duration(duration: usize, buf: &mut impl BufMut) {
    let info = field_len(duration);
    length(buf, 3, field_len(RETRY_INFO.len()) + field_len(info));
    length(buf, 1, RETRY_INFO.len());
    buf.put_slice(RETRY_INFO.as_bytes());
    length(buf, 2, info);
    length(buf, 1, duration);
}

/// The size of a length-delimited field of `len` bytes: its key (one byte: every tag here is
/// below 16), the length, the bytes.
fn field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// The key and length of a length-delimited field `tag` of `len` bytes, which follow.
fn length(buf: &mut impl BufMut, tag: u32, len: usize) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
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
    status_response(code, detail.to_owned(), None)
}

/// The gRPC status of an error of the crate's other layers (see [`LazyStatus`]): `code` with
/// `message` and, when a wait ends it, that wait in a `google.rpc.RetryInfo` of its details and
/// in `grpc-retry-pushback-ms` (gRPC's retry design, A6), rounded up to whole milliseconds as a
/// refusal's is.
fn status_of(code: Code, message: String, retry_after: Option<Duration>) -> tonic::Status {
    use tonic_types::{ErrorDetails, StatusExt};

    let Some(wait) = retry_after else {
        return tonic::Status::new(code, message);
    };
    let millis = as_pushback_millis(wait);
    let delay = Duration::from_millis(millis.unsigned_abs());
    let details = ErrorDetails::with_retry_info(Some(delay));
    let mut status = tonic::Status::with_error_details(code, message, details);
    status
        .metadata_mut()
        .insert("grpc-retry-pushback-ms", millis.into());
    status
}

/// The trailers-only gRPC answer of [`status_of`]`(code, message, retry_after)` (HTTP 200, the
/// status in the headers, no body): how the overload protection answers a call it sheds, and
/// the layer's [`error`]s.
pub(crate) fn status_response(
    code: Code,
    message: String,
    retry_after: Option<Duration>,
) -> Response<Bytes> {
    let mut response = status_of(code, message, retry_after).into_http::<Bytes>();
    // The status itself, which tonic keeps in the extensions, is not the layer's to hand on.
    response.extensions_mut().clear();
    response
}

/// The gRPC status of an error of the crate's (a full bulkhead, a spent client quota, a call
/// held for a dependency), built the first time tonic looks for it among the error's sources,
/// so that an error no gRPC client sees costs nothing more. A clone starts without it.
#[derive(Debug, Default)]
pub(crate) struct LazyStatus(OnceLock<tonic::Status>);

impl LazyStatus {
    /// The status of `error`, built by [`status_of`] with `code`, the error's message and
    /// `retry_after` the first time it is asked for: what the error's `source` is.
    pub(crate) fn of(
        &self,
        error: &impl std::fmt::Display,
        code: Code,
        retry_after: Option<Duration>,
    ) -> Option<&(dyn std::error::Error + 'static)> {
        Some(
            self.0
                .get_or_init(|| status_of(code, error.to_string(), retry_after)),
        )
    }
}

impl Clone for LazyStatus {
    fn clone(&self) -> Self {
        Self::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic_types::StatusExt;

    /// A wait of zero (a limiter of one's own, a fail mode `Closed(Duration::ZERO)`) is said as
    /// 1 ms by every gRPC answer, as a refusal says it: the layer's errors and the outbound
    /// refusals said 0 before.
    #[test]
    fn every_answer_says_a_wait_of_zero_as_one_millisecond() {
        for (wait, millis) in [
            (Duration::ZERO, 1),
            (Duration::from_nanos(1), 1),
            (Duration::from_micros(1500), 2),
        ] {
            let status = super::status_of(tonic::Code::Unavailable, "held".into(), Some(wait));
            let pushback = status.metadata().get("grpc-retry-pushback-ms").unwrap();
            assert_eq!(pushback.to_str().unwrap(), millis.to_string(), "{wait:?}");
            let delay = status.get_details_retry_info().unwrap().retry_delay;
            assert_eq!(delay, Some(Duration::from_millis(millis)), "{wait:?}");
        }
    }
}
