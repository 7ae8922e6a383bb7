//! A lean candidate's snapshot and its check from scratch: what a restored
//! candidate is rebuilt from, and everything a replay could never build,
//! refused.

use std::collections::BTreeSet;

use super::{
    entry_base, free_term, idle_term, root_base, Entry, LeanCandidate, Order, NO_PARENT,
    SLOT_ENTRY, SLOT_FREE, SLOT_ROOT,
};
use crate::ghost_history::GhostHistory;
use crate::queue_shared::Slot;
use crate::queues::QueueState;
use crate::ranking::Ranking;
use cpkv_wire::{Reader, Writer};

impl LeanCandidate {
    /// The clock, the floor and the next lifetime id, every slot (free, a
    /// root with its namespace, lifetime id and whether it is idle since
    /// when, or an entry), the free stack, then the history: what the
    /// children table, the leaf heap, the idle order and the digest are
    /// rebuilt from.
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u64(self.clock);
        w.u64(self.floor);
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
                w.u8(u8::from(self.idle.contains(&(entry.stamp, entry.life, id))));
                w.u64(entry.stamp);
            } else {
                w.u8(SLOT_ENTRY);
                w.u32(entry.parent);
                w.u64(entry.life);
                w.u64(entry.hits);
                w.u64(entry.stamp);
                w.u64(entry.key);
                w.u64s(&entry.words);
            }
        }
        w.u64(self.free.len() as u64);
        self.free.iter().for_each(|&id| w.u32(id));
        if let Some(history) = &self.history {
            history.encode(w);
        }
        self.queues.encode(w);
    }

    /// The inverse of `encode` for `ranking`'s candidate, refusing what no
    /// replay could have built (an orphan, a cycle, two children on one
    /// word, a child newer than its parent or the clock, a lifetime id
    /// used twice or not yet handed out, an idle root with children or a
    /// childless one not idle, hits or a key the ranking never gives, a
    /// free stack that is not exactly the free slots).
    pub(crate) fn decode(r: &mut Reader<'_>, ranking: Ranking) -> Result<Self, String> {
        let mut lean = Self::new(ranking);
        let clock = r.u64()?;
        lean.clock = clock;
        lean.floor = r.u64()?;
        lean.next_life = r.u64()?;
        let slots = r.len(1)?;
        if slots >= NO_PARENT as usize {
            return Err(format!("{slots} slots"));
        }
        let mut free_slots = BTreeSet::new();
        for id in 0..slots as u32 {
            let mut entry = Entry {
                parent: NO_PARENT,
                children: 0,
                hits: 0,
                stamp: 0,
                key: 0,
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
                            entry.stamp = since;
                            let idle = (since, entry.life, id);
                            lean.idle.insert(idle);
                            lean.idle_sum = lean.idle_sum.wrapping_add(idle_term(idle));
                        }
                        _ => return Err(format!("root {id}: bad idle state {idle}, {since}")),
                    }
                    entry.base = root_base(id, entry.life, &namespace);
                    lean.root_names.insert(id, namespace);
                }
                SLOT_ENTRY => {
                    entry.parent = r.u32()?;
                    entry.life = r.u64()?;
                    entry.hits = r.u64()?;
                    entry.stamp = r.u64()?;
                    entry.key = r.u64()?;
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
        if lean.history.is_some() {
            lean.history = Some(GhostHistory::decode(r)?);
        }
        if let Some(policy) = ranking.queue_policy() {
            // The books are recounted from the entries below.
            lean.queues = QueueState::decode(policy, r)?;
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
        for id in 0..slots as u32 {
            let entry = &lean.entries[id as usize];
            if free_slots.contains(&id) {
                continue;
            }
            lean.entry_sum = lean.entry_sum.wrapping_add(entry.term());
            if lean.queues.is_on() && !entry.is_root() {
                if !lean.queues.accepts(entry.key) {
                    return Err(format!("entry {id}: queue slot {:#x}", entry.key));
                }
                lean.queues.enter(entry.key, entry.words.len());
            }
            if !entry.is_root() && entry.children == 0 {
                lean.live_leaves += 1;
                lean.push_leaf(lean.order(id));
            }
        }
        lean.check()?;
        Ok(lean)
    }

    /// Checks the trie from scratch: child counts, the children table, the
    /// roots and which are idle, the lifetime ids, the pages held, hits and
    /// keys the ranking gives, that every leaf is queued at its order, that
    /// a parent is never older than its child, the history, and the
    /// digest's sums.
    pub fn check(&self) -> Result<(), String> {
        let free: BTreeSet<u32> = self.free.iter().copied().collect();
        let queued: BTreeSet<Order> = self.leaves.iter().flatten().map(|r| r.0).collect();
        if free.len() != self.free.len() {
            return Err("a slot is on the free stack twice".into());
        }
        let live = |i: u32| (i as usize) < self.entries.len() && !free.contains(&i);
        let mut counts = vec![0u32; self.entries.len()];
        let (mut pages, mut leaves, mut entry_sum) = (0, 0, 0u64);
        let mut lives = BTreeSet::new();
        let mut recount = [0u64; 2];
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
                if named.and_then(|n| self.roots.get(n)) != Some(&i)
                    || !e.words.is_empty()
                    || e.hits != 0
                    || e.key != 0
                {
                    return Err(format!("root {i} is not its namespace's"));
                }
                continue;
            }
            if e.words.is_empty() || !live(e.parent) {
                return Err(format!("entry {i}: empty or orphaned"));
            }
            let keyed = match self.ranking {
                Ranking::Recency => e.hits == 1 && e.key == 0,
                Ranking::Segmented => e.hits >= 1 && e.key == u64::from(e.hits >= 2),
                Ranking::Priority => e.hits >= 1,
                Ranking::Arc | Ranking::S3fifo => e.hits == 1 && self.queues.accepts(e.key),
            };
            if self.queues.is_on() {
                recount[Slot::unpack(e.key).queue as usize] += e.words.len() as u64;
            }
            if !keyed {
                return Err(format!("entry {i}: hits {} and key {}", e.hits, e.key));
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
        let mut idle_sum = 0u64;
        for (i, e) in self.entries.iter().enumerate() {
            if !live(i as u32) {
                continue;
            }
            if e.children != counts[i] {
                return Err(format!("entry {i} counts {} children", e.children));
            }
            if e.is_root() {
                let idle = (e.stamp, e.life, i as u32);
                if (e.children == 0) != self.idle.contains(&idle) {
                    return Err(format!("root {i}: idle is not childless"));
                }
                if e.children == 0 {
                    idle_sum = idle_sum.wrapping_add(idle_term(idle));
                }
            } else if e.children == 0 {
                leaves += 1;
                if !queued.contains(&self.order(i as u32)) {
                    return Err(format!("leaf {i} is not queued at its order"));
                }
            }
        }
        if self.roots.len() != self.root_names.len() || self.idle.len() > self.roots.len() {
            return Err("roots, their namespaces and the idle ones differ".into());
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
        self.queues.check(recount)?;
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
