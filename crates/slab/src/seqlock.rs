//! The row seqlock: per slab row a stamp and a key tag (int64 each, in the
//! node's shared memory, so every access is atomic).
//!
//! A row's one writer stamps it `-handle` ([`RowStamps::invalidate`]), a full
//! fence ([`copies_done`]), copies, a full fence, then sets the tag and stamps
//! it `handle` ([`RowStamps::publish`]). A reader checks stamp and tag before
//! and after it copies ([`RowStamps::holds`], an acquire fence between the
//! copy and the second check), so a row overwritten under it is a miss, never
//! torn bytes; a tag that differs (a rank whose index diverged) is a miss,
//! never another key's page.

use std::sync::atomic::{fence, AtomicI64, Ordering};

use cpkv_hash::Hasher64;

use crate::region::{prefetch, Region};

/// The seed of a key's tag (distinct from the index's own key tokens).
const KEY_TAG: u64 = 0x7367_6c61_6e67_7467; // "sglangtg"

/// A key's tag: 64 bits of `cpkv_hash` over its bytes, the same in every process.
pub fn key_tag(key: &[u8]) -> i64 {
    Hasher64::new(KEY_TAG).bytes(key).finish() as i64
}

/// Orders every byte copied before it against every stamp stored after it (a
/// full fence: it orders the streaming stores a copy may use, too).
pub fn copies_done() {
    fence(Ordering::SeqCst);
}

/// One row a writer publishes: its row, the page's handle and key tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowWrite {
    pub row: u64,
    pub handle: i64,
    pub tag: i64,
}

/// The stamps and tags of `rows` rows.
#[derive(Clone, Copy, Debug)]
pub struct RowStamps {
    stamps: Region,
    tags: Region,
    rows: u64,
}

impl RowStamps {
    /// `stamps` and `tags`: `rows` aligned int64 each.
    pub fn new(stamps: Region, tags: Region, rows: u64) -> Result<Self, String> {
        let aligned = |r: &Region| r.address().is_multiple_of(8) && r.len() as u64 == rows * 8;
        if !aligned(&stamps) || !aligned(&tags) || stamps.overlaps(&tags) {
            return Err(format!(
                "stamps ({} bytes) and tags ({} bytes) are not {rows} aligned, separate int64 each",
                stamps.len(),
                tags.len()
            ));
        }
        Ok(Self { stamps, tags, rows })
    }

    /// Whether either region shares a byte with `other`.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.stamps.overlaps(other) || self.tags.overlaps(other)
    }

    /// The stamp and tag of a row (`row < rows`, checked).
    fn cells(&self, row: u64) -> Result<(&AtomicI64, &AtomicI64), String> {
        if row >= self.rows {
            return Err(format!(
                "slab row {row} is outside the slab's {} rows",
                self.rows
            ));
        }
        Ok((
            self.stamps.atomic_i64(row * 8),
            self.tags.atomic_i64(row * 8),
        ))
    }

    /// Starts fetching the stamp and tag of each row (rows outside the slab
    /// skipped), so a batch's misses overlap before its rows are checked one
    /// by one; a hint, it reads nothing.
    pub fn prefetch_rows(&self, rows: impl IntoIterator<Item = u64>) {
        for row in rows.into_iter().filter(|&row| row < self.rows) {
            prefetch(self.stamps.address_of(row * 8));
            prefetch(self.tags.address_of(row * 8));
        }
    }

    /// Whether `row` holds the page stamped `handle` with key tag `tag` now.
    pub fn holds(&self, row: u64, handle: i64, tag: i64) -> Result<bool, String> {
        let (stamp, key) = self.cells(row)?;
        Ok(stamp.load(Ordering::Acquire) == handle && key.load(Ordering::Acquire) == tag)
    }

    /// Whether `row` holds a fully written page (any handle) of key tag `tag`.
    pub fn carries(&self, row: u64, tag: i64) -> Result<bool, String> {
        let (stamp, key) = self.cells(row)?;
        Ok(stamp.load(Ordering::Acquire) > 0 && key.load(Ordering::Acquire) == tag)
    }

    /// The stamp of `row` (`-handle` while a write of `handle` is under way).
    pub fn stamp(&self, row: u64) -> Result<i64, String> {
        Ok(self.cells(row)?.0.load(Ordering::Acquire))
    }

    /// Marks `row` invalid while its bytes change.
    pub fn invalidate(&self, row: u64, handle: i64) -> Result<(), String> {
        self.cells(row)?.0.store(-handle, Ordering::Release);
        Ok(())
    }

    /// Publishes `row` as the page of `handle` with key tag `tag`.
    pub fn publish(&self, row: u64, handle: i64, tag: i64) -> Result<(), String> {
        let (stamp, key) = self.cells(row)?;
        key.store(tag, Ordering::Release);
        stamp.store(handle, Ordering::Release);
        Ok(())
    }

    /// The first half of a write: every row of `writes` marked invalid, then
    /// a full fence (the stamps are invalid before any byte changes).
    pub fn begin_writes(&self, writes: &[RowWrite]) -> Result<(), String> {
        for w in writes {
            self.invalidate(w.row, w.handle)?;
        }
        copies_done();
        Ok(())
    }

    /// The second half, once the bytes are copied: a full fence (every byte
    /// is in place before a row is published), then every row published.
    pub fn finish_writes(&self, writes: &[RowWrite]) -> Result<(), String> {
        copies_done();
        for w in writes {
            self.publish(w.row, w.handle, w.tag)?;
        }
        Ok(())
    }
}
