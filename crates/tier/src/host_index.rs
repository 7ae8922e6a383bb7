//! `HostIndex`: the host tier's core, shared by the main job (`TierCache`,
//! which adds the device tier on top) and the engines (`OffloadIndex`, one
//! core call per engine call): the prefix tree of what the host holds, the
//! slab rows it sits in (`HostRows`, the first-fit allocator's extents), the pins that keep a transfer's path
//! from eviction, and one digest of the three.
//!
//! A pin is a set of tree locks taken for one transfer and released
//! together, when the transfer's last part is done (or at once). Pins are
//! numbered in the order they are made, so releasing them is deterministic.

use std::collections::BTreeMap;

use cpkv_evict::{NodeId, Policy, PrefixTree};
use cpkv_hash::hash_words;

use crate::error::Result;
use crate::rows::HostRows;

const PIN_TAG: u64 = 0x686f_7374_7069_6e73; // "hostpins"
const HOST_TAG: u64 = 0x686f_7374_6964_7820; // "hostidx "

/// Tree locks held for one transfer.
#[derive(Debug, Clone)]
pub struct Pin {
    /// The locked nodes (one lock each).
    pub nodes: Vec<NodeId>,
    /// Parts of the transfer still in flight: released when it reaches 0.
    pub waiting: usize,
    /// The caller's ids of what the transfer reads (for views only).
    pub reads: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct HostIndex {
    tree: PrefixTree,
    rows: HostRows,
    pins: BTreeMap<u64, Pin>,
    next_pin: u64,
}

impl HostIndex {
    /// A tree of `page_size`-token pages under `policy`, over `rows` slab
    /// rows.
    pub fn new(page_size: usize, policy: Policy, rows: u64) -> Result<Self> {
        Ok(Self {
            rows: HostRows::new(rows)?,
            tree: PrefixTree::new(page_size, policy)?,
            pins: BTreeMap::new(),
            next_pin: 0,
        })
    }

    pub fn tree(&self) -> &PrefixTree {
        &self.tree
    }
    pub fn tree_mut(&mut self) -> &mut PrefixTree {
        &mut self.tree
    }
    pub fn rows(&self) -> &HostRows {
        &self.rows
    }
    pub fn rows_mut(&mut self) -> &mut HostRows {
        &mut self.rows
    }

    // ---- pins ------------------------------------------------------------

    pub fn num_pins(&self) -> usize {
        self.pins.len()
    }
    pub fn pins(&self) -> impl Iterator<Item = &Pin> + '_ {
        self.pins.values()
    }

    /// Records `nodes` (already locked by the caller) as one pin; returns
    /// its id.
    pub fn pin(&mut self, nodes: Vec<NodeId>, waiting: usize, reads: Vec<u32>) -> u64 {
        self.next_pin += 1;
        self.pins.insert(
            self.next_pin,
            Pin {
                nodes,
                waiting,
                reads,
            },
        );
        self.next_pin
    }

    /// One part of pin `pin` is done; the pin is released with its last.
    pub fn part_done(&mut self, pin: u64) {
        let done = match self.pins.get_mut(&pin) {
            Some(p) => {
                p.waiting -= 1;
                p.waiting == 0
            }
            None => false,
        };
        if done {
            self.release(pin);
        }
    }

    /// Unlocks every node of pin `pin`; an unknown pin is ignored.
    pub fn release(&mut self, pin: u64) {
        if let Some(p) = self.pins.remove(&pin) {
            for node in p.nodes {
                // A node a pin locked is still in the tree: locks keep it.
                let _ = self.tree.unlock(node);
            }
        }
    }

    // ---- digest and audit --------------------------------------------------

    /// One digest of the tree (with its logical clock), the rows' placement
    /// (the allocator's digest) and the pins.
    pub fn digest(&self) -> u64 {
        self.combine(self.tree.digest())
    }

    /// `digest` with the tree's part recomputed from its full state.
    pub fn digest_from_scratch(&self) -> u64 {
        self.combine(self.tree.digest_from_scratch())
    }

    fn combine(&self, tree: u64) -> u64 {
        let pins = self.pins.iter().fold(0u64, |d, (&id, p)| {
            d.wrapping_add(hash_words(
                PIN_TAG,
                &[id, p.nodes.len() as u64, p.waiting as u64],
            ))
        });
        hash_words(
            HOST_TAG,
            &[
                tree,
                self.tree.clock(),
                self.rows.digest(),
                pins,
                self.next_pin,
            ],
        )
    }

    /// The tree's invariants and the rows' (conservation, coalescing,
    /// digest).
    pub fn check(&self) -> std::result::Result<(), String> {
        self.tree.check_invariants()?;
        self.rows.check()
    }
}
