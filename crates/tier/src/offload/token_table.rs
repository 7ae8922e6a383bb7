//! Each resident chunk's slot by its key's token: an open-addressing table
//! (linear probing, at most half full, deletion by backward shift).
//!
//! A token is already a full 64-bit hash of its key (`token_of`), so its top
//! bits pick the bucket, and a bucket holds the token and the slot side by
//! side (16 bytes, four to a cache line): a lookup nearly always reads one
//! line. A batch fetches the lines of all its tokens before it probes any
//! (`prefetch`), so their cache misses overlap instead of queueing one
//! behind the other.
//!
//! Looked up only, never iterated in a decision (the index's rule for its
//! tables): where an entry sits depends on the order of inserts and
//! removals, what a lookup answers does not.

use super::prefetch::prefetch;
use super::NO_SLOT;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    token: u64,
    /// `NO_SLOT`: empty (a chunk's slot is below it).
    slot: u32,
}

const EMPTY: Bucket = Bucket {
    token: 0,
    slot: NO_SLOT,
};

/// Buckets of a table's first allocation.
const MIN_BUCKETS: usize = 16;

#[derive(Debug, Default)]
pub(super) struct TokenTable {
    /// A power of two long (or empty, before the first insert).
    buckets: Vec<Bucket>,
    len: usize,
}

impl TokenTable {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bucket `token`'s probe starts at (`buckets` not empty).
    fn home(&self, token: u64) -> usize {
        // The top bits: `buckets.len()` is a power of two, at most 2^63.
        let bits = self.buckets.len().trailing_zeros();
        if bits == 0 {
            0
        } else {
            (token >> (64 - bits)) as usize
        }
    }

    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    /// Where `token` is, or the empty bucket that ends its probe.
    fn find(&self, token: u64) -> (usize, bool) {
        let mask = self.mask();
        let mut at = self.home(token);
        loop {
            let b = self.buckets[at];
            if b.slot == NO_SLOT {
                return (at, false);
            }
            if b.token == token {
                return (at, true);
            }
            at = (at + 1) & mask;
        }
    }

    pub(super) fn get(&self, token: u64) -> Option<u32> {
        if self.buckets.is_empty() {
            return None;
        }
        match self.find(token) {
            (at, true) => Some(self.buckets[at].slot),
            (_, false) => None,
        }
    }

    /// Starts fetching the cache line `get(token)` reads first.
    pub(super) fn prefetch(&self, token: u64) {
        if !self.buckets.is_empty() {
            prefetch(&self.buckets[self.home(token)]);
        }
    }

    /// Maps `token` to `slot` (a slot below `NO_SLOT`); returns the slot it
    /// mapped to before.
    pub(super) fn insert(&mut self, token: u64, slot: u32) -> Option<u32> {
        debug_assert_ne!(slot, NO_SLOT);
        if (self.len + 1) * 2 > self.buckets.len() {
            self.grow();
        }
        let (at, found) = self.find(token);
        let before = found.then_some(self.buckets[at].slot);
        if !found {
            self.len += 1;
        }
        self.buckets[at] = Bucket { token, slot };
        before
    }

    /// Unmaps `token`; returns the slot it mapped to.
    pub(super) fn remove(&mut self, token: u64) -> Option<u32> {
        if self.buckets.is_empty() {
            return None;
        }
        let (mut hole, found) = self.find(token);
        if !found {
            return None;
        }
        let slot = self.buckets[hole].slot;
        self.len -= 1;
        // Backward shift: each entry after the hole, up to the next empty
        // bucket, moves into the hole when the hole lies on its probe (from
        // its home to where it is), so every probe still reaches its entry.
        let mask = self.mask();
        let mut next = (hole + 1) & mask;
        loop {
            let b = self.buckets[next];
            if b.slot == NO_SLOT {
                break;
            }
            let home = self.home(b.token);
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.buckets[hole] = b;
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.buckets[hole] = EMPTY;
        Some(slot)
    }

    /// Twice the buckets (or the first ones), every entry placed again.
    fn grow(&mut self) {
        let size = (self.buckets.len() * 2).max(MIN_BUCKETS);
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; size]);
        for b in old.into_iter().filter(|b| b.slot != NO_SLOT) {
            let (at, _) = self.find(b.token);
            self.buckets[at] = b;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
    }

    /// Tokens from a small set, spread over a few top-bit values and low
    /// bits, so probes run long, collide and wrap past the table's end.
    fn token() -> impl Strategy<Value = u64> {
        (0u64..4, 0u64..24).prop_map(|(high, low)| (high << 62) | (u64::MAX >> 2 & !0xff) | low)
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            3 => (token(), 0u32..1000).prop_map(|(t, s)| Op::Insert(t, s)),
            2 => token().prop_map(Op::Remove),
        ];
        prop::collection::vec(op, 1..300)
    }

    proptest! {
        /// Against a `HashMap`: every answer equal after every op, for every
        /// token the ops use, and the length too.
        #[test]
        fn answers_as_a_hash_map_does(ops in ops()) {
            let mut table = TokenTable::default();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for op in &ops {
                match *op {
                    Op::Insert(t, s) => prop_assert_eq!(table.insert(t, s), model.insert(t, s)),
                    Op::Remove(t) => prop_assert_eq!(table.remove(t), model.remove(&t)),
                }
                prop_assert_eq!(table.len(), model.len());
                prop_assert!(table.len() * 2 <= table.buckets.len().max(1));
                for high in 0..4u64 {
                    for low in 0..24u64 {
                        let t = (high << 62) | (u64::MAX >> 2 & !0xff) | low;
                        prop_assert_eq!(table.get(t), model.get(&t).copied());
                    }
                }
            }
        }
    }

    #[test]
    fn a_removal_keeps_a_wrapped_probe_reachable() {
        let mut table = TokenTable::default();
        // Four tokens whose home is the last bucket of 16: the probe wraps.
        let last = |low: u64| (0xf << 60) | low;
        for low in 0..4 {
            table.insert(last(low), low as u32);
        }
        assert_eq!(table.buckets.len(), 16);
        assert_eq!(table.remove(last(0)), Some(0));
        for low in 1..4 {
            assert_eq!(table.get(last(low)), Some(low as u32));
        }
        assert_eq!((table.get(last(0)), table.len()), (None, 3));
    }
}
