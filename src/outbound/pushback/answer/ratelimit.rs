//! `RateLimit` and `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11), Structured
//! Fields Lists (RFC 9651) read with `sfv`.
//!
//! Each `RateLimit` item names a policy (a String, or a Token as earlier drafts wrote it) and
//! gives `r`, the calls left, and `t`, the seconds they are left for; the `RateLimit-Policy`
//! item of the same name gives `q` calls per `w` seconds. A field that does not parse is ignored
//! whole, as RFC 9651 asks; parameters other than Integers are ignored.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName};

use super::{quota_name, AdvertisedQuota, Dialect, Read, Reader, Refill};
use crate::rate_limit::{RATELIMIT, RATELIMIT_POLICY};

/// What each field of the dialect begins with.
pub(super) const PREFIXES: &[&str] = &["ratelimit"];

/// The quota of each `RateLimit` item, with its policy's window and refill.
pub(super) fn read(reader: &Reader<'_>, headers: &HeaderMap) -> Read {
    let policies = items(reader, headers, &RATELIMIT_POLICY);
    let policy_of = |name: Option<&str>| {
        policies
            .iter()
            .rev()
            .find(|policy| name.is_some() && name_of(policy) == name)
    };
    let quotas = items(reader, headers, &RATELIMIT)
        .into_iter()
        .filter_map(|item| {
            let Some(remaining) = non_negative(&item, "r") else {
                tracing::warn!(
                    target: "tower_bulwark::pushback",
                    dependency = reader.dependency,
                    "a RateLimit item without a non-negative `r`; ignored",
                );
                return None;
            };
            let policy = policy_of(name_of(&item));
            let refill = policy.and_then(|policy| {
                let calls = non_negative(policy, "q")?;
                let window = non_negative(policy, "w").filter(|&w| w > 0)?;
                Some(Refill {
                    calls,
                    window: reader.capped("ratelimit-policy", Duration::from_secs(window)),
                })
            });
            let window = integer(&item, "t").or_else(|| integer(policy?, "w"));
            let window = match window.and_then(|t| u64::try_from(t).ok()) {
                Some(t) => reader.capped("ratelimit", Duration::from_secs(t)),
                None if remaining == 0 => reader.hold_without_time(),
                // Calls left, but no window to spread them over: nothing to pace by.
                None => return None,
            };
            Some(AdvertisedQuota {
                dialect: Dialect::RateLimit,
                name: quota_name(name_of(&item)),
                remaining,
                window,
                refill,
            })
        });
    (quotas.collect(), None)
}

/// The Items of the List in field `name`; none when it is absent, too long or malformed.
fn items(reader: &Reader<'_>, headers: &HeaderMap, name: &HeaderName) -> Vec<sfv::Item> {
    let parse = |field: &[u8]| sfv::Parser::new(field).parse::<sfv::List>().ok();
    let field = reader.joined(headers, name);
    let list = field.and_then(|field| reader.parsed(name.as_str(), &field, parse));
    (list.into_iter().flatten())
        .filter_map(|entry| match entry {
            sfv::ListEntry::Item(item) => Some(item),
            sfv::ListEntry::InnerList(_) => None,
        })
        .collect()
}

/// The name of the policy an Item is about: its value, if that is a String or a Token.
fn name_of(item: &sfv::Item) -> Option<&str> {
    let value = &item.bare_item;
    value
        .as_string()
        .map(|name| name.as_str())
        .or_else(|| value.as_token().map(|name| name.as_str()))
}

/// The parameter `key`, if it is an Integer.
fn integer(item: &sfv::Item, key: &str) -> Option<i64> {
    item.params.get(key)?.as_integer().map(i64::from)
}

/// The parameter `key`, if it is a non-negative Integer.
fn non_negative(item: &sfv::Item, key: &str) -> Option<u64> {
    u64::try_from(integer(item, key)?).ok()
}
