//! A bounded history of content that recently left the tree, for
//! `Policy::Ghost` (after ARC's and LIRS's ghost lists).
//!
//! Content that comes back soon after it was dropped was dropped too early:
//! its reuse distance is longer than the cache reaches. Remembering the hit
//! count it had lets the re-inserted node resume where it left off instead
//! of restarting as one-shot traffic. Entries are keyed by content (the
//! parent's id and the first page's tokens: ids are never reused, only slots are, and a split
//! keeps a node's id on its suffix, so the parent of a dropped node keeps
//! naming the same prefix) and forgotten first-in first-out once the history
//! holds more pages than `GHOST_PAGES_PER_CACHED_PAGE` times the most pages
//! the tree has held (the tree knows no capacity; its high-water mark is
//! the cache size an engine gives it).
//!
//! The history also tells how much reuse the cache is missing: of the reused
//! pages lately (hits on device, and content coming back from the history),
//! the share that came back. The more reuse outruns the cache, the deeper the
//! policy puts one-shot content on probation. Everything here is replicated
//! state, in the digest, and visited in order only through `order`.

use std::collections::VecDeque;

use hashbrown::HashTable;

use crate::ids::{NodeId, Token};
use cpkv_hash::{mix64, Hasher64};
use cpkv_wire::{Reader, Writer};

/// `Policy::Ghost`'s weights, in sixteenths of the horizon: how far behind
/// its access one-shot content goes, and how far ahead each reuse puts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weights {
    pub probation: u64,
    pub reuse_bonus: u64,
}

/// One horizon, in the sixteenths `Weights` count in.
pub const SIXTEENTHS: u64 = 16;

/// One recorded drop, in recording order. Its sequence number is its place
/// in the queue; it is live while `entries` holds that number.
/// 16 bytes, not 24: the queue holds one item per dropped node, up to four
/// times the tree's pages. Hits and pages past `u32::MAX` are remembered as
/// `u32::MAX` (`narrow`), the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Item {
    key: u64,
    hits: u32,
    pages: u32,
}

/// A count as an item keeps it: saturated at `u32::MAX`.
fn narrow(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The most items the queue holds, live and stale, whatever its bound: a
/// live item is indexed by 32 bits of its sequence number.
const MAX_ITEMS: usize = u32::MAX as usize;

/// The live items' sequence numbers, found by key. A slot keeps the low 32
/// bits of a sequence number and the key is read from the item it names, so
/// a bucket is 5 bytes with its control byte where a `HashMap<u64, u64>`
/// takes 17: the history holds up to four entries per page the tree held,
/// and deletions leave its table at 1/4 to 1/2 full.
#[derive(Debug, Clone, Default)]
struct LiveItems(HashTable<u32>);

/// Where sequence number `seq`, kept as its low 32 bits, sits in a queue
/// whose front is `front` (the queue is shorter than 2^32 items).
fn offset(seq: u32, front: u64) -> usize {
    seq.wrapping_sub(front as u32) as usize
}

/// Content keys are hashes already; one mix spreads them over the buckets.
fn key_hash(key: u64) -> u64 {
    mix64(key)
}

impl LiveItems {
    fn len(&self) -> usize {
        self.0.len()
    }

    /// The sequence number of `key`'s live item.
    fn get(&self, key: u64, items: &VecDeque<Item>, front: u64) -> Option<u64> {
        self.0
            .find(key_hash(key), |&s| items[offset(s, front)].key == key)
            .map(|&s| front + offset(s, front) as u64)
    }

    /// Makes `seq` (already queued) `key`'s live item; returns the one it
    /// replaces.
    fn insert(&mut self, key: u64, seq: u64, items: &VecDeque<Item>, front: u64) -> Option<u64> {
        let rehash = |&s: &u32| key_hash(items[offset(s, front)].key);
        match self.0.entry(
            key_hash(key),
            |&s| items[offset(s, front)].key == key,
            rehash,
        ) {
            hashbrown::hash_table::Entry::Occupied(mut slot) => {
                let old = front + offset(*slot.get(), front) as u64;
                *slot.get_mut() = seq as u32;
                Some(old)
            }
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(seq as u32);
                None
            }
        }
    }

    /// Forgets `key`'s live item; returns its sequence number.
    fn remove(&mut self, key: u64, items: &VecDeque<Item>, front: u64) -> Option<u64> {
        let slot = self
            .0
            .find_entry(key_hash(key), |&s| items[offset(s, front)].key == key)
            .ok()?;
        let (s, _) = slot.remove();
        Some(front + offset(s, front) as u64)
    }

    /// Forgets item `seq` of `key` if it is live.
    fn remove_item(&mut self, key: u64, seq: u64) -> bool {
        self.0
            .find_entry(key_hash(key), |&s| s == seq as u32)
            .map(|slot| slot.remove())
            .is_ok()
    }

    /// The live items' sequence numbers, in no order.
    fn seqs(&self, front: u64) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().map(move |&s| front + offset(s, front) as u64)
    }
}

#[derive(Debug, Clone, Default)]
pub struct GhostHistory {
    /// The live items, found by key (`LiveItems`). Looked up by key only,
    /// never iterated in any decision (the digest sums over it, which is
    /// order-free), so its hash order cannot leak.
    entries: LiveItems,
    /// Every recorded drop still in the bound, oldest first; the front's
    /// sequence number is `next_seq - items.len()`. An item taken back or
    /// re-recorded since is stale, skipped when it reaches the front.
    items: VecDeque<Item>,
    /// Wrapping sum of the items' queue hashes (stale ones count too: they
    /// take room in the queue's bound).
    order_digest: u64,
    next_seq: u64,
    pages: usize,
    /// The most pages (device and host) the tree held when it dropped a node.
    peak_cached_pages: usize,
    /// Wrapping sum of the live entries' hashes.
    digest_sum: u64,
    /// Reused pages lately: hit on device, and back from the history (both
    /// halved whenever their sum passes `REUSE_WINDOW_PAGES`).
    hit_pages: u64,
    returned_pages: u64,
}

/// The history's bound, per page of the tree's high-water mark.
const GHOST_PAGES_PER_CACHED_PAGE: usize = 4;
/// How many recent reused pages the hit/return mix reflects.
const REUSE_WINDOW_PAGES: u64 = 1 << 14;
/// One-shot content goes at least half a horizon behind its access.
const MIN_PROBATION: u64 = SIXTEENTHS / 2;

/// The content key of a node: its parent and its first page.
pub fn content_key(parent: NodeId, first_page: &[Token]) -> u64 {
    Hasher64::default()
        .word(parent.0)
        .words(first_page)
        .finish()
}

fn entry_hash(seq: u64, item: &Item) -> u64 {
    Hasher64::default()
        .word(item.key)
        .word(seq)
        .word(u64::from(item.hits))
        .word(u64::from(item.pages))
        .finish()
}

fn item_hash(seq: u64, key: u64) -> u64 {
    Hasher64::new(1).word(seq).word(key).finish()
}

impl GhostHistory {
    fn front_seq(&self) -> u64 {
        self.next_seq - self.items.len() as u64
    }

    fn item(&self, seq: u64) -> &Item {
        &self.items[(seq - self.front_seq()) as usize]
    }

    fn push(&mut self, item: Item) {
        self.order_digest = self
            .order_digest
            .wrapping_add(item_hash(self.next_seq, item.key));
        self.items.push_back(item);
        self.next_seq += 1;
    }

    /// Remembers that content `key` of `pages` pages left with `hits` hits
    /// from a tree that held `cached_pages` pages (it included), then forgets
    /// the oldest entries until the history is within its bound (in pages
    /// and in queue items).
    pub fn record(&mut self, key: u64, hits: u64, pages: usize, cached_pages: usize) {
        self.peak_cached_pages = self.peak_cached_pages.max(cached_pages);
        let bound = GHOST_PAGES_PER_CACHED_PAGE * self.peak_cached_pages;
        let item = Item {
            key,
            hits: narrow(hits),
            pages: narrow(pages as u64),
        };
        let seq = self.next_seq;
        // Queued first: the index reads keys from the queue. One lookup: a
        // re-recorded key's old item goes stale.
        self.push(item);
        let front = self.front_seq();
        if let Some(old) = self.entries.insert(key, seq, &self.items, front) {
            self.discount(old);
        }
        self.digest_sum = self.digest_sum.wrapping_add(entry_hash(seq, &item));
        self.pages += item.pages as usize;
        while self.pages > bound || self.items.len() > bound.clamp(1, MAX_ITEMS) {
            let seq = self.front_seq();
            let Some(front) = self.items.front().copied() else {
                break;
            };
            // Stale items (taken back or re-recorded since) name no entry.
            if self.entries.remove_item(front.key, seq) {
                self.discount(seq);
            }
            self.items.pop_front();
            self.order_digest = self.order_digest.wrapping_sub(item_hash(seq, front.key));
        }
    }

    /// Content `key` came back: forgets it and returns the hits it had, if
    /// it was remembered, counting its pages as reuse the cache missed.
    pub fn take_back(&mut self, key: u64) -> Option<u64> {
        let (hits, pages) = self.forget(key)?;
        self.returned_pages += pages as u64;
        self.rescale();
        Some(hits)
    }

    /// Counts `pages` reused pages the cache did hold. Until the tree first
    /// drops something it holds everything, so hits say nothing yet.
    pub fn note_hit(&mut self, pages: usize) {
        if self.next_seq == 0 {
            return;
        }
        self.hit_pages += pages as u64;
        self.rescale();
    }

    /// How `Policy::Ghost` weighs one-shot and reused content now, from
    /// the share `s` of recent reuse that came back from the history: one-shot
    /// content goes `clamp(2s, 1/2, 1)` horizons behind its access, each
    /// reuse puts content `s` horizons ahead. Reuse the cache keeps up with
    /// (large caches) tends to plain recency; reuse that outruns it keeps
    /// fewer newcomers, longer. With nothing measured yet: 1/2 and 1.
    pub fn weights(&self) -> Weights {
        let reused = self.hit_pages + self.returned_pages;
        if reused == 0 {
            return Weights {
                probation: MIN_PROBATION,
                reuse_bonus: SIXTEENTHS,
            };
        }
        let share = SIXTEENTHS * self.returned_pages / reused;
        Weights {
            probation: (2 * share).clamp(MIN_PROBATION, SIXTEENTHS),
            reuse_bonus: share,
        }
    }

    fn rescale(&mut self) {
        while self.hit_pages + self.returned_pages > REUSE_WINDOW_PAGES {
            self.hit_pages /= 2;
            self.returned_pages /= 2;
        }
    }

    fn forget(&mut self, key: u64) -> Option<(u64, usize)> {
        let seq = self.entries.remove(key, &self.items, self.front_seq())?;
        let item = self.discount(seq);
        Some((u64::from(item.hits), item.pages as usize))
    }

    /// Takes the item whose entry was just removed out of the page count and
    /// the digest.
    fn discount(&mut self, seq: u64) -> Item {
        let item = *self.item(seq);
        self.pages -= item.pages as usize;
        self.digest_sum = self.digest_sum.wrapping_sub(entry_hash(seq, &item));
        item
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Reused pages lately: (hit on device, back from the history).
    #[cfg(test)]
    pub(crate) fn reuse_pages(&self) -> (u64, u64) {
        (self.hit_pages, self.returned_pages)
    }

    /// Whether queued item `seq` is its key's live one.
    fn is_live(&self, seq: u64, item: &Item) -> bool {
        self.entries.get(item.key, &self.items, self.front_seq()) == Some(seq)
    }

    /// The remembered content, oldest first: `(key, hits, pages)`.
    pub fn remembered(&self) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
        (self.front_seq()..)
            .zip(&self.items)
            .filter(|(seq, item)| self.is_live(*seq, item))
            .map(|(_, item)| (item.key, u64::from(item.hits), item.pages as usize))
    }

    /// Every field, for snapshots: the queue as it is, oldest first (stale
    /// items included: they decide when entries are forgotten), each item's
    /// key and whether it is live, a live one's hits and pages. Sequence
    /// numbers follow from the order, so none is written: 17 bytes a live
    /// item, 9 a stale one.
    ///
    /// An empty history is written as version 5 wrote it (two zero counts,
    /// then the five words), so the other policies' earlier snapshots, whose
    /// histories are always empty, still read.
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u64(self.entries.len() as u64);
        w.u64(self.items.len() as u64);
        for (seq, item) in (self.front_seq()..).zip(&self.items) {
            w.u64(item.key);
            if self.is_live(seq, item) {
                w.u8(1);
                w.u32(item.hits);
                w.u32(item.pages);
            } else {
                w.u8(0);
            }
        }
        for v in [
            self.next_seq,
            self.pages as u64,
            self.peak_cached_pages as u64,
            self.hit_pages,
            self.returned_pages,
        ] {
            w.u64(v);
        }
    }

    /// The inverse of `encode`. Refuses what no replay builds: a key live
    /// twice, an item of a key after that key's live one (a live item is
    /// its key's newest), a live count that is not the live items', a queue
    /// longer than its records.
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        let live_count = r.u64()?;
        let mut items = Vec::new();
        let mut live = Vec::new();
        for _ in 0..r.len(9)? {
            let key = r.u64()?;
            let item = match r.u8()? {
                0 => Item {
                    key,
                    hits: 0,
                    pages: 0,
                },
                1 => {
                    live.push(items.len());
                    Item {
                        key,
                        hits: r.u32()?,
                        pages: r.u32()?,
                    }
                }
                flag => return Err(format!("bad ghost item flag {flag}")),
            };
            items.push(item);
        }
        if items.len() > MAX_ITEMS {
            return Err(format!(
                "ghost queue of {} items, over {MAX_ITEMS}",
                items.len()
            ));
        }
        if live.len() as u64 != live_count {
            return Err(format!(
                "ghost live count {live_count} != {} live items",
                live.len()
            ));
        }
        let to_usize = |v: u64| usize::try_from(v).map_err(|_| "ghost count out of range");
        let next_seq = r.u64()?;
        let front = next_seq
            .checked_sub(items.len() as u64)
            .ok_or("ghost queue longer than its records")?;
        let mut g = Self {
            next_seq: front,
            ..Self::default()
        };
        for item in items {
            g.push(item);
        }
        for at in live {
            let (seq, item) = (front + at as u64, g.items[at]);
            if g.entries.insert(item.key, seq, &g.items, front).is_some() {
                return Err(format!("ghost key {} listed twice", item.key));
            }
            g.digest_sum = g.digest_sum.wrapping_add(entry_hash(seq, &item));
            g.pages += item.pages as usize;
        }
        if let Some(after) = (front..).zip(&g.items).find(|(seq, item)| {
            g.entries
                .get(item.key, &g.items, front)
                .is_some_and(|live| live < *seq)
        }) {
            return Err(format!(
                "ghost key {} has an item after its live one",
                after.1.key
            ));
        }
        let stored_pages = to_usize(r.u64()?)?;
        g.peak_cached_pages = to_usize(r.u64()?)?;
        g.hit_pages = r.u64()?;
        g.returned_pages = r.u64()?;
        if stored_pages != g.pages {
            return Err(format!(
                "ghost pages {stored_pages} != {} in its entries",
                g.pages
            ));
        }
        Ok(g)
    }

    /// O(1): the live entries, the recording counter, the queue length and
    /// the reuse mix.
    pub fn digest(&self) -> u64 {
        self.seal(self.digest_sum)
    }

    fn seal(&self, sum: u64) -> u64 {
        Hasher64::default()
            .word(sum)
            .word(self.next_seq)
            .word(self.items.len() as u64)
            .word(self.order_digest)
            .word(self.pages as u64)
            .word(self.peak_cached_pages as u64)
            .word(self.hit_pages)
            .word(self.returned_pages)
            .finish()
    }

    /// The digest recomputed from the entries (for checks).
    pub fn digest_from_scratch(&self) -> u64 {
        let sum = self
            .entries
            .seqs(self.front_seq())
            .map(|seq| entry_hash(seq, self.item(seq)))
            .fold(0u64, u64::wrapping_add);
        let order_sum = (self.front_seq()..)
            .zip(&self.items)
            .map(|(seq, item)| item_hash(seq, item.key))
            .fold(0u64, u64::wrapping_add);
        if order_sum != self.order_digest {
            return self.seal(sum).wrapping_add(1);
        }
        self.seal(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_takes_back_and_forgets_oldest_first() {
        let mut g = GhostHistory::default();
        g.record(1, 3, 4, 2); // bound: 4 * 2 pages held
        g.record(2, 1, 4, 2);
        assert_eq!(g.pages(), 8);
        g.record(3, 2, 4, 2); // 12 > 8: the oldest (1) goes
        assert_eq!(g.take_back(1), None);
        assert_eq!(g.take_back(2), Some(1));
        assert_eq!(g.take_back(2), None);
        assert_eq!(g.pages(), 4);
        assert_eq!(g.digest(), g.digest_from_scratch());
    }

    #[test]
    fn remembered_lists_live_entries_oldest_first() {
        let mut g = GhostHistory::default();
        for (key, hits) in [(1, 0), (2, 4), (3, 1), (4, 2)] {
            g.record(key, hits, key as usize, 100);
        }
        g.take_back(3);
        g.record(1, 5, 1, 100); // re-recorded: now the newest
        let listed: Vec<_> = g.remembered().collect();
        assert_eq!(listed, vec![(2, 4, 2), (4, 2, 4), (1, 5, 1)]);
    }

    /// One history's snapshot encoding.
    fn encoded(g: &GhostHistory) -> Vec<u8> {
        let mut w = Writer::default();
        g.encode(&mut w);
        w.into_bytes()
    }

    #[test]
    fn snapshots_round_trip_and_what_no_replay_builds_is_refused() {
        let mut g = GhostHistory::default();
        for key in 0..12 {
            g.record(key % 5, key, 2, 4); // re-records leave stale items
        }
        g.take_back(3);
        let bytes = encoded(&g);
        let back = GhostHistory::decode(&mut Reader::new(&bytes)).unwrap();
        assert_eq!(back.digest(), g.digest());
        assert_eq!(back.digest(), back.digest_from_scratch());
        assert!(back.remembered().eq(g.remembered()));
        assert_eq!(encoded(&back), bytes);
        // Three live items, keys 7, 8 and 9, of 17 bytes each.
        let mut g = GhostHistory::default();
        for key in [7, 8, 9] {
            g.record(key, 1, 1, 100);
        }
        let bytes = encoded(&g);
        assert_eq!(bytes.len(), 16 + 3 * 17 + 5 * 8);
        let key_at = |i: usize| 16 + 17 * i;
        let refused = |edit: &dyn Fn(&mut Vec<u8>), why: &str| {
            let mut b = bytes.clone();
            edit(&mut b);
            let err = GhostHistory::decode(&mut Reader::new(&b)).unwrap_err();
            assert!(err.contains(why), "{why}: {err}");
        };
        refused(&|b| b[key_at(1)] = 7, "ghost key 7 listed twice");
        refused(&|b| b[0] = 2, "ghost live count 2 != 3 live items");
        refused(&|b| b[key_at(0) + 8] = 2, "bad ghost item flag 2");
        // Item 1 made stale, of key 7: after 7's live item.
        refused(
            &|b| {
                b.drain(key_at(1) + 9..key_at(1) + 17);
                b[key_at(1)] = 7;
                b[key_at(1) + 8] = 0;
                b[0] = 2;
            },
            "ghost key 7 has an item after its live one",
        );
        refused(
            &|b| b[16 + 3 * 17] = 2,
            "ghost queue longer than its records",
        );
    }

    #[test]
    fn an_item_is_two_words_and_saturates_past_32_bits() {
        assert_eq!(size_of::<Item>(), 16);
        let mut g = GhostHistory::default();
        g.record(9, u64::MAX, 3, 10);
        assert_eq!(g.take_back(9), Some(u64::from(u32::MAX)));
    }

    /// What the history must do, kept the plainest way: every recorded
    /// drop in a list, live ones found by scanning it.
    #[derive(Default)]
    struct Model {
        queue: Vec<(u64, u64, usize, bool)>, // key, hits, pages, live
        peak: usize,
    }

    impl Model {
        fn pages(&self) -> usize {
            self.queue.iter().filter(|i| i.3).map(|i| i.2).sum()
        }
        fn take_back(&mut self, key: u64) -> Option<u64> {
            let item = self.queue.iter_mut().find(|i| i.0 == key && i.3)?;
            item.3 = false;
            Some(item.1)
        }
        fn record(&mut self, key: u64, hits: u64, pages: usize, cached: usize) {
            self.take_back(key);
            self.peak = self.peak.max(cached);
            self.queue.push((key, u64::from(narrow(hits)), pages, true));
            let bound = GHOST_PAGES_PER_CACHED_PAGE * self.peak;
            while self.pages() > bound || self.queue.len() > bound.max(1) {
                self.queue.remove(0);
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Record(u64, u64, usize, usize),
        TakeBack(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (0..40u64, any::<u64>(), 1..6usize, 1..30usize)
                .prop_map(|(k, h, p, c)| Op::Record(k, h, p, c)),
            1 => (0..40u64).prop_map(Op::TakeBack),
        ]
    }

    proptest::proptest! {
        #[test]
        fn the_history_does_what_its_model_does(ops in proptest::collection::vec(op(), 1..400)) {
            let (mut g, mut m) = (GhostHistory::default(), Model::default());
            for op in ops {
                match op {
                    Op::Record(k, h, p, c) => {
                        g.record(k, h, p, c);
                        m.record(k, h, p, c);
                    }
                    Op::TakeBack(k) => proptest::prop_assert_eq!(g.take_back(k), m.take_back(k)),
                }
                proptest::prop_assert_eq!(g.pages(), m.pages());
                proptest::prop_assert_eq!(g.digest(), g.digest_from_scratch());
                let live: Vec<_> = m.queue.iter().filter(|i| i.3).map(|i| (i.0, i.1, i.2)).collect();
                proptest::prop_assert!(g.remembered().eq(live));
            }
            let bytes = encoded(&g);
            let back = GhostHistory::decode(&mut Reader::new(&bytes)).unwrap();
            proptest::prop_assert_eq!(back.digest(), g.digest());
            proptest::prop_assert_eq!(encoded(&back), bytes);
        }
    }

    #[test]
    fn re_recording_replaces_and_the_digest_tracks_every_change() {
        let mut g = GhostHistory::default();
        g.record(7, 1, 2, 25);
        let once = g.digest();
        g.record(7, 5, 2, 25);
        assert_eq!(g.pages(), 2);
        assert_ne!(g.digest(), once);
        assert_eq!(g.digest(), g.digest_from_scratch());
        assert_eq!(g.take_back(7), Some(5));
    }

    #[test]
    fn weights_follow_the_share_of_reuse_that_came_back() {
        let mut g = GhostHistory::default();
        let cold = Weights {
            probation: MIN_PROBATION,
            reuse_bonus: SIXTEENTHS,
        };
        g.note_hit(50); // nothing dropped yet: hits say nothing
        assert_eq!(g.weights(), cold);
        g.record(1, 2, 100, 250);
        g.note_hit(900);
        let before = g.digest();
        assert_eq!(g.take_back(1), Some(2)); // 100 of 1000 reused pages came back
        assert_ne!(g.digest(), before);
        assert_eq!(
            g.weights(),
            Weights {
                probation: MIN_PROBATION, // 2 * 1, clamped up to 8
                reuse_bonus: 1,
            }
        );
        g.record(2, 2, 900, 250);
        g.take_back(2); // 1000 of 1900
        assert_eq!(
            g.weights(),
            Weights {
                probation: SIXTEENTHS,
                reuse_bonus: 8,
            }
        );
        // A flood of hits slides the window: old counts halve and the
        // weights go back towards recency.
        g.note_hit(REUSE_WINDOW_PAGES as usize);
        assert_eq!(
            (g.hit_pages, g.returned_pages),
            ((900 + REUSE_WINDOW_PAGES) / 2, 500)
        );
        assert_eq!(g.weights().reuse_bonus, 16 * 500 / (500 + g.hit_pages));
        assert_eq!(g.digest(), g.digest_from_scratch());
    }
}
