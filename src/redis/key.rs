//! How a client key becomes part of a Redis key.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;

/// A client key that can name its state in Redis: strings, numbers, IP addresses, header values
/// (the keys of the HTTP layer's extractors) and `()` (one budget for everything).
///
/// Two different keys of one type must write different text. Implement it for a key type of your
/// own, or wrap the key in a `String`.
pub trait RedisKey {
    /// Appends this key's text to `out`.
    fn write_redis_key(&self, out: &mut String);
}

impl<T: RedisKey + ?Sized> RedisKey for &T {
    fn write_redis_key(&self, out: &mut String) {
        (**self).write_redis_key(out);
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Box<T> {
    fn write_redis_key(&self, out: &mut String) {
        (**self).write_redis_key(out);
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Arc<T> {
    fn write_redis_key(&self, out: &mut String) {
        (**self).write_redis_key(out);
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Rc<T> {
    fn write_redis_key(&self, out: &mut String) {
        (**self).write_redis_key(out);
    }
}

impl RedisKey for str {
    fn write_redis_key(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl RedisKey for String {
    fn write_redis_key(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl RedisKey for Cow<'_, str> {
    fn write_redis_key(&self, out: &mut String) {
        out.push_str(self);
    }
}

/// One budget for everything: the empty key.
impl RedisKey for () {
    fn write_redis_key(&self, _out: &mut String) {}
}

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

display_keys!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, char, bool, IpAddr, Ipv4Addr,
    Ipv6Addr, SocketAddr,
);

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
