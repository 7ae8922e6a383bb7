//! What every queue policy (`arc.rs`, `s3fifo.rs`) shares, below the queue
//! state that holds them (`queues.rs`): the node state packed into
//! `Node::queue_slot`, the choice of a victim, and the books (pages per
//! queue, the cache size, the sequence counter, the ghost lists).

use crate::evictable::{EvictableIndex, PolicyKey};
use crate::ids::{NodeId, Tier};
use crate::queue_ghost_lists::GhostLists;
use cpkv_hash::Hasher64;

const QUEUE_SHIFT: u32 = 62;
const COUNT_SHIFT: u32 = 60;
const SEQ_MASK: u64 = (1 << COUNT_SHIFT) - 1;
/// The access counter saturates here (two bits).
pub const MAX_COUNT: u64 = 3;

/// A queue policy's node state, packed into `Node::queue_slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub queue: u64,
    pub count: u64,
    pub seq: u64,
}

impl Slot {
    pub fn pack(self) -> u64 {
        debug_assert!(self.queue < 2 && self.count <= MAX_COUNT && self.seq <= SEQ_MASK);
        (self.queue << QUEUE_SHIFT) | (self.count << COUNT_SHIFT) | self.seq
    }

    pub fn unpack(packed: u64) -> Self {
        Self {
            queue: packed >> QUEUE_SHIFT,
            count: (packed >> COUNT_SHIFT) & MAX_COUNT,
            seq: packed & SEQ_MASK,
        }
    }

    /// The eviction key: queue, then position in it.
    pub fn key(packed: u64) -> PolicyKey {
        let s = Self::unpack(packed);
        PolicyKey([s.queue, s.seq])
    }
}

/// The next victim, or a node that must first move (S3-FIFO's second
/// chances): the tree re-keys it and asks again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Evict(NodeId),
    Requeue(NodeId, u64),
}

/// Pages and counters every queue policy shares.
#[derive(Debug, Clone, Default)]
pub struct Shared {
    /// Device pages held by nodes of queue 0 and queue 1.
    pub queue_pages: [u64; 2],
    /// The most device pages the tree has held when a policy hook ran: the
    /// cache size (the tree is told no capacity; an engine fills it to what
    /// it has). Sampled in the hooks, not on every page change: a split
    /// briefly counts the pages it moves twice.
    pub peak_pages: u64,
    pub next_seq: u64,
    pub ghosts: GhostLists,
}

impl Shared {
    pub fn slot(&mut self, queue: u64, count: u64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        Slot { queue, count, seq }.pack()
    }

    pub fn device_pages(&self) -> u64 {
        self.queue_pages[0] + self.queue_pages[1]
    }

    /// The books of a tree taken over: its pages per queue, and a cache
    /// size of `capacity` pages (or what it holds, if more).
    pub(crate) fn adopt(&mut self, pages: [u64; 2], capacity: u64) {
        self.queue_pages = pages;
        self.peak_pages = capacity.max(pages[0] + pages[1]);
    }

    /// The head leaf of `queue`, if it has an evictable one.
    pub fn head(index: &EvictableIndex, queue: u64) -> Option<NodeId> {
        index
            .first_from(Tier::Device, PolicyKey([queue, 0]))
            .filter(|(key, _)| key.0[0] == queue)
            .map(|(_, id)| id)
    }

    pub(crate) fn digest(&self) -> u64 {
        Hasher64::default()
            .word(self.queue_pages[0])
            .word(self.queue_pages[1])
            .word(self.peak_pages)
            .word(self.next_seq)
            .word(self.ghosts.digest())
            .finish()
    }
}
