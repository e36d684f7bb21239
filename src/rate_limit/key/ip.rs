//! Keys by IP address: [`PeerIp`], the TCP peer's; [`Cidr`], a network; and the prefixes that
//! say how much of an address identifies one client.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

#[cfg(any(feature = "axum", feature = "grpc"))]
use super::{KeyError, KeyExtractor};
#[cfg(any(feature = "axum", feature = "grpc"))]
use crate::head::RequestHead;

/// How much of an address identifies one client: the whole IPv4 address and the /64 network of
/// an IPv6 address, by default.
///
/// One IPv6 subscriber is usually handed a whole /64 (often a /56 or /48), and can pick a new
/// address in it for every request; keying by the full address would give each a fresh budget.
/// Kept as masks, made once, so that keying an address is one `and`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Prefixes {
    /// The mask of IPv4 addresses ([`mask_v4`]).
    pub(super) v4: u32,
    /// The mask of IPv6 addresses ([`mask_v6`]).
    pub(super) v6: u128,
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

    /// The part of `ip` that identifies one client. An IPv4 client seen through a dual-stack
    /// socket arrives as `::ffff:a.b.c.d`; it is an IPv4 client and is keyed as one (otherwise
    /// every IPv4 client would share one /64).
    pub(super) fn key(&self, ip: IpAddr) -> IpAddr {
        match ip.to_canonical() {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from_bits(v4.to_bits() & self.v4)),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & self.v6)),
        }
    }
}

/// The first `bits` bits of an IPv4 address set (above 32 means 32): the complement of all 32
/// shifted right by `bits` (of which a shift by 32 or more leaves none). The IPv4 prefix of
/// `PeerIp` and [`ForwardedIp`](super::ForwardedIp) alike.
pub(super) fn mask_v4(bits: u8) -> u32 {
    !u32::MAX.checked_shr(u32::from(bits)).unwrap_or(0)
}

/// The first `bits` bits of an IPv6 address set (above 128 means 128), as [`mask_v4`] makes
/// them: the IPv6 prefix of `PeerIp` and [`ForwardedIp`](super::ForwardedIp) alike.
pub(super) fn mask_v6(bits: u8) -> u128 {
    !u128::MAX.checked_shr(u32::from(bits)).unwrap_or(0)
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The network of `address` with `prefix` leading bits; an error if the prefix is longer
    /// than the address.
    pub fn new(address: IpAddr, prefix: u8) -> Result<Self, CidrError> {
        let address = address.to_canonical();
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(PREFIX_TOO_LONG);
        }
        Ok(Self {
            network: Prefixes::new(prefix, prefix).key(address),
            prefix,
        })
    }

    /// Whether `ip` lies in this network: its first `prefix` bits are the network's, and it is
    /// of the network's family (an IPv4 address masked stays IPv4, so it never equals an IPv6
    /// network).
    pub fn contains(&self, ip: IpAddr) -> bool {
        Prefixes::new(self.prefix, self.prefix).key(ip) == self.network
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
        let (addr, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let address: IpAddr = addr.parse().map_err(|_| CidrError("not an IP address"))?;
        let prefix = match prefix {
            None if address.to_canonical().is_ipv4() => 32,
            None => 128,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 3 => {
                p.parse::<u8>().map_err(|_| PREFIX_TOO_LONG)?
            }
            Some(_) => return Err(CidrError("the prefix is not a number of bits")),
        };
        Self::new(address, prefix)
    }
}

/// A network that could not be parsed or built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CidrError(&'static str);

const PREFIX_TOO_LONG: CidrError = CidrError("the prefix is longer than the address");

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid network: {}", self.0)
    }
}

impl std::error::Error for CidrError {}

/// The address of the TCP peer, as the server saw the connection.
///
/// Read from axum's `ConnectInfo<SocketAddr>` (serve the router with
/// `into_make_service_with_connect_info::<SocketAddr>()`), from `MockConnectInfo<SocketAddr>`
/// in tests, or (feature `grpc`) from the `TcpConnectInfo` a tonic server gives each request. Without either the request gets [`KeyError::internal`]: the server is set up wrong,
/// and refusing beats letting every request share, or escape, a budget.
///
/// IPv6 peers are keyed by their /64 network ([`ipv6_prefix`](Self::ipv6_prefix) changes it);
/// IPv4 peers by their full address. IPv4-mapped IPv6 addresses count as IPv4.
///
/// Behind a reverse proxy every request comes from the proxy; use
/// [`ForwardedIp`](super::ForwardedIp) there.
#[cfg(any(feature = "axum", feature = "grpc"))]
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerIp {
    prefixes: Prefixes,
}

#[cfg(any(feature = "axum", feature = "grpc"))]
impl PeerIp {
    /// The peer's IPv4 address, or its IPv6 /64.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys IPv6 peers by their first `bits` bits (64 by default; values above 128 mean 128).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.prefixes.v6 = mask_v6(bits);
        self
    }

    /// Keys IPv4 peers by their first `bits` bits (32 by default; values above 32 mean 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.prefixes.v4 = mask_v4(bits);
        self
    }
}

/// The TCP peer's address, from axum's `ConnectInfo` (or `MockConnectInfo`) or tonic's
/// `TcpConnectInfo`; without any, the server is set up wrong.
#[cfg(any(feature = "axum", feature = "grpc"))]
pub(crate) fn peer_ip(head: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
    #[cfg(feature = "axum")]
    {
        use axum::extract::connect_info::{ConnectInfo, MockConnectInfo};
        use std::net::SocketAddr;

        if let Some(ConnectInfo(addr)) = head.extensions.get::<ConnectInfo<SocketAddr>>() {
            return Ok(addr.ip());
        }
        if let Some(MockConnectInfo(addr)) = head.extensions.get::<MockConnectInfo<SocketAddr>>() {
            return Ok(addr.ip());
        }
    }
    #[cfg(feature = "grpc")]
    {
        use tonic::transport::server::TcpConnectInfo;

        let info = head.extensions.get::<TcpConnectInfo>();
        if let Some(addr) = info.and_then(TcpConnectInfo::remote_addr) {
            return Ok(addr.ip());
        }
    }
    Err(KeyError::internal(
        "the request carries no peer address; serve an axum router with \
         `into_make_service_with_connect_info::<SocketAddr>()`, or a tonic server over TCP",
    ))
}

#[cfg(any(feature = "axum", feature = "grpc"))]
impl KeyExtractor for PeerIp {
    type Key = IpAddr;

    fn extract(&self, head: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        Ok(self.prefixes.key(peer_ip(head)?))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The address `s` names (tests of the address keys).
    pub(in crate::rate_limit::key) fn ip(s: &str) -> IpAddr {
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
        assert_eq!(host.to_string(), "2001:db8::1/128");
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
}
