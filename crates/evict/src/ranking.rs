//! The rankings `Policy::Ghost` chooses between (`shadow.rs` measures
//! which one fits): each orders leaves as one policy does, and the ghost tree
//! keys its index by the ranking it follows.

use crate::evictable::PolicyKey;
use crate::node::Node;
use crate::policy::Policy;

/// A way to order leaves that `Policy::Ghost` can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    /// The ghost priority (reuse bonus, probation), then recency.
    Priority,
    /// Plain recency.
    Recency,
    /// One-shot before reused (hits remembered across evictions count),
    /// then recency.
    Segmented,
    /// ARC's queues (`arc.rs`), kept on the nodes while it leads.
    Arc,
    /// S3-FIFO's queues (`s3fifo.rs`), kept on the nodes while it leads.
    S3fifo,
}

impl Ranking {
    /// The eviction key of `node` under this ranking: each ranks as one
    /// policy does (the priority as `Policy::Ghost` itself, recency as lru,
    /// segmented as slru, the queues by their slots).
    pub fn key(self, node: &Node) -> PolicyKey {
        self.keyed_as().key(node)
    }

    /// The policy whose key this ranking uses.
    fn keyed_as(self) -> Policy {
        match self {
            Self::Priority => Policy::Ghost,
            Self::Recency => Policy::Lru,
            Self::Segmented => Policy::Slru,
            Self::Arc => Policy::Arc,
            Self::S3fifo => Policy::S3fifo,
        }
    }

    /// The ranking's name (`PrefixTree::following`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Priority => "priority",
            Self::Recency => "recency",
            Self::Segmented => "segmented",
            Self::Arc => "arc",
            Self::S3fifo => "s3fifo",
        }
    }

    /// The queue policy this ranking runs, if it is one.
    pub fn queue_policy(self) -> Option<Policy> {
        match self {
            Self::Arc => Some(Policy::Arc),
            Self::S3fifo => Some(Policy::S3fifo),
            _ => None,
        }
    }
}

/// The candidates, in tie-break order (the first wins a tie).
pub const CANDIDATES: [Ranking; 5] = [
    Ranking::Priority,
    Ranking::Recency,
    Ranking::Segmented,
    Ranking::Arc,
    Ranking::S3fifo,
];
