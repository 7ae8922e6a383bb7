//! `Policy::S3fifo`: S3-FIFO (Yang et al., SOSP '23) on a prefix tree where
//! only leaves can leave.
//!
//! New content enters the small queue S (queue 0), content found in the
//! ghost list enters the main queue M (queue 1). Each node counts hits up to
//! 3. While S holds more than a tenth of the device pages, the victim comes
//! from S's head: a leaf hit since it entered moves to M's tail instead,
//! one never hit leaves and is remembered in the ghost list. Otherwise M's
//! head leaf leaves if it has no hits left, or goes back to M's tail with one
//! hit fewer (a second chance, which bounds the work: every requeue spends a
//! hit). When the chosen queue has no evictable leaf (its pages sit in
//! interior nodes) the other one is used. The ghost list holds at most as
//! many pages as the cache (the most device pages the tree has held); a
//! host-only node reloaded onto the device enters M.

use crate::ids::NodeId;
use crate::queue_shared::{Choice, Shared, Slot, MAX_COUNT};

const SMALL: u64 = 0;
const MAIN: u64 = 1;
/// S's share of the device pages: one in `SMALL_SHARE`.
const SMALL_SHARE: u64 = 10;

#[derive(Debug, Clone, Default)]
pub struct S3fifoState {
    pub shared: Shared,
}

impl S3fifoState {
    pub fn hit(&mut self, packed: u64) -> u64 {
        let mut slot = Slot::unpack(packed);
        slot.count = (slot.count + 1).min(MAX_COUNT);
        slot.pack()
    }

    pub fn created(&mut self, key: u64) -> u64 {
        let queue = if self.shared.ghosts.take(key).is_some() {
            MAIN
        } else {
            SMALL
        };
        self.shared.slot(queue, 0)
    }

    pub fn reloaded(&mut self) -> u64 {
        self.shared.slot(MAIN, 0)
    }

    pub fn dropped(&mut self, key: u64, packed: u64, pages: u64) {
        if Slot::unpack(packed).queue == SMALL {
            self.shared.ghosts.record(key, 0, pages);
            self.trim_ghosts();
        }
    }

    /// Keeps the ghost list within the cache size.
    pub fn trim_ghosts(&mut self) {
        self.shared.ghosts.trim(0, self.shared.peak_pages);
    }

    /// The victim, or a leaf to move first, given each queue's head
    /// evictable leaf.
    pub fn choose(
        &mut self,
        mut head: impl FnMut(u64) -> Option<NodeId>,
        slot_of: impl Fn(NodeId) -> u64,
    ) -> Option<Choice> {
        let small_over = self.shared.queue_pages[0] * SMALL_SHARE > self.shared.device_pages();
        let (first, second) = if small_over {
            (SMALL, MAIN)
        } else {
            (MAIN, SMALL)
        };
        let (queue, id) = head(first)
            .map(|id| (first, id))
            .or_else(|| head(second).map(|id| (second, id)))?;
        let slot = Slot::unpack(slot_of(id));
        Some(match (queue, slot.count) {
            (_, 0) => Choice::Evict(id),
            (SMALL, _) => Choice::Requeue(id, self.shared.slot(MAIN, 0)),
            (_, count) => Choice::Requeue(id, self.shared.slot(MAIN, count - 1)),
        })
    }
}
