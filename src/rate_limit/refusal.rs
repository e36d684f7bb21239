//! A refused request and the default answer to it: `429 Too Many Requests` with the rate-limit
//! headers and a problem+json body. An [`OnRefusal`](super::OnRefusal) hook renders it otherwise.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use super::decide::Outcome;
use super::headers::{refusal_headers, SF_INTEGER_MAX};
use super::policy::PolicyInfo;
use super::problem::{refusal_problem, PROBLEM_JSON};
use super::settings::Settings;
use crate::decision::{retry_after_secs, Decision, InsufficientCapacity};
use crate::head::RequestHead;

/// A refused request, as the [`OnRefusal`](super::OnRefusal) hook sees it.
pub struct Refusal<'a> {
    pub(crate) settings: &'a Settings,
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
    /// them (draft-ietf-httpapi-ratelimit-headers-11, section 6). So a wait of a limiter of your
    /// own past what `t` can say, 999 999 999 999 999 seconds (a Structured Field Integer, some
    /// 31.7 million years), is said as that here too.
    pub fn retry_after_secs(&self) -> Option<u64> {
        // Rounding up is monotonic: the longest wait rounded is the longest of those rounded.
        self.retry_after()
            .map(|wait| retry_after_secs(wait).min(SF_INTEGER_MAX))
    }

    /// The exact wait until the request could be admitted: the longest of the violated
    /// policies' `retry_after` (what [`retry_after_secs`](Self::retry_after_secs) rounds up);
    /// `None` when no wait would help.
    pub fn retry_after(&self) -> Option<Duration> {
        if self.unadmittable().next().is_some() {
            return None;
        }
        self.enforced()
            .filter_map(|(_, o)| match o {
                Outcome::Refused(d) => Some(d.retry_after),
                _ => None,
            })
            .max()
    }

    /// The names of the policies that refused the request, in the layer's order.
    pub fn violated_policies(&self) -> impl Iterator<Item = &'a str> + Clone + 'a {
        let policies = &self.settings.policies;
        self.violated().map(move |i| &*policies[i].name)
    }

    /// Every policy's name with its decision (`None` where the policy made none: its limiter
    /// failed and the layer fails open, the request cost it nothing, or costs more than it can
    /// ever admit). Admissions listed here have been given back. Shadow policies are listed
    /// too.
    pub fn decisions(&self) -> impl Iterator<Item = (&'a str, Option<&'a Decision>)> + 'a {
        let policies = self.settings.policies.iter();
        policies
            .zip(self.outcomes)
            .map(|(p, o)| (&*p.name, o.decision()))
    }

    /// The headers of the default answer: `Retry-After`, `RateLimit-Policy`, `RateLimit` (the
    /// violated policies only, each with what it has left, fewer permits than the request asked
    /// for, and its own wait as `t`), and the legacy `X-RateLimit-*` ones if they are turned on.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(6);
        if let Some(retry) = self.retry_after_secs() {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry));
        }
        refusal_headers(self, &mut headers);
        headers
    }

    /// The default body: an RFC 9457 problem naming the `violated-policies`. Of type
    /// `https://iana.org/assignments/http-problem-types#quota-exceeded` (status 429) when a wait
    /// helps; when none does (the request costs more than a violated policy can ever admit at
    /// once), of type `about:blank` with status 413 and `largest-cost`, the most the strictest
    /// such policy admits.
    pub fn problem_json(&self) -> Bytes {
        let unadmittable = self.unadmittable().map(|(p, e)| (&*p.name, e));
        refusal_problem(
            self.violated_policies(),
            self.retry_after_secs(),
            unadmittable,
        )
    }

    /// The default answer: `429 Too Many Requests` with [`headers`](Self::headers) and
    /// [`problem_json`](Self::problem_json), or `413 Content Too Large` when no wait helps (see
    /// [`retry_after`](Self::retry_after)): clients retry a 429, and a request that can never be
    /// admitted must not be retried as it is. For a gRPC call (feature `grpc`), the
    /// trailers-only `RESOURCE_EXHAUSTED` with the wait in `grpc-retry-pushback-ms` (`-1`, do not
    /// retry, when no wait helps) and a `RetryInfo`, so a hook that answers only some requests
    /// itself falls back to what the layer would send.
    pub fn default_response(&self) -> Response<Bytes> {
        #[cfg(feature = "grpc")]
        if super::grpc::is_grpc(&self.request) {
            return super::grpc::refusal(self);
        }
        let mut response = Response::new(self.problem_json());
        *response.status_mut() = match self.retry_after() {
            Some(_) => StatusCode::TOO_MANY_REQUESTS,
            None => StatusCode::PAYLOAD_TOO_LARGE,
        };
        let mut headers = self.headers();
        headers.insert(CONTENT_TYPE, PROBLEM_JSON);
        *response.headers_mut() = headers;
        response
    }

    /// The answer to send: the layer's hook's, or the default.
    pub(crate) fn respond(&self) -> Response<Bytes> {
        // Whatever built the limiters, in code or from a file (whose `Observed` limiters also
        // log their own refusals, with the key).
        tracing::debug!(
            target: "tower_bulwark::rate_limit",
            policies = ?self.violated_policies().collect::<Vec<_>>(),
            retry_after_secs = self.retry_after_secs(),
            "rate limit: refusing the request"
        );
        match &self.settings.on_refusal {
            Some(hook) => hook.on_refusal(self),
            None => self.default_response(),
        }
    }

    /// The places in the layer of the policies that refused the request (those
    /// [`violated_policies`](Self::violated_policies) names).
    pub(crate) fn violated(&self) -> impl Iterator<Item = usize> + Clone + 'a {
        let policies = self.settings.policies.iter();
        (policies.zip(self.outcomes).enumerate())
            .filter(|(_, (p, o))| p.enforced() && o.refused())
            .map(|(i, _)| i)
    }

    /// Enforced (not shadow) policies with their outcomes.
    fn enforced(&self) -> impl Iterator<Item = (&'a PolicyInfo, &'a Outcome)> + Clone + 'a {
        let policies = self.settings.policies.iter();
        policies.zip(self.outcomes).filter(|(p, _)| p.enforced())
    }

    fn unadmittable(
        &self,
    ) -> impl Iterator<Item = (&'a PolicyInfo, InsufficientCapacity)> + Clone + 'a {
        self.enforced().filter_map(|(p, o)| match o {
            Outcome::Unadmittable(e) => Some((p, *e)),
            _ => None,
        })
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
