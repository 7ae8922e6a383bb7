//! The two-tier CP KV cache's decisions: which node to back up, where its
//! host copy goes, what to evict in both tiers, what to load back and what
//! to admit, as a pure function of the replicated call sequence.
//!
//! One host-tier core, `HostIndex` (the prefix tree, the slab rows from
//! the first-fit `PageAllocator`'s extents, the pins, a digest), serves
//! both users: `OffloadIndex`, the engines' call protocol (one core call
//! per engine call), and `TierCache`,
//! which adds the device tier on top (the same tree carries both tiers'
//! residency; the device page pool sits beside it) and exposes one combined
//! digest. Python (`cpkv.tier.CacheController`) only moves bytes, runs
//! collectives and keeps time around it.
//!
//! One forward, from the engine's side (`C` marks the only collectives):
//! 1. `lookup` each request (device hit, host hit; the path is locked);
//!    `plan_load` the host-only part: device pages to fill from slab rows;
//!    `allocate` pages for the new tokens.
//! 2. Per layer: each rank copies the slab rows of the load pages it owns,
//!    the model runs, each rank copies the pages of pending backups it owns
//!    into the slab (write-through, overlapping the forward).
//! 3. `insert` each request: the tree adopts its pages; backups are
//!    reserved for the path's nodes without a host copy, evicting host
//!    objects in policy order on a capacity miss, skipping on every rank
//!    alike if even that cannot make room.
//! 4. C: one all-reduce MIN of each rank's completed-backup frontier, then
//!    `commit(frontier)`: finished objects become host copies.
//! 5. C, every k forwards: one all-reduce MIN/MAX of `digest()`.
//!
//! Nothing else needs a collective: every rank replays the same calls on
//! the same state, so it reaches the same decisions; the frontier is the
//! only input that differs per rank, and it is made common by the MIN
//! before any decision reads it.

/// `TierCache`: the engine-level operations.
mod cache;
/// The cache's side of spills (`spill.rs` holds the bookkeeping).
mod cache_spills;
/// `TierConfig`: the cache's shape.
mod config;
/// `DevicePool`: logical device pages, free / held by the caller / cached.
mod device_pool;
/// `TierError`, the one error type.
mod error;
/// `HostIndex`: the host tier's core (tree, rows, pins, digest) that the
/// main job and the engines share.
mod host_index;
/// The durable third tier (L3) below the host slab: record codec, index,
/// namespace, writer rule.
pub mod l3;
/// Host objects: the rows one backup holds.
mod objects;
/// `OffloadIndex`: the engine-call protocol over the host tier's core
/// (vLLM's scheduler-side manager, SGLang's HiCache store calls), one core
/// call per engine call; one file per concept under `offload/`.
mod offload;
/// Which rank owns which page, and the rows (and runs) each rank copies.
mod ownership;
/// Plain results: lookups, load plans, backups, commits.
mod plan;
/// `HostRows`: the host tier's one row placement, first-fit allocator
/// extents.
mod rows;
/// Host segments: tree host keys into host objects (a backup's rows).
mod segments;
/// Spills: the pages host eviction hands to L3, with their content keys.
mod spill;
/// Counters.
mod stats;

pub use cache::TierCache;
pub use config::{TierConfig, MAX_CP_SIZE, MAX_PAGES};
pub use cpkv_evict::{Namespace, NodeId, PageId, Policy};
pub use device_pool::DevicePool;
pub use error::{Result, TierError};
pub use host_index::{HostIndex, Pin};
pub use offload::{
    key_hex, push_text_key, Evicted, KeyState, OffloadIndex, OffloadStats, Placed, StorePlan,
    GROUP_BYTES, MAX_KEYS_PER_CALL, MAX_OFFLOAD_ROWS,
};
pub use ownership::{owned_rows, OwnedRows};
pub use plan::{Backup, CommitOutcome, InsertOutcome, LoadPlan, LoadRun, Lookup};
pub use rows::{HostRows, MAX_ROWS};
pub use spill::{page_keys, Spilled};
pub use stats::TierStats;
