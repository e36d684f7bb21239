//! Policies: a name, a key, a cost and a limiter; and the sets of policies a layer holds.

use std::fmt;
use std::sync::Arc;

use crate::head::RequestHead;

use super::headers::sf_string;
use super::key::KeyExtractor;
use super::set::Chain;
use crate::usage::BodyUsage;
use crate::{decision::Decision, Limiter, Quota};

/// One rate limit on a route: a name that clients see, a [`KeyExtractor`] that says whom a
/// request counts against, a [`Limiter`] that decides, and what a request costs.
///
/// ```
/// use std::net::IpAddr;
///
/// use tower_bulwark::rate_limit::{GlobalKey, HeaderKey, PeerIp, Policy, RateLimitLayer};
/// use tower_bulwark::{DirectRateLimiter, KeyedRateLimiter, Quota};
///
/// // Ten per second per client IP, a thousand per day per API key, 500 per second in all:
/// // three keys, three limiters, one all-or-nothing decision.
/// let per_ip = Policy::new("per-ip", PeerIp::new(), KeyedRateLimiter::new(Quota::per_second(10)?))?;
/// let per_key = Policy::new(
///     "per-key",
///     HeaderKey::new("x-api-key")?,
///     KeyedRateLimiter::new(Quota::per_day(1000)?),
/// )?
/// // A search costs five permits of this policy, anything else one.
/// .cost_by(|request| if request.uri.path() == "/search" { 5 } else { 1 });
/// let all = Policy::new("all", GlobalKey, DirectRateLimiter::new(Quota::per_second(500)?))?;
/// let layer = RateLimitLayer::new(per_ip.and(per_key).and(all));
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A name is one to 64 printable ASCII characters (space to `~`), so that it is a valid
/// Structured Field string and a valid JSON string without surprises.
#[derive(Clone)]
pub struct Policy<X, L> {
    pub(crate) name: Box<str>,
    pub(crate) key: X,
    pub(crate) limiter: L,
    pub(crate) cost: Cost,
    pub(crate) settle: Settle,
    pub(crate) shadow: Shadow,
}

/// What one request costs a policy.
#[derive(Clone)]
pub(crate) enum Cost {
    Fixed(u32),
    By(Arc<dyn Fn(&RequestHead<'_>) -> u32 + Send + Sync>),
}

/// What a response says a request cost (`None`: the estimate stands).
pub(crate) type SettleBy = dyn Fn(&http::response::Parts) -> Option<u32> + Send + Sync;

/// Whether, and from what, a policy settles a request's cost after its response.
#[derive(Clone)]
pub(crate) enum Settle {
    /// The cost asked for stands.
    Never,
    /// The response head says what the request cost.
    ByHead(Arc<SettleBy>),
    /// The response body says, once it has streamed by.
    ByBody(BodyUsage),
    /// Nothing is settled: the admission is held until the response body ends, fails or is
    /// dropped (or the request ends without one), then given back whole ([`Policy::concurrent`]).
    Held,
}

/// Says where the costs come from: `Never`, `Head` or `Body`.
impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Settle::Never => "Never",
            Settle::ByHead(_) => "Head",
            Settle::ByBody(_) => "Body",
            Settle::Held => "Held",
        })
    }
}

/// Whether a policy may refuse, and whether a shadow policy is advertised (a route's `shadow`
/// in a configuration file: `false`, `true` or `"advertised"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Shadow {
    /// The policy refuses what it does not admit.
    #[default]
    Off,
    /// The policy never refuses; it is left out of the rate-limit headers.
    Silent,
    /// The policy never refuses, but the headers describe it as if it did.
    Advertised,
}

impl<X: KeyExtractor, L: Limiter<X::Key>> Policy<X, L> {
    /// A policy named `name` that keys requests with `key` and decides with `limiter`; each
    /// request costs one permit.
    ///
    /// A [`ConcurrencyLimiter`](super::ConcurrencyLimiter) (a clone of a
    /// [`concurrent`](Self::concurrent) policy's, to share its slots) makes a concurrent policy:
    /// its requests hold their slots until the response body ends, and the headers say so.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] if the name is empty, longer than 64 characters, or not printable ASCII.
    pub fn new(name: impl Into<String>, key: X, limiter: L) -> Result<Self, PolicyError> {
        let name = name.into();
        check_name(&name)?;
        // The one kind of limiter whose admissions are held, not spent.
        let slots = (&limiter as &dyn std::any::Any).is::<super::ConcurrencyLimiter<X::Key>>();
        Ok(Self {
            name: name.into_boxed_str(),
            key,
            limiter,
            cost: Cost::Fixed(1),
            settle: if slots { Settle::Held } else { Settle::Never },
            shadow: Shadow::Off,
        })
    }

    /// The policy as the layer describes it.
    pub(crate) fn info(&self) -> PolicyInfo {
        let quota = self.limiter.quota();
        PolicyInfo::new(&self.name, quota, self.shadow, self.settle.clone())
    }
}

impl<X, L> Policy<X, L> {
    /// Every request costs `permits` (one by default). A cost of zero leaves the policy out of
    /// the request's decision and its headers.
    ///
    /// A cost above what the limiter can ever hold at once (its burst) is refused with a `413
    /// Content Too Large` that says the request can never be admitted and the largest cost the
    /// policy admits, without a `Retry-After` (a `429` would be retried, in vain).
    pub fn cost(mut self, permits: u32) -> Self {
        self.cost = Cost::Fixed(permits);
        self
    }

    /// Each request costs what `cost` says from its head: the path, the method, a header, or
    /// axum's `MatchedPath` in the extensions. Zero leaves the policy out, as for
    /// [`cost`](Self::cost).
    ///
    /// ```
    /// use axum::extract::MatchedPath;
    /// use tower_bulwark::rate_limit::{PeerIp, Policy};
    /// use tower_bulwark::{KeyedRateLimiter, Quota};
    ///
    /// let policy = Policy::new("per-ip", PeerIp::new(), KeyedRateLimiter::new(Quota::per_second(10)?))?
    ///     .cost_by(|request| {
    ///         match request.extensions.get::<MatchedPath>().map(MatchedPath::as_str) {
    ///             Some("/search") => 5,
    ///             _ => 1,
    ///         }
    ///     });
    /// # let _ = policy;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// axum puts `MatchedPath` in the extensions before a `route_layer` runs, not before a
    /// `Router::layer`.
    pub fn cost_by(
        mut self,
        cost: impl Fn(&RequestHead<'_>) -> u32 + Send + Sync + 'static,
    ) -> Self {
        self.cost = Cost::By(Arc::new(cost));
        self
    }

    /// Counts only requests whose response matches `counts` (a failed login, a server error):
    /// the permit is taken before the request goes on, so a client already over the limit is
    /// refused before the inner service runs, and it is given back when the response turns out
    /// not to count.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_bulwark::rate_limit::{PeerIp, Policy};
    /// use tower_bulwark::{KeyedRateLimiter, Quota};
    ///
    /// // Five failed logins per minute per client IP; successful ones never count.
    /// let failures = Policy::new("login-failures", PeerIp::new(), KeyedRateLimiter::new(Quota::per_minute(5)?))?
    ///     .count_if(|response| response.status == StatusCode::UNAUTHORIZED);
    /// # let _ = failures;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// A request counts unless a response proves otherwise: when the inner service fails
    /// instead of answering, or the response future is dropped before the response (the client
    /// went away), its permit stays spent. A policy that counts by outcome keeps the request's key
    /// until the response: one allocation per admitted request.
    ///
    /// This is [`settle_by`](Self::settle_by) with a cost of zero for the responses that do not
    /// count, and replaces any other settle of the policy.
    pub fn count_if(
        self,
        counts: impl Fn(&http::response::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.settle_by(move |response| (!counts(response)).then_some(0))
    }

    /// Settles each admitted request to the cost its response head reports (a usage header:
    /// the tokens an LLM API used), where the request first took its cost
    /// ([`cost`](Self::cost) or [`cost_by`](Self::cost_by): an estimate, such as the request's
    /// `max_tokens`). The difference is given back, or charged as debt that the key's next
    /// requests wait for: see [`Limiter::settle`] for the exact rules. Build the limiter with
    /// [`Metered`](crate::algorithm::Metered) for settles that are exact however many requests
    /// are in flight and however long they take.
    ///
    /// `settled` returns `None` when the response says nothing readable: the estimate stands,
    /// with a `debug` log line; so it does when the inner service fails, the response future is
    /// dropped before the response, or `settled` panics (an `error` log line). The rate-limit
    /// headers of the response tell the state after the settle, in the policy's unit.
    ///
    /// ```
    /// use tower_bulwark::rate_limit::{HeaderKey, Policy};
    /// use tower_bulwark::{KeyedRateLimiter, Quota};
    ///
    /// // 10 000 tokens a minute per API key: reserve the request's declared maximum, settle to
    /// // what the upstream reports it used.
    /// let tokens = Policy::new("tokens", HeaderKey::new("x-api-key")?, KeyedRateLimiter::new(Quota::per_minute(10_000)?))?
    ///     .cost_by(|request| {
    ///         request.headers.get("x-max-tokens").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1000)
    ///     })
    ///     .settle_by(|response| {
    ///         response.headers.get("x-usage-total-tokens")?.to_str().ok()?.parse().ok()
    ///     });
    /// # let _ = tokens;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle_by(
        mut self,
        settled: impl Fn(&http::response::Parts) -> Option<u32> + Send + Sync + 'static,
    ) -> Self {
        // A concurrent policy keeps its hold (see `Policy::concurrent`).
        if !matches!(self.settle, Settle::Held) {
            self.settle = Settle::ByHead(Arc::new(settled));
        }
        self
    }

    /// Settles each admitted request, as [`settle_by`](Self::settle_by) does, to the cost its
    /// response body reports ([`BodyUsage`]: `usage.total_tokens` of a JSON body, or of the last
    /// server-sent event that has it), read as the body streams by to the client, unchanged and
    /// never held back or buffered.
    ///
    /// The answer's `Content-Type` says how to read it: an event stream as events, JSON as one
    /// document, whichever constructor made `usage` (see [`BodyUsage`]), so one policy settles
    /// a route that streams some answers and not others. A body in a content coding (gzip) is
    /// not read: place the layer inside any compression layer.
    ///
    /// The settle happens when the body ends. A body dropped before its end (the client went
    /// away) settles to the cost read so far, if it was read, and otherwise keeps the estimate;
    /// so does a body that fails. An error answer (status 400 and up: the service's own
    /// refusal, or a failure before the upstream was reached, streamed or not) that reports no
    /// usage settles to zero, as LLM APIs charge no tokens for a failed request. The rate-limit headers went out before the body and tell the
    /// state after the estimate.
    ///
    /// The layer must carry the body: call [`wrap_body`](super::RateLimitLayer::wrap_body) on
    /// it (the layer panics when it is applied to a service otherwise, naming the policy).
    pub fn settle_from_body(mut self, usage: BodyUsage) -> Self {
        if !matches!(self.settle, Settle::Held) {
            self.settle = Settle::ByBody(usage);
        }
        self
    }

    /// Shadow mode: the policy decides and counts as usual, but never refuses a request, and is
    /// left out of the rate-limit headers. A request it would have refused goes on (if the other
    /// policies admit it), with an `info` log line and, with the `metrics` feature, the counter
    /// `bulwark_ratelimit_shadow_refusals_total`: a new limit can be watched before it is
    /// enforced. A shadow policy never makes a request wait, and a failure of its limiter never
    /// answers `503`.
    pub fn shadow(mut self) -> Self {
        self.shadow = Shadow::Silent;
        self
    }

    /// Shadow mode, as [`shadow`](Self::shadow), but with the policy in the rate-limit headers
    /// as if it were enforced, so clients can adapt before it is.
    pub fn shadow_advertised(mut self) -> Self {
        self.shadow = Shadow::Advertised;
        self
    }

    /// This policy and then `next` (a policy or a chain of them), for one layer: a request is
    /// admitted only if all of them admit it. Each keeps its own key, cost and limiter types.
    pub fn and<Q>(self, next: Q) -> Chain<Self, Q> {
        Chain::new(self, next)
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key extractor.
    pub fn key(&self) -> &X {
        &self.key
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<X, L> fmt::Debug for Policy<X, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cost: &dyn fmt::Debug = match &self.cost {
            Cost::Fixed(permits) => permits,
            Cost::By(_) => &"by request",
        };
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("key", &std::any::type_name::<X>())
            .field("cost", cost)
            .field("settles", &self.settle)
            .field("shadow", &self.shadow)
            .finish_non_exhaustive()
    }
}

pub(crate) fn check_name(name: &str) -> Result<(), PolicyError> {
    let reason = if name.is_empty() {
        "is empty"
    } else if name.len() > 64 {
        "is longer than 64 characters"
    } else if !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        "has a character that is not printable ASCII"
    } else {
        return Ok(());
    };
    Err(PolicyError::new("name", reason))
}

/// A policy name that cannot be sent in a header, or a key header name that is not one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyError {
    what: &'static str,
    reason: &'static str,
}

impl PolicyError {
    pub(crate) fn new(what: &'static str, reason: &'static str) -> Self {
        Self { what, reason }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid policy {}: it {}", self.what, self.reason)
    }
}

impl std::error::Error for PolicyError {}

/// One policy as the layer describes it to clients and to its logs.
#[derive(Clone, Debug)]
pub struct PolicyInfo {
    pub(crate) name: Box<str>,
    /// The name as a Structured Field String, quotes included.
    pub(crate) sf_name: Box<str>,
    pub(crate) quota: Quota,
    pub(crate) shadow: Shadow,
    /// Whether, and from what, the policy's admissions are settled after the response.
    pub(crate) settle: Settle,
    #[cfg(feature = "metrics")]
    shadow_refusals: std::sync::OnceLock<metrics::Counter>,
}

impl PolicyInfo {
    pub(crate) fn new(name: &str, quota: Quota, shadow: Shadow, settle: Settle) -> Self {
        Self {
            name: name.into(),
            sf_name: sf_string(name).into_boxed_str(),
            quota,
            shadow,
            settle,
            #[cfg(feature = "metrics")]
            shadow_refusals: std::sync::OnceLock::new(),
        }
    }

    /// Whether the policy appears in the rate-limit headers.
    pub(crate) fn advertised(&self) -> bool {
        self.shadow != Shadow::Silent
    }

    /// Whether the policy may refuse.
    pub(crate) fn enforced(&self) -> bool {
        self.shadow == Shadow::Off
    }

    /// Records that this shadow policy would have refused a request.
    pub(crate) fn would_have_refused(&self, decision: &Decision) {
        tracing::info!(
            policy = &*self.name,
            retry_after_ms = crate::decision::ceil_millis(decision.retry_after),
            "rate limit (shadow): the policy would have refused the request; letting it through"
        );
        #[cfg(feature = "metrics")]
        self.shadow_refusals
            .get_or_init(|| {
                metrics::counter!(
                    crate::observe::metric_names::RATELIMIT_SHADOW_REFUSALS,
                    "name" => self.name.to_string()
                )
            })
            .increment(1);
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("per-ip").is_ok());
        assert!(check_name("with \"quotes\" and \\").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("é").is_err());
        assert!(check_name("tab\there").is_err());
        assert!(check_name(&"x".repeat(65)).is_err());
        assert!(check_name(&"x".repeat(64)).is_ok());
        let err = check_name("").unwrap_err();
        assert_eq!(err.to_string(), "invalid policy name: it is empty");
    }
}
