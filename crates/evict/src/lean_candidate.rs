//! ghost's recency and segmented candidates as lean miniature caches: the
//! membership and order a candidate needs, and nothing of the replicated tree
//! node a real cache needs (issue 47's "cheaper candidates"; `Shadows` runs
//! them in place of replicas).
//!
//! A compressed trie of page words in a slab of small entries (parent, child
//! count, rank, lifetime id, the run's words), one root per namespace;
//! children found through one table keyed by (parent, first word) instead of
//! a table per node; leaves ordered by a min-heap of (rank, entry) whose stale
//! pairs are skipped when popped (checked against the entry's own rank) and
//! dropped when they outnumber the live leaves. A request is replayed as the
//! replica replays it (`PrefixTree::replay`: match and stamp the path, evict
//! just enough with the path locked, a victim holding at least twice what is
//! still needed losing only its tail, insert what fits) and hits the same
//! pages: leaves never share a stamp (one request stamps one path with one
//! time), so the replica's tie-break by node id never decides.
//!
//! The rank is the last access, and for the segmented candidate a bit above
//! it once the entry is reused (the replica's `hits >= 2`: a matched node,
//! the upper part of a split it copied its count to, or content the history
//! gives back). The segmented candidate keeps the replica's history of
//! dropped content (`GhostHistory`), keyed as the replica keys it by the
//! parent's id and the first word. Its ids are lifetime ids, not slots: one
//! per entry, never reused, the upper part of a split taking a new one and
//! the lower keeping its own, as the replica's node ids do; and roots live as
//! the replica's do (kept while idle, up to `IDLE_ROOTS_KEPT`, the longest
//! idle dropped first when a new one is made), since a root's id is the
//! parent of every first-level entry.
//!
//! Replicated state like the tree's: the digest is a wrapping sum of one
//! term per entry (its slot, parent, lifetime id, words and rank), one per
//! free slot at its place in the free stack (which decides the slots entries
//! get) and one per idle root, updated as they change, and the history's own;
//! the snapshot carries the entries, the free stack and the history, and the
//! children table, the heap and the idle order are rebuilt from them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use crate::ghost_history::{content_key, GhostHistory};
use crate::ids::{NodeId, Token};
use crate::namespace::{Namespace, IDLE_ROOTS_KEPT};
use crate::ranking::Ranking;
use cpkv_hash::{fold_words, mix64, Hasher64, WordHashing};
use cpkv_wire::{Reader, Writer};

/// `Entry::parent` of a namespace root.
const NO_PARENT: u32 = u32::MAX;

/// The rank's bit for a reused entry: above every stamp, so a segmented
/// candidate evicts one-shot entries before reused ones, each by recency.
const REUSED: u64 = 1 << 63;

const TAG_ENTRY: u64 = 0x1ea0_0001;
const TAG_ROOT: u64 = 0x1ea0_0002;
const TAG_FREE: u64 = 0x1ea0_0003;
const TAG_DIGEST: u64 = 0x1ea0_0004;
const TAG_IDLE: u64 = 0x1ea0_0005;

/// Snapshot tags of a slot.
const SLOT_FREE: u8 = 0;
const SLOT_ROOT: u8 = 1;
const SLOT_ENTRY: u8 = 2;

#[derive(Debug, Clone)]
struct Entry {
    /// `NO_PARENT` for a namespace root.
    parent: u32,
    children: u32,
    /// An entry's last access, `REUSED` set once reused; a root's idle
    /// since (meaningful while it is idle).
    rank: u64,
    /// The entry's lifetime id (never reused): what the history names a
    /// parent by.
    life: u64,
    /// The run's page words (empty for a root and a free slot).
    words: Vec<Token>,
    /// The hash of the slot, parent, lifetime id and words (or the root's
    /// namespace): what the digest term adds the rank to.
    base: u64,
}

impl Entry {
    fn term(&self) -> u64 {
        mix64(self.base ^ self.rank)
    }
    fn is_root(&self) -> bool {
        self.parent == NO_PARENT
    }
    fn stamp(&self) -> u64 {
        self.rank & !REUSED
    }
    /// What the history remembers of the replica node's hit count: 2 for
    /// a reused entry, 1 for a one-shot one (only `hits >= 2` ranks).
    fn hits(&self) -> u64 {
        1 + u64::from(self.rank & REUSED != 0)
    }
}

#[derive(Debug, Clone)]
pub struct LeanCandidate {
    entries: Vec<Entry>,
    /// Free slots, the next one handed out last.
    free: Vec<u32>,
    roots: BTreeMap<Namespace, u32>,
    /// Each root's namespace, to drop a root that is reaped.
    root_names: BTreeMap<u32, Namespace>,
    /// Childless roots by (idle since, lifetime id, slot), the longest
    /// idle first. Since is the request that left the root childless: its
    /// eviction (the replica's evict tick) or the request's own, storing
    /// nothing (its unlock tick); one request is never both, as an eviction
    /// that frees a page leaves room to store one.
    idle: BTreeSet<(u64, u64, u32)>,
    children: HashMap<(u32, Token), u32, WordHashing>,
    /// Leaves by (rank, entry), with stale pairs skipped lazily.
    leaves: BinaryHeap<Reverse<(u64, u32)>>,
    live_leaves: usize,
    clock: u64,
    pages: usize,
    next_life: u64,
    /// The segmented candidate's history of dropped content; `None` for
    /// recency.
    history: Option<GhostHistory>,
    /// Sum of the live entries' terms.
    entry_sum: u64,
    /// Sum of the free slots' terms (slot at its place in the stack).
    free_sum: u64,
    /// Sum of the idle roots' terms.
    idle_sum: u64,
}

impl LeanCandidate {
    /// The lean cache of `ranking`, when it has one (recency, segmented).
    pub fn new(ranking: Ranking) -> Option<Self> {
        let history = match ranking {
            Ranking::Recency => None,
            Ranking::Segmented => Some(GhostHistory::default()),
            _ => return None,
        };
        Some(Self {
            entries: Vec::new(),
            free: Vec::new(),
            roots: BTreeMap::new(),
            root_names: BTreeMap::new(),
            idle: BTreeSet::new(),
            children: HashMap::default(),
            leaves: BinaryHeap::new(),
            live_leaves: 0,
            clock: 0,
            pages: 0,
            next_life: 0,
            history,
            entry_sum: 0,
            free_sum: 0,
            idle_sum: 0,
        })
    }

    #[cfg(test)]
    fn ranking(&self) -> Ranking {
        match self.history {
            None => Ranking::Recency,
            Some(_) => Ranking::Segmented,
        }
    }

    /// Pages held.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Pages the history remembers.
    pub fn remembered_pages(&self) -> usize {
        self.history.as_ref().map_or(0, GhostHistory::pages)
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
            .word(self.next_life)
            .word(self.entry_sum)
            .word(self.free_sum)
            .word(self.idle_sum)
            .word(self.history.as_ref().map_or(0, GhostHistory::digest))
            .finish()
    }

    /// Replays one request of page words in `namespace` at a capacity of
    /// `cap` pages; returns the pages it hit and the pages it stored.
    pub fn replay(&mut self, pages: &[Token], namespace: &Namespace, cap: usize) -> (usize, usize) {
        self.clock += 1;
        let now = self.clock;
        let root = self.root(namespace);
        let (end, matched) = self.match_path(root, pages);
        self.touch_path(end, now);
        let new = pages.len() - matched;
        let room = cap.saturating_sub(self.pages);
        if new > room {
            self.evict(new - room, end, root);
        }
        let keep = matched + new.min(cap.saturating_sub(self.pages));
        if keep > matched {
            // Content back from the history is reused on its return.
            let parent_life = NodeId(self.entries[end as usize].life);
            let returned = self.history.as_mut().is_some_and(|h| {
                h.take_back(content_key(parent_life, &pages[matched..=matched]))
                    .is_some()
            });
            let rank = if returned { now | REUSED } else { now };
            let leaf = self.alloc(end, rank, pages[matched..keep].to_vec());
            self.enter(leaf);
            self.children.insert((end, pages[matched]), leaf);
            let parent = &mut self.entries[end as usize];
            parent.children += 1;
            if parent.children == 1 && !parent.is_root() {
                self.live_leaves -= 1;
            }
            self.live_leaves += 1;
            self.pages += keep - matched;
            self.push_leaf(rank, leaf);
        }
        if self.entries[root as usize].children == 0 {
            self.set_idle(root, Some(now));
        }
        (matched, keep - matched)
    }

    /// `namespace`'s root, taken out of the idle ones for the request; a
    /// new one is made when it has none, first dropping the longest idle
    /// roots beyond `IDLE_ROOTS_KEPT` (the new one counted among them, as
    /// the replica counts it).
    fn root(&mut self, namespace: &Namespace) -> u32 {
        if let Some(&root) = self.roots.get(namespace) {
            self.set_idle(root, None);
            return root;
        }
        while self.idle.len() >= IDLE_ROOTS_KEPT {
            let (_, _, oldest) = *self.idle.first().expect("idle roots");
            self.drop_root(oldest);
        }
        let root = self.alloc(NO_PARENT, 0, Vec::new());
        self.roots.insert(namespace.clone(), root);
        self.root_names.insert(root, namespace.clone());
        self.enter(root);
        root
    }

    fn drop_root(&mut self, root: u32) {
        self.set_idle(root, None);
        let namespace = self.root_names.remove(&root).expect("a root");
        self.roots.remove(&namespace);
        self.release(root);
    }

    /// Makes `root` idle since `since`, or not idle (its rank 0 then, as
    /// a snapshot restores it).
    fn set_idle(&mut self, root: u32, since: Option<u64>) {
        let entry = &mut self.entries[root as usize];
        let old = (entry.rank, entry.life, root);
        if self.idle.remove(&old) {
            self.idle_sum = self.idle_sum.wrapping_sub(idle_term(old));
        }
        self.entry_sum = self.entry_sum.wrapping_sub(entry.term());
        entry.rank = since.unwrap_or(0);
        self.entry_sum = self.entry_sum.wrapping_add(entry.term());
        if let Some(since) = since {
            let new = (since, entry.life, root);
            self.idle.insert(new);
            self.idle_sum = self.idle_sum.wrapping_add(idle_term(new));
        }
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
    /// its place under the parent, with a new lifetime id and `id`'s rank,
    /// and is returned (the lower keeps `id`, its lifetime id, its rank and
    /// its place among the leaves).
    fn split(&mut self, id: u32, k: usize) -> u32 {
        let entry = &mut self.entries[id as usize];
        let (parent, rank) = (entry.parent, entry.rank);
        let tail = entry.words.split_off(k);
        let head = std::mem::replace(&mut entry.words, tail);
        let lower_first = entry.words[0];
        let first = head[0];
        let upper = self.alloc(parent, rank, head);
        self.entries[upper as usize].children = 1;
        self.enter(upper);
        self.entries[id as usize].parent = upper;
        self.rebase(id);
        self.children.insert((parent, first), upper);
        self.children.insert((upper, lower_first), id);
        upper
    }

    /// Stamps `end` and its ancestors with `now` (and, for the segmented
    /// candidate, marks them reused: each matched node gains a hit); a
    /// stamped leaf is queued again at its new rank.
    fn touch_path(&mut self, end: u32, now: u64) {
        let rank = if self.history.is_some() {
            now | REUSED
        } else {
            now
        };
        let mut at = end;
        while !self.entries[at as usize].is_root() {
            let entry = &mut self.entries[at as usize];
            self.entry_sum = self.entry_sum.wrapping_sub(entry.term());
            entry.rank = rank;
            self.entry_sum = self.entry_sum.wrapping_add(entry.term());
            at = entry.parent;
        }
        let entry = &self.entries[end as usize];
        if !entry.is_root() && entry.children == 0 {
            self.push_leaf(rank, end);
        }
    }

    /// Frees `need` pages from the lowest ranked leaves other than
    /// `locked` (the request's path ends there, so no other leaf is on it);
    /// `request_root` stays out of the idle roots until the request ends.
    fn evict(&mut self, mut need: usize, locked: u32, request_root: u32) {
        let mut held_back = None;
        while need > 0 {
            let Some(Reverse((rank, id))) = self.leaves.pop() else {
                break;
            };
            let entry = &self.entries[id as usize];
            if entry.rank != rank || entry.children != 0 || entry.words.is_empty() {
                continue; // stale: re-stamped, grown a child or freed
            }
            if id == locked {
                held_back = Some((rank, id));
                continue;
            }
            let held = entry.words.len();
            if need <= held / 2 {
                self.trim_tail(id, need);
                self.leaves.push(Reverse((rank, id)));
                break;
            }
            need = need.saturating_sub(held);
            self.remove_leaf(id, request_root);
        }
        if let Some((rank, id)) = held_back {
            self.leaves.push(Reverse((rank, id)));
        }
    }

    /// Drops the last `need` pages of leaf `id`, remembered as the replica
    /// remembers a trimmed tail: under the leaf's own id and the tail's
    /// first word.
    fn trim_tail(&mut self, id: u32, need: usize) {
        let entry = &self.entries[id as usize];
        let keep = entry.words.len() - need;
        if let Some(history) = self.history.as_mut() {
            let key = content_key(NodeId(entry.life), &entry.words[keep..=keep]);
            history.record(key, entry.hits(), need, self.pages);
        }
        self.entries[id as usize].words.truncate(keep);
        self.rebase(id);
        self.pages -= need;
    }

    /// Removes leaf `id` (remembered under its parent's id and its first
    /// word); its parent becomes a leaf when it was the last child, or an
    /// idle root (unless it is `request_root`).
    fn remove_leaf(&mut self, id: u32, request_root: u32) {
        let entry = &self.entries[id as usize];
        let (parent, first, len) = (entry.parent, entry.words[0], entry.words.len());
        if let Some(history) = self.history.as_mut() {
            let key = content_key(NodeId(self.entries[parent as usize].life), &[first]);
            history.record(key, entry.hits(), len, self.pages);
        }
        self.pages -= len;
        self.children.remove(&(parent, first));
        self.release(id);
        self.live_leaves -= 1;
        let p = &mut self.entries[parent as usize];
        p.children -= 1;
        if p.children == 0 {
            if !p.is_root() {
                let rank = p.rank;
                self.live_leaves += 1;
                self.push_leaf(rank, parent);
            } else if parent != request_root {
                self.set_idle(parent, Some(self.clock));
            }
        }
    }

    /// A slot for a new entry with the next lifetime id, the free stack's
    /// top first (its term joins the sum in `enter`, once a root's
    /// namespace is known).
    fn alloc(&mut self, parent: u32, rank: u64, words: Vec<Token>) -> u32 {
        let entry = Entry {
            parent,
            children: 0,
            rank,
            life: self.next_life,
            words,
            base: 0,
        };
        self.next_life += 1;
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
        root_base(id, entry.life, &self.root_names[&id])
    }

    /// Queues leaf `id` at `rank`; stale pairs are dropped once they
    /// outnumber the live leaves, so the heap stays bounded by the trie.
    fn push_leaf(&mut self, rank: u64, id: u32) {
        self.leaves.push(Reverse((rank, id)));
        if self.leaves.len() > 2 * self.live_leaves + 64 {
            let entries = &self.entries;
            self.leaves.retain(|Reverse((r, i))| {
                let e = &entries[*i as usize];
                !e.words.is_empty() && e.children == 0 && e.rank == *r
            });
            // A leaf re-queued while still queued keeps one pair.
            let mut seen: Vec<(u64, u32)> = self.leaves.drain().map(|Reverse(p)| p).collect();
            seen.sort_unstable();
            seen.dedup();
            self.leaves.extend(seen.into_iter().map(Reverse));
        }
    }

    /// The clock and the next lifetime id, every slot (free, a root with
    /// its namespace, lifetime id and whether it is idle since when, or an
    /// entry), the free stack, then the segmented candidate's history: what
    /// the children table, the leaf heap, the idle order and the digest are
    /// rebuilt from.
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u64(self.clock);
        w.u64(self.next_life);
        w.u64(self.entries.len() as u64);
        let free: BTreeSet<u32> = self.free.iter().copied().collect();
        for (id, entry) in self.entries.iter().enumerate() {
            let id = id as u32;
            if free.contains(&id) {
                w.u8(SLOT_FREE);
            } else if let Some(namespace) = self.root_names.get(&id) {
                w.u8(SLOT_ROOT);
                crate::namespace::encode_namespace(w, namespace);
                w.u64(entry.life);
                let idle = self.idle.contains(&(entry.rank, entry.life, id));
                w.u8(u8::from(idle));
                w.u64(if idle { entry.rank } else { 0 });
            } else {
                w.u8(SLOT_ENTRY);
                w.u32(entry.parent);
                w.u64(entry.life);
                w.u64(entry.rank);
                w.u64s(&entry.words);
            }
        }
        w.u64(self.free.len() as u64);
        self.free.iter().for_each(|&id| w.u32(id));
        if let Some(history) = &self.history {
            history.encode(w);
        }
    }

    /// The inverse of `encode` for `ranking`'s candidate, refusing what no
    /// replay could have built (an orphan, a cycle, two children on one
    /// word, a child newer than its parent or the clock, a lifetime id
    /// used twice or not yet handed out, an idle root with children or a
    /// childless one not idle, a reused entry in the recency candidate, a
    /// free stack that is not exactly the free slots).
    pub(crate) fn decode(r: &mut Reader<'_>, ranking: Ranking) -> Result<Self, String> {
        let mut lean = Self::new(ranking).ok_or(format!("{ranking:?} has no lean candidate"))?;
        let clock = r.u64()?;
        lean.clock = clock;
        lean.next_life = r.u64()?;
        let slots = r.len(1)?;
        if slots >= NO_PARENT as usize {
            return Err(format!("{slots} slots"));
        }
        let mut free_slots = BTreeSet::new();
        let mut lives = BTreeSet::new();
        let mut idle_since = BTreeMap::new();
        for id in 0..slots as u32 {
            let mut entry = Entry {
                parent: NO_PARENT,
                children: 0,
                rank: 0,
                life: 0,
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
                    entry.life = r.u64()?;
                    let (idle, since) = (r.u8()?, r.u64()?);
                    match idle {
                        0 if since == 0 => {}
                        1 if since <= clock => {
                            entry.rank = since;
                            idle_since.insert(id, since);
                        }
                        _ => return Err(format!("root {id}: bad idle state {idle}, {since}")),
                    }
                    entry.base = root_base(id, entry.life, &namespace);
                    lean.root_names.insert(id, namespace);
                }
                SLOT_ENTRY => {
                    entry.parent = r.u32()?;
                    entry.life = r.u64()?;
                    entry.rank = r.u64()?;
                    entry.words = r.u64s()?;
                    let reused = entry.rank & REUSED != 0;
                    if entry.words.is_empty()
                        || entry.stamp() > clock
                        || (reused && lean.history.is_none())
                    {
                        return Err(format!(
                            "entry {id}: no words, newer than the clock, or reused under recency"
                        ));
                    }
                    entry.base = entry_base(id, &entry);
                }
                tag => return Err(format!("bad slot tag {tag}")),
            }
            if !free_slots.contains(&id)
                && (entry.life >= lean.next_life || !lives.insert(entry.life))
            {
                return Err(format!(
                    "slot {id}: lifetime id {} used twice or not handed out",
                    entry.life
                ));
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
        if lean.history.is_some() {
            lean.history = Some(GhostHistory::decode(r)?);
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
            if !up.is_root() && up.stamp() < entry.stamp() {
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
            let id = id as u32;
            if free_slots.contains(&id) {
                continue;
            }
            lean.entry_sum = lean.entry_sum.wrapping_add(entry.term());
            if entry.is_root() {
                if (entry.children == 0) != idle_since.contains_key(&id) {
                    return Err(format!("root {id}: idle is not childless"));
                }
                if let Some(&since) = idle_since.get(&id) {
                    let idle = (since, entry.life, id);
                    lean.idle.insert(idle);
                    lean.idle_sum = lean.idle_sum.wrapping_add(idle_term(idle));
                }
            } else if entry.children == 0 {
                lean.live_leaves += 1;
                lean.leaves.push(Reverse((entry.rank, id)));
            }
        }
        lean.check()?;
        Ok(lean)
    }

    /// Checks the trie from scratch: child counts, the children table, the
    /// roots and which are idle, the lifetime ids, the pages held, that
    /// every leaf is queued at its rank, that a parent is never older than
    /// its child, the history, and the digest's sums.
    pub fn check(&self) -> Result<(), String> {
        let free: BTreeSet<u32> = self.free.iter().copied().collect();
        let queued: BTreeSet<(u64, u32)> = self.leaves.iter().map(|r| r.0).collect();
        if free.len() != self.free.len() {
            return Err("a slot is on the free stack twice".into());
        }
        let live = |i: u32| (i as usize) < self.entries.len() && !free.contains(&i);
        let mut counts = vec![0u32; self.entries.len()];
        let (mut pages, mut leaves, mut entry_sum) = (0, 0, 0u64);
        let mut lives = BTreeSet::new();
        for (i, e) in self.entries.iter().enumerate() {
            let i = i as u32;
            if !live(i) {
                continue;
            }
            entry_sum = entry_sum.wrapping_add(e.term());
            if e.life >= self.next_life || !lives.insert(e.life) {
                return Err(format!("entry {i}: lifetime id {} reused", e.life));
            }
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
            if e.rank & REUSED != 0 && self.history.is_none() {
                return Err(format!("entry {i}: reused under recency"));
            }
            counts[e.parent as usize] += 1;
            pages += e.words.len();
            if self.children.get(&(e.parent, e.words[0])) != Some(&i) {
                return Err(format!("entry {i} missing from the children table"));
            }
            let parent = &self.entries[e.parent as usize];
            if !parent.is_root() && parent.stamp() < e.stamp() {
                return Err(format!("entry {i} is newer than its parent"));
            }
        }
        let mut idle_sum = 0u64;
        for (i, e) in self.entries.iter().enumerate() {
            if !live(i as u32) {
                continue;
            }
            if e.children != counts[i] {
                return Err(format!("entry {i} counts {} children", e.children));
            }
            if e.is_root() {
                let idle = (e.rank, e.life, i as u32);
                if (e.children == 0) != self.idle.contains(&idle) {
                    return Err(format!("root {i}: idle is not childless"));
                }
                if e.children == 0 {
                    idle_sum = idle_sum.wrapping_add(idle_term(idle));
                }
            } else if e.children == 0 {
                leaves += 1;
                if !queued.contains(&(e.rank, i as u32)) {
                    return Err(format!("leaf {i} is not queued at its rank"));
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
        if let Some(history) = &self.history {
            if history.digest() != history.digest_from_scratch() {
                return Err("the history's digest differs from its entries".into());
            }
        }
        let free_sum = self
            .free
            .iter()
            .enumerate()
            .fold(0u64, |s, (at, &id)| s.wrapping_add(free_term(at, id)));
        if entry_sum != self.entry_sum || free_sum != self.free_sum || idle_sum != self.idle_sum {
            return Err("digest sums differ from the entries".into());
        }
        Ok(())
    }
}

fn entry_base(id: u32, entry: &Entry) -> u64 {
    Hasher64::new(TAG_ENTRY)
        .word(u64::from(id))
        .word(u64::from(entry.parent))
        .word(entry.life)
        .word(fold_words(&entry.words))
        .finish()
}

fn root_base(id: u32, life: u64, namespace: &Namespace) -> u64 {
    let h = Hasher64::new(TAG_ROOT).word(u64::from(id)).word(life);
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

/// The term of an idle root: (since, lifetime id, slot).
fn idle_term((since, life, id): (u64, u64, u32)) -> u64 {
    Hasher64::new(TAG_IDLE)
        .word(since)
        .word(life)
        .word(u64::from(id))
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shadow::candidate_replica;
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

    const LEAN: [Ranking; 2] = [Ranking::Recency, Ranking::Segmented];

    fn lean(ranking: Ranking) -> LeanCandidate {
        LeanCandidate::new(ranking).expect("a lean ranking")
    }

    fn round_trip(lean: &LeanCandidate) -> LeanCandidate {
        let mut w = Writer::default();
        lean.encode(&mut w);
        let mut r = Reader::new(w.bytes());
        let back = LeanCandidate::decode(&mut r, lean.ranking()).expect("its own encoding");
        assert!(r.is_empty());
        back
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The model is the candidate's replica: after every request both
        /// hit the same pages and hold the same number; the lean trie's own
        /// invariants hold, and a copy restored from its snapshot halfway
        /// has its digest and goes on exactly as it does.
        #[test]
        fn lean_candidates_hit_what_their_replicas_hit(
            ops in ops(), start in 1usize..24, segmented in any::<bool>(),
        ) {
            let ranking = LEAN[usize::from(segmented)];
            let mut replica = candidate_replica(ranking);
            let mut lean = lean(ranking);
            let mut restored: Option<LeanCandidate> = None;
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
                        prop_assert_eq!(lean.remembered_pages(), replica.remembered_pages());
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
        fn a_damaged_snapshot_is_refused_or_sound(
            ops in ops(), at in any::<prop::sample::Index>(), byte in any::<u8>(), segmented in any::<bool>(),
        ) {
            let ranking = LEAN[usize::from(segmented)];
            let mut lean = lean(ranking);
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
            if let Ok(back) = LeanCandidate::decode(&mut Reader::new(&bytes), ranking) {
                back.check().map_err(TestCaseError::fail)?;
            }
        }
    }

    /// Two candidates fed the same requests agree; one request different
    /// (its namespace, its last word, or its capacity) changes the digest.
    #[test]
    fn one_divergent_request_changes_the_digest() {
        for ranking in LEAN {
            one_divergent_request_changes_the_digest_of(ranking);
        }
    }

    fn one_divergent_request_changes_the_digest_of(ranking: Ranking) {
        let feed = |last: Op| {
            let mut lean = lean(ranking);
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
        w.u64(4); // next lifetime id
        w.u64(4); // slots
        w.u8(SLOT_ROOT);
        crate::namespace::encode_namespace(&mut w, &Namespace::Default);
        w.u64(0); // lifetime id
        w.u8(0); // not idle
        w.u64(0);
        for (life, (parent, word)) in [(2u32, 7u64), (1, 8), (0, 9)].into_iter().enumerate() {
            w.u8(SLOT_ENTRY);
            w.u32(parent);
            w.u64(life as u64 + 1);
            w.u64(1);
            w.u64s(&[word]);
        }
        w.u64(0); // free stack
        let err = LeanCandidate::decode(&mut Reader::new(w.bytes()), Ranking::Recency).unwrap_err();
        assert!(err.contains("cycle"), "{err}");
    }

    /// The heap drops stale pairs and idle roots beyond `IDLE_ROOTS_KEPT`
    /// leave: memory follows what is held, not the requests made.
    #[test]
    fn stale_pairs_and_idle_roots_do_not_accumulate() {
        for ranking in LEAN {
            let mut lean = lean(ranking);
            for i in 0..10_000u64 {
                lean.replay(&[i % 10, 1, 2], &Namespace::Default, 1000);
            }
            assert_eq!(lean.entries(), 11);
            assert!(lean.leaves.len() <= 2 * 10 + 64, "{}", lean.leaves.len());
            for i in 0..3 * IDLE_ROOTS_KEPT as u64 {
                lean.replay(&[5, i], &Namespace::Id(i), 4);
            }
            assert!(
                lean.roots.len() <= IDLE_ROOTS_KEPT + 2,
                "{}",
                lean.roots.len()
            );
            assert!(lean.entries() <= IDLE_ROOTS_KEPT + 8, "{}", lean.entries());
            lean.check().unwrap();
        }
    }

    /// Roots live as the replica's do. Each of more than `IDLE_ROOTS_KEPT`
    /// namespaces stores a run, is evicted (remembered under its root's id)
    /// and idles; the longest idle roots are reaped as new ones are made,
    /// and each namespace returns after a round of the others in a new
    /// order: to its kept root, where the history gives its run back, or to
    /// a new one, where it does not. The segmented candidate hits what its
    /// replica hits and remembers what it remembers after every request.
    #[test]
    fn roots_are_kept_and_reaped_as_the_replica_keeps_them() {
        let mut replica = candidate_replica(Ranking::Segmented);
        let mut lean = lean(Ranking::Segmented);
        let mut next_page = 0;
        let (spaces, cap) = (IDLE_ROOTS_KEPT as u64 + 676, 600);
        let mut returned = 0;
        for i in 0..4 * spaces {
            let round = i / spaces;
            let ns = Namespace::Id((i * 7 + round * 3) % spaces);
            let request = [1, 2 + round % 2];
            let want = replica.replay(&request, &ns, cap, &mut next_page);
            let before = lean.remembered_pages();
            assert_eq!(lean.replay(&request, &ns, cap).0, want, "request {i}");
            assert_eq!(
                lean.remembered_pages(),
                replica.remembered_pages(),
                "request {i}"
            );
            returned += usize::from(lean.remembered_pages() < before);
        }
        lean.check().unwrap();
        assert!(replica.namespaces() < spaces as usize, "roots were reaped");
        assert!(returned > 0, "runs came back from the history");
        assert_eq!(lean.roots.len(), replica.namespaces());
    }

    /// The history keys a new leaf by its parent's lifetime id: a root
    /// reaped and made again is a new parent, and what was dropped under
    /// the old one does not come back (as in the replica).
    #[test]
    fn a_reaped_root_forgets_what_was_dropped_under_it() {
        let mut lean = lean(Ranking::Segmented);
        let mine = Namespace::Name("mine".into());
        lean.replay(&[1, 2], &mine, 2);
        lean.replay(&[3, 4], &Namespace::Default, 2); // drops [1, 2]: remembered
        assert_eq!(lean.remembered_pages(), 2);
        let back = |lean: &mut LeanCandidate| {
            lean.replay(&[1, 2], &mine, 2);
            let leaf = lean.children[&(lean.roots[&mine], 1)];
            lean.entries[leaf as usize].rank & REUSED != 0
        };
        assert!(back(&mut lean.clone()), "returned content is reused");
        for i in 0..IDLE_ROOTS_KEPT as u64 + 1 {
            lean.replay(&[], &Namespace::Id(i), 2);
        }
        assert!(!lean.roots.contains_key(&mine), "reaped");
        assert!(!back(&mut lean), "a new root is a new parent");
        lean.check().unwrap();
    }

    #[test]
    fn only_the_lean_rankings_have_a_lean_candidate() {
        for ranking in crate::ranking::CANDIDATES {
            assert_eq!(
                LeanCandidate::new(ranking).is_some(),
                LEAN.contains(&ranking)
            );
        }
    }
}
