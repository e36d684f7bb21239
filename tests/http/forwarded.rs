//! `ForwardedIp` under hostile forwarding headers: the key is the hop the trusted proxy wrote,
//! or a 400, whatever the client wrote before it. Through the layer with `oneshot`, over a real
//! listener with a real client, and as properties over arbitrary client-written bytes.

use crate::common::listener::serve;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use proptest::prelude::*;
use tower::ServiceExt;
use tower_bulwark::rate_limit::{Cidr, FailMode, ForwardedIp, Policy, RateLimitLayer};
use tower_bulwark::{clock::ManualClock, KeyedRateLimiter, Quota};

/// The quota of every test: five requests, and the clock never moves, so none comes back.
const QUOTA: u32 = 5;

fn app(extractor: ForwardedIp) -> Router {
    let limiter = KeyedRateLimiter::<IpAddr>::builder(Quota::per_minute(QUOTA).unwrap())
        .clock(ManualClock::new())
        .build();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(
            RateLimitLayer::new(Policy::new("per-client", extractor, limiter).unwrap())
                .without_admitted_headers(),
        )
}

fn trusted() -> Vec<Cidr> {
    vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()]
}

/// A proxy in 10.0.0.0/8 forwards a request carrying `headers` (byte values, appended in order).
async fn via_proxy(app: &Router, headers: &[(&str, &[u8])]) -> StatusCode {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    for (name, value) in headers {
        request.headers_mut().append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    app.clone()
        .layer(MockConnectInfo(SocketAddr::from(([10, 0, 0, 2], 443))))
        .oneshot(request)
        .await
        .unwrap()
        .status()
}

fn count(statuses: &[StatusCode], status: StatusCode) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

#[tokio::test]
async fn a_client_rotating_unterminated_quotes_gets_exactly_its_quota() {
    // nginx: proxy_set_header Forwarded "$http_forwarded, for=$remote_addr"
    let app = app(ForwardedIp::forwarded(trusted()));
    let mut statuses = Vec::new();
    for i in 0..200 {
        let line = format!("for=10.9.{}.{};by=\", for=198.51.100.7", i / 250, i % 250);
        statuses.push(via_proxy(&app, &[("forwarded", line.as_bytes())]).await);
    }
    assert_eq!(count(&statuses, StatusCode::OK), QUOTA as usize);
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 200 - 5);
}

#[tokio::test]
async fn malformed_client_text_neither_adds_a_quota_nor_shares_the_proxys() {
    for (header, junk, honest) in [
        ("x-forwarded-for", &b"caf\xc3\xa9"[..], &b"198.51.100.8"[..]),
        ("x-forwarded-for", b"\xff\"1.2.3.4", b"198.51.100.8"),
        ("forwarded", b"for=\"", b"for=198.51.100.8"),
        ("forwarded", b"for=caf\xc3\xa9", b"for=198.51.100.8"),
        ("forwarded", b"for=1.2.3.4;by=\"\\\"", b"for=198.51.100.8"),
    ] {
        let extractor = if header == "forwarded" {
            ForwardedIp::forwarded(trusted())
        } else {
            ForwardedIp::x_forwarded_for(trusted())
        };
        let app = app(extractor);
        let with_junk = [junk, b", ", honest].concat();
        let mut statuses = Vec::new();
        for _ in 0..10 {
            statuses.push(via_proxy(&app, &[(header, &with_junk)]).await);
            statuses.push(via_proxy(&app, &[(header, honest)]).await);
            // The proxy appending its hop on a line of its own: the same client.
            statuses.push(via_proxy(&app, &[(header, junk), (header, honest)]).await);
        }
        let what = String::from_utf8_lossy(junk);
        assert_eq!(count(&statuses, StatusCode::OK), 5, "{header}: {what}");
        // The proxy's own budget (requests it sends itself, without the header) is untouched.
        for _ in 0..QUOTA {
            assert_eq!(via_proxy(&app, &[]).await, StatusCode::OK, "{what}");
        }
        assert_eq!(
            via_proxy(&app, &[]).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{what}"
        );
        // Junk that the proxy forwarded without appending anything: no key, a 400.
        assert_eq!(
            via_proxy(&app, &[(header, junk)]).await,
            StatusCode::BAD_REQUEST,
            "{what}"
        );
    }
}

#[tokio::test]
async fn an_unreadable_hop_is_a_400_naming_the_header_or_passes_uncounted_when_open() {
    let app = app(ForwardedIp::forwarded(trusted()));
    let request = || {
        Request::get("/")
            .header("forwarded", "for=198.51.100.9;by=\"")
            .body(Body::empty())
            .unwrap()
    };
    let response = app
        .clone()
        .layer(MockConnectInfo(SocketAddr::from(([10, 0, 0, 2], 443))))
        .oneshot(request())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("`Forwarded`"), "{detail}");

    let limiter = KeyedRateLimiter::<IpAddr>::builder(Quota::per_minute(1).unwrap())
        .clock(ManualClock::new())
        .build();
    let per_client = Policy::new(
        "per-client",
        ForwardedIp::forwarded(trusted()),
        limiter.clone(),
    )
    .unwrap();
    let failing_open = RateLimitLayer::new(per_client).key_error_mode(FailMode::Open);
    let open = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(failing_open)
        .layer(MockConnectInfo(SocketAddr::from(([10, 0, 0, 2], 443))));
    for _ in 0..3 {
        let status = open.clone().oneshot(request()).await.unwrap().status();
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(limiter.len(), 0, "requests without a key are not counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_real_listener_client_text_cannot_choose_or_share_a_key() {
    // The client connects from 127.0.0.1, standing in for the trusted proxy: it sends the lines
    // exactly as the proxy would forward them, its own text first and the proxy's hop last.
    let loopback: Cidr = "127.0.0.0/8".parse().unwrap();
    let client = reqwest::Client::new();
    let get = |url: String, name: &'static str, value: Vec<u8>| {
        let client = client.clone();
        async move {
            client
                .get(url)
                .header(name, HeaderValue::from_bytes(&value).unwrap())
                .send()
                .await
                .unwrap()
                .status()
        }
    };

    let addr = serve(app(ForwardedIp::forwarded([loopback]))).await;
    let url = format!("http://{addr}/");
    let mut ok = 0;
    for i in 0..200 {
        let line = format!("for=10.9.0.{};by=\", for=198.51.100.7", i % 250);
        ok += usize::from(get(url.clone(), "forwarded", line.into_bytes()).await == StatusCode::OK);
    }
    assert_eq!(ok, QUOTA as usize, "rotating `for=10.9.0.x;by=\"` prefixes");

    for (name, junk, honest) in [
        ("x-forwarded-for", &b"caf\xc3\xa9"[..], &b"198.51.100.8"[..]),
        ("forwarded", b"for=\"", b"for=198.51.100.8"),
    ] {
        let extractor = if name == "forwarded" {
            ForwardedIp::forwarded([loopback])
        } else {
            ForwardedIp::x_forwarded_for([loopback])
        };
        let url = format!("http://{}/", serve(app(extractor)).await);
        let mut ok = 0;
        for _ in 0..10 {
            let with_junk = [junk, b", ", honest].concat();
            ok += usize::from(get(url.clone(), name, with_junk).await == StatusCode::OK);
            ok += usize::from(get(url.clone(), name, honest.to_vec()).await == StatusCode::OK);
        }
        assert_eq!(
            ok,
            QUOTA as usize,
            "{name}: {}",
            String::from_utf8_lossy(junk)
        );
        let status = get(url.clone(), name, junk.to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
}

// ---------------------------------------------------------------------------------------------
// Properties: for any client-written prefix, the key is the hop the trusted proxy appended.

/// The peer: a trusted proxy.
const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

/// Bytes a client may write in a header value: anything `HeaderValue::from_bytes` takes.
fn arbitrary_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..48).prop_filter("a valid header value", |v| {
        HeaderValue::from_bytes(v).is_ok()
    })
}

/// Client text made of the pieces that confuse a parser: quotes, escapes, separators,
/// parameters, brackets, addresses, bytes outside ASCII.
fn tricky_bytes() -> impl Strategy<Value = Vec<u8>> {
    const PIECES: &[&[u8]] = &[
        b"\"",
        b"\\",
        b"\\\"",
        b",",
        b", ",
        b";",
        b"=",
        b" ",
        b"\t",
        b"for=",
        b"For=",
        b"by=",
        b"proto=",
        b"for=\"",
        b"by=\"",
        b"[",
        b"]",
        b":",
        b"10.9.0.1",
        b"6.6.6.6",
        b"2001:db8::66",
        b"[2001:db8::66]:80",
        b"unknown",
        b"_hidden",
        b"caf\xc3\xa9",
        b"\xff",
        b"\x80",
    ];
    prop::collection::vec(prop::sample::select(PIECES), 0..24).prop_map(|pieces| pieces.concat())
}

fn prefix() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![arbitrary_bytes(), tricky_bytes()]
}

/// An address outside the trusted networks, as the key of the client.
fn honest_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))),
        any::<u128>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
    ]
    .prop_filter("not a trusted proxy", |ip| {
        !trusted().iter().any(|net| net.contains(*ip))
    })
}

/// How a proxy writes `ip` (and the port it saw) into each header.
fn written(ip: IpAddr, port: u16, forwarded: bool) -> String {
    match (ip, forwarded) {
        (IpAddr::V4(v4), true) => format!("for={v4}"),
        (IpAddr::V6(v6), true) => format!("for=\"[{v6}]:{port}\""),
        (IpAddr::V4(v4), false) => format!("{v4}"),
        (IpAddr::V6(v6), false) => format!("[{v6}]:{port}"),
    }
}

fn headers(name: &str, lines: &[Vec<u8>]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in lines {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(line).unwrap(),
        );
    }
    map
}

fn extractor(forwarded: bool) -> (ForwardedIp, &'static str) {
    if forwarded {
        (ForwardedIp::forwarded(trusted()), "forwarded")
    } else {
        (ForwardedIp::x_forwarded_for(trusted()), "x-forwarded-for")
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// `{prefix}, {hop}` on one line, and `{prefix}` then `{hop}` on two lines.
    #[test]
    fn the_key_is_the_hop_the_proxy_appended(
        prefix in prefix(),
        client in honest_ip(),
        port in any::<u16>(),
        forwarded in any::<bool>(),
        separate_line in any::<bool>(),
    ) {
        let (x, name) = extractor(forwarded);
        let hop = written(client, port, forwarded).into_bytes();
        let lines = if separate_line {
            vec![prefix, hop]
        } else {
            vec![[&prefix[..], b", ", &hop].concat()]
        };
        let key = x.client_ip(PEER, &headers(name, &lines));
        prop_assert_eq!(key, Ok(client), "{:?}", lines);
    }

    /// An inner trusted proxy appended its own hop after the edge proxy's: the key is still the
    /// edge proxy's hop, the first untrusted one from the right.
    #[test]
    fn trusted_hops_after_the_honest_one_are_skipped(
        prefix in prefix(),
        client in honest_ip(),
        inner in any::<u32>().prop_map(|b| Ipv4Addr::from((10 << 24) | (b >> 8))),
        port in any::<u16>(),
        forwarded in any::<bool>(),
        separate_line in any::<bool>(),
    ) {
        let (x, name) = extractor(forwarded);
        let hop = written(client, port, forwarded).into_bytes();
        let inner = written(IpAddr::V4(inner), port, forwarded).into_bytes();
        let lines = if separate_line {
            vec![prefix, hop, inner]
        } else {
            vec![[&prefix[..], b", ", &hop, b",", &inner].concat()]
        };
        let key = x.client_ip(PEER, &headers(name, &lines));
        prop_assert_eq!(key, Ok(client), "{:?}", lines);
    }

    /// Client text alone (a proxy that forwards it without appending) never panics, and is
    /// either an address the text holds, the peer (nothing but trusted hops), or a 400.
    #[test]
    fn client_text_alone_is_an_address_or_a_400(
        line in prefix(),
        forwarded in any::<bool>(),
    ) {
        let (x, name) = extractor(forwarded);
        match x.client_ip(PEER, &headers(name, std::slice::from_ref(&line))) {
            Ok(ip) => prop_assert!(ip == PEER || trusted().iter().any(|n| n.contains(ip)) || {
                let text = String::from_utf8_lossy(&line);
                text.contains(&ip.to_string()) || text.contains("::")
            }, "{:?} -> {}", line, ip),
            Err(e) => prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST),
        }
    }
}
