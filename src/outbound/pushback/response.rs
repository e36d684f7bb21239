//! Responses whose status and headers the pushback layer reads.

use http::{HeaderMap, StatusCode};

/// A response whose status and headers can be read: what [`Pushback`](super::Pushback) needs
/// from the services it wraps.
///
/// Implemented for `http::Response<B>`, `http::response::Parts` and, with the `reqwest`
/// feature, `reqwest::Response`; implement it for a client of your own.
pub trait ResponseHead {
    /// The status code.
    fn status(&self) -> StatusCode;
    /// The header fields.
    fn headers(&self) -> &HeaderMap;
}

impl<B> ResponseHead for http::Response<B> {
    fn status(&self) -> StatusCode {
        http::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        http::Response::headers(self)
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
}
