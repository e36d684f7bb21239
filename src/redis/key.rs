//! How a client key becomes a Redis key: its text, the limiter's prefix and the Redis Cluster
//! hash tag that chooses its slot.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;

use super::BuildError;

/// Where the Redis Cluster hash tag of a limiter's keys comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HashTag {
    /// `<prefix>{<client key>}`: each client's state hashes by the client key alone, so clients
    /// spread over the cluster's slots (the default).
    #[default]
    PerKey,
    /// `<prefix>{<tag>}:<client key>`: every key of the limiter lives in the slot of `tag`.
    Fixed(String),
}

/// How one limiter names the Redis key of a client key.
#[derive(Debug)]
pub(crate) struct KeyLayout {
    pub(crate) prefix: String,
    pub(crate) hash_tag: HashTag,
}

impl KeyLayout {
    /// The layout of `prefix` and `hash_tag`, or why they cannot stand in a key: a brace in
    /// either would move or end the hash tag.
    pub(crate) fn new(prefix: String, hash_tag: HashTag) -> Result<Self, BuildError> {
        if prefix.contains(['{', '}']) {
            return Err(BuildError::at(
                "prefix",
                "the key prefix must not hold `{` or `}`",
            ));
        }
        if matches!(&hash_tag, HashTag::Fixed(tag) if tag.is_empty() || tag.contains(['{', '}'])) {
            return Err(BuildError::at(
                "hash_tag",
                "a fixed hash tag must be non-empty, without `{` or `}`",
            ));
        }
        Ok(Self { prefix, hash_tag })
    }

    /// The Redis key that holds the state of `key`.
    pub(crate) fn redis_key<K: RedisKey + ?Sized>(&self, key: &K) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 24);
        out.push_str(&self.prefix);
        out.push('{');
        match &self.hash_tag {
            HashTag::PerKey => {
                // Redis Cluster ends the tag at the first `}`, so a key holding one would choose
                // its own slot (and could pile onto another client's): `%` becomes `%25` and
                // then `}` becomes `%7D`, which keeps different client keys different.
                let mut text = String::new();
                key.write_redis_key(&mut text);
                out.push_str(&text.replace('%', "%25").replace('}', "%7D"));
                out.push('}');
            }
            HashTag::Fixed(tag) => {
                out.push_str(tag);
                out.push_str("}:");
                key.write_redis_key(&mut out);
            }
        }
        out
    }
}

/// A fingerprint of a Redis key, which a decision carries so that a refund under another key
/// gives nothing back. Stable across limiters and processes (std's SipHash with fixed keys), so
/// a decision of one limiter can be given back through a clone or another limiter on the same
/// Redis keys.
pub(crate) fn fingerprint(redis_key: &str) -> u64 {
    std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
        .hash_one(redis_key)
}

/// A client key that can name its state in Redis: strings, numbers, IP addresses, header values
/// (the keys of the HTTP layer's extractors) and `()` (one budget for everything).
///
/// Two different keys of one type must write different text. Implement it for a key type of your
/// own, or wrap the key in a `String`.
pub trait RedisKey {
    /// Appends this key's text to `out`.
    fn write_redis_key(&self, out: &mut String);
}

macro_rules! pointer_keys {
    ($($pointer:ty),*) => {$(
        impl<T: RedisKey + ?Sized> RedisKey for $pointer {
            fn write_redis_key(&self, out: &mut String) {
                (**self).write_redis_key(out);
            }
        }
    )*};
}

pointer_keys!(&T, Box<T>, Arc<T>, Rc<T>);

/// One budget for everything: the empty key.
impl RedisKey for () {
    fn write_redis_key(&self, _out: &mut String) {}
}

/// Keys written as they display (text as it is).
macro_rules! display_keys {
    ($($ty:ty),* $(,)?) => {$(
        impl RedisKey for $ty {
            fn write_redis_key(&self, out: &mut String) {
                // Writing into a String cannot fail.
                let _ = write!(out, "{self}");
            }
        }
    )*};
}

display_keys! {
    str, String, Cow<'_, str>, char, bool, IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr,
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize,
}

/// Header bytes as text: visible ASCII as is, anything else (and `\`) escaped as `\xNN`, so
/// different values never write the same text.
impl RedisKey for http::HeaderValue {
    fn write_redis_key(&self, out: &mut String) {
        for &byte in self.as_bytes() {
            if byte.is_ascii_graphic() && byte != b'\\' || byte == b' ' {
                out.push(char::from(byte));
            } else {
                let _ = write!(out, "\\x{byte:02x}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text<K: RedisKey + ?Sized>(key: &K) -> String {
        let mut out = String::new();
        key.write_redis_key(&mut out);
        out
    }

    #[test]
    fn keys_write_their_text() {
        assert_eq!(text("alice"), "alice");
        assert_eq!(text(&String::from("bob")), "bob");
        assert_eq!(text(&&42u64), "42");
        assert_eq!(text(&()), "");
        assert_eq!(text(&IpAddr::from([203, 0, 113, 7])), "203.0.113.7");
        assert_eq!(text(&"2001:db8::".parse::<IpAddr>().unwrap()), "2001:db8::");
        assert_eq!(text(&Arc::<str>::from("carol")), "carol");
    }

    fn layout(prefix: &str, hash_tag: HashTag) -> Result<KeyLayout, BuildError> {
        KeyLayout::new(prefix.to_owned(), hash_tag)
    }

    #[test]
    fn keys_carry_the_prefix_and_an_escaped_hash_tag() {
        let per_key = layout("p:", HashTag::PerKey).unwrap();
        assert_eq!(per_key.redis_key("alice"), "p:{alice}");
        assert_eq!(per_key.redis_key("{a}b%c"), "p:{{a%7Db%25c}");
        assert_ne!(per_key.redis_key("{a}"), per_key.redis_key("{a%7D"));
        let fixed = layout("p:", HashTag::Fixed("t".into())).unwrap();
        assert_eq!(fixed.redis_key("{a}b"), "p:{t}:{a}b");
        for (prefix, tag) in [
            ("p{", HashTag::PerKey),
            ("p}", HashTag::PerKey),
            ("p:", HashTag::Fixed(String::new())),
            ("p:", HashTag::Fixed("}a{".into())),
        ] {
            assert!(layout(prefix, tag).is_err(), "{prefix}");
        }
    }

    #[test]
    fn header_values_are_escaped_without_collisions() {
        let plain = http::HeaderValue::from_static("key 123");
        assert_eq!(text(&plain), "key 123");
        let odd = http::HeaderValue::from_bytes(b"a\xffb\\x").unwrap();
        assert_eq!(text(&odd), "a\\xffb\\x5cx");
        let literal = http::HeaderValue::from_static("a\\xffb");
        assert_ne!(
            text(&literal),
            text(&http::HeaderValue::from_bytes(b"a\xffb").unwrap())
        );
    }
}
