//! The free extents of one payload pool: address-ordered, fully coalesced,
//! with the extent and page counts kept up to date.
//!
//! The extents live in an `ExtentTree` (a B+tree augmented with the largest
//! length under each child), so first fit is one root-to-leaf descent:
//! O(log F) for F free extents, never a scan of the free list.

use crate::extent::Extent;
use crate::extent_tree::{ExtentTree, GiveBack};
use crate::placement::ExtentVec;

#[derive(Clone, Debug)]
pub struct FreeList {
    tree: ExtentTree,
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
            tree: ExtentTree::default(),
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
        self.tree.max_len()
    }

    /// Takes `len` pages from the start of the lowest-addressed extent that
    /// holds them all; `None` (nothing taken) if no extent does.
    pub fn take_first_fit(&mut self, len: u64) -> Option<Extent> {
        let found = self.tree.take_first_fit(len)?;
        self.free_pages -= len;
        if found.len == len {
            self.extents -= 1;
        }
        Some(Extent::new(found.start, len))
    }

    /// Takes `len` pages from the start of free extent `extent`.
    fn take_front(&mut self, extent: Extent, len: u64) {
        debug_assert!(0 < len && len <= extent.len);
        if len == extent.len {
            self.remove(extent.start);
        } else {
            // Shrinking from the front keeps the extent between its neighbours.
            self.replace(extent, Extent::new(extent.start + len, extent.len - len));
        }
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
            // tree at once (what the loop below would take, in one pass).
            self.tree.drain(each);
            self.extents = 0;
            self.free_pages = 0;
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
        match self.tree.give_back(extent) {
            GiveBack::Inserted => self.extents += 1,
            GiveBack::MergedBefore(_) | GiveBack::MergedAfter(_) => {}
            GiveBack::Joined(..) => self.extents -= 1,
        }
    }

    /// Adds a free extent as is, without coalescing (restore, which validated
    /// that the extents are disjoint and non-adjacent).
    pub fn insert(&mut self, extent: Extent) {
        debug_assert!(extent.len > 0);
        self.tree.insert(extent);
        self.extents += 1;
        self.free_pages += extent.len;
    }

    /// Every free extent in address order.
    pub fn extents(&self) -> Vec<Extent> {
        self.tree.extents()
    }

    /// Checks the bookkeeping (tree shape, counts) against the
    /// extents; returns what is wrong.
    pub fn check_structure(&self) -> Result<(), String> {
        self.tree.check()?;
        let extents = self.extents();
        let pages: u64 = extents.iter().map(|e| e.len).sum();
        if extents.len() != self.extents || pages != self.free_pages {
            return Err(format!(
                "counts say {} extents / {} pages, tree holds {} / {pages}",
                self.extents,
                self.free_pages,
                extents.len()
            ));
        }
        Ok(())
    }

    fn remove(&mut self, start: u64) {
        let extent = self.tree.remove(start);
        self.extents -= 1;
        self.free_pages -= extent.len;
    }

    /// Replaces free extent `old` by `new` (which keeps the address order).
    fn replace(&mut self, old: Extent, new: Extent) {
        self.tree.replace(old.start, new);
        self.free_pages = self.free_pages - old.len + new.len;
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
