//! What the layer answers: the 429 with its headers and problem+json body, the rate-limit headers
//! of admitted responses, and the response body type.

use std::cell::RefCell;
use std::fmt;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use crate::head::RequestHead;
use arc_swap::ArcSwapOption;
use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::policy::Shadow;
use crate::decision::ceil_secs;
use crate::{
    decision::{Decision, InsufficientCapacity},
    Quota,
};

/// `RateLimit-Policy`: the quota policies of the route (draft-ietf-httpapi-ratelimit-headers-11).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: the service limit of each policy for this client: the quota available (`r`) and
/// the effective window (`t`) within which the client should use no more than that.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit` (opt-in).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining` (opt-in).
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset`, in seconds from now (opt-in).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The problem type of a refusal, `quota-exceeded`, as draft-ietf-httpapi-ratelimit-headers-11
/// registers it in IANA's HTTP Problem Types registry (title `Quota Exceeded`, status 429).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// The start of every refusal's problem+json body, up to the text of `detail`.
/// (`QUOTA_EXCEEDED` needs no JSON escapes; a test checks this is what escaping would write.)
const PROBLEM_HEAD: &str =
    "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\
    \"title\":\"Quota Exceeded\",\"status\":429,\"detail\":\"";

/// The most policies for which a layer keeps the `RateLimit-Policy` of each set of them (2^6 = 64
/// headers at most); beyond, each response builds its own.
const CACHED_SETS: usize = 6;

/// The largest Structured Field Integer (RFC 9651 §3.3.1: at most 15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

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

/// One policy as the layer describes it to clients.
#[derive(Clone, Debug)]
pub struct PolicyInfo {
    pub(crate) name: Box<str>,
    /// The name as a Structured Field String, quotes included.
    pub(crate) sf_name: Box<str>,
    /// The name escaped for the inside of a JSON string, without quotes.
    pub(crate) json_name: Box<str>,
    pub(crate) quota: Quota,
    pub(crate) shadow: Shadow,
    /// Whether the policy counts only some responses (its admissions are settled after the
    /// response).
    pub(crate) count_if: bool,
    #[cfg(feature = "metrics")]
    shadow_refusals: std::sync::OnceLock<metrics::Counter>,
}

impl PolicyInfo {
    pub(crate) fn new(name: &str, quota: Quota, shadow: Shadow, count_if: bool) -> Self {
        let mut sf_name = String::with_capacity(name.len() + 2);
        sf_string(&mut sf_name, name);
        let mut json_name = String::with_capacity(name.len());
        json_escaped(&mut json_name, name);
        Self {
            name: name.into(),
            sf_name: sf_name.into_boxed_str(),
            json_name: json_name.into_boxed_str(),
            quota,
            shadow,
            count_if,
            #[cfg(feature = "metrics")]
            shadow_refusals: std::sync::OnceLock::new(),
        }
    }

    /// Whether the policy appears in the rate-limit headers.
    #[inline]
    fn advertised(&self) -> bool {
        self.shadow != Shadow::Silent
    }

    /// Whether the policy may refuse.
    #[inline]
    pub(crate) fn enforced(&self) -> bool {
        self.shadow == Shadow::Off
    }

    /// Records that this shadow policy would have refused a request.
    pub(crate) fn would_have_refused(&self, decision: &Decision) {
        tracing::info!(
            policy = &*self.name,
            retry_after_ms = decision.retry_after.as_millis() as u64,
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

/// What one policy said about one request.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Admitted, holding a permit (possibly one that falls due after `wait`).
    Admitted(Decision),
    /// Refused (for a shadow policy: would have been).
    Refused(Decision),
    /// The request costs more than the policy can ever admit at once.
    Unadmittable(InsufficientCapacity),
    /// The limiter failed and the layer fails open: no decision.
    Failed,
    /// The policy sat the request out: a cost of zero, or no key and the layer lets such
    /// requests through.
    Skipped,
}

impl Outcome {
    fn decision(&self) -> Option<&Decision> {
        match self {
            Outcome::Admitted(d) | Outcome::Refused(d) => Some(d),
            _ => None,
        }
    }
}

/// Settings of a layer that do not depend on its type parameters.
#[derive(Clone)]
pub(crate) struct Meta {
    pub(crate) policies: Vec<PolicyInfo>,
    /// `RateLimit-Policy` for each set of policies that took part in a request (bit `i` of the
    /// index: policy `i`), computed once when first needed; empty for more than
    /// [`CACHED_SETS`] policies.
    policy_headers: Box<[OnceLock<Option<HeaderValue>>]>,
    /// `RateLimit-Policy` built at the latest response whose quotas were not those the layer was
    /// built with (a limiter's quota changed, or a key's tier), for the next responses with the
    /// same set and quotas; shared by every clone.
    changed_policy: Arc<ArcSwapOption<ChangedPolicy>>,
    pub(crate) admitted_headers: bool,
    pub(crate) legacy_headers: bool,
    pub(crate) key_error_mode: super::FailMode,
    pub(crate) limiter_error_mode: super::FailMode,
    pub(crate) on_refusal: Option<Arc<dyn OnRefusal>>,
    /// Requests that skip every policy (see [`RateLimitLayer::exempt`](super::RateLimitLayer::exempt)).
    pub(crate) exempt: Option<Arc<Exempt>>,
    /// Whether some policy counts only some responses, so that admissions are settled after
    /// the response.
    pub(crate) settles: bool,
}

/// Whether a request skips every policy.
pub(crate) type Exempt = dyn Fn(&RequestHead<'_>) -> bool + Send + Sync;

impl Meta {
    pub(crate) fn new(policies: Vec<PolicyInfo>) -> Self {
        let policy_headers = if policies.len() <= CACHED_SETS {
            (0..1usize << policies.len())
                .map(|_| OnceLock::new())
                .collect()
        } else {
            Box::default()
        };
        let settles = policies.iter().any(|p| p.count_if);
        Self {
            policies,
            policy_headers,
            changed_policy: Arc::default(),
            admitted_headers: true,
            legacy_headers: false,
            key_error_mode: super::FailMode::Closed,
            limiter_error_mode: super::FailMode::Closed,
            on_refusal: None,
            exempt: None,
            settles,
        }
    }

    /// Whether `parts` is a request that skips every policy.
    #[inline]
    pub(crate) fn is_exempt(&self, head: &RequestHead<'_>) -> bool {
        self.exempt.as_ref().is_some_and(|exempt| exempt(head))
    }

    /// The headers of an admitted response, or `None` if they are turned off. `quota` gives each
    /// policy's quota for the request's key.
    #[inline]
    pub(crate) fn admitted_headers(
        &self,
        outcomes: &[Outcome],
        quota: impl Fn(usize) -> Quota,
    ) -> Option<AdmittedHeaders> {
        if self.admitted_headers {
            self.build_admitted_headers(outcomes, quota)
        } else {
            None
        }
    }

    /// `RateLimit-Policy` for a request: the policies that took part in its decision (not
    /// those that sat it out, at a cost of zero or without a key), with the quotas `quota`
    /// gives for its keys. Built once per set of policies, unless a quota is not the policy's
    /// own (a key's tier), or the layer has more than [`CACHED_SETS`] policies.
    #[inline]
    pub(crate) fn policy_header_for(
        &self,
        outcomes: &[Outcome],
        quota: impl Fn(usize) -> Quota,
    ) -> Option<HeaderValue> {
        let mut set = 0usize;
        let mut own_quotas = true;
        for (i, p) in self.policies.iter().enumerate() {
            if p.advertised() && took_part(outcomes, i) {
                // Only read as an index while there are at most `CACHED_SETS` policies.
                set |= 1 << i.min(usize::BITS as usize - 1);
                own_quotas &= quota(i) == p.quota;
            }
        }
        match self.policy_headers.get(set) {
            Some(cached) if own_quotas => cached
                .get_or_init(|| {
                    let included = |i| took_part(outcomes, i);
                    policy_header(&self.policies, included, |i| self.policies[i].quota)
                })
                .clone(),
            _ => self.changed_policy_header(outcomes, quota),
        }
    }

    /// `RateLimit-Policy` for quotas other than those the layer was built with (or for more
    /// than [`CACHED_SETS`] policies): the one built last if it was for the same policies with
    /// the same quotas, otherwise built now and kept.
    #[cold]
    fn changed_policy_header(
        &self,
        outcomes: &[Outcome],
        quota: impl Fn(usize) -> Quota,
    ) -> Option<HeaderValue> {
        // Each advertised policy that took part, with its quota; the others `None`.
        let quotas: Box<[Option<Quota>]> = (0..self.policies.len())
            .map(|i| (self.policies[i].advertised() && took_part(outcomes, i)).then(|| quota(i)))
            .collect();
        if let Some(changed) = &*self.changed_policy.load() {
            if changed.quotas == quotas {
                return changed.header.clone();
            }
        }
        let header = policy_header(
            &self.policies,
            |i| quotas[i].is_some(),
            |i| quotas[i].unwrap_or(self.policies[i].quota),
        );
        self.changed_policy.store(Some(Arc::new(ChangedPolicy {
            quotas,
            header: header.clone(),
        })));
        header
    }

    fn build_admitted_headers(
        &self,
        outcomes: &[Outcome],
        quota: impl Fn(usize) -> Quota,
    ) -> Option<AdmittedHeaders> {
        // Both headers need each policy's quota; read it once (for a keyed limiter that is a
        // lock taken and released).
        let memo: [std::cell::Cell<Option<Quota>>; 4] = Default::default();
        let quota = |i: usize| match memo.get(i) {
            Some(cell) => cell.get().unwrap_or_else(|| {
                let q = quota(i);
                cell.set(Some(q));
                q
            }),
            None => quota(i),
        };
        let policy = self.policy_header_for(outcomes, quota)?;
        let ratelimit = ratelimit_header(&self.policies, outcomes, false, quota)?;
        let legacy = if self.legacy_headers {
            legacy_values(&self.policies, outcomes, false).map(Box::new)
        } else {
            None
        };
        Some(AdmittedHeaders {
            policy,
            ratelimit,
            legacy,
        })
    }
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meta")
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

/// `RateLimit-Policy` for quotas that differ from those a layer was built with.
#[derive(Debug)]
pub(crate) struct ChangedPolicy {
    /// Per policy, its quota if it took part and is advertised.
    quotas: Box<[Option<Quota>]>,
    header: Option<HeaderValue>,
}

/// Headers to add to an admitted response.
#[derive(Debug)]
pub(crate) struct AdmittedHeaders {
    policy: HeaderValue,
    ratelimit: HeaderValue,
    legacy: Option<Box<[HeaderValue; 3]>>,
}

impl AdmittedHeaders {
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        // Append: an outer layer's policies and ours form one list (RFC 9110 §5.3).
        headers.append(RATELIMIT_POLICY, self.policy);
        headers.append(RATELIMIT, self.ratelimit);
        if let Some(legacy) = self.legacy {
            let [limit, remaining, reset] = *legacy;
            headers.entry(X_RATELIMIT_LIMIT).or_insert(limit);
            headers.entry(X_RATELIMIT_REMAINING).or_insert(remaining);
            headers.entry(X_RATELIMIT_RESET).or_insert(reset);
        }
    }
}

/// A refused request, as the [`OnRefusal`] hook sees it.
pub struct Refusal<'a> {
    pub(crate) meta: &'a Meta,
    pub(crate) request: RequestHead<'a>,
    pub(crate) outcomes: &'a [Outcome],
    /// `RateLimit-Policy` for this request's keys.
    pub(crate) policy_header: Option<HeaderValue>,
}

impl<'a> Refusal<'a> {
    /// The head of the refused request.
    pub fn request(&self) -> RequestHead<'a> {
        self.request
    }

    /// The value of `Retry-After`: the longest `max(1, ceil(seconds))` of the limiters'
    /// `retry_after` over the violated policies; `None` when no wait would help (the request
    /// costs more than a violated policy can ever admit at once).
    ///
    /// That is also the longest effective window (`t`) in the refusal's `RateLimit` field, which
    /// lists only the violated policies, so `Retry-After` never points before the end of any of
    /// them (draft-ietf-httpapi-ratelimit-headers-11, section 6).
    pub fn retry_after_secs(&self) -> Option<u64> {
        if self.unadmittable().next().is_some() {
            return None;
        }
        self.enforced()
            .filter_map(|(_, o)| match o {
                Outcome::Refused(d) => Some(d.retry_after_secs()),
                _ => None,
            })
            .max()
    }

    /// The names of the policies that refused the request, in the layer's order.
    pub fn violated_policies(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.violated().map(|p| &*p.name)
    }

    /// Enforced (not shadow) policies with their outcomes.
    fn enforced(&self) -> impl Iterator<Item = (&'a PolicyInfo, &'a Outcome)> + 'a {
        self.meta
            .policies
            .iter()
            .zip(self.outcomes)
            .filter(|(p, _)| p.enforced())
    }

    fn violated(&self) -> impl Iterator<Item = &'a PolicyInfo> + 'a {
        self.enforced()
            .filter(|(_, o)| matches!(o, Outcome::Refused(_) | Outcome::Unadmittable(_)))
            .map(|(p, _)| p)
    }

    fn unadmittable(&self) -> impl Iterator<Item = (&'a PolicyInfo, InsufficientCapacity)> + 'a {
        self.enforced().filter_map(|(p, o)| match o {
            Outcome::Unadmittable(e) => Some((p, *e)),
            _ => None,
        })
    }

    /// Every policy's name with its decision (`None` where the policy made none: its limiter
    /// failed and the layer fails open, the request cost it nothing, or costs more than it can
    /// ever admit). Admissions listed here have been given back. Shadow policies are listed
    /// too.
    pub fn decisions(&self) -> impl Iterator<Item = (&'a str, Option<&'a Decision>)> + 'a {
        self.meta
            .policies
            .iter()
            .zip(self.outcomes)
            .map(|(p, o)| (&*p.name, o.decision()))
    }

    /// The headers of the default answer: `Retry-After`, `RateLimit-Policy`, `RateLimit` (the
    /// violated policies only, each with `r=0` and its own wait as `t`), and the legacy
    /// `X-RateLimit-*` ones if they are turned on.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(6);
        if let Some(retry) = self.retry_after_secs() {
            headers.insert(RETRY_AFTER, number_value(retry));
        }
        if let Some(policy) = &self.policy_header {
            headers.insert(RATELIMIT_POLICY, policy.clone());
        }
        // A refusal lists only refused decisions, whose values do not depend on the quota.
        let quota = |i: usize| self.meta.policies[i].quota;
        if let Some(ratelimit) = ratelimit_header(&self.meta.policies, self.outcomes, true, quota) {
            headers.insert(RATELIMIT, ratelimit);
        }
        if self.meta.legacy_headers {
            if let Some([limit, remaining, reset]) =
                legacy_values(&self.meta.policies, self.outcomes, true)
            {
                headers.insert(X_RATELIMIT_LIMIT, limit);
                headers.insert(X_RATELIMIT_REMAINING, remaining);
                headers.insert(X_RATELIMIT_RESET, reset);
            }
        }
        headers
    }

    /// The default body: an RFC 9457 problem of type [`QUOTA_EXCEEDED`], with `violated-policies`.
    pub fn problem_json(&self) -> Bytes {
        // Names come escaped from the layer's set-up, so this only appends.
        let mut json = String::with_capacity(256);
        json.push_str(PROBLEM_HEAD);
        if let Some(retry) = self.retry_after_secs() {
            json.push_str("The request exceeds the quota of ");
            push_names(
                &mut json,
                &self.violated().map(|p| &*p.json_name).collect::<Vec<_>>(),
            );
            json.push_str("; retry in ");
            push_decimal(&mut json, retry);
            json.push_str(if retry == 1 {
                " second.\""
            } else {
                " seconds.\""
            });
        } else {
            json.push_str("The request costs more than ");
            push_names(
                &mut json,
                &self
                    .unadmittable()
                    .map(|(p, _)| &*p.json_name)
                    .collect::<Vec<_>>(),
            );
            json.push_str(" can ever admit at once (");
            for (i, (_, e)) in self.unadmittable().enumerate() {
                if i > 0 {
                    json.push_str("; ");
                }
                push_decimal(&mut json, e.requested().into());
                json.push_str(" permits asked, at most ");
                push_decimal(&mut json, e.capacity().into());
            }
            json.push_str("); it will never be admitted.\"");
        }
        json.push_str(",\"violated-policies\":[");
        for (i, p) in self.violated().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push('"');
            json.push_str(&p.json_name);
            json.push('"');
        }
        json.push_str("]}");
        Bytes::from(json)
    }

    /// The default answer: `429 Too Many Requests` with [`headers`](Self::headers) and
    /// [`problem_json`](Self::problem_json).
    pub fn default_response(&self) -> Response<Bytes> {
        let mut response = Response::new(self.problem_json());
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let mut headers = self.headers();
        headers.insert(CONTENT_TYPE, PROBLEM_JSON);
        *response.headers_mut() = headers;
        response
    }

    pub(crate) fn respond(&self) -> Response<Bytes> {
        match &self.meta.on_refusal {
            Some(hook) => hook.on_refusal(self),
            None => self.default_response(),
        }
    }
}

impl fmt::Debug for Refusal<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refusal")
            .field("method", &self.request.method)
            .field("uri", &self.request.uri)
            .field("decisions", &self.decisions().collect::<Vec<_>>())
            .finish()
    }
}

/// A problem+json answer for a request the layer could not judge (no key, or a failed limiter).
pub(crate) fn problem_response(status: StatusCode, detail: &str) -> Response<Bytes> {
    let mut json = String::with_capacity(128 + detail.len());
    json.push_str("{\"type\":\"about:blank\",\"title\":");
    json_string(&mut json, status.canonical_reason().unwrap_or("Error"));
    let _ = write!(json, ",\"status\":{},\"detail\":", status.as_u16());
    json_string(&mut json, detail);
    json.push('}');
    let mut response = Response::new(Bytes::from(json));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// `RateLimit-Policy: "name";q=..;w=.., ...`: one [`write_policy_item`] per advertised policy
/// that `included` names, with the quota `quota` gives it.
fn policy_header(
    policies: &[PolicyInfo],
    included: impl Fn(usize) -> bool,
    quota: impl Fn(usize) -> Quota,
) -> Option<HeaderValue> {
    let mut value = ValueBuf::new();
    for (i, p) in policies.iter().enumerate() {
        if p.advertised() && included(i) {
            write_policy_item(&mut value, &p.sf_name, &quota(i));
        }
    }
    if value.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(value.as_bytes()).ok()
}

/// `RateLimit: "name";r=..;t=.., ...`: one [`write_ratelimit_item`] per advertised policy that
/// decided, with the quota `quota` gives it.
///
/// On a refusal (`refused`) only the violated policies are listed (see [`service_limit`]): the
/// policies that admitted a refused request were given their permits back, so their state is the
/// one the client's previous response described. On an admitted response, an advertised shadow
/// policy that would have refused says `r=0` and its own wait.
fn ratelimit_header(
    policies: &[PolicyInfo],
    outcomes: &[Outcome],
    refused: bool,
    quota: impl Fn(usize) -> Quota,
) -> Option<HeaderValue> {
    // Built on the stack and copied once into the header value: this runs for every admitted
    // request.
    let mut value = ValueBuf::new();
    for (i, (p, o)) in policies.iter().zip(outcomes).enumerate() {
        if !p.advertised() || (refused && !p.enforced()) {
            continue;
        }
        if let Some(d) = o.decision() {
            write_ratelimit_item(&mut value, &p.sf_name, &quota(i), d, refused);
        }
    }
    if value.is_empty() {
        return None;
    }
    cut_value(value.as_bytes())
}

/// How many bytes of header values a thread cuts from one allocation (see [`cut_value`]).
const CHUNK: usize = 512;

thread_local! {
    /// The rest of this thread's current chunk (see [`cut_value`]).
    static VALUE_CHUNK: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// `bytes` as a header value, cut from a chunk of [`CHUNK`] bytes that the thread's values share,
/// or in its own allocation if it is longer than a quarter of a chunk.
///
/// Every admitted response carries a `RateLimit` value of its own; allocating each one, and
/// freeing it once the response is written, cost more than building it. A value cut from a
/// chunk is one reference count, and the chunk is freed when its last value is. The price is
/// that a value kept long after its response (by a cache that stores responses) keeps up to
/// [`CHUNK`] bytes alive rather than its own twenty-odd.
fn cut_value(bytes: &[u8]) -> Option<HeaderValue> {
    if bytes.len() <= CHUNK / 4 {
        let cut = VALUE_CHUNK.try_with(|chunk| {
            let mut chunk = chunk.try_borrow_mut().ok()?;
            if chunk.capacity() - chunk.len() < bytes.len() {
                *chunk = BytesMut::with_capacity(CHUNK);
            }
            chunk.extend_from_slice(bytes);
            HeaderValue::from_maybe_shared(chunk.split().freeze()).ok()
        });
        if let Ok(Some(value)) = cut {
            return Some(value);
        }
    }
    HeaderValue::from_bytes(bytes).ok()
}

/// Appends one Quota Policy Item, `"name";q=<q>;w=<w>`, to a `RateLimit-Policy` list (with the
/// `", "` separator if the list is not empty). `sf_name` is the name already written as a
/// Structured Field String. The values are [`advertised_policy`]'s.
fn write_policy_item(buf: &mut ValueBuf, sf_name: &str, quota: &Quota) {
    let (q, w) = advertised_policy(quota);
    buf.push_item(sf_name.as_bytes(), (b";q=", q), (b";w=", w));
}

/// Appends one Service Limit Item, `"name";r=<r>;t=<t>`, to a `RateLimit` list (with the `", "`
/// separator if the list is not empty), or nothing where [`service_limit`] lists nothing.
/// `refused` says whether the response is the refusal (a 429) rather than an admitted response.
fn write_ratelimit_item(
    buf: &mut ValueBuf,
    sf_name: &str,
    quota: &Quota,
    decision: &Decision,
    refused: bool,
) {
    if let Some((r, t)) = service_limit(quota, decision, refused) {
        buf.push_item(sf_name.as_bytes(), (b";r=", r), (b";t=", t));
    }
}

/// Whether the policy at `i` took part in the decision whose outcomes these are (rather than
/// sitting it out, at a cost of zero or without a key).
#[inline]
fn took_part(outcomes: &[Outcome], i: usize) -> bool {
    !matches!(outcomes.get(i), None | Some(Outcome::Skipped))
}

/// The `(q, w)` a policy advertises in `RateLimit-Policy`.
///
/// Draft-ietf-httpapi-ratelimit-headers-11 allows only whole seconds in `w`, so `w` is the
/// quota's period rounded up to whole seconds (at least 1), and `q` is what the quota grants in
/// `w` seconds at its own rate, `permits · w / period`, rounded down: `q/w` is never a faster
/// rate than the quota's, and it is the quota's exact rate whenever `permits · w / period` is a
/// whole number (every period of whole seconds, `5 per 200 ms` as `q=25;w=1`, `3 per 1.5 s` as
/// `q=4;w=2`). Both are at most [`SF_INTEGER_MAX`]; a `q` cut down to it states a slower rate
/// than the real one, never a faster. Since `w ≥ period`, `q ≥ permits ≥ 1`.
///
/// The burst is not advertised: `q` is the rate a client may keep up for ever; a GCRA burst
/// above `permits` is slack on top of it.
fn advertised_policy(quota: &Quota) -> (u64, u64) {
    const NANOS_PER_SEC: u64 = 1_000_000_000;
    let period = quota.period_nanos();
    let w = period.div_ceil(NANOS_PER_SEC).max(1);
    let permits = u64::from(quota.permits());
    let q = if period == w * NANOS_PER_SEC {
        permits
    } else {
        mul_div_floor(permits, w * NANOS_PER_SEC, period)
    };
    (q.min(SF_INTEGER_MAX), w.min(SF_INTEGER_MAX))
}

/// The `(r, t)` of one policy's Service Limit Item, or `None` where the item is left out.
///
/// * A policy that refused this request: `r=0`, and `t` its own `Retry-After`,
///   `max(1, ceil(retry_after))`: the time until it admits again, so the response's
///   `Retry-After` (the longest of these) never ends before any listed window.
/// * A policy that admitted, on an admitted response: `r` is the permits left, at most `q`
///   (a GCRA burst above `permits` is not reported beyond what the policy advertises), and `t`
///   is the later of when the key is whole again (`ceil(reset_after)`) and the time the
///   advertised rate takes to grant `r` (`ceil(r · w / q)`), and at least 1. So `r/t` never
///   states a faster rate than `q/w`, and any `r` requests sent within `t` are admitted, since
///   `r` never exceeds what the limiter has left now.
/// * A policy that admitted, on a refusal: left out. Its admission was given back, so the
///   decision no longer describes the key, and a window it listed would have to end before the
///   response's `Retry-After`, which only the violated policies decide.
fn service_limit(quota: &Quota, decision: &Decision, refused: bool) -> Option<(u64, u64)> {
    if !decision.allowed {
        return Some((0, decision.retry_after_secs().min(SF_INTEGER_MAX)));
    }
    if refused {
        return None;
    }
    let (q, w) = advertised_policy(quota);
    let r = decision.remaining.min(q);
    // `q ≥ 1` (see `advertised_policy`).
    let earn = mul_div_ceil(r, w, q);
    let t = ceil_secs(decision.reset_after).max(earn).max(1);
    Some((r, t.min(SF_INTEGER_MAX)))
}

/// `a · b / c` rounded down (`c > 0`), saturating at `u64::MAX`.
fn mul_div_floor(a: u64, b: u64, c: u64) -> u64 {
    match a.checked_mul(b) {
        Some(product) => product / c,
        None => u64::try_from(u128::from(a) * u128::from(b) / u128::from(c)).unwrap_or(u64::MAX),
    }
}

/// `a · b / c` rounded up (`c > 0`), saturating at `u64::MAX`.
fn mul_div_ceil(a: u64, b: u64, c: u64) -> u64 {
    match a.checked_mul(b) {
        Some(product) => product.div_ceil(c),
        None => u64::try_from((u128::from(a) * u128::from(b)).div_ceil(u128::from(c)))
            .unwrap_or(u64::MAX),
    }
}

/// The bytes of a header value, on the stack while they fit in 128 bytes (one policy with a
/// name of up to 64 characters always does), on the heap beyond.
struct ValueBuf {
    inline: [u8; 128],
    len: usize,
    spilled: Vec<u8>,
}

impl ValueBuf {
    fn new() -> Self {
        Self {
            inline: [0; 128],
            len: 0,
            spilled: Vec::new(),
        }
    }

    #[inline]
    fn push(&mut self, bytes: &[u8]) {
        if self.spilled.is_empty() {
            if let Some(room) = self.inline.get_mut(self.len..self.len + bytes.len()) {
                room.copy_from_slice(bytes);
                self.len += bytes.len();
                return;
            }
        }
        self.push_spilled(bytes);
    }

    #[cold]
    #[inline(never)]
    fn push_spilled(&mut self, bytes: &[u8]) {
        if self.spilled.is_empty() {
            self.spilled.reserve(2 * (self.len + bytes.len()));
            self.spilled.extend_from_slice(&self.inline[..self.len]);
        }
        self.spilled.extend_from_slice(bytes);
    }

    /// Appends one list item, `[", "]<name><first.0><first.1><second.0><second.1>` (the `", "`
    /// separator if the list is not empty; `name` already a Structured Field String). An item
    /// that fits in the inline buffer (one of a name of up to 64 characters always does) is
    /// written straight into it, the numbers' digits in place: this runs for every admitted
    /// response, where a push per piece cost three times as much.
    #[inline]
    fn push_item(&mut self, name: &[u8], first: (&[u8; 3], u64), second: (&[u8; 3], u64)) {
        let first_item = self.is_empty();
        let most = 2 + name.len() + 2 * (3 + MAX_DIGITS);
        let room = if self.spilled.is_empty() {
            self.inline.get_mut(self.len..self.len + most)
        } else {
            None
        };
        let Some(room) = room else {
            if !first_item {
                self.push(b", ");
            }
            self.push(name);
            self.push(first.0);
            self.push_u64(first.1);
            self.push(second.0);
            self.push_u64(second.1);
            return;
        };
        // The fixed pieces are copied at their constant lengths, so as plain stores.
        let mut at = 0;
        if !first_item {
            room[..2].copy_from_slice(b", ");
            at = 2;
        }
        room[at..at + name.len()].copy_from_slice(name);
        at += name.len();
        room[at..at + 3].copy_from_slice(first.0);
        at += 3;
        at += write_decimal(&mut room[at..], first.1);
        room[at..at + 3].copy_from_slice(second.0);
        at += 3;
        at += write_decimal(&mut room[at..], second.1);
        self.len += at;
    }

    /// Appends the decimal digits of `n`.
    #[inline]
    fn push_u64(&mut self, n: u64) {
        self.push(decimal(n, &mut [0; MAX_DIGITS]));
    }

    fn as_bytes(&self) -> &[u8] {
        if self.spilled.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spilled
        }
    }

    fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (seconds) of the policy that binds: on a
/// refusal the violated one with the longest wait, otherwise the advertised one with the fewest
/// permits left.
fn legacy_values(
    policies: &[PolicyInfo],
    outcomes: &[Outcome],
    refused: bool,
) -> Option<[HeaderValue; 3]> {
    let decided = policies
        .iter()
        .zip(outcomes)
        .filter(|(p, _)| p.advertised());
    let binding = if refused {
        decided
            .filter_map(|(p, o)| match o {
                Outcome::Refused(d) if p.enforced() => Some(d),
                _ => None,
            })
            .max_by_key(|d| d.retry_after)
            .map(|d| (d.limit, 0, d.retry_after_secs()))
    } else {
        decided
            .filter_map(|(_, o)| match o {
                Outcome::Admitted(d) => Some((d.limit, d.remaining, ceil_secs(d.reset_after))),
                Outcome::Refused(d) => Some((d.limit, 0, d.retry_after_secs())),
                _ => None,
            })
            .min_by_key(|&(_, remaining, reset)| (remaining, std::cmp::Reverse(reset)))
    };
    binding.map(|(limit, remaining, reset)| {
        [
            number_value(limit),
            number_value(remaining),
            number_value(reset),
        ]
    })
}

/// Appends `'a'`, `'a' and 'b'`, `'a', 'b' and 'c'`.
fn push_names(json: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            json.push_str(if i + 1 == names.len() { " and " } else { ", " });
        }
        json.push('\'');
        json.push_str(name);
        json.push('\'');
    }
}

/// `n` as a header value; values below 100 (the common `Retry-After`s and `X-RateLimit-*`
/// values) without allocating.
fn number_value(n: u64) -> HeaderValue {
    const TWO_DIGITS: &str = "000102030405060708091011121314151617181920212223242526272829\
        30313233343536373839404142434445464748495051525354555657585960616263646566676869\
        707172737475767778798081828384858687888990919293949596979899";
    match usize::try_from(n) {
        Ok(n @ 0..=9) => HeaderValue::from_static(&TWO_DIGITS[2 * n + 1..2 * n + 2]),
        Ok(n @ 10..=99) => HeaderValue::from_static(&TWO_DIGITS[2 * n..2 * n + 2]),
        _ => HeaderValue::from(n),
    }
}

/// `00`, `01`, ... `99`: two digits per step from a table, half the multiply-shift divisions of
/// one digit a step, for the numbers of up to ten digits every admitted response carries.
const DIGIT_PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
                                  2021222324252627282930313233343536373839\
                                  4041424344454647484950515253545556575859\
                                  6061626364656667686970717273747576777879\
                                  8081828384858687888990919293949596979899";

/// The decimal digits of `n` (without `core::fmt`, which is slow on these hot paths).
fn decimal(n: u64, buf: &mut [u8; MAX_DIGITS]) -> &[u8] {
    let len = write_decimal(buf, n);
    &buf[..len]
}

/// The most decimal digits of a `u64`.
const MAX_DIGITS: usize = 20;

/// Writes the decimal digits of `n` at the start of `out` (at least [`MAX_DIGITS`] long) and
/// says how many: counted first, then written in place from the last, two at a time.
#[inline]
fn write_decimal(out: &mut [u8], n: u64) -> usize {
    let digits = n.checked_ilog10().map_or(1, |log| log as usize + 1);
    let out = &mut out[..digits];
    let mut n = n;
    let mut i = digits;
    while i >= 2 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        out[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if i == 1 {
        out[0] = b'0' + n as u8;
    }
    digits
}

/// Appends the decimal digits of `n`.
fn push_decimal(out: &mut String, n: u64) {
    // Digits are ASCII, so they are always UTF-8.
    out.push_str(std::str::from_utf8(decimal(n, &mut [0; MAX_DIGITS])).unwrap_or_default());
}

/// Appends `s` (printable ASCII) as a Structured Field String (RFC 9651 §4.1.6).
fn sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// Appends `s` as a JSON string.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    json_escaped(out, s);
    out.push('"');
}

/// Appends `s` escaped for the inside of a JSON string: runs that need no escape are copied
/// whole.
fn json_escaped(out: &mut String, s: &str) {
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        // Every byte that needs an escape is ASCII, so `run..i` and `i + 1..` are on char
        // boundaries.
        out.push_str(&s[run..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{:04x}", b);
        } else {
            out.push_str(escape);
        }
        run = i + 1;
    }
    out.push_str(&s[run..]);
}

pin_project! {
    /// The response body of a rate-limited service: the inner service's body, or the body of an
    /// answer the layer made itself.
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        let data = if data.is_empty() { None } else { Some(data) };
        Self {
            kind: Kind::Full { data },
        }
    }
}

impl<B> fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("RateLimitBody::Inner"),
            Kind::Full { data } => f
                .debug_struct("RateLimitBody::Full")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for RateLimitBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_written_in_full() {
        let powers = (0..20).flat_map(|e| {
            let p = 10u64.pow(e);
            [p - 1, p, p + 1]
        });
        for n in [
            0,
            7,
            10,
            99,
            100,
            12_345,
            999_999_999,
            SF_INTEGER_MAX,
            u64::MAX,
        ]
        .into_iter()
        .chain(powers)
        {
            let mut v = ValueBuf::new();
            v.push_u64(n);
            assert_eq!(v.as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn numbers_are_written_in_full() {
        for n in (0..=1_000).chain([12_345, u64::MAX]) {
            assert_eq!(number_value(n), HeaderValue::from(n), "{n}");
        }
    }

    #[test]
    fn the_problem_head_is_the_escaped_type_and_title() {
        let mut head = String::from("{\"type\":");
        json_string(&mut head, QUOTA_EXCEEDED);
        head.push_str(",\"title\":\"Quota Exceeded\",\"status\":429,\"detail\":\"");
        assert_eq!(PROBLEM_HEAD, head);
    }

    #[test]
    fn json_strings_read_back_as_written() {
        let mut samples: Vec<String> = (0u8..0x80).map(|b| format!("x{}y", b as char)).collect();
        samples.extend(
            [
                "",
                "plain",
                "é\"ü\\",
                "\u{1}\u{1f}\u{7f}",
                "tab\tnew\nline\r",
                "日本\"語",
            ]
            .map(String::from),
        );
        for sample in samples {
            let mut json = String::new();
            json_string(&mut json, &sample);
            let back: String = serde_json::from_str(&json).unwrap();
            assert_eq!(back, sample, "{json}");
        }
    }

    proptest::proptest! {
        /// Items written in place read as the same items written piece by piece, whatever the
        /// names and numbers, as the list grows past the inline buffer and spills.
        #[test]
        fn items_read_as_written(
            items in proptest::collection::vec(("[ -~]{1,64}", proptest::num::u64::ANY, 0u64..1000), 1..12)
        ) {
            let mut v = ValueBuf::new();
            let mut expected = String::new();
            for (name, r, t) in &items {
                let mut sf_name = String::new();
                sf_string(&mut sf_name, name);
                v.push_item(sf_name.as_bytes(), (b";r=", *r), (b";t=", *t));
                if !expected.is_empty() {
                    expected.push_str(", ");
                }
                expected.push_str(&format!("{sf_name};r={r};t={t}"));
                proptest::prop_assert_eq!(std::str::from_utf8(v.as_bytes()).unwrap(), expected.as_str());
            }
        }
    }

    proptest::proptest! {
        /// Values cut from the thread's chunks keep their own bytes, however many are cut, of
        /// whatever lengths (across chunk boundaries and past the size that gets its own
        /// allocation), while all of them are kept alive together; and bytes a header value may
        /// not hold are refused, as `HeaderValue::from_bytes` refuses them.
        #[test]
        fn cut_values_keep_their_own_bytes(
            values in proptest::collection::vec(proptest::collection::vec(
                proptest::prop_oneof![50 => 0x20u8..0x7f, 1 => proptest::num::u8::ANY], 0..100), 1..400)
        ) {
            let cut: Vec<_> = values.iter().map(|v| cut_value(v)).collect();
            for (value, cut) in values.iter().zip(&cut) {
                let expected = HeaderValue::from_bytes(value).ok();
                proptest::prop_assert_eq!(cut.as_ref().map(HeaderValue::as_bytes), expected.as_ref().map(HeaderValue::as_bytes));
            }
        }
    }

    #[test]
    fn a_value_longer_than_the_stack_buffer_moves_to_the_heap_whole() {
        let mut v = ValueBuf::new();
        let mut expected = String::new();
        for i in 0..40u64 {
            v.push(b"\"p\";r=");
            v.push_u64(i * 1_000_003);
            expected.push_str(&format!("\"p\";r={}", i * 1_000_003));
            assert_eq!(v.as_bytes(), expected.as_bytes());
        }
        assert!(expected.len() > 128);
    }

    #[test]
    fn sf_and_json_strings_escape() {
        let mut s = String::new();
        sf_string(&mut s, r#"a "b" \c"#);
        assert_eq!(s, r#""a \"b\" \\c""#);
        let mut j = String::new();
        json_string(&mut j, "a\"\\\n\u{1}é");
        assert_eq!(j, "\"a\\\"\\\\\\n\\u0001é\"");
    }

    #[test]
    fn the_policy_header_states_each_quota_at_its_real_rate_in_whole_seconds() {
        let p = |n: &str, q| PolicyInfo::new(n, q, Shadow::Off, false);
        let ms = std::time::Duration::from_millis;
        let policies = [
            p("a", Quota::per_second(10).unwrap()),
            p("b", Quota::with_period(3, ms(1500)).unwrap()),
            p("c", Quota::per_hour(1000).unwrap()),
            p("d", Quota::with_period(5, ms(200)).unwrap()),
        ];
        let header = policy_header(&policies, |_| true, |i| policies[i].quota).unwrap();
        assert_eq!(
            header,
            "\"a\";q=10;w=1, \"b\";q=4;w=2, \"c\";q=1000;w=3600, \"d\";q=25;w=1"
        );
        assert!(policy_header(&[], |_| true, |_| unreachable!()).is_none());
        let only_b = policy_header(&policies, |i| i == 1, |i| policies[i].quota).unwrap();
        assert_eq!(only_b, "\"b\";q=4;w=2");
    }

    #[test]
    fn advertised_quotas_round_down_and_stay_structured_field_integers() {
        use std::time::Duration;
        let q = |permits, nanos| {
            advertised_policy(&Quota::with_period(permits, Duration::from_nanos(nanos)).unwrap())
        };
        // 1 per 1.5 s: 1.33 per 2 s, rounded down.
        assert_eq!(q(1, 1_500_000_000), (1, 2));
        // 7 per 0.3 s is 23.33 per second.
        assert_eq!(q(7, 300_000_000), (23, 1));
        // One nanosecond past a second: two seconds hold 1.999999998 periods.
        assert_eq!(q(1, 1_000_000_001), (1, 2));
        // u32::MAX per nanosecond is far beyond 15 digits: cut to the largest integer.
        assert_eq!(q(u32::MAX, 1), (SF_INTEGER_MAX, 1));
        // The longest period: 2^60 ns, just over 1.15e9 s.
        // w is slightly longer than the period, so it holds one permit more.
        assert_eq!(
            q(u32::MAX, 1 << 60),
            (u64::from(u32::MAX) + 1, 1_152_921_505)
        );
        assert_eq!(q(1, 1 << 60), (1, 1_152_921_505));
    }

    #[test]
    fn service_limits_never_report_more_than_the_policy_nor_a_faster_rate() {
        use std::time::Duration;
        let quota = Quota::per_hour(1000).unwrap();
        let admitted = |remaining, reset| Decision::allowed(1000, remaining, reset);
        // After one request of a fresh 1000/h GCRA key: 999 left, whole again in 3.6 s. The
        // window is the time 999 permits take at 1000/h, not 3.6 s.
        assert_eq!(
            service_limit(&quota, &admitted(999, Duration::from_millis(3600)), false),
            Some((999, 3597))
        );
        // A burst beyond the quota is not reported beyond `q`.
        let bursty = Quota::per_second(1).unwrap().with_burst(10).unwrap();
        assert_eq!(
            service_limit(
                &bursty,
                &Decision::allowed(10, 9, Duration::from_secs(1)),
                false
            ),
            Some((1, 1))
        );
        // Nothing left: the window lasts until the key is whole again, at least a second.
        assert_eq!(
            service_limit(&quota, &admitted(0, Duration::from_secs(3600)), false),
            Some((0, 3600))
        );
        assert_eq!(
            service_limit(&quota, &admitted(0, Duration::ZERO), false),
            Some((0, 1))
        );
        // A refusal: nothing left until it admits again.
        let refused = Decision::refused(1000, 0, Duration::from_millis(3_500), Duration::ZERO);
        assert_eq!(service_limit(&quota, &refused, true), Some((0, 4)));
        assert_eq!(service_limit(&quota, &refused, false), Some((0, 4)));
        // An admission vetoed by another policy is not listed on the refusal.
        assert_eq!(
            service_limit(&quota, &admitted(5, Duration::from_secs(1)), true),
            None
        );
        // Huge values stay within 15 digits.
        let huge = Quota::with_period(u32::MAX, Duration::from_nanos(1)).unwrap();
        let d = Decision::allowed(u64::MAX, u64::MAX, Duration::MAX);
        assert_eq!(
            service_limit(&huge, &d, false),
            Some((SF_INTEGER_MAX, SF_INTEGER_MAX))
        );
        let d = Decision::refused(1, 0, Duration::MAX, Duration::MAX);
        assert_eq!(service_limit(&huge, &d, true), Some((0, SF_INTEGER_MAX)));
    }

    #[test]
    fn products_beyond_64_bits_are_divided_exactly() {
        assert_eq!(mul_div_floor(u64::MAX, 3, 3), u64::MAX);
        assert_eq!(mul_div_ceil(u64::MAX, 3, 6), u64::MAX / 2 + 1);
        assert_eq!(mul_div_floor(u64::MAX, u64::MAX, 1), u64::MAX);
        assert_eq!(mul_div_ceil(7, 3, 2), 11);
        assert_eq!(mul_div_floor(7, 3, 2), 10);
    }
}
