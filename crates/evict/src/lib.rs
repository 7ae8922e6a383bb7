//! Replicated prefix tree with a logical clock and O(log n) deterministic eviction.
//!
//! Every decision reads only replicated state (the event stream, a logical
//! clock, counter-assigned node ids), and every eviction key ends in the node
//! id, so all context-parallel ranks that replay the same calls evict the same
//! victims without exchanging a word. `digest` makes that checkable.
//!
//! The modules, from the ground up: each imports only those on the lines
//! above it.
//!
//! | layer | modules |
//! |---|---|
//! | words | `ids`, `clock`, `namespace`, `error`, `events` |
//! | a node and where nodes live | `node`, `child_key` (child lookup, page words), `arena` (slots), `page_set`, `evictable` (the ordered index), `digest` |
//! | what policies remember | `ghost_history` (`Policy::Ghost`'s history of dropped content), `queue_ghost_lists` (ARC's and S3-FIFO's ghost lists) |
//! | how policies rank | `queue_shared` (the node slot and books both queue policies share), `arc`, `s3fifo`, `queues` (the queue state a tree keeps), `policy`, `lean_candidate` (ghost's candidates as lean miniature caches), `ranking` (the rankings `Policy::Ghost` chooses between), `sampling` (which requests its candidates see) |
//! | the tree | `tree` (with `tree/`): it knows the ghost policy's layer only as a `RankingChooser` |
//! | above the tree | `transplant` (a queue policy's take-over order, read from its candidate), `shadow` (ghost's shadow caches: the layer that chooses its ranking), `snapshot` |
//!
//! Snapshots and the policy state inside them share the allocator's
//! encoding (`cpkv_wire`).

mod clock;
mod error;
mod events;
mod ids;
mod namespace;

mod arena;
mod child_key;
mod digest;
mod evictable;
mod node;
mod page_set;

mod ghost_history;
mod queue_ghost_lists;

mod arc;
mod lean_candidate;
mod policy;
mod queue_shared;
mod queues;
mod ranking;
mod s3fifo;
mod sampling;

mod tree;

mod shadow;
mod snapshot;
mod transplant;

pub use clock::Stamp;
pub use error::EvictError;
pub use events::Event;
pub use evictable::PolicyKey;
pub use ids::{HostKey, NodeId, PageId, Tier, Token};
pub use namespace::Namespace;
pub use node::Node;
pub use policy::Policy;
pub use sampling::Sampling;
pub use shadow::candidate_hits;
#[cfg(feature = "floor-measurements")]
pub use shadow::recency_candidate_hits;
pub use snapshot::TREE_SNAPSHOT_VERSION;
pub use tree::{
    DeviceVictim, HostVictim, InsertResult, MatchResult, PolicyMemory, PrefixTree,
    DEFAULT_EVENT_LIMIT, IDLE_ROOTS_KEPT, MAX_PAGE_SIZE,
};
