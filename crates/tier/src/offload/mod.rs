//! `OffloadIndex`: an engine's host tier of offloaded blocks, one call per
//! engine call (vLLM's scheduler-side `OffloadingManager`).
//!
//! Keys are the engine's opaque bytes; the last four name the block's group
//! (big-endian, vLLM's `OffloadKey` layout), and each group is a namespace of
//! the prefix tree. A block's path in the tree is the chain of blocks before
//! it in the request that stored it (the engine's hashes are chained, so the
//! chain is the block's identity); a block whose parent is not on the host
//! when it is stored starts a path under its namespace root, which is still
//! exact. The tree evicts leaves in the policy's order, so a block never
//! leaves before the blocks that continue it: what stays is a usable prefix.
//! A victim loses only the rows the call still needs, cut from its tail
//! (ghost by its own tail rule: at most half of a victim, else all of it).
//!
//! Pins are tree locks (the core's `HostIndex::pin`): a store pins its blocks until each completes, a load
//! pins what it reads until `complete_load`, and `prepare_store` pins the
//! resident blocks it was offered (and the parents of the new ones) while it
//! evicts. A failed store leaves its blocks unreadable and unpinned; the next
//! offer rewrites them in their own rows.
//!
//! Every decision is a function of the calls alone (the key map is only
//! looked up, never iterated in a decision), so two indexes fed the same
//! calls report the same `digest`.
//!
//! An engine whose stores are synchronous (SGLang's HiCache `batch_set`:
//! keys continue a prefix key and each other, and are written before the
//! call returns) makes one `store` call, which is exactly those calls in a
//! row. Its reads (`locate`) change nothing. Each chunk's `serial` (from 1,
//! never reused, not even across `reset`) names one content of its row: the
//! engine stamps a written row with it, so a reused row is never read torn.
//!
//! The index is the engine-call protocol over the host tier's core
//! (`HostIndex`: tree, rows, pins, digest); its files, one concept each:

/// Batched reads: `locate_many`, a call's keys found in passes.
mod batch;
/// Chunks: one per resident key, its row, serial and state.
mod chunks;
/// Engine keys: their group, their 64-bit token, their checks.
mod keys;
/// Reads: `lookup`, `prepare_load`/`complete_load`, `touch`, and the
/// per-request record of positions that later stores find parents in.
mod load;
/// A software prefetch (a hint: starts a cache line's fetch).
mod prefetch;
/// Writes: `prepare_store`/`complete_store`, the synchronous `store`,
/// eviction and placement.
mod store;
/// What an index shows: `locate`, `digest`, `stats`, the audit.
mod views;

use std::collections::{HashMap, VecDeque};

use cpkv_evict::Policy;
use cpkv_hash::KeyHashing;

use crate::error::{Result, TierError};
use crate::host_index::HostIndex;

pub use chunks::{KeyState, Placed};
pub use keys::{key_hex, push_text_key, GROUP_BYTES, MAX_KEYS_PER_CALL};
pub use store::{Evicted, StorePlan};
pub use views::OffloadStats;

use chunks::Chunk;

/// The most rows an index holds (row numbers fit a u32, as the engine's
/// int32 block ids need).
pub const MAX_OFFLOAD_ROWS: u64 = (1 << 31) - 1;

const NO_SLOT: u32 = u32::MAX;

/// The request `store` runs as; an engine's own request ids never start
/// with a NUL.
const STORE_REQUEST: &str = "\0store";

/// A request's chunks by (group, end position): (slot, serial).
type Chain = Map<(u32, u64), (u32, u64)>;

/// The index's tables: looked up, never iterated in a decision.
type Map<K, V> = HashMap<K, V, KeyHashing>;

#[derive(Debug)]
pub struct OffloadIndex {
    policy: Policy,
    tokens_per_chunk: Vec<u64>,
    /// The host tier's core: the tree (a chunk is one page of one token,
    /// its row the page), the rows (first-fit allocator), the pins, the
    /// digest.
    host: HostIndex,
    slots: Vec<Option<Chunk>>,
    free_slots: Vec<u32>,
    /// Each resident chunk's slot by its key's token (`token_of`); a
    /// lookup confirms the key itself, so a token never names a wrong key.
    by_token: Map<u64, u32>,
    by_row: Vec<u32>,
    /// (request, its chunks sorted) -> load pins, oldest first: an engine
    /// completes a load with the same keys.
    loads: Map<(Box<str>, Vec<u32>), VecDeque<u64>>,
    /// Per live request: (group, end position) -> (slot, serial) of the
    /// chunks it loaded, touched or stored, so a later store finds parents.
    requests: Map<Box<str>, Chain>,
    next_serial: u64,
    epoch: u64,
    evicted: u64,
    chunk_digest: u64,
}

impl OffloadIndex {
    pub fn new(capacity: u64, policy: Policy, tokens_per_chunk: Vec<u64>) -> Result<Self> {
        if capacity == 0 || capacity > MAX_OFFLOAD_ROWS {
            return Err(TierError::Config {
                field: "capacity",
                reason: format!("must be in [1, {MAX_OFFLOAD_ROWS}], got {capacity}"),
            });
        }
        if let Some(&t) = tokens_per_chunk.iter().find(|&&t| t == 0) {
            return Err(TierError::Config {
                field: "tokens_per_chunk",
                reason: format!("every entry must be >= 1, got {t}"),
            });
        }
        let mut host = HostIndex::new(1, policy, capacity)?;
        let tree = host.tree_mut();
        // No one reads the tree's residency events here.
        tree.set_event_limit(0);
        // A call needs a few rows and a victim may be a long chain: it loses
        // only what the call needs, from its tail (vLLM's own LRU evicts per
        // block), under every policy but ghost, which has a rule of its own.
        tree.set_trim_tails(true);
        Ok(Self {
            policy,
            tokens_per_chunk,
            host,
            slots: Vec::new(),
            free_slots: Vec::new(),
            by_token: Map::default(),
            by_row: Vec::new(),
            loads: Map::default(),
            requests: Map::default(),
            next_serial: 1,
            epoch: 0,
            evicted: 0,
            chunk_digest: 0,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.host.rows().capacity()
    }
    pub fn policy(&self) -> Policy {
        self.policy
    }
    pub fn len(&self) -> usize {
        self.by_token.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }
    pub fn free_rows(&self) -> u64 {
        self.host.rows().free()
    }
    pub fn num_pins(&self) -> usize {
        self.host.num_pins()
    }
    /// The host tier's core this index runs on.
    pub fn host(&self) -> &HostIndex {
        &self.host
    }

    pub fn request_finished(&mut self, request: &str) {
        self.requests.remove(request);
    }

    /// Drops everything; completions of earlier transfers are then ignored.
    /// Serials keep counting, so no row stamped before the reset matches a
    /// chunk placed after it.
    pub fn reset(&mut self) -> Result<()> {
        let serial = self.next_serial;
        *self = Self::new(
            self.capacity(),
            self.policy,
            std::mem::take(&mut self.tokens_per_chunk),
        )?;
        self.next_serial = serial;
        Ok(())
    }
}
