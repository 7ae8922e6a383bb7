//! Eviction policies: each maps a node's replicated state to a key; victims
//! leave in ascending (key, node id) order, a total order every rank shares.

use std::str::FromStr;

use crate::clock::Stamp;
use crate::error::EvictError;
use crate::node::Node;

/// The policy part of an eviction key; the index appends the node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyKey(pub [u64; 2]);

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
    /// Reuse buys time, measured in the cache's own horizon: a node accessed
    /// at `now` gets priority `now + horizon * bonus(hits)`, where `horizon`
    /// is how far back the cache currently reaches (`now` minus the latest
    /// last-access stamp among device victims) and `bonus` is 0 for a
    /// one-shot node, 1 once reused and +1/2 per further hit (capped). Unlike
    /// `slru`, protection ages out, and it scales itself to the capacity and
    /// traffic with no tuning in wall-clock units. The key changes only on
    /// access, so the ordered index stays valid between accesses.
    Horizon,
}

/// `Policy::Horizon` bonus, in sixteenths of a horizon.
const REUSED_BONUS: u64 = 16;
const PER_HIT_BONUS: u64 = 8;
const MAX_COUNTED_HITS: u64 = 64;

impl Policy {
    pub const ALL: [Policy; 5] = [Self::Lru, Self::Lfu, Self::Fifo, Self::Slru, Self::Horizon];
    pub const NAMES: [&'static str; 5] = ["lru", "lfu", "fifo", "slru", "horizon"];

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
            Self::Horizon => PolicyKey([node.priority, node.last_access]),
        }
    }

    /// The priority `Policy::Horizon` gives a node accessed at `now` while
    /// the cache reaches back to `floor`; stored on the node.
    pub fn priority(self, node: &Node, now: Stamp, floor: Stamp) -> u64 {
        let bonus = if node.hits >= 2 {
            REUSED_BONUS + PER_HIT_BONUS * (node.hits - 2).min(MAX_COUNTED_HITS)
        } else {
            0
        };
        let horizon = now.saturating_sub(floor);
        now.saturating_add(horizon.saturating_mul(bonus) / 16)
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
