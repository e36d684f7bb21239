//! Who is asking: turning a request into the key that a limiter counts against.
//!
//! A [`KeyExtractor`] looks at the [request head](RequestHead) (method, URI, headers, extensions;
//! never the body) and returns a key, or a [`KeyError`] saying why it could not. The crate ships:
//!
//! * [`PeerIp`] (feature `axum`): the address of the TCP peer, from axum's `ConnectInfo` (or
//!   `MockConnectInfo` in tests). IPv6 clients are keyed by their /64 network by default.
//! * [`ForwardedIp`] (a key extractor with feature `axum`): the client address behind reverse
//!   proxies that you trust, read from `X-Forwarded-For` or `Forwarded` only when the peer is one
//!   of those proxies.
//! * [`HeaderKey`]: the value of a request header such as `x-api-key`.
//! * [`GlobalKey`]: one key for every request.
//! * any closure `Fn(&RequestHead) -> Result<K, KeyError>`.
//!
//! ```
//! use tower_bulwark::rate_limit::{KeyError, KeyExtractor, RequestHead};
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
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::ControlFlow;
use std::str::FromStr;
use std::sync::Arc;

use crate::head::RequestHead;
use http::header::{HeaderName, HeaderValue, FORWARDED};
use http::{HeaderMap, StatusCode};

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
        Self {
            status: StatusCode::BAD_REQUEST,
            reason: reason.into(),
        }
    }

    /// The client must say who it is first: a route limited per API key, called without one
    /// (answered with `401`).
    pub fn unauthorized(reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            reason: reason.into(),
        }
    }

    /// The server is not set up to find keys (answered with `500`; the reason is logged, not
    /// sent).
    pub fn internal(reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            reason: reason.into(),
        }
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

    /// Keys requests by the value of header `name`.
    pub fn new(name: HeaderName) -> Self {
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
        match (values.next(), values.next()) {
            (Some(value), None) if value.len() > self.max_len => {
                Err(KeyError::bad_request(format!(
                    "the `{}` header is longer than {} bytes",
                    self.name, self.max_len
                )))
            }
            (Some(value), None) if !value.is_empty() => own(value).ok_or_else(|| {
                KeyError::bad_request(format!("the `{}` header is not a valid value", self.name))
            }),
            (Some(_), None) => Err(KeyError::bad_request(format!(
                "the `{}` header is empty",
                self.name
            ))),
            (None, _) => Err(KeyError::bad_request(format!(
                "the `{}` header is missing",
                self.name
            ))),
            (Some(_), Some(_)) => Err(KeyError::bad_request(format!(
                "the `{}` header is sent more than once",
                self.name
            ))),
        }
    }
}

/// A copy of `value` in an allocation of its own length: `HeaderValue::clone` would share the
/// request's buffer (over HTTP/1, the connection's whole read buffer) for as long as the key
/// lives. `None` cannot happen (the bytes were a valid value already).
fn own(value: &HeaderValue) -> Option<HeaderValue> {
    let mut copy = HeaderValue::from_bytes(value.as_bytes()).ok()?;
    copy.set_sensitive(value.is_sensitive());
    Some(copy)
}

/// How much of an address identifies one client: the whole IPv4 address and the /64 network of
/// an IPv6 address, by default.
///
/// One IPv6 subscriber is usually handed a whole /64 (often a /56 or /48), and can pick a new
/// address in it for every request; keying by the full address would give each a fresh budget.
/// Kept as masks, made once, so that keying an address is one `and`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Prefixes {
    v4: u32,
    v6: u128,
}

impl Default for Prefixes {
    fn default() -> Self {
        Self::new(32, 64)
    }
}

impl Prefixes {
    /// The first `v4` bits of IPv4 addresses, the first `v6` of IPv6 ones (longer prefixes
    /// mean the whole address).
    fn new(v4: u8, v6: u8) -> Self {
        Self {
            v4: mask_v4(v4),
            v6: mask_v6(v6),
        }
    }

    fn with_v4(self, bits: u8) -> Self {
        Self {
            v4: mask_v4(bits),
            ..self
        }
    }

    fn with_v6(self, bits: u8) -> Self {
        Self {
            v6: mask_v6(bits),
            ..self
        }
    }

    #[inline]
    fn key(&self, ip: IpAddr) -> IpAddr {
        match canonical(ip) {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from_bits(v4.to_bits() & self.v4)),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & self.v6)),
        }
    }
}

fn mask_v4(bits: u8) -> u32 {
    match bits.min(32) {
        0 => 0,
        n => u32::MAX << (32 - n),
    }
}

fn mask_v6(bits: u8) -> u128 {
    match bits.min(128) {
        0 => 0,
        n => u128::MAX << (128 - n),
    }
}

/// An IPv4 client seen through a dual-stack socket arrives as `::ffff:a.b.c.d`; it is an IPv4
/// client and is keyed as one (otherwise every IPv4 client would share one /64).
#[inline]
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// A network in CIDR notation, such as `10.0.0.0/8` or `2001:db8::/32`, used to list trusted
/// proxies.
///
/// Parsed with [`FromStr`]; a bare address means that one host. Bits set beyond the prefix are
/// cleared (`192.168.1.7/24` is `192.168.1.0/24`). IPv4-mapped IPv6 addresses are compared as the
/// IPv4 addresses they are.
///
/// ```
/// use tower_bulwark::rate_limit::Cidr;
///
/// let net: Cidr = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse()?));
/// assert!(net.contains("::ffff:10.1.2.3".parse()?));
/// assert!(!net.contains("11.0.0.1".parse()?));
/// assert!("10.0.0.0/33".parse::<Cidr>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The network of `address` with `prefix` leading bits; an error if the prefix is longer
    /// than the address.
    pub fn new(address: IpAddr, prefix: u8) -> Result<Self, CidrError> {
        let address = canonical(address);
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(CidrError {
                reason: "the prefix is longer than the address",
            });
        }
        let p = Prefixes::new(prefix, prefix);
        Ok(Self {
            network: p.key(address),
            prefix,
        })
    }

    /// Whether `ip` lies in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                ip.to_bits() & mask_v4(self.prefix) == net.to_bits()
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                ip.to_bits() & mask_v6(self.prefix) == net.to_bits()
            }
            _ => false,
        }
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length in bits.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let address: IpAddr = addr.parse().map_err(|_| CidrError {
            reason: "not an IP address",
        })?;
        let address = canonical(address);
        let prefix = match prefix {
            None => {
                if address.is_ipv4() {
                    32
                } else {
                    128
                }
            }
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 3 => {
                p.parse::<u8>().map_err(|_| CidrError {
                    reason: "the prefix is longer than the address",
                })?
            }
            Some(_) => {
                return Err(CidrError {
                    reason: "the prefix is not a number of bits",
                })
            }
        };
        Self::new(address, prefix)
    }
}

/// A network that could not be parsed or built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CidrError {
    reason: &'static str,
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid network: {}", self.reason)
    }
}

impl std::error::Error for CidrError {}

/// The address of the TCP peer, as the server saw the connection.
///
/// Read from axum's `ConnectInfo<SocketAddr>` (serve the router with
/// `into_make_service_with_connect_info::<SocketAddr>()`), or from `MockConnectInfo<SocketAddr>`
/// in tests. Without either the request gets [`KeyError::internal`]: the server is set up wrong,
/// and refusing beats letting every request share, or escape, a budget.
///
/// IPv6 peers are keyed by their /64 network ([`ipv6_prefix`](Self::ipv6_prefix) changes it);
/// IPv4 peers by their full address. IPv4-mapped IPv6 addresses count as IPv4.
///
/// Behind a reverse proxy every request comes from the proxy; use [`ForwardedIp`] there.
#[cfg(feature = "axum")]
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerIp {
    prefixes: Prefixes,
}

#[cfg(feature = "axum")]
impl PeerIp {
    /// The peer's IPv4 address, or its IPv6 /64.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys IPv6 peers by their first `bits` bits (64 by default; values above 128 mean 128).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.prefixes = self.prefixes.with_v6(bits);
        self
    }

    /// Keys IPv4 peers by their first `bits` bits (32 by default; values above 32 mean 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.prefixes = self.prefixes.with_v4(bits);
        self
    }
}

#[cfg(feature = "axum")]
#[inline]
pub(crate) fn peer_ip(head: &RequestHead<'_>) -> Option<IpAddr> {
    use axum::extract::connect_info::{ConnectInfo, MockConnectInfo};
    use std::net::SocketAddr;

    if let Some(ConnectInfo(addr)) = head.extensions.get::<ConnectInfo<SocketAddr>>() {
        return Some(addr.ip());
    }
    head.extensions
        .get::<MockConnectInfo<SocketAddr>>()
        .map(|MockConnectInfo(addr)| addr.ip())
}

#[cfg(feature = "axum")]
const NO_PEER: &str = "the request carries no peer address; serve the router with \
                       `into_make_service_with_connect_info::<SocketAddr>()`";

#[cfg(feature = "axum")]
impl KeyExtractor for PeerIp {
    type Key = IpAddr;

    #[inline]
    fn extract(&self, head: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        match peer_ip(head) {
            Some(ip) => Ok(self.prefixes.key(ip)),
            None => Err(KeyError::internal(NO_PEER)),
        }
    }
}

/// Which header carries the chain of forwarding proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    XForwardedFor,
    Forwarded,
}

impl Source {
    fn header(self) -> &'static str {
        match self {
            Source::XForwardedFor => "X-Forwarded-For",
            Source::Forwarded => "Forwarded",
        }
    }
}

/// The client address behind reverse proxies that you trust.
///
/// You list the networks of your proxies. When the TCP peer is not in them, the forwarding
/// headers are ignored and the peer is the key, exactly as with [`PeerIp`]: anyone can write
/// `X-Forwarded-For`. When the peer is a trusted proxy, the chain in the header is read from
/// right to left (each proxy appends the address it saw), over the header's lines from the last
/// to the first, and the first address that is not a trusted proxy is the client. When every
/// address is a trusted proxy, or there is no header, the request came from inside your network
/// and the leftmost trusted address reached is the key.
///
/// # Reading the chain
///
/// Each header line is read as bytes, on its own, from its right end, so the hops that your
/// proxies appended are found whatever the client wrote before them. `X-Forwarded-For` is split
/// at every comma and each element stands alone. A `Forwarded` line is read from the right by
/// RFC 7239's grammar (`name=value` pairs separated by `;`, each value a token or a quoted string
/// with backslash escapes, elements separated by `,`); every parameter must parse, not only
/// `for`. When an element cannot be parsed, the rest of its line, to its left, counts as one
/// unreadable hop. Values may hold unquoted `:`, `[` and `]`, since proxies set up with
/// `for=$remote_addr` write IPv6 addresses unquoted.
///
/// # When the client cannot be known
///
/// A hop that is not an address (unparseable, `unknown`, an obfuscated node such as `_hidden`, a
/// `Forwarded` element without exactly one `for`) reached before the client's address means
/// that address is not known. The request gets [`KeyError::bad_request`], a `400` naming the
/// header: everything left of that hop may have been written by the client, and keying by the
/// trusted proxy instead would put every such client in one budget shared with the proxy. A
/// client can therefore neither pick its key nor share one. With
/// [`RateLimitLayer::key_error_mode(FailMode::Open)`](super::RateLimitLayer::key_error_mode) such
/// requests pass through uncounted instead.
///
/// It is a [`KeyExtractor`] with feature `axum` (the peer address comes from `ConnectInfo`);
/// without it, [`client_ip`](Self::client_ip) does the same work for a peer address you supply.
///
/// ```
/// use http::HeaderMap;
/// use tower_bulwark::rate_limit::{Cidr, ForwardedIp};
///
/// let behind_lb = ForwardedIp::forwarded(["10.0.0.0/8".parse::<Cidr>()?]);
/// let proxy = "10.0.0.2".parse()?;
/// let mut headers = HeaderMap::new();
/// // The client wrote `for=10.9.0.1;by="`; the proxy appended the address it saw.
/// headers.insert("forwarded", r#"for=10.9.0.1;by=", for=198.51.100.7"#.parse()?);
/// assert_eq!(behind_lb.client_ip(proxy, &headers)?, "198.51.100.7".parse::<std::net::IpAddr>()?);
/// // Nothing readable between the proxy and the client: a 400, not the proxy's address.
/// headers.insert("forwarded", r#"for=198.51.100.7;by=""#.parse()?);
/// assert_eq!(behind_lb.client_ip(proxy, &headers).unwrap_err().status(), 400);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ForwardedIp {
    trusted: Arc<[Cidr]>,
    source: Source,
    prefixes: Prefixes,
}

impl ForwardedIp {
    /// Reads `X-Forwarded-For` when the peer is in `trusted`.
    pub fn x_forwarded_for(trusted: impl IntoIterator<Item = Cidr>) -> Self {
        Self::with_source(trusted, Source::XForwardedFor)
    }

    /// Reads the `for=` parameters of RFC 7239 `Forwarded` when the peer is in `trusted`.
    pub fn forwarded(trusted: impl IntoIterator<Item = Cidr>) -> Self {
        Self::with_source(trusted, Source::Forwarded)
    }

    fn with_source(trusted: impl IntoIterator<Item = Cidr>, source: Source) -> Self {
        Self {
            trusted: trusted.into_iter().collect(),
            source,
            prefixes: Prefixes::default(),
        }
    }

    /// Keys IPv6 clients by their first `bits` bits (64 by default; values above 128 mean 128).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.prefixes = self.prefixes.with_v6(bits);
        self
    }

    /// Keys IPv4 clients by their first `bits` bits (32 by default; values above 32 mean 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.prefixes = self.prefixes.with_v4(bits);
        self
    }

    /// The client address for a connection from `peer` with request headers `headers`, before
    /// the prefix is applied, or a [`KeyError::bad_request`] when a hop that is not an address
    /// stands between the trusted proxies and the client.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> Result<IpAddr, KeyError> {
        let trusted = |ip: IpAddr| self.trusted.iter().any(|net| net.contains(ip));
        if !trusted(peer) {
            return Ok(peer);
        }
        let mut last_trusted = peer;
        let mut visit = |hop: Hop| match hop {
            Hop::Addr(ip) if trusted(ip) => {
                last_trusted = ip;
                ControlFlow::Continue(())
            }
            Hop::Addr(ip) => ControlFlow::Break(Ok(ip)),
            Hop::Not(what) => ControlFlow::Break(Err(KeyError::bad_request(format!(
                "the `{}` header holds {what} where the client's address should be",
                self.source.header()
            )))),
        };
        let walk = match self.source {
            Source::XForwardedFor => headers
                .get_all("x-forwarded-for")
                .iter()
                .rev()
                .try_for_each(|line| x_forwarded_for_hops(line.as_bytes(), &mut visit)),
            Source::Forwarded => headers
                .get_all(FORWARDED)
                .iter()
                .rev()
                .try_for_each(|line| forwarded_hops(line.as_bytes(), &mut visit)),
        };
        match walk {
            ControlFlow::Break(found) => found,
            ControlFlow::Continue(()) => Ok(last_trusted),
        }
    }
}

#[cfg(feature = "axum")]
impl KeyExtractor for ForwardedIp {
    type Key = IpAddr;

    fn extract(&self, head: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        let peer = peer_ip(head).ok_or_else(|| KeyError::internal(NO_PEER))?;
        self.client_ip(peer, head.headers)
            .map(|ip| self.prefixes.key(ip))
    }
}

/// One hop of a forwarding chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    /// An address.
    Addr(IpAddr),
    /// Anything else, described for the key error.
    Not(&'static str),
}

const NOT_AN_ADDRESS: &str = "a hop that is not an IP address";
const MALFORMED: &str = "an element that does not parse";
const NO_FOR: &str = "an element without a `for` parameter";
const TWO_FORS: &str = "an element with more than one `for` parameter";

impl Hop {
    fn node(node: &[u8]) -> Self {
        parse_node(node).map_or(Hop::Not(NOT_AN_ADDRESS), Hop::Addr)
    }
}

/// Visits the hops of one `X-Forwarded-For` line from right to left; each comma-separated
/// element is a hop of its own, and empty elements are skipped.
fn x_forwarded_for_hops<B>(
    line: &[u8],
    visit: &mut impl FnMut(Hop) -> ControlFlow<B>,
) -> ControlFlow<B> {
    for element in line.rsplit(|&b| b == b',') {
        let element = trim_ows(element);
        if !element.is_empty() {
            visit(Hop::node(element))?;
        }
    }
    ControlFlow::Continue(())
}

/// Visits the hops of one `Forwarded` line from right to left, one per element. An element that
/// does not parse ends the line as one unreadable hop: what lies to its left cannot be told
/// apart from client-written text.
fn forwarded_hops<B>(line: &[u8], visit: &mut impl FnMut(Hop) -> ControlFlow<B>) -> ControlFlow<B> {
    let mut end = line.len();
    loop {
        end = trim_ows_end(line, end);
        match end.checked_sub(1).map(|i| line[i]) {
            None => return ControlFlow::Continue(()),
            Some(b',') => end -= 1, // an empty element
            Some(_) => match forwarded_element(&line[..end]) {
                Some((start, hop)) => {
                    visit(hop)?;
                    end = start;
                }
                None => return visit(Hop::Not(MALFORMED)),
            },
        }
    }
}

/// Reads the last element of `s` from its right end: where it starts (at 0 or just after a
/// comma) and its hop, or `None` if it does not parse.
fn forwarded_element(s: &[u8]) -> Option<(usize, Hop)> {
    let mut pos = s.len();
    let mut fors = 0_u32;
    let mut node = Hop::Not(NO_FOR);
    loop {
        pos = trim_ows_end(s, pos);
        match pos.checked_sub(1).map(|i| s[i]) {
            None | Some(b',') => break,
            Some(b';') => pos -= 1, // an empty pair, or the separator before one
            Some(_) => {
                let (start, name, value) = forwarded_pair(&s[..pos])?;
                if name.eq_ignore_ascii_case(b"for") {
                    fors += 1;
                    node = Hop::node(&value);
                }
                // Before a pair: white space, then a separator or the start of the line.
                let before = trim_ows_end(s, start);
                if !matches!(
                    before.checked_sub(1).map(|i| s[i]),
                    None | Some(b',' | b';')
                ) {
                    return None;
                }
                pos = start;
            }
        }
    }
    let hop = match fors {
        0 => Hop::Not(NO_FOR),
        1 => node,
        _ => Hop::Not(TWO_FORS),
    };
    Some((pos, hop))
}

/// A `Forwarded` parameter read from the right: where it starts, its name, its unquoted value.
type Pair<'a> = (usize, &'a [u8], Cow<'a, [u8]>);

/// Reads the `name=value` pair that ends `s`, from the right; `None` if it does not parse.
fn forwarded_pair(s: &[u8]) -> Option<Pair<'_>> {
    let (value_start, value) = if s.last() == Some(&b'"') {
        quoted_string(s)?
    } else {
        let start = s.len() - s.iter().rev().take_while(|&&b| is_value_char(b)).count();
        if start == s.len() {
            return None;
        }
        (start, Cow::Borrowed(&s[start..]))
    };
    let name_end = value_start.checked_sub(1).filter(|&i| s[i] == b'=')?;
    let name_start = name_end
        - s[..name_end]
            .iter()
            .rev()
            .take_while(|&&b| is_tchar(b))
            .count();
    if name_start == name_end {
        return None;
    }
    Some((name_start, &s[name_start..name_end], value))
}

/// Reads the quoted string that ends `s` (its last byte is `"`), from the right: where its
/// opening quote is, and its content with the escapes removed; `None` if it does not parse.
///
/// A quote is escaped exactly when an odd number of backslashes precedes it, so the opening
/// quote is the nearest one to the left that follows an even number (usually none).
fn quoted_string(s: &[u8]) -> Option<(usize, Cow<'_, [u8]>)> {
    let backslashes_before = |i: usize| s[..i].iter().rev().take_while(|&&b| b == b'\\').count();
    let close = s.len() - 1;
    if backslashes_before(close) % 2 == 1 {
        return None; // the last quote is escaped: the string is not closed
    }
    let mut open = close;
    loop {
        open = s[..open].iter().rposition(|&b| b == b'"')?;
        if backslashes_before(open) % 2 == 0 {
            break;
        }
    }
    let inner = &s[open + 1..close];
    if !inner.contains(&b'\\') {
        return inner
            .iter()
            .all(|&b| is_qdtext(b))
            .then_some((open, Cow::Borrowed(inner)));
    }
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter().copied();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => out.push(bytes.next().filter(|&c| is_escapable(c))?),
            b if is_qdtext(b) => out.push(b),
            _ => return None,
        }
    }
    Some((open, Cow::Owned(out)))
}

/// RFC 9110 `tchar`: the bytes of a token.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The bytes of an unquoted value: a token, and also `:`, `[` and `]` for unquoted IPv6
/// addresses and ports, which none of the separators (`=`, `;`, `,`, `"`, white space) is.
fn is_value_char(b: u8) -> bool {
    is_tchar(b) || matches!(b, b':' | b'[' | b']')
}

/// RFC 9110 `qdtext`: a byte that stands for itself in a quoted string.
fn is_qdtext(b: u8) -> bool {
    matches!(b, b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff)
}

/// A byte that may follow a backslash in a quoted string.
fn is_escapable(b: u8) -> bool {
    matches!(b, b'\t' | b' ' | 0x21..=0x7e | 0x80..=0xff)
}

fn trim_ows(s: &[u8]) -> &[u8] {
    let end = trim_ows_end(s, s.len());
    let start = s[..end]
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    &s[start..end]
}

/// `end` moved left past any spaces and tabs.
fn trim_ows_end(s: &[u8], end: usize) -> usize {
    end - s[..end]
        .iter()
        .rev()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count()
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`, `[2001:db8::1]`
/// or `[2001:db8::1]:8080` (a port may be an RFC 7239 obfuscated one, `_abc`). Anything else
/// (`unknown`, `_hidden`, garbage, bytes outside ASCII) is `None`.
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let node = std::str::from_utf8(node).ok().filter(|s| s.is_ascii())?;
    if let Some(rest) = node.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        if !(after.is_empty() || is_port(after.strip_prefix(':')?)) {
            return None;
        }
        return addr.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    let (addr, port) = node.rsplit_once(':')?;
    if !is_port(port) {
        return None;
    }
    addr.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// A port number, or an RFC 7239 obfuscated port (`_` then letters, digits, `.`, `_`, `-`).
fn is_port(s: &str) -> bool {
    let number = !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit());
    let obfuscated = s.len() > 1
        && s.starts_with('_')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    number || obfuscated
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_mask_v6_to_64_and_unmap_v4() {
        let p = Prefixes::default();
        assert_eq!(p.key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(p.key(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(p.key(ip("192.0.2.7")), ip("192.0.2.7"));
        let p = Prefixes::new(0, 0);
        assert_eq!(p.key(ip("192.0.2.7")), ip("0.0.0.0"));
        assert_eq!(p.key(ip("2001:db8::1")), ip("::"));
        let p = Prefixes::new(24, 128);
        assert_eq!(p.key(ip("192.0.2.7")), ip("192.0.2.0"));
        assert_eq!(p.key(ip("2001:db8::1")), ip("2001:db8::1"));
    }

    #[test]
    fn cidr_parses_and_contains() {
        let net: Cidr = "192.168.1.7/24".parse().unwrap();
        assert_eq!(net.to_string(), "192.168.1.0/24");
        assert!(net.contains(ip("192.168.1.200")));
        assert!(!net.contains(ip("192.168.2.1")));
        assert!(!net.contains(ip("2001:db8::1")));
        let host: Cidr = "2001:db8::1".parse().unwrap();
        assert_eq!(host.prefix(), 128);
        assert!(host.contains(ip("2001:db8::1")));
        assert!(!host.contains(ip("2001:db8::2")));
        let all: Cidr = "::/0".parse().unwrap();
        assert!(all.contains(ip("2001:db8::2")));
        for bad in [
            "",
            "10.0.0.0/",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/x",
            "nope/8",
            "10/8",
            "::/-1",
            "10.0.0.0/0008",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn nodes_parse_with_and_without_ports() {
        let node = |s: &str| parse_node(s.as_bytes());
        assert_eq!(node("192.0.2.1"), Some(ip("192.0.2.1")));
        assert_eq!(node("192.0.2.1:8080"), Some(ip("192.0.2.1")));
        assert_eq!(node("192.0.2.1:_port"), Some(ip("192.0.2.1")));
        assert_eq!(node("2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(node("[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(node("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        assert_eq!(node("[2001:db8::1]:_x-1.b"), Some(ip("2001:db8::1")));
        for bad in [
            "unknown",
            "_hidden",
            "[2001:db8::1",
            "[192.0.2.1]",
            "192.0.2.1:",
            "192.0.2.1:x",
            "192.0.2.1:_",
            "192.0.2.1:_a/b",
            "[::1]x",
            "1.2.3.4:123456",
            "::1]",
            "",
        ] {
            assert_eq!(node(bad), None, "{bad:?}");
        }
        assert_eq!(parse_node(b"192.0.2.1\xff"), None);
        assert_eq!(parse_node("1.2.3.4\u{a0}".as_bytes()), None);
    }

    /// The hops of one line, right to left, as the walk sees them.
    fn hops(line: &[u8], forwarded: bool) -> Vec<Hop> {
        let mut out = Vec::new();
        let mut visit = |hop| {
            out.push(hop);
            ControlFlow::<()>::Continue(())
        };
        let _ = if forwarded {
            forwarded_hops(line, &mut visit)
        } else {
            x_forwarded_for_hops(line, &mut visit)
        };
        out
    }

    fn a(s: &str) -> Hop {
        Hop::Addr(ip(s))
    }

    #[test]
    fn x_forwarded_for_elements_stand_alone() {
        let x = |line: &[u8]| hops(line, false);
        assert_eq!(x(b""), []);
        assert_eq!(x(b" ,, \t,"), []);
        assert_eq!(x(b"192.0.2.1, 10.0.0.1"), [a("10.0.0.1"), a("192.0.2.1")]);
        assert_eq!(
            x(b"caf\xc3\xa9, 198.51.100.7"),
            [a("198.51.100.7"), Hop::Not(NOT_AN_ADDRESS)]
        );
        assert_eq!(
            x(b"\"1.2.3.4\",unknown,\t[::1]:80 "),
            [a("::1"), Hop::Not(NOT_AN_ADDRESS), Hop::Not(NOT_AN_ADDRESS)]
        );
    }

    #[test]
    fn forwarded_elements_are_read_from_the_right() {
        let f = |line: &str| hops(line.as_bytes(), true);
        let bad = Hop::Not(MALFORMED);
        assert_eq!(
            f("for=192.0.2.60;proto=http;by=203.0.113.43"),
            [a("192.0.2.60")]
        );
        assert_eq!(
            f(r#"For="[2001:db8:cafe::17]:4711""#),
            [a("2001:db8:cafe::17")]
        );
        assert_eq!(f("for=2001:db8::1"), [a("2001:db8::1")]);
        assert_eq!(f(r#"for="\1.2.3.4""#), [a("1.2.3.4")]);
        assert_eq!(f("for=1.2.3.4 ; proto=https ;"), [a("1.2.3.4")]);
        assert_eq!(
            f("for=1.2.3.4;;, ,for=5.6.7.8"),
            [a("5.6.7.8"), a("1.2.3.4")]
        );
        assert_eq!(f("proto=https"), [Hop::Not(NO_FOR)]);
        assert_eq!(f(";;;"), [Hop::Not(NO_FOR)]);
        assert_eq!(f("for=1.2.3.4;for=5.6.7.8"), [Hop::Not(TWO_FORS)]);
        assert_eq!(f("for=unknown"), [Hop::Not(NOT_AN_ADDRESS)]);
        assert_eq!(f(r#"for="""#), [Hop::Not(NOT_AN_ADDRESS)]);
        // The issue's attack: the client's unterminated quote no longer swallows the proxy's hop.
        assert_eq!(
            f(r#"for=10.9.0.1;by=", for=198.51.100.7"#),
            [a("198.51.100.7"), bad]
        );
        assert_eq!(f(r#"for=", for=198.51.100.7"#), [a("198.51.100.7"), bad]);
        // A quoted string holding commas, quotes and backslashes is one value.
        assert_eq!(
            f(r#"for=1.2.3.4;by="a,\"b\\", for=5.6.7.8"#),
            [a("5.6.7.8"), a("1.2.3.4")]
        );
        // An element with any malformed parameter is malformed; nothing left of it is read.
        for line in [
            "for=1.2.3.4;by=\"",
            "for=1.2.3.4;by=\"x\\\"",
            "for=1.2.3.4;by=",
            "for=1.2.3.4;=x",
            "for=1.2.3.4;by=a=b",
            "for=1.2.3.4;by\"=x",
            "for=1.2.3.4;by=x\"y\"",
            "for=\"1.2.3.4\"x",
            "for=1.2.3.4 by=x",
            "for = 1.2.3.4",
            "for=\"a\x01\"",
            "for",
            "=",
            "\"",
        ] {
            assert_eq!(f(line), [bad], "{line:?}");
        }
        assert_eq!(
            f("for=192.0.2.9, for=1.2.3.4;by=\", for=5.6.7.8"),
            [a("5.6.7.8"), bad]
        );
        assert_eq!(hops(b"for=\xff, for=5.6.7.8", true), [a("5.6.7.8"), bad]);
        assert_eq!(
            hops(b"for=\"\xff\", for=5.6.7.8", true),
            [a("5.6.7.8"), Hop::Not(NOT_AN_ADDRESS)]
        );
    }

    #[test]
    fn quoted_strings_end_at_the_nearest_unescaped_quote() {
        let q = |s: &str| quoted_string(s.as_bytes()).map(|(i, v)| (i, v.into_owned()));
        assert_eq!(q(r#"x="ab""#), Some((2, b"ab".to_vec())));
        assert_eq!(q(r#"x="a\"b""#), Some((2, b"a\"b".to_vec())));
        assert_eq!(q(r#"x="a\\""#), Some((2, b"a\\".to_vec())));
        assert_eq!(q(r#"x="a\\\"""#), Some((2, b"a\\\"".to_vec())));
        assert_eq!(q(r#"x="a\""#), None);
        assert_eq!(q(r#"x=\"a""#), None);
        assert_eq!(q(r#"""#), None);
        assert_eq!(q(r#""""#), Some((0, Vec::new())));
    }
}
