//! A lean miniature cache for ghost's recency candidate (issue 47's
//! "cheaper candidates"): the membership and order a candidate needs, and
//! nothing of the replicated tree node the real cache needs.
//!
//! A compressed trie of page words in a slab of small entries (parent,
//! child count, last access, the run's words); children found through one
//! table keyed by (parent, first word) instead of a table per node; leaves
//! ordered by a min-heap of (last access, entry) whose stale entries are
//! skipped when popped (checked against the entry's own stamp) and dropped
//! when they outnumber the live ones. A request is replayed as the recency
//! shadow replays it (`PrefixTree::replay`: match and stamp the path, evict
//! just enough with the path locked, a victim holding at least twice what is
//! still needed losing only its tail, insert what fits) and hits the same
//! pages: leaves never share a stamp (one request stamps one path with one
//! time), so the shadow's tie-break by node id never decides.
//!
//! Measured against the replica, not landed in `Shadows` (docs/ghost.md,
//! "A lean candidate"): one namespace, no digest, no snapshot.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::ids::Token;
use cpkv_hash::WordHashing;

const ROOT: u32 = 0;

#[derive(Debug, Clone)]
struct Entry {
    parent: u32,
    children: u32,
    stamp: u64,
    words: Vec<Token>,
}

#[derive(Debug, Clone)]
pub struct LeanRecency {
    entries: Vec<Entry>,
    free: Vec<u32>,
    children: HashMap<(u32, Token), u32, WordHashing>,
    /// Leaves by (last access, entry), with stale pairs skipped lazily.
    leaves: BinaryHeap<Reverse<(u64, u32)>>,
    live_leaves: usize,
    clock: u64,
    pages: usize,
}

impl Default for LeanRecency {
    fn default() -> Self {
        Self::new()
    }
}

impl LeanRecency {
    pub fn new() -> Self {
        let root = Entry {
            parent: ROOT,
            children: 0,
            stamp: 0,
            words: Vec::new(),
        };
        Self {
            entries: vec![root],
            free: Vec::new(),
            children: HashMap::default(),
            leaves: BinaryHeap::new(),
            live_leaves: 0,
            clock: 0,
            pages: 0,
        }
    }

    /// Pages held.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Entries held, the root included.
    pub fn entries(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Replays one request of page words at a capacity of `cap` pages;
    /// returns the pages it hit.
    pub fn replay(&mut self, pages: &[Token], cap: usize) -> usize {
        self.clock += 1;
        let now = self.clock;
        let (end, matched) = self.match_path(pages);
        self.stamp_path(end, now);
        let new = pages.len() - matched;
        let room = cap.saturating_sub(self.pages);
        if new > room {
            self.evict(new - room, end);
        }
        let keep = matched + new.min(cap.saturating_sub(self.pages));
        if keep > matched {
            let leaf = self.alloc(Entry {
                parent: end,
                children: 0,
                stamp: now,
                words: pages[matched..keep].to_vec(),
            });
            self.children.insert((end, pages[matched]), leaf);
            let parent = &mut self.entries[end as usize];
            parent.children += 1;
            if parent.children == 1 && end != ROOT {
                self.live_leaves -= 1;
            }
            self.live_leaves += 1;
            self.pages += keep - matched;
            self.push_leaf(now, leaf);
        }
        matched
    }

    /// The entry the longest held prefix of `pages` ends at (split there
    /// when it ends inside one) and how many pages that is.
    fn match_path(&mut self, pages: &[Token]) -> (u32, usize) {
        let (mut at, mut i) = (ROOT, 0);
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
        let upper = self.alloc(Entry {
            parent,
            children: 1,
            stamp,
            words: head,
        });
        self.entries[id as usize].parent = upper;
        self.children.insert((parent, first), upper);
        self.children.insert((upper, lower_first), id);
        upper
    }

    /// Stamps `end` and its ancestors with `now`; a stamped leaf is
    /// queued again at its new time.
    fn stamp_path(&mut self, end: u32, now: u64) {
        let mut at = end;
        while at != ROOT {
            let entry = &mut self.entries[at as usize];
            entry.stamp = now;
            at = entry.parent;
        }
        if end != ROOT && self.entries[end as usize].children == 0 {
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
            if entry.stamp != stamp || entry.children != 0 || id == ROOT || entry.words.is_empty() {
                continue; // stale: re-stamped, grown a child or freed
            }
            if id == locked {
                held_back = Some((stamp, id));
                continue;
            }
            let held = entry.words.len();
            if need <= held / 2 {
                self.entries[id as usize].words.truncate(held - need);
                self.pages -= need;
                self.leaves.push(Reverse((stamp, id)));
                break;
            }
            need = need.saturating_sub(held);
            self.remove_leaf(id);
        }
        if let Some((stamp, id)) = held_back {
            self.leaves.push(Reverse((stamp, id)));
        }
    }

    fn remove_leaf(&mut self, id: u32) {
        let entry = &mut self.entries[id as usize];
        let words = std::mem::take(&mut entry.words);
        let parent = entry.parent;
        self.pages -= words.len();
        self.children.remove(&(parent, words[0]));
        self.free.push(id);
        self.live_leaves -= 1;
        let p = &mut self.entries[parent as usize];
        p.children -= 1;
        if p.children == 0 && parent != ROOT {
            let stamp = p.stamp;
            self.live_leaves += 1;
            self.push_leaf(stamp, parent);
        }
    }

    fn alloc(&mut self, entry: Entry) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.entries[id as usize] = entry;
                id
            }
            None => {
                self.entries.push(entry);
                u32::try_from(self.entries.len() - 1).expect("under 2^32 entries")
            }
        }
    }

    /// Queues leaf `id` at `stamp`; stale pairs are dropped once they
    /// outnumber the live leaves, so the heap stays bounded by the trie.
    fn push_leaf(&mut self, stamp: u64, id: u32) {
        self.leaves.push(Reverse((stamp, id)));
        if self.leaves.len() > 2 * self.live_leaves + 64 {
            let entries = &self.entries;
            self.leaves.retain(|Reverse((s, i))| {
                let e = &entries[*i as usize];
                *i != ROOT && !e.words.is_empty() && e.children == 0 && e.stamp == *s
            });
            // A leaf re-queued while still queued keeps one pair.
            let mut seen: Vec<(u64, u32)> = self.leaves.drain().map(|Reverse(p)| p).collect();
            seen.sort_unstable();
            seen.dedup();
            self.leaves.extend(seen.into_iter().map(Reverse));
        }
    }

    /// Checks the trie from scratch: child counts, the children table,
    /// the pages held, that every leaf is queued at its stamp and that a
    /// parent is never older than its child.
    pub fn check(&self) -> Result<(), String> {
        let free: std::collections::BTreeSet<u32> = self.free.iter().copied().collect();
        let live = |i: u32| i == ROOT || !free.contains(&i);
        let mut counts = vec![0u32; self.entries.len()];
        let (mut pages, mut leaves) = (0, 0);
        for (i, e) in self.entries.iter().enumerate().skip(1) {
            let i = i as u32;
            if !live(i) {
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
            if e.parent != ROOT && self.entries[e.parent as usize].stamp < e.stamp {
                return Err(format!("entry {i} is newer than its parent"));
            }
        }
        for (i, e) in self.entries.iter().enumerate() {
            if live(i as u32) && e.children != counts[i] {
                return Err(format!("entry {i} counts {} children", e.children));
            }
            if i > 0 && live(i as u32) && e.children == 0 {
                leaves += 1;
                let queued = self.leaves.iter().any(|r| r.0 == (e.stamp, i as u32));
                if !queued {
                    return Err(format!("leaf {i} is not queued at its stamp"));
                }
            }
        }
        if self.children.len() != self.entries() - 1 {
            return Err("children table size".into());
        }
        if pages != self.pages || leaves != self.live_leaves {
            return Err(format!(
                "pages {pages} / {} or leaves {leaves} / {}",
                self.pages, self.live_leaves
            ));
        }
        Ok(())
    }
}

/// The hits per request of the recency candidate fed `requests` (page
/// words) at `cap` pages: the lean one, or the replica `Shadows` runs. For
/// the measuring example (`examples/lean_candidate.rs`).
#[doc(hidden)]
pub fn recency_candidate_hits(requests: &[Vec<Token>], cap: usize, lean: bool) -> Vec<usize> {
    if lean {
        let mut lean = LeanRecency::new();
        return requests.iter().map(|p| lean.replay(p, cap)).collect();
    }
    let mut replica = recency_replica();
    let mut next_page = 0;
    let ns = crate::Namespace::Default;
    requests
        .iter()
        .map(|p| replica.replay(p, &ns, cap, &mut next_page))
        .collect()
}

/// The recency shadow's tree, as `Shadows::new` makes it.
pub(crate) fn recency_replica() -> crate::PrefixTree {
    let mut t = crate::PrefixTree::without_chooser(1, crate::Policy::Ghost).expect("page size 1");
    t.set_event_limit(0);
    t.defer_terms();
    t.count_pages_only();
    t.make_shadow(crate::ranking::Ranking::Recency);
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::Namespace;
    use proptest::prelude::*;

    /// One call into the candidate: a request of page words at a capacity
    /// (capacities change as the real cache's high-water mark grows).
    #[derive(Debug, Clone)]
    enum Op {
        Request(Vec<Token>),
        Grow(usize),
    }

    /// Requests sharing roots and middles at several depths, so matches
    /// end inside entries (splits) and leaves are trimmed and removed.
    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let request = (0u64..8, 0u64..5, 0usize..4, 0u64..6, 0usize..9).prop_map(
            |(root, mid, mid_len, tail, tail_len)| {
                let mut r = vec![root];
                r.extend((0..mid_len as u64).map(|k| 100 + mid * 10 + k));
                r.extend((0..tail_len as u64).map(|k| 1000 + tail * 100 + root * 10 + k));
                Op::Request(r)
            },
        );
        let op = prop_oneof![8 => request, 1 => (0usize..6).prop_map(Op::Grow)];
        prop::collection::vec(op, 1..300)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The model is the recency shadow's replica: after every request
        /// both hit the same pages and hold the same number, and the lean
        /// trie's own invariants hold.
        #[test]
        fn lean_recency_hits_what_the_replica_hits(ops in ops(), start in 1usize..24) {
            let mut replica = recency_replica();
            let mut lean = LeanRecency::new();
            let (mut cap, mut next_page) = (start, 0);
            for op in &ops {
                match op {
                    Op::Grow(by) => cap += by,
                    Op::Request(pages) => {
                        let want = replica.replay(pages, &Namespace::Default, cap, &mut next_page);
                        prop_assert_eq!(lean.replay(pages, cap), want, "{:?} at {}", pages, cap);
                        prop_assert_eq!(lean.pages(), replica.device_pages());
                        prop_assert!(lean.pages() <= cap);
                        lean.check().map_err(TestCaseError::fail)?;
                    }
                }
            }
        }
    }

    /// The heap drops stale pairs: a workload of hits only keeps it bounded
    /// by the live leaves, not by the requests made.
    #[test]
    fn stale_pairs_do_not_accumulate() {
        let mut lean = LeanRecency::new();
        for i in 0..10_000u64 {
            lean.replay(&[i % 10, 1, 2], 1000);
        }
        assert_eq!(lean.entries(), 11);
        assert!(lean.leaves.len() <= 2 * 10 + 64, "{}", lean.leaves.len());
        lean.check().unwrap();
    }
}
