//! The free extents of one payload pool: address-ordered, fully coalesced,
//! with the extent and page counts kept up to date.
//!
//! Few free extents (up to `FLAT`, the common case of a full host whose
//! evictions free just what the next batch needs) live in a flat sorted
//! array: first fit, take and give back are a short scan with no node to
//! follow. Past `FLAT` they move into an `ExtentTree` (a B+tree augmented
//! with the largest length under each child), so first fit is one
//! root-to-leaf descent, O(log F) for F free extents, never a scan of the
//! free list; they move back once `FLAT / 4` or fewer remain. Which of the
//! two holds them is never read by a decision: both hold the same extents
//! in the same order and answer every question alike.
//!
//! Not a bitmap of free pages: one was measured (branch h-rowbits) and
//! freed single engine rows faster, but its first fit visits every word that
//! holds a free page, 7x to 30x slower on the allocator's stream bench of a
//! fragmented pool, where the tree descends once.

use crate::extent::Extent;
use crate::extent_tree::{ExtentTree, GiveBack};
use crate::placement::ExtentVec;

/// The most free extents the flat array holds.
const FLAT: usize = 32;
/// Back from the tree to the flat array at this many extents or fewer.
const FLAT_AGAIN: usize = FLAT / 4;

#[derive(Clone, Debug)]
pub struct FreeList {
    /// The extents by start while `in_tree` is false (`extents` of them).
    flat: [Extent; FLAT],
    tree: ExtentTree,
    in_tree: bool,
    extents: usize,
    free_pages: u64,
}

impl FreeList {
    /// A pool of `capacity` pages of `payload`, all free.
    pub fn new(capacity: u64) -> Self {
        let mut list = FreeList::empty();
        list.insert(Extent::new(0, capacity));
        list
    }

    /// No free pages at all (restore fills it extent by extent).
    pub fn empty() -> Self {
        FreeList {
            flat: [Extent::new(0, 0); FLAT],
            tree: ExtentTree::default(),
            in_tree: false,
            extents: 0,
            free_pages: 0,
        }
    }

    pub fn free_pages(&self) -> u64 {
        self.free_pages
    }

    pub fn extent_count(&self) -> usize {
        self.extents
    }

    pub fn largest(&self) -> u64 {
        if self.in_tree {
            self.tree.max_len()
        } else {
            self.flat().iter().map(|e| e.len).max().unwrap_or(0)
        }
    }

    fn flat(&self) -> &[Extent] {
        &self.flat[..self.extents]
    }

    /// Takes `len` pages from the start of the lowest-addressed extent that
    /// holds them all; `None` (nothing taken) if no extent does.
    pub fn take_first_fit(&mut self, len: u64) -> Option<Extent> {
        if self.in_tree {
            let found = self.tree.take_first_fit(len)?;
            self.free_pages -= len;
            if found.len == len {
                self.extents -= 1;
                self.maybe_flatten();
            }
            return Some(Extent::new(found.start, len));
        }
        let i = self.flat().iter().position(|e| e.len >= len)?;
        let found = self.flat[i];
        self.free_pages -= len;
        if found.len == len {
            self.flat_remove(i, 1);
        } else {
            self.flat[i] = Extent::new(found.start + len, found.len - len);
        }
        Some(Extent::new(found.start, len))
    }

    /// Takes `len` pages from the start of free extent `extent` (tree).
    fn take_front(&mut self, extent: Extent, len: u64) {
        debug_assert!(0 < len && len <= extent.len);
        if len == extent.len {
            self.tree.remove(extent.start);
            self.extents -= 1;
        } else {
            // Shrinking from the front keeps the extent between its neighbours.
            self.tree.replace(
                extent.start,
                Extent::new(extent.start + len, extent.len - len),
            );
        }
        self.free_pages -= len;
    }

    /// Takes the lowest-addressed `len` free pages (no more than are free):
    /// whole extents in address order, the last one from its start; appends
    /// them to `taken`.
    pub(crate) fn take_prefix(&mut self, len: u64, taken: &mut ExtentVec) {
        self.take_prefix_each(len, |e| taken.push(e));
    }

    /// `take_prefix` handing each extent taken to `each`, in address order.
    fn take_prefix_each(&mut self, len: u64, mut each: impl FnMut(Extent)) {
        assert!(
            len <= self.free_pages,
            "only {} pages free",
            self.free_pages
        );
        if len == self.free_pages {
            // Every free page goes: hand the extents out and empty the
            // list at once (what the loops below would take, in one pass).
            if self.in_tree {
                self.tree.drain(each);
                self.in_tree = false;
            } else {
                self.flat().iter().for_each(|&e| each(e));
            }
            self.extents = 0;
            self.free_pages = 0;
            return;
        }
        if !self.in_tree {
            let mut missing = len;
            let mut whole = 0;
            while missing > 0 {
                let first = self.flat[whole];
                let take = first.len.min(missing);
                each(Extent::new(first.start, take));
                missing -= take;
                if take == first.len {
                    whole += 1;
                } else {
                    self.flat[whole] = Extent::new(first.start + take, first.len - take);
                }
            }
            self.free_pages -= len;
            self.flat_remove(0, whole);
            return;
        }
        let mut missing = len;
        while missing > 0 {
            let first = self.tree.first().expect("free pages were counted");
            let take = first.len.min(missing);
            self.take_front(first, take);
            each(Extent::new(first.start, take));
            missing -= take;
        }
        self.maybe_flatten();
    }

    /// A batch of `len` pages (no more than are free), placed as one
    /// object's: the front of the lowest-addressed extent that holds them
    /// all, else the lowest free pages (`take_prefix`). Hands each extent
    /// taken to `each`, in address order.
    pub(crate) fn take_batch(&mut self, len: u64, mut each: impl FnMut(Extent)) {
        match self.take_first_fit(len) {
            Some(extent) => each(extent),
            None => self.take_prefix_each(len, each),
        }
    }

    /// Returns `extent` (not overlapping any free extent) to the pool, merging
    /// it with the free extents that touch it on either side.
    pub fn give_back(&mut self, extent: Extent) {
        self.free_pages += extent.len;
        if self.in_tree {
            match self.tree.give_back(extent) {
                GiveBack::Inserted => self.extents += 1,
                GiveBack::MergedBefore(_) | GiveBack::MergedAfter(_) => {}
                GiveBack::Joined(..) => {
                    self.extents -= 1;
                    self.maybe_flatten();
                }
            }
            return;
        }
        let n = self.extents;
        let at = self
            .flat()
            .iter()
            .take_while(|e| e.start < extent.start)
            .count();
        let touches_before = at > 0 && self.flat[at - 1].end() == extent.start;
        let touches_after = at < n && self.flat[at].start == extent.end();
        match (touches_before, touches_after) {
            (true, true) => {
                self.flat[at - 1].len += extent.len + self.flat[at].len;
                self.flat_remove(at, 1);
            }
            (true, false) => self.flat[at - 1].len += extent.len,
            (false, true) => {
                let after = self.flat[at];
                self.flat[at] = Extent::new(extent.start, extent.len + after.len);
            }
            (false, false) if n < FLAT => {
                self.flat.copy_within(at..n, at + 1);
                self.flat[at] = extent;
                self.extents += 1;
            }
            (false, false) => {
                self.spill();
                self.tree.insert(extent);
                self.extents += 1;
            }
        }
    }

    /// Adds a free extent as is, without coalescing (restore, which validated
    /// that the extents are disjoint and non-adjacent, in address order).
    pub fn insert(&mut self, extent: Extent) {
        debug_assert!(extent.len > 0);
        if !self.in_tree && self.extents == FLAT {
            self.spill();
        }
        if self.in_tree {
            self.tree.insert(extent);
        } else {
            let at = self
                .flat()
                .iter()
                .take_while(|e| e.start < extent.start)
                .count();
            self.flat.copy_within(at..self.extents, at + 1);
            self.flat[at] = extent;
        }
        self.extents += 1;
        self.free_pages += extent.len;
    }

    /// Every free extent in address order.
    pub fn extents(&self) -> Vec<Extent> {
        if self.in_tree {
            self.tree.extents()
        } else {
            self.flat().to_vec()
        }
    }

    /// Checks the bookkeeping (tree shape, flat order, counts) against the
    /// extents; returns what is wrong.
    pub fn check_structure(&self) -> Result<(), String> {
        if self.in_tree {
            self.tree.check()?;
        } else if self.flat().windows(2).any(|w| w[0].start >= w[1].start) {
            return Err("flat free extents out of address order".into());
        }
        let extents = self.extents();
        let pages: u64 = extents.iter().map(|e| e.len).sum();
        if extents.len() != self.extents || pages != self.free_pages {
            return Err(format!(
                "counts say {} extents / {} pages, list holds {} / {pages}",
                self.extents,
                self.free_pages,
                extents.len()
            ));
        }
        Ok(())
    }

    /// Removes `count` flat extents from index `at`.
    fn flat_remove(&mut self, at: usize, count: usize) {
        self.flat.copy_within(at + count..self.extents, at);
        self.extents -= count;
    }

    /// Moves the flat extents into the (empty) tree.
    fn spill(&mut self) {
        debug_assert!(!self.in_tree && self.tree.extents().is_empty());
        for &extent in &self.flat[..self.extents] {
            self.tree.insert(extent);
        }
        self.in_tree = true;
    }

    /// Moves the tree's extents back into the flat array once few remain.
    fn maybe_flatten(&mut self) {
        if self.in_tree && self.extents <= FLAT_AGAIN {
            let (flat, mut n) = (&mut self.flat, 0);
            self.tree.drain(|e| {
                flat[n] = e;
                n += 1;
            });
            debug_assert_eq!(n, self.extents);
            self.in_tree = false;
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_and_give_back_coalesce() {
        let mut list = FreeList::new(100);
        assert_eq!(list.take_first_fit(10), Some(Extent::new(0, 10)));
        assert_eq!(list.extents(), vec![Extent::new(10, 90)]);
        assert_eq!(list.take_first_fit(90), Some(Extent::new(10, 90)));
        assert_eq!(list.extent_count(), 0);
        assert_eq!(list.take_first_fit(1), None);
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
        let mut list = FreeList::empty();
        for (start, len) in [(0, 2), (10, 5), (20, 3), (30, 8), (50, 5)] {
            list.insert(Extent::new(start, len));
        }
        assert_eq!(list.take_first_fit(9), None);
        assert_eq!(list.take_first_fit(6), Some(Extent::new(30, 6)));
        assert_eq!(list.take_first_fit(3), Some(Extent::new(10, 3)));
        assert_eq!(list.take_first_fit(1), Some(Extent::new(0, 1)));
        assert_eq!(list.largest(), 5);
        let mut taken = ExtentVec::default();
        list.take_prefix(6, &mut taken);
        assert_eq!(
            taken.as_slice(),
            vec![Extent::new(1, 1), Extent::new(13, 2), Extent::new(20, 3)]
        );
        assert_eq!(list.extents(), vec![Extent::new(36, 2), Extent::new(50, 5)]);
        assert_eq!(list.free_pages(), 7);
        list.check_structure().unwrap();
    }

    #[test]
    fn extents_move_between_the_flat_array_and_the_tree() {
        let mut list = FreeList::new(1_000);
        // Every other page taken: one more free extent per page taken.
        let mut taken = ExtentVec::default();
        list.take_prefix(1_000, &mut taken);
        assert_eq!((list.extent_count(), list.in_tree), (0, false));
        for page in (0..2 * FLAT as u64 + 4).step_by(2) {
            list.give_back(Extent::new(page, 1));
            assert_eq!(list.in_tree, list.extent_count() > FLAT);
            list.check_structure().unwrap();
        }
        assert!(list.in_tree);
        // Filling the gaps joins extents until few are left: back to flat.
        for page in (1..2 * FLAT as u64 + 2).step_by(2) {
            list.give_back(Extent::new(page, 1));
            list.check_structure().unwrap();
        }
        assert_eq!(list.extents(), vec![Extent::new(0, 2 * FLAT as u64 + 3)]);
        assert!(!list.in_tree);
        assert_eq!(list.take_first_fit(2), Some(Extent::new(0, 2)));
        assert_eq!(list.largest(), 2 * FLAT as u64 + 1);
        list.check_structure().unwrap();
    }

    #[test]
    fn many_extents_keep_structure() {
        let mut list = FreeList::empty();
        for start in (0..80_000).step_by(8) {
            list.insert(Extent::new(start, 1 + (start / 8) % 7));
        }
        list.check_structure().unwrap();
        assert_eq!(list.extent_count(), 10_000);
        assert_eq!(list.take_first_fit(8), None);
        assert_eq!(list.take_first_fit(7), Some(Extent::new(48, 7)));
        assert_eq!(list.extent_count(), 9_999);
        list.check_structure().unwrap();
    }
}

#[cfg(test)]
#[path = "free_list_model.rs"]
mod model;
