//! Memory per key of the keyed limiters, measured with a counting allocator.
//!
//! ```sh
//! cargo bench --bench memory                 # both parts
//! cargo bench --bench memory -- in-process   # only the first
//! cargo bench --bench memory -- listener     # only the second
//! ```
//!
//! In process: inserts 1 000 000 distinct IPv4 keys into a keyed limiter and divides the bytes
//! still allocated by the number of keys; the same for governor's keyed limiter, and for our
//! limiter keyed by `IpAddr` (the HTTP layer's key), in the same run.
//!
//! Through a real listener (feature `axum`): 100 000 keys, each made by one request on a TCP
//! connection of its own to an axum server on 127.0.0.1, against the same keys made by requests
//! built in process, for `PeerIp` keys (each connection from its own source address 127.a.b.c)
//! and `HeaderKey` keys (`x-api-key`). Client and server share one thread, so every
//! connection's task has ended, and freed its buffers, before the next connection opens.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};

use tower_bulwark::{KeyedRateLimiter, Quota};

/// Counts live heap bytes, delegating the allocation itself to the system allocator.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to `System` with the caller's own arguments, so `System`'s
// guarantees hold unchanged; the only addition is an atomic counter update.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout as given to us.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u32 = 1_000_000;

fn measure<T>(name: &str, build: impl FnOnce() -> T) -> f64 {
    let before = LIVE.load(Ordering::Relaxed);
    let value = build();
    let after = LIVE.load(Ordering::Relaxed);
    let per_key = (after - before) as f64 / f64::from(KEYS);
    println!("{name:<32} {per_key:>7.1} bytes/key");
    drop(value);
    per_key
}

fn ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(i.wrapping_mul(2_654_435_761))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing we need. A bare
    // argument chooses one part.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |part: &str| only.is_empty() || only.iter().any(|a| a == part);
    if wants("in-process") {
        in_process();
    }
    #[cfg(feature = "axum")]
    if wants("listener") {
        listener::run();
    }
}

fn in_process() {
    let quota = Quota::per_second(10).unwrap();
    let ours_v4 = measure("bulwark KeyedRateLimiter<Ipv4Addr>", || {
        let l = KeyedRateLimiter::<Ipv4Addr>::builder(quota)
            .max_keys(2_000_000)
            .build();
        for i in 0..KEYS {
            l.check(&ip(i));
        }
        assert_eq!(l.len(), KEYS as usize);
        l
    });
    let ours_ip = measure("bulwark KeyedRateLimiter<IpAddr>", || {
        let l = KeyedRateLimiter::<IpAddr>::builder(quota)
            .max_keys(2_000_000)
            .build();
        for i in 0..KEYS {
            l.check(&IpAddr::V4(ip(i)));
        }
        l
    });
    let gov = measure("governor keyed (dashmap) <Ipv4Addr>", || {
        let l =
            governor::RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::new(10).unwrap()));
        for i in 0..KEYS {
            let _ = l.check_key(&ip(i));
        }
        l
    });
    println!(
        "ratio governor/bulwark (Ipv4Addr): {:.2}x; IpAddr keys cost {:.1} bytes more per key",
        gov / ours_v4,
        ours_ip - ours_v4
    );
}

#[cfg(feature = "axum")]
mod listener {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::routing::get;
    use axum::Router;
    use http::{HeaderName, HeaderValue, Request, StatusCode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpSocket};
    use tower::ServiceExt;
    use tower_bulwark::rate_limit::{HeaderKey, PeerIp, Policy, RateLimitLayer};
    use tower_bulwark::{KeyedRateLimiter, Quota};

    use super::LIVE;

    const KEYS: usize = 100_000;

    #[derive(Clone, Copy, Debug)]
    enum Keys {
        PeerIp,
        HeaderKey,
    }

    fn live() -> isize {
        LIVE.load(Ordering::Relaxed)
    }

    /// The source address of key `i`: distinct, inside 127.0.0.0/8, never .0 or .255.
    fn source(i: usize) -> Ipv4Addr {
        let a = 1 + i / (254 * 256);
        Ipv4Addr::new(127, a as u8, (i / 254 % 256) as u8, (1 + i % 254) as u8)
    }

    fn api_key() -> HeaderName {
        HeaderName::from_static("x-api-key")
    }

    fn api_key_value(i: usize) -> String {
        format!("key-{i:08}")
    }

    fn app(keys: Keys) -> Router {
        let quota = Quota::per_second(10).unwrap();
        let router = Router::new().route("/", get(|| async { "ok" }));
        match keys {
            Keys::PeerIp => router.route_layer(RateLimitLayer::new(
                Policy::new(
                    "per-ip",
                    PeerIp::new(),
                    KeyedRateLimiter::<IpAddr>::builder(quota).build(),
                )
                .unwrap(),
            )),
            Keys::HeaderKey => router.route_layer(RateLimitLayer::new(
                Policy::new(
                    "per-key",
                    HeaderKey::new(api_key()).unwrap(),
                    KeyedRateLimiter::<HeaderValue>::builder(quota).build(),
                )
                .unwrap(),
            )),
        }
    }

    async fn in_process(keys: Keys) -> f64 {
        let app = app(keys);
        let request = |i: usize| {
            let mut request = Request::get("/").body(Body::empty()).unwrap();
            let addr = SocketAddr::new(IpAddr::V4(source(i)), 40_000);
            request.extensions_mut().insert(ConnectInfo(addr));
            if let Keys::HeaderKey = keys {
                let value = HeaderValue::from_str(&api_key_value(i)).unwrap();
                request.headers_mut().insert(api_key(), value);
            }
            request
        };
        let send = |i| app.clone().oneshot(request(i));
        assert_eq!(send(KEYS).await.unwrap().status(), StatusCode::OK); // warm-up
        let before = live();
        for i in 0..KEYS {
            assert_eq!(send(i).await.unwrap().status(), StatusCode::OK);
        }
        (live() - before) as f64 / KEYS as f64
    }

    async fn one_request(server: SocketAddr, keys: Keys, i: usize, response: &mut Vec<u8>) {
        let head = match keys {
            Keys::PeerIp => String::new(),
            Keys::HeaderKey => format!("x-api-key: {}\r\n", api_key_value(i)),
        };
        let request =
            format!("GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n{head}\r\n");
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(source(i).into(), 0)).unwrap();
        let mut stream = socket.connect(server).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        response.clear();
        stream.read_to_end(response).await.unwrap();
        assert!(response.starts_with(b"HTTP/1.1 200"));
    }

    async fn over_tcp(keys: Keys) -> f64 {
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
        one_request(server, keys, KEYS, &mut response).await; // warm-up
        let before = live();
        for i in 0..KEYS {
            one_request(server, keys, i, &mut response).await;
        }
        let per_key = (live() - before) as f64 / KEYS as f64;
        serving.abort();
        per_key
    }

    pub(super) fn run() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        println!("{KEYS} keys, one request per key:");
        for keys in [Keys::PeerIp, Keys::HeaderKey] {
            let started = Instant::now();
            let local = runtime.block_on(in_process(keys));
            let tcp = runtime.block_on(over_tcp(keys));
            println!(
                "{:<10} {local:>7.1} bytes/key in process, {tcp:>7.1} over TCP: {:.2}x ({:.1} s)",
                format!("{keys:?}"),
                tcp / local,
                started.elapsed().as_secs_f64()
            );
        }
    }
}
