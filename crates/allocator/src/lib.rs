//! Deterministic first-fit page allocator for a shared host (L2) KV pool.
//!
//! Every CP rank of a node runs the same `PageAllocator` over the same
//! replicated event stream and so computes the identical placement without
//! talking to the others; `digest()` (O(1), incremental) and
//! `canonical_digest()` (SHA-256, for audits) make that agreement checkable.

mod allocator;
mod digest;
mod error;
mod extent;
mod extent_tree;
mod free_list;
mod payload;
mod placement;
mod snapshot;
mod stats;

pub use allocator::PageAllocator;
pub use error::{AllocError, Result};
pub use extent::Extent;
pub use payload::{PayloadId, PayloadSet, Payloads, MAX_CAPACITY, MAX_PAYLOADS};
pub use placement::Placement;
pub use snapshot::SNAPSHOT_VERSION;
pub use stats::{Counters, PayloadStats, Stats};
