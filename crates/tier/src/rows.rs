//! `RowStack`: the host tier's one row placement, a stack of free slab rows.
//!
//! Rows never handed out are taken in ascending order; a freed group of
//! rows is pushed last-first, so the next take of that many pops them back
//! in their ascending order (a freed backup's rows return as one run).
//! Chosen over the first-fit `PageAllocator` by `benches/rows.rs`: on the
//! engines' one-row-per-block churn the stack is many times faster per row,
//! and on the main job's groups of 1..=8 rows it gives about as few runs per
//! group (see the README's "What is in the box").
//!
//! Every take and give-back is a function of the calls alone, so two stacks
//! fed the same calls hand out the same rows. `digest` covers the counts;
//! which rows are in use is digested by their holders (the engine index's
//! chunks, the main job's host objects), so a row is hashed once, not twice.

use cpkv_hash::hash_words;

use crate::error::{Result, TierError};

const ROW_TAG: u64 = 0x726f_7773_7573_6564; // "rowsused"

/// The most rows a stack holds: row numbers fit a u32.
pub const MAX_ROWS: u64 = 1 << 32;

#[derive(Debug, Clone)]
pub struct RowStack {
    capacity: u64,
    /// Rows below this have been handed out at least once.
    fresh_from: u64,
    free: Vec<u32>,
    used: u64,
}

impl RowStack {
    pub fn new(capacity: u64) -> Result<Self> {
        if capacity == 0 || capacity > MAX_ROWS {
            return Err(TierError::Config {
                field: "rows",
                reason: format!("must be in [1, {MAX_ROWS}], got {capacity}"),
            });
        }
        Ok(Self {
            capacity,
            fresh_from: 0,
            free: Vec::new(),
            used: 0,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn used(&self) -> u64 {
        self.used
    }
    pub fn free(&self) -> u64 {
        self.capacity - self.used
    }

    /// `n` rows, all or nothing: `None` when fewer are free.
    pub fn take(&mut self, n: u64) -> Option<Vec<u32>> {
        if n > self.free() {
            return None;
        }
        let rows: Vec<u32> = (0..n).map(|_| self.take_one()).collect();
        Some(rows)
    }

    /// One row; the caller has checked that one is free.
    pub fn take_one(&mut self) -> u32 {
        debug_assert!(self.used < self.capacity, "a row is free");
        let row = self.free.pop().unwrap_or_else(|| {
            self.fresh_from += 1;
            (self.fresh_from - 1) as u32
        });
        self.used += 1;
        row
    }

    /// Frees `rows` (each in use); the next `take(rows.len())` returns them
    /// in this order.
    pub fn give_back(&mut self, rows: &[u32]) {
        self.free.extend(rows.iter().rev());
        self.used -= rows.len() as u64;
    }

    /// The counts: rows in use, rows ever handed out, capacity.
    pub fn digest(&self) -> u64 {
        hash_words(ROW_TAG, &[self.used, self.fresh_from, self.capacity])
    }

    /// Conservation: every row is free or used, once.
    pub fn check(&self) -> std::result::Result<(), String> {
        let free = self.free.len() as u64 + (self.capacity - self.fresh_from);
        if free + self.used != self.capacity {
            return Err(format!(
                "rows not conserved: {} free + {} used != {}",
                free, self.used, self.capacity
            ));
        }
        let mut seen = vec![false; self.fresh_from as usize];
        for &row in &self.free {
            if u64::from(row) >= self.fresh_from || std::mem::replace(&mut seen[row as usize], true)
            {
                return Err(format!(
                    "free row {row} is listed twice or never handed out"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_group_comes_back_in_order_and_the_digest_follows_the_used_rows() {
        let mut rows = RowStack::new(8).unwrap();
        let a = rows.take(3).unwrap();
        let b = rows.take(2).unwrap();
        assert_eq!((a.as_slice(), b.as_slice()), (&[0, 1, 2][..], &[3, 4][..]));
        let before = rows.digest();
        rows.give_back(&a);
        assert_ne!(rows.digest(), before);
        assert_eq!(rows.take(3).unwrap(), a);
        assert_eq!(rows.digest(), before);
        assert_eq!(rows.take(4), None, "3 free, all or nothing");
        assert_eq!(rows.take(3).unwrap(), [5, 6, 7]);
        rows.check().unwrap();
        assert!(RowStack::new(0).is_err() && RowStack::new(MAX_ROWS + 1).is_err());
    }
}
