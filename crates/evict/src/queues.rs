//! What the queue policies (`Policy::Arc`, `Policy::S3fifo`) keep beside the
//! nodes, and the layout of their per-node state.
//!
//! A queue policy's node state lives in `Node::queue_slot` (so the node
//! digest covers it): which queue the node is in, a small access counter and its
//! position in the queue, a sequence number from this state's own counter
//! (not the clock: several nodes can enter queues within one call, and the
//! later one must queue behind). Its eviction key is (queue, position), so
//! the index orders each queue first in first out and a range query finds a
//! queue's head leaf. Beside the nodes it keeps the device pages each queue
//! holds (every node, interior ones too: they take room, even if only their
//! leaves can leave) and ghost lists of content that left the tree. All of
//! it is replicated state, in the digest, integers only.

use crate::arc::ArcState;
use crate::evictable::EvictableIndex;
use crate::ids::{NodeId, Tier};
use crate::policy::Policy;
use crate::queue_ghost_lists::GhostLists;
use crate::queue_shared::{Choice, Shared, Slot, MAX_COUNT};
use crate::s3fifo::S3fifoState;
use cpkv_hash::Hasher64;
use cpkv_wire::{Reader, Writer};

#[derive(Debug, Clone, Default)]
pub enum QueueState {
    #[default]
    Off,
    Arc(ArcState),
    S3fifo(S3fifoState),
}

impl QueueState {
    pub fn new(policy: Policy) -> Self {
        match policy {
            Policy::Arc => Self::Arc(ArcState::default()),
            Policy::S3fifo => Self::S3fifo(S3fifoState::default()),
            _ => Self::Off,
        }
    }

    /// Whether a queue policy keeps state here.
    pub fn is_on(&self) -> bool {
        !matches!(self, Self::Off)
    }

    /// The state of a node with `hits` hits when this policy takes over a
    /// tree (`Policy::Ghost` following it): reused content in the protected
    /// queue with its remaining hits, one-shot content on probation.
    pub fn adopted(&mut self, hits: u64) -> u64 {
        match self {
            Self::Off => 0,
            Self::Arc(s) => s.shared.slot(u64::from(hits >= 2), 0),
            Self::S3fifo(s) => {
                let count = hits.saturating_sub(1).min(MAX_COUNT);
                s.shared.slot(u64::from(hits >= 2), count)
            }
        }
    }

    /// A node of a tree taken over, queued behind the ones before it with
    /// the queue and count of `held` (where a shadow holds its content).
    pub fn adopted_as(&mut self, held: Slot) -> u64 {
        self.shared_mut()
            .map_or(0, |s| s.slot(held.queue, held.count))
    }

    /// Books the pages per queue of a tree just taken over, whose cache
    /// size is `capacity` pages; ARC starts from `arc_target`, the target
    /// its shadow adapted at that size. The ghost lists start from the
    /// tree's own history of dropped content (`remembered`: `(key, hits,
    /// pages)`, oldest first; the shadow's lists name the shadow's nodes, not
    /// the tree's), newest kept within each list's bound: ARC's B1 takes
    /// one-shot content and B2 reused content, as `adopted` sorts live
    /// content; S3-FIFO's ghost queue takes all of it (whatever ranking
    /// dropped it, content that comes back soon is reuse the cache missed,
    /// which is what the queue sends to M). Seeded this way, the slow
    /// workload's one miss and two of docqa's three went (`docs/ghost.md`).
    pub fn adopt_books(
        &mut self,
        pages: [u64; 2],
        capacity: u64,
        arc_target: u64,
        remembered: impl Iterator<Item = (u64, u64, usize)>,
    ) {
        match self {
            Self::Off => {}
            Self::Arc(s) => {
                s.shared.adopt(pages, capacity);
                s.target = arc_target.min(s.shared.peak_pages);
                for (key, hits, pages) in remembered {
                    let list = usize::from(hits >= 2);
                    s.shared.ghosts.record(key, list, pages as u64);
                }
                s.trim_ghosts();
            }
            Self::S3fifo(s) => {
                s.shared.adopt(pages, capacity);
                for (key, _, pages) in remembered {
                    s.shared.ghosts.record(key, 0, pages as u64);
                }
                s.trim_ghosts();
            }
        }
    }

    /// ARC's target, if this is ARC's state.
    pub fn arc_target(&self) -> Option<u64> {
        match self {
            Self::Arc(s) => Some(s.target),
            _ => None,
        }
    }

    fn shared(&self) -> Option<&Shared> {
        match self {
            Self::Off => None,
            Self::Arc(s) => Some(&s.shared),
            Self::S3fifo(s) => Some(&s.shared),
        }
    }

    fn shared_mut(&mut self) -> Option<&mut Shared> {
        match self {
            Self::Off => None,
            Self::Arc(s) => Some(&mut s.shared),
            Self::S3fifo(s) => Some(&mut s.shared),
        }
    }

    /// A node holding `device_pages` with state `packed` joins the books.
    pub fn enter(&mut self, packed: u64, device_pages: usize) {
        if let Some(s) = self.shared_mut() {
            s.queue_pages[Slot::unpack(packed).queue as usize] += device_pages as u64;
        }
    }

    /// The node leaves the books (to change, or for good).
    pub fn leave(&mut self, packed: u64, device_pages: usize) {
        if let Some(s) = self.shared_mut() {
            s.queue_pages[Slot::unpack(packed).queue as usize] -= device_pages as u64;
        }
    }

    fn observe(&mut self) {
        if let Some(s) = self.shared_mut() {
            s.peak_pages = s.peak_pages.max(s.device_pages());
        }
    }

    /// A match passed through a node: its new state.
    pub fn hit(&mut self, packed: u64) -> Option<u64> {
        self.observe();
        match self {
            Self::Off => None,
            Self::Arc(s) => Some(s.hit(packed)),
            Self::S3fifo(s) => Some(s.hit(packed)),
        }
    }

    /// A new leaf with content `key` and `pages` pages: its state.
    pub fn created(&mut self, key: u64, pages: usize) -> Option<u64> {
        self.observe();
        match self {
            Self::Off => None,
            Self::Arc(s) => Some(s.created(key, pages as u64)),
            Self::S3fifo(s) => Some(s.created(key)),
        }
    }

    /// A host-only node got device pages back (it had been evicted while
    /// its state stayed on the node): its new state.
    pub fn reloaded(&mut self, packed: u64, pages: usize) -> Option<u64> {
        self.observe();
        match self {
            Self::Off => None,
            Self::Arc(s) => Some(s.reloaded(packed, pages as u64)),
            Self::S3fifo(s) => Some(s.reloaded()),
        }
    }

    /// A node with content `key` left the tree.
    pub fn dropped(&mut self, key: u64, packed: u64, pages: usize) {
        self.observe();
        match self {
            Self::Off => {}
            Self::Arc(s) => s.dropped(key, packed, pages as u64),
            Self::S3fifo(s) => s.dropped(key, packed, pages as u64),
        }
    }

    /// The next device victim: the index's first leaf for the key-ordered
    /// policies; `None` when nothing is evictable.
    pub fn choose(
        &mut self,
        index: &EvictableIndex,
        slot_of: impl Fn(NodeId) -> u64,
    ) -> Option<Choice> {
        if !self.is_on() {
            return index.first(Tier::Device).map(Choice::Evict);
        }
        self.choose_by(|queue| Shared::head(index, queue), slot_of)
    }

    /// A queue policy's next device victim, given each queue's head
    /// evictable leaf (`head`): what `choose` asks of the tree's index, and
    /// ghost's lean queue candidates of their own queues.
    pub fn choose_by(
        &mut self,
        head: impl FnMut(u64) -> Option<NodeId>,
        slot_of: impl Fn(NodeId) -> u64,
    ) -> Option<Choice> {
        self.observe();
        match self {
            Self::Off => None,
            Self::Arc(s) => s.choose(head),
            Self::S3fifo(s) => s.choose(head, slot_of),
        }
    }

    /// Pages of dropped content the ghost lists remember.
    pub fn remembered_pages(&self) -> u64 {
        self.shared()
            .map_or(0, |s| s.ghosts.pages(0) + s.ghosts.pages(1))
    }

    /// `None` for policies without queue state (so their digests do not
    /// change with this state's existence).
    pub fn digest(&self) -> Option<u64> {
        let extra = match self {
            Self::Off => return None,
            Self::Arc(s) => s.target,
            Self::S3fifo(_) => 0,
        };
        let shared = self.shared().expect("on");
        Some(
            Hasher64::default()
                .word(shared.digest())
                .word(extra)
                .finish(),
        )
    }

    /// The replicated part, for snapshots (nothing for other policies): the
    /// peak, the sequence counter, the ghost lists, ARC's target. The pages
    /// per queue are not written: restore recounts them from the nodes.
    pub(crate) fn encode(&self, w: &mut Writer) {
        let Some(s) = self.shared() else {
            return;
        };
        w.u64(s.peak_pages);
        w.u64(s.next_seq);
        s.ghosts.encode(w);
        if let Self::Arc(arc) = self {
            w.u64(arc.target);
        }
    }

    /// The inverse of `encode` for `policy`, with empty queue books.
    pub(crate) fn decode(policy: Policy, r: &mut Reader<'_>) -> Result<Self, String> {
        let mut state = Self::new(policy);
        let Some(s) = state.shared_mut() else {
            return Ok(state);
        };
        s.peak_pages = r.u64()?;
        s.next_seq = r.u64()?;
        s.ghosts = GhostLists::decode(r)?;
        if let Self::Arc(arc) = &mut state {
            arc.target = r.u64()?;
            if arc.target > arc.shared.peak_pages {
                return Err(format!(
                    "ARC target {} above the cache size {}",
                    arc.target, arc.shared.peak_pages
                ));
            }
        }
        Ok(state)
    }

    /// Whether this is the state `policy` keeps.
    pub(crate) fn belongs_to(&self, policy: Policy) -> bool {
        matches!(
            (self, policy),
            (Self::Off, _) if !policy.is_queued()
        ) || matches!(
            (self, policy),
            (Self::Arc(_), Policy::Arc) | (Self::S3fifo(_), Policy::S3fifo)
        )
    }

    /// Whether node state `packed` can belong to this policy's books
    /// (a queue it has, a position already handed out).
    pub(crate) fn accepts(&self, packed: u64) -> bool {
        let Some(s) = self.shared() else {
            return true;
        };
        let slot = Slot::unpack(packed);
        slot.queue < 2 && (slot.seq < s.next_seq || packed == 0)
    }

    /// Checks the books against a recount of the nodes' device pages per
    /// queue (for `check_invariants`).
    pub fn check(&self, recount: [u64; 2]) -> Result<(), String> {
        let Some(s) = self.shared() else {
            return Ok(());
        };
        if s.queue_pages != recount {
            return Err(format!(
                "queue pages {:?} != recount {recount:?}",
                s.queue_pages
            ));
        }
        if s.ghosts.digest() != s.ghosts.digest_from_scratch() {
            return Err("ghost list digest differs from recomputation".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evictable::PolicyKey;

    /// (key, hits, pages), oldest first.
    const REMEMBERED: [(u64, u64, usize); 3] = [(11, 1, 2), (12, 3, 1), (13, 0, 4)];

    /// Takes `policy`'s state over with `REMEMBERED`; returns its remembered
    /// pages and what its ghost lists give back for keys 11, 12 and 13.
    fn taken_over(
        policy: Policy,
        pages: [u64; 2],
        capacity: u64,
    ) -> (u64, Vec<Option<(usize, u64)>>) {
        let mut state = QueueState::new(policy);
        state.adopt_books(pages, capacity, 2, REMEMBERED.into_iter());
        let remembered = state.remembered_pages();
        let taken = match state.shared_mut() {
            Some(s) => [11, 12, 13].map(|key| s.ghosts.take(key)).to_vec(),
            None => Vec::new(),
        };
        (remembered, taken)
    }

    #[test]
    fn arc_takes_over_with_ghost_lists_from_the_history() {
        // c = 8 pages, |T1| = 3: B1 holds at most 5 pages, so of the one-shot
        // content (11: 2 pages, 13: 4 pages) the older goes; 12 was reused.
        let (remembered, taken) = taken_over(Policy::Arc, [3, 1], 8);
        assert_eq!(remembered, 5);
        assert_eq!(taken, [None, Some((1, 1)), Some((0, 4))]);
        let mut state = QueueState::new(Policy::Arc);
        state.adopt_books([3, 1], 8, 2, std::iter::empty());
        assert_eq!(state.arc_target(), Some(2));
    }

    #[test]
    fn s3fifo_takes_over_with_all_dropped_content_in_its_ghost_queue() {
        // Within the cache size (6 pages), newest first: 13 and 12.
        let (remembered, taken) = taken_over(Policy::S3fifo, [2, 3], 6);
        assert_eq!(remembered, 5);
        assert_eq!(taken, [None, Some((0, 1)), Some((0, 4))]);
        assert_eq!(taken_over(Policy::Lru, [1, 1], 4), (0, Vec::new()));
    }

    #[test]
    fn slots_pack_and_key_by_queue_then_position() {
        let a = Slot {
            queue: 0,
            count: 3,
            seq: 99,
        };
        let b = Slot {
            queue: 1,
            count: 0,
            seq: 5,
        };
        assert_eq!(Slot::unpack(a.pack()), a);
        assert_eq!(Slot::unpack(b.pack()), b);
        assert!(Slot::key(a.pack()) < Slot::key(b.pack()));
        assert_eq!(Slot::key(a.pack()), PolicyKey([0, 99]));
    }
}
