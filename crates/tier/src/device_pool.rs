//! `DevicePool`: the logical device pages and who holds each. A page is
//! free, held by the caller (allocated or loaded, not yet cached), or held
//! by the tree. Free pages are taken lowest first, so every rank takes the
//! same pages for the same calls.
//!
//! The pool is built lazily: pages at or above `fresh` have never been
//! taken since they were last free in one block, and are not stored, so a
//! pool's memory follows the pages in use, not its capacity (a capacity of
//! 2^32 costs nothing until pages are taken).

use std::collections::BTreeSet;

use cpkv_evict::PageId;

use crate::error::{Result, TierError};
use cpkv_hash::hash_words as term;

const FREE_PAGE: u64 = 0x4650;
const HELD_PAGE: u64 = 0x4850;

#[derive(Debug, Clone)]
pub struct DevicePool {
    capacity: u64,
    /// Every page in `fresh..capacity` is free; `fresh` is one past the
    /// highest page that is not free (0 when all are), so the
    /// representation is a function of which pages are free.
    fresh: u64,
    /// The free pages below `fresh`.
    returned: BTreeSet<PageId>,
    held: BTreeSet<PageId>,
    /// Wrapping sum of the held pages' terms and the free pages' terms,
    /// less the free terms of all `capacity` pages (a constant of the
    /// config, left out so it never has to be summed): the returned pages'
    /// terms minus those of every page below `fresh`.
    digest: u64,
}

impl DevicePool {
    /// O(1): no page is stored until it is taken.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            fresh: 0,
            returned: BTreeSet::new(),
            held: BTreeSet::new(),
            digest: 0,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn free_pages(&self) -> u64 {
        self.capacity - self.fresh + self.returned.len() as u64
    }

    pub fn held_pages(&self) -> u64 {
        self.held.len() as u64
    }

    pub fn is_held(&self, page: PageId) -> bool {
        self.held.contains(&page)
    }

    fn is_free(&self, page: PageId) -> bool {
        page >= self.fresh || self.returned.contains(&page)
    }

    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// O(pages below `fresh`).
    pub fn digest_from_scratch(&self) -> u64 {
        let below = (0..self.fresh).map(|p| term(FREE_PAGE, &[p]).wrapping_neg());
        let returned = self.returned.iter().map(|&p| term(FREE_PAGE, &[p]));
        let held = self.held.iter().map(|&p| term(HELD_PAGE, &[p]));
        below
            .chain(returned)
            .chain(held)
            .fold(0u64, u64::wrapping_add)
    }

    /// The `n` lowest free pages, now held by the caller; `None` (nothing
    /// taken) if fewer are free.
    pub fn take(&mut self, n: u64) -> Option<Vec<PageId>> {
        if n > self.free_pages() {
            return None;
        }
        let mut pages = Vec::with_capacity(n as usize);
        for _ in 0..n {
            // Returned pages all lie below `fresh`, so they come first.
            let page = self.returned.pop_first().unwrap_or_else(|| {
                self.fresh += 1;
                self.fresh - 1
            });
            // Either way the page stops being free: it leaves `returned`
            // (counted positive) or joins the range below `fresh` (counted
            // negative).
            self.digest = self
                .digest
                .wrapping_sub(term(FREE_PAGE, &[page]))
                .wrapping_add(term(HELD_PAGE, &[page]));
            self.held.insert(page);
            pages.push(page);
        }
        Some(pages)
    }

    /// Checks that `pages` are in range and distinct, and (when
    /// `caller_only`) that the caller holds every one of them.
    pub fn check(&self, pages: &[PageId], caller_only: bool) -> Result<()> {
        let mut seen = BTreeSet::new();
        for &page in pages {
            if page >= self.capacity {
                return Err(TierError::PageOutOfRange {
                    page,
                    capacity: self.capacity,
                });
            }
            if self.is_free(page) {
                return Err(TierError::PageNotHeld {
                    page,
                    why: "is free (never allocated, or already given back)",
                });
            }
            if caller_only && !self.held.contains(&page) {
                return Err(TierError::PageNotHeld {
                    page,
                    why: "is held by the cache, not by the caller",
                });
            }
            if !seen.insert(page) {
                return Err(TierError::RepeatedPage { page });
            }
        }
        Ok(())
    }

    /// A held page the tree has adopted.
    pub fn adopt(&mut self, page: PageId) {
        let was_held = self.held.remove(&page);
        debug_assert!(was_held, "adopting page {page} the caller did not hold");
        self.digest = self.digest.wrapping_sub(term(HELD_PAGE, &[page]));
    }

    /// Held pages the caller gives back.
    pub fn release_held(&mut self, pages: &[PageId]) {
        for &page in pages {
            let was_held = self.held.remove(&page);
            debug_assert!(was_held, "page {page} was not held");
            self.digest = self.digest.wrapping_sub(term(HELD_PAGE, &[page]));
            self.add_free(page);
        }
    }

    /// Pages the tree evicted.
    pub fn release_evicted(&mut self, pages: &[PageId]) {
        for &page in pages {
            debug_assert!(!self.held.contains(&page), "evicted page {page} was held");
            self.add_free(page);
        }
    }

    fn add_free(&mut self, page: PageId) {
        debug_assert!(!self.is_free(page), "page {page} freed twice");
        self.digest = self.digest.wrapping_add(term(FREE_PAGE, &[page]));
        self.returned.insert(page);
        // Free pages at the top of the taken range rejoin the untouched
        // block, which keeps the representation canonical and the set small.
        while let Some(&top) = self.returned.last() {
            if top + 1 != self.fresh {
                break;
            }
            // Leaving `returned` and the range below `fresh` at once: its
            // term cancels, the digest is unchanged.
            self.returned.pop_last();
            self.fresh = top;
        }
    }
}
