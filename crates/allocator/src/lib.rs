//! Deterministic first-fit page allocator for a shared host (L2) KV pool:
//! the host tier's slab rows, for the main job and both engines, come from
//! its extents (`cpkv_tier::HostRows`: one object per backup, or an engine
//! store call's rows reserved as one batch by `reserve_held` and held by
//! row number, each freed on its own by `release_held`).
//!
//! Every CP rank of a node runs the same `PageAllocator` over the same
//! replicated event stream and so computes the identical placement without
//! talking to the others; `digest()` (O(1), incremental) and
//! `canonical_digest()` (SHA-256, for audits) make that agreement checkable.

/// `PageAllocator`: reserve, release, commit, split, queries, audit.
mod allocator;
/// The incremental order-independent state digest.
mod digest;
/// `AllocError`, the one error type.
mod error;
/// `Extent`: a run of contiguous pages.
mod extent;
/// B+tree of free extents with subtree maxima: O(log F) first fit.
mod extent_tree;
/// One payload's free extents: coalescing and page counts.
mod free_list;
/// Pages held by page number (`reserve_held`): one bit per page.
mod held;
/// The live objects by key (hash lookup; walked only in key order).
mod object_map;
/// Payload names, capacities and payload sets.
mod payload;
/// `Placement`: an object's extents per payload.
mod placement;
/// Versioned snapshots and the canonical serialisation.
mod snapshot;
/// Counters and per-payload occupancy.
mod stats;

pub use allocator::PageAllocator;
pub use error::{AllocError, Result};
pub use extent::Extent;
pub use payload::{PayloadId, PayloadSet, Payloads, MAX_CAPACITY, MAX_PAYLOADS};
pub use placement::Placement;
pub use snapshot::SNAPSHOT_VERSION;
pub use stats::{Counters, PayloadStats, Stats};
