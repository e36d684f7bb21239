//! [`GrpcMethod`]: the gRPC method a call names, as the key (feature `grpc`).

use super::{KeyError, KeyExtractor};
use crate::head::RequestHead;

/// The gRPC method a call names: `/package.Service/Method` from the request path, so that each
/// method has a budget of its own (chain it with a per-client policy for "per client and
/// method").
///
/// A path of another shape (not two segments, a segment empty or over 128 bytes, a byte that a
/// protobuf name cannot hold) gets [`KeyError::bad_request`], which a gRPC call is answered as
/// `INVALID_ARGUMENT`. Any client can name any method, so made-up names are keys too: the store's
/// bound on keys (see [`max_keys`](crate::limiter::RateLimiterBuilder::max_keys)) keeps their
/// memory bounded, and a server answers them `UNIMPLEMENTED` past the layer.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcMethod;

/// The longest service or method name accepted, in bytes.
const MAX_SEGMENT: usize = 128;

impl KeyExtractor for GrpcMethod {
    type Key = Box<str>;

    fn extract(&self, head: &RequestHead<'_>) -> Result<Box<str>, KeyError> {
        let path = head.uri.path();
        let named = path.strip_prefix('/').and_then(|rest| rest.split_once('/'));
        let valid = |segment: &str| {
            (1..=MAX_SEGMENT).contains(&segment.len())
                && (segment.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        };
        match named {
            Some((service, method)) if valid(service) && valid(method) => Ok(path.into()),
            _ => Err(KeyError::bad_request(
                "the path names no gRPC method (`/package.Service/Method`)",
            )),
        }
    }
}
