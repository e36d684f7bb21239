//! Who is asking: turning a request into the key that a limiter counts against.
//!
//! A [`KeyExtractor`] looks at the [request head](RequestHead) (method, URI, headers, extensions;
//! never the body) and returns a key, or a [`KeyError`] saying why it could not. The crate ships:
//!
//! * `PeerIp` (feature `axum` or `grpc`): the address of the TCP peer, from axum's
//!   `ConnectInfo` (or `MockConnectInfo` in tests) or tonic's `TcpConnectInfo`. IPv6 clients are keyed by their /64 network by default.
//! * [`ForwardedIp`] (a key extractor with feature `axum` or `grpc`): the client address behind reverse
//!   proxies that you trust, read from `X-Forwarded-For` or `Forwarded` only when the peer is one
//!   of those proxies.
//! * [`HeaderKey`]: the value of a request header such as `x-api-key` (for a gRPC call, a
//!   metadata entry).
//! * `GrpcMethod` (feature `grpc`): the gRPC method a call names.
//! * [`GlobalKey`]: one key for every request.
//! * any closure `Fn(&RequestHead) -> Result<K, KeyError>`.
//!
//! ```
//! use tower_bulwark::head::RequestHead;
//! use tower_bulwark::rate_limit::{KeyError, KeyExtractor};
//!
//! // Key by tenant, taken from the first path segment: `/acme/orders` -> "acme".
//! let by_tenant = |head: &RequestHead| {
//!     head.uri
//!         .path()
//!         .split('/')
//!         .nth(1)
//!         .filter(|s| !s.is_empty())
//!         .map(str::to_owned)
//!         .ok_or_else(|| KeyError::bad_request("the path names no tenant"))
//! };
//! let request = http::Request::get("/acme/orders").body(()).unwrap();
//! assert_eq!(by_tenant.extract(&RequestHead::from(&request)).unwrap(), "acme");
//! ```

use std::borrow::Cow;
use std::fmt;

use http::StatusCode;

use crate::head::RequestHead;

mod forwarded;
mod header;
mod ip;
#[cfg(feature = "grpc")]
mod method;

#[cfg(any(feature = "axum", feature = "grpc"))]
pub(crate) use self::ip::peer_ip;
#[cfg(any(feature = "axum", feature = "grpc"))]
pub use self::ip::PeerIp;
#[cfg(feature = "grpc")]
pub use self::method::GrpcMethod;
pub use self::{
    forwarded::ForwardedIp,
    header::HeaderKey,
    ip::{Cidr, CidrError},
};

/// Finds the rate-limit key of a request.
///
/// Implemented by the extractors of this module and by every closure
/// `Fn(&RequestHead) -> Result<K, KeyError>`.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key a limiter counts against.
    type Key: Send + 'static;

    /// Returns the key of the request whose head is `head`, or why there is none.
    fn extract(&self, head: &RequestHead<'_>) -> Result<Self::Key, KeyError>;
}

impl<F, K> KeyExtractor for F
where
    F: Fn(&RequestHead<'_>) -> Result<K, KeyError> + Send + Sync + 'static,
    K: Send + 'static,
{
    type Key = K;

    fn extract(&self, head: &RequestHead<'_>) -> Result<K, KeyError> {
        self(head)
    }
}

/// Why a request has no rate-limit key, and the status it deserves.
///
/// A client-side cause (a missing API key header) is a `400`; a server-side cause (the server was
/// started without connection info) is a `500`. What the layer does with it is chosen with
/// [`RateLimitLayer::key_error_mode`](super::RateLimitLayer::key_error_mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyError {
    status: StatusCode,
    reason: Cow<'static, str>,
}

impl KeyError {
    /// The client sent a request that carries no usable key (answered with `400`).
    pub fn bad_request(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::with_status(StatusCode::BAD_REQUEST, reason.into())
    }

    /// The client must say who it is first: a route limited per API key, called without one
    /// (answered with `401`).
    pub fn unauthorized(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::with_status(StatusCode::UNAUTHORIZED, reason.into())
    }

    /// The server is not set up to find keys (answered with `500`; the reason is logged, not
    /// sent).
    pub fn internal(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::with_status(StatusCode::INTERNAL_SERVER_ERROR, reason.into())
    }

    fn with_status(status: StatusCode, reason: Cow<'static, str>) -> Self {
        Self { status, reason }
    }

    /// The status of the answer; [`bad_request`](Self::bad_request),
    /// [`unauthorized`](Self::unauthorized) and [`internal`](Self::internal) choose it.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Why there is no key.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no rate-limit key: {}", self.reason)
    }
}

impl std::error::Error for KeyError {}

/// One key for every request: the whole route shares a single budget.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    type Key = ();

    fn extract(&self, _head: &RequestHead<'_>) -> Result<(), KeyError> {
        Ok(())
    }
}
