//! Eviction policies: each maps a node's replicated state to a key; victims
//! leave in ascending (key, node id) order, a total order every rank shares.

use std::str::FromStr;

use crate::clock::Stamp;
use crate::error::EvictError;
use crate::evictable::PolicyKey;
use crate::ghost_history::{Weights, SIXTEENTHS};
use crate::node::Node;
use crate::queue_shared::Slot;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Least recently accessed first.
    Lru,
    /// Fewest hits first, then least recent.
    Lfu,
    /// Oldest insertion first.
    Fifo,
    /// Segmented LRU as the seed defined it: (hits >= 2, last access), so
    /// one-shot prefixes go before reused ones.
    Slru,
    /// Reuse buys time, new content is on probation, and content that
    /// returns soon after it was dropped keeps its count. A node accessed at
    /// `now` gets priority `now + bonus * horizon * (hits - 1)` once reused
    /// and `now - probation * horizon` while one-shot. `horizon` is how far
    /// back the cache currently reaches (`now` minus the latest position
    /// among device victims), so everything scales with the cache and the
    /// traffic, in no wall-clock unit. A node dropped from the tree is
    /// remembered in a bounded ghost history with its hit count; a new leaf
    /// whose content is found there starts with those hits plus one, so a
    /// conversation whose turns are farther apart than the cache reaches is
    /// recognised as reused on its return. `bonus` and `probation` adapt to
    /// the share `s` of recent reuse that came back from the history rather
    /// than hitting the cache: `bonus = s`, `probation = clamp(2s, 1/2, 1)`.
    /// Reuse the cache keeps up with tends to plain recency; reuse that
    /// outruns it keeps fewer newcomers, longer.
    ///
    /// That priority is one of five rankings the policy chooses between
    /// online: a miniature cache per candidate (the priority above;
    /// plain recency; one-shot before reused, remembered hits counting,
    /// then recency; arc; s3fifo) replays a hashed sample of the inserts at
    /// the sampled share of the tree's capacity, and the tree ranks its
    /// leaves as the candidate with the most hit pages lately does
    /// (`shadow.rs`, `sampling.rs`, `lean_candidate.rs`). Following arc or
    /// s3fifo, it builds that policy's queue state from its own nodes
    /// (`PrefixTree::follow`, `transplant.rs`). A victim holding at least
    /// twice the pages an eviction still needs loses only its tail
    /// (`PrefixTree::evict`). The key changes only on
    /// access, creation or a switch of ranking, so the ordered index stays
    /// valid in between. Why each part is there, what it costs, and how its
    /// constants were chosen: `docs/ghost.md`.
    Ghost,
    /// Adaptive replacement: recency and frequency queues whose split
    /// follows ghost hits (see `arc.rs`).
    Arc,
    /// Small and main FIFO queues with a ghost queue (see `s3fifo.rs`).
    S3fifo,
}

impl Policy {
    // New policies go last: a policy's position is part of the digest.
    pub const ALL: [Policy; 7] = [
        Self::Lru,
        Self::Lfu,
        Self::Fifo,
        Self::Slru,
        Self::Ghost,
        Self::Arc,
        Self::S3fifo,
    ];
    pub const NAMES: [&'static str; 7] = ["lru", "lfu", "fifo", "slru", "ghost", "arc", "s3fifo"];
    /// The one policy every part of cpkv starts with (the tree, the tier
    /// cache, `cpkv replay`, the engine backends), chosen by measurement:
    /// see the README's "Default policy".
    pub const DEFAULT: Policy = Policy::Ghost;

    pub fn name(self) -> &'static str {
        Self::NAMES[Self::ALL.iter().position(|p| *p == self).expect("listed")]
    }

    /// The eviction key of `node`; it only changes when the node is accessed,
    /// created or split, which is when the index refreshes it.
    pub fn key(self, node: &Node) -> PolicyKey {
        match self {
            Self::Lru => PolicyKey([node.last_access, 0]),
            Self::Lfu => PolicyKey([node.hits, node.last_access]),
            Self::Fifo => PolicyKey([node.created, 0]),
            Self::Slru => PolicyKey([u64::from(node.hits >= 2), node.last_access]),
            Self::Ghost => PolicyKey([node.priority, node.last_access]),
            Self::Arc | Self::S3fifo => Slot::key(node.queue_slot),
        }
    }

    /// The priority `Policy::Ghost` gives a node accessed at `now` while
    /// the cache reaches back to `floor`; stored on the node. The queue
    /// policies rank by the node's queue slot instead (`queue_shared::Slot`).
    pub(crate) fn priority(self, node: &Node, now: Stamp, floor: Stamp, weights: Weights) -> u64 {
        debug_assert!(!self.is_queued(), "{} ranks by queue slots", self.name());
        ghost_priority(node.hits, now, floor, weights)
    }

    /// Whether the policy keeps queue state beside the nodes (`queues.rs`).
    pub fn is_queued(self) -> bool {
        matches!(self, Self::Arc | Self::S3fifo)
    }

    /// Whether the policy keeps a history of content dropped from the tree.
    pub fn remembers_dropped(self) -> bool {
        self == Self::Ghost
    }
}

/// `Policy::Ghost`'s priority of content with `hits` hits accessed at `now`
/// while the cache reaches back to `floor` (see `Policy::Ghost`): the tree's
/// nodes and ghost's lean priority candidate rank by this one formula.
pub(crate) fn ghost_priority(hits: u64, now: Stamp, floor: Stamp, weights: Weights) -> u64 {
    let horizon = now.saturating_sub(floor);
    if hits >= 2 {
        let bonus = horizon
            .saturating_mul(hits - 1)
            .saturating_mul(weights.reuse_bonus);
        now.saturating_add(bonus / SIXTEENTHS)
    } else {
        now.saturating_sub(horizon.saturating_mul(weights.probation) / SIXTEENTHS)
    }
}

impl FromStr for Policy {
    type Err = EvictError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| EvictError::UnknownPolicy(name.to_string()))
    }
}
