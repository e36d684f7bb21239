//! Attacks on the key extractors as a deployment meets them: an app listening on a dual-stack
//! socket sees an IPv4 proxy as `::ffff:a.b.c.d`, a dual-stack proxy writes IPv4 clients in
//! that form, forwarding headers with no proxy named, and hostile bytes over a real listener.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::Router;
use http::{Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;
use tower_bulwark::rate_limit::{Cidr, ForwardedIp, HeaderKey};

use crate::common::listener::orders_one_an_hour;

/// The status of `GET /orders` on `app` from `peer` with `headers`.
async fn status(app: &Router, peer: &str, headers: &[(&str, &str)]) -> StatusCode {
    let app = app.clone().layer(MockConnectInfo(SocketAddr::new(
        peer.parse().unwrap(),
        4711,
    )));
    let mut request = Request::get("/orders").body(Body::empty()).unwrap();
    for (name, value) in headers {
        request.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    app.oneshot(request).await.unwrap().status()
}

/// Asserts that `app` (one request an hour per key) admits both `clients` from `peer`, each
/// written in header `header`: two keys. `shared` says what a refusal of the second means.
async fn assert_two_keys(app: &Router, peer: &str, header: &str, clients: [&str; 2], shared: &str) {
    let [a, b] = clients;
    assert_eq!(
        status(app, peer, &[(header, a)]).await,
        200,
        "{header}: {a}"
    );
    assert_eq!(
        status(app, peer, &[(header, b)]).await,
        200,
        "{header}: {shared}"
    );
}

/// The trusted proxies' network, 10.0.0.0/8.
fn proxies() -> [Cidr; 1] {
    ["10.0.0.0/8".parse().unwrap()]
}

/// The `ForwardedIp` trusting [`proxies`] that reads `Forwarded` (with `forwarded`) or else
/// `X-Forwarded-For`, and the name of the header it reads.
fn trusting_proxies(forwarded: bool) -> (ForwardedIp, &'static str) {
    if forwarded {
        (ForwardedIp::forwarded(proxies()), "forwarded")
    } else {
        (ForwardedIp::x_forwarded_for(proxies()), "x-forwarded-for")
    }
}

/// The app listens on a dual-stack socket, so its IPv4 proxy 10.0.0.2 is seen as
/// `::ffff:10.0.0.2`. That peer is the trusted proxy; the two clients it forwards are two keys,
/// not one budget shared with the proxy.
///
/// Promises: src/rate_limit/key/forwarded.rs (`ForwardedIp` docs): "When the TCP peer is not
/// in them, the forwarding headers are ignored and the peer is the key, exactly as with
/// `PeerIp`"; src/rate_limit/key/ip.rs (`PeerIp` docs): "IPv4-mapped IPv6 addresses count as
/// IPv4"; README.md:91: "no client-written text can choose or share another client's key".
#[tokio::test]
async fn attack_a_trusted_ipv4_proxy_seen_through_a_dual_stack_socket_is_trusted() {
    for forwarded in [false, true] {
        let (extractor, header) = trusting_proxies(forwarded);
        let (a, b) = if forwarded {
            ("for=198.51.100.7", "for=203.0.113.9")
        } else {
            ("198.51.100.7", "203.0.113.9")
        };
        let app = orders_one_an_hour("one", extractor);
        // Through the plain IPv4 peer, as a control: two clients, two keys.
        assert_two_keys(&app, "10.0.0.2", header, [a, b], "the control").await;
        let app = orders_one_an_hour("one", trusting_proxies(forwarded).0);
        let shared = "a second client behind the dual-stack-seen proxy shares the first's key";
        assert_two_keys(&app, "::ffff:10.0.0.2", header, [a, b], shared).await;
    }
}

/// The same over a real dual-stack listener (`[::]`), the proxy connecting over IPv4 loopback,
/// with reqwest as the proxy. Skipped where the machine has no IPv6 socket.
#[tokio::test]
async fn attack_a_trusted_proxy_on_a_real_dual_stack_listener_is_trusted() {
    let Ok(listener) = tokio::net::TcpListener::bind("[::]:0").await else {
        eprintln!("skipped: no IPv6 socket");
        return;
    };
    let app = orders_one_an_hour(
        "one",
        ForwardedIp::x_forwarded_for(["127.0.0.0/8".parse::<Cidr>().unwrap()]),
    );
    let port = crate::common::listener::serve_on(listener, app).port();
    let client = reqwest::Client::new();
    let send = |client_ip: &'static str| {
        let client = client.clone();
        async move {
            client
                .get(format!("http://127.0.0.1:{port}/orders"))
                .header("x-forwarded-for", client_ip)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(send("198.51.100.7").await, 200);
    assert_eq!(
        send("203.0.113.9").await,
        200,
        "every client behind the proxy shares one key"
    );
    assert_eq!(send("198.51.100.7").await, 429);
}

/// A dual-stack proxy writes its IPv4 clients as `::ffff:a.b.c.d`. Two such clients are two
/// keys: an IPv6 prefix of /64 over the mapped form would put every IPv4 client on the
/// Internet in the one network `::/64`.
///
/// Promises: README.md:87: "`ForwardedIp` (the client address your trusted proxies appended
/// ...)" and README.md:91: "no client-written text can choose or share another client's key";
/// `PeerIp` docs: "IPv4-mapped IPv6 addresses count as IPv4".
#[tokio::test]
async fn attack_mapped_client_addresses_written_by_a_proxy_are_distinct_keys() {
    for forwarded in [false, true] {
        let (extractor, header) = trusting_proxies(forwarded);
        let (a, b) = if forwarded {
            (
                r#"for="[::ffff:198.51.100.7]""#,
                r#"for="[::ffff:203.0.113.9]""#,
            )
        } else {
            ("::ffff:198.51.100.7", "::ffff:203.0.113.9")
        };
        let app = orders_one_an_hour("one", extractor);
        let shared = "two IPv4 clients written in mapped form share one key";
        assert_two_keys(&app, "10.0.0.2", header, [a, b], shared).await;
    }
}

/// An inner proxy of the trusted network, written by the outer (dual-stack) proxy as
/// `::ffff:10.0.0.3`, is still a trusted hop: the client is the address left of it, and two
/// clients are two keys, never the inner proxy's one budget.
///
/// Promise: `ForwardedIp` docs: "the chain in the header is read from right to left ... and the
/// first address that is not a trusted proxy is the client"; README.md:91 as above.
#[tokio::test]
async fn attack_a_trusted_hop_written_in_mapped_form_is_skipped() {
    let app = orders_one_an_hour("one", ForwardedIp::x_forwarded_for(proxies()));
    let a = "198.51.100.7, ::ffff:10.0.0.3";
    let b = "203.0.113.9, ::ffff:10.0.0.3";
    let shared = "two clients behind a mapped trusted hop share the hop's key";
    assert_two_keys(&app, "10.0.0.2", "x-forwarded-for", [a, b], shared).await;
}

/// With no proxy named, forwarding headers are never believed: whatever a client writes, its
/// key is its peer address, so it can neither pick a fresh budget nor spend another's.
///
/// Promise: `ForwardedIp` docs: "When the TCP peer is not in them, the forwarding headers are
/// ignored and the peer is the key, exactly as with `PeerIp`: anyone can write
/// `X-Forwarded-For`".
#[tokio::test]
async fn attack_forwarding_headers_are_ignored_unless_proxies_are_named() {
    for extractor in [ForwardedIp::x_forwarded_for([]), ForwardedIp::forwarded([])] {
        let app = orders_one_an_hour("one", extractor);
        assert_eq!(
            status(&app, "192.0.2.10", &[("x-forwarded-for", "198.51.100.1")]).await,
            200
        );
        for (name, value) in [
            ("x-forwarded-for", "198.51.100.2"),
            ("forwarded", "for=198.51.100.3"),
            ("X-Forwarded-For", "192.0.2.11"),
            ("x-real-ip", "198.51.100.4"),
        ] {
            assert_eq!(
                status(&app, "192.0.2.10", &[(name, value)]).await,
                429,
                "{name}: {value}"
            );
        }
        // The victim's budget is untouched by what the attacker wrote.
        assert_eq!(status(&app, "192.0.2.11", &[]).await, 200);
    }
    // From a file: `forwarded_ip` without `trusted_proxies` is refused, naming the field.
    #[cfg(feature = "config")]
    {
        let text = "[rate_limiters.api]\nlimit_for_period = 1\nlimit_refresh_period = \"1h\"\nkey = \"forwarded_ip\"\n";
        let err = tower_bulwark::config::Registry::from_toml_str(text).unwrap_err();
        assert!(err.path().contains("trusted_proxies"), "{err}");
    }
}

/// Hostile requests over a real listener (raw bytes, so nothing is cleaned up on the way): a
/// forwarding header or API key of 10 KB, bytes that are not UTF-8, thousands of hops, a
/// header sent twice. Each gets its documented answer (a key, or a `400` problem that parses
/// as JSON), never a panic nor a dropped connection.
///
/// Promises: `ForwardedIp` docs ("A hop that is not an address ... reached before the client's
/// address ... gets `KeyError::bad_request`, a 400"); `HeaderKey` docs ("with the header more
/// than once ... So does a value longer than `max_len` bytes"); README.md:90: "A request
/// without its key gets a `400` or `500` problem".
#[tokio::test]
async fn attack_hostile_key_bytes_over_a_real_listener_get_their_documented_answer() {
    let xff = orders_one_an_hour(
        "one",
        ForwardedIp::x_forwarded_for(["127.0.0.0/8".parse::<Cidr>().unwrap()]),
    );
    let keyed = orders_one_an_hour("one", HeaderKey::new("x-api-key").unwrap());
    let xff = crate::common::listener::serve(xff).await;
    let keyed = crate::common::listener::serve(keyed).await;
    let trusted_hops = "127.0.0.5,".repeat(2000);
    let many_hops = format!("198.51.100.9,{}", "127.0.0.1,".repeat(1000));
    let cases: Vec<(SocketAddr, Vec<u8>, u16)> = vec![
        (
            xff,
            format!("x-forwarded-for: {}", "9".repeat(10_000)).into_bytes(),
            400,
        ),
        (xff, b"x-forwarded-for: 198.51.100.7\xff".to_vec(), 400),
        (
            xff,
            b"x-forwarded-for: \xff\xfe, 198.51.100.8".to_vec(),
            200,
        ),
        (
            xff,
            format!("x-forwarded-for: {trusted_hops}").into_bytes(),
            200,
        ),
        (
            xff,
            format!("x-forwarded-for: {many_hops}").into_bytes(),
            200,
        ),
        (xff, b"forwarded: for=\"\\\xff\"".to_vec(), 200),
        (
            keyed,
            format!("x-api-key: {}", "k".repeat(10_000)).into_bytes(),
            400,
        ),
        (keyed, b"x-api-key: a\r\nX-Api-Key: b".to_vec(), 400),
        (keyed, b"x-api-key: \xff\xfe\x80".to_vec(), 200),
        (keyed, b"x-api-key:".to_vec(), 400),
    ];
    for (addr, header, expected) in cases {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut request = b"GET /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\n".to_vec();
        request.extend_from_slice(&header);
        request.extend_from_slice(b"\r\n\r\n");
        stream.write_all(&request).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let text = String::from_utf8_lossy(&answer);
        let shown = String::from_utf8_lossy(&header[..header.len().min(60)]).into_owned();
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{shown}: no answer: {text}"));
        assert_eq!(status, expected, "{shown}: {text}");
        if status == 400 {
            let body = &answer[text.find("\r\n\r\n").unwrap() + 4..];
            let parsed: serde_json::Value = serde_json::from_slice(body)
                .unwrap_or_else(|e| panic!("{shown}: the 400 is not JSON ({e}): {text}"));
            assert_eq!(parsed["status"], 400, "{shown}");
        }
    }
}

/// A `Forwarded` element's `for` quoted, unquoted, in upper case, with a port or with other
/// parameters: one client, one key; so a client cannot move to a fresh budget by how its proxy
/// happens to quote it, and a second client is another key.
#[tokio::test]
async fn attack_one_client_written_many_ways_is_one_key() {
    let app = orders_one_an_hour("one", ForwardedIp::forwarded(proxies()));
    let forms = [
        "for=198.51.100.7",
        r#"for="198.51.100.7""#,
        r#"FOR="198.51.100.7:4711""#,
        "for=198.51.100.7;proto=https",
        r#"proto=http;for="198.51.100.7";by=10.0.0.2"#,
    ];
    assert_eq!(
        status(&app, "10.0.0.2", &[("forwarded", forms[0])]).await,
        200
    );
    for form in &forms[1..] {
        assert_eq!(
            status(&app, "10.0.0.2", &[("forwarded", form)]).await,
            429,
            "{form}"
        );
    }
    let other = r#"for="198.51.100.8""#;
    assert_eq!(status(&app, "10.0.0.2", &[("forwarded", other)]).await, 200);
}
