//! How the in-memory store hashes keys: SipHash-1-3 under secret random keys, as
//! `std::collections::HashMap` does, computed here for keys of a few words.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// How many bytes [`Gathered`] holds before it compresses them: four SipHash words.
const GATHER: usize = 32;

/// Builds [`Gathered`] hashers under one pair of secret keys.
///
/// The function is SipHash-1-3, the one std's `HashMap` uses, under 128 secret bits drawn from
/// std's `RandomState` when the store is made: a client that chooses its keys cannot make them
/// collide without knowing those bits. It is computed here rather than through std's hasher
/// because a key's `Hash` makes several small writes (an `IpAddr` two: its variant, then its
/// address), and std's generic code pays for each and for the bytes it carries over between
/// them; gathered and compressed a word at a time, an `IpAddr` costs about half
/// (`benches/http_instructions.sh`). The tests check every hash against the `siphasher` crate's
/// SipHash-1-3 under the same keys.
#[derive(Clone, Debug)]
pub(crate) struct KeyHashing {
    k0: u64,
    k1: u64,
}

impl Default for KeyHashing {
    fn default() -> Self {
        // Two outputs of std's SipHash under its own random keys (which differ per `RandomState`):
        // as secret as those keys.
        let random = RandomState::new();
        Self {
            k0: random.hash_one(0x6b30_u64),
            k1: random.hash_one(0x6b31_u64),
        }
    }
}

impl BuildHasher for KeyHashing {
    type Hasher = Gathered;

    #[inline]
    fn build_hasher(&self) -> Gathered {
        Gathered {
            state: Sip::new(self.k0, self.k1),
            buf: [0; GATHER],
            len: 0,
            total: 0,
        }
    }
}

/// SipHash-1-3 over the bytes written, gathered [`GATHER`] at a time (see [`KeyHashing`]).
#[derive(Clone, Debug)]
pub(crate) struct Gathered {
    state: Sip,
    /// Bytes written and not compressed yet; `buf[len..]` is zero.
    buf: [u8; GATHER],
    len: usize,
    /// Every byte written so far (SipHash's last block carries it modulo 256).
    total: u64,
}

impl Hasher for Gathered {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.total = self.total.wrapping_add(bytes.len() as u64);
        let end = self.len + bytes.len();
        if end <= GATHER {
            self.buf[self.len..end].copy_from_slice(bytes);
            self.len = end;
        } else {
            self.write_long(bytes);
        }
    }

    #[inline]
    fn finish(&self) -> u64 {
        let mut state = self.state.clone();
        let whole = self.len / 8 * 8;
        for word in self.buf[..whole].chunks_exact(8) {
            state.compress(word_at(word));
        }
        // The last block: what is left of the bytes (the buffer is zero beyond them), and the
        // length in the top byte.
        let mut last = [0; 8];
        last[..self.len - whole].copy_from_slice(&self.buf[whole..self.len]);
        state.compress(u64::from_le_bytes(last) | (self.total << 56));
        state.finish()
    }
}

impl Gathered {
    /// A write that does not fit in the buffer: fill it, compress it whole, and go on.
    #[cold]
    fn write_long(&mut self, mut bytes: &[u8]) {
        while self.len + bytes.len() > GATHER {
            let (head, rest) = bytes.split_at(GATHER - self.len);
            self.buf[self.len..].copy_from_slice(head);
            for word in self.buf.chunks_exact(8) {
                self.state.compress(word_at(word));
            }
            self.buf = [0; GATHER];
            self.len = 0;
            bytes = rest;
        }
        self.buf[..bytes.len()].copy_from_slice(bytes);
        self.len = bytes.len();
    }
}

/// The little-endian word of eight bytes.
#[inline(always)]
fn word_at(bytes: &[u8]) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

/// SipHash's four words of state.
#[derive(Clone, Debug)]
struct Sip([u64; 4]);

impl Sip {
    #[inline(always)]
    fn new(k0: u64, k1: u64) -> Self {
        Self([
            k0 ^ 0x736f_6d65_7073_6575,
            k1 ^ 0x646f_7261_6e64_6f6d,
            k0 ^ 0x6c79_6765_6e65_7261,
            k1 ^ 0x7465_6462_7974_6573,
        ])
    }

    /// One word of message, with one round (the "1" of SipHash-1-3).
    #[inline(always)]
    fn compress(&mut self, m: u64) {
        self.0[3] ^= m;
        self.round();
        self.0[0] ^= m;
    }

    /// The finalization, with three rounds (the "3").
    #[inline(always)]
    fn finish(mut self) -> u64 {
        self.0[2] ^= 0xff;
        self.round();
        self.round();
        self.round();
        let [v0, v1, v2, v3] = self.0;
        v0 ^ v1 ^ v2 ^ v3
    }

    #[inline(always)]
    fn round(&mut self) {
        let [mut v0, mut v1, mut v2, mut v3] = self.0;
        v0 = v0.wrapping_add(v1);
        v1 = v1.rotate_left(13) ^ v0;
        v0 = v0.rotate_left(32);
        v2 = v2.wrapping_add(v3);
        v3 = v3.rotate_left(16) ^ v2;
        v0 = v0.wrapping_add(v3);
        v3 = v3.rotate_left(21) ^ v0;
        v2 = v2.wrapping_add(v1);
        v1 = v1.rotate_left(17) ^ v2;
        v2 = v2.rotate_left(32);
        self.0 = [v0, v1, v2, v3];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::hash::Hash;
    use std::net::IpAddr;

    /// The reference: the `siphasher` crate's SipHash-1-3 under the same keys.
    fn reference(keys: &KeyHashing) -> siphasher::sip::SipHasher13 {
        siphasher::sip::SipHasher13::new_with_keys(keys.k0, keys.k1)
    }

    proptest! {
        /// Any sequence of writes, of any lengths (empty, one byte, up to the buffer, past it,
        /// several buffers long), under any keys, hashes as the reference SipHash-1-3 hashes the
        /// same bytes.
        #[test]
        fn hashes_as_siphash_1_3(
            k0 in any::<u64>(),
            k1 in any::<u64>(),
            pieces in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..80), 0..12),
        ) {
            let keys = KeyHashing { k0, k1 };
            let mut gathered = keys.build_hasher();
            let mut expected = reference(&keys);
            for piece in &pieces {
                gathered.write(piece);
                expected.write(piece);
            }
            prop_assert_eq!(gathered.finish(), expected.finish());
        }

        /// So keys hash as SipHash-1-3 hashes their `Hash` writes: addresses, strings (with
        /// their terminator), integers and tuples of them.
        #[test]
        fn keys_hash_as_siphash_1_3(ip in any::<IpAddr>(), s in ".{0,70}", n in any::<u128>()) {
            let keys = KeyHashing::default();
            let expected = |f: &dyn Fn(&mut siphasher::sip::SipHasher13)| {
                let mut h = reference(&keys);
                f(&mut h);
                h.finish()
            };
            prop_assert_eq!(keys.hash_one(ip), expected(&|h| ip.hash(h)));
            prop_assert_eq!(keys.hash_one(&s), expected(&|h| s.hash(h)));
            prop_assert_eq!(keys.hash_one((n, &s, ip)), expected(&|h| (n, &s, ip).hash(h)));
        }
    }

    /// Two stores draw different secret keys: what collides in one does not in the other.
    #[test]
    fn each_store_draws_its_own_keys() {
        let (a, b) = (KeyHashing::default(), KeyHashing::default());
        assert_ne!((a.k0, a.k1), (b.k0, b.k1));
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert_ne!(a.hash_one(ip), b.hash_one(ip));
    }
}
