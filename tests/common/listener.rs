//! Test helpers for HTTP end to end: an axum app served on a real listener on 127.0.0.1, with
//! connection info, and the rate-limit headers parsed as Structured Fields.

#![allow(dead_code)] // Not every test file uses every helper.

use std::net::SocketAddr;

use axum::Router;
use tokio::net::TcpListener;

/// Serves `app` on a free port of 127.0.0.1 with connection info, as a real server does, and
/// returns its address. The server runs until the test's runtime ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(listener, app)
}

/// Serves `app` on `listener` with connection info, as a real server does, and returns its
/// address. The server runs until the test's runtime ends.
pub fn serve_on(listener: TcpListener, app: Router) -> SocketAddr {
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// `GET /orders` answering `ok`, limited by the policy `name` to one request an hour per key of
/// `extractor` (on a manual clock that never moves).
pub fn orders_one_an_hour<E>(name: &'static str, extractor: E) -> Router
where
    E: tower_bulwark::rate_limit::KeyExtractor + Clone + Send + Sync + 'static,
    E::Key: std::hash::Hash + Eq + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    use tower_bulwark::rate_limit::{Policy, RateLimitLayer};
    let limiter = tower_bulwark::KeyedRateLimiter::<E::Key>::builder(
        tower_bulwark::Quota::per_hour(1).unwrap(),
    )
    .clock(tower_bulwark::clock::ManualClock::new())
    .build();
    Router::new()
        .route("/orders", axum::routing::get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(
            Policy::new(name, extractor, limiter).unwrap(),
        ))
}

/// A header value parsed as an RFC 9651 List of String Items with Integer parameters, as the
/// `RateLimit` and `RateLimit-Policy` headers are (draft -11 requires both to be): each entry's
/// name and parameters. Panics on anything else.
pub fn sf_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured field list: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => {
                let name = item
                    .bare_item
                    .as_string()
                    .unwrap_or_else(|| panic!("{value:?}: the item is not a String"))
                    .as_str()
                    .to_owned();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        let n = v
                            .as_integer()
                            .unwrap_or_else(|| panic!("{value:?}: {k:?} is not an Integer"));
                        (k.as_str().to_owned(), i64::from(n))
                    })
                    .collect();
                (name, params)
            }
            other => panic!("{value:?}: unexpected inner list {other:?}"),
        })
        .collect()
}

/// Every line of header `name` parsed as one Structured Field list (see [`sf_list`]); empty when
/// the header is absent.
pub fn sf_entries(headers: &http::HeaderMap, name: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let joined = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect::<Vec<_>>()
        .join(", ");
    if joined.is_empty() {
        return Vec::new();
    }
    sf_list(&joined)
}

/// The names listed in header `name` (the policies of `RateLimit-Policy` or `RateLimit`).
pub fn sf_names(headers: &http::HeaderMap, name: &str) -> Vec<String> {
    sf_entries(headers, name)
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}
