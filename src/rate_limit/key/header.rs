//! [`HeaderKey`]: the value of a request header as the key.

use http::header::{HeaderName, HeaderValue};

use super::{KeyError, KeyExtractor};
use crate::head::RequestHead;
use crate::rate_limit::PolicyError;

/// The value of one request header, such as `x-api-key`.
///
/// A request without the header, with an empty value, or with the header more than once gets a
/// [`KeyError::bad_request`]: when an authentication layer reads one copy of a repeated header
/// and this extractor another, a client could be authenticated as one key and counted as another.
/// So does a value longer than [`max_len`](Self::max_len) bytes (256 by default), which bounds
/// the memory each key may take.
///
/// The key is a copy of the value's bytes: a value taken as it is from the request would share,
/// and keep alive, the whole read buffer of the connection it arrived on.
///
/// Any client can put any value in a header, so put this layer after the layer that checks the
/// key, or every made-up key gets a fresh budget.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
    max_len: usize,
}

impl HeaderKey {
    /// The longest value accepted unless [`max_len`](Self::max_len) says otherwise, in bytes.
    pub const DEFAULT_MAX_LEN: usize = 256;

    /// Keys requests by the value of header `name`: a `&str` such as `"x-api-key"` (any case),
    /// or an `http::HeaderName`.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] if `name` is not a valid header field name (RFC 9110's token: no
    /// spaces, colons or other separators, not empty).
    pub fn new(name: impl AsRef<[u8]>) -> Result<Self, PolicyError> {
        match HeaderName::from_bytes(name.as_ref()) {
            Ok(name) => Ok(Self::for_header(name)),
            Err(_) => Err(PolicyError::new(
                "key header",
                "is not a valid header field name (RFC 9110's token: letters, digits and \
                 !#$%&'*+-.^_`|~, not empty)",
            )),
        }
    }

    /// Keys requests by the value of header `name`, already a valid field name.
    pub(crate) fn for_header(name: HeaderName) -> Self {
        Self {
            name,
            max_len: Self::DEFAULT_MAX_LEN,
        }
    }

    /// Refuses values longer than `bytes` with a `400` ([`DEFAULT_MAX_LEN`](Self::DEFAULT_MAX_LEN),
    /// 256, by default).
    pub fn max_len(mut self, bytes: usize) -> Self {
        self.max_len = bytes;
        self
    }
}

impl KeyExtractor for HeaderKey {
    type Key = HeaderValue;

    fn extract(&self, head: &RequestHead<'_>) -> Result<HeaderValue, KeyError> {
        let mut values = head.headers.get_all(&self.name).iter();
        let why = match (values.next(), values.next()) {
            (Some(value), None) if value.len() > self.max_len => {
                format!("is longer than {} bytes", self.max_len)
            }
            (Some(value), None) if value.is_empty() => "is empty".to_owned(),
            // A copy in an allocation of its own length: `HeaderValue::clone` would share the
            // request's buffer (over HTTP/1, the connection's whole read buffer) for as long as
            // the key lives. The bytes were a valid value already, so the copy cannot fail.
            (Some(value), None) => match HeaderValue::from_bytes(value.as_bytes()) {
                Ok(mut key) => {
                    key.set_sensitive(value.is_sensitive());
                    return Ok(key);
                }
                Err(_) => "is not a valid value".to_owned(),
            },
            (None, _) => "is missing".to_owned(),
            (Some(_), Some(_)) => "is sent more than once".to_owned(),
        };
        let name = &self.name;
        Err(KeyError::bad_request(format!("the `{name}` header {why}")))
    }
}
