//! ghost's recency candidate as a lean miniature cache: the membership and
//! order the candidate needs, and nothing of the replicated tree node a real
//! cache needs (issue 47's "cheaper candidates"; `Shadows` runs it in place of
//! a recency replica).
//!
//! A compressed trie of page words in a slab of small entries (parent, child
//! count, last access, the run's words), one root per namespace; children
//! found through one table keyed by (parent, first word) instead of a table
//! per node; leaves ordered by a min-heap of (last access, entry) whose stale
//! pairs are skipped when popped (checked against the entry's own stamp) and
//! dropped when they outnumber the live leaves. A request is replayed as the
//! recency replica replays it (`PrefixTree::replay`: match and stamp the path,
//! evict just enough with the path locked, a victim holding at least twice
//! what is still needed losing only its tail, insert what fits) and hits the
//! same pages: leaves never share a stamp (one request stamps one path with
//! one time), so the replica's tie-break by node id never decides.
//!
//! Replicated state like the tree's: the digest is a wrapping sum of one
//! term per entry (its slot, parent, words and stamp) and one per free slot
//! at its place in the free stack (which decides the slots entries get),
//! updated as they change; the snapshot carries the entries and the free
//! stack, and the children table and the heap are rebuilt from them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use crate::ids::Token;
use crate::namespace::Namespace;
use cpkv_hash::{fold_words, mix64, Hasher64, WordHashing};
use cpkv_wire::{Reader, Writer};

/// `Entry::parent` of a namespace root.
const NO_PARENT: u32 = u32::MAX;

const TAG_ENTRY: u64 = 0x1ea0_0001;
const TAG_ROOT: u64 = 0x1ea0_0002;
const TAG_FREE: u64 = 0x1ea0_0003;
const TAG_DIGEST: u64 = 0x1ea0_0004;

/// Snapshot tags of a slot.
const SLOT_FREE: u8 = 0;
const SLOT_ROOT: u8 = 1;
const SLOT_ENTRY: u8 = 2;

#[derive(Debug, Clone)]
struct Entry {
    /// `NO_PARENT` for a namespace root.
    parent: u32,
    children: u32,
    stamp: u64,
    /// The run's page words (empty for a root and a free slot).
    words: Vec<Token>,
    /// The hash of the slot, parent and words (or the root's namespace):
    /// what the digest term adds the stamp to.
    base: u64,
}

impl Entry {
    fn term(&self) -> u64 {
        mix64(self.base ^ self.stamp)
    }
    fn is_root(&self) -> bool {
        self.parent == NO_PARENT
    }
}

#[derive(Debug, Clone)]
pub struct LeanRecency {
    entries: Vec<Entry>,
    /// Free slots, the next one handed out last.
    free: Vec<u32>,
    roots: BTreeMap<Namespace, u32>,
    /// Each root's namespace, to drop a root whose last child leaves.
    root_names: BTreeMap<u32, Namespace>,
    children: HashMap<(u32, Token), u32, WordHashing>,
    /// Leaves by (last access, entry), with stale pairs skipped lazily.
    leaves: BinaryHeap<Reverse<(u64, u32)>>,
    live_leaves: usize,
    clock: u64,
    pages: usize,
    /// Sum of the live entries' terms.
    entry_sum: u64,
    /// Sum of the free slots' terms (slot at its place in the stack).
    free_sum: u64,
}

impl Default for LeanRecency {
    fn default() -> Self {
        Self::new()
    }
}

impl LeanRecency {
    pub fn new() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            roots: BTreeMap::new(),
            root_names: BTreeMap::new(),
            children: HashMap::default(),
            leaves: BinaryHeap::new(),
            live_leaves: 0,
            clock: 0,
            pages: 0,
            entry_sum: 0,
            free_sum: 0,
        }
    }

    /// Pages held.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Entries held, roots included.
    pub fn entries(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    pub fn digest(&self) -> u64 {
        Hasher64::new(TAG_DIGEST)
            .word(self.clock)
            .word(self.pages as u64)
            .word(self.entries.len() as u64)
            .word(self.free.len() as u64)
            .word(self.entry_sum)
            .word(self.free_sum)
            .finish()
    }

    /// Replays one request of page words in `namespace` at a capacity of
    /// `cap` pages; returns the pages it hit and the pages it stored.
    pub fn replay(&mut self, pages: &[Token], namespace: &Namespace, cap: usize) -> (usize, usize) {
        self.clock += 1;
        let now = self.clock;
        let root = self.root(namespace);
        let (end, matched) = self.match_path(root, pages);
        self.stamp_path(end, now);
        let new = pages.len() - matched;
        let room = cap.saturating_sub(self.pages);
        if new > room {
            self.evict(new - room, end);
        }
        let keep = matched + new.min(cap.saturating_sub(self.pages));
        if keep > matched {
            let leaf = self.alloc(end, now, pages[matched..keep].to_vec());
            self.enter(leaf);
            self.children.insert((end, pages[matched]), leaf);
            let parent = &mut self.entries[end as usize];
            parent.children += 1;
            if parent.children == 1 && !parent.is_root() {
                self.live_leaves -= 1;
            }
            self.live_leaves += 1;
            self.pages += keep - matched;
            self.push_leaf(now, leaf);
        }
        if self.entries[root as usize].children == 0 {
            self.drop_root(root);
        }
        (matched, keep - matched)
    }

    /// `namespace`'s root, made when it has none.
    fn root(&mut self, namespace: &Namespace) -> u32 {
        if let Some(&root) = self.roots.get(namespace) {
            return root;
        }
        let root = self.alloc(NO_PARENT, 0, Vec::new());
        self.roots.insert(namespace.clone(), root);
        self.root_names.insert(root, namespace.clone());
        self.enter(root);
        root
    }

    fn drop_root(&mut self, root: u32) {
        let namespace = self.root_names.remove(&root).expect("a root");
        self.roots.remove(&namespace);
        self.release(root);
    }

    /// The entry the longest held prefix of `pages` ends at (split there
    /// when it ends inside one) and how many pages that is.
    fn match_path(&mut self, root: u32, pages: &[Token]) -> (u32, usize) {
        let (mut at, mut i) = (root, 0);
        while i < pages.len() {
            let Some(&child) = self.children.get(&(at, pages[i])) else {
                break;
            };
            let words = &self.entries[child as usize].words;
            let k = words
                .iter()
                .zip(&pages[i..])
                .take_while(|(a, b)| a == b)
                .count();
            i += k;
            if k < words.len() {
                return (self.split(child, k), i);
            }
            at = child;
        }
        (at, i)
    }

    /// Splits `id` after its first `k` words; the new upper entry takes
    /// its place under the parent and is returned (the lower keeps `id`,
    /// its stamp and its place among the leaves).
    fn split(&mut self, id: u32, k: usize) -> u32 {
        let entry = &mut self.entries[id as usize];
        let (parent, stamp) = (entry.parent, entry.stamp);
        let tail = entry.words.split_off(k);
        let head = std::mem::replace(&mut entry.words, tail);
        let lower_first = entry.words[0];
        let first = head[0];
        let upper = self.alloc(parent, stamp, head);
        self.entries[upper as usize].children = 1;
        self.enter(upper);
        self.entries[id as usize].parent = upper;
        self.rebase(id);
        self.children.insert((parent, first), upper);
        self.children.insert((upper, lower_first), id);
        upper
    }

    /// Stamps `end` and its ancestors with `now`; a stamped leaf is
    /// queued again at its new time.
    fn stamp_path(&mut self, end: u32, now: u64) {
        let mut at = end;
        while !self.entries[at as usize].is_root() {
            let entry = &mut self.entries[at as usize];
            self.entry_sum = self.entry_sum.wrapping_sub(entry.term());
            entry.stamp = now;
            self.entry_sum = self.entry_sum.wrapping_add(entry.term());
            at = entry.parent;
        }
        let entry = &self.entries[end as usize];
        if !entry.is_root() && entry.children == 0 {
            self.push_leaf(now, end);
        }
    }

    /// Frees `need` pages from the least recently used leaves other than
    /// `locked` (the request's path ends there, so no other leaf is on it).
    fn evict(&mut self, mut need: usize, locked: u32) {
        let mut held_back = None;
        while need > 0 {
            let Some(Reverse((stamp, id))) = self.leaves.pop() else {
                break;
            };
            let entry = &self.entries[id as usize];
            if entry.stamp != stamp || entry.children != 0 || entry.words.is_empty() {
                continue; // stale: re-stamped, grown a child or freed
            }
            if id == locked {
                held_back = Some((stamp, id));
                continue;
            }
            let held = entry.words.len();
            if need <= held / 2 {
                self.entries[id as usize].words.truncate(held - need);
                self.rebase(id);
                self.pages -= need;
                self.leaves.push(Reverse((stamp, id)));
                break;
            }
            need = need.saturating_sub(held);
            self.remove_leaf(id, locked);
        }
        if let Some((stamp, id)) = held_back {
            self.leaves.push(Reverse((stamp, id)));
        }
    }

    /// Removes leaf `id`; its parent becomes a leaf when it was the last
    /// child, or leaves with it when it is a root (not `locked`'s).
    fn remove_leaf(&mut self, id: u32, locked: u32) {
        let entry = &self.entries[id as usize];
        let (parent, first, len) = (entry.parent, entry.words[0], entry.words.len());
        self.pages -= len;
        self.children.remove(&(parent, first));
        self.release(id);
        self.live_leaves -= 1;
        let p = &mut self.entries[parent as usize];
        p.children -= 1;
        if p.children == 0 {
            if !p.is_root() {
                let stamp = p.stamp;
                self.live_leaves += 1;
                self.push_leaf(stamp, parent);
            } else if parent != locked {
                self.drop_root(parent);
            }
        }
    }

    /// A slot for a new entry, the free stack's top first (its term joins
    /// the sum in `enter`, once a root's namespace is known).
    fn alloc(&mut self, parent: u32, stamp: u64, words: Vec<Token>) -> u32 {
        let entry = Entry {
            parent,
            children: 0,
            stamp,
            words,
            base: 0,
        };
        match self.free.pop() {
            Some(id) => {
                self.free_sum = self.free_sum.wrapping_sub(free_term(self.free.len(), id));
                self.entries[id as usize] = entry;
                id
            }
            None => {
                self.entries.push(entry);
                u32::try_from(self.entries.len() - 1)
                    .ok()
                    .filter(|&id| id != NO_PARENT)
                    .expect("under 2^32 - 1 entries")
            }
        }
    }

    /// Frees slot `id` (its term out of the sum, the slot onto the stack).
    fn release(&mut self, id: u32) {
        let entry = &mut self.entries[id as usize];
        self.entry_sum = self.entry_sum.wrapping_sub(entry.term());
        entry.words = Vec::new();
        entry.children = 0;
        self.free_sum = self.free_sum.wrapping_add(free_term(self.free.len(), id));
        self.free.push(id);
    }

    /// Puts new entry `id`'s term into the sum.
    fn enter(&mut self, id: u32) {
        let base = self.base_of(id);
        let entry = &mut self.entries[id as usize];
        entry.base = base;
        self.entry_sum = self.entry_sum.wrapping_add(entry.term());
    }

    /// Recomputes `id`'s term after its parent or words changed.
    fn rebase(&mut self, id: u32) {
        let base = self.base_of(id);
        let entry = &mut self.entries[id as usize];
        self.entry_sum = self.entry_sum.wrapping_sub(entry.term());
        entry.base = base;
        self.entry_sum = self.entry_sum.wrapping_add(entry.term());
    }

    fn base_of(&self, id: u32) -> u64 {
        let entry = &self.entries[id as usize];
        if !entry.is_root() {
            return entry_base(id, entry);
        }
        root_base(id, &self.root_names[&id])
    }

    /// Queues leaf `id` at `stamp`; stale pairs are dropped once they
    /// outnumber the live leaves, so the heap stays bounded by the trie.
    fn push_leaf(&mut self, stamp: u64, id: u32) {
        self.leaves.push(Reverse((stamp, id)));
        if self.leaves.len() > 2 * self.live_leaves + 64 {
            let entries = &self.entries;
            self.leaves.retain(|Reverse((s, i))| {
                let e = &entries[*i as usize];
                !e.words.is_empty() && e.children == 0 && e.stamp == *s
            });
            // A leaf re-queued while still queued keeps one pair.
            let mut seen: Vec<(u64, u32)> = self.leaves.drain().map(|Reverse(p)| p).collect();
            seen.sort_unstable();
            seen.dedup();
            self.leaves.extend(seen.into_iter().map(Reverse));
        }
    }

    /// Every slot (free, a root with its namespace, or an entry), then
    /// the free stack: what the children table, the leaf heap and the
    /// digest are rebuilt from.
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u64(self.clock);
        w.u64(self.entries.len() as u64);
        let free: BTreeSet<u32> = self.free.iter().copied().collect();
        for (id, entry) in self.entries.iter().enumerate() {
            let id = id as u32;
            if free.contains(&id) {
                w.u8(SLOT_FREE);
            } else if let Some(namespace) = self.root_names.get(&id) {
                w.u8(SLOT_ROOT);
                crate::namespace::encode_namespace(w, namespace);
            } else {
                w.u8(SLOT_ENTRY);
                w.u32(entry.parent);
                w.u64(entry.stamp);
                w.u64s(&entry.words);
            }
        }
        w.u64(self.free.len() as u64);
        self.free.iter().for_each(|&id| w.u32(id));
    }

    /// The inverse of `encode`, refusing what no replay could have built
    /// (an orphan, a cycle, two children on one word, a child newer than
    /// its parent or the clock, a root without children, a free stack that
    /// is not exactly the free slots).
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        let clock = r.u64()?;
        let slots = r.len(1)?;
        if slots >= NO_PARENT as usize {
            return Err(format!("{slots} slots"));
        }
        let mut lean = Self::new();
        lean.clock = clock;
        let mut free_slots = BTreeSet::new();
        for id in 0..slots as u32 {
            let mut entry = Entry {
                parent: NO_PARENT,
                children: 0,
                stamp: 0,
                words: Vec::new(),
                base: 0,
            };
            match r.u8()? {
                SLOT_FREE => {
                    free_slots.insert(id);
                }
                SLOT_ROOT => {
                    let namespace = crate::namespace::decode_namespace(r)?;
                    if lean.roots.insert(namespace.clone(), id).is_some() {
                        return Err(format!("namespace {namespace} has two roots"));
                    }
                    entry.base = root_base(id, &namespace);
                    lean.root_names.insert(id, namespace);
                }
                SLOT_ENTRY => {
                    entry.parent = r.u32()?;
                    entry.stamp = r.u64()?;
                    entry.words = r.u64s()?;
                    if entry.words.is_empty() || entry.stamp > clock {
                        return Err(format!("entry {id}: no words, or newer than the clock"));
                    }
                    entry.base = entry_base(id, &entry);
                }
                tag => return Err(format!("bad slot tag {tag}")),
            }
            lean.entries.push(entry);
        }
        let stacked = r.len(4)?;
        let mut seen = BTreeSet::new();
        for _ in 0..stacked {
            let id = r.u32()?;
            if !free_slots.contains(&id) || !seen.insert(id) {
                return Err(format!("free stack names slot {id}"));
            }
            lean.free_sum = lean.free_sum.wrapping_add(free_term(lean.free.len(), id));
            lean.free.push(id);
        }
        if stacked != free_slots.len() {
            return Err("free slots missing from the free stack".into());
        }
        for id in 0..slots as u32 {
            let entry = &lean.entries[id as usize];
            if free_slots.contains(&id) || entry.is_root() {
                continue;
            }
            let parent = entry.parent;
            let live = |p: u32| (p as usize) < slots && !free_slots.contains(&p);
            if !live(parent) || parent == id {
                return Err(format!("entry {id}: parent {parent} is not an entry"));
            }
            let up = &lean.entries[parent as usize];
            if !up.is_root() && up.stamp < entry.stamp {
                return Err(format!("entry {id} is newer than its parent"));
            }
            if lean.children.insert((parent, entry.words[0]), id).is_some() {
                return Err(format!("entry {id} shares its first word with a sibling"));
            }
            lean.pages += entry.words.len();
            lean.entries[parent as usize].children += 1;
        }
        // Every entry reaches a root; each walk stops at an entry already
        // known to, so the whole check is linear (a chain is a valid trie).
        let mut reaches = vec![false; slots];
        for id in 0..slots {
            let (mut at, mut path) = (id, Vec::new());
            while !reaches[at] && !free_slots.contains(&(at as u32)) {
                if lean.entries[at].is_root() {
                    break;
                }
                if path.len() > slots {
                    return Err(format!("entry {id} is on a cycle"));
                }
                path.push(at);
                at = lean.entries[at].parent as usize;
            }
            path.into_iter().for_each(|p| reaches[p] = true);
            reaches[at] = true;
        }
        for (id, entry) in lean.entries.iter().enumerate() {
            if free_slots.contains(&(id as u32)) {
                continue;
            }
            if entry.is_root() && entry.children == 0 {
                return Err(format!("root {id} has no children"));
            }
            lean.entry_sum = lean.entry_sum.wrapping_add(entry.term());
            if !entry.is_root() && entry.children == 0 {
                lean.live_leaves += 1;
                lean.leaves.push(Reverse((entry.stamp, id as u32)));
            }
        }
        lean.check()?;
        Ok(lean)
    }

    /// Checks the trie from scratch: child counts, the children table, the
    /// roots, the pages held, that every leaf is queued at its stamp, that
    /// a parent is never older than its child, and the digest's sums.
    pub fn check(&self) -> Result<(), String> {
        let free: BTreeSet<u32> = self.free.iter().copied().collect();
        let queued: BTreeSet<(u64, u32)> = self.leaves.iter().map(|r| r.0).collect();
        if free.len() != self.free.len() {
            return Err("a slot is on the free stack twice".into());
        }
        let live = |i: u32| (i as usize) < self.entries.len() && !free.contains(&i);
        let mut counts = vec![0u32; self.entries.len()];
        let (mut pages, mut leaves, mut entry_sum) = (0, 0, 0u64);
        for (i, e) in self.entries.iter().enumerate() {
            let i = i as u32;
            if !live(i) {
                continue;
            }
            entry_sum = entry_sum.wrapping_add(e.term());
            if e.is_root() {
                let named = self.root_names.get(&i);
                if named.and_then(|n| self.roots.get(n)) != Some(&i) || !e.words.is_empty() {
                    return Err(format!("root {i} is not its namespace's"));
                }
                continue;
            }
            if e.words.is_empty() || !live(e.parent) {
                return Err(format!("entry {i}: empty or orphaned"));
            }
            counts[e.parent as usize] += 1;
            pages += e.words.len();
            if self.children.get(&(e.parent, e.words[0])) != Some(&i) {
                return Err(format!("entry {i} missing from the children table"));
            }
            let parent = &self.entries[e.parent as usize];
            if !parent.is_root() && parent.stamp < e.stamp {
                return Err(format!("entry {i} is newer than its parent"));
            }
        }
        for (i, e) in self.entries.iter().enumerate() {
            if !live(i as u32) {
                continue;
            }
            if e.children != counts[i] || (e.is_root() && e.children == 0) {
                return Err(format!("entry {i} counts {} children", e.children));
            }
            if !e.is_root() && e.children == 0 {
                leaves += 1;
                if !queued.contains(&(e.stamp, i as u32)) {
                    return Err(format!("leaf {i} is not queued at its stamp"));
                }
            }
        }
        if self.roots.len() != self.root_names.len() {
            return Err("roots and their namespaces differ".into());
        }
        if self.children.len() != self.entries() - self.roots.len() {
            return Err("children table size".into());
        }
        if pages != self.pages || leaves != self.live_leaves {
            return Err(format!(
                "pages {pages} / {} or leaves {leaves} / {}",
                self.pages, self.live_leaves
            ));
        }
        let free_sum = self
            .free
            .iter()
            .enumerate()
            .fold(0u64, |s, (at, &id)| s.wrapping_add(free_term(at, id)));
        if entry_sum != self.entry_sum || free_sum != self.free_sum {
            return Err("digest sums differ from the entries".into());
        }
        Ok(())
    }
}

fn entry_base(id: u32, entry: &Entry) -> u64 {
    Hasher64::new(TAG_ENTRY)
        .word(u64::from(id))
        .word(u64::from(entry.parent))
        .word(fold_words(&entry.words))
        .finish()
}

fn root_base(id: u32, namespace: &Namespace) -> u64 {
    let h = Hasher64::new(TAG_ROOT).word(u64::from(id));
    match namespace {
        Namespace::Default => h.word(0),
        Namespace::Id(n) => h.word(1).word(*n),
        Namespace::Name(name) => h.word(2).bytes(name.as_bytes()),
    }
    .finish()
}

/// The term of free slot `id` at place `at` of the free stack.
fn free_term(at: usize, id: u32) -> u64 {
    Hasher64::new(TAG_FREE)
        .word(at as u64)
        .word(u64::from(id))
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shadow::recency_replica;
    use proptest::prelude::*;

    /// One call into the candidate: a request of page words in a namespace
    /// at a capacity (capacities change as the real cache's high-water
    /// mark grows).
    #[derive(Debug, Clone)]
    enum Op {
        Request(Vec<Token>, u64),
        Grow(usize),
    }

    fn namespace(n: u64) -> Namespace {
        match n {
            0 => Namespace::Default,
            1 => Namespace::Id(7),
            _ => Namespace::Name("lora".into()),
        }
    }

    /// Requests sharing roots and middles at several depths in three
    /// namespaces, so matches end inside entries (splits), leaves are
    /// trimmed and removed, and roots come and go.
    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let request = (0u64..8, 0u64..5, 0usize..4, 0u64..6, 0usize..9, 0u64..3).prop_map(
            |(root, mid, mid_len, tail, tail_len, ns)| {
                let mut r = vec![root];
                r.extend((0..mid_len as u64).map(|k| 100 + mid * 10 + k));
                r.extend((0..tail_len as u64).map(|k| 1000 + tail * 100 + root * 10 + k));
                Op::Request(r, ns)
            },
        );
        let op = prop_oneof![8 => request, 1 => (0usize..6).prop_map(Op::Grow)];
        prop::collection::vec(op, 1..300)
    }

    fn round_trip(lean: &LeanRecency) -> LeanRecency {
        let mut w = Writer::default();
        lean.encode(&mut w);
        let mut r = Reader::new(w.bytes());
        let back = LeanRecency::decode(&mut r).expect("its own encoding");
        assert!(r.is_empty());
        back
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The model is the recency replica: after every request both hit
        /// the same pages and hold the same number; the lean trie's own
        /// invariants hold, and a copy restored from its snapshot halfway
        /// has its digest and goes on exactly as it does.
        #[test]
        fn lean_recency_hits_what_the_replica_hits(ops in ops(), start in 1usize..24) {
            let mut replica = recency_replica();
            let mut lean = LeanRecency::new();
            let mut restored: Option<LeanRecency> = None;
            let (mut cap, mut next_page) = (start, 0);
            for (i, op) in ops.iter().enumerate() {
                match op {
                    Op::Grow(by) => cap += by,
                    Op::Request(pages, ns) => {
                        let ns = namespace(*ns);
                        let want = replica.replay(pages, &ns, cap, &mut next_page);
                        prop_assert_eq!(lean.replay(pages, &ns, cap).0, want, "{:?} at {}", pages, cap);
                        if let Some(copy) = restored.as_mut() {
                            prop_assert_eq!(copy.replay(pages, &ns, cap).0, want);
                            prop_assert_eq!(copy.digest(), lean.digest());
                        }
                        prop_assert_eq!(lean.pages(), replica.device_pages());
                        prop_assert!(lean.pages() <= cap);
                        lean.check().map_err(TestCaseError::fail)?;
                    }
                }
                if i == ops.len() / 2 {
                    let copy = round_trip(&lean);
                    prop_assert_eq!(copy.digest(), lean.digest());
                    restored = Some(copy);
                }
            }
        }

        /// A snapshot with any byte changed decodes to an error or to a
        /// trie whose invariants hold: never a panic.
        #[test]
        fn a_damaged_snapshot_is_refused_or_sound(ops in ops(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let mut lean = LeanRecency::new();
            for op in &ops {
                if let Op::Request(pages, ns) = op {
                    lean.replay(pages, &namespace(*ns), 12);
                }
            }
            let mut w = Writer::default();
            lean.encode(&mut w);
            let mut bytes = w.into_bytes();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            if let Ok(back) = LeanRecency::decode(&mut Reader::new(&bytes)) {
                back.check().map_err(TestCaseError::fail)?;
            }
        }
    }

    /// Two candidates fed the same requests agree; one request different
    /// (its namespace, its last word, or its capacity) changes the digest.
    #[test]
    fn one_divergent_request_changes_the_digest() {
        let feed = |last: Op| {
            let mut lean = LeanRecency::new();
            for i in 0..200u64 {
                lean.replay(&[i % 9, 100 + i % 4, 1000 + i], &Namespace::Default, 40);
            }
            match last {
                Op::Request(pages, ns) => lean.replay(&pages, &namespace(ns), 40),
                Op::Grow(cap) => lean.replay(&[3, 101, 7], &Namespace::Default, cap),
            };
            lean.digest()
        };
        let same = feed(Op::Request(vec![3, 101, 7], 0));
        assert_eq!(same, feed(Op::Request(vec![3, 101, 7], 0)));
        assert_ne!(same, feed(Op::Request(vec![3, 101, 7], 1)));
        assert_ne!(same, feed(Op::Request(vec![3, 101, 8], 0)));
        assert_ne!(same, feed(Op::Grow(20)));
    }

    /// Two entries that name each other as parent are refused: a trie
    /// restored with a cycle would stamp its path forever.
    #[test]
    fn a_cycle_is_refused() {
        let mut w = Writer::default();
        w.u64(5); // clock
        w.u64(4); // slots
        w.u8(SLOT_ROOT);
        crate::namespace::encode_namespace(&mut w, &Namespace::Default);
        for (parent, word) in [(2u32, 7u64), (1, 8), (0, 9)] {
            w.u8(SLOT_ENTRY);
            w.u32(parent);
            w.u64(1);
            w.u64s(&[word]);
        }
        w.u64(0); // free stack
        let err = LeanRecency::decode(&mut Reader::new(w.bytes())).unwrap_err();
        assert!(err.contains("cycle"), "{err}");
    }

    /// The heap drops stale pairs and an emptied namespace drops its root:
    /// memory follows what is held, not the requests made.
    #[test]
    fn stale_pairs_and_idle_roots_do_not_accumulate() {
        let mut lean = LeanRecency::new();
        for i in 0..10_000u64 {
            lean.replay(&[i % 10, 1, 2], &Namespace::Default, 1000);
        }
        assert_eq!(lean.entries(), 11);
        assert!(lean.leaves.len() <= 2 * 10 + 64, "{}", lean.leaves.len());
        for i in 0..1000u64 {
            lean.replay(&[5, i], &Namespace::Id(i), 4);
        }
        assert!(lean.roots.len() <= 2, "{}", lean.roots.len());
        assert!(lean.entries() <= 8, "{}", lean.entries());
        lean.check().unwrap();
    }
}
