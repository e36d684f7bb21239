// A rate-limited service whose inner body cannot be made from `Bytes`: the error names the fix.
use std::convert::Infallible;

use http_body_util::Empty;
use tower::{service_fn, ServiceBuilder};
use tower_bulwark::rate_limit::{GlobalKey, Policy, RateLimitLayer};
use tower_bulwark::{DirectRateLimiter, Quota};

fn needs_service<S: tower::Service<http::Request<()>>>(_: S) {}

fn main() {
    let limiter = DirectRateLimiter::new(Quota::per_second(1).unwrap());
    let layer = RateLimitLayer::new(Policy::new("all", GlobalKey, limiter).unwrap());
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(Empty::<bytes::Bytes>::new()))
        }));
    needs_service(service);
}
