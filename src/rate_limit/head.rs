//! What key extractors, cost functions and exemptions read of a request: its head, borrowed.

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

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
/// use tower_bulwark::rate_limit::RequestHead;
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
    #[inline]
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
    #[inline]
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
