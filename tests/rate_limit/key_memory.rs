//! What a key costs in memory once it has arrived over a real connection: a key owns compact
//! bytes and never pins the connection's read buffer.
//!
//! This binary counts the heap bytes that each thread allocates and frees with its own global
//! allocator; every measurement runs on one thread (a current-thread runtime serves and
//! requests), so tests running side by side do not disturb each other. No timings are asserted.

use crate::counting;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use tower::ServiceExt;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{HeaderKey, KeyExtractor, PeerIp, Policy, RateLimitLayer};
use tower_bulwark::{KeyedRateLimiter, Quota};

fn api_key() -> HeaderName {
    HeaderName::from_static("x-api-key")
}

/// A header value that, like one hyper parsed, is a slice of a much larger buffer.
fn slice_of_a_big_buffer(text: &[u8]) -> HeaderValue {
    let mut buffer = vec![b' '; 16 * 1024];
    buffer[100..100 + text.len()].copy_from_slice(text);
    let buffer = Bytes::from(buffer);
    HeaderValue::from_maybe_shared(buffer.slice(100..100 + text.len())).unwrap()
}

#[test]
fn a_header_key_owns_its_bytes_instead_of_the_request_buffer() {
    let before = counting::live_bytes();
    let key = {
        let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        parts
            .headers
            .insert(api_key(), slice_of_a_big_buffer(b"key-0001"));
        HeaderKey::new(api_key())
            .unwrap()
            .extract(&RequestHead::from(&parts))
            .unwrap()
    };
    let kept = counting::live_bytes() - before;
    assert_eq!(key, "key-0001");
    assert!(kept < 256, "one key keeps {kept} bytes alive");
}

#[test]
fn header_values_longer_than_the_limit_are_refused_with_the_limit_named() {
    let extract = |x: &HeaderKey, len: usize| {
        let (parts, ()) = Request::get("/")
            .header(api_key(), "k".repeat(len))
            .body(())
            .unwrap()
            .into_parts();
        x.extract(&RequestHead::from(&parts))
    };
    let default = HeaderKey::new(api_key()).unwrap();
    assert_eq!(HeaderKey::DEFAULT_MAX_LEN, 256);
    assert_eq!(extract(&default, 256).unwrap().len(), 256);
    let err = extract(&default, 257).unwrap_err();
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    assert!(err.reason().contains("x-api-key"), "{err}");
    assert!(err.reason().contains("256 bytes"), "{err}");
    let short = HeaderKey::new(api_key()).unwrap().max_len(8);
    assert!(extract(&short, 8).is_ok());
    assert!(extract(&short, 9).unwrap_err().reason().contains("8 bytes"));
}

#[cfg(feature = "config")]
#[tokio::test(flavor = "current_thread")]
async fn a_configured_header_key_owns_its_bytes_too() {
    let registry = tower_bulwark::config::Registry::from_toml_str(
        "[rate_limiters.api]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n\
         key = \"header:x-api-key\"\n",
    )
    .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(registry.rate_limit_layer("api").unwrap());
    let send = |value: HeaderValue| {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        request.headers_mut().insert(api_key(), value);
        app.clone().oneshot(request)
    };
    // A first key makes the tables; the second is the one measured.
    let first = send(HeaderValue::from_static("key-0000")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    drop(first);
    let before = counting::live_bytes();
    let second = send(slice_of_a_big_buffer(b"key-0001")).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    drop(second);
    let kept = counting::live_bytes() - before;
    assert_eq!(registry.rate_limiter("api").unwrap().snapshot().allowed, 2);
    assert!(kept < 1024, "one configured key keeps {kept} bytes alive");
    let long = send(HeaderValue::from_str(&"k".repeat(257)).unwrap())
        .await
        .unwrap();
    assert_eq!(long.status(), StatusCode::BAD_REQUEST);
}

// ---------------------------------------------------------------------------------------------
// Bytes per key through a real listener, against the same keys made in process.

#[derive(Clone, Copy, Debug)]
enum Keys {
    /// `PeerIp`: each key is a distinct source address 127.a.b.c.
    Peer,
    /// `HeaderKey("x-api-key")`: each key is a distinct `x-api-key` value.
    Header,
}

/// The source address of key `i`: distinct, inside 127.0.0.0/8, never .0 or .255.
fn source(i: usize) -> Ipv4Addr {
    let a = 1 + i / (254 * 256);
    Ipv4Addr::new(127, a as u8, (i / 254 % 256) as u8, (1 + i % 254) as u8)
}

fn api_key_value(i: usize) -> String {
    format!("key-{i:08}")
}

fn app(keys: Keys) -> Router {
    let quota = Quota::per_second(10).unwrap();
    let router = Router::new().route("/", get(|| async { "ok" }));
    match keys {
        Keys::Peer => router.route_layer(RateLimitLayer::new(
            Policy::new(
                "per-ip",
                PeerIp::new(),
                KeyedRateLimiter::<IpAddr>::builder(quota).build(),
            )
            .unwrap(),
        )),
        Keys::Header => router.route_layer(RateLimitLayer::new(
            Policy::new(
                "per-key",
                HeaderKey::new(api_key()).unwrap(),
                KeyedRateLimiter::<HeaderValue>::builder(quota).build(),
            )
            .unwrap(),
        )),
    }
}

/// Bytes per key for keys `0..n` made by requests built in process.
async fn in_process(keys: Keys, n: usize) -> f64 {
    let app = app(keys);
    let request = |i: usize| {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        let addr = SocketAddr::new(IpAddr::V4(source(i)), 40_000);
        request.extensions_mut().insert(ConnectInfo(addr));
        if let Keys::Header = keys {
            let value = HeaderValue::from_str(&api_key_value(i)).unwrap();
            request.headers_mut().insert(api_key(), value);
        }
        request
    };
    let status = |i| app.clone().oneshot(request(i));
    assert_eq!(status(n).await.unwrap().status(), StatusCode::OK); // warm-up
    let before = counting::live_bytes();
    for i in 0..n {
        assert_eq!(status(i).await.unwrap().status(), StatusCode::OK);
    }
    (counting::live_bytes() - before) as f64 / n as f64
}

/// Bytes per key for keys `0..n`, each made by one request on a connection of its own to a real
/// axum server on 127.0.0.1. Server and client share one thread, so each connection's task has
/// ended, and freed its buffers, before the client reads the end of the response.
async fn over_tcp(keys: Keys, n: usize) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    let app = app(keys);
    let serving = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let mut response = Vec::with_capacity(1024);
    one_request(server, keys, n, &mut response).await; // warm-up
    let before = counting::live_bytes();
    for i in 0..n {
        one_request(server, keys, i, &mut response).await;
    }
    let per_key = (counting::live_bytes() - before) as f64 / n as f64;
    serving.abort();
    per_key
}

/// Sends the request of key `i` on a connection of its own, from its own source address.
async fn one_request(server: SocketAddr, keys: Keys, i: usize, response: &mut Vec<u8>) {
    let head = match keys {
        Keys::Peer => String::new(),
        Keys::Header => format!("x-api-key: {}\r\n", api_key_value(i)),
    };
    let request = format!("GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n{head}\r\n");
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source(i).into(), 0)).unwrap();
    let mut stream = socket.connect(server).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    response.clear();
    stream.read_to_end(response).await.unwrap();
    assert!(
        response.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(response)
    );
}

/// Keys made over TCP cost at most twice what the same keys cost when made in process (before
/// keys owned their bytes, a `HeaderKey` key kept the connection's 16 KB read buffer alive).
#[tokio::test(flavor = "current_thread")]
async fn keys_made_over_tcp_cost_about_what_they_cost_in_process() {
    const KEYS: usize = 5_000;
    for keys in [Keys::Peer, Keys::Header] {
        let local = in_process(keys, KEYS).await;
        let tcp = over_tcp(keys, KEYS).await;
        println!(
            "{keys:?}: {local:.1} bytes/key in process, {tcp:.1} over TCP ({:.2}x)",
            tcp / local
        );
        assert!(local > 0.0, "{keys:?}: {local}");
        assert!(
            tcp <= 2.0 * local,
            "{keys:?}: {tcp:.1} bytes/key over TCP against {local:.1} in process"
        );
    }
}
