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

use crate::ids::NodeId;
use crate::node::Node;
use cpkv_hash::Hasher64;

const SLOT_BITS: u32 = 32;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

#[derive(Debug, Clone, Default)]
pub(crate) struct NodeArena {
    slots: Vec<Option<Node>>,
    /// Generation of each slot's current (or next) occupant.
    generations: Vec<u32>,
    /// Free slots, reused last-freed first.
    free: Vec<u32>,
    /// Wrapping sum of `free_term` over the free list.
    free_digest: u64,
    live: usize,
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
            .as_ref()
            .filter(|n| n.id == id)
    }

    /// The live node `id`; panics on a dead id (internal ids are live).
    pub(crate) fn live_mut(&mut self, id: NodeId) -> &mut Node {
        self.slots[Self::slot(id)]
            .as_mut()
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
            .as_mut()
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
                self.slots.push(None);
                self.generations.push(0);
                slot
            }
        };
        let id = NodeId(u64::from(self.generations[slot as usize]) << SLOT_BITS | u64::from(slot));
        node.id = id;
        self.slots[slot as usize] = Some(node);
        self.live += 1;
        id
    }

    /// Frees the live node `id`'s slot for a later id. `keep` takes what the
    /// caller needs out of the node, which is then dropped where it lies:
    /// moving a whole node out of its slot cost more than the rest of a
    /// removal.
    pub(crate) fn remove<R>(&mut self, id: NodeId, keep: impl FnOnce(&mut Node) -> R) -> R {
        let slot = Self::slot(id);
        let entry = &mut self.slots[slot];
        let kept = keep(
            entry
                .as_mut()
                .filter(|n| n.id == id)
                .expect("internal ids are live"),
        );
        *entry = None;
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
            arena.slots.push(node.map(|mut n| {
                n.id = NodeId(u64::from(generation) << SLOT_BITS | slot as u64);
                arena.live += 1;
                n
            }));
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
            .map(|(g, n)| (*g, n.as_ref()))
            .collect();
        (slots, &self.free)
    }

    /// The node `id` if it is live (a fallible `live_mut`).
    pub(crate) fn get_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.slots
            .get_mut(Self::slot(id))?
            .as_mut()
            .filter(|n| n.id == id)
    }

    /// Live nodes in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Node> + '_ {
        self.slots.iter().flatten()
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
            if s >= self.slots.len() || free[s] || self.slots[s].is_some() {
                return Err(format!("slot {slot} wrongly on the free list"));
            }
            free[s] = true;
        }
        for (s, node) in self.slots.iter().enumerate() {
            match node {
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
        if self.iter().count() != self.live {
            return Err("live node count out of sync".into());
        }
        if self.digest() != self.digest_from_scratch() {
            return Err("free list digest differs from recomputation".into());
        }
        Ok(())
    }
}
