//! What a response says about when to call again.
//!
//! A response can hold calls (`Retry-After`, read in [`retry_after`]) and advertise a quota.
//! Dependencies write their quotas in several dialects; each [`Dialect`] is read by a module of
//! its own, and every quota read counts (at most [`MAX_QUOTAS`], the most restrictive).
//!
//! Every span read here is capped by the pushback's `max_hold`; nothing read from a header can
//! panic, overflow or make a span longer than that.

mod anthropic;
mod openai;
mod ratelimit;
mod retry_after;
mod when;
mod x_ratelimit;

use std::cell::OnceCell;
use std::cmp::Reverse;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, DATE};
use http::StatusCode;

use super::tokens::TokenQuota;
use crate::head::{field_lines, one_value};

/// How long to hold after a 429 that says nothing about when to come back.
const HOLD_WITHOUT_TIME: Duration = Duration::from_secs(1);

/// The most quotas of one answer that are kept: the most restrictive, the fewest calls left and
/// of those the longest window. The schedule holds calls by each of them.
pub(crate) const MAX_QUOTAS: usize = 16;

/// A way dependencies write their quota in response fields. Reading one more is a module with
/// a `read` function and the `PREFIXES` of its fields, a variant here (before `Custom`, the
/// last), its entry in [`READERS`] and its label in the metrics' `HOLD_REASONS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// `RateLimit` and `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11).
    RateLimit,
    /// `X-RateLimit-Remaining` with `X-RateLimit-Reset` or `X-RateLimit-Reset-After` (GitHub,
    /// Discord and many more), and the `RateLimit-Remaining` and `RateLimit-Reset` of the
    /// drafts before -07 (GitLab).
    XRateLimit,
    /// OpenAI's `x-ratelimit-{remaining,reset}-{requests,tokens}`.
    OpenAi,
    /// Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-*`.
    Anthropic,
    /// A reader of the user's own ([`PushbackBuilder::dialect`](super::PushbackBuilder::dialect)).
    Custom,
}

/// The readers of the built-in dialects, in the order of their declaration, which is the order
/// they are read in. Each gives the
/// quotas its dialect advertises in the fields, if they have any, and its limit of tokens with
/// the fewest left, if it speaks of tokens; beside it, what its fields begin with (which tells
/// a 403 for a rate limit). Every field a reader reads begins so: it is read only where the
/// answer carries such a field. Most answers carry none, and looking each field up cost a call
/// through the pushback two thirds of its instructions (`benches/resilience.rs`, on an answer
/// of no fields: 3 583 a call with every reader, 1 304 with those of the fields it carries).
type ReadDialect = fn(&Reader<'_>, &HeaderMap) -> Read;
const READERS: [(&[&str], ReadDialect); 4] = [
    (ratelimit::PREFIXES, ratelimit::read),
    (x_ratelimit::PREFIXES, x_ratelimit::read),
    (openai::PREFIXES, openai::read),
    (anthropic::PREFIXES, anthropic::read),
];

impl Dialect {
    /// Whether, on an answer that also carries `Retry-After`, the time a spent quota of this
    /// dialect comes back is Retry-After's rather than its reset's when that is later.
    ///
    /// * draft-11's `RateLimit`: yes. Its "Client Behavior" section: Retry-After "MUST take
    ///   precedence and the reset keyword MAY be ignored".
    /// * OpenAI's and Anthropic's families: yes. Their resets say when a limit is whole again
    ///   (OpenAI) or replenished (Anthropic), and Retry-After when this call would succeed
    ///   (Anthropic: "earlier retries will fail").
    /// * `X-RateLimit-*` and the older drafts' `RateLimit-*` (GitHub, GitLab, Discord): no, the
    ///   later of the two counts. A spent primary limit outlasts a secondary limit's shorter
    ///   Retry-After, and GitHub warns that calls made while limited can get an integration
    ///   banned.
    /// * A dialect of the user's: no. Its meaning is unknown, so the later of the two counts.
    fn yields_to_retry_after(self) -> bool {
        matches!(self, Self::RateLimit | Self::OpenAi | Self::Anthropic)
    }
}

/// What one response asks of its caller.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    /// Hold every call for this long (`Retry-After` on a 429 or 503, or a 429 without it).
    pub(crate) hold: Option<Duration>,
    /// The quotas the response advertises, the most restrictive first (at most
    /// [`MAX_QUOTAS`]): each holds calls.
    pub(crate) quotas: Vec<AdvertisedQuota>,
    /// The limit of tokens with the fewest left, if the response advertises tokens.
    pub(crate) tokens: Option<TokenQuota>,
}

/// A quota the dependency advertised: `remaining` calls within `window`, then, when its policy
/// is known, `refill`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdvertisedQuota {
    /// The fields it was read from.
    pub(crate) dialect: Dialect,
    /// Which of its dialect's quotas it is ([`quota_name`] of what names it: a `RateLimit`
    /// item's name, a family's field, the place of a reader of the user's). An older answer's
    /// quota tightens the quota in force of the same dialect and name.
    pub(crate) name: u64,
    pub(crate) remaining: u64,
    pub(crate) window: Duration,
    pub(crate) refill: Option<Refill>,
}

impl AdvertisedQuota {
    /// `remaining` calls of `dialect`'s quota `name` within `window`, and nothing known after
    /// it.
    fn new(dialect: Dialect, name: u64, remaining: u64, window: Duration) -> Self {
        Self {
            dialect,
            name,
            remaining,
            window,
            refill: None,
        }
    }
}

/// The [`AdvertisedQuota::name`] of a quota named by `name` (a hash: quotas of one dialect are
/// told apart by it).
fn quota_name(name: impl Hash) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    name.hash(&mut hasher);
    hasher.finish()
}

/// The quota of every window after the advertised one: `calls` in each `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refill {
    pub(crate) calls: u64,
    pub(crate) window: Duration,
}

/// One limit of a dialect that writes several side by side (requests, tokens), each in a field
/// of what is left and a field of when it resets.
struct Family {
    /// The family's limit (read for tokens, which come back at an even pace up to it).
    limit: HeaderName,
    remaining: HeaderName,
    reset: HeaderName,
    /// Whether it counts calls. A family of tokens says how many calls are left only when it
    /// is spent (none are): while tokens are left, calls go by the other families.
    counts_calls: bool,
}

/// The [`Family`] of the fields `{before}limit{after}`, `{before}remaining{after}` and
/// `{before}reset{after}`, as a constant.
macro_rules! family {
    ($before:literal, $after:literal, counts_calls: $counts_calls:literal) => {
        Family {
            limit: HeaderName::from_static(concat!($before, "limit", $after)),
            remaining: HeaderName::from_static(concat!($before, "remaining", $after)),
            reset: HeaderName::from_static(concat!($before, "reset", $after)),
            counts_calls: $counts_calls,
        }
    };
}
use family;

/// What one dialect's fields say: its quotas of calls, and its limit of tokens with the fewest
/// left.
type Read = (Vec<AdvertisedQuota>, Option<TokenQuota>);

/// What `families` say, each field read once (so that a malformed or capped one is logged
/// once), each reset read by `reset`: the quota of calls of each family, a family of tokens
/// counting as one only when it is spent, and the family of tokens with the fewest left.
fn read_families(
    reader: &Reader<'_>,
    headers: &HeaderMap,
    dialect: Dialect,
    families: &[Family],
    reset: impl Fn(&[u8]) -> Option<when::Reset>,
) -> Read {
    let (mut quotas, mut tokens) = (Vec::new(), None);
    let readable = families.iter().filter_map(|family| {
        let remaining = reader.single_number(headers, &family.remaining)?;
        let window = reader.reset(headers, &family.reset, &reset)?;
        Some((family, remaining, window))
    });
    for (family, remaining, window) in readable {
        let limit = (!family.counts_calls)
            .then(|| reader.single_number(headers, &family.limit))
            .flatten();
        // Spent tokens with no limit to come back to hold every call until the reset; with a
        // limit, they come back at an even pace, and a call waits for its own.
        if family.counts_calls || (remaining == 0 && limit.is_none()) {
            let name = quota_name(family.remaining.as_str());
            quotas.push(AdvertisedQuota::new(dialect, name, remaining, window));
        }
        if !family.counts_calls {
            let read = TokenQuota {
                remaining,
                limit,
                resets_in: window,
            };
            tokens = fewest_tokens(tokens.into_iter().chain([read]));
        }
    }
    (quotas, tokens)
}

/// The limit of tokens with the fewest left, and of those the longest reset.
fn fewest_tokens(quotas: impl Iterator<Item = TokenQuota>) -> Option<TokenQuota> {
    quotas.min_by_key(|quota| (quota.remaining, Reverse(quota.resets_in)))
}

/// A reader of a dialect of the user's: the calls left and the span until they reset, if the
/// fields it knows are there.
pub(crate) type ReadQuota = dyn Fn(&HeaderMap) -> Option<(u64, Duration)> + Send + Sync;

/// Reads `status` and `headers` as of now (by the system time), capping every span
/// at `max_hold`, with the built-in dialects and the user's `custom` ones. `dependency` names
/// the dependency in logs.
pub(crate) fn read(
    dependency: &str,
    status: StatusCode,
    headers: &HeaderMap,
    max_hold: Duration,
    custom: &[Arc<ReadQuota>],
) -> Answer {
    let reader = Reader::new(dependency, max_hold, headers);
    let retry_after = reads_retry_after(status, headers)
        .then(|| retry_after::read(&reader, headers))
        .flatten();
    read_with(&reader, status, headers, retry_after, custom)
}

/// [`read`], with `retry_after` the answer's `Retry-After` if it is read.
fn read_with(
    reader: &Reader<'_>,
    status: StatusCode,
    headers: &HeaderMap,
    retry_after: Option<Duration>,
    custom: &[Arc<ReadQuota>],
) -> Answer {
    // A gRPC answer comes as HTTP 200: its own status says when to call again (with a
    // `Retry-After` too, the longer).
    #[cfg(feature = "grpc")]
    let retry_after = retry_after.max(
        crate::outbound::grpc::hold(headers)
            .map(|hold| reader.capped("grpc-retry-pushback-ms", hold)),
    );
    // Where a dialect's owner says Retry-After takes precedence over its resets, what the
    // answer says is spent comes back when Retry-After has passed, even where a reset says
    // later (see `Dialect::yields_to_retry_after`). What is not spent keeps its window. A
    // dialect that does not yield keeps its later reset, whichever dialects share the answer.
    let precedence = |mut quota: AdvertisedQuota| {
        if let Some(after) = retry_after {
            if quota.remaining == 0 && quota.dialect.yields_to_retry_after() {
                quota.window = quota.window.min(after);
            }
        }
        quota
    };
    let custom = custom.iter().enumerate().filter_map(|(place, read)| {
        let (remaining, window) = read(headers)?;
        let window = reader.capped("a dialect of the user's", window);
        let name = quota_name(place);
        Some(AdvertisedQuota::new(
            Dialect::Custom,
            name,
            remaining,
            window,
        ))
    });
    let mut tokens = None;
    let mut quotas: Vec<_> = (READERS.iter())
        .filter(|(prefixes, _)| carries(headers, prefixes))
        .flat_map(|(_, read_dialect)| {
            let (quotas, read) = read_dialect(reader, headers);
            tokens = fewest_tokens(tokens.into_iter().chain(read));
            quotas
        })
        .chain(custom)
        .map(precedence)
        .collect();
    // The most restrictive first (the fewest calls left, and of those the longest window), at
    // most `MAX_QUOTAS` of them.
    quotas.sort_by_key(|quota| (quota.remaining, Reverse(quota.window)));
    quotas.truncate(MAX_QUOTAS);
    // Tokens are OpenAI's and Anthropic's, which both yield.
    if let (Some(after), Some(tokens)) = (retry_after, tokens.as_mut()) {
        if tokens.remaining == 0 {
            tokens.resets_in = tokens.resets_in.min(after);
        }
    }
    let mut hold = retry_after;
    if hold.is_none() && status == StatusCode::TOO_MANY_REQUESTS && quotas.is_empty() {
        tracing::debug!(
            target: "tower_bulwark::pushback",
            dependency = reader.dependency,
            "429 without Retry-After or rate-limit fields; holding {HOLD_WITHOUT_TIME:?}",
        );
        hold = Some(reader.hold_without_time());
    }
    Answer {
        hold,
        quotas,
        tokens,
    }
}

/// How long an answer of `status` and `headers` asks every call to wait, read as [`read`]
/// reads it in the built-in dialects but uncapped (`max_hold` is the pushback's, not the
/// caller's): the longest of its hold, the windows of the quotas it says are spent, and the
/// reset of the tokens it says are spent (a call takes at least one: a pushback below holds a
/// call for them too). What a retry of the call waits at least. The answer was judged
/// transient, so its `Retry-After` counts whatever its status (a 504's too, which the pushback
/// does not read).
#[cfg(feature = "adaptive")]
pub(crate) fn wait(dependency: &str, status: StatusCode, headers: &HeaderMap) -> Duration {
    let reader = Reader::new(dependency, Duration::MAX, headers);
    let retry_after = retry_after::read(&reader, headers);
    let answer = read_with(&reader, status, headers, retry_after, &[]);
    let spent = (answer.quotas.iter())
        .filter(|quota| quota.remaining == 0)
        .map(|quota| quota.window);
    let tokens_spent = (answer.tokens.iter())
        .filter(|tokens| tokens.remaining == 0)
        .map(|tokens| tokens.resets_in);
    (answer.hold.into_iter().chain(spent).chain(tokens_spent))
        .max()
        .unwrap_or_default()
}

/// Whether [`read`] reads the `Retry-After` of an answer of `status`: a 429, a 503, or a 403
/// that is a refusal for a rate limit (GitHub's secondary limits), which it is when it carries
/// rate-limit fields; any other 403 says nothing about when to call again.
fn reads_retry_after(status: StatusCode, headers: &HeaderMap) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::SERVICE_UNAVAILABLE
        || (status == StatusCode::FORBIDDEN && has_rate_limit_fields(headers))
}

/// Whether `headers` carry a field of a built-in rate-limit dialect, readable or not.
fn has_rate_limit_fields(headers: &HeaderMap) -> bool {
    (READERS.iter()).any(|(prefixes, _)| carries(headers, prefixes))
}

/// Whether `headers` carry a field whose name begins with one of `prefixes`.
fn carries(headers: &HeaderMap, prefixes: &[&str]) -> bool {
    (headers.keys()).any(|name| prefixes.iter().any(|p| name.as_str().starts_with(p)))
}

/// The `Date` of a response, if it has one readable value (see [`one_value`]).
fn date_of(headers: &HeaderMap) -> Option<SystemTime> {
    let value = one_value(headers, &DATE).ok()??;
    httpdate::parse_http_date(std::str::from_utf8(value).ok()?.trim()).ok()
}

/// A header value shortened and escaped for a log line.
fn shown(value: &[u8]) -> String {
    let end = value.len().min(64);
    let more = if value.len() > end { "…" } else { "" };
    format!(
        "{}{more}",
        String::from_utf8_lossy(&value[..end]).escape_debug()
    )
}

/// Non-negative whole seconds or a count, saturating: `None` unless `text` is one or more ASCII
/// digits, with optional whitespace around them.
fn whole_number(text: &[u8]) -> Option<u64> {
    let text = text.trim_ascii();
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(text.iter().fold(0u64, |n, &d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

/// What every dialect reads with: the caps, the reference time, and the logging of what is
/// capped or ignored.
struct Reader<'a> {
    dependency: &'a str,
    max_hold: Duration,
    headers: &'a HeaderMap,
    /// The time that dates in the response are read against, found when a date is first read
    /// (most answers have none, and parsing their `Date` was a third of reading them).
    reference: OnceCell<SystemTime>,
}

impl<'a> Reader<'a> {
    /// A reader for the answer of `dependency` with `headers`, capping spans at `max_hold`.
    fn new(dependency: &'a str, max_hold: Duration, headers: &'a HeaderMap) -> Self {
        Self {
            dependency,
            max_hold,
            headers,
            reference: OnceCell::new(),
        }
    }

    /// The server's own clock, when it sends one, so that dates are read without clock skew;
    /// else this machine's.
    fn reference(&self) -> SystemTime {
        *(self.reference).get_or_init(|| date_of(self.headers).unwrap_or_else(SystemTime::now))
    }

    /// `span`, capped at `max_hold` (logged when capped).
    fn capped(&self, field: &str, span: Duration) -> Duration {
        if span > self.max_hold {
            tracing::warn!(
                target: "tower_bulwark::pushback",
                dependency = self.dependency,
                field,
                asked = ?span,
                max_hold = ?self.max_hold,
                "the dependency asked for a longer hold than max_hold; capped",
            );
            self.max_hold
        } else {
            span
        }
    }

    /// The span until the reset that `parse` reads in the one line of `name`, capped; `None`,
    /// logged, when it reads none or the field has several lines.
    fn reset(
        &self,
        headers: &HeaderMap,
        name: &HeaderName,
        parse: impl FnOnce(&[u8]) -> Option<when::Reset>,
    ) -> Option<Duration> {
        let reset = self.parsed(name.as_str(), self.single(headers, name)?, parse)?;
        Some(self.span(name.as_str(), reset))
    }

    /// The span until `reset`, the reset of `field`, an instant read from the reference time,
    /// capped: zero for an instant in the past.
    fn span(&self, field: &str, reset: when::Reset) -> Duration {
        let span = match reset {
            when::Reset::In(span) => span,
            when::Reset::At(at) => at.duration_since(self.reference()).unwrap_or_else(|_| {
                tracing::debug!(
                    target: "tower_bulwark::pushback",
                    dependency = self.dependency,
                    field,
                    "a time in the past; no hold",
                );
                Duration::ZERO
            }),
        };
        self.capped(field, span)
    }

    /// What `parse` reads of `value`, the value of `field`; `None`, logged, when it reads
    /// nothing.
    fn parsed<T>(
        &self,
        field: &str,
        value: &[u8],
        parse: impl FnOnce(&[u8]) -> Option<T>,
    ) -> Option<T> {
        let parsed = parse(value);
        if parsed.is_none() {
            self.malformed(field, value);
        }
        parsed
    }

    /// The one value of `name` (see [`one_value`]); logged when its lines differ or the field
    /// is too large to read.
    fn single<'h>(&self, headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h [u8]> {
        one_value(headers, name)
            .inspect_err(|first| self.malformed(name.as_str(), first))
            .ok()?
    }

    /// The lines of `name`, unless the field is too large to read (then it is ignored whole,
    /// logged: see [`field_lines`]).
    fn lines<'h>(
        &self,
        headers: &'h HeaderMap,
        name: &HeaderName,
    ) -> Option<http::header::GetAll<'h, http::HeaderValue>> {
        field_lines(headers, name)
            .inspect_err(|first| self.malformed(name.as_str(), first))
            .ok()
    }

    /// The hold of an answer that says nothing is left but not for how long.
    fn hold_without_time(&self) -> Duration {
        HOLD_WITHOUT_TIME.min(self.max_hold)
    }

    fn malformed(&self, field: &str, value: &[u8]) {
        tracing::warn!(
            target: "tower_bulwark::pushback",
            dependency = self.dependency,
            field,
            value = %shown(value),
            "malformed rate-limit field from the dependency; ignored",
        );
    }

    /// The one line of `name` as a whole number; `None`, logged, when it is not one or the
    /// field has several lines.
    fn single_number(&self, headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
        self.parsed(name.as_str(), self.single(headers, name)?, whole_number)
    }

    /// The field `name`, its lines joined by commas (RFC 9651), or `None` when it is absent or
    /// too long (logged).
    fn joined(&self, headers: &HeaderMap, name: &HeaderName) -> Option<Vec<u8>> {
        let lines: Vec<&[u8]> = self
            .lines(headers, name)?
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        // Lines after the first are joined with ", ", as RFC 9110 combines them.
        let joined = lines.join(&b", "[..]);
        (!joined.is_empty()).then_some(joined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas_of(fields: &[(&str, &str)]) -> Vec<AdvertisedQuota> {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        read("p", StatusCode::OK, &headers, Duration::MAX, &[]).quotas
    }

    /// A 403 is a refusal for a rate limit when it carries a field of any built-in dialect,
    /// readable or not, and of no other kind otherwise.
    #[test]
    fn a_field_of_every_dialect_makes_a_403_a_rate_limit() {
        for (name, rate_limit) in [
            ("ratelimit", true),
            ("ratelimit-policy", true),
            ("ratelimit-remaining", true),
            ("x-ratelimit-remaining", true),
            ("x-ratelimit-reset-tokens", true),
            ("anthropic-ratelimit-requests-reset", true),
            ("x-rate-limit", false),
            ("www-authenticate", false),
        ] {
            let mut headers = HeaderMap::new();
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            headers.insert(name.clone(), "?".parse().unwrap());
            assert_eq!(has_rate_limit_fields(&headers), rate_limit, "{name}");
        }
    }

    /// `read_with` reads a dialect only where the answer carries a field of its prefixes: sound
    /// only while no reader finds anything without one. Every field any built-in reader reads,
    /// each with a value it takes: each reader finds something in all of them, and nothing once
    /// the fields of its own prefixes are gone (the other dialects' fields left).
    #[test]
    fn a_dialect_finds_nothing_without_a_field_of_its_prefixes() {
        // A family's fields, named by `field` of its kind and each part.
        let families = |field: &dyn Fn(&str, &str) -> String, kinds: &[&str], reset: &str| {
            let values = [("limit", "10"), ("remaining", "0"), ("reset", reset)];
            (kinds.iter())
                .flat_map(|kind| values.map(|(part, v)| (field(kind, part), v.to_owned())))
                .collect::<Vec<_>>()
        };
        let mut every_field: Vec<(String, String)> = [
            ("date", "Mon, 07 Dec 2026 10:00:00 GMT"),
            ("ratelimit", r#""a";r=0;t=1"#),
            ("ratelimit-policy", r#""a";q=1;w=1"#),
            ("ratelimit-remaining", "0"),
            ("ratelimit-reset", "1"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1"),
            ("x-ratelimit-reset-after", "1"),
        ]
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .into();
        let openai = |kind: &str, part: &str| format!("x-ratelimit-{part}-{kind}");
        every_field.extend(families(&openai, &["requests", "tokens"], "1s"));
        let anthropic = |kind: &str, part: &str| format!("anthropic-ratelimit-{kind}-{part}");
        let kinds = ["requests", "tokens", "input-tokens", "output-tokens"];
        every_field.extend(families(&anthropic, &kinds, "2026-12-07T10:00:01Z"));
        let headers_of = |keep: &dyn Fn(&str) -> bool| {
            let mut headers = HeaderMap::new();
            for (name, value) in every_field.iter().filter(|(name, _)| keep(name)) {
                let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
                headers.append(name, value.parse().unwrap());
            }
            headers
        };
        let all = headers_of(&|_| true);
        for (prefixes, read_dialect) in READERS {
            let own = |name: &str| prefixes.iter().any(|p| name.starts_with(p));
            let (quotas, tokens) = read_dialect(&Reader::new("p", Duration::MAX, &all), &all);
            assert!(
                !quotas.is_empty() || tokens.is_some(),
                "{prefixes:?} read nothing"
            );
            let others = headers_of(&|name| !own(name));
            let read = read_dialect(&Reader::new("p", Duration::MAX, &others), &others);
            assert_eq!(
                read,
                (Vec::new(), None),
                "{prefixes:?} read another's fields"
            );
        }
    }

    #[test]
    fn reads_policies_named_by_strings_or_tokens_and_their_integer_parameters() {
        let quotas = quotas_of(&[
            ("ratelimit", r#""day";r=10;t=3600, hour;r=0;x=?1, (1 2)"#),
            ("ratelimit-policy", r#""day";q=100;w=86400, hour;q=5;w=60"#),
        ]);
        let quota = |name: &str, remaining, window, calls, per| AdvertisedQuota {
            dialect: Dialect::RateLimit,
            name: quota_name(Some(name)),
            remaining,
            window: Duration::from_secs(window),
            refill: Some(Refill {
                calls,
                window: Duration::from_secs(per),
            }),
        };
        let (hour, day) = (
            quota("hour", 0, 60, 5, 60),
            quota("day", 10, 3600, 100, 86400),
        );
        assert_eq!(quotas, [hour, day]);
    }

    #[test]
    fn a_field_rfc_9651_rejects_is_ignored_whole() {
        for bad in [
            r#""a";r=0;t=5,"#,
            r#""a";r=0;t=1234567890123456"#,
            r#""a";R=0;t=5"#,
            r#""a";r=0;t=5, "b";r=-"#,
            r#""a";r=0;t=5, "b"#,
            r#""a";r=0;t=5, 1.2345"#,
            r#""a";r=0;t=5, (1"#,
        ] {
            assert_eq!(quotas_of(&[("ratelimit", bad)]), [], "{bad}");
        }
    }
}
