//! A `reqwest` call over loopback, for the benchmarks of outbound services (`bulkhead.rs`,
//! `resilience.rs`): what a caller feels.

use std::hint::black_box;

use tower::Service;

use crate::calls::runtime;

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
