//! The L3 index: which key sits in which slot of the node's preallocated
//! data files, under which sequence, and which page goes next.
//!
//! Every choice reads only the replicated call sequence: slots are taken
//! lowest-free first, victims in order of a logical clock (ties impossible:
//! each tick is used once), sequences count placements. So every rank, on
//! every node, replaying the same calls holds the same index and the same
//! digest, and no collective decides anything. One rank per node writes
//! each page (`writer_rank`); the others only record the placement.

use std::collections::{BTreeSet, HashMap};

use cpkv_hash::{hash_words, mix64, WordHashing};

use super::error::L3Error;
use super::log::LogEntry;

/// The most slots an index holds (slot numbers are 32-bit in the log).
pub const MAX_L3_SLOTS: u64 = u32::MAX as u64;
const ENTRY_TAG: u64 = 0x4c33_454e; // "L3EN"
const STATE_TAG: u64 = 0x4c33_5354; // "L3ST"

/// The rank of a node (0..ranks_on_node) that writes and reads `key`'s
/// record: a fixed hash of the key, so the ranks split the disk traffic
/// evenly and agree without talking.
pub fn writer_rank(key: u64, ranks_on_node: u32) -> u32 {
    (mix64(key ^ 0x4c33_5752) % u64::from(ranks_on_node.max(1))) as u32
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    slot: u32,
    sequence: u64,
    used: u64,
}

/// One new page of a batch: where it goes and who writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L3Placement {
    pub key: u64,
    pub slot: u32,
    pub sequence: u64,
    /// The key this placement evicted from the slot, if any.
    pub evicted: Option<u64>,
    pub writer: u32,
}

/// What recovery made of the logs' entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct L3Recovery {
    /// Entries read.
    pub entries: u64,
    /// Pages in the rebuilt index.
    pub kept: u64,
    /// Entries a later entry replaced (same key or same slot).
    pub superseded: u64,
    /// Entries naming a slot beyond this store's capacity (a store reopened
    /// smaller): dropped.
    pub out_of_range: u64,
}

#[derive(Debug, Clone)]
pub struct L3Index {
    slots: u32,
    ranks_on_node: u32,
    entries: HashMap<u64, Entry, WordHashing>,
    /// `by_slot[s]`: the key in slot `s`, for slots below `high_water`.
    by_slot: Vec<Option<u64>>,
    /// Freed slots below `high_water`; slots from `high_water` up were never used.
    free: BTreeSet<u32>,
    high_water: u32,
    /// (last use tick, key): the eviction order, oldest first.
    recency: BTreeSet<(u64, u64)>,
    clock: u64,
    next_sequence: u64,
    /// Wrapping sum of every entry's hash.
    entry_sum: u64,
    pub hits: u64,
    pub misses: u64,
    pub placed: u64,
    pub evicted: u64,
    pub dropped: u64,
}

fn entry_hash(key: u64, e: &Entry) -> u64 {
    hash_words(ENTRY_TAG, &[key, u64::from(e.slot), e.sequence, e.used])
}

impl L3Index {
    /// An empty index of `slots` slots shared by `ranks_on_node` ranks.
    pub fn new(slots: u64, ranks_on_node: u64) -> Result<Self, L3Error> {
        if slots == 0 || slots > MAX_L3_SLOTS {
            return Err(L3Error::Argument {
                name: "slots",
                reason: format!("must be in 1..={MAX_L3_SLOTS}, got {slots}"),
            });
        }
        if ranks_on_node == 0 || ranks_on_node > u64::from(u16::MAX) {
            return Err(L3Error::Argument {
                name: "ranks_on_node",
                reason: format!("must be in 1..=65535, got {ranks_on_node}"),
            });
        }
        Ok(Self {
            slots: slots as u32,
            ranks_on_node: ranks_on_node as u32,
            entries: HashMap::default(),
            by_slot: Vec::new(),
            free: BTreeSet::new(),
            high_water: 0,
            recency: BTreeSet::new(),
            clock: 0,
            next_sequence: 1,
            entry_sum: 0,
            hits: 0,
            misses: 0,
            placed: 0,
            evicted: 0,
            dropped: 0,
        })
    }

    pub fn slots(&self) -> u64 {
        u64::from(self.slots)
    }
    pub fn ranks_on_node(&self) -> u32 {
        self.ranks_on_node
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// The index's state as one word, equal on every rank that made the same
    /// calls: every entry (key, slot, sequence, last use), the clock and the
    /// next sequence.
    pub fn digest(&self) -> u64 {
        hash_words(
            STATE_TAG,
            &[
                self.entry_sum,
                self.entries.len() as u64,
                self.clock,
                self.next_sequence,
            ],
        )
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn set_entry(&mut self, key: u64, entry: Entry) {
        self.entry_sum = self.entry_sum.wrapping_add(entry_hash(key, &entry));
        self.recency.insert((entry.used, key));
        self.entries.insert(key, entry);
    }

    fn take_entry(&mut self, key: u64) -> Option<Entry> {
        let entry = self.entries.remove(&key)?;
        self.entry_sum = self.entry_sum.wrapping_sub(entry_hash(key, &entry));
        self.recency.remove(&(entry.used, key));
        Some(entry)
    }

    /// Removes `key` and frees its slot.
    fn remove(&mut self, key: u64) -> Option<Entry> {
        let entry = self.take_entry(key)?;
        self.by_slot[entry.slot as usize] = None;
        self.free.insert(entry.slot);
        Some(entry)
    }

    fn touch(&mut self, key: u64) -> Option<Entry> {
        let mut entry = self.take_entry(key)?;
        entry.used = self.tick();
        self.set_entry(key, entry);
        Some(entry)
    }

    /// (slot, sequence) of `key` without counting a use.
    pub fn peek(&self, key: u64) -> Option<(u32, u64)> {
        self.entries.get(&key).map(|e| (e.slot, e.sequence))
    }

    /// A lookup: (slot, sequence) of `key`, which counts as its use (moves it
    /// to the back of the eviction order); `None` is a miss.
    pub fn lookup(&mut self, key: u64) -> Option<(u32, u64)> {
        match self.touch(key) {
            Some(e) => {
                self.hits += 1;
                Some((e.slot, e.sequence))
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Drops `key` (its record failed its check): the slot is free again.
    /// Returns the tombstone to log (`LogEntry::tombstone`, so a recovery
    /// does not bring back what the slot held before), `None` when absent.
    pub fn drop_key(&mut self, key: u64) -> Option<LogEntry> {
        let entry = self.remove(key)?;
        self.dropped += 1;
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        Some(LogEntry::tombstone(key, entry.slot, sequence))
    }

    /// Places a batch of pages leaving the host slab, in the caller's order.
    /// A key already in the index counts as a use and is not written again;
    /// each new key takes the lowest free slot, or the slot of the least
    /// recently used page (evicting it). All or nothing: a repeated key or
    /// more new pages than slots changes nothing.
    pub fn place(&mut self, keys: &[u64]) -> Result<Vec<L3Placement>, L3Error> {
        let mut seen: HashMap<u64, (), WordHashing> = HashMap::default();
        let mut new = 0u64;
        for &key in keys {
            if seen.insert(key, ()).is_some() {
                return Err(L3Error::RepeatedKey { key });
            }
            new += u64::from(!self.entries.contains_key(&key));
        }
        if new > u64::from(self.slots) {
            return Err(L3Error::BatchTooLarge {
                pages: new,
                slots: u64::from(self.slots),
            });
        }
        let mut placements = Vec::with_capacity(new as usize);
        for &key in keys {
            if self.touch(key).is_some() {
                continue;
            }
            let (slot, evicted) = self.free_slot();
            let entry = Entry {
                slot,
                sequence: self.next_sequence,
                used: self.tick(),
            };
            self.next_sequence += 1;
            self.by_slot[slot as usize] = Some(key);
            self.set_entry(key, entry);
            self.placed += 1;
            placements.push(L3Placement {
                key,
                slot,
                sequence: entry.sequence,
                evicted,
                writer: writer_rank(key, self.ranks_on_node),
            });
        }
        Ok(placements)
    }

    /// A slot for a new page: a free one (lowest first), else the least
    /// recently used page's, evicted.
    fn free_slot(&mut self) -> (u32, Option<u64>) {
        let freed = self.free.first().copied();
        match freed {
            Some(slot) if slot < self.high_water => {
                self.free.remove(&slot);
                return (slot, None);
            }
            _ => {}
        }
        if self.high_water < self.slots {
            let slot = self.high_water;
            self.high_water += 1;
            self.by_slot.push(None);
            return (slot, None);
        }
        let (_, victim) = *self.recency.first().expect("a full index has entries");
        let entry = self.remove(victim).expect("the victim is indexed");
        self.free.remove(&entry.slot);
        self.evicted += 1;
        (entry.slot, Some(victim))
    }

    /// Every (key, slot, sequence), in sequence order (a checkpoint).
    pub fn entries(&self) -> Vec<(u64, u32, u64)> {
        let mut out: Vec<_> = self
            .entries
            .iter()
            .map(|(k, e)| (*k, e.slot, e.sequence))
            .collect();
        out.sort_unstable_by_key(|e| e.2);
        out
    }

    /// Rebuilds an index from log entries (any order, from any number of
    /// ranks' logs, duplicates allowed) without reading page data: entries
    /// are applied in sequence order, a later one replacing an earlier one
    /// of the same key or slot; the eviction order is the sequence order.
    pub fn recover(
        slots: u64,
        ranks_on_node: u64,
        mut log: Vec<LogEntry>,
    ) -> Result<(Self, L3Recovery), L3Error> {
        let mut index = Self::new(slots, ranks_on_node)?;
        let mut report = L3Recovery {
            entries: log.len() as u64,
            ..L3Recovery::default()
        };
        log.sort_unstable_by_key(|e| (e.sequence, e.slot, e.key));
        log.dedup();
        let duplicates = report.entries - log.len() as u64;
        let mut max_sequence = 0u64;
        let mut max_slot: Option<u32> = None;
        let mut slot_key: HashMap<u32, u64, WordHashing> = HashMap::default();
        for e in &log {
            max_sequence = max_sequence.max(e.sequence);
            if e.slot >= index.slots {
                report.out_of_range += 1;
                continue;
            }
            if e.is_tombstone() {
                if slot_key.get(&e.slot) == Some(&e.key) {
                    slot_key.remove(&e.slot);
                    index.take_entry(e.key);
                    report.superseded += 1;
                }
                continue;
            }
            if let Some(old) = slot_key.insert(e.slot, e.key) {
                if index.take_entry(old).is_some() {
                    report.superseded += 1;
                }
            }
            if let Some(old) = index.take_entry(e.key) {
                slot_key.remove(&old.slot);
                slot_key.insert(e.slot, e.key);
                report.superseded += 1;
            }
            index.clock += 1;
            let entry = Entry {
                slot: e.slot,
                sequence: e.sequence,
                used: index.clock,
            };
            index.set_entry(e.key, entry);
            max_slot = Some(max_slot.map_or(e.slot, |m| m.max(e.slot)));
        }
        index.high_water = max_slot.map_or(0, |m| m + 1);
        index.by_slot = vec![None; index.high_water as usize];
        for (key, e) in &index.entries {
            index.by_slot[e.slot as usize] = Some(*key);
        }
        index.free = (0..index.high_water)
            .filter(|s| index.by_slot[*s as usize].is_none())
            .collect();
        index.next_sequence = max_sequence + 1;
        report.superseded += duplicates;
        report.kept = index.entries.len() as u64;
        Ok((index, report))
    }

    /// Checks every internal invariant; `Err` names the first broken one.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.entries.len() > self.slots as usize {
            return Err(format!(
                "{} entries in {} slots",
                self.entries.len(),
                self.slots
            ));
        }
        if self.recency.len() != self.entries.len() {
            return Err("recency and entries differ in size".into());
        }
        let mut sum = 0u64;
        for (key, e) in &self.entries {
            if self.by_slot.get(e.slot as usize) != Some(&Some(*key)) {
                return Err(format!("key {key:#x} is not in its slot {}", e.slot));
            }
            if !self.recency.contains(&(e.used, *key)) {
                return Err(format!("key {key:#x} missing from the eviction order"));
            }
            if e.sequence >= self.next_sequence || e.used > self.clock {
                return Err(format!("key {key:#x} is ahead of the clock or sequence"));
            }
            sum = sum.wrapping_add(entry_hash(*key, e));
        }
        if sum != self.entry_sum {
            return Err("incremental digest differs from a recount".into());
        }
        for (slot, key) in self.by_slot.iter().enumerate() {
            let free = self.free.contains(&(slot as u32));
            if key.is_some() == free {
                return Err(format!("slot {slot} is both free and held, or neither"));
            }
        }
        if self.free.iter().any(|s| *s >= self.high_water) {
            return Err("a free slot above the high-water mark".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: a list in recency order, slots lowest-free first.
    #[derive(Default)]
    struct Model {
        order: Vec<(u64, u32, u64)>, // (key, slot, sequence), least recent first
        next_sequence: u64,
    }

    impl Model {
        fn place(&mut self, slots: u32, keys: &[u64]) -> Vec<(u64, u32, Option<u64>)> {
            let mut out = vec![];
            for &k in keys {
                if let Some(i) = self.order.iter().position(|e| e.0 == k) {
                    let e = self.order.remove(i);
                    self.order.push(e);
                    continue;
                }
                let used: Vec<u32> = self.order.iter().map(|e| e.1).collect();
                let (slot, evicted) = match (0..slots).find(|s| !used.contains(s)) {
                    Some(s) => (s, None),
                    None => {
                        let v = self.order.remove(0);
                        (v.1, Some(v.0))
                    }
                };
                self.next_sequence += 1;
                self.order.push((k, slot, self.next_sequence));
                out.push((k, slot, evicted));
            }
            out
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Place(Vec<u64>),
        Lookup(u64),
        Drop(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => proptest::collection::btree_set(0u64..24, 1..5).prop_map(|s| Op::Place(s.into_iter().collect())),
            2 => (0u64..24).prop_map(Op::Lookup),
            1 => (0u64..24).prop_map(Op::Drop),
        ]
    }

    proptest! {
        /// The index against the reference after every op; a recovery from
        /// the placements' log rebuilds the same key -> (slot, sequence).
        #[test]
        fn matches_the_reference(slots in 1u32..8, ops in proptest::collection::vec(op(), 1..60)) {
            let mut index = L3Index::new(u64::from(slots), 2).unwrap();
            let mut model = Model::default();
            let mut log = vec![];
            for op in &ops {
                match op {
                    Op::Place(keys) => {
                        let new = keys.iter().filter(|k| index.peek(**k).is_none()).count();
                        if new > slots as usize {
                            let before = index.digest();
                            prop_assert!(index.place(keys).is_err());
                            prop_assert_eq!(index.digest(), before);
                            continue;
                        }
                        let got = index.place(keys).unwrap();
                        let want = model.place(slots, keys);
                        let got_short: Vec<_> = got.iter().map(|p| (p.key, p.slot, p.evicted)).collect();
                        prop_assert_eq!(got_short, want);
                        for p in &got {
                            prop_assert_eq!(p.writer, writer_rank(p.key, 2));
                            log.push(LogEntry { key: p.key, sequence: p.sequence, slot: p.slot, length: 1 });
                        }
                    }
                    Op::Lookup(k) => {
                        let got = index.lookup(*k);
                        let want = model.order.iter().position(|e| e.0 == *k).map(|i| {
                            let e = model.order.remove(i);
                            model.order.push(e);
                            (e.1, e.2)
                        });
                        prop_assert_eq!(got, want);
                    }
                    Op::Drop(k) => {
                        let had = model.order.iter().position(|e| e.0 == *k).map(|i| model.order.remove(i));
                        let tombstone = index.drop_key(*k);
                        prop_assert_eq!(tombstone.is_some(), had.is_some());
                        if let Some(t) = tombstone {
                            model.next_sequence += 1;
                            log.push(t);
                        }
                    }
                }
                index.check_invariants().map_err(TestCaseError::fail)?;
            }
            let mut shuffled = log.clone();
            shuffled.reverse();
            let (recovered, report) = L3Index::recover(u64::from(slots), 2, shuffled).unwrap();
            recovered.check_invariants().map_err(TestCaseError::fail)?;
            let mut want: Vec<_> = model.order.iter().map(|e| (e.0, e.1, e.2)).collect();
            want.sort_unstable_by_key(|e| e.2);
            prop_assert_eq!(recovered.entries(), want);
            prop_assert_eq!(report.kept as usize, recovered.len());
            prop_assert!(recovered.next_sequence() > log.iter().map(|e| e.sequence).max().unwrap_or(0));
        }

        /// Two replicas of the same calls agree; one extra lookup shows in the digest.
        #[test]
        fn replicas_agree_and_one_extra_use_differs(keys in proptest::collection::vec(0u64..50, 2..40)) {
            let mut a = L3Index::new(8, 4).unwrap();
            let mut b = L3Index::new(8, 4).unwrap();
            for chunk in keys.chunks(3) {
                let mut uniq = chunk.to_vec();
                uniq.sort_unstable();
                uniq.dedup();
                prop_assert_eq!(a.place(&uniq).unwrap(), b.place(&uniq).unwrap());
            }
            prop_assert_eq!(a.digest(), b.digest());
            let present = a.entries()[0].0;
            a.lookup(present);
            prop_assert_ne!(a.digest(), b.digest());
        }
    }

    #[test]
    fn refusals_name_the_value_and_change_nothing() {
        let mut index = L3Index::new(2, 1).unwrap();
        index.place(&[1]).unwrap();
        let before = index.digest();
        assert_eq!(index.place(&[5, 5]), Err(L3Error::RepeatedKey { key: 5 }));
        assert_eq!(
            index.place(&[5, 6, 7]),
            Err(L3Error::BatchTooLarge { pages: 3, slots: 2 })
        );
        assert_eq!(index.digest(), before);
        assert!(L3Index::new(0, 1).is_err());
        assert!(L3Index::new(1, 0).is_err());
    }

    #[test]
    fn writers_spread_over_the_node() {
        let mut counts = [0u32; 4];
        for key in 0..4000u64 {
            counts[writer_rank(key, 4) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (900..1100).contains(c)), "{counts:?}");
    }
}
