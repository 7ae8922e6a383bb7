//! The tree's identifiers: tokens, device pages, host objects, nodes and tiers.
//! A leaf of the crate: every other module names these, and they name nothing.

use std::fmt;

/// A token id.
pub type Token = u64;
/// An engine's device (L1) page id.
pub type PageId = u64;
/// The host allocator's key of a node's backup object (L2).
pub type HostKey = u64;

/// A node's slot in the tree's arena (low 32 bits) and that slot's
/// generation (high 32 bits). Slots are reused, ids are not: every rank that
/// replays the same calls names the same node with the same id, and an id
/// kept past its node's removal names nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The residency tiers a node can be evicted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    Device,
    Host,
}
