//! Pages held by page number: one bit per page of a pool.
//!
//! `reserve_held` hands out pages that belong to no object: the caller
//! names each by its page number when it frees it (the engines free their
//! rows one block at a time, in eviction order, and already know every
//! row). A set bit is the whole bookkeeping, so a held page costs no object,
//! no placement and no key lookup. The bitset grows to the highest page
//! ever held, never to the pool's capacity.

use crate::extent::Extent;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HeldPages {
    words: Vec<u64>,
    count: u64,
}

impl HeldPages {
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    #[inline]
    pub(crate) fn contains(&self, page: u64) -> bool {
        let word = (page / 64) as usize;
        self.words
            .get(word)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    /// Marks the pages of `extent` held (none of them is).
    #[inline]
    pub(crate) fn insert_extent(&mut self, extent: Extent) {
        let last = ((extent.end() - 1) / 64) as usize;
        if self.words.len() <= last {
            self.words.resize(last + 1, 0);
        }
        let mut page = extent.start;
        let end = extent.end();
        while page < end {
            let bit = page % 64;
            let span = (64 - bit).min(end - page);
            let mask = if span == 64 {
                u64::MAX
            } else {
                ((1u64 << span) - 1) << bit
            };
            let word = &mut self.words[(page / 64) as usize];
            debug_assert_eq!(*word & mask, 0, "page held twice");
            *word |= mask;
            page += span;
        }
        self.count += extent.len;
    }

    /// Clears `page`; `false` (nothing changed) if it was not held.
    #[inline]
    pub(crate) fn remove(&mut self, page: u64) -> bool {
        let Some(word) = self.words.get_mut((page / 64) as usize) else {
            return false;
        };
        let bit = 1u64 << (page % 64);
        if *word & bit == 0 {
            return false;
        }
        *word &= !bit;
        self.count -= 1;
        true
    }

    /// Marks one page held again (undoing a `remove`).
    pub(crate) fn restore(&mut self, page: u64) {
        self.insert_extent(Extent::new(page, 1));
    }

    /// Every held page in ascending order.
    pub(crate) fn pages(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros() as u64;
                rest &= rest - 1;
                Some(i as u64 * 64 + bit)
            })
        })
    }

    /// The held pages as maximal runs, in address order.
    pub(crate) fn extents(&self) -> Vec<Extent> {
        let mut out: Vec<Extent> = Vec::new();
        for page in self.pages() {
            match out.last_mut() {
                Some(last) if last.end() == page => last.len += 1,
                _ => out.push(Extent::new(page, 1)),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_round_trip_across_words() {
        let mut held = HeldPages::default();
        held.insert_extent(Extent::new(3, 2));
        held.insert_extent(Extent::new(60, 70));
        held.insert_extent(Extent::new(200, 1));
        assert_eq!(held.count(), 73);
        assert_eq!(
            held.extents(),
            vec![Extent::new(3, 2), Extent::new(60, 70), Extent::new(200, 1)]
        );
        assert!(held.contains(64) && !held.contains(130) && !held.contains(9999));
        assert!(held.remove(64) && !held.remove(64) && !held.remove(9999));
        assert_eq!(held.count(), 72);
        held.restore(64);
        assert_eq!(held.extents()[1], Extent::new(60, 70));
    }
}
