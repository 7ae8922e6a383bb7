//! `TierConfig`: the cache's shape, validated once. Every rank must build
//! its cache from the same config (the digest covers it).

use cpkv_evict::Policy;

use crate::error::{Result, TierError};

/// The most pages either tier may have: the host allocator's own limit, so
/// one number bounds device pages, host pages, the binding and the engine
/// configs that size a cache.
pub const MAX_PAGES: u64 = cpkv_allocator::MAX_CAPACITY;
/// The most CP ranks a cache may be shared by.
pub const MAX_CP_SIZE: u64 = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierConfig {
    /// Tokens per page.
    pub page_size: usize,
    /// CP ranks; `ownership` says which rank holds which logical page.
    pub cp_size: u64,
    /// Logical device (L1) pages over all ranks.
    pub device_pages: u64,
    /// Host (L2) slab pages, shared by the node's ranks.
    pub host_pages: u64,
    /// Eviction policy of both tiers.
    pub policy: Policy,
    /// Free host pages that admission evicts toward, best effort, once a
    /// backup does not fit; a backup that fits never evicts.
    pub host_free_target: u64,
}

impl TierConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TierError::Config { field, reason });
        let max_page_size = cpkv_evict::MAX_PAGE_SIZE;
        if self.page_size == 0 || self.page_size > max_page_size {
            return bad(
                "page_size",
                format!("{} is not in 1..={max_page_size}", self.page_size),
            );
        }
        if self.cp_size == 0 || self.cp_size > MAX_CP_SIZE {
            return bad(
                "cp_size",
                format!("{} is not in 1..={MAX_CP_SIZE}", self.cp_size),
            );
        }
        if self.device_pages < self.cp_size || self.device_pages > MAX_PAGES {
            return bad(
                "device_pages",
                format!(
                    "{} must hold at least one page per rank ({}) and at most {MAX_PAGES}",
                    self.device_pages, self.cp_size
                ),
            );
        }
        if self.host_pages == 0 || self.host_pages > MAX_PAGES {
            return bad(
                "host_pages",
                format!("{} is not in 1..={MAX_PAGES}", self.host_pages),
            );
        }
        if self.host_free_target > self.host_pages {
            return bad(
                "host_free_target",
                format!(
                    "{} exceeds host_pages {}",
                    self.host_free_target, self.host_pages
                ),
            );
        }
        Ok(())
    }
}
