//! `HostRows`: the host tier's one row placement, the design's deterministic
//! first-fit `PageAllocator` over one pool of slab rows.
//!
//! One reservation per batch of pages: the main job reserves one object per
//! backup (freed whole), the engines reserve a store call's rows with
//! `reserve_rows` and hold them by row number (freed block by block, in
//! eviction order, with `release_row`: no allocator object, no key). Either
//! way the batch is placed as one request: the lowest-addressed free extent
//! that holds it whole, else the lowest free rows, so a batch comes in as
//! few copy runs as the free space allows; a free coalesces with its free
//! neighbours.
//!
//! Every placement is a function of the calls alone, so two `HostRows` fed
//! the same calls hand out the same rows. `digest` is the allocator's
//! (configuration, every object's rows at their positions, every held row);
//! it is part of the host core's digest.

use cpkv_allocator::{AllocError, PageAllocator, PayloadId};

use crate::error::{Result, TierError};

/// The most rows a host holds: row numbers fit a u32.
pub const MAX_ROWS: u64 = cpkv_allocator::MAX_CAPACITY;

/// The one payload: the host slab's rows.
const SLAB: PayloadId = 0;

#[derive(Debug, Clone)]
pub struct HostRows {
    allocator: PageAllocator,
    /// Rows of the last `reserve_rows`, reused so a store call allocates
    /// no scratch.
    scratch: Vec<u64>,
}

impl HostRows {
    pub fn new(capacity: u64) -> Result<Self> {
        if capacity == 0 || capacity > MAX_ROWS {
            return Err(TierError::Config {
                field: "rows",
                reason: format!("must be in [1, {MAX_ROWS}], got {capacity}"),
            });
        }
        let allocator =
            PageAllocator::new(&[("slab", capacity)]).map_err(|e| TierError::Config {
                field: "rows",
                reason: e.to_string(),
            })?;
        Ok(Self {
            allocator,
            scratch: Vec::new(),
        })
    }

    pub fn capacity(&self) -> u64 {
        self.allocator.payloads().capacity(SLAB)
    }
    pub fn used(&self) -> u64 {
        self.capacity() - self.free()
    }
    pub fn free(&self) -> u64 {
        self.allocator.free_pages(SLAB)
    }
    /// The allocator under the rows (placements, free extents, stats).
    pub fn allocator(&self) -> &PageAllocator {
        &self.allocator
    }

    /// `n` rows for object `key` (not live), all or nothing: `None` when
    /// fewer are free. The rows in object position order.
    pub fn reserve(&mut self, key: u64, n: u64) -> Result<Option<Vec<u32>>> {
        let mut rows = Vec::with_capacity(n as usize);
        Ok(self.reserve_into(key, n, &mut rows)?.then_some(rows))
    }

    /// `reserve` appending the rows to `rows`; `false` (nothing appended)
    /// when fewer are free.
    pub fn reserve_into(&mut self, key: u64, n: u64, rows: &mut Vec<u32>) -> Result<bool> {
        let Some(placement) = self.allocator.reserve_one(key, n, SLAB).map_err(diverged)? else {
            return Ok(false);
        };
        let extents = placement.extents(SLAB).expect("the slab payload");
        rows.extend(
            extents
                .iter()
                .flat_map(|e| e.start..e.end())
                .map(|row| row as u32),
        );
        Ok(true)
    }

    /// `n` rows held by row number, placed as one batch (in address
    /// order), each freed on its own by `release_row`; all or nothing:
    /// `None` when fewer are free.
    pub fn reserve_rows(&mut self, n: u64) -> Result<Option<&[u64]>> {
        self.scratch.clear();
        let placed = self
            .allocator
            .reserve_held(SLAB, n, &mut self.scratch)
            .map_err(diverged)?;
        Ok(placed.then_some(self.scratch.as_slice()))
    }

    /// Frees held row `row`.
    pub fn release_row(&mut self, row: u64) -> Result<()> {
        self.allocator.release_held(SLAB, row).map_err(diverged)
    }

    /// Frees every held row of `rows`; a rejected batch frees nothing.
    pub fn release_rows(&mut self, rows: &[u64]) -> Result<()> {
        self.allocator
            .release_held_many(SLAB, rows)
            .map_err(diverged)
    }

    /// Frees object `key`'s rows.
    pub fn release(&mut self, key: u64) -> Result<()> {
        self.allocator.release(key).map_err(diverged)
    }

    /// Frees every object of `keys`; a rejected batch frees nothing.
    pub fn release_many(&mut self, keys: &[u64]) -> Result<()> {
        self.allocator.release_many(keys).map_err(diverged)
    }

    /// The allocator's digest: every object's rows at their positions.
    pub fn digest(&self) -> u64 {
        self.allocator.digest()
    }

    /// Conservation and coalescing, recomputed: every row free or in one
    /// object, free extents fully merged, the digest as kept.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.allocator.verify()
    }
}

/// The host core's callers name objects it tracks itself, so an allocator
/// refusal means the two disagree.
fn diverged(err: AllocError) -> TierError {
    TierError::Divergence(format!("host rows: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_fills_the_lowest_hole_that_holds_it_and_frees_coalesce() {
        let mut rows = HostRows::new(8).unwrap();
        assert_eq!(rows.reserve(1, 3).unwrap().unwrap(), [0, 1, 2]);
        assert_eq!(rows.reserve_rows(2).unwrap().unwrap(), [3, 4]);
        assert_eq!(rows.reserve(2, 3).unwrap().unwrap(), [5, 6, 7]);
        let full = rows.digest();
        rows.release(1).unwrap();
        rows.release_row(4).unwrap();
        // Row 4 freed beside rows 0..3: two holes, [0, 3) and [4, 5).
        assert_eq!(rows.free(), 4);
        assert_ne!(rows.digest(), full);
        assert_eq!(rows.reserve_rows(2).unwrap().unwrap(), [0, 1]);
        assert_eq!(rows.reserve(3, 3).unwrap(), None, "2 free, all or nothing");
        assert_eq!(rows.reserve(3, 2).unwrap().unwrap(), [2, 4]);
        rows.check().unwrap();
        assert!(rows.release(1).is_err(), "released twice");
        assert!(rows.release_row(4).is_err(), "row 4 is an object's now");
        assert!(rows.release_rows(&[3, 3]).is_err(), "repeated");
        rows.release_rows(&[3, 0]).unwrap();
        assert_eq!(rows.free(), 2);
        rows.check().unwrap();
        assert!(HostRows::new(0).is_err() && HostRows::new(MAX_ROWS + 1).is_err());
    }
}
