//! Inbound HTTP rate limiting: [`RateLimitLayer`], a tower layer for axum routes (or any
//! `http` service).
//!
//! A [`Policy`] is one limit: a name that clients see, a [`KeyExtractor`] that says whom a
//! request counts against (the client's IP, an API key, a tenant), a [`Limiter`](crate::Limiter)
//! that decides, and what a request costs. For each request the layer asks each of its policies
//! for a permit under that policy's own key, and then either calls the inner service or answers
//! `429 Too Many Requests` itself.
//!
//! ```
//! use std::net::{IpAddr, SocketAddr};
//!
//! use axum::{body::Body, extract::connect_info::MockConnectInfo, routing::get, Router};
//! use http::{Request, StatusCode};
//! use tower::ServiceExt;
//! use tower_bulwark::rate_limit::{PeerIp, Policy, RateLimitLayer};
//! use tower_bulwark::{KeyedRateLimiter, clock::ManualClock, Quota};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new(); // `KeyedRateLimiter::new` uses the system clock
//! let limiter = KeyedRateLimiter::<IpAddr>::builder(Quota::per_second(2)?)
//!     .clock(clock.clone())
//!     .build();
//! let app = Router::new()
//!     .route("/orders", get(|| async { "ok" }))
//!     .route_layer(RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter)?))
//!     // In a server: `app.into_make_service_with_connect_info::<SocketAddr>()`.
//!     .layer(MockConnectInfo(SocketAddr::from(([203, 0, 113, 7], 4711))));
//!
//! let get = || Request::get("/orders").body(Body::empty());
//! let admitted = app.clone().oneshot(get()?).await?;
//! assert_eq!(admitted.status(), StatusCode::OK);
//! assert_eq!(admitted.headers()["ratelimit-policy"], r#""per-ip";q=2;w=1"#);
//! assert_eq!(admitted.headers()["ratelimit"], r#""per-ip";r=1;t=1"#);
//!
//! app.clone().oneshot(get()?).await?;
//! let refused = app.clone().oneshot(get()?).await?;
//! assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(refused.headers()["retry-after"], "1");
//! assert_eq!(refused.headers()["ratelimit"], r#""per-ip";r=0;t=1"#);
//! assert_eq!(refused.headers()["content-type"], "application/problem+json");
//!
//! clock.advance(std::time::Duration::from_millis(500));
//! assert_eq!(app.oneshot(get()?).await?.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! `PeerIp` keys by the TCP peer's address (IPv6 by its /64), `ForwardedIp` by the client
//! behind proxies you trust, [`HeaderKey`] by a header such as `x-api-key`, [`GlobalKey`] puts every
//! request in one budget, and any closure over the [`RequestHead`](crate::head::RequestHead) can
//! be a key extractor. A request without a key gets the [`KeyError`]'s status (`400` when the client is at fault, `500`
//! when the server is set up wrong) with a problem+json body, and a log line with the reason;
//! [`RateLimitLayer::key_error_mode`] with [`FailMode::Open`] lets such requests through instead,
//! uncounted. Behind proxies, `ForwardedIp` answers `400` when a hop that is not an address
//! stands between your proxies and the client: its docs say why.
//!
//! # The refusal
//!
//! A refused request is answered without calling the service:
//!
//! ```text
//! HTTP/1.1 429 Too Many Requests
//! retry-after: 1
//! ratelimit-policy: "per-ip";q=10;w=1
//! ratelimit: "per-ip";r=0;t=1
//! content-type: application/problem+json
//!
//! {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//!  "title":"Quota Exceeded","status":429,
//!  "detail":"The request exceeds the quota of 'per-ip'; retry in 1 second.",
//!  "violated-policies":["per-ip"]}
//! ```
//!
//! * `Retry-After` is `max(1, ceil(seconds))` of the limiter's own `retry_after`, never `0`.
//! * `RateLimit-Policy` and `RateLimit` follow draft-ietf-httpapi-ratelimit-headers-11 and are
//!   serialized as RFC 9651 Structured Field lists, one item per policy, named by the policy.
//! * `RateLimit-Policy` states each quota as a rate, the same on every response: `w` is the
//!   period in whole seconds (rounded up, at least 1), and `q` what the quota grants in `w`
//!   seconds, rounded down: 5 per 200 ms is `q=25;w=1`, 3 per 1.5 s is `q=4;w=2`. A client that
//!   spaces its requests `w/q` apart is never refused (the sliding counter has one exception,
//!   see the guide). A GCRA burst above the permits is not
//!   advertised. `q/w` is a rate, not a burst: how much may go at once is `r`.
//! * `RateLimit` gives `r`, the permits available now (at most `q`), and `t`, the window in
//!   seconds within which to use no more than `r`: the later of when the key is whole again and
//!   the time the advertised rate takes to grant `r`, so `r/t` never states a faster rate than
//!   `q/w` (1000 per hour after one request is `r=999;t=3597`, not 999 in the 4 s GCRA needs to
//!   be whole again). On a refusal it lists only the violated policies, each with what it has
//!   left (fewer permits than the request asked for: `r=0` for a request of one) and its own
//!   wait as `t`; `Retry-After` is the longest of them, so it never points before the end of any
//!   listed window.
//! * The body is an RFC 9457 problem of the type `quota-exceeded` that the draft registers,
//!   with its registered title, `Quota Exceeded`.
//!
//! The [guide](crate::guide#rate-limit-headers) explains these choices per algorithm and lists
//! each requirement of the draft with the test that checks it.
//!
//! [`RateLimitLayer::on_refusal`] replaces this answer with one of your own ([`OnRefusal`]).
//! Admitted responses carry `RateLimit-Policy` and `RateLimit` too, unless
//! [`RateLimitLayer::without_admitted_headers`]; the legacy `X-RateLimit-*` headers are opt-in with
//! [`RateLimitLayer::with_legacy_headers`].
//!
//! # Several policies, costs, outcomes and shadows
//!
//! [`Policy::and`] puts several policies on one layer, each with its own key and limiter types
//! (ten per second per IP, a thousand per day per API key, five hundred per second in all). A
//! request is admitted only if every policy admits it; one that any policy refuses gives back
//! what the others granted, so it spends nothing (a GCRA policy keeps spent only what the key's
//! state cannot place: the time elapsed since, when other requests were admitted meanwhile, or a
//! slot a later reservation holds; a fixed-window reservation straddling two cycles stays spent;
//! see the [guide](crate::guide)). The 429 names every violated
//! policy and carries the longest `Retry-After`; its `RateLimit` header describes the policies
//! that refused. A `Vec` of policies of one type (as a configuration builds them) works too.
//!
//! * [`Policy::cost`] and [`Policy::cost_by`] charge a request more than one permit (a search
//!   five, a lookup one), from its head (axum's `MatchedPath` included). A cost the policy can
//!   never admit at once is a `413 Content Too Large` that says so (the body's `largest-cost`),
//!   without a `Retry-After`.
//! * [`Policy::count_if`] counts only the requests whose response matches (failed logins, server
//!   errors): a client over the limit is refused before the inner service runs, and a request
//!   whose response does not count gets its permit back (and its `RateLimit` header says so). A
//!   predicate that panics counts the response, with an `error` log line.
//! * [`Policy::settle_by`] and [`Policy::settle_from_body`] settle a cost known only from the
//!   answer (an LLM API's tokens): the request reserves its estimate, and is settled to what the
//!   response head, or its body as it streams by ([`BodyUsage`](crate::usage::BodyUsage)), says it cost.
//! * [`Policy::shadow`] decides and counts but never refuses: an `info` log line and a metric say
//!   what it would have refused, so a new limit can be watched before it is enforced.
//!
//! # Waiting
//!
//! A quota with a `max_wait` lets a request whose permit falls due within it wait for it (a tokio
//! timer; no thread is parked) and then proceed. If the request's future is dropped while it
//! waits (the client hung up, or a timeout layer gave up) the permits it held are given back.
//!
//! # Failures
//!
//! A limiter may fail (a Redis limiter whose server is down). By default the request gets `503
//! Service Unavailable` with a problem+json body and a `warn` log line;
//! [`RateLimitLayer::limiter_error_mode`] with [`FailMode::Open`] lets it through instead, without
//! counting it against the failed policy.
//!
//! # Sharing and placement
//!
//! Every clone of the layer and of its services shares one set of limiters, so the limits hold
//! under axum, which clones services freely. Use `route_layer` to limit chosen routes (unmatched
//! paths are then not counted), or `layer` for everything. The service's error type is the inner
//! service's; no `HandleErrorLayer` is needed.
//!
//! Two layers in one stack (a `layer` for everything and a `route_layer` on some routes) decide
//! apart: to the outer one, the inner one's 429 is an answer, so the request stays counted
//! there, and the outer policy is listed in the 429's `RateLimit` beside the inner's. Put the
//! policies of a request in one layer instead (each route's `route_layer` with
//! `global.clone().and(route)`: the clones of a policy share its limiter), so that a refusal
//! spends nothing and names only what refused; or keep an outer policy's count off refusals
//! with `count_if(|answer| answer.status != StatusCode::TOO_MANY_REQUESTS)`.
//!
//! # Response bodies
//!
//! The layer answers some requests itself, so its responses must carry either the inner
//! service's body or bytes of its own. By default ([`SameBody`]) they keep the inner service's
//! body type, which must be made from `Bytes` (axum's `Body` and `http_body_util::Full<Bytes>`
//! are): under axum this avoids a box per response, since a route's body must be axum's `Body`.
//! For an inner service of any other body type, [`RateLimitLayer::wrap_body`] ([`WrapBody`])
//! answers with a [`RateLimitBody`] around it.

mod body;
mod concurrent;
mod decide;
pub mod future;
#[cfg(feature = "grpc")]
pub(crate) mod grpc;
mod headers;
pub mod key;
mod layer;
mod policy;
mod problem;
mod refusal;
mod service;
mod set;
mod settings;

pub use self::body::{BodyKind, RateLimitBody, SameBody, WrapBody};
pub use self::concurrent::ConcurrencyLimiter;
pub(crate) use self::headers::{RATELIMIT, RATELIMIT_POLICY};
#[cfg(feature = "grpc")]
pub use self::key::GrpcMethod;
pub use self::key::{Cidr, CidrError, GlobalKey, HeaderKey, KeyError, KeyExtractor};
#[cfg(any(feature = "axum", feature = "grpc"))]
pub use self::key::{ForwardedIp, PeerIp};
pub use self::layer::RateLimitLayer;
#[cfg(feature = "config")]
pub(crate) use self::policy::{check_name as check_policy_name, Shadow};
pub use self::policy::{Policy, PolicyError};
#[cfg(feature = "config")]
pub(crate) use self::problem::json_string;
#[cfg(feature = "adaptive")]
pub(crate) use self::problem::problem_response;
pub use self::refusal::Refusal;
pub use self::service::RateLimitService;
pub use self::set::{Chain, PolicySet};
pub use self::settings::{FailMode, OnRefusal};
