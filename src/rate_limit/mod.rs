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
//! use tower_bulwark::{KeyedRateLimiter, ManualClock, Quota};
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
//! [`PeerIp`] keys by the TCP peer's address (IPv6 by its /64), [`ForwardedIp`] by the client
//! behind proxies you trust, [`HeaderKey`] by a header such as `x-api-key`, [`GlobalKey`] puts every
//! request in one budget, and any closure over [`http::request::Parts`] can be a key extractor. A
//! request without a key gets the [`KeyError`]'s status (`400` when the client is at fault, `500`
//! when the server is set up wrong) with a problem+json body, and a log line with the reason;
//! [`RateLimitLayer::on_key_error`] with [`FailMode::Open`] lets such requests through instead,
//! uncounted. Behind proxies, [`ForwardedIp`] answers `400` when a hop that is not an address
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
//!  "title":"Quota exceeded","status":429,
//!  "detail":"The request exceeds the quota of 'per-ip'; retry in 1 second.",
//!  "violated-policies":["per-ip"]}
//! ```
//!
//! * `Retry-After` is `max(1, ceil(seconds))` of the limiter's own `retry_after`, never `0`.
//! * `RateLimit-Policy` and `RateLimit` follow draft-ietf-httpapi-ratelimit-headers-10 and are
//!   serialized as RFC 9651 Structured Field lists: `q` is the quota's permits, `w` its period in
//!   seconds (rounded up), `r` the permits left, `t` the seconds until the policy is whole again
//!   (for a violated policy, the seconds until it admits again: its own `Retry-After`).
//! * The body is an RFC 9457 problem of the draft's `quota-exceeded` type.
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
//! slot a later reservation holds; see the [guide](crate::guide)). The 429 names every violated
//! policy and carries the longest `Retry-After`; its `RateLimit` header describes the policies
//! that refused. A `Vec` of policies of one type (as a configuration builds them) works too.
//!
//! * [`Policy::cost`] and [`Policy::cost_by`] charge a request more than one permit (a search
//!   five, a lookup one), from its head (axum's `MatchedPath` included). A cost the policy can
//!   never admit at once is a 429 that says so, without a `Retry-After`.
//! * [`Policy::count_if`] counts only the requests whose response matches (failed logins, server
//!   errors): a client over the limit is refused before the inner service runs, and a request
//!   whose response does not count gets its permit back.
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
//! [`RateLimitLayer::on_limiter_error`] with [`FailMode::Open`] lets it through instead, without
//! counting it against the failed policy.
//!
//! # Sharing and placement
//!
//! Every clone of the layer and of its services shares one set of limiters, so the limits hold
//! under axum, which clones services freely. Use `route_layer` to limit chosen routes (unmatched
//! paths are then not counted), or `layer` for everything. The service's error type is the inner
//! service's; no `HandleErrorLayer` is needed.
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
mod decide;
mod future;
pub mod key;
mod layer;
mod policy;
mod response;
mod service;

pub use self::body::{BodyKind, SameBody, WrapBody};
pub use self::future::ResponseFuture;
pub use self::key::{Cidr, CidrError, GlobalKey, HeaderKey, KeyError, KeyExtractor};
#[cfg(feature = "axum")]
pub use self::key::{ForwardedIp, PeerIp};
pub use self::layer::{FailMode, RateLimitLayer};
#[cfg(feature = "config")]
pub(crate) use self::policy::check_name as check_policy_name;
pub use self::policy::{BoxLimiter, BoxReserve, Chain, Policy, PolicyError, PolicySet};
pub use self::response::{
    OnRefusal, RateLimitBody, Refusal, QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY,
    X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
pub use self::service::RateLimit;
