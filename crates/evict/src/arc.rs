//! `Policy::Arc`: adaptive replacement (Megiddo and Modha's ARC) on a prefix
//! tree where only leaves can leave.
//!
//! Queue 0 (T1) holds content seen once since it entered the cache, queue 1
//! (T2) content hit again; each is least recently used first. Content that
//! leaves the tree is remembered in the ghost list of its queue (B1, B2). A
//! new leaf found in B1 says T1 was too small: the target size of T1 grows
//! by its pages (times |B2| / |B1| when B2 is larger); found in B2, the
//! target shrinks the same way; either way it enters T2. A victim comes from
//! T1 while T1 holds more pages than the target, from T2 otherwise, and from
//! the other queue when the chosen one has no evictable leaf (its pages sit
//! in interior nodes). A host-only node reloaded onto the device counts as a
//! ghost hit of the queue it was evicted from. Sizes are device pages; the
//! cache size `c` is the most the tree has held; B1 keeps |T1| + |B1| <= c
//! and all four lists together stay within 2c, as in the original.

use crate::ids::NodeId;
use crate::queue_shared::{Choice, Shared, Slot};

const T1: u64 = 0;
const T2: u64 = 1;

#[derive(Debug, Clone, Default)]
pub struct ArcState {
    pub shared: Shared,
    /// The target size of T1, in pages (ARC's `p`).
    pub target: u64,
}

impl ArcState {
    pub fn hit(&mut self, _slot: u64) -> u64 {
        self.shared.slot(T2, 0)
    }

    pub fn created(&mut self, key: u64, pages: u64) -> u64 {
        match self.shared.ghosts.take(key) {
            Some((list, _)) => {
                self.adapt(list as u64, pages);
                self.shared.slot(T2, 0)
            }
            None => self.shared.slot(T1, 0),
        }
    }

    pub fn reloaded(&mut self, packed: u64, pages: u64) -> u64 {
        self.adapt(Slot::unpack(packed).queue, pages);
        self.shared.slot(T2, 0)
    }

    /// A ghost hit of `pages` pages in B1 (`list` 0) or B2 moves the target.
    fn adapt(&mut self, list: u64, pages: u64) {
        let b1 = self.shared.ghosts.pages(0).max(1);
        let b2 = self.shared.ghosts.pages(1).max(1);
        if list == T1 {
            let step = pages.saturating_mul((b2 / b1).max(1));
            self.target = self.target.saturating_add(step).min(self.shared.peak_pages);
        } else {
            let step = pages.saturating_mul((b1 / b2).max(1));
            self.target = self.target.saturating_sub(step);
        }
    }

    pub fn dropped(&mut self, key: u64, packed: u64, pages: u64) {
        let queue = Slot::unpack(packed).queue;
        self.shared.ghosts.record(key, queue as usize, pages);
        self.trim_ghosts();
    }

    /// Keeps |T1| + |B1| within the cache size and all four lists within twice it.
    pub fn trim_ghosts(&mut self) {
        let g = &mut self.shared.ghosts;
        let c = self.shared.peak_pages;
        let [t1, t2] = self.shared.queue_pages;
        g.trim(0, c.saturating_sub(t1));
        let b1 = g.pages(0);
        g.trim(1, (2 * c).saturating_sub(t1 + t2 + b1));
    }

    /// The victim, given each queue's head evictable leaf.
    pub fn choose(&mut self, mut head: impl FnMut(u64) -> Option<NodeId>) -> Option<Choice> {
        let t1_first = self.shared.queue_pages[0] > self.target;
        let (first, second) = if t1_first { (T1, T2) } else { (T2, T1) };
        head(first).or_else(|| head(second)).map(Choice::Evict)
    }
}
