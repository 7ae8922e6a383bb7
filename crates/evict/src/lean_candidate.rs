//! ghost's five candidates as lean miniature caches: the membership and
//! order a candidate needs, and nothing of the replicated tree node a real
//! cache needs (issue 47's "cheaper candidates"; `Shadows` runs them, and
//! the replica trees they replaced are the models they are tested against).
//!
//! A compressed trie of page words in a slab of small entries (parent, child
//! count, hits, last access, the ranking's key, lifetime id, the run's words),
//! one root per namespace; children found through one table keyed by
//! (parent, first word) instead of a table per node; leaves ordered by a
//! min-heap of (key, last access, entry), or under a queue ranking one heap
//! of (position, entry) per queue, whose stale triples are skipped when
//! popped (checked against the entry's own) and dropped when they outnumber
//! the live leaves. A request is replayed as the replica replays it
//! (`PrefixTree::replay`: match, lock, evict just enough with the path locked,
//! insert what fits, unlock), on a clock that ticks as the replica's does, and
//! hits the same pages: leaves never share a last access (one request stamps
//! one path with one time), so the replica's tie-break by node id never
//! decides.
//!
//! The key before the last access is the ranking's: none for recency, whether
//! the entry is reused (the replica's `hits >= 2`) for segmented, and
//! `Policy::Ghost`'s priority (`ghost_priority`) for priority, which reads how
//! far back the cache reaches (the floor its victims raise) and the weights
//! its history measures; under these three a victim holding at least twice
//! what is still needed loses only its tail. The segmented and priority
//! candidates count hits as the replica does (each matched node gains one,
//! the upper part of a split copies the count, content the history gives
//! back resumes its count) and keep the replica's history of dropped content
//! (`GhostHistory`). ARC and S3-FIFO keep the replica's queue books and ghost
//! lists (`QueueState`): an entry's key is its packed queue slot, moved by
//! the same hooks in the same order (a match's hits root side first, a new
//! leaf placed while its pages count in queue 0, a victim chosen from the
//! queues' heads, S3-FIFO's second chances), and a tree that follows one
//! reads its order from the lean cache (`transplant::QueueShadow`). Histories
//! and ghost lists key content as the replica does, by the parent's id and
//! the first word, so ids are lifetime ids, not slots: one per entry, never
//! reused, the upper part of a split taking a new one and the lower keeping
//! its own, as the replica's node ids do; and roots live as the replica's do
//! (kept while idle, up to `IDLE_ROOTS_KEPT`, the longest idle dropped first
//! when a new one is made), since a root's id is the parent of every
//! first-level entry.
//!
//! Replicated state like the tree's: the digest is a wrapping sum of one
//! term per entry (its slot, parent, lifetime id, words, hits, last access
//! and key), one per free slot at its place in the free stack (which decides
//! the slots entries get) and one per idle root, updated as they change, and
//! the history's or the queues' own; the snapshot carries the entries, the
//! free stack and the history or the queues' books, and the children table,
//! the heaps, the idle order and the pages per queue are rebuilt from them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use crate::ghost_history::{content_key, GhostHistory};
use crate::ids::{NodeId, Token};
use crate::namespace::{Namespace, IDLE_ROOTS_KEPT};
use crate::policy::ghost_priority;
use crate::queue_shared::{Choice, Slot};
use crate::queues::QueueState;
use crate::ranking::Ranking;
use cpkv_hash::{fold_words, mix64, Hasher64, WordHashing};

mod codec;

/// `Entry::parent` of a namespace root.
const NO_PARENT: u32 = u32::MAX;

const TAG_ENTRY: u64 = 0x1ea0_0001;
const TAG_ROOT: u64 = 0x1ea0_0002;
const TAG_FREE: u64 = 0x1ea0_0003;
const TAG_DIGEST: u64 = 0x1ea0_0004;
const TAG_IDLE: u64 = 0x1ea0_0005;

/// Snapshot tags of a slot.
const SLOT_FREE: u8 = 0;
const SLOT_ROOT: u8 = 1;
const SLOT_ENTRY: u8 = 2;

/// Where a leaf stands in the eviction order: (key, last access, slot),
/// or under a queue ranking (queue, position, slot).
type Order = (u64, u64, u32);

#[derive(Debug, Clone)]
struct Entry {
    /// `NO_PARENT` for a namespace root.
    parent: u32,
    children: u32,
    /// The replica's hit count (kept at 1 by recency and the queue
    /// rankings, which read none).
    hits: u64,
    /// An entry's last access; a root's idle since (0 while not idle).
    stamp: u64,
    /// The ranking's key before the last access, or a queue ranking's
    /// packed queue slot (`queue_shared::Slot`); 0 for a root.
    key: u64,
    /// The entry's lifetime id (never reused): what the history names a
    /// parent by.
    life: u64,
    /// The run's page words (empty for a root and a free slot).
    words: Vec<Token>,
    /// The hash of the slot, parent, lifetime id and words (or the root's
    /// namespace): what the digest term adds the rest to.
    base: u64,
}

impl Entry {
    fn term(&self) -> u64 {
        mix64(self.base ^ mix64(self.stamp ^ mix64(self.key ^ self.hits.rotate_left(32))))
    }
    fn is_root(&self) -> bool {
        self.parent == NO_PARENT
    }
}

#[derive(Debug, Clone)]
pub struct LeanCandidate {
    ranking: Ranking,
    entries: Vec<Entry>,
    /// Free slots, the next one handed out last.
    free: Vec<u32>,
    roots: BTreeMap<Namespace, u32>,
    /// Each root's namespace, to drop a root that is reaped.
    root_names: BTreeMap<u32, Namespace>,
    /// Childless roots by (idle since, lifetime id, slot), the longest
    /// idle first: since is the replica's tick that left the root
    /// childless (a request's eviction, or its unlock when it stored
    /// nothing).
    idle: BTreeSet<(u64, u64, u32)>,
    children: HashMap<(u32, Token), u32, WordHashing>,
    /// Leaves by their order, with stale triples skipped lazily: one heap,
    /// or one per queue under a queue ranking.
    leaves: [BinaryHeap<Reverse<Order>>; 2],
    live_leaves: usize,
    /// A queue ranking's books and ghost lists, as its replica keeps them
    /// (`QueueState::Off` for the others).
    queues: QueueState,
    /// The replica's logical clock: four ticks a request (match, lock,
    /// insert, unlock), five when it evicts.
    clock: u64,
    /// How far back the cache reaches: the latest of each victim's last
    /// access and key (the priority candidate's horizon starts there).
    floor: u64,
    pages: usize,
    next_life: u64,
    /// The history of dropped content (priority, segmented).
    history: Option<GhostHistory>,
    /// Sum of the live entries' terms.
    entry_sum: u64,
    /// Sum of the free slots' terms (slot at its place in the stack).
    free_sum: u64,
    /// Sum of the idle roots' terms.
    idle_sum: u64,
    /// Scratch: a request's path, root side first (not state).
    path: Vec<u32>,
}

impl LeanCandidate {
    /// The lean cache of `ranking`.
    pub fn new(ranking: Ranking) -> Self {
        let history = match ranking {
            Ranking::Segmented | Ranking::Priority => Some(GhostHistory::default()),
            Ranking::Recency | Ranking::Arc | Ranking::S3fifo => None,
        };
        let queues = ranking
            .queue_policy()
            .map_or(QueueState::Off, QueueState::new);
        Self {
            ranking,
            entries: Vec::new(),
            free: Vec::new(),
            roots: BTreeMap::new(),
            root_names: BTreeMap::new(),
            idle: BTreeSet::new(),
            children: HashMap::default(),
            leaves: [BinaryHeap::new(), BinaryHeap::new()],
            live_leaves: 0,
            queues,
            clock: 0,
            floor: 0,
            pages: 0,
            next_life: 0,
            history,
            entry_sum: 0,
            free_sum: 0,
            idle_sum: 0,
            path: Vec::new(),
        }
    }

    #[cfg(test)]
    fn ranking(&self) -> Ranking {
        self.ranking
    }

    /// Pages held.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Pages the history or the ghost lists remember.
    pub fn remembered_pages(&self) -> usize {
        self.history.as_ref().map_or(0, GhostHistory::pages)
            + self.queues.remembered_pages() as usize
    }

    /// The target ARC has adapted to, for the ARC candidate.
    pub fn arc_target(&self) -> Option<u64> {
        self.queues.arc_target()
    }

    /// `namespace`'s root (for `transplant::QueueShadow`).
    pub(crate) fn root_slot(&self, namespace: &Namespace) -> Option<u32> {
        self.roots.get(namespace).copied()
    }

    /// Entry `id`'s words.
    pub(crate) fn entry_words(&self, id: u32) -> &[Token] {
        &self.entries[id as usize].words
    }

    /// Entry `id`'s key (a queue ranking's packed queue slot).
    pub(crate) fn entry_key(&self, id: u32) -> u64 {
        self.entries[id as usize].key
    }

    /// The child of entry `id` whose first word is `word`.
    pub(crate) fn child_slot(&self, id: u32, word: Token) -> Option<u32> {
        self.children.get(&(id, word)).copied()
    }

    /// Where entry `id` stands among the leaves.
    fn order(&self, id: u32) -> Order {
        let entry = &self.entries[id as usize];
        if self.queues.is_on() {
            let slot = Slot::unpack(entry.key);
            return (slot.queue, slot.seq, id);
        }
        (entry.key, entry.stamp, id)
    }

    /// Entries held, roots included.
    pub fn entries(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    pub fn digest(&self) -> u64 {
        Hasher64::new(TAG_DIGEST)
            .word(self.clock)
            .word(self.floor)
            .word(self.pages as u64)
            .word(self.entries.len() as u64)
            .word(self.free.len() as u64)
            .word(self.next_life)
            .word(self.entry_sum)
            .word(self.free_sum)
            .word(self.idle_sum)
            .word(self.history.as_ref().map_or(0, GhostHistory::digest))
            .word(self.queues.digest().unwrap_or(0))
            .finish()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Replays one request of page words in `namespace` at a capacity of
    /// `cap` pages; returns the pages it hit and the pages it stored.
    pub fn replay(&mut self, pages: &[Token], namespace: &Namespace, cap: usize) -> (usize, usize) {
        self.tick(); // match
        let root = self.root(namespace);
        let (end, matched) = self.match_path(root, pages);
        if self.ranking != Ranking::Recency {
            self.hit_path(end);
        }
        self.tick(); // lock
        let new = pages.len() - matched;
        let room = cap.saturating_sub(self.pages);
        if new > room {
            self.tick();
            if self.queues.is_on() {
                self.evict_queued(new - room, end, root);
            } else {
                self.evict(new - room, end, root);
            }
        }
        let now = self.tick(); // insert
        self.touch_path(end, now);
        let keep = matched + new.min(cap.saturating_sub(self.pages));
        if keep > matched {
            // Content back from the history resumes its hit count.
            let parent_life = NodeId(self.entries[end as usize].life);
            let returned = self
                .history
                .as_mut()
                .and_then(|h| h.take_back(content_key(parent_life, &pages[matched..=matched])));
            let hits = match self.history {
                Some(_) => 1 + returned.unwrap_or(0),
                None => 1,
            };
            let stored = keep - matched;
            let key = match self.queues.is_on() {
                // The queues see the new pages as the stored entry's (in
                // queue 0) while they place it, as the replica's do.
                true => {
                    self.queues.enter(0, stored);
                    let content = content_key(parent_life, &pages[matched..=matched]);
                    let slot = self.queues.created(content, stored).expect("queued");
                    self.queues.leave(0, stored);
                    self.queues.enter(slot, stored);
                    slot
                }
                false => self.key_of(hits, now),
            };
            let leaf = self.alloc(end, pages[matched..keep].to_vec());
            let entry = &mut self.entries[leaf as usize];
            (entry.hits, entry.stamp, entry.key) = (hits, now, key);
            self.enter(leaf);
            self.children.insert((end, pages[matched]), leaf);
            let parent = &mut self.entries[end as usize];
            parent.children += 1;
            if parent.children == 1 && !parent.is_root() {
                self.live_leaves -= 1;
            }
            self.live_leaves += 1;
            self.pages += stored;
            self.push_leaf(self.order(leaf));
        }
        let now = self.tick(); // unlock
        if self.entries[root as usize].children == 0 {
            self.set_idle(root, Some(now));
        }
        (matched, keep - matched)
    }

    /// The ranking's key of content with `hits` hits accessed at `now`
    /// (not for the queue rankings, whose key only their queues move).
    fn key_of(&self, hits: u64, now: u64) -> u64 {
        match (self.ranking, &self.history) {
            (Ranking::Segmented, _) => u64::from(hits >= 2),
            (Ranking::Priority, Some(history)) => {
                ghost_priority(hits, now, self.floor, history.weights())
            }
            _ => 0,
        }
    }

    /// `namespace`'s root, taken out of the idle ones for the request; a
    /// new one is made when it has none, first dropping the longest idle
    /// roots beyond `IDLE_ROOTS_KEPT` (the new one counted among them, as
    /// the replica counts it).
    fn root(&mut self, namespace: &Namespace) -> u32 {
        if let Some(&root) = self.roots.get(namespace) {
            // An idle root's since is a tick, never 0.
            if self.entries[root as usize].stamp != 0 {
                self.set_idle(root, None);
            }
            return root;
        }
        while self.idle.len() >= IDLE_ROOTS_KEPT {
            let (_, _, oldest) = *self.idle.first().expect("idle roots");
            self.drop_root(oldest);
        }
        let root = self.alloc(NO_PARENT, Vec::new());
        self.entries[root as usize].hits = 0;
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

    /// Makes `root` idle since `since`, or not idle.
    fn set_idle(&mut self, root: u32, since: Option<u64>) {
        let entry = &mut self.entries[root as usize];
        let old = (entry.stamp, entry.life, root);
        if self.idle.remove(&old) {
            self.idle_sum = self.idle_sum.wrapping_sub(idle_term(old));
        }
        let life = entry.life;
        self.retermed(root, |e| e.stamp = since.unwrap_or(0));
        if let Some(since) = since {
            let new = (since, life, root);
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
    /// its place under the parent, with a new lifetime id and `id`'s hits,
    /// last access and key, and is returned (the lower keeps `id`, its
    /// lifetime id, its order and its place among the leaves).
    fn split(&mut self, id: u32, k: usize) -> u32 {
        let entry = &mut self.entries[id as usize];
        let (parent, hits, stamp, key) = (entry.parent, entry.hits, entry.stamp, entry.key);
        let tail = entry.words.split_off(k);
        let head = std::mem::replace(&mut entry.words, tail);
        let lower_first = entry.words[0];
        let first = head[0];
        let upper = self.alloc(parent, head);
        let entry = &mut self.entries[upper as usize];
        (entry.hits, entry.stamp, entry.key, entry.children) = (hits, stamp, key, 1);
        self.enter(upper);
        self.entries[id as usize].parent = upper;
        self.rebase(id);
        self.children.insert((parent, first), upper);
        self.children.insert((upper, lower_first), id);
        upper
    }

    /// The match's hits: each entry of the path to `end` gains one, root
    /// side first (a queue ranking's queues count it instead, numbering
    /// positions in that order), and under the priority ranking the history
    /// counts its pages as reuse the cache held (the replica's `note_hit`,
    /// whose halving makes the order matter too).
    fn hit_path(&mut self, end: u32) {
        self.path.clear();
        let mut at = end;
        while !self.entries[at as usize].is_root() {
            self.path.push(at);
            at = self.entries[at as usize].parent;
        }
        for i in (0..self.path.len()).rev() {
            let at = self.path[i];
            if self.queues.is_on() {
                // A queue ranking counts the hit in its queues instead.
                let slot = self
                    .queues
                    .hit(self.entries[at as usize].key)
                    .expect("queued");
                self.requeue(at, slot);
            } else {
                self.retermed(at, |e| e.hits = e.hits.saturating_add(1));
            }
            if self.ranking == Ranking::Priority {
                if let Some(history) = self.history.as_mut() {
                    history.note_hit(self.entries[at as usize].words.len());
                }
            }
        }
    }

    /// The insert's access: `end` and its ancestors are stamped `now` and
    /// keyed again (the replica accesses the matched path once more when it
    /// inserts); a stamped leaf is queued again at its new order.
    fn touch_path(&mut self, end: u32, now: u64) {
        let queued = self.queues.is_on();
        let mut at = end;
        while !self.entries[at as usize].is_root() {
            let entry = &self.entries[at as usize];
            let key = if queued {
                entry.key
            } else {
                self.key_of(entry.hits, now)
            };
            self.retermed(at, |e| (e.stamp, e.key) = (now, key));
            at = self.entries[at as usize].parent;
        }
        let entry = &self.entries[end as usize];
        if !entry.is_root() && entry.children == 0 {
            self.push_leaf(self.order(end));
        }
    }

    /// Frees `need` pages from the lowest ordered leaves other than
    /// `locked` (the request's path ends there, so no other leaf is on it);
    /// `request_root` stays out of the idle roots until the request ends.
    fn evict(&mut self, mut need: usize, locked: u32, request_root: u32) {
        let mut held_back = None;
        while need > 0 {
            let Some(Reverse(order)) = self.leaves[0].pop() else {
                break;
            };
            let id = order.2;
            let entry = &self.entries[id as usize];
            if self.order(id) != order || entry.children != 0 || entry.words.is_empty() {
                continue; // stale: re-stamped, grown a child or freed
            }
            if id == locked {
                held_back = Some(order);
                continue;
            }
            if self.ranking == Ranking::Priority {
                self.floor = self.floor.max(entry.stamp.min(entry.key));
            }
            let held = entry.words.len();
            if need <= held / 2 {
                self.trim_tail(id, need);
                self.leaves[0].push(Reverse(order));
                break;
            }
            need = need.saturating_sub(held);
            self.remove_leaf(id, request_root);
        }
        if let Some(order) = held_back {
            self.leaves[0].push(Reverse(order));
        }
    }

    /// Frees `need` pages as a queue ranking's replica does: its queues
    /// choose each victim from their heads (S3-FIFO moving some first), a
    /// victim leaves whole, and `locked` (the end of the request's path)
    /// is passed over.
    fn evict_queued(&mut self, need: usize, locked: u32, request_root: u32) {
        let mut freed = 0;
        let mut held_back = None;
        while freed < need {
            let (entries, leaves) = (&self.entries, &mut self.leaves);
            let queued_at = |id: u32| {
                let e = &entries[id as usize];
                let slot = Slot::unpack(e.key);
                (slot.queue, slot.seq, id)
            };
            let head = |queue: u64| loop {
                let Reverse(order) = *leaves[queue as usize].peek()?;
                let e = &entries[order.2 as usize];
                if queued_at(order.2) != order || e.children != 0 || e.words.is_empty() {
                    leaves[queue as usize].pop(); // stale
                } else if order.2 == locked {
                    held_back = leaves[queue as usize].pop();
                } else {
                    return Some(NodeId(u64::from(order.2)));
                }
            };
            let slot_of = |id: NodeId| entries[id.0 as usize].key;
            match self.queues.choose_by(head, slot_of) {
                None => break,
                Some(Choice::Evict(id)) => {
                    let id = id.0 as u32;
                    freed += self.entries[id as usize].words.len();
                    self.remove_leaf(id, request_root);
                }
                Some(Choice::Requeue(id, slot)) => {
                    let id = id.0 as u32;
                    self.requeue(id, slot);
                    self.push_leaf(self.order(id));
                }
            }
        }
        if let Some(order) = held_back {
            self.push_leaf(order.0);
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
            history.record(key, entry.hits, need, self.pages);
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
        if self.history.is_some() || self.queues.is_on() {
            let content = content_key(NodeId(self.entries[parent as usize].life), &[first]);
            if let Some(history) = self.history.as_mut() {
                history.record(content, entry.hits, len, self.pages);
            }
            if self.queues.is_on() {
                self.queues.leave(entry.key, len);
                self.queues.dropped(content, entry.key, len);
            }
        }
        self.pages -= len;
        self.children.remove(&(parent, first));
        self.release(id);
        self.live_leaves -= 1;
        let p = &mut self.entries[parent as usize];
        p.children -= 1;
        if p.children == 0 {
            if !p.is_root() {
                self.live_leaves += 1;
                self.push_leaf(self.order(parent));
            } else if parent != request_root {
                self.set_idle(parent, Some(self.clock));
            }
        }
    }

    /// A slot for a new entry (one hit, never accessed) with the next
    /// lifetime id, the free stack's top first (its term joins the sum in
    /// `enter`, once the caller has set it up).
    fn alloc(&mut self, parent: u32, words: Vec<Token>) -> u32 {
        let entry = Entry {
            parent,
            children: 0,
            hits: 1,
            stamp: 0,
            key: 0,
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
        self.retermed(id, |e| e.base = base);
    }

    /// Changes entry `id` by `change`, its term kept in the digest's sum.
    fn retermed(&mut self, id: u32, change: impl FnOnce(&mut Entry)) {
        let entry = &mut self.entries[id as usize];
        self.entry_sum = self.entry_sum.wrapping_sub(entry.term());
        change(entry);
        self.entry_sum = self.entry_sum.wrapping_add(entry.term());
    }

    /// Moves entry `id` to queue slot `slot`, its pages with it.
    fn requeue(&mut self, id: u32, slot: u64) {
        let entry = &self.entries[id as usize];
        self.queues.leave(entry.key, entry.words.len());
        self.queues.enter(slot, entry.words.len());
        self.retermed(id, |e| e.key = slot);
    }

    fn base_of(&self, id: u32) -> u64 {
        let entry = &self.entries[id as usize];
        if !entry.is_root() {
            return entry_base(id, entry);
        }
        root_base(id, entry.life, &self.root_names[&id])
    }

    /// Queues a leaf at `order`; stale triples are dropped once they
    /// outnumber the live leaves, so the heap stays bounded by the trie.
    fn push_leaf(&mut self, order: Order) {
        let heap = if self.queues.is_on() {
            order.0 as usize
        } else {
            0
        };
        self.leaves[heap].push(Reverse(order));
        if self.leaves[0].len() + self.leaves[1].len() > 2 * self.live_leaves + 64 {
            for heap in 0..2 {
                let mut kept: Vec<Order> = std::mem::take(&mut self.leaves[heap])
                    .into_iter()
                    .map(|Reverse(o)| o)
                    .filter(|o| {
                        let e = &self.entries[o.2 as usize];
                        !e.words.is_empty() && e.children == 0 && self.order(o.2) == *o
                    })
                    .collect();
                // A leaf re-queued while still queued keeps one triple.
                kept.sort_unstable();
                kept.dedup();
                self.leaves[heap] = kept.into_iter().map(Reverse).collect();
            }
        }
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
    use cpkv_wire::{Reader, Writer};
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

    impl LeanCandidate {
        fn reuse_pages(&self) -> (u64, u64) {
            self.history
                .as_ref()
                .map_or((0, 0), GhostHistory::reuse_pages)
        }
    }

    const LEAN: [Ranking; 5] = crate::ranking::CANDIDATES;

    fn lean(ranking: Ranking) -> LeanCandidate {
        LeanCandidate::new(ranking)
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
            ops in ops(), start in 1usize..24, ranking in 0usize..5,
        ) {
            let ranking = LEAN[ranking];
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
                        if ranking == Ranking::Priority {
                            prop_assert_eq!(lean.reuse_pages(), replica.reuse_pages());
                        }
                        prop_assert_eq!(lean.arc_target(), replica.queue_state().arc_target());
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
            ops in ops(), at in any::<prop::sample::Index>(), byte in any::<u8>(), ranking in 0usize..5,
        ) {
            let ranking = LEAN[ranking];
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
        w.u64(0); // floor
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
            w.u64(1); // hits
            w.u64(1); // last access
            w.u64(0); // key
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
    /// a new one, where it does not. The candidate hits what its
    /// replica hits and remembers what it remembers after every request.
    #[test]
    fn roots_are_kept_and_reaped_as_the_replica_keeps_them() {
        // Each ranking that remembers dropped content by its parent's id.
        for ranking in [
            Ranking::Priority,
            Ranking::Segmented,
            Ranking::Arc,
            Ranking::S3fifo,
        ] {
            roots_are_kept_and_reaped_as_the_replica_keeps_them_in(ranking);
        }
    }

    fn roots_are_kept_and_reaped_as_the_replica_keeps_them_in(ranking: Ranking) {
        let mut replica = candidate_replica(ranking);
        let mut lean = lean(ranking);
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
        // ARC's and S3-FIFO's ghost lists are bounded by the cache, too
        // short here for a whole round of namespaces.
        let lists = ranking.queue_policy().is_some();
        assert!(returned > 0 || lists, "runs came back from the history");
        assert_eq!(lean.roots.len(), replica.namespaces());
    }

    /// Requests of thousands of pages: the history's reuse mix passes its
    /// window and is halved between one match's hits, so the priority
    /// candidate must count them root side first, as the replica does.
    #[test]
    fn the_reuse_mix_is_counted_in_the_replicas_order() {
        let mut replica = candidate_replica(Ranking::Priority);
        let mut lean = lean(Ranking::Priority);
        let mut next_page = 0;
        for i in 0..300u64 {
            let doc = i % 7;
            // Documents share a head, split at the request's own depth.
            let mut request: Vec<Token> = (0..1500).map(|k| 1_000_000 + k).collect();
            request.extend((0..(500 + 300 * doc)).map(|k| doc * 100_000 + k));
            request.extend((0..200).map(|k| 10_000_000 + i * 1000 + k));
            let want = replica.replay(&request, &Namespace::Default, 9000, &mut next_page);
            assert_eq!(
                lean.replay(&request, &Namespace::Default, 9000).0,
                want,
                "request {i}"
            );
            assert_eq!(lean.reuse_pages(), replica.reuse_pages(), "request {i}");
        }
        let (hit, returned) = lean.reuse_pages();
        assert!(hit > 0 && returned > 0 && hit + returned <= 1 << 14);
        lean.check().unwrap();
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
            lean.entries[leaf as usize].key == 1
        };
        assert!(back(&mut lean.clone()), "returned content is reused");
        for i in 0..IDLE_ROOTS_KEPT as u64 + 1 {
            lean.replay(&[], &Namespace::Id(i), 2);
        }
        assert!(!lean.roots.contains_key(&mine), "reaped");
        assert!(!back(&mut lean), "a new root is a new parent");
        lean.check().unwrap();
    }
}
