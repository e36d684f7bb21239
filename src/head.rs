//! Views of HTTP messages: what the crate reads of a request or a response, never the body.
//!
//! [`RequestHead`] is what the rate-limit layer's key extractors, cost functions and exemptions
//! read of a request; [`ResponseHead`] is what the pushback layer and the adaptive bulkhead's
//! classifier read of a response. [`UntilHead`] and [`UntilBodyEnd`] say whether a bulkhead or a
//! pushback follows a call past its answer's head, to the end of its body.

use http::header::GetAll;
use http::{
    Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, Version,
};

pub use crate::body_end::{Until, UntilBodyEnd, UntilHead};

// gRPC's header names, named once: a name given as a `&str` is parsed again at every lookup
// and insert (a large share of the retry layer's own instructions on a call that succeeds:
// BENCHMARKS.md, "Retries and circuit breaker").
/// gRPC's retry pushback (A6): milliseconds to wait, or a negative value for "do not retry".
#[cfg(any(feature = "grpc", feature = "adaptive"))]
pub(crate) const GRPC_RETRY_PUSHBACK_MS: http::HeaderName =
    http::HeaderName::from_static("grpc-retry-pushback-ms");

/// The most lines of one field of an answer that are read: a field of more is ignored whole.
pub(crate) const MAX_LINES: usize = 16;

/// The most bytes of one field of an answer, its lines joined by ", ", that are read: a longer
/// field is ignored whole.
pub(crate) const MAX_FIELD_BYTES: usize = 4096;

/// The lines of field `name` of an answer's `headers`; `Err` with its first line when the
/// field is too large to read (more than [`MAX_LINES`] lines, or more than [`MAX_FIELD_BYTES`]
/// joined).
pub(crate) fn field_lines<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<GetAll<'h, HeaderValue>, &'h [u8]> {
    let lines = headers.get_all(name);
    // One pass over the lines: how many, and their bytes.
    let (count, bytes) = (lines.iter()).fold((0usize, 0usize), |(n, b), v| (n + 1, b + v.len()));
    if count > MAX_LINES || bytes + 2 * count.saturating_sub(1) > MAX_FIELD_BYTES {
        return Err(lines.iter().next().map_or(&b""[..], HeaderValue::as_bytes));
    }
    Ok(lines)
}

/// The value of a field of an answer that holds one short value (a status, a number, a date):
/// `Ok(None)` when the field is absent; `Err` with its first line when it is too large to read
/// or its lines differ. Lines that all say the same count once (a proxy and the server may each
/// add the field). The one rule for such fields: the pushback's, the retries' and the
/// classifier's alike.
pub(crate) fn one_value<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h [u8]>, &'h [u8]> {
    let mut lines = field_lines(headers, name)?.iter();
    let Some(value) = lines.next() else {
        return Ok(None);
    };
    if lines.any(|other| other != value) {
        return Err(value.as_bytes());
    }
    Ok(Some(value.as_bytes()))
}

/// The `grpc-retry-pushback-ms` of `headers` (an answer's, or a `tonic::Status`'s metadata as
/// a header map): `None` when there is none (or it is ignored: see [`one_value`]), else the
/// milliseconds it asks to wait, or `None` within for one that is not a count of milliseconds
/// (negative, or unreadable), which A6 reads as "do not retry". The one reader of the field,
/// for the pushback's hold and the retries alike.
#[cfg(any(feature = "grpc", feature = "adaptive"))]
pub(crate) fn pushback_millis(headers: &HeaderMap) -> Option<Option<u64>> {
    let value = one_value(headers, &GRPC_RETRY_PUSHBACK_MS).ok()??;
    Some(
        std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.trim().parse().ok()),
    )
}
/// A gRPC answer's status code.
#[cfg(feature = "grpc")]
pub(crate) const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
/// A gRPC answer's message.
#[cfg(feature = "grpc")]
pub(crate) const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");
/// A gRPC answer's details: a serialized `google.rpc.Status`, in base64.
#[cfg(feature = "grpc")]
pub(crate) const GRPC_STATUS_DETAILS_BIN: http::HeaderName =
    http::HeaderName::from_static("grpc-status-details-bin");

/// The head of a request (method, URI, version, headers, extensions; never the body), borrowed
/// from the request: what key extractors, cost functions and exemptions read.
///
/// A view of the request as it travels, so that the layer never takes the request apart to show
/// it to them (that would move all of it twice). Its fields have the names of
/// [`http::request::Parts`]' fields, so a closure reads `head.uri.path()` or
/// `head.headers.get("x-api-key")` as it would read the parts. Make one from a request or from
/// parts to call an extractor yourself:
///
/// ```
/// use tower_bulwark::head::RequestHead;
///
/// let request = http::Request::get("/acme/orders").body(()).unwrap();
/// let head = RequestHead::from(&request);
/// assert_eq!(head.uri.path(), "/acme/orders");
/// assert!(head.method == http::Method::GET);
/// ```
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RequestHead<'a> {
    /// The request's method.
    pub method: &'a Method,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's HTTP version.
    pub version: Version,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The request's extensions (axum's `ConnectInfo` and `MatchedPath` live here).
    pub extensions: &'a Extensions,
}

impl<'a, B> From<&'a Request<B>> for RequestHead<'a> {
    fn from(request: &'a Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            version: request.version(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }
}

impl<'a> From<&'a http::request::Parts> for RequestHead<'a> {
    fn from(parts: &'a http::request::Parts) -> Self {
        Self {
            method: &parts.method,
            uri: &parts.uri,
            version: parts.version,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }
}

/// A response whose status and headers can be read: what
/// [`Pushback`](crate::outbound::Pushback) needs from the services it wraps, and what the adaptive
/// bulkhead's classifier judges.
///
/// Implemented for `http::Response<B>`, `http::response::Parts` and, with the `reqwest`
/// feature, reqwest 0.13's `Response`; implement it for a client of your own. A `Response` of
/// another reqwest major converts: `.map_response(http::Response::from)` below the layer.
#[diagnostic::on_unimplemented(
    message = "tower-bulwark cannot read the status and headers of `{Self}`",
    label = "the inner service answers with `{Self}`, which does not implement `ResponseHead`",
    note = "`ResponseHead` is implemented for `http::Response<B>`, `http::response::Parts` and, with the `reqwest` feature, `reqwest::Response` of reqwest 0.13",
    note = "with another major of reqwest (check `cargo tree -d -i reqwest`), put `.map_response(http::Response::from)` below this layer, or implement `ResponseHead` for your type"
)]
pub trait ResponseHead {
    /// The status code.
    fn status(&self) -> StatusCode;
    /// The header fields.
    fn headers(&self) -> &HeaderMap;

    /// The response's extensions, where a client quota leaves an
    /// [`Unsettled`](crate::outbound::quota::Unsettled) for a settle from the body; `None` (the
    /// default) for a response without them.
    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        None
    }
}

impl<B> ResponseHead for http::Response<B> {
    fn status(&self) -> StatusCode {
        http::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        http::Response::headers(self)
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(http::Response::extensions_mut(self))
    }
}

impl ResponseHead for http::response::Parts {
    fn status(&self) -> StatusCode {
        self.status
    }

    fn headers(&self) -> &HeaderMap {
        &self.headers
    }
}

#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl ResponseHead for reqwest::Response {
    fn status(&self) -> StatusCode {
        reqwest::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        reqwest::Response::headers(self)
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(reqwest::Response::extensions_mut(self))
    }
}
