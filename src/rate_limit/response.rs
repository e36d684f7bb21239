//! What the layer answers: the 429 with its headers and problem+json body, the rate-limit headers
//! of admitted responses, and the response body type.

use std::fmt;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::decision::ceil_secs;
use crate::{Decision, Quota};

/// `RateLimit-Policy`: the quota policies of the route (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: what is left of each policy for this client.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit` (opt-in).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining` (opt-in).
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset`, in seconds from now (opt-in).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The problem type of a refusal, registered by the rate-limit headers draft.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// The start of every refusal's problem+json body, up to the first policy name in `detail`.
/// (`QUOTA_EXCEEDED` needs no JSON escapes; a test checks this is what escaping would write.)
const PROBLEM_HEAD: &str =
    "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\
    \"title\":\"Quota exceeded\",\"status\":429,\"detail\":\"The request exceeds the quota of ";

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
///     let mut response = Response::new(Bytes::from(format!(
///         "slow down; come back in {} s\n",
///         refusal.retry_after_secs()
///     )));
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
pub(crate) struct PolicyInfo {
    pub(crate) name: Box<str>,
    /// The name as a Structured Field String, quotes included.
    pub(crate) sf_name: Box<str>,
    /// The name escaped for the inside of a JSON string, without quotes.
    pub(crate) json_name: Box<str>,
    pub(crate) quota: Quota,
}

impl PolicyInfo {
    pub(crate) fn new(name: &str, quota: Quota) -> Self {
        let mut sf_name = String::with_capacity(name.len() + 2);
        sf_string(&mut sf_name, name);
        let mut json_name = String::with_capacity(name.len());
        json_escaped(&mut json_name, name);
        Self {
            name: name.into(),
            sf_name: sf_name.into_boxed_str(),
            json_name: json_name.into_boxed_str(),
            quota,
        }
    }
}

/// What one policy said about one request.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    /// Admitted, holding a permit (possibly one that falls due after `wait`).
    Admitted(Decision),
    /// Refused.
    Refused(Decision),
    /// The limiter failed and the layer fails open: no decision.
    Failed,
}

impl Outcome {
    fn decision(&self) -> Option<&Decision> {
        match self {
            Outcome::Admitted(d) | Outcome::Refused(d) => Some(d),
            Outcome::Failed => None,
        }
    }
}

/// Settings of a layer that do not depend on its type parameters.
#[derive(Clone)]
pub(crate) struct Meta {
    pub(crate) policies: Vec<PolicyInfo>,
    /// `RateLimit-Policy` for the quotas in `policies` (those of the limiters when the layer was
    /// built); `None` without policies.
    pub(crate) policy_header: Option<HeaderValue>,
    /// `RateLimit-Policy` for the quotas seen at the latest response after a limiter changed its
    /// quota (see [`policy_header_now`](Self::policy_header_now)); shared by every clone.
    pub(crate) changed_policy: Arc<ArcSwapOption<ChangedPolicy>>,
    pub(crate) admitted_headers: bool,
    pub(crate) legacy_headers: bool,
    pub(crate) on_key_error: super::FailMode,
    pub(crate) on_limiter_error: super::FailMode,
    pub(crate) on_refusal: Option<Arc<dyn OnRefusal>>,
    /// Requests that skip every policy (see [`RateLimitLayer::exempt`](super::RateLimitLayer::exempt)).
    pub(crate) exempt: Option<Arc<Exempt>>,
}

/// Whether a request skips every policy.
pub(crate) type Exempt = dyn Fn(&http::request::Parts) -> bool + Send + Sync;

impl Meta {
    pub(crate) fn new(policies: Vec<PolicyInfo>) -> Self {
        let policy_header = policy_header(&policies);
        Self {
            policies,
            policy_header,
            changed_policy: Arc::default(),
            admitted_headers: true,
            legacy_headers: false,
            on_key_error: super::FailMode::Closed,
            on_limiter_error: super::FailMode::Closed,
            on_refusal: None,
            exempt: None,
        }
    }

    /// Whether `parts` is a request that skips every policy.
    #[inline]
    pub(crate) fn is_exempt(&self, parts: &http::request::Parts) -> bool {
        self.exempt.as_ref().is_some_and(|exempt| exempt(parts))
    }

    /// The headers of an admitted response, or `None` if they are turned off. `quota_of(i)` is
    /// the quota policy `i`'s limiter enforces now.
    #[inline]
    pub(crate) fn admitted_headers(
        &self,
        outcomes: &[Outcome],
        quota_of: impl Fn(usize) -> Quota,
    ) -> Option<AdmittedHeaders> {
        if self.admitted_headers {
            self.build_admitted_headers(outcomes, quota_of)
        } else {
            None
        }
    }

    /// `RateLimit-Policy` for the quotas the limiters enforce now (`quota_of(i)` for policy
    /// `i`). While they are the quotas the layer was built with, the header computed then is
    /// shared (no allocation); once a limiter's quota has changed, the header is built again for
    /// the first response that sees the new quotas and shared by the responses after it.
    pub(crate) fn policy_header_now(
        &self,
        quota_of: impl Fn(usize) -> Quota,
    ) -> Option<HeaderValue> {
        let unchanged = self
            .policies
            .iter()
            .enumerate()
            .all(|(i, p)| p.quota == quota_of(i));
        if unchanged {
            return self.policy_header.clone();
        }
        let current: Box<[Quota]> = (0..self.policies.len()).map(&quota_of).collect();
        if let Some(changed) = &*self.changed_policy.load() {
            if changed.quotas == current {
                return Some(changed.header.clone());
            }
        }
        let header = policy_header_with(&self.policies, |i| current[i])?;
        self.changed_policy.store(Some(Arc::new(ChangedPolicy {
            quotas: current,
            header: header.clone(),
        })));
        Some(header)
    }

    fn build_admitted_headers(
        &self,
        outcomes: &[Outcome],
        quota_of: impl Fn(usize) -> Quota,
    ) -> Option<AdmittedHeaders> {
        let policy = self.policy_header_now(quota_of)?;
        let ratelimit = ratelimit_header(&self.policies, outcomes, false)?;
        let legacy = if self.legacy_headers {
            legacy_values(outcomes, false).map(Box::new)
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
            .field("on_key_error", &self.on_key_error)
            .field("on_limiter_error", &self.on_limiter_error)
            .field("on_refusal", &self.on_refusal.as_ref().map(|_| "custom"))
            .field("exempt", &self.exempt.is_some())
            .finish()
    }
}

/// `RateLimit-Policy` for quotas that differ from those a layer was built with.
#[derive(Debug)]
pub(crate) struct ChangedPolicy {
    quotas: Box<[Quota]>,
    header: HeaderValue,
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
    pub(crate) request: &'a Parts,
    pub(crate) outcomes: &'a [Outcome],
    /// `RateLimit-Policy` for the quotas enforced when the request was refused.
    pub(crate) policy_header: Option<HeaderValue>,
}

impl<'a> Refusal<'a> {
    /// The head of the refused request.
    pub fn request(&self) -> &'a Parts {
        self.request
    }

    /// The value of `Retry-After`: the longest `max(1, ceil(seconds))` over the violated
    /// policies.
    pub fn retry_after_secs(&self) -> u64 {
        self.outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Refused(d) => Some(d.retry_after_secs()),
                _ => None,
            })
            .max()
            .unwrap_or(1)
    }

    /// The names of the policies that refused the request, in the layer's order.
    pub fn violated_policies(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.violated().map(|p| &*p.name)
    }

    fn violated(&self) -> impl Iterator<Item = &'a PolicyInfo> + 'a {
        self.meta
            .policies
            .iter()
            .zip(self.outcomes)
            .filter(|(_, o)| matches!(o, Outcome::Refused(_)))
            .map(|(p, _)| p)
    }

    /// Every policy's name with its decision (`None` where the limiter failed and the layer
    /// fails open). Admissions listed here have been given back.
    pub fn decisions(&self) -> impl Iterator<Item = (&'a str, Option<&'a Decision>)> + 'a {
        self.meta
            .policies
            .iter()
            .zip(self.outcomes)
            .map(|(p, o)| (&*p.name, o.decision()))
    }

    /// The headers of the default answer: `Retry-After`, `RateLimit-Policy`, `RateLimit`, and the
    /// legacy `X-RateLimit-*` ones if they are turned on.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(6);
        headers.insert(RETRY_AFTER, number_value(self.retry_after_secs()));
        if let Some(policy) = &self.policy_header {
            headers.insert(RATELIMIT_POLICY, policy.clone());
        }
        if let Some(ratelimit) = ratelimit_header(&self.meta.policies, self.outcomes, true) {
            headers.insert(RATELIMIT, ratelimit);
        }
        if self.meta.legacy_headers {
            if let Some([limit, remaining, reset]) = legacy_values(self.outcomes, true) {
                headers.insert(X_RATELIMIT_LIMIT, limit);
                headers.insert(X_RATELIMIT_REMAINING, remaining);
                headers.insert(X_RATELIMIT_RESET, reset);
            }
        }
        headers
    }

    /// The default body: an RFC 9457 problem of type [`QUOTA_EXCEEDED`], with `violated-policies`.
    pub fn problem_json(&self) -> Bytes {
        let retry = self.retry_after_secs();
        // Names come escaped from the layer's set-up, so this only appends.
        let violated = || self.violated().map(|p| &*p.json_name);
        let count = violated().count();
        let mut json = String::with_capacity(256);
        json.push_str(PROBLEM_HEAD);
        for (i, name) in violated().enumerate() {
            if i > 0 {
                json.push_str(if i + 1 == count { " and " } else { ", " });
            }
            json.push('\'');
            json.push_str(name);
            json.push('\'');
        }
        json.push_str("; retry in ");
        push_decimal(&mut json, retry);
        json.push_str(if retry == 1 {
            " second.\""
        } else {
            " seconds.\""
        });
        json.push_str(",\"violated-policies\":[");
        for (i, name) in violated().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push('"');
            json.push_str(name);
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

/// `RateLimit-Policy: "name";q=<permits>;w=<period seconds>, ...`.
///
/// `w` is whole seconds; a period that is not a whole number of seconds is rounded up (so a
/// client that spaces its requests by it stays within the quota).
fn policy_header(policies: &[PolicyInfo]) -> Option<HeaderValue> {
    policy_header_with(policies, |i| policies[i].quota)
}

/// [`policy_header`] with `quota_of(i)` as the quota of policy `i`.
fn policy_header_with(
    policies: &[PolicyInfo],
    quota_of: impl Fn(usize) -> Quota,
) -> Option<HeaderValue> {
    if policies.is_empty() {
        return None;
    }
    let mut value = String::with_capacity(32 * policies.len());
    for (i, p) in policies.iter().enumerate() {
        if i > 0 {
            value.push_str(", ");
        }
        let quota = quota_of(i);
        value.push_str(&p.sf_name);
        let window = ceil_secs(quota.period()).clamp(1, SF_INTEGER_MAX);
        let _ = write!(
            value,
            ";q={};w={window}",
            u64::from(quota.permits()).min(SF_INTEGER_MAX)
        );
    }
    HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
}

/// `RateLimit: "name";r=<remaining>;t=<seconds>, ...` for every policy that decided.
///
/// `t` is the time until the policy's quota is whole again (`reset_after`), in whole seconds
/// rounded up; for a policy that refused this request it is that policy's own `Retry-After`, the
/// time until it admits again.
fn ratelimit_header(
    policies: &[PolicyInfo],
    outcomes: &[Outcome],
    refused: bool,
) -> Option<HeaderValue> {
    // Built on the stack and copied once into the header value: this runs for every admitted
    // request.
    let mut value = ValueBuf::new();
    for (p, o) in policies.iter().zip(outcomes) {
        let (d, t) = match o {
            Outcome::Admitted(d) => (d, ceil_secs(d.reset_after)),
            Outcome::Refused(d) => (d, d.retry_after_secs()),
            Outcome::Failed => continue,
        };
        let remaining = if refused && matches!(o, Outcome::Refused(_)) {
            0
        } else {
            d.remaining
        };
        if !value.is_empty() {
            value.push(b", ");
        }
        value.push(p.sf_name.as_bytes());
        value.push(b";r=");
        value.push_u64(remaining.min(SF_INTEGER_MAX));
        value.push(b";t=");
        value.push_u64(t.min(SF_INTEGER_MAX));
    }
    if value.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(value.as_bytes()).ok()
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

    /// Appends the decimal digits of `n`.
    #[inline]
    fn push_u64(&mut self, n: u64) {
        self.push(decimal(n, &mut [0; 20]));
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
/// refusal the violated one with the longest wait, otherwise the one with the fewest permits
/// left.
fn legacy_values(outcomes: &[Outcome], refused: bool) -> Option<[HeaderValue; 3]> {
    let binding = if refused {
        outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Refused(d) => Some(d),
                _ => None,
            })
            .max_by_key(|d| d.retry_after)
            .map(|d| (d.limit, 0, d.retry_after_secs()))
    } else {
        outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Admitted(d) => Some(d),
                _ => None,
            })
            .min_by_key(|d| (d.remaining, std::cmp::Reverse(d.reset_after)))
            .map(|d| (d.limit, d.remaining, ceil_secs(d.reset_after)))
    };
    binding.map(|(limit, remaining, reset)| {
        [
            number_value(limit),
            number_value(remaining),
            number_value(reset),
        ]
    })
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

/// The decimal digits of `n`, written at the end of `buf` (without `core::fmt`, which is slow on
/// these hot paths).
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Appends the decimal digits of `n`.
fn push_decimal(out: &mut String, n: u64) {
    // Digits are ASCII, so they are always UTF-8.
    out.push_str(std::str::from_utf8(decimal(n, &mut [0; 20])).unwrap_or_default());
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
        for n in [0, 7, 10, 99, 100, 12_345, SF_INTEGER_MAX, u64::MAX] {
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
        head.push_str(",\"title\":\"Quota exceeded\",\"status\":429,\"detail\":\"");
        assert!(PROBLEM_HEAD.starts_with(&head), "{PROBLEM_HEAD}");
        assert_eq!(
            &PROBLEM_HEAD[head.len()..],
            "The request exceeds the quota of "
        );
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
    fn policy_header_rounds_windows_up() {
        let p = |n: &str, q| PolicyInfo::new(n, q);
        let header = policy_header(&[
            p("a", Quota::per_second(10).unwrap()),
            p(
                "b",
                Quota::with_period(3, std::time::Duration::from_millis(1500)).unwrap(),
            ),
            p("c", Quota::per_hour(1000).unwrap()),
        ])
        .unwrap();
        assert_eq!(header, "\"a\";q=10;w=1, \"b\";q=3;w=2, \"c\";q=1000;w=3600");
        assert!(policy_header(&[]).is_none());
    }
}
