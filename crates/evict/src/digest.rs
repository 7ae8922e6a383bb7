//! An order-independent digest of the replicated state.
//!
//! Each live node contributes a 64-bit hash of everything that is replicated
//! about it; the digest is the wrapping sum of those hashes, updated whenever
//! a node changes, so reading it is O(1) and two ranks agree iff (with
//! overwhelming probability) their trees, clocks, stamps, counts and tiers do.

use cpkv_hash::Hasher64;

use crate::namespace::Namespace;
use crate::node::Node;

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
        .word(node.order_word())
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
