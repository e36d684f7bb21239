//! How the in-memory store hashes keys: SipHash-1-3 with the process's random keys, as
//! `std::collections::HashMap` does, fed in one piece.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::hash::{BuildHasher, Hasher};

/// How many bytes [`Gathered`] holds before it hands them to SipHash.
const GATHER: usize = 32;

/// Builds [`Gathered`] hashers over one `RandomState`.
///
/// A key's `Hash` makes several small writes (an `IpAddr` two: its variant, then its address),
/// and std's SipHash pays a fixed cost for each. SipHash is defined over the byte stream, so
/// gathering the writes and handing them over at once gives the very hash that writing them one
/// by one gives: the same function under the same secret keys, so the same resistance to keys
/// chosen to collide, at about 30 fewer instructions for an `IpAddr`
/// (`benches/http_instructions.sh`).
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyHashing(RandomState);

impl BuildHasher for KeyHashing {
    type Hasher = Gathered;

    #[inline]
    fn build_hasher(&self) -> Gathered {
        Gathered {
            sip: self.0.build_hasher(),
            buf: [0; GATHER],
            len: 0,
        }
    }
}

/// A SipHash-1-3 hasher that gathers small writes (see [`KeyHashing`]).
#[derive(Clone, Debug)]
pub(crate) struct Gathered {
    sip: DefaultHasher,
    buf: [u8; GATHER],
    len: usize,
}

impl Hasher for Gathered {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end <= GATHER {
            self.buf[self.len..end].copy_from_slice(bytes);
            self.len = end;
        } else {
            self.sip.write(&self.buf[..self.len]);
            self.len = 0;
            self.sip.write(bytes);
        }
    }

    #[inline]
    fn finish(&self) -> u64 {
        let mut sip = self.sip.clone();
        sip.write(&self.buf[..self.len]);
        sip.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::hash::Hash;
    use std::net::IpAddr;

    proptest! {
        /// Any sequence of writes, of any lengths (empty, one byte, past the buffer, far past
        /// it), hashes exactly as SipHash under the same keys hashes it written piece by piece.
        #[test]
        fn gathering_changes_no_hash(pieces in prop::collection::vec(
            prop::collection::vec(any::<u8>(), 0..80), 0..12)) {
            let keys = KeyHashing::default();
            let mut gathered = keys.build_hasher();
            let mut direct = keys.0.build_hasher();
            for piece in &pieces {
                gathered.write(piece);
                direct.write(piece);
            }
            prop_assert_eq!(gathered.finish(), direct.finish());
        }

        /// So keys hash as `HashMap` hashes them, strings (with their terminator) and integers
        /// included.
        #[test]
        fn keys_hash_as_std_hashes_them(ip in any::<IpAddr>(), s in ".{0,70}", n in any::<u128>()) {
            let keys = KeyHashing::default();
            let direct = |f: &dyn Fn(&mut DefaultHasher)| {
                let mut h = keys.0.build_hasher();
                f(&mut h);
                h.finish()
            };
            prop_assert_eq!(keys.hash_one(ip), direct(&|h| ip.hash(h)));
            prop_assert_eq!(keys.hash_one(&s), direct(&|h| s.hash(h)));
            prop_assert_eq!(keys.hash_one((n, &s, ip)), direct(&|h| (n, &s, ip).hash(h)));
        }
    }

    /// Two stores draw different secret keys: what collides in one does not in the other.
    #[test]
    fn each_store_draws_its_own_keys() {
        let (a, b) = (KeyHashing::default(), KeyHashing::default());
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert_ne!(a.hash_one(ip), b.hash_one(ip));
    }
}
