//! Hostile header bytes against the key extractors that read headers (`HeaderKey`,
//! `ForwardedIp`): any bytes a header value may hold, many lines, overlong values. They never
//! panic, a `HeaderKey` is the value's exact bytes (two values never share a key), and a client
//! never chooses its `ForwardedIp` key: an untrusted peer is keyed by itself, and behind a
//! trusted proxy the address the proxy appended is the key whatever the client wrote before it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use proptest::prelude::*;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{
    Cidr, ForwardedIp, HeaderKey, KeyExtractor, Policy, RateLimitLayer,
};
use tower_bulwark::{KeyedRateLimiter, Quota};

fn trusted() -> Vec<Cidr> {
    vec![
        "10.0.0.0/8".parse().unwrap(),
        "2001:db8:ffff::/48".parse().unwrap(),
    ]
}

/// Bytes shaped like what a hostile client writes into a forwarding header.
fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..48),
        proptest::collection::vec(
            prop_oneof![
                Just(b"for=".to_vec()),
                Just(b"\"".to_vec()),
                Just(b"\\".to_vec()),
                Just(b",".to_vec()),
                Just(b";".to_vec()),
                Just(b"=".to_vec()),
                Just(b" ".to_vec()),
                Just(b"[".to_vec()),
                Just(b"]".to_vec()),
                Just(b":".to_vec()),
                Just(b"unknown".to_vec()),
                Just(b"_hidden".to_vec()),
                Just(b"10.0.0.7".to_vec()),
                Just(b"198.51.100.1".to_vec()),
                Just(b"2001:db8:ffff::1".to_vec()),
                Just(b"by=".to_vec()),
                Just(b"proto=https".to_vec()),
            ],
            0..24
        )
        .prop_map(|parts| parts.concat()),
    ]
}

fn client_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 2]>().prop_map(|[a, b]| IpAddr::V4(Ipv4Addr::new(198, 51, a, b))),
        any::<u64>().prop_map(|low| IpAddr::V6(Ipv6Addr::from(
            (0x2001_0db8_0001_u128 << 80) | u128::from(low)
        ))),
    ]
}

fn proxy_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 3]>().prop_map(|[a, b, c]| IpAddr::V4(Ipv4Addr::new(10, a, b, c))),
        any::<u64>().prop_map(|low| IpAddr::V6(Ipv6Addr::from(
            (0x2001_0db8_ffff_u128 << 80) | u128::from(low)
        ))),
    ]
}

/// How a proxy writes `ip` into the header: bare for `X-Forwarded-For`; for `Forwarded`, as
/// RFC 7239 asks (IPv6 quoted in brackets, optionally with a port) or as `for=$remote_addr`
/// proxies write it, unquoted.
fn hop(forwarded: bool, ip: IpAddr, style: u8) -> String {
    if !forwarded {
        return ip.to_string();
    }
    match (ip, style % 3) {
        (IpAddr::V4(v4), 0) => format!("for={v4}"),
        (IpAddr::V4(v4), 1) => format!("for=\"{v4}:4711\""),
        (IpAddr::V4(v4), _) => format!("for={v4};proto=https;by=_lb"),
        (IpAddr::V6(v6), 0) => format!("for=\"[{v6}]\""),
        (IpAddr::V6(v6), 1) => format!("for=\"[{v6}]:4711\""),
        (IpAddr::V6(v6), _) => format!("for=[{v6}]"),
    }
}

fn head_of(request: &Request<()>) -> RequestHead<'_> {
    RequestHead::from(request)
}

fn request_with(peer: IpAddr, name: &str, lines: &[Vec<u8>]) -> Request<()> {
    let mut request = Request::get("/").body(()).unwrap();
    for line in lines {
        // Bytes no header value may hold are refused by `http` before any extractor sees them.
        if let Ok(value) = HeaderValue::from_bytes(line) {
            request
                .headers_mut()
                .append(HeaderName::from_bytes(name.as_bytes()).unwrap(), value);
        }
    }
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(peer, 4000)));
    request
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any lines of any bytes: the key is the single value's exact bytes, or a 400 for no
    /// value, an empty one, one over `max_len`, or several lines.
    #[test]
    fn a_header_key_is_the_exact_value_or_a_400(
        lines in proptest::collection::vec(
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..40),
                proptest::collection::vec(any::<u8>(), 300..320),
            ],
            0..3,
        ),
        max_len in prop_oneof![Just(None), (0usize..64).prop_map(Some)],
    ) {
        let mut extractor = HeaderKey::new("x-api-key").unwrap();
        if let Some(bytes) = max_len {
            extractor = extractor.max_len(bytes);
        }
        let limit = max_len.unwrap_or(HeaderKey::DEFAULT_MAX_LEN);
        let mut request = Request::get("/").body(()).unwrap();
        let mut kept = Vec::new();
        for line in &lines {
            if let Ok(value) = HeaderValue::from_bytes(line) {
                request.headers_mut().append("x-api-key", value);
                kept.push(line.clone());
            }
        }
        match extractor.extract(&head_of(&request)) {
            Ok(key) => {
                prop_assert_eq!(kept.len(), 1);
                prop_assert!(!kept[0].is_empty() && kept[0].len() <= limit);
                prop_assert_eq!(key.as_bytes(), &kept[0][..]);
            }
            Err(err) => {
                prop_assert_eq!(err.status(), StatusCode::BAD_REQUEST);
                prop_assert!(
                    kept.len() != 1 || kept[0].is_empty() || kept[0].len() > limit,
                    "{:?} refused: {}", kept, err.reason()
                );
            }
        }
    }

    /// A peer that is not a trusted proxy is keyed by its own address, whatever it writes.
    #[test]
    fn an_untrusted_peer_is_keyed_by_itself_whatever_it_writes(
        forwarded in any::<bool>(),
        peer in client_ip(),
        lines in proptest::collection::vec(hostile_bytes(), 0..4),
    ) {
        let (name, extractor) = if forwarded {
            ("forwarded", ForwardedIp::forwarded(trusted()))
        } else {
            ("x-forwarded-for", ForwardedIp::x_forwarded_for(trusted()))
        };
        let request = request_with(peer, name, &lines);
        prop_assert_eq!(extractor.client_ip(peer, request.headers()).unwrap(), peer);
        let key = extractor.ipv6_prefix(128).extract(&head_of(&request)).unwrap();
        prop_assert_eq!(key, peer);
    }

    /// Behind trusted proxies, the client writes anything (lines before, bytes before the
    /// proxy's hop on its line); the proxy appends the address it saw, and more trusted proxies
    /// may append theirs. The key is that address: the client neither chooses it nor shares
    /// the proxies' budget.
    #[test]
    fn behind_a_trusted_proxy_the_appended_address_is_the_key(
        forwarded in any::<bool>(),
        peer in proxy_ip(),
        client in client_ip(),
        written in proptest::collection::vec(hostile_bytes(), 0..3),
        prefix in hostile_bytes(),
        own_line in any::<bool>(),
        proxies in proptest::collection::vec((proxy_ip(), any::<u8>()), 0..3),
        style in any::<u8>(),
    ) {
        let (name, extractor) = if forwarded {
            ("forwarded", ForwardedIp::forwarded(trusted()))
        } else {
            ("x-forwarded-for", ForwardedIp::x_forwarded_for(trusted()))
        };
        let mut appended = hop(forwarded, client, style);
        for (proxy, style) in &proxies {
            appended = format!("{appended}, {}", hop(forwarded, *proxy, *style));
        }
        let mut lines = written.clone();
        if own_line {
            lines.push(appended.into_bytes());
        } else {
            // The client's own bytes, then the proxy's `, hop`, on one line. A line `http`
            // refuses is dropped whole, so the proxy's hop is then on a line of its own.
            let mut line = prefix.clone();
            line.extend_from_slice(b", ");
            line.extend_from_slice(appended.as_bytes());
            if HeaderValue::from_bytes(&line).is_ok() {
                lines.push(line);
            } else {
                lines.push(appended.into_bytes());
            }
        }
        let request = request_with(peer, name, &lines);
        let got = extractor.client_ip(peer, request.headers());
        prop_assert_eq!(got.as_ref().ok(), Some(&client), "{:?} from {} -> {:?}", lines.iter().map(|l| String::from_utf8_lossy(l).into_owned()).collect::<Vec<_>>(), peer, got.as_ref().map_err(|e| e.reason().to_string()));
    }

    /// Behind a trusted proxy, any bytes at all: never a panic; a refusal is a 400; and when
    /// the hop nearest the proxy is not an address (`unknown`, `_hidden`, garbage), the
    /// answer is a 400, never the proxy's own address.
    #[test]
    fn behind_a_trusted_proxy_garbage_is_a_400_never_the_proxy(
        forwarded in any::<bool>(),
        peer in proxy_ip(),
        lines in proptest::collection::vec(hostile_bytes(), 0..4),
        last in prop_oneof![
            Just("unknown".to_string()),
            "_[a-zA-Z0-9._-]{1,12}".prop_map(|s| s),
            "[g-z]{1,8}".prop_map(|s| s),
            Just("300.1.2.3".to_string()),
        ],
    ) {
        let (name, extractor) = if forwarded {
            ("forwarded", ForwardedIp::forwarded(trusted()))
        } else {
            ("x-forwarded-for", ForwardedIp::x_forwarded_for(trusted()))
        };
        let request = request_with(peer, name, &lines);
        if let Err(err) = extractor.client_ip(peer, request.headers()) {
            prop_assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        }
        let mut lines = lines;
        let last = if forwarded { format!("for={last}") } else { last };
        lines.push(format!("198.51.100.1, {last}").into_bytes());
        let request = request_with(peer, name, &lines);
        let err = extractor.client_ip(peer, request.headers()).unwrap_err();
        prop_assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    }
}

/// Through the layer: an overlong chain (a hundred hops of garbage and spoofed addresses
/// before the proxy's hop) is keyed by the proxy's hop, and a 100-hop chain ending in
/// `unknown` is a 400 that spends nothing.
#[tokio::test]
async fn an_overlong_chain_through_the_layer_is_keyed_by_the_appended_hop() {
    let limiter = KeyedRateLimiter::<IpAddr>::new(Quota::per_hour(1).unwrap());
    let policy = Policy::new(
        "client",
        ForwardedIp::x_forwarded_for(trusted()),
        limiter.clone(),
    )
    .unwrap();
    let service = RateLimitLayer::new(policy).layer(service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
    }));
    let send = |chain: String| {
        let service = service.clone();
        async move {
            let mut request = Request::get("/")
                .header("x-forwarded-for", chain)
                .body(Body::empty())
                .unwrap();
            request
                .extensions_mut()
                .insert(ConnectInfo(SocketAddr::from(([10, 0, 0, 2], 4000))));
            service.oneshot(request).await.unwrap().status()
        }
    };
    let spoof = "198.51.100.66, _x, unknown, 10.0.0.9, ".repeat(100);
    assert_eq!(send(format!("{spoof}198.51.100.7")).await, StatusCode::OK);
    assert_eq!(
        send(format!("{spoof}198.51.100.7")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(format!("{spoof}unknown")).await,
        StatusCode::BAD_REQUEST
    );
    // Neither the spoofed addresses nor the proxies were charged.
    for ip in ["198.51.100.66", "10.0.0.9", "10.0.0.2"] {
        let ip: IpAddr = ip.parse().unwrap();
        assert!(limiter.check(&ip).allowed, "{ip} was charged");
    }
}
