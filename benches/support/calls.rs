//! Calls through a tower service, for the benchmarks of services (`bulkhead.rs`,
//! `resilience.rs`): from several threads at once, and over loopback with `reqwest`.

use std::hint::black_box;
use std::sync::Barrier;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use tower::Service;

/// Runs `iters` calls (`call` with the call's index) on each of `threads` threads, each on a
/// clone of `service` (one limit, budget or breaker for all), inside `runtime`; returns the
/// slowest thread's time, so the figure is the time per call while the others call too.
pub fn on_threads<S: Clone + Send>(
    runtime: &tokio::runtime::Handle,
    service: &S,
    threads: usize,
    iters: u64,
    call: impl Fn(&mut S, &mut Context<'_>, u64) + Sync,
) -> Duration {
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (mut service, barrier, call) = (service.clone(), &barrier, &call);
                scope.spawn(move || {
                    let _runtime = runtime.enter();
                    let mut cx = Context::from_waker(Waker::noop());
                    barrier.wait();
                    let start = Instant::now();
                    for n in 0..iters {
                        call(&mut service, &mut cx, n);
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .max()
            .unwrap()
    })
}

/// Serves `GET /` with a short body on a loopback port of `runtime`; returns its URL.
pub fn loopback_server(runtime: &tokio::runtime::Runtime) -> String {
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    runtime.spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// One `GET` through `service`, body read to its end.
pub async fn get<S>(service: &mut S, client: &reqwest::Client, url: &str)
where
    S: Service<reqwest::Request, Response = reqwest::Response>,
    S::Error: std::fmt::Debug,
{
    use tower::ServiceExt;
    let request = client.get(url).build().unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    black_box(response.bytes().await.unwrap());
}
