//! Batched reads: `locate_many` answers `locate` for every key of a call.
//!
//! One key's lookup is a chain of dependent cache misses (the table's
//! bucket, then the chunk it names, then the chunk's key bytes that confirm
//! it), and a call of a hundred keys over a large index ran a hundred such
//! chains back to back. Here each step runs for every key before the next
//! step starts: every key hashed, then the table probes (independent loads
//! with nothing between them, so the processor overlaps their misses by
//! itself), then a pass that prefetches each found chunk, then one that
//! prefetches each chunk's key bytes, then the checks.
//! The misses of different keys overlap; the answers are `locate`'s, key by
//! key (a test holds them equal).

use super::chunks::Placed;
use super::keys::token_of;
use super::prefetch::prefetch;
use super::{OffloadIndex, NO_SLOT};

impl OffloadIndex {
    /// `locate` of each key, in key order; reads nothing else and changes
    /// nothing.
    pub fn locate_many(&self, keys: &[&[u8]]) -> Vec<Option<Placed>> {
        // Hashed first, probed after: a probe loop with no hashing between
        // its loads keeps many of them in flight at once.
        let tokens: Vec<u64> = keys.iter().map(|k| token_of(k)).collect();
        let slots: Vec<u32> = tokens
            .iter()
            .map(|token| self.by_token.get(token).copied().unwrap_or(NO_SLOT))
            .collect();
        for &slot in &slots {
            if slot != NO_SLOT {
                prefetch(&self.slots[slot as usize]);
            }
        }
        for &slot in &slots {
            if slot != NO_SLOT {
                prefetch(&*self.chunk(slot).key);
            }
        }
        keys.iter()
            .zip(slots)
            .map(|(key, slot)| {
                if slot != NO_SLOT && *self.chunk(slot).key == **key {
                    self.placed_at(slot)
                } else {
                    None
                }
            })
            .collect()
    }
}
