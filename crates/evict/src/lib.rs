//! Replicated prefix tree with a logical clock and O(log n) deterministic eviction.
//!
//! Every decision reads only replicated state (the event stream, a logical
//! clock, counter-assigned node ids), and every eviction key ends in the node
//! id, so all context-parallel ranks that replay the same calls evict the same
//! victims without exchanging a word. `digest` makes that checkable.

mod arc;
mod arena;
mod child_key;
mod clock;
mod digest;
mod error;
mod events;
mod evictable;
mod ghost;
mod ghost_list;
mod ids;
mod namespace;
mod node;
mod page_set;
mod policy;
mod queues;
mod s3fifo;
mod shadow;
mod snapshot;
mod transplant;
mod tree;

// Snapshots and the policy state inside them share the allocator's encoding.
use cpkv_wire as wire;

pub use clock::Stamp;
pub use error::EvictError;
pub use events::Event;
pub use evictable::PolicyKey;
pub use ids::{HostKey, NodeId, PageId, Tier, Token};
pub use namespace::Namespace;
pub use node::Node;
pub use policy::Policy;
pub use shadow::PolicyMemory;
pub use snapshot::TREE_SNAPSHOT_VERSION;
pub use tree::{
    DeviceVictim, HostVictim, InsertResult, MatchResult, PrefixTree, DEFAULT_EVENT_LIMIT,
    IDLE_ROOTS_KEPT, MAX_PAGE_SIZE,
};
