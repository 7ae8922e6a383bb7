//! Chunks: one per resident key, in a slot table (slots reused), with its
//! row, its serial (from 1, never reused, not even across `reset`: an
//! engine stamps a written row with it, so a reused row is never read
//! torn) and its state; the index's digest sums every chunk's term.

use cpkv_hash::hash_words;

use super::{keys::token_of, OffloadIndex, NO_SLOT};

const CHUNK_TAG: u64 = 0x6f66_6c64_6368_6e6b; // "ofldchnk"

/// What `lookup` says of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// Not on the host, or its store failed.
    Miss,
    /// Written and readable.
    Ready,
    /// Its store is in flight.
    Pending,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Pending,
    Ready,
    Failed,
}

impl State {
    pub(super) fn code(self) -> u64 {
        match self {
            Self::Pending => 1,
            Self::Ready => 2,
            Self::Failed => 3,
        }
    }
}

#[derive(Debug)]
pub(super) struct Chunk {
    pub(super) key: Box<[u8]>,
    pub(super) token: u64,
    pub(super) group: u32,
    pub(super) parent: u32, // slot of the chunk before it on its path, or NO_SLOT
    pub(super) row: u32,
    pub(super) serial: u64, // unique per chunk ever made (from 1): a stale record or row stamp matches nothing
    pub(super) state: State,
    pub(super) store_pin: Option<u64>,
    pub(super) mark: u64, // lock walks: covered in the walk with this epoch
}

/// A readable chunk: its row, and its serial (unique per chunk ever
/// placed, from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub row: u32,
    pub serial: u64,
}

pub(super) fn chunk_term(c: &Chunk) -> u64 {
    hash_words(
        CHUNK_TAG,
        &[
            c.token,
            u64::from(c.group),
            u64::from(c.row),
            c.state.code(),
        ],
    )
}

impl OffloadIndex {
    pub(super) fn chunk(&self, slot: u32) -> &Chunk {
        self.slots[slot as usize].as_ref().expect("live slot")
    }
    pub(super) fn chunk_mut(&mut self, slot: u32) -> &mut Chunk {
        self.slots[slot as usize].as_mut().expect("live slot")
    }

    /// The resident chunk holding `key`.
    pub(super) fn slot_of(&self, key: &[u8]) -> Option<u32> {
        self.slot_at(token_of(key), key)
    }

    /// `slot_of`, with the key's token already at hand.
    pub(super) fn slot_at(&self, token: u64, key: &[u8]) -> Option<u32> {
        let &slot = self.by_token.get(&token)?;
        (*self.chunk(slot).key == *key).then_some(slot)
    }

    pub(super) fn serial_at(&self, slot: u32) -> Option<u64> {
        self.slots.get(slot as usize)?.as_ref().map(|c| c.serial)
    }

    pub(super) fn set_state(&mut self, slot: u32, state: State) {
        let before = chunk_term(self.chunk(slot));
        self.chunk_mut(slot).state = state;
        let after = chunk_term(self.chunk(slot));
        self.chunk_digest = self.chunk_digest.wrapping_sub(before).wrapping_add(after);
    }

    /// Tree tokens from the namespace root down to `slot`.
    pub(super) fn path(&self, slot: u32) -> (Vec<u64>, Vec<u64>) {
        let (mut tokens, mut rows) = (Vec::new(), Vec::new());
        let mut at = slot;
        while at != NO_SLOT {
            let c = self.chunk(at);
            tokens.push(c.token);
            rows.push(u64::from(c.row));
            at = c.parent;
        }
        tokens.reverse();
        rows.reverse();
        (tokens, rows)
    }
}
