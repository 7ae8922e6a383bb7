//! An order-independent digest of the replicated state.
//!
//! Each live node contributes a 64-bit hash of everything that is replicated
//! about it; the digest is the wrapping sum of those hashes, updated whenever
//! a node changes, so reading it is O(1) and two ranks agree iff (with
//! overwhelming probability) their trees, clocks, stamps, counts and tiers do.

use std::hash::{BuildHasherDefault, Hasher};

use crate::namespace::Namespace;
use crate::node::Node;

/// A 64-bit streaming hash with a fixed seed (FNV-style absorb, splitmix64
/// finish): deterministic across processes and platforms.
#[derive(Debug, Clone, Copy)]
pub struct Hasher64(u64);

impl Default for Hasher64 {
    fn default() -> Self {
        Self(0x6a09_e667_f3bc_c908)
    }
}

impl Hasher64 {
    pub fn word(mut self, value: u64) -> Self {
        self.0 = mix(self.0 ^ value).wrapping_mul(0x100_0000_01b3);
        self
    }

    pub fn words(self, values: &[u64]) -> Self {
        values
            .iter()
            .fold(self.word(values.len() as u64), |h, v| h.word(*v))
    }

    pub fn bytes(self, bytes: &[u8]) -> Self {
        bytes
            .chunks(8)
            .fold(self.word(bytes.len() as u64), |h, chunk| {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                h.word(u64::from_le_bytes(word))
            })
    }

    pub fn finish(self) -> u64 {
        mix(self.0)
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub fn namespace_hash(namespace: &Namespace) -> u64 {
    let h = Hasher64::default();
    match namespace {
        Namespace::Default => h.word(0),
        Namespace::Id(id) => h.word(1).word(*id),
        Namespace::Name(name) => h.word(2).bytes(name.as_bytes()),
    }
    .finish()
}

/// The contribution of one node. `tokens_hash` is cached by the tree because
/// tokens only change on split.
pub fn node_hash(node: &Node, tokens_hash: u64) -> u64 {
    let h = Hasher64::default()
        .word(node.id.0)
        .word(node.parent.map_or(u64::MAX, |p| p.0))
        .word(tokens_hash)
        .word(node.created)
        .word(node.last_access)
        .word(node.hits)
        .word(node.locks)
        .word(node.pins)
        .word(node.priority)
        .word(node.host.map_or(0, |k| k.wrapping_add(1)))
        .word(u64::from(node.host.is_some()));
    match &node.device {
        Some(pages) => h.word(1).words(pages),
        None => h.word(0),
    }
    .finish()
}

pub fn tokens_hash(tokens: &[u64]) -> u64 {
    Hasher64::default().words(tokens).finish()
}

/// Hashes one 64-bit word with `mix`, for the tree's own hash tables (page
/// ids, ghost keys): cheaper than SipHash, and fixed, though nothing ever
/// depends on those tables' order (they are looked up, never iterated in a
/// decision).
#[derive(Debug, Default, Clone, Copy)]
pub struct WordHasher(u64);

pub type WordHashing = BuildHasherDefault<WordHasher>;

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        mix(self.0)
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
