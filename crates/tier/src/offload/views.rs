//! What an index shows: where a readable key is, every readable chunk,
//! the digest, the resident and pinned keys, counters and the audit. None
//! of these changes anything.

use super::chunks::{Placed, State};
use super::keys::{key_hex, token_of};
use super::{Chunk, OffloadIndex, NO_SLOT};
use cpkv_hash::hash_words;

const DIGEST_TAG: u64 = 0x6f66_6c64_6467_7374; // "oflddgst"

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadStats {
    pub capacity: u64,
    pub resident: u64,
    pub ready: u64,
    pub pins: u64,
    pub evicted: u64,
}

impl OffloadIndex {
    /// A readable key's row and serial; reads nothing else and changes
    /// nothing.
    pub fn locate(&self, key: &[u8]) -> Option<Placed> {
        self.placed_at(self.slot_of(key)?)
    }

    /// `locate` of the chunk in `slot` (`NO_SLOT`: none).
    pub(super) fn placed_at(&self, slot: u32) -> Option<Placed> {
        let c = self.slots.get(slot as usize)?.as_ref()?;
        (c.state == State::Ready).then_some(Placed {
            row: c.row,
            serial: c.serial,
        })
    }

    /// Every readable chunk, in the order they were placed.
    pub fn readable(&self) -> Vec<Placed> {
        let mut live: Vec<Placed> = self
            .slots
            .iter()
            .flatten()
            .filter(|c| c.state == State::Ready)
            .map(|c| Placed {
                row: c.row,
                serial: c.serial,
            })
            .collect();
        live.sort_unstable_by_key(|p| p.serial);
        live
    }

    /// One digest of the host core (tree, rows, pins), the chunks and
    /// their rows, and the next serial (an engine stamps rows with serials).
    pub fn digest(&self) -> u64 {
        hash_words(
            DIGEST_TAG,
            &[self.host.digest(), self.chunk_digest, self.next_serial],
        )
    }

    /// Resident keys in the order they were placed (not failed stores that
    /// stay while chunks placed since continue them: their removal was
    /// reported).
    pub fn resident_keys(&self) -> Vec<Box<[u8]>> {
        let mut live: Vec<&Chunk> = self
            .slots
            .iter()
            .flatten()
            .filter(|c| c.state != State::Failed)
            .collect();
        live.sort_unstable_by_key(|c| c.serial);
        live.into_iter().map(|c| c.key.clone()).collect()
    }

    /// Keys an in-flight store or load pins, sorted.
    pub fn pinned_keys(&self) -> Vec<Box<[u8]>> {
        let mut keys: Vec<Box<[u8]>> = self
            .slots
            .iter()
            .flatten()
            .filter(|c| c.store_pin.is_some())
            .map(|c| c.key.clone())
            .collect();
        for pin in self.host.pins() {
            keys.extend(pin.reads.iter().map(|&s| self.chunk(s).key.clone()));
        }
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    pub fn row_of(&self, key: &[u8]) -> Option<u32> {
        self.slot_of(key).map(|s| self.chunk(s).row)
    }

    /// The key before `key` on its path, when it is on the host.
    pub fn parent_of(&self, key: &[u8]) -> Option<Box<[u8]>> {
        let slot = self.slot_of(key)?;
        let parent = self.chunk(slot).parent;
        (parent != NO_SLOT).then(|| self.chunk(parent).key.clone())
    }

    /// Whether `key`'s store is in flight.
    pub fn is_storing(&self, key: &[u8]) -> bool {
        self.slot_of(key)
            .is_some_and(|s| self.chunk(s).store_pin.is_some())
    }

    pub fn stats(&self) -> OffloadStats {
        OffloadStats {
            capacity: self.capacity(),
            resident: self.len() as u64,
            ready: self
                .slots
                .iter()
                .flatten()
                .filter(|c| c.state == State::Ready)
                .count() as u64,
            pins: self.host.num_pins() as u64,
            evicted: self.evicted,
        }
    }

    /// Audit: the tree's invariants, and that tree, rows and keys agree.
    pub fn check(&self) -> Result<(), String> {
        self.host.check()?;
        let live = self.slots.iter().flatten().count();
        if self.host.tree().device_pages() != live
            || self.by_token.len() != live
            || self.host.rows().used() as usize != live
        {
            return Err(format!(
                "{live} chunks, {} tree pages, {} keys, {} rows used",
                self.host.tree().device_pages(),
                self.by_token.len(),
                self.host.rows().used()
            ));
        }
        for (slot, c) in self.slots.iter().enumerate() {
            let Some(c) = c else { continue };
            if self.by_row[c.row as usize] != slot as u32
                || self.by_token.get(&c.token) != Some(&(slot as u32))
                || c.token != token_of(&c.key)
            {
                return Err(format!(
                    "chunk {} is not where its row and key say",
                    key_hex(&c.key)
                ));
            }
            if c.parent != NO_SLOT && self.slots[c.parent as usize].is_none() {
                return Err(format!("chunk {}'s parent left first", key_hex(&c.key)));
            }
        }
        Ok(())
    }
}
