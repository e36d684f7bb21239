//! Who is asking: turning a request into the key that a limiter counts against.
//!
//! A [`KeyExtractor`] looks at the request head (method, URI, headers, extensions; never the body)
//! and returns a key, or a [`KeyError`] saying why it could not. The crate ships:
//!
//! * [`PeerIp`] (feature `axum`): the address of the TCP peer, from axum's `ConnectInfo` (or
//!   `MockConnectInfo` in tests). IPv6 clients are keyed by their /64 network by default.
//! * [`ForwardedIp`] (a key extractor with feature `axum`): the client address behind reverse
//!   proxies that you trust, read from `X-Forwarded-For` or `Forwarded` only when the peer is one
//!   of those proxies.
//! * [`HeaderKey`]: the value of a request header such as `x-api-key`.
//! * [`GlobalKey`]: one key for every request.
//! * any closure `Fn(&http::request::Parts) -> Result<K, KeyError>`.
//!
//! ```
//! use http::request::Parts;
//! use tower_bulwark::rate_limit::{KeyError, KeyExtractor};
//!
//! // Key by tenant, taken from the first path segment: `/acme/orders` -> "acme".
//! let by_tenant = |parts: &Parts| {
//!     parts
//!         .uri
//!         .path()
//!         .split('/')
//!         .nth(1)
//!         .filter(|s| !s.is_empty())
//!         .map(str::to_owned)
//!         .ok_or_else(|| KeyError::bad_request("the path names no tenant"))
//! };
//! let (parts, ()) = http::Request::get("/acme/orders").body(()).unwrap().into_parts();
//! assert_eq!(by_tenant.extract(&parts).unwrap(), "acme");
//! ```

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue, FORWARDED};
use http::request::Parts;
use http::{HeaderMap, StatusCode};

/// Finds the rate-limit key of a request.
///
/// Implemented by the extractors of this module and by every closure
/// `Fn(&http::request::Parts) -> Result<K, KeyError>`.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key a limiter counts against.
    type Key: Send + 'static;

    /// Returns the key of the request described by `parts`, or why there is none.
    fn extract(&self, parts: &Parts) -> Result<Self::Key, KeyError>;
}

impl<F, K> KeyExtractor for F
where
    F: Fn(&Parts) -> Result<K, KeyError> + Send + Sync + 'static,
    K: Send + 'static,
{
    type Key = K;

    fn extract(&self, parts: &Parts) -> Result<K, KeyError> {
        self(parts)
    }
}

/// Why a request has no rate-limit key, and the status it deserves.
///
/// A client-side cause (a missing API key header) is a `400`; a server-side cause (the server was
/// started without connection info) is a `500`. What the layer does with it is chosen with
/// [`RateLimitLayer::on_key_error`](super::RateLimitLayer::on_key_error).
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

    /// The server is not set up to find keys (answered with `500`; the reason is logged, not
    /// sent).
    pub fn internal(reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            reason: reason.into(),
        }
    }

    /// The status of the answer; [`bad_request`](Self::bad_request) and
    /// [`internal`](Self::internal) choose it.
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

    fn extract(&self, _parts: &Parts) -> Result<(), KeyError> {
        Ok(())
    }
}

/// The value of one request header, such as `x-api-key`.
///
/// A request without the header, with an empty value, or with the header more than once gets a
/// [`KeyError::bad_request`]: when an authentication layer reads one copy of a repeated header
/// and this extractor another, a client could be authenticated as one key and counted as another.
///
/// Any client can put any value in a header, so put this layer after the layer that checks the
/// key, or every made-up key gets a fresh budget.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys requests by the value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl KeyExtractor for HeaderKey {
    type Key = HeaderValue;

    fn extract(&self, parts: &Parts) -> Result<HeaderValue, KeyError> {
        let mut values = parts.headers.get_all(&self.name).iter();
        match (values.next(), values.next()) {
            (Some(value), None) if !value.is_empty() => Ok(value.clone()),
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

/// How much of an address identifies one client: the whole IPv4 address and the /64 network of
/// an IPv6 address, by default.
///
/// One IPv6 subscriber is usually handed a whole /64 (often a /56 or /48), and can pick a new
/// address in it for every request; keying by the full address would give each a fresh budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Prefixes {
    v4: u8,
    v6: u8,
}

impl Default for Prefixes {
    fn default() -> Self {
        Self { v4: 32, v6: 64 }
    }
}

impl Prefixes {
    fn key(&self, ip: IpAddr) -> IpAddr {
        match canonical(ip) {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from_bits(v4.to_bits() & mask_v4(self.v4))),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & mask_v6(self.v6))),
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
        let p = Prefixes {
            v4: prefix,
            v6: prefix,
        };
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
        self.prefixes.v6 = bits.min(128);
        self
    }

    /// Keys IPv4 peers by their first `bits` bits (32 by default; values above 32 mean 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.prefixes.v4 = bits.min(32);
        self
    }
}

#[cfg(feature = "axum")]
fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    use axum::extract::connect_info::{ConnectInfo, MockConnectInfo};
    use std::net::SocketAddr;

    if let Some(ConnectInfo(addr)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() {
        return Some(addr.ip());
    }
    parts
        .extensions
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
    fn extract(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        match peer_ip(parts) {
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

/// The client address behind reverse proxies that you trust.
///
/// You list the networks of your proxies. When the TCP peer is not in them, the forwarding
/// headers are ignored and the peer is the key, exactly as with [`PeerIp`]: anyone can write
/// `X-Forwarded-For`. When the peer is a trusted proxy, the chain in the header is read from
/// right to left (each proxy appends the address it saw) and the first address that is not a
/// trusted proxy is the client.
///
/// A value that is not an address (malformed, `unknown`, an obfuscated `Forwarded` node) stops
/// the walk: everything to its left may have been written by the client, so the key is the last
/// address known to be honest, the trusted hop that received the request. A client can therefore
/// never pick its own key; at worst, a broken proxy chain makes its clients share one budget.
///
/// Several header lines are read as one list, in order; empty list elements are skipped.
///
/// It is a [`KeyExtractor`] with feature `axum` (the peer address comes from `ConnectInfo`);
/// without it, [`client_ip`](Self::client_ip) does the same work for a peer address you supply.
///
/// ```
/// use tower_bulwark::rate_limit::{Cidr, ForwardedIp};
///
/// let behind_lb = ForwardedIp::x_forwarded_for(["10.0.0.0/8".parse::<Cidr>()?]);
/// # let _ = behind_lb;
/// # Ok::<(), tower_bulwark::rate_limit::CidrError>(())
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
        self.prefixes.v6 = bits.min(128);
        self
    }

    /// Keys IPv4 clients by their first `bits` bits (32 by default; values above 32 mean 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.prefixes.v4 = bits.min(32);
        self
    }

    /// The client address for a connection from `peer` with request headers `headers`, before
    /// the prefix is applied.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let trusted = |ip: IpAddr| self.trusted.iter().any(|net| net.contains(ip));
        if !trusted(peer) {
            return peer;
        }
        let hops = match self.source {
            Source::XForwardedFor => x_forwarded_for_hops(headers),
            Source::Forwarded => forwarded_hops(headers),
        };
        let mut last_trusted = peer;
        for hop in hops.into_iter().rev() {
            match hop {
                Some(ip) if trusted(ip) => last_trusted = ip,
                Some(ip) => return ip,
                None => break,
            }
        }
        last_trusted
    }
}

#[cfg(feature = "axum")]
impl KeyExtractor for ForwardedIp {
    type Key = IpAddr;

    fn extract(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        let peer = peer_ip(parts).ok_or_else(|| KeyError::internal(NO_PEER))?;
        Ok(self.prefixes.key(self.client_ip(peer, &parts.headers)))
    }
}

/// One hop of a forwarding chain: an address, or `None` for anything else.
type Hop = Option<IpAddr>;

/// The hops of every `X-Forwarded-For` line, left to right.
fn x_forwarded_for_hops(headers: &HeaderMap) -> Vec<Hop> {
    let mut hops = Vec::new();
    for line in headers.get_all("x-forwarded-for") {
        let Ok(line) = line.to_str() else {
            hops.push(None);
            continue;
        };
        for element in line.split(',') {
            let element = element.trim_matches([' ', '\t']);
            if !element.is_empty() {
                hops.push(parse_node(element));
            }
        }
    }
    hops
}

/// The `for=` hops of every `Forwarded` line, left to right. An element without exactly one
/// `for` parameter, or that cannot be parsed, is a `None` hop.
fn forwarded_hops(headers: &HeaderMap) -> Vec<Hop> {
    let mut hops = Vec::new();
    for line in headers.get_all(FORWARDED) {
        let Ok(line) = line.to_str() else {
            hops.push(None);
            continue;
        };
        for element in split_outside_quotes(line, ',') {
            let element = element.trim_matches([' ', '\t']);
            if !element.is_empty() {
                hops.push(forwarded_for(element));
            }
        }
    }
    hops
}

/// The address in the `for` parameter of one `Forwarded` element.
fn forwarded_for(element: &str) -> Hop {
    let mut found: Option<Hop> = None;
    for pair in split_outside_quotes(element, ';') {
        let pair = pair.trim_matches([' ', '\t']);
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=')?;
        if !name.trim_matches([' ', '\t']).eq_ignore_ascii_case("for") {
            continue;
        }
        if found.is_some() {
            return None; // two `for` parameters: ambiguous
        }
        let value = unquote(value.trim_matches([' ', '\t']))?;
        found = Some(parse_node(&value));
    }
    found.flatten()
}

/// Splits `s` at `sep` where it is not inside a quoted string.
fn split_outside_quotes(s: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut quoted = false;
        let mut escaped = false;
        for (i, c) in s.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                c if c == sep && !quoted => {
                    rest = Some(&s[i + c.len_utf8()..]);
                    return Some(&s[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
}

/// The content of a token or a quoted string; `None` for an unterminated quote.
fn unquote(value: &str) -> Option<Cow<'_, str>> {
    let Some(inner) = value.strip_prefix('"') else {
        return if value.contains('"') {
            None
        } else {
            Some(Cow::Borrowed(value))
        };
    };
    let inner = inner.strip_suffix('"')?;
    if !inner.contains('\\') {
        return if inner.contains('"') {
            None
        } else {
            Some(Cow::Borrowed(inner))
        };
    }
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return None,
            c => out.push(c),
        }
    }
    Some(Cow::Owned(out))
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`, `[2001:db8::1]`
/// or `[2001:db8::1]:8080`. Anything else (`unknown`, `_hidden`, garbage) is `None`.
fn parse_node(node: &str) -> Hop {
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

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit())
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
        let p = Prefixes { v4: 0, v6: 0 };
        assert_eq!(p.key(ip("192.0.2.7")), ip("0.0.0.0"));
        assert_eq!(p.key(ip("2001:db8::1")), ip("::"));
        let p = Prefixes { v4: 24, v6: 128 };
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
        assert_eq!(parse_node("192.0.2.1"), Some(ip("192.0.2.1")));
        assert_eq!(parse_node("192.0.2.1:8080"), Some(ip("192.0.2.1")));
        assert_eq!(parse_node("2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        for bad in [
            "unknown",
            "_hidden",
            "[2001:db8::1",
            "[192.0.2.1]",
            "192.0.2.1:",
            "192.0.2.1:x",
            "[::1]x",
            "1.2.3.4:123456",
            "::1]",
        ] {
            assert_eq!(parse_node(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn forwarded_elements() {
        assert_eq!(
            forwarded_for("for=192.0.2.60;proto=http;by=203.0.113.43"),
            Some(ip("192.0.2.60"))
        );
        assert_eq!(
            forwarded_for("For=\"[2001:db8:cafe::17]:4711\""),
            Some(ip("2001:db8:cafe::17"))
        );
        assert_eq!(forwarded_for("proto=https"), None);
        assert_eq!(forwarded_for("for=1.2.3.4;for=5.6.7.8"), None);
        assert_eq!(forwarded_for("for=\"1.2.3.4"), None);
        assert_eq!(forwarded_for("for"), None);
        assert_eq!(forwarded_for("for=\"\\1.2.3.4\""), Some(ip("1.2.3.4")));
        let parts: Vec<_> = split_outside_quotes("a=\"x,y\",b", ',').collect();
        assert_eq!(parts, ["a=\"x,y\"", "b"]);
    }
}
