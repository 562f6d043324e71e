//! A fast hasher for the maps every submission looks into: live C
//! handles, peers by id, the relocation cache. std's default (SipHash
//! with a random key) guards a map against keys chosen to collide; these
//! maps hold keys this library made (addresses, ids) or few entries (the
//! cache is bounded by its capacity), so collisions cost at most a short
//! scan, and SipHash's 20-odd ns a lookup were a visible share of a
//! one-request submission.

use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-rotate hasher (the Fx scheme): one multiply per word.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

/// Odd constant of the multiply (the golden ratio in 64 bits).
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            // The length keeps "a" apart from "a\0" (a str's 0xff end
            // comes in a later write).
            self.add(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        // hashbrown takes the bucket from the low bits and the control
        // byte from the top seven; a multiply mixes its high bits best:
        // rotate the best-mixed ones down into the bucket bits.
        self.0.rotate_left(26)
    }
}

/// The `HashMap` state of the fast hasher.
pub type FastState = BuildHasherDefault<FastHasher>;

/// A `HashMap` with the fast hasher.
pub type FastMap<K, V> = std::collections::HashMap<K, V, FastState>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(v: T) -> u64 {
        FastState::default().hash_one(v)
    }

    #[test]
    fn strings_differing_in_their_last_bytes_or_length_hash_apart() {
        let names = [
            "",
            "a",
            "a\0",
            "ab",
            "abcdefgh",
            "abcdefgh\0",
            "abcdefghi",
            "abcdefghj",
            "127.0.0.1:4001",
            "127.0.0.1:4002",
        ];
        let hashes: Vec<u64> = names.iter().map(hash).collect();
        for (i, a) in hashes.iter().enumerate() {
            for (j, b) in hashes.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "{:?} and {:?} collide", names[i], names[j]);
            }
        }
    }

    #[test]
    fn handle_addresses_spread_over_the_bucket_and_control_bits() {
        // Box addresses 16 bytes apart (their low four bits always 0):
        // hashbrown picks the bucket from the low bits and the control
        // byte from the top seven, so both must take many values.
        let hashes: Vec<u64> = (0..128u64).map(|i| hash(0x5555_0000_0000 + 16 * i)).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 127).collect();
        let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() >= 64, "only {} distinct buckets of 128 for 128 keys", low.len());
        assert!(top.len() >= 64, "only {} distinct control values for 128 keys", top.len());
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut m: FastMap<(u64, bool), u32> = FastMap::default();
        for i in 0..1000u32 {
            m.insert((u64::from(i) << 12, i % 2 == 0), i);
        }
        assert_eq!(m.len(), 1000);
        assert!((0..1000u32).all(|i| m[&(u64::from(i) << 12, i % 2 == 0)] == i));
        assert_eq!(m.get(&(1 << 12, true)), None);
    }
}
