//! Node storage with slot reuse, so memory follows the live nodes rather
//! than every node ever created.
//!
//! A `NodeId` is a slot index in its low 32 bits and the slot's generation in
//! its high 32 bits. A freed slot goes on a LIFO free list and its generation
//! moves on, so the next node placed there gets a new id: an id a caller kept
//! from before stops naming anything (`get` returns `None`) instead of naming
//! a stranger. Which slot is reused next depends only on the sequence of
//! inserts and removals, so replicas that replay the same calls hand out the
//! same ids; the free list is part of the digest.
//!
//! A free slot keeps the token buffer of the node removed from it, and the
//! next node placed there reuses it when it fits (`token_buffer`): freeing
//! a node's token buffer was the largest single cost of an eviction (the
//! allocator coalesces the chunk with its neighbours), and an insert
//! allocated one again, so a tree churning at a steady size now does
//! neither. The buffer lives in the free slot itself, so keeping it costs
//! no memory of its own and no allocation while evicting; the spare
//! capacity stays within the tokens the tree held at the last removal, so
//! memory still follows the live contents. Which buffer a node gets changes
//! nothing but where its tokens live.

use crate::ids::{NodeId, Token};
use crate::node::Node;
use cpkv_hash::Hasher64;

const SLOT_BITS: u32 = 32;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// A live node, or a free slot with a token buffer kept for the next one
/// (empty when none is kept).
// A free slot is as large as a live one on purpose, as `Option<Node>` was:
// slots are reused, and the buffer sits in room the slot has anyway.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Slot {
    Live(Node),
    Free(Vec<Token>),
}

impl Slot {
    fn node(&self) -> Option<&Node> {
        match self {
            Self::Live(node) => Some(node),
            Self::Free(_) => None,
        }
    }

    fn node_mut(&mut self) -> Option<&mut Node> {
        match self {
            Self::Live(node) => Some(node),
            Self::Free(_) => None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct NodeArena {
    slots: Vec<Slot>,
    /// Generation of each slot's current (or next) occupant.
    generations: Vec<u32>,
    /// Free slots, reused last-freed first.
    free: Vec<u32>,
    /// Wrapping sum of `free_term` over the free list.
    free_digest: u64,
    live: usize,
    /// Capacity of the token buffers free slots keep, in tokens.
    spare_tokens: usize,
}

fn free_term(position: usize, slot: u32, generation: u32) -> u64 {
    Hasher64::default()
        .word(position as u64)
        .word(u64::from(slot))
        .word(u64::from(generation))
        .finish()
}

fn live_in(generations: &[u32], id: NodeId) -> bool {
    generations
        .get(NodeArena::slot(id))
        .is_some_and(|&g| u64::from(g) == id.0 >> SLOT_BITS)
}

impl NodeArena {
    fn slot(id: NodeId) -> usize {
        (id.0 & SLOT_MASK) as usize
    }

    pub(crate) fn get(&self, id: NodeId) -> Option<&Node> {
        self.slots
            .get(Self::slot(id))?
            .node()
            .filter(|n| n.id == id)
    }

    /// The live node `id`; panics on a dead id (internal ids are live).
    pub(crate) fn live_mut(&mut self, id: NodeId) -> &mut Node {
        self.slots[Self::slot(id)]
            .node_mut()
            .filter(|n| n.id == id)
            .expect("internal ids are live")
    }

    /// Whether `id` names a live node, from the generations alone (a slot's
    /// generation moves on when its node leaves, so it matches only the
    /// id of the node there now).
    pub(crate) fn is_live(&self, id: NodeId) -> bool {
        live_in(&self.generations, id)
    }

    /// The live node `id` (as `live_mut`) beside `is_live` for any id.
    pub(crate) fn live_mut_and_liveness(
        &mut self,
        id: NodeId,
    ) -> (&mut Node, impl Fn(NodeId) -> bool + '_) {
        let generations = &self.generations;
        let node = self.slots[Self::slot(id)]
            .node_mut()
            .filter(|n| n.id == id)
            .expect("internal ids are live");
        (node, move |other| live_in(generations, other))
    }

    /// Stores `node` under a fresh id (written into it) and returns the id.
    pub(crate) fn insert(&mut self, mut node: Node) -> NodeId {
        let slot = match self.free.pop() {
            Some(slot) => {
                let generation = self.generations[slot as usize];
                let term = free_term(self.free.len(), slot, generation);
                self.free_digest = self.free_digest.wrapping_sub(term);
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 live nodes");
                self.slots.push(Slot::Free(Vec::new()));
                self.generations.push(0);
                slot
            }
        };
        let id = NodeId(u64::from(self.generations[slot as usize]) << SLOT_BITS | u64::from(slot));
        node.id = id;
        let entry = &mut self.slots[slot as usize];
        if let Slot::Free(spare) = entry {
            self.spare_tokens -= spare.capacity();
        }
        *entry = Slot::Live(node);
        self.live += 1;
        id
    }

    /// An empty buffer for `len` tokens of the node stored next: the one the
    /// slot it will take keeps, if that fits without wasting more than its
    /// size, else a new one.
    fn spare_buffer(&mut self, len: usize) -> Vec<Token> {
        let next = self.free.last().map(|&s| &mut self.slots[s as usize]);
        match next {
            Some(Slot::Free(spare)) if (len..=2 * len).contains(&spare.capacity()) => {
                self.spare_tokens -= spare.capacity();
                std::mem::take(spare)
            }
            _ => Vec::with_capacity(len),
        }
    }

    /// A buffer holding `tokens` for the node stored next (`spare_buffer`).
    pub(crate) fn token_buffer(&mut self, tokens: &[Token]) -> Vec<Token> {
        let mut buffer = self.spare_buffer(tokens.len());
        buffer.extend_from_slice(tokens);
        buffer
    }

    /// A buffer holding the first `len` tokens of the live node `id`, for
    /// the node stored next (a split's head).
    pub(crate) fn head_buffer(&mut self, id: NodeId, len: usize) -> Vec<Token> {
        let mut buffer = self.spare_buffer(len);
        let node = self.get(id).expect("internal ids are live");
        buffer.extend_from_slice(&node.tokens[..len]);
        buffer
    }

    /// Frees the live node `id`'s slot for a later id. `keep` takes what the
    /// caller needs out of the node, which is then dropped where it lies:
    /// moving a whole node out of its slot cost more than the rest of a
    /// removal. The slot keeps the node's token buffer while the spare
    /// capacity stays within `held` tokens (what the tree still holds).
    pub(crate) fn remove<R>(
        &mut self,
        id: NodeId,
        held: usize,
        keep: impl FnOnce(&mut Node) -> R,
    ) -> R {
        let slot = Self::slot(id);
        let entry = &mut self.slots[slot];
        let node = entry
            .node_mut()
            .filter(|n| n.id == id)
            .expect("internal ids are live");
        let kept = keep(node);
        let mut tokens = std::mem::take(&mut node.tokens);
        if self.spare_tokens + tokens.capacity() <= held {
            tokens.clear();
            self.spare_tokens += tokens.capacity();
        } else {
            tokens = Vec::new();
        }
        *entry = Slot::Free(tokens);
        let generation = self.generations[slot].wrapping_add(1);
        self.generations[slot] = generation;
        let slot = slot as u32;
        self.free_digest =
            self.free_digest
                .wrapping_add(free_term(self.free.len(), slot, generation));
        self.free.push(slot);
        self.live -= 1;
        kept
    }

    /// An arena from a snapshot's slots (generation, node) and free list;
    /// node ids are set from their slots. Fails if they do not partition.
    pub(crate) fn from_parts(
        slots: Vec<(u32, Option<Node>)>,
        free: Vec<u32>,
    ) -> Result<Self, String> {
        if u32::try_from(slots.len()).is_err() {
            return Err(format!("{} slots exceed 2^32", slots.len()));
        }
        let mut arena = Self::default();
        for (slot, (generation, node)) in slots.into_iter().enumerate() {
            arena.generations.push(generation);
            arena.slots.push(match node {
                Some(mut n) => {
                    n.id = NodeId(u64::from(generation) << SLOT_BITS | slot as u64);
                    arena.live += 1;
                    Slot::Live(n)
                }
                None => Slot::Free(Vec::new()),
            });
        }
        for (position, &slot) in free.iter().enumerate() {
            let generation = *arena
                .generations
                .get(slot as usize)
                .ok_or(format!("free slot {slot} out of range"))?;
            arena.free_digest = arena
                .free_digest
                .wrapping_add(free_term(position, slot, generation));
        }
        arena.free = free;
        arena.check()?;
        Ok(arena)
    }

    /// Each slot's generation and node, and the free list (for snapshots).
    pub(crate) fn parts(&self) -> (Vec<(u32, Option<&Node>)>, &[u32]) {
        let slots = self
            .generations
            .iter()
            .zip(&self.slots)
            .map(|(g, n)| (*g, n.node()))
            .collect();
        (slots, &self.free)
    }

    /// The node `id` if it is live (a fallible `live_mut`).
    pub(crate) fn get_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.slots
            .get_mut(Self::slot(id))?
            .node_mut()
            .filter(|n| n.id == id)
    }

    /// Live nodes in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Node> + '_ {
        self.slots.iter().filter_map(Slot::node)
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Slots ever used: the high-water mark of live nodes.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// What decides the next ids: the slot count and the free list.
    pub(crate) fn digest(&self) -> u64 {
        Hasher64::default()
            .word(self.slots.len() as u64)
            .word(self.free_digest)
            .finish()
    }

    /// `digest` recomputed from the free list (for checks).
    pub(crate) fn digest_from_scratch(&self) -> u64 {
        let sum = self
            .free
            .iter()
            .enumerate()
            .map(|(i, &slot)| free_term(i, slot, self.generations[slot as usize]))
            .fold(0u64, u64::wrapping_add);
        Hasher64::default()
            .word(self.slots.len() as u64)
            .word(sum)
            .finish()
    }

    /// Checks that live and free slots partition the arena.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut free = vec![false; self.slots.len()];
        for &slot in &self.free {
            let s = slot as usize;
            if s >= self.slots.len() || free[s] || self.slots[s].node().is_some() {
                return Err(format!("slot {slot} wrongly on the free list"));
            }
            free[s] = true;
        }
        for (s, node) in self.slots.iter().enumerate() {
            match node.node() {
                Some(n)
                    if Self::slot(n.id) != s
                        || n.id.0 >> SLOT_BITS != u64::from(self.generations[s]) =>
                {
                    return Err(format!("slot {s} holds node {} under a wrong id", n.id));
                }
                None if !free[s] => return Err(format!("slot {s} is neither live nor free")),
                _ => {}
            }
        }
        let mut spare = 0;
        for slot in &self.slots {
            if let Slot::Free(buffer) = slot {
                if !buffer.is_empty() {
                    return Err("a free slot keeps tokens".into());
                }
                spare += buffer.capacity();
            }
        }
        // At most the count: a clone's free slots come back with no buffers.
        if spare > self.spare_tokens {
            return Err("free slots keep more token buffer than counted".into());
        }
        if self.iter().count() != self.live {
            return Err("live node count out of sync".into());
        }
        if self.digest() != self.digest_from_scratch() {
            return Err("free list digest differs from recomputation".into());
        }
        Ok(())
    }
}
