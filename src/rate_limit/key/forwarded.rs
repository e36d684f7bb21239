//! [`ForwardedIp`]: the client address behind trusted reverse proxies, read from
//! `X-Forwarded-For` or RFC 7239 `Forwarded`.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::ControlFlow;
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use http::HeaderMap;

use super::ip::{mask_v4, mask_v6, Cidr, Prefixes};
use super::KeyError;
#[cfg(any(feature = "axum", feature = "grpc"))]
use super::{ip::peer_ip, KeyExtractor};
#[cfg(any(feature = "axum", feature = "grpc"))]
use crate::head::RequestHead;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Which header carries the chain of forwarding proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    XForwardedFor,
    Forwarded,
}

/// The client address behind reverse proxies that you trust.
///
/// You list the networks of your proxies. When the TCP peer is not in them, the forwarding
/// headers are ignored and the peer is the key, exactly as with `PeerIp`:
/// anyone can write `X-Forwarded-For`. When the peer is a trusted proxy, the chain in the header
/// is read from right to left (each proxy appends the address it saw), over the header's lines
/// from the last to the first, and the first address that is not a trusted proxy is the client.
/// When every address is a trusted proxy, or there is no header, the request came from inside
/// your network and the leftmost trusted address reached is the key.
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
/// [`RateLimitLayer::key_error_mode(FailMode::Open)`][key_error_mode] such requests pass through
/// uncounted instead.
///
/// It is a `KeyExtractor` with feature `axum` (the peer address comes from `ConnectInfo`);
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
///
/// [key_error_mode]: crate::rate_limit::RateLimitLayer::key_error_mode
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
        self.prefixes.v6 = mask_v6(bits);
        self
    }

    /// Keys IPv4 clients by their first `bits` bits (32 by default; values above 32 mean 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.prefixes.v4 = mask_v4(bits);
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
        // The header's name, as written in a key error, and the reader of its lines.
        let (name, shown, hops): (_, _, fn(&[u8], &mut _) -> ControlFlow<_>) = match self.source {
            Source::XForwardedFor => (X_FORWARDED_FOR, "X-Forwarded-For", x_forwarded_for_hops),
            Source::Forwarded => (FORWARDED, "Forwarded", forwarded_hops),
        };
        let mut last_trusted = peer;
        let mut visit = |hop: Hop| match hop {
            Hop::Addr(ip) if trusted(ip) => {
                last_trusted = ip;
                ControlFlow::Continue(())
            }
            Hop::Addr(ip) => ControlFlow::Break(Ok(ip)),
            Hop::Not(what) => ControlFlow::Break(Err(KeyError::bad_request(format!(
                "the `{shown}` header holds {what} where the client's address should be"
            )))),
        };
        let mut lines = headers.get_all(name).iter().rev();
        match lines.try_for_each(|line| hops(line.as_bytes(), &mut visit)) {
            ControlFlow::Break(found) => found,
            ControlFlow::Continue(()) => Ok(last_trusted),
        }
    }
}

#[cfg(any(feature = "axum", feature = "grpc"))]
impl KeyExtractor for ForwardedIp {
    type Key = IpAddr;

    fn extract(&self, head: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        let client = self.client_ip(peer_ip(head)?, head.headers)?;
        Ok(self.prefixes.key(client))
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
    line.rsplit(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|element| !element.is_empty())
        .try_for_each(|element| visit(Hop::node(element)))
}

/// Visits the hops of one `Forwarded` line from right to left, one per element. An element that
/// does not parse ends the line as one unreadable hop: what lies to its left cannot be told
/// apart from client-written text.
///
/// Of the bytes `trim_ascii_end` takes for white space, a header value holds only spaces and
/// tabs (RFC 9110's OWS): `HeaderValue` refuses the others.
fn forwarded_hops<B>(line: &[u8], visit: &mut impl FnMut(Hop) -> ControlFlow<B>) -> ControlFlow<B> {
    let mut rest = line;
    loop {
        rest = rest.trim_ascii_end();
        match rest.split_last() {
            None => return ControlFlow::Continue(()),
            Some((b',', before)) => rest = before, // an empty element
            Some(_) => match forwarded_element(rest) {
                Some((start, hop)) => {
                    visit(hop)?;
                    rest = &rest[..start];
                }
                None => return visit(Hop::Not(MALFORMED)),
            },
        }
    }
}

/// Reads the last element of `s` from its right end: where it starts (at 0 or just after a
/// comma) and its hop, or `None` if it does not parse.
fn forwarded_element(s: &[u8]) -> Option<(usize, Hop)> {
    let mut rest = s;
    let mut node = Hop::Not(NO_FOR);
    loop {
        rest = rest.trim_ascii_end();
        match rest.split_last() {
            None | Some((b',', _)) => break,
            Some((b';', before)) => rest = before, // an empty pair, or the separator before one
            Some(_) => {
                let (start, name, value) = forwarded_pair(rest)?;
                if name.eq_ignore_ascii_case(b"for") {
                    // Right to left: the first `for` met is the hop, unless another follows.
                    node = match node {
                        Hop::Not(NO_FOR) => Hop::node(&value),
                        _ => Hop::Not(TWO_FORS),
                    };
                }
                rest = &rest[..start];
                // Before a pair: white space, then a separator or the start of the line.
                if !matches!(rest.trim_ascii_end().last(), None | Some(b',' | b';')) {
                    return None;
                }
            }
        }
    }
    Some((rest.len(), node))
}

/// A `Forwarded` parameter read from the right: where it starts, its name, its unquoted value.
type Pair<'a> = (usize, &'a [u8], Cow<'a, [u8]>);

/// Reads the `name=value` pair that ends `s`, from the right; `None` if it does not parse.
fn forwarded_pair(s: &[u8]) -> Option<Pair<'_>> {
    let (value_start, value) = if s.last() == Some(&b'"') {
        quoted_string(s)?
    } else {
        let start = run_start(s, is_value_char);
        (start < s.len()).then(|| (start, Cow::Borrowed(&s[start..])))?
    };
    let name_end = value_start.checked_sub(1).filter(|&i| s[i] == b'=')?;
    let name_start = run_start(&s[..name_end], is_tchar);
    (name_start < name_end).then(|| (name_start, &s[name_start..name_end], value))
}

/// Where the run of bytes that `f` accepts at the end of `s` starts.
fn run_start(s: &[u8], f: impl Fn(u8) -> bool) -> usize {
    s.iter().rposition(|&b| !f(b)).map_or(0, |i| i + 1)
}

/// Reads the quoted string that ends `s` (its last byte is `"`), from the right: where its
/// opening quote is, and its content with the escapes removed; `None` if it does not parse.
///
/// A quote is escaped exactly when an odd number of backslashes precedes it, so the opening
/// quote is the nearest one to the left that follows an even number (usually none).
fn quoted_string(s: &[u8]) -> Option<(usize, Cow<'_, [u8]>)> {
    let backslashes_before = |i: usize| i - run_start(&s[..i], |b| b == b'\\');
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
    use crate::rate_limit::key::ip::tests::ip;

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
        // A client's unterminated quote does not swallow the hop its proxy appended.
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
