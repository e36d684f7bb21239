//! What a layer is set up with besides its policies: what it does with a request it cannot judge,
//! which headers it sends, how it answers a refusal, which requests skip it.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response};

use super::headers::PerSet;
use super::policy::PolicyInfo;
use super::refusal::Refusal;
use crate::head::RequestHead;

/// What the layer does with a request it cannot judge: one without a key, or one whose limiter
/// failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailMode {
    /// Answer at once with an `application/problem+json` error: the key error's status (`400` or
    /// `500`), or `503` for a failed limiter. The default.
    #[default]
    Closed,
    /// Let the request through without counting it against the policy that could not decide.
    Open,
}

/// Builds the response to a refused request.
///
/// Implemented for every closure `Fn(&Refusal<'_>) -> Response<Bytes>`. The
/// [`Refusal`] offers the parts of the default answer ([`headers`](Refusal::headers),
/// [`problem_json`](Refusal::problem_json), [`default_response`](Refusal::default_response)),
/// so a hook can change one thing and keep the rest.
///
/// ```
/// use bytes::Bytes;
/// use http::Response;
/// use tower_bulwark::rate_limit::Refusal;
///
/// // Plain text instead of problem+json, with the same status and headers.
/// let plain = |refusal: &Refusal<'_>| {
///     let mut response = Response::new(Bytes::from(match refusal.retry_after_secs() {
///         Some(secs) => format!("slow down; come back in {secs} s\n"),
///         None => "this request is too large to ever be admitted\n".to_owned(),
///     }));
///     *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
///     *response.headers_mut() = refusal.headers();
///     response
/// };
/// # fn is_hook(_: impl tower_bulwark::rate_limit::OnRefusal) {}
/// # is_hook(plain);
/// ```
pub trait OnRefusal: Send + Sync + 'static {
    /// The response to send instead of calling the service.
    fn on_refusal(&self, refusal: &Refusal<'_>) -> Response<Bytes>;
}

impl<F> OnRefusal for F
where
    F: Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync + 'static,
{
    fn on_refusal(&self, refusal: &Refusal<'_>) -> Response<Bytes> {
        self(refusal)
    }
}

/// Whether a request skips every policy.
pub(crate) type Exempt = dyn Fn(&RequestHead<'_>) -> bool + Send + Sync;

/// The settings of a layer that do not depend on its type parameters.
#[derive(Clone)]
pub(crate) struct Settings {
    /// Each policy as clients see it, in the layer's order.
    pub(crate) policies: Vec<PolicyInfo>,
    /// `RateLimit-Policy` for each set of policies taking part in a request.
    pub(crate) policy_headers: PerSet<Option<HeaderValue>>,
    /// What the gRPC refusals of each set of violated policies share.
    #[cfg(feature = "grpc")]
    pub(crate) grpc_refusals: PerSet<super::grpc::Shared>,
    pub(crate) admitted_headers: bool,
    pub(crate) legacy_headers: bool,
    pub(crate) key_error_mode: FailMode,
    pub(crate) limiter_error_mode: FailMode,
    pub(crate) on_refusal: Option<Arc<dyn OnRefusal>>,
    /// Requests that skip every policy (see
    /// [`RateLimitLayer::exempt`](super::RateLimitLayer::exempt)).
    pub(crate) exempt: Option<Arc<Exempt>>,
    /// Whether responses carry a [`RateLimitBody`](super::RateLimitBody), which a settle from
    /// the body needs.
    pub(crate) wraps_body: bool,
}

impl Settings {
    /// The default settings for these policies.
    pub(crate) fn new(policies: Vec<PolicyInfo>) -> Self {
        Self {
            policy_headers: PerSet::new(policies.len()),
            #[cfg(feature = "grpc")]
            grpc_refusals: PerSet::new(policies.len()),
            policies,
            wraps_body: false,
            admitted_headers: true,
            legacy_headers: false,
            key_error_mode: FailMode::Closed,
            limiter_error_mode: FailMode::Closed,
            on_refusal: None,
            exempt: None,
        }
    }

    /// Whether `head` is the head of a request that skips every policy.
    pub(crate) fn is_exempt(&self, head: &RequestHead<'_>) -> bool {
        self.exempt.as_ref().is_some_and(|exempt| exempt(head))
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("policies", &self.policies)
            .field("admitted_headers", &self.admitted_headers)
            .field("legacy_headers", &self.legacy_headers)
            .field("key_error_mode", &self.key_error_mode)
            .field("limiter_error_mode", &self.limiter_error_mode)
            .field("on_refusal", &self.on_refusal.as_ref().map(|_| "custom"))
            .field("exempt", &self.exempt.is_some())
            .finish()
    }
}

/// A layer's policies and settings, shared by every clone of the layer and of its services.
pub(crate) struct Limits<P> {
    pub(crate) policies: Arc<P>,
    pub(crate) settings: Arc<Settings>,
}
