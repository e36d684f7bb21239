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

/// A tokio runtime on the calling thread, with its I/O and timers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A server answering `GET /` with a short body on a loopback port, and a `reqwest` client: a
/// service is measured by the time of one whole `GET` through it.
pub struct Loopback {
    runtime: tokio::runtime::Runtime,
    url: String,
    client: reqwest::Client,
}

impl Loopback {
    /// Starts the server on a runtime of its own.
    pub fn start() -> Self {
        let runtime = runtime();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        runtime.spawn(async move { axum::serve(listener, app).await.unwrap() });
        let client = reqwest::Client::new();
        Self {
            runtime,
            url,
            client,
        }
    }

    /// The client, for a service to wrap.
    pub fn client(&self) -> reqwest::Client {
        self.client.clone()
    }

    /// Benchmarks, as `name` in `group`, one `GET` through the service `make` builds (the body
    /// read to its end).
    pub fn bench<S>(
        &self,
        group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
        name: &str,
        make: impl Fn() -> S,
    ) where
        S: Service<reqwest::Request, Response = reqwest::Response>,
        S::Error: std::fmt::Debug,
    {
        group.bench_function(name, |b| {
            let mut service = make();
            b.iter(|| self.get(&mut service))
        });
    }

    /// One `GET` through `service`, body read to its end.
    pub fn get<S>(&self, service: &mut S)
    where
        S: Service<reqwest::Request, Response = reqwest::Response>,
        S::Error: std::fmt::Debug,
    {
        use tower::ServiceExt;
        let request = self.client.get(&self.url).build().unwrap();
        self.runtime.block_on(async {
            let response = service.ready().await.unwrap().call(request).await.unwrap();
            black_box(response.bytes().await.unwrap());
        })
    }
}
