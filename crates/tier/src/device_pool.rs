//! `DevicePool`: the logical device pages and who holds each. A page is
//! free, held by the caller (allocated or loaded, not yet cached), or held
//! by the tree. Free pages are taken lowest first, so every rank takes the
//! same pages for the same calls.

use std::collections::BTreeSet;

use cpkv_evict::PageId;

use crate::error::{Result, TierError};
use cpkv_hash::hash_words as term;

const FREE_PAGE: u64 = 0x4650;
const HELD_PAGE: u64 = 0x4850;

#[derive(Debug, Clone)]
pub struct DevicePool {
    capacity: u64,
    free: BTreeSet<PageId>,
    held: BTreeSet<PageId>,
    /// Wrapping sum of the free and held pages' terms.
    digest: u64,
}

impl DevicePool {
    pub fn new(capacity: u64) -> Self {
        let mut pool = Self {
            capacity,
            free: (0..capacity).collect(),
            held: BTreeSet::new(),
            digest: 0,
        };
        pool.digest = pool.digest_from_scratch();
        pool
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn free_pages(&self) -> u64 {
        self.free.len() as u64
    }

    pub fn held_pages(&self) -> u64 {
        self.held.len() as u64
    }

    pub fn is_held(&self, page: PageId) -> bool {
        self.held.contains(&page)
    }

    pub fn digest(&self) -> u64 {
        self.digest
    }

    pub fn digest_from_scratch(&self) -> u64 {
        let free = self.free.iter().map(|&p| term(FREE_PAGE, &[p]));
        let held = self.held.iter().map(|&p| term(HELD_PAGE, &[p]));
        free.chain(held).fold(0u64, u64::wrapping_add)
    }

    /// The `n` lowest free pages, now held by the caller; `None` (nothing
    /// taken) if fewer are free.
    pub fn take(&mut self, n: u64) -> Option<Vec<PageId>> {
        if n > self.free_pages() {
            return None;
        }
        let mut pages = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let page = self.free.pop_first().expect("counted");
            self.held.insert(page);
            self.digest = self
                .digest
                .wrapping_sub(term(FREE_PAGE, &[page]))
                .wrapping_add(term(HELD_PAGE, &[page]));
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
            if self.free.contains(&page) {
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
        let fresh = self.free.insert(page);
        debug_assert!(fresh, "page {page} freed twice");
        self.digest = self.digest.wrapping_add(term(FREE_PAGE, &[page]));
    }
}
