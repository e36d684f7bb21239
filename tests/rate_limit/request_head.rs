//! `RequestHead` attacked through a real axum server on 127.0.0.1 and a raw TCP client (so
//! that the request is exactly what the test wrote: repeated headers, chunked bodies sent piece
//! by piece): the key extractor, the cost function and the exemption see exactly the request the
//! handler gets, the handler gets the body unchanged on the admitted and on the waiting path,
//! and a closure that panics keeps no permit.

use crate::common::{in_bursts_of, listener, waits_up_to};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{to_bytes, Body};
use axum::extract::MatchedPath;
use axum::routing::any;
use axum::Router;
use http::{Request, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::util::MapRequestLayer;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{GlobalKey, KeyError, Policy, RateLimitLayer};
use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Quota};

/// Set by a layer before the rate limit.
#[derive(Clone, Debug, PartialEq)]
struct Tag(String);

/// What a closure or the handler saw of a request.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    method: String,
    uri: String,
    version: Version,
    headers: Vec<(String, Vec<u8>)>,
    tag: Option<Tag>,
    matched: Option<String>,
}

impl Seen {
    fn of(
        method: &http::Method,
        uri: &http::Uri,
        version: Version,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Self {
        Self {
            method: method.to_string(),
            uri: uri.to_string(),
            version,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            tag: extensions.get::<Tag>().cloned(),
            matched: extensions
                .get::<MatchedPath>()
                .map(|m| m.as_str().to_owned()),
        }
    }

    fn head(head: &RequestHead<'_>) -> Self {
        Self::of(
            head.method,
            head.uri,
            head.version,
            head.headers,
            head.extensions,
        )
    }
}

#[derive(Default)]
struct Log {
    key: Mutex<Vec<Seen>>,
    cost: Mutex<Vec<Seen>>,
    exempt: Mutex<Vec<Seen>>,
    handler: Mutex<Vec<(Seen, Vec<u8>)>>,
}

/// An app whose route `/items/{id}` is limited by `layer` (a `route_layer`, so that
/// `MatchedPath` is there), behind a layer that tags every request.
fn app(layer: RateLimitLayer<impl tower_bulwark::rate_limit::PolicySet>, log: &Arc<Log>) -> Router {
    let handler_log = log.clone();
    Router::new()
        .route(
            "/items/{id}",
            any(move |request: Request<Body>| {
                let log = handler_log.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let seen = Seen::of(
                        &parts.method,
                        &parts.uri,
                        parts.version,
                        &parts.headers,
                        &parts.extensions,
                    );
                    let body = to_bytes(body, usize::MAX).await.unwrap().to_vec();
                    let len = body.len();
                    log.handler.lock().unwrap().push((seen, body));
                    format!("got {len}")
                }
            }),
        )
        .route_layer(layer)
        .layer(MapRequestLayer::new(|mut request: Request<Body>| {
            request.extensions_mut().insert(Tag("tagged".to_owned()));
            request
        }))
}

/// A policy keyed by the `x-client` header, recording what its key extractor and cost function
/// see, and a layer whose exemption records too.
fn recording_layer(
    quota: Quota,
    log: &Arc<Log>,
) -> RateLimitLayer<
    Policy<impl tower_bulwark::rate_limit::KeyExtractor<Key = String>, KeyedRateLimiter<String>>,
> {
    let (k, c, e) = (log.clone(), log.clone(), log.clone());
    let policy = Policy::new(
        "per-client",
        move |head: &RequestHead<'_>| -> Result<String, KeyError> {
            k.key.lock().unwrap().push(Seen::head(head));
            Ok(head
                .headers
                .get("x-client")
                .map_or("none", |v| v.to_str().unwrap())
                .to_owned())
        },
        KeyedRateLimiter::new(quota),
    )
    .unwrap()
    .cost_by(move |head| {
        c.cost.lock().unwrap().push(Seen::head(head));
        1
    });
    RateLimitLayer::new(policy).exempt(move |head: &RequestHead<'_>| {
        e.exempt.lock().unwrap().push(Seen::head(head));
        false
    })
}

/// Writes `pieces` to a new connection to `addr`, pausing `pause` before each but the first,
/// and reads the whole response (the request says `connection: close`). `None` when the
/// connection ends without a response.
async fn exchange(addr: SocketAddr, pieces: &[Vec<u8>], pause: Duration) -> Option<String> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(pause).await;
        }
        if stream.write_all(piece).await.is_err() {
            return None;
        }
    }
    let mut response = Vec::new();
    match stream.read_to_end(&mut response).await {
        Ok(_) if !response.is_empty() => Some(String::from_utf8_lossy(&response).into_owned()),
        _ => None,
    }
}

fn status(response: &str) -> u16 {
    response[9..12].parse().unwrap()
}

fn head_bytes(method: &str, target: &str, client: &str, extra: &str) -> Vec<u8> {
    format!(
        "{method} {target} HTTP/1.1\r\nhost: example.test\r\nx-client: {client}\r\n\
         x-multi: one\r\nX-Multi: two\r\nx-empty: \r\nx-multi: three\r\n\
         x-opaque: \t caf\u{e9} \r\n{extra}connection: close\r\n\r\n"
    )
    .into_bytes()
}

/// A body of `len` bytes that is not periodic in any short period.
fn body(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `data` sent as chunked transfer coding, one chunk per piece of `chunk` bytes.
fn chunked(head: Vec<u8>, data: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    let mut pieces = vec![head];
    for part in data.chunks(chunk) {
        let mut piece = format!("{:x}\r\n", part.len()).into_bytes();
        piece.extend_from_slice(part);
        piece.extend_from_slice(b"\r\n");
        pieces.push(piece);
    }
    pieces.push(b"0\r\n\r\n".to_vec());
    pieces
}

/// Every closure saw exactly what the handler got, for each request in order; returns the
/// handler's bodies.
fn assert_closures_saw_the_handlers_requests(log: &Log, requests: usize) -> Vec<Vec<u8>> {
    let handler = log.handler.lock().unwrap().clone();
    assert_eq!(handler.len(), requests, "requests the handler got");
    for (name, seen) in [
        ("key", &log.key),
        ("cost", &log.cost),
        ("exempt", &log.exempt),
    ] {
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), requests, "{name} calls");
        for (i, (closure, (handler, _))) in seen.iter().zip(&handler).enumerate() {
            assert_eq!(
                closure, handler,
                "request {i}: the {name} closure saw another request"
            );
        }
    }
    for (seen, _) in &handler {
        assert_eq!(
            seen.tag,
            Some(Tag("tagged".to_owned())),
            "the earlier layer's extension"
        );
        assert_eq!(seen.matched.as_deref(), Some("/items/{id}"), "MatchedPath");
        let multi: Vec<_> = seen
            .headers
            .iter()
            .filter(|(n, _)| n == "x-multi")
            .map(|(_, v)| v.clone())
            .collect();
        assert_eq!(multi, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
    }
    handler.into_iter().map(|(_, body)| body).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closures_see_exactly_the_request_the_handler_gets_with_its_body_on_the_admitted_path() {
    let log = Arc::new(Log::default());
    let addr = listener::serve(app(
        recording_layer(Quota::per_minute(100).unwrap(), &log),
        &log,
    ))
    .await;
    let small = body(5, 1);
    let large = body(8 << 20, 2);
    let streamed = body(300_000, 3);
    let mut sent = Vec::new();
    for (method, target, data, chunk) in [
        ("GET", "/items/42?x=1&y=%20z&x=2", Vec::new(), 0),
        ("POST", "/items/%E2%9C%93?q", small.clone(), 0),
        ("PUT", "/items/big", large.clone(), 0),
        (
            "PATCH",
            "/items/streamed?chunked=yes",
            streamed.clone(),
            7_919,
        ),
    ] {
        let response = if chunk == 0 {
            let mut request = head_bytes(
                method,
                target,
                "alice",
                &format!("content-length: {}\r\n", data.len()),
            );
            request.extend_from_slice(&data);
            exchange(addr, &[request], Duration::ZERO).await
        } else {
            let head = head_bytes(method, target, "alice", "transfer-encoding: chunked\r\n");
            exchange(addr, &chunked(head, &data, chunk), Duration::from_millis(1)).await
        }
        .expect("a response");
        assert_eq!(status(&response), 200, "{method} {target}: {response:.200}");
        sent.push((method, target, data));
    }
    let bodies = assert_closures_saw_the_handlers_requests(&log, sent.len());
    let handler = log.handler.lock().unwrap().clone();
    for ((method, target, data), (body, (seen, _))) in sent.iter().zip(bodies.iter().zip(&handler))
    {
        assert_eq!(&seen.method, method);
        assert_eq!(&seen.uri, target, "the URI with its query, as sent");
        assert!(
            body == data,
            "{method} {target}: body of {} bytes, sent {}",
            body.len(),
            data.len()
        );
    }
}

/// A policy whose quota has a `max_wait` makes the second and third requests wait (half a
/// second each); their bodies, a large one and one streamed while the request waits, reach the
/// handler unchanged, and the closures saw what the handler got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closures_see_the_request_and_the_body_is_unchanged_when_the_request_waits() {
    let log = Arc::new(Log::default());
    let quota = waits_up_to(
        in_bursts_of(Quota::per_second(2).unwrap(), 1),
        Duration::from_secs(5),
    );
    let addr = listener::serve(app(recording_layer(quota, &log), &log)).await;
    let first = body(10, 4);
    let large = body(4 << 20, 5);
    let streamed = body(200_000, 6);

    let mut request = head_bytes("POST", "/items/1?a=b", "bob", "content-length: 10\r\n");
    request.extend_from_slice(&first);
    let response = exchange(addr, &[request], Duration::ZERO).await.unwrap();
    assert_eq!(status(&response), 200);

    // Sent together: both wait for their reservations.
    let mut large_request = head_bytes(
        "POST",
        "/items/2?large",
        "bob",
        &format!("content-length: {}\r\n", large.len()),
    );
    large_request.extend_from_slice(&large);
    let stream_head = head_bytes(
        "POST",
        "/items/3?streamed",
        "bob",
        "transfer-encoding: chunked\r\n",
    );
    let stream_pieces = chunked(stream_head, &streamed, 20_000);
    let large_pieces = [large_request];
    let started = Instant::now();
    let (a, b) = tokio::join!(exchange(addr, &large_pieces, Duration::ZERO), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Ten pieces 100 ms apart: the body is still arriving while the request waits.
        exchange(addr, &stream_pieces, Duration::from_millis(100)).await
    });
    let waited = started.elapsed();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(status(&a), 200, "{a:.200}");
    assert_eq!(status(&b), 200, "{b:.200}");
    assert!(
        waited >= Duration::from_millis(900),
        "the second reservation falls due a second after the first request; answered after {waited:?}"
    );
    let bodies = assert_closures_saw_the_handlers_requests(&log, 3);
    let mut got: Vec<_> = bodies.iter().map(Vec::len).collect();
    got.sort_unstable();
    assert_eq!(got, [10, streamed.len(), large.len()]);
    assert!(bodies.contains(&first) && bodies.contains(&large) && bodies.contains(&streamed));
}

/// Which closure of the second policy panics on a request with `x-boom`.
#[derive(Clone, Copy, Debug)]
enum Boom {
    Key,
    Cost,
    Exempt,
}

/// A global policy of `quota` and a keyed one whose closure `boom` panics on `x-boom`.
fn panicking_app(quota: Quota, boom: Boom) -> Router {
    let second = Policy::new(
        "per-client",
        move |head: &RequestHead<'_>| -> Result<String, KeyError> {
            if matches!(boom, Boom::Key) && head.headers.contains_key("x-boom") {
                panic!("key extractor panics");
            }
            Ok("k".to_owned())
        },
        KeyedRateLimiter::<String>::new(Quota::per_day(1_000).unwrap()),
    )
    .unwrap()
    .cost_by(move |head| {
        if matches!(boom, Boom::Cost) && head.headers.contains_key("x-boom") {
            panic!("cost function panics");
        }
        1
    });
    let first = Policy::new("all", GlobalKey, DirectRateLimiter::new(quota)).unwrap();
    let layer = RateLimitLayer::new(first.and(second)).exempt(move |head: &RequestHead<'_>| {
        if matches!(boom, Boom::Exempt) && head.headers.contains_key("x-boom") {
            panic!("exemption panics");
        }
        false
    });
    Router::new()
        .route("/items/{id}", any(|| async { "ok" }))
        .route_layer(layer)
}

async fn plain(addr: SocketAddr) -> u16 {
    let request = head_bytes("GET", "/items/1", "carol", "");
    status(
        &exchange(addr, &[request], Duration::ZERO)
            .await
            .expect("a response"),
    )
}

async fn boom(addr: SocketAddr) {
    let request = head_bytes("GET", "/items/1", "carol", "x-boom: 1\r\n");
    let response = exchange(addr, &[request], Duration::ZERO).await;
    // The panic unwinds through the connection's task: no response at all.
    assert!(
        response.is_none(),
        "the closure did not panic: {response:?}"
    );
}

/// Five requests whose closure panics, then the quota of three: all three admitted, the
/// fourth refused. A panic keeps no permit of the global policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_closure_keeps_no_permit_through_a_real_server() {
    for which in [Boom::Key, Boom::Cost, Boom::Exempt] {
        let addr = listener::serve(panicking_app(Quota::per_day(3).unwrap(), which)).await;
        for _ in 0..5 {
            boom(addr).await;
        }
        for i in 0..3 {
            assert_eq!(
                plain(addr).await,
                200,
                "{which:?}: request {i} after the panics"
            );
        }
        assert_eq!(plain(addr).await, 429, "{which:?}: the quota holds");
    }
}

/// The same on the waiting path: the global policy makes requests wait (one per second, burst
/// one); three panicking requests would each have reserved a second. After them, a plain request
/// waits about one second, not four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_closure_keeps_no_reservation_of_a_waiting_policy() {
    for which in [Boom::Key, Boom::Cost] {
        let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(10));
        let addr = listener::serve(panicking_app(quota, which)).await;
        assert_eq!(plain(addr).await, 200);
        for _ in 0..3 {
            boom(addr).await;
        }
        let started = Instant::now();
        assert_eq!(plain(addr).await, 200);
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_millis(1_800),
            "{which:?}: waited {waited:?}: the panicking requests kept their reservations"
        );
    }
}
