//! The set of device pages the tree holds: one bit per page, 64 neighbouring
//! page ids to a word, words in a hash table keyed by `id / 64`.
//!
//! Engines hand out page ids from dense pools, and the pages of one node are
//! usually neighbours, so a node's pages share a word and the whole set of a
//! million-leaf tree is a few hundred kilobytes that stay in cache, where a
//! hash set of ids was tens of megabytes and every eviction missed it. Ids
//! scattered one per word cost what a hash set of ids costs (one table
//! entry each); a word whose last bit clears leaves the table, so memory is
//! bounded by the live pages whatever ids come and go. A membership set only:
//! never iterated, so its hash order cannot leak into a decision.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::ids::PageId;
use cpkv_hash::WordHashing;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageSet {
    words: HashMap<u64, u64, WordHashing>,
    len: usize,
}

#[inline]
fn split(page: PageId) -> (u64, u64) {
    (page >> 6, 1 << (page & 63))
}

impl PageSet {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn contains(&self, page: PageId) -> bool {
        let (word, bit) = split(page);
        self.words.get(&word).is_some_and(|w| w & bit != 0)
    }

    /// True when `page` was not in the set.
    pub fn insert(&mut self, page: PageId) -> bool {
        let (word, bit) = split(page);
        let w = self.words.entry(word).or_insert(0);
        let fresh = *w & bit == 0;
        *w |= bit;
        self.len += usize::from(fresh);
        fresh
    }

    /// True when `page` was in the set (the tree removes a node's pages
    /// together, `remove_all`).
    #[cfg(test)]
    pub fn remove(&mut self, page: PageId) -> bool {
        let (word, bit) = split(page);
        let Entry::Occupied(mut slot) = self.words.entry(word) else {
            return false;
        };
        if *slot.get() & bit == 0 {
            return false;
        }
        *slot.get_mut() &= !bit;
        if *slot.get() == 0 {
            slot.remove();
        }
        self.len -= 1;
        true
    }

    /// Inserts every page of `pages`, one table lookup per run of
    /// neighbours (a node's pages, usually).
    pub fn insert_all(&mut self, pages: &[PageId]) {
        for (word, bits, _) in runs(pages) {
            let w = self.words.entry(word).or_insert(0);
            self.len += (bits & !*w).count_ones() as usize;
            *w |= bits;
        }
    }

    /// Removes every page of `pages` that is in the set, one table lookup
    /// per run of neighbours.
    pub fn remove_all(&mut self, pages: &[PageId]) {
        for (word, bits, _) in runs(pages) {
            if let Entry::Occupied(mut slot) = self.words.entry(word) {
                self.len -= (*slot.get() & bits).count_ones() as usize;
                *slot.get_mut() &= !bits;
                if *slot.get() == 0 {
                    slot.remove();
                }
            }
        }
    }

    /// The first page of `pages` (in their order) that is in the set.
    pub fn first_held(&self, pages: &[PageId]) -> Option<PageId> {
        runs(pages).find_map(|(word, bits, run)| {
            let held = self.words.get(&word).map_or(0, |w| w & bits);
            (held != 0).then(|| {
                let page = run.iter().find(|&&p| held & split(p).1 != 0);
                *page.expect("a held bit is one of the run's")
            })
        })
    }

    /// Table entries in use.
    #[cfg(test)]
    pub fn words(&self) -> usize {
        self.words.len()
    }
}

/// `pages` cut into maximal runs that share a word: (word, their bits, the run).
fn runs(pages: &[PageId]) -> impl Iterator<Item = (u64, u64, &[PageId])> + '_ {
    let mut rest = pages;
    std::iter::from_fn(move || {
        let word = split(*rest.first()?).0;
        let len = rest.iter().take_while(|&&p| split(p).0 == word).count();
        let (run, after) = rest.split_at(len);
        rest = after;
        let bits = run.iter().fold(0, |bits, &p| bits | split(p).1);
        Some((word, bits, run))
    })
}

impl Extend<PageId> for PageSet {
    fn extend<I: IntoIterator<Item = PageId>>(&mut self, pages: I) {
        for page in pages {
            self.insert(page);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(PageId),
        Remove(PageId),
        InsertAll(Vec<PageId>),
        RemoveAll(Vec<PageId>),
        FirstHeld(Vec<PageId>),
    }

    /// Ids near zero (shared words), near a word edge and near u64::MAX.
    fn page() -> impl Strategy<Value = PageId> {
        prop_oneof![0..200u64, 60..70u64, (u64::MAX - 70)..=u64::MAX]
    }

    fn op() -> impl Strategy<Value = Op> {
        let pages = || proptest::collection::vec(page(), 0..8);
        prop_oneof![
            page().prop_map(Op::Insert),
            page().prop_map(Op::Remove),
            pages().prop_map(Op::InsertAll),
            pages().prop_map(Op::RemoveAll),
            pages().prop_map(Op::FirstHeld),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_an_ordered_set(ops in proptest::collection::vec(op(), 0..300)) {
            let (mut set, mut model) = (PageSet::default(), BTreeSet::new());
            for op in ops {
                match op {
                    Op::Insert(p) => prop_assert_eq!(set.insert(p), model.insert(p)),
                    Op::Remove(p) => prop_assert_eq!(set.remove(p), model.remove(&p)),
                    Op::InsertAll(pages) => {
                        set.insert_all(&pages);
                        model.extend(pages);
                    }
                    Op::RemoveAll(pages) => {
                        set.remove_all(&pages);
                        pages.iter().for_each(|p| { model.remove(p); });
                    }
                    Op::FirstHeld(pages) => {
                        let want = pages.iter().copied().find(|p| model.contains(p));
                        prop_assert_eq!(set.first_held(&pages), want);
                    }
                }
                prop_assert_eq!(set.len(), model.len());
                let words: BTreeSet<u64> = model.iter().map(|p| p >> 6).collect();
                prop_assert_eq!(set.words(), words.len(), "no empty word is kept");
                for p in [0, 63, 64, 127, 199, u64::MAX] {
                    prop_assert_eq!(set.contains(p), model.contains(&p));
                }
            }
        }
    }

    #[test]
    fn equal_sets_compare_equal_whatever_the_history() {
        let mut a = PageSet::default();
        a.extend([5, 70, 900]);
        a.remove(70);
        let mut b = PageSet::default();
        b.extend([900, 5]);
        assert_eq!(a, b);
        b.insert(6);
        assert_ne!(a, b);
    }

    #[test]
    fn neighbouring_pages_share_a_word() {
        let mut s = PageSet::default();
        s.extend(0..3000);
        assert_eq!((s.len(), s.words()), (3000, 3000usize.div_ceil(64)));
    }
}
