//! Tagged first-in first-out lists of content that left the tree, for the
//! queue policies (`Policy::Arc`'s B1 and B2, `Policy::S3fifo`'s ghost
//! queue). Entries are keyed by content (`ghost_history::content_key`), carry the
//! number of pages they stood for, and are forgotten oldest first when the
//! owner trims a list to its bound. Looked up by key only, never iterated in
//! a decision; the digest is an order-free sum plus the counters.

use std::collections::hash_map::Entry as Slot;
use std::collections::{HashMap, VecDeque};

use cpkv_hash::{Hasher64, WordHashing};
use cpkv_wire::{Reader, Writer};

/// How many tagged lists one `GhostLists` keeps.
pub const LISTS: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    seq: u64,
    list: usize,
    pages: u64,
}

#[derive(Debug, Clone, Default)]
pub struct GhostLists {
    entries: HashMap<u64, Entry, WordHashing>,
    /// (seq, key) per list in recording order; a taken-back or re-recorded
    /// entry leaves a stale item, skipped when it reaches the front.
    order: [VecDeque<(u64, u64)>; LISTS],
    pages: [u64; LISTS],
    next_seq: u64,
    digest_sum: u64,
    /// Wrapping sum of the queue items' hashes, per list (stale items count:
    /// they take room in the bound and decide when entries are forgotten).
    order_digest: u64,
}

fn item_hash(list: usize, seq: u64, key: u64) -> u64 {
    Hasher64::new(2)
        .word(list as u64)
        .word(seq)
        .word(key)
        .finish()
}

fn entry_hash(key: u64, e: &Entry) -> u64 {
    Hasher64::default()
        .word(key)
        .word(e.seq)
        .word(e.list as u64)
        .word(e.pages)
        .finish()
}

impl GhostLists {
    /// Remembers content `key` of `pages` pages at the back of `list`
    /// (replacing an older entry for the same content).
    pub fn record(&mut self, key: u64, list: usize, pages: u64) {
        let entry = Entry {
            seq: self.next_seq,
            list,
            pages,
        };
        self.next_seq += 1;
        if let Some(old) = self.entries.insert(key, entry) {
            self.discount(key, &old);
        }
        self.pages[list] += pages;
        self.digest_sum = self.digest_sum.wrapping_add(entry_hash(key, &entry));
        self.push_order(list, entry.seq, key);
    }

    fn push_order(&mut self, list: usize, seq: u64, key: u64) {
        self.order[list].push_back((seq, key));
        self.order_digest = self.order_digest.wrapping_add(item_hash(list, seq, key));
    }

    /// Content `key` came back: forgets it and says which list held it and
    /// for how many pages.
    pub fn take(&mut self, key: u64) -> Option<(usize, u64)> {
        let entry = self.entries.remove(&key)?;
        self.discount(key, &entry);
        Some((entry.list, entry.pages))
    }

    /// Forgets the oldest entries of `list` until it holds at most `bound`
    /// pages and its queue at most `bound` items (stale ones included, so
    /// the queue's memory is bounded too).
    pub fn trim(&mut self, list: usize, bound: u64) {
        while self.pages[list] > bound || self.order[list].len() as u64 > bound.max(1) {
            let Some((seq, key)) = self.order[list].pop_front() else {
                break;
            };
            self.order_digest = self.order_digest.wrapping_sub(item_hash(list, seq, key));
            if let Slot::Occupied(slot) = self.entries.entry(key) {
                if slot.get().seq == seq {
                    let old = slot.remove();
                    self.discount(key, &old);
                }
            }
        }
    }

    fn discount(&mut self, key: u64, e: &Entry) {
        self.pages[e.list] -= e.pages;
        self.digest_sum = self.digest_sum.wrapping_sub(entry_hash(key, e));
    }

    pub fn pages(&self, list: usize) -> u64 {
        self.pages[list]
    }

    pub fn digest(&self) -> u64 {
        self.seal(self.digest_sum)
    }

    pub fn digest_from_scratch(&self) -> u64 {
        let sum = self
            .entries
            .iter()
            .map(|(k, e)| entry_hash(*k, e))
            .fold(0u64, u64::wrapping_add);
        let order_sum = (0..LISTS)
            .flat_map(|list| {
                self.order[list]
                    .iter()
                    .map(move |(seq, key)| item_hash(list, *seq, *key))
            })
            .fold(0u64, u64::wrapping_add);
        if order_sum != self.order_digest {
            return self.seal(sum).wrapping_add(1);
        }
        self.seal(sum)
    }

    fn seal(&self, sum: u64) -> u64 {
        let mut h = Hasher64::default()
            .word(sum)
            .word(self.next_seq)
            .word(self.order_digest);
        for list in 0..LISTS {
            h = h.word(self.pages[list]).word(self.order[list].len() as u64);
        }
        h.finish()
    }
}

impl GhostLists {
    /// Every field, for snapshots: live entries in key order, each list's
    /// queue as it is (stale items included), the recording counter.
    pub(crate) fn encode(&self, w: &mut Writer) {
        let mut keys: Vec<&u64> = self.entries.keys().collect();
        keys.sort_unstable();
        w.u64(keys.len() as u64);
        for key in keys {
            let e = &self.entries[key];
            for v in [*key, e.seq, e.list as u64, e.pages] {
                w.u64(v);
            }
        }
        for queue in &self.order {
            w.u64(queue.len() as u64);
            for (seq, key) in queue {
                w.u64(*seq);
                w.u64(*key);
            }
        }
        w.u64(self.next_seq);
    }

    /// The inverse of `encode`; page counts and digests are recomputed, and
    /// every live entry must still have its item in its list's queue (else
    /// it could never be forgotten).
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        let mut g = Self::default();
        for _ in 0..r.len(32)? {
            let (key, seq, list, pages) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let list = usize::try_from(list)
                .ok()
                .filter(|l| *l < LISTS)
                .ok_or(format!("ghost list {list} out of range"))?;
            let entry = Entry { seq, list, pages };
            if g.entries.insert(key, entry).is_some() {
                return Err(format!("ghost list key {key} listed twice"));
            }
            g.pages[list] = g.pages[list]
                .checked_add(pages)
                .ok_or("ghost list pages overflow")?;
            g.digest_sum = g.digest_sum.wrapping_add(entry_hash(key, &entry));
        }
        let mut queued = std::collections::BTreeSet::new();
        for list in 0..LISTS {
            for _ in 0..r.len(16)? {
                let (seq, key) = (r.u64()?, r.u64()?);
                if g.entries
                    .get(&key)
                    .is_some_and(|e| e.seq == seq && e.list == list)
                {
                    queued.insert(key);
                }
                g.push_order(list, seq, key);
            }
        }
        if queued.len() != g.entries.len() {
            return Err("a ghost list entry has no item in its queue".into());
        }
        g.next_seq = r.u64()?;
        if g.entries.values().any(|e| e.seq >= g.next_seq) {
            return Err("a ghost list entry is newer than the recording counter".into());
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_takes_back_and_trims_oldest_first() {
        let mut g = GhostLists::default();
        g.record(1, 0, 2);
        g.record(2, 0, 2);
        g.record(3, 1, 5);
        assert_eq!((g.pages(0), g.pages(1)), (4, 5));
        g.trim(0, 3);
        assert_eq!(g.take(1), None, "the oldest of list 0 went");
        assert_eq!(g.take(2), Some((0, 2)));
        assert_eq!(g.take(3), Some((1, 5)));
        assert_eq!((g.pages(0), g.pages(1)), (0, 0));
        g.record(4, 1, 1);
        g.record(4, 0, 3); // re-recorded: moves lists
        assert_eq!((g.pages(0), g.pages(1)), (3, 0));
        assert_eq!(g.digest(), g.digest_from_scratch());
        g.trim(1, 0);
        assert_eq!(
            g.take(4),
            Some((0, 3)),
            "the stale item of list 1 named nothing"
        );
    }
}
