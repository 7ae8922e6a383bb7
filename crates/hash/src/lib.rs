//! The one hash construction behind every cpkv digest.
//!
//! Digests are compared across processes, machines and builds, so the hash
//! is fixed here once: no `std` hasher (its seed may vary), a fixed seed, and
//! a construction whose every step is a bijection. Absorbing a word is
//! `state = mix64(state ^ word)`, a bijection of the word for a given state
//! and of the state for a given word, and `finish` is a bijection too, so two
//! inputs of the same length that differ in exactly one word always hash
//! differently: no field value can cancel another or vanish (a product with
//! a zero factor, for example, would). Word sequences are length-prefixed, so
//! a shorter sequence is never a prefix-collision of a longer one.
//!
//! Digests of sets are wrapping sums of element hashes (order-independent and
//! updatable in O(1)); the canonical digests (SHA-256 over a sorted encoding)
//! live with the structures that need them.

use std::hash::{BuildHasherDefault, Hasher};

/// The fixed seed every hash starts from (the fractional bits of sqrt(2)).
pub const SEED: u64 = 0x6a09_e667_f3bc_c908;
/// XORed in before the final mix, so `finish` differs from one more `word`.
const FINISH_KEY: u64 = 0xbb67_ae85_84ca_a73b;

/// The SplitMix64 finaliser: a bijection on u64 with full avalanche.
#[inline]
pub const fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A streaming 64-bit hash: `Hasher64::new(tag).word(a).word(b).finish()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hasher64(u64);

impl Default for Hasher64 {
    fn default() -> Self {
        Self::new(0)
    }
}

impl Hasher64 {
    /// A hasher for elements of kind `tag` (distinct kinds never collide by
    /// construction of their inputs alone).
    #[inline]
    pub const fn new(tag: u64) -> Self {
        Self(mix64(SEED ^ tag))
    }

    #[inline]
    #[must_use]
    pub const fn word(self, value: u64) -> Self {
        Self(mix64(self.0 ^ value))
    }

    /// A length-prefixed sequence of words.
    #[must_use]
    pub fn words(self, values: &[u64]) -> Self {
        values
            .iter()
            .fold(self.word(values.len() as u64), |h, v| h.word(*v))
    }

    /// Length-prefixed bytes, little-endian words, the last one zero-padded.
    /// Whole words are read as they are; only a short last one is copied
    /// into a padded word (a copy of a variable length per word was a
    /// `memcpy` call each, a third of the time of an engine key's hash).
    #[must_use]
    pub fn bytes(self, bytes: &[u8]) -> Self {
        let mut chunks = bytes.chunks_exact(8);
        let mut h = self.word(bytes.len() as u64);
        for chunk in &mut chunks {
            h = h.word(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            h = h.word(u64::from_le_bytes(word));
        }
        h
    }

    #[inline]
    pub const fn finish(self) -> u64 {
        mix64(self.0 ^ FINISH_KEY)
    }
}

/// The hash of a tagged tuple of words (an element of a digest's set).
#[inline]
pub fn hash_words(tag: u64, words: &[u64]) -> u64 {
    words
        .iter()
        .fold(Hasher64::new(tag).word(words.len() as u64), |h, w| {
            h.word(*w)
        })
        .finish()
}

/// A cheap fold of a run of words into one, for runs a digest hashes again
/// whenever they are cut (a shadow trie's leaves lose their tails): `h = h *
/// K + w` from the length, K odd, so each step is a bijection of the word
/// for a given state and two runs of one length that differ in one word
/// fold differently. Not mixed: absorb the fold with `Hasher64::word`.
#[inline]
pub fn fold_words(words: &[u64]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    words.iter().fold(words.len() as u64, |h, &w| {
        h.wrapping_mul(K).wrapping_add(w)
    })
}

/// A `Hasher` for hash tables keyed by one 64-bit word (page ids, content
/// keys): one `mix64`, cheaper than SipHash. Tables built with it are only
/// looked up, never iterated in a decision, so their order cannot leak.
#[derive(Debug, Default, Clone, Copy)]
pub struct WordHasher(u64);

/// `BuildHasher` of `WordHasher`.
pub type WordHashing = BuildHasherDefault<WordHasher>;

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        mix64(self.0)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// A `Hasher` for hash tables with composite or byte-string keys (engine
/// keys, request ids, (group, position) pairs): each word is folded in with
/// one rotate, xor and multiply, bytes eight at a time, and `finish` mixes
/// once. Several times cheaper than SipHash on the short keys cpkv's tables
/// hold. Tables built with it are only looked up, never iterated in a
/// decision, so their order cannot leak; the keys they hold are engine
/// hashes, not text an attacker chooses bucket by bucket.
#[derive(Debug, Clone, Copy)]
pub struct KeyHasher(u64);

/// `BuildHasher` of `KeyHasher`.
pub type KeyHashing = BuildHasherDefault<KeyHasher>;

impl Default for KeyHasher {
    fn default() -> Self {
        Self(SEED)
    }
}

impl KeyHasher {
    #[inline]
    fn fold(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        mix64(self.0)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.fold(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.fold(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, value: u8) {
        self.fold(u64::from(value));
    }
    #[inline]
    fn write_u32(&mut self, value: u32) {
        self.fold(u64::from(value));
    }
    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.fold(value);
    }
    #[inline]
    fn write_usize(&mut self, value: usize) {
        self.fold(value as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pinned values (computed by an independent Python rendering of the
    /// construction): a change here changes every digest cpkv reports,
    /// so it must be deliberate.
    #[test]
    fn golden_values() {
        assert_eq!(mix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(hash_words(0, &[]), GOLDEN_EMPTY);
        assert_eq!(hash_words(7, &[1, 2, 3]), GOLDEN_123);
    }
    const GOLDEN_EMPTY: u64 = 0x536a_e816_b11f_67fd;
    const GOLDEN_123: u64 = 0x677c_6c2b_61ce_78e1;

    /// `bytes` pinned too (an SGLang-shaped key: 64 hex digits, then group
    /// 0's four bytes; and a short one; the same independent rendering):
    /// the engines' key tokens and tags.
    #[test]
    fn golden_bytes() {
        let mut key = b"0123456789abcdef".repeat(4);
        key.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(Hasher64::new(7).bytes(&key).finish(), GOLDEN_KEY);
        assert_eq!(Hasher64::new(7).bytes(b"abc").finish(), GOLDEN_ABC);
    }
    const GOLDEN_KEY: u64 = 0xf96e_3e09_5ed8_5c4c;

    /// `fold_words` pinned (Python: `h = len; h = (h * K + w) % 2**64`),
    /// and one changed word, or one word more, always changes the fold.
    #[test]
    fn folds() {
        assert_eq!(fold_words(&[]), 0);
        assert_eq!(fold_words(&[1, 2, 3]), GOLDEN_FOLD_123);
        assert_ne!(fold_words(&[1, 2, 3]), fold_words(&[1, 2, 4]));
        assert_ne!(fold_words(&[0]), fold_words(&[0, 0]));
    }
    const GOLDEN_ABC: u64 = 0xcb13_cac2_153b_f598;
    const GOLDEN_FOLD_123: u64 = 0x3c92_3740_d67a_3a6d;

    #[test]
    fn words_that_used_to_vanish_still_count() {
        // A word equal to a multiply constant once zeroed a product.
        for w in [0xa076_1d64_78bd_642f, 0x100_0000_01b3, 0, u64::MAX, SEED] {
            assert_ne!(hash_words(1, &[w, 5]), hash_words(1, &[w, 6]));
            assert_ne!(hash_words(1, &[5, w]), hash_words(1, &[6, w]));
        }
    }

    /// Engine-like keys (sequential block hashes, then a four-byte group):
    /// every key its own hash, and the low bits, which pick a table's
    /// bucket, spread over all their values.
    #[test]
    fn key_hasher_spreads_sequential_keys() {
        use std::hash::BuildHasher;
        let hashing = KeyHashing::default();
        let hashes: Vec<u64> = (0..65_536u64)
            .map(|i| {
                let mut key = i.to_be_bytes().to_vec();
                key.extend_from_slice(&[0, 0, 0, 1]);
                hashing.hash_one(key.as_slice())
            })
            .collect();
        let mut distinct = hashes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), hashes.len());
        let mut buckets = vec![0u32; 4096];
        for h in &hashes {
            buckets[(h & 4095) as usize] += 1;
        }
        let (least, most) = (buckets.iter().min(), buckets.iter().max());
        assert!(least >= Some(&2) && most <= Some(&40), "{least:?} {most:?}");
        // A trailing zero byte, or the same words in another order, differ.
        assert_ne!(hashing.hash_one(&b"ab"[..]), hashing.hash_one(&b"ab\0"[..]));
        assert_ne!(
            hashing.hash_one((1u32, 2u64)),
            hashing.hash_one((2u32, 1u64))
        );
    }

    proptest! {
        #[test]
        fn changing_one_word_always_changes_the_hash(
            words in proptest::collection::vec(any::<u64>(), 1..8),
            at in any::<proptest::sample::Index>(),
            other in any::<u64>(),
        ) {
            let i = at.index(words.len());
            prop_assume!(other != words[i]);
            let mut changed = words.clone();
            changed[i] = other;
            prop_assert_ne!(hash_words(3, &words), hash_words(3, &changed));
        }

        #[test]
        fn lengths_and_tags_separate(words in proptest::collection::vec(any::<u64>(), 0..6)) {
            let mut longer = words.clone();
            longer.push(0);
            prop_assert_ne!(hash_words(3, &words), hash_words(3, &longer));
            prop_assert_ne!(hash_words(3, &words), hash_words(4, &words));
        }

        /// `bytes` is its definition: the length, then each run of eight
        /// bytes as a little-endian word, the last one zero-padded.
        #[test]
        fn bytes_is_its_definition(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let mut want = Hasher64::new(5).word(bytes.len() as u64);
            for chunk in bytes.chunks(8) {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                want = want.word(u64::from_le_bytes(word));
            }
            prop_assert_eq!(Hasher64::new(5).bytes(&bytes), want);
        }
    }
}
