//! The rate-limit header fields: `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-11, written as RFC 9651 Structured Field lists, one item
//! per policy), and the opt-in legacy `X-RateLimit-*`.

use std::sync::OnceLock;

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use smallvec::SmallVec;

use super::decide::Outcome;
use super::policy::{PolicyInfo, Settle};
use super::refusal::Refusal;
use super::settings::Settings;
use crate::decision::{ceil_secs, Decision};
use crate::Quota;

/// `RateLimit-Policy`: the quota policies of the route (draft-ietf-httpapi-ratelimit-headers-11).
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: the service limit of each policy for this client: the quota available (`r`) and
/// the effective window (`t`) within which the client should use no more than that.
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit` (opt-in).
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining` (opt-in).
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset`, in seconds from now (opt-in).
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The largest Structured Field Integer (RFC 9651 §3.3.1: at most 15 digits).
pub(super) const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// The most policies for which a layer keeps a value of each set of them (2^6 = 64 values at
/// most, see [`PerSet`]); beyond, each response builds its own.
const CACHED_SETS: usize = 6;

/// A value for each set of a layer's policies (bit `i` of the index: policy `i` is in the set),
/// each built when first needed: what is the same on every response of a set (its
/// `RateLimit-Policy`, the constant part of a gRPC refusal) is written once rather than per
/// response. It holds none for a layer of more than [`CACHED_SETS`] policies.
#[derive(Clone, Debug)]
pub(crate) struct PerSet<T>(Box<[OnceLock<T>]>);

impl<T> PerSet<T> {
    /// Room for every set of `policies` policies, or none beyond [`CACHED_SETS`].
    pub(crate) fn new(policies: usize) -> Self {
        if policies <= CACHED_SETS {
            Self((0..1usize << policies).map(|_| OnceLock::new()).collect())
        } else {
            Self(Box::default())
        }
    }

    /// The value of `set`, built by `init` the first time; `None` when the layer keeps none.
    pub(crate) fn get(&self, set: usize, init: impl FnOnce() -> T) -> Option<&T> {
        self.0.get(set).map(|cell| cell.get_or_init(init))
    }
}

/// The index in a [`PerSet`] of the set of the policies `members` names (by their places in the
/// layer).
pub(crate) fn set_index(members: impl Iterator<Item = usize>) -> usize {
    // Only read as an index while there are at most `CACHED_SETS` policies.
    members.fold(0, |set, i| set | 1 << i.min(usize::BITS as usize - 1))
}

/// The rate-limit headers of an admitted response.
#[derive(Debug)]
pub(crate) struct AdmittedHeaders {
    policy: HeaderValue,
    ratelimit: HeaderValue,
    legacy: Option<Box<[HeaderValue; 3]>>,
}

impl AdmittedHeaders {
    /// The headers for these outcomes, or `None` if the layer sends none on admitted responses
    /// (or no advertised policy took part). `quota` gives each policy's quota for the request's
    /// key.
    pub(crate) fn new(
        settings: &Settings,
        outcomes: &[Outcome],
        quota: impl Fn(usize) -> Quota,
    ) -> Option<Self> {
        if !settings.admitted_headers {
            return None;
        }
        // Both fields need each policy's quota; read it once (for a keyed limiter that is a lock
        // taken and released).
        let quotas: SmallVec<[Quota; 4]> = (0..outcomes.len()).map(quota).collect();
        let quota = |i: usize| quotas[i];
        let policy = policy_header(settings, outcomes, quota)?;
        let ratelimit = ratelimit_header(&settings.policies, outcomes, false, quota)?;
        Some(Self {
            policy,
            ratelimit,
            legacy: legacy_values(settings, outcomes, false).map(Box::new),
        })
    }

    /// Adds the headers to a response's.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        // Append: an outer layer's policies and ours form one list (RFC 9110 §5.3).
        headers.append(RATELIMIT_POLICY, self.policy);
        headers.append(RATELIMIT, self.ratelimit);
        if let Some(legacy) = self.legacy {
            insert_legacy(headers, *legacy);
        }
    }
}

/// Adds the legacy `X-RateLimit-*` fields, unless the response has them already (from an inner
/// layer): they describe one policy, so they cannot be combined as lists.
fn insert_legacy(headers: &mut HeaderMap, [limit, remaining, reset]: [HeaderValue; 3]) {
    headers.entry(X_RATELIMIT_LIMIT).or_insert(limit);
    headers.entry(X_RATELIMIT_REMAINING).or_insert(remaining);
    headers.entry(X_RATELIMIT_RESET).or_insert(reset);
}

/// Adds the headers of `refusal`: its `RateLimit-Policy`, `RateLimit` for the violated policies,
/// and the legacy ones if they are turned on.
pub(crate) fn refusal_headers(refusal: &Refusal<'_>, headers: &mut HeaderMap) {
    let (settings, outcomes) = (refusal.settings, refusal.outcomes);
    if let Some(policy) = &refusal.policy_header {
        headers.insert(RATELIMIT_POLICY, policy.clone());
    }
    // A refusal lists only refused decisions, whose values do not depend on the quota.
    let quota = |i: usize| settings.policies[i].quota;
    if let Some(ratelimit) = ratelimit_header(&settings.policies, outcomes, true, quota) {
        headers.insert(RATELIMIT, ratelimit);
    }
    if let Some(legacy) = legacy_values(settings, outcomes, true) {
        insert_legacy(headers, legacy);
    }
}

/// `RateLimit-Policy` for a request: the advertised policies that took part in its decision (not
/// those that sat it out, at a cost of zero or without a key), with the quotas `quota` gives for
/// its keys. Taken from the layer's [`PerSet`] when every quota is the policy's own.
pub(crate) fn policy_header(
    settings: &Settings,
    outcomes: &[Outcome],
    quota: impl Fn(usize) -> Quota,
) -> Option<HeaderValue> {
    let policies = &settings.policies;
    // Not those that sat the decision out, at a cost of zero or without a key.
    let took_part = |i| !matches!(outcomes.get(i), None | Some(Outcome::Skipped));
    let listed = |i: usize| policies[i].advertised() && took_part(i);
    let slots = |i: usize| counts_slots(&policies[i], outcomes.get(i));
    let held = |i: usize| matches!(policies[i].settle, Settle::Held);
    let mut own_quotas = true;
    let set = set_index(
        (0..policies.len())
            .filter(|&i| listed(i))
            .inspect(|&i| own_quotas &= quota(i) == policies[i].quota && slots(i) == held(i)),
    );
    let own = || policy_value(policies, listed, |i| (policies[i].quota, held(i)));
    match own_quotas.then(|| settings.policy_headers.get(set, own)) {
        Some(Some(cached)) => cached.clone(),
        _ => policy_value(policies, listed, |i| (quota(i), slots(i))),
    }
}

/// Whether a policy's decision is of slots of requests in flight, advertised with no window:
/// a concurrent policy's, or a concurrency limiter's serving in `Tiers` or another policy.
fn counts_slots(policy: &PolicyInfo, outcome: Option<&Outcome>) -> bool {
    matches!(policy.settle, Settle::Held)
        || outcome
            .and_then(Outcome::decision)
            .is_some_and(Decision::holds_slots)
}

/// `"name";q=..;w=.., ...`: one item per policy that `listed` names, with the quota `quota`
/// gives it (see [`advertised_policy`]) and whether it counts slots (then with no window).
fn policy_value(
    policies: &[PolicyInfo],
    listed: impl Fn(usize) -> bool,
    quota: impl Fn(usize) -> (Quota, bool),
) -> Option<HeaderValue> {
    let mut value = ValueBuf::new();
    for (i, p) in policies.iter().enumerate().filter(|&(i, _)| listed(i)) {
        let (quota, slots) = quota(i);
        if slots {
            // Requests in flight: no window (draft-11, section 5.1's `qu`).
            let q = u64::from(quota.burst());
            push_item(&mut value, &p.sf_name, &[("q", q)]);
            value.extend_from_slice(b";qu=\"concurrent-requests\"");
        } else {
            let (q, w) = advertised_policy(&quota);
            push_item(&mut value, &p.sf_name, &[("q", q), ("w", w)]);
        }
    }
    header_value(&value)
}

/// `RateLimit: "name";r=..;t=.., ...`: one item per advertised policy that decided, with the
/// values of [`service_limit`] for the quota `quota` gives it.
///
/// On a refusal (`refused`) only the violated policies are listed: the policies that admitted a
/// refused request were given their permits back, so their state is the one the client's previous
/// response described. On an admitted response, an advertised shadow policy that would have
/// refused says `r=0` and its own wait.
fn ratelimit_header(
    policies: &[PolicyInfo],
    outcomes: &[Outcome],
    refused: bool,
    quota: impl Fn(usize) -> Quota,
) -> Option<HeaderValue> {
    let mut value = ValueBuf::new();
    let decided = policies.iter().zip(outcomes).enumerate();
    for (i, (p, o)) in decided.filter(|(_, (p, _))| p.advertised() && (p.enforced() || !refused)) {
        let Some(decision) = o.decision() else {
            continue;
        };
        if counts_slots(p, Some(o)) {
            // Slots, not a rate: what is left, and no time; on a refusal, only when it refused
            // (a slot it granted went back).
            if !(refused && decision.allowed) {
                push_item(&mut value, &p.sf_name, &[("r", decision.remaining)]);
            }
        } else if let Some((r, t)) = service_limit(&quota(i), decision, refused) {
            push_item(&mut value, &p.sf_name, &[("r", r), ("t", t)]);
        }
    }
    header_value(&value)
}

/// The bytes of one header value, on the stack while they fit (an item of one policy, whose name
/// has at most 64 characters, always does).
type ValueBuf = SmallVec<[u8; 128]>;

/// Appends one list item, `"name";<a>=<x>;<b>=<y>`, after `", "` if the list is not empty.
/// `sf_name` is the name already written as a Structured Field String.
fn push_item(out: &mut ValueBuf, sf_name: &str, params: &[(&str, u64)]) {
    if !out.is_empty() {
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(sf_name.as_bytes());
    for &(key, n) in params {
        out.push(b';');
        out.extend_from_slice(key.as_bytes());
        out.push(b'=');
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }
}

/// The value, or `None` if it is empty.
fn header_value(bytes: &[u8]) -> Option<HeaderValue> {
    HeaderValue::from_bytes(bytes)
        .ok()
        .filter(|value| !value.is_empty())
}

/// `s` (printable ASCII) as a Structured Field String (RFC 9651 §4.1.6): quoted, with `\` and
/// `"` escaped by a backslash (the backslashes first, so that no escape is escaped again).
pub(crate) fn sf_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
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
/// * A policy that refused this request: `r` the units it has left, fewer than the request's
///   cost (0 for a request of one permit; for a request of 4 000 tokens, the 2 000 left, in
///   which a smaller request still fits), and `t` its own `Retry-After`,
///   `max(1, ceil(retry_after))`: the time until it admits this request, so the response's
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
    if refused && decision.allowed {
        return None;
    }
    let (q, w) = advertised_policy(quota);
    let r = decision.remaining.min(q);
    let t = if decision.allowed {
        // `q ≥ 1` (see `advertised_policy`).
        let earn = mul_div_ceil(r, w, q);
        ceil_secs(decision.reset_after).max(earn).max(1)
    } else {
        decision.retry_after_secs()
    };
    Some((r, t.min(SF_INTEGER_MAX)))
}

/// `a · b / c` rounded down (`c > 0`), saturating at `u64::MAX`.
fn mul_div_floor(a: u64, b: u64, c: u64) -> u64 {
    let exact = u128::from(a) * u128::from(b) / u128::from(c);
    u64::try_from(exact).unwrap_or(u64::MAX)
}

/// `a · b / c` rounded up (`c > 0`), saturating at `u64::MAX`.
fn mul_div_ceil(a: u64, b: u64, c: u64) -> u64 {
    let exact = (u128::from(a) * u128::from(b)).div_ceil(u128::from(c));
    u64::try_from(exact).unwrap_or(u64::MAX)
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (seconds) of the policy that binds: on a
/// refusal the violated one with the longest wait, otherwise the advertised one with the fewest
/// permits left. `None` unless the layer sends them.
fn legacy_values(
    settings: &Settings,
    outcomes: &[Outcome],
    refused: bool,
) -> Option<[HeaderValue; 3]> {
    if !settings.legacy_headers {
        return None;
    }
    let decided = settings
        .policies
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
    binding.map(|(limit, remaining, reset)| [limit, remaining, reset].map(HeaderValue::from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate_limit::policy::{Settle, Shadow};

    #[test]
    fn sf_strings_escape() {
        assert_eq!(sf_string(r#"a "b" \c"#), r#""a \"b\" \\c""#);
    }

    proptest::proptest! {
        /// Items read as written, whatever the names and numbers, as the list grows past the
        /// buffer on the stack.
        #[test]
        fn items_read_as_written(
            items in proptest::collection::vec(("[ -~]{1,64}", proptest::num::u64::ANY, 0u64..1000), 1..12)
        ) {
            let mut v = ValueBuf::new();
            let mut expected = String::new();
            for (name, r, t) in &items {
                let sf_name = sf_string(name);
                push_item(&mut v, &sf_name, &[("r", *r), ("t", *t)]);
                if !expected.is_empty() {
                    expected.push_str(", ");
                }
                expected.push_str(&format!("{sf_name};r={r};t={t}"));
                proptest::prop_assert_eq!(std::str::from_utf8(&v).unwrap(), expected.as_str());
            }
        }
    }

    #[test]
    fn the_policy_header_states_each_quota_at_its_real_rate_in_whole_seconds() {
        let p = |n: &str, q| PolicyInfo::new(n, q, Shadow::Off, Settle::Never);
        let ms = std::time::Duration::from_millis;
        let policies = [
            p("a", Quota::per_second(10).unwrap()),
            p("b", Quota::with_period(3, ms(1500)).unwrap()),
            p("c", Quota::per_hour(1000).unwrap()),
            p("d", Quota::with_period(5, ms(200)).unwrap()),
        ];
        let header = policy_value(&policies, |_| true, |i| (policies[i].quota, false)).unwrap();
        assert_eq!(
            header,
            "\"a\";q=10;w=1, \"b\";q=4;w=2, \"c\";q=1000;w=3600, \"d\";q=25;w=1"
        );
        assert!(policy_value(&[], |_| true, |_| unreachable!()).is_none());
        let only_b = policy_value(&policies, |i| i == 1, |i| (policies[i].quota, false)).unwrap();
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
