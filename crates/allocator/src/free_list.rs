//! The free extents of one payload pool: address-ordered, fully coalesced.
//!
//! Stored as a treap keyed by extent start, each node also holding the largest
//! extent length in its subtree, so first-fit ("lowest-addressed extent with at
//! least n pages") descends one root-to-leaf path instead of scanning: O(log F)
//! expected for F free extents. Node priorities are a fixed hash of the start
//! address an extent was created with, so the tree shape is a pure function of
//! the operation history (identical on every rank) and needs no randomness.

use crate::digest::{free_element, mix64, StateDigest};
use crate::extent::Extent;
use crate::payload::PayloadId;

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node {
    start: u64,
    len: u64,
    /// Largest `len` in this node's subtree.
    max_len: u64,
    /// Sum of `len` over this node's subtree.
    sum_len: u64,
    priority: u64,
    left: u32,
    right: u32,
}

#[derive(Clone, Debug)]
pub struct FreeList {
    payload: PayloadId,
    /// Sum of the digest elements of the free extents.
    digest: StateDigest,
    nodes: Vec<Node>,
    vacant: Vec<u32>,
    root: u32,
    extents: usize,
    free_pages: u64,
}

impl FreeList {
    /// A pool of `capacity` pages of `payload`, all free.
    pub fn new(payload: PayloadId, capacity: u64) -> Self {
        let mut list = FreeList::empty(payload);
        list.insert(Extent::new(0, capacity));
        list
    }

    /// No free pages at all (restore fills it extent by extent).
    pub fn empty(payload: PayloadId) -> Self {
        FreeList {
            payload,
            digest: StateDigest::default(),
            nodes: Vec::new(),
            vacant: Vec::new(),
            root: NIL,
            extents: 0,
            free_pages: 0,
        }
    }

    /// The digest elements of every free extent, summed.
    pub fn digest(&self) -> StateDigest {
        self.digest
    }

    pub fn free_pages(&self) -> u64 {
        self.free_pages
    }

    pub fn extent_count(&self) -> usize {
        self.extents
    }

    pub fn largest(&self) -> u64 {
        self.max_len(self.root)
    }

    /// The lowest-addressed extent holding at least `len` pages.
    pub fn first_fit(&self, len: u64) -> Option<Extent> {
        let mut t = self.root;
        if self.max_len(t) < len {
            return None;
        }
        loop {
            let node = &self.nodes[t as usize];
            if self.max_len(node.left) >= len {
                t = node.left;
            } else if node.len >= len {
                return Some(Extent::new(node.start, node.len));
            } else {
                t = node.right;
            }
        }
    }

    /// Takes `len` pages from the start of the free extent beginning at `start`
    /// (which must exist and hold at least `len` pages).
    pub fn take_front(&mut self, start: u64, len: u64) {
        let found = self
            .find(start)
            .expect("take_front: no free extent at start");
        let have = self.nodes[found as usize].len;
        debug_assert!(len <= have);
        if len == have {
            self.remove(start);
        } else {
            // Shrinking from the front keeps the extent between its neighbours,
            // so it is re-keyed in place.
            self.replace(
                Extent::new(start, have),
                Extent::new(start + len, have - len),
            );
        }
    }

    /// Takes the lowest-addressed `len` free pages (no more than are free):
    /// whole extents in address order, the last one from its start. One
    /// descent finds the cut and one split detaches the whole extents, so
    /// this costs O(log F + extents taken), not a removal per extent.
    pub fn take_prefix(&mut self, len: u64) -> Vec<Extent> {
        assert!(
            len <= self.free_pages,
            "take_prefix: only {} pages free",
            self.free_pages
        );
        let (mut t, mut missing) = (self.root, len);
        let cut = loop {
            let n = &self.nodes[t as usize];
            let left = self.sum_len(n.left);
            if left >= missing {
                t = n.left;
            } else if left + n.len >= missing {
                missing -= left;
                break Extent::new(n.start, n.len);
            } else {
                missing -= left + n.len;
                t = n.right;
            }
        };
        let (whole, rest) = self.split(self.root, cut.start);
        self.root = rest;
        let mut taken = Vec::new();
        self.drain(whole, &mut taken);
        self.take_front(cut.start, missing);
        taken.push(Extent::new(cut.start, missing));
        taken
    }

    /// Removes every node of subtree `t`, appending its extents in order.
    fn drain(&mut self, t: u32, out: &mut Vec<Extent>) {
        if t == NIL {
            return;
        }
        let (left, right) = (self.nodes[t as usize].left, self.nodes[t as usize].right);
        self.drain(left, out);
        let extent = self.extent(t);
        self.free_pages -= extent.len;
        self.digest.remove(free_element(self.payload, extent));
        self.extents -= 1;
        self.vacant.push(t);
        out.push(extent);
        self.drain(right, out);
    }

    /// Returns `extent` (not overlapping any free extent) to the pool, merging
    /// it with the free extents that touch it on either side.
    pub fn give_back(&mut self, extent: Extent) {
        let before = self
            .last_before(extent.start)
            .filter(|p| p.end() == extent.start);
        let after = self
            .first_after(extent.start)
            .filter(|n| n.start == extent.end());
        match (before, after) {
            (Some(p), Some(n)) => {
                self.remove(n.start);
                self.replace(p, Extent::new(p.start, p.len + extent.len + n.len));
            }
            (Some(p), None) => self.replace(p, Extent::new(p.start, p.len + extent.len)),
            (None, Some(n)) => self.replace(n, Extent::new(extent.start, extent.len + n.len)),
            (None, None) => self.insert(extent),
        }
    }

    /// Adds a free extent as is, without coalescing (restore, which validated
    /// that the extents are disjoint and non-adjacent).
    pub fn insert(&mut self, extent: Extent) {
        debug_assert!(extent.len > 0);
        let node = self.alloc_node(extent);
        let (left, right) = self.split(self.root, extent.start);
        let left = self.merge(left, node);
        self.root = self.merge(left, right);
        self.extents += 1;
        self.free_pages += extent.len;
        self.digest.add(free_element(self.payload, extent));
    }

    /// Every free extent in address order.
    pub fn extents(&self) -> Vec<Extent> {
        let mut out = Vec::with_capacity(self.extents);
        let mut stack = Vec::new();
        let mut t = self.root;
        while t != NIL || !stack.is_empty() {
            while t != NIL {
                stack.push(t);
                t = self.nodes[t as usize].left;
            }
            let top = stack.pop().expect("non-empty stack");
            out.push(self.extent(top));
            t = self.nodes[top as usize].right;
        }
        out
    }

    /// Checks the tree's own bookkeeping (order, heap, subtree maxima, counts);
    /// returns what is wrong.
    pub fn check_structure(&self) -> Result<(), String> {
        let mut count = 0usize;
        let mut pages = 0u64;
        self.check_node(self.root, None, None, u64::MAX, &mut count, &mut pages)?;
        if count != self.extents || pages != self.free_pages {
            return Err(format!(
                "counts say {} extents / {} pages, tree holds {count} / {pages}",
                self.extents, self.free_pages
            ));
        }
        let mut digest = StateDigest::default();
        for extent in self.extents() {
            digest.add(free_element(self.payload, extent));
        }
        if digest != self.digest {
            return Err(format!(
                "payload {}: free-extent digest differs from a recomputation",
                self.payload
            ));
        }
        Ok(())
    }

    fn check_node(
        &self,
        t: u32,
        low: Option<u64>,
        high: Option<u64>,
        parent_priority: u64,
        count: &mut usize,
        pages: &mut u64,
    ) -> Result<(), String> {
        if t == NIL {
            return Ok(());
        }
        let n = &self.nodes[t as usize];
        if low.is_some_and(|l| n.start <= l) || high.is_some_and(|h| n.start >= h) {
            return Err(format!("extent at {} is out of address order", n.start));
        }
        if n.priority > parent_priority {
            return Err(format!("extent at {} breaks the heap order", n.start));
        }
        let expect = n.len.max(self.max_len(n.left)).max(self.max_len(n.right));
        let sum = n.len + self.sum_len(n.left) + self.sum_len(n.right);
        if n.max_len != expect || n.sum_len != sum || n.len == 0 {
            return Err(format!("extent at {} has a stale subtree maximum", n.start));
        }
        *count += 1;
        *pages += n.len;
        self.check_node(n.left, low, Some(n.start), n.priority, count, pages)?;
        self.check_node(n.right, Some(n.start), high, n.priority, count, pages)
    }

    fn extent(&self, t: u32) -> Extent {
        let n = &self.nodes[t as usize];
        Extent::new(n.start, n.len)
    }

    fn max_len(&self, t: u32) -> u64 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].max_len
        }
    }

    fn sum_len(&self, t: u32) -> u64 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].sum_len
        }
    }

    fn update(&mut self, t: u32) {
        let n = &self.nodes[t as usize];
        let max_len = n.len.max(self.max_len(n.left)).max(self.max_len(n.right));
        let sum_len = n.len + self.sum_len(n.left) + self.sum_len(n.right);
        let n = &mut self.nodes[t as usize];
        n.max_len = max_len;
        n.sum_len = sum_len;
    }

    fn alloc_node(&mut self, extent: Extent) -> u32 {
        let node = Node {
            start: extent.start,
            len: extent.len,
            max_len: extent.len,
            sum_len: extent.len,
            priority: mix64(extent.start ^ 0x5bd1_e995_9e37_79b9),
            left: NIL,
            right: NIL,
        };
        match self.vacant.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 free extents")
            }
        }
    }

    fn find(&self, start: u64) -> Option<u32> {
        let mut t = self.root;
        while t != NIL {
            let n = &self.nodes[t as usize];
            if start == n.start {
                return Some(t);
            }
            t = if start < n.start { n.left } else { n.right };
        }
        None
    }

    /// The free extent with the largest start below `addr`.
    fn last_before(&self, addr: u64) -> Option<Extent> {
        let (mut t, mut best) = (self.root, NIL);
        while t != NIL {
            let n = &self.nodes[t as usize];
            if n.start < addr {
                best = t;
                t = n.right;
            } else {
                t = n.left;
            }
        }
        (best != NIL).then(|| self.extent(best))
    }

    /// The free extent with the smallest start above `addr`.
    fn first_after(&self, addr: u64) -> Option<Extent> {
        let (mut t, mut best) = (self.root, NIL);
        while t != NIL {
            let n = &self.nodes[t as usize];
            if n.start > addr {
                best = t;
                t = n.left;
            } else {
                t = n.right;
            }
        }
        (best != NIL).then(|| self.extent(best))
    }

    /// Replaces free extent `old` by `new`; the caller guarantees that `new`
    /// keeps the address order.
    fn replace(&mut self, old: Extent, new: Extent) {
        self.root = self.rekey(self.root, old.start, new.start, new.len);
        self.free_pages = self.free_pages - old.len + new.len;
        self.digest.remove(free_element(self.payload, old));
        self.digest.add(free_element(self.payload, new));
    }

    /// Changes the extent keyed `start` to `(new_start, new_len)`; the caller
    /// guarantees `new_start` keeps the address order.
    fn rekey(&mut self, t: u32, start: u64, new_start: u64, new_len: u64) -> u32 {
        let n = &self.nodes[t as usize];
        if start == n.start {
            let n = &mut self.nodes[t as usize];
            n.start = new_start;
            n.len = new_len;
        } else if start < n.start {
            let left = n.left;
            self.rekey(left, start, new_start, new_len);
        } else {
            let right = n.right;
            self.rekey(right, start, new_start, new_len);
        }
        self.update(t);
        t
    }

    fn remove(&mut self, start: u64) {
        let (left, rest) = self.split(self.root, start);
        let (found, right) = self.split(rest, start + 1);
        debug_assert!(found != NIL && self.nodes[found as usize].left == NIL);
        let extent = self.extent(found);
        self.free_pages -= extent.len;
        self.digest.remove(free_element(self.payload, extent));
        self.extents -= 1;
        self.vacant.push(found);
        self.root = self.merge(left, right);
    }

    /// Splits `t` into extents starting below `key` and the rest.
    fn split(&mut self, t: u32, key: u64) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.nodes[t as usize].start < key {
            let (l, r) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = l;
            self.update(t);
            (t, r)
        } else {
            let (l, r) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = r;
            self.update(t);
            (l, t)
        }
    }

    /// Joins two treaps whose keys are all ordered `a < b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].priority >= self.nodes[b as usize].priority {
            let right = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = right;
            self.update(a);
            a
        } else {
            let left = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = left;
            self.update(b);
            b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_and_give_back_coalesce() {
        let mut list = FreeList::new(0, 100);
        list.take_front(0, 10);
        assert_eq!(list.extents(), vec![Extent::new(10, 90)]);
        list.take_front(10, 90);
        assert_eq!(list.extent_count(), 0);
        list.give_back(Extent::new(50, 10));
        list.give_back(Extent::new(0, 10));
        list.give_back(Extent::new(30, 10));
        assert_eq!(
            list.extents(),
            vec![Extent::new(0, 10), Extent::new(30, 10), Extent::new(50, 10)]
        );
        list.give_back(Extent::new(40, 10));
        assert_eq!(
            list.extents(),
            vec![Extent::new(0, 10), Extent::new(30, 30)]
        );
        list.give_back(Extent::new(10, 20));
        list.give_back(Extent::new(60, 40));
        assert_eq!(list.extents(), vec![Extent::new(0, 100)]);
        list.check_structure().unwrap();
    }

    #[test]
    fn first_fit_is_lowest_addressed_that_holds() {
        let mut list = FreeList::empty(0);
        for (start, len) in [(0, 2), (10, 5), (20, 3), (30, 8), (50, 5)] {
            list.insert(Extent::new(start, len));
        }
        assert_eq!(list.first_fit(1), Some(Extent::new(0, 2)));
        assert_eq!(list.first_fit(3), Some(Extent::new(10, 5)));
        assert_eq!(list.first_fit(6), Some(Extent::new(30, 8)));
        assert_eq!(list.first_fit(9), None);
        assert_eq!(list.largest(), 8);
        assert_eq!(
            list.take_prefix(9),
            vec![Extent::new(0, 2), Extent::new(10, 5), Extent::new(20, 2)]
        );
        assert_eq!(list.extents()[0], Extent::new(22, 1));
        assert_eq!(list.free_pages(), 14);
        list.check_structure().unwrap();
    }

    #[test]
    fn many_extents_keep_structure() {
        let mut list = FreeList::empty(0);
        for start in (0..80_000).step_by(8) {
            list.insert(Extent::new(start, 1 + (start / 8) % 7));
        }
        list.check_structure().unwrap();
        assert_eq!(list.extent_count(), 10_000);
        assert_eq!(list.first_fit(7).map(|e| e.start), Some(48));
        assert_eq!(list.first_fit(8), None);
    }
}
