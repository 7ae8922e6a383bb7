//! The run copy between host pages and slab rows, and the seqlock's
//! sequences over it: a batch's write, a batch's read, a spill of victims,
//! and the one-page tensor calls.
//!
//! Every copy goes through `cpkv-copy`: entry `j` of a batch's pages is one
//! run table (`runs_from_rows`: a stretch of pages in consecutive host pages
//! and consecutive rows is one contiguous copy) over entry `j` of every slab
//! row and the host buffer's rows of that entry's size, so a batch is a few
//! long copies, not one per page piece (at 4 KB pages the per-copy work, not
//! the bytes, is the cost). The tables are checked against both buffers
//! before a byte moves.

use std::sync::atomic::{fence, Ordering};

use cpkv_copy::{copy_runs, runs_from_rows};

use crate::layout::{HostPages, PageLayout, PoolMemory};
use crate::region::{copy_piece, Region};
use crate::seqlock::{RowStamps, RowWrite};

/// Which way a batch's bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    ToSlab,
    FromSlab,
}

/// What a one-page read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The row did not hold the page (stamp or tag differ): nothing copied.
    Missing,
    /// The row changed under the copy: the copy is not the page.
    Torn,
    /// The page is in `out`.
    Served,
}

impl PageLayout {
    fn named(&self, e: String) -> String {
        format!("pool '{}': {e}", self.name())
    }

    /// Copies pages between the host pool and the slab: `(page, row)` each,
    /// page `page` of `pages` to or from slab row `row`, entry by entry.
    pub fn copy_pages(
        &self,
        memory: &PoolMemory,
        pages: &HostPages,
        which: &[(usize, u64)],
        direction: Direction,
    ) -> Result<(), String> {
        for (j, &size) in self.sizes().iter().enumerate() {
            let (base, span) = self.entry_span(j);
            // The host side of a page's entry: its buffer, seen as rows of
            // `size` bytes from the entry's offset modulo `size` (the same for
            // every page of a pool's layout: one stretch per entry).
            let side = |&(page, _): &(usize, u64)| {
                let (buffer, at) = pages.page(page)[j];
                (buffer, at % size)
            };
            let mut rest = which;
            while let Some(first) = rest.first() {
                let (buffer, residue) = side(first);
                let stretch = rest
                    .iter()
                    .position(|w| side(w) != (buffer, residue))
                    .unwrap_or(rest.len());
                let (now, later) = rest.split_at(stretch);
                rest = later;
                let host_rows: Vec<u64> = now
                    .iter()
                    .map(|&(page, _)| pages.page(page)[j].1 / size)
                    .collect();
                let slab_rows: Vec<u64> = now.iter().map(|&(_, row)| row).collect();
                let host = memory.host[buffer];
                let host_span = (host.len() as u64 - residue) / size * size;
                match direction {
                    Direction::ToSlab => copy_runs(
                        memory.data.slice_mut(base, span)?,
                        &[host.slice(residue, host_span)?],
                        size as usize,
                        &runs_from_rows(&slab_rows, &host_rows, 0),
                    ),
                    Direction::FromSlab => copy_runs(
                        host.slice_mut(residue, host_span)?,
                        &[memory.data.slice(base, span)?],
                        size as usize,
                        &runs_from_rows(&host_rows, &slab_rows, 0),
                    ),
                }
                .map_err(|e| format!("entry {j}: {e}"))?;
            }
        }
        Ok(())
    }

    /// Slab `row`, entry `j`, and the piece of a page laid out whole it is.
    fn row_entry(&self, row: u64, j: usize) -> Result<(u64, u64), String> {
        if row >= self.rows() {
            return Err(format!(
                "slab row {row} is outside the slab's {} rows",
                self.rows()
            ));
        }
        let (base, _) = self.entry_span(j);
        Ok((base + row * self.sizes()[j], self.sizes()[j]))
    }

    /// Copies slab `row` into `out` (`page_bytes` long, its entries in
    /// order, as an L3 record holds a page).
    pub fn copy_row_out(
        &self,
        memory: &PoolMemory,
        row: u64,
        out: &mut [u8],
    ) -> Result<(), String> {
        self.check_whole(out.len())?;
        for j in 0..self.sizes().len() {
            let (at, size) = self.row_entry(row, j)?;
            let from = self.page_offset(j) as usize;
            copy_piece(
                &mut out[from..from + size as usize],
                memory.data.slice(at, size)?,
            )?;
        }
        Ok(())
    }

    /// Copies a page laid out whole (`src`) into slab `row`.
    fn copy_row_in(&self, memory: &PoolMemory, row: u64, src: &[u8]) -> Result<(), String> {
        self.check_whole(src.len())?;
        for j in 0..self.sizes().len() {
            let (at, size) = self.row_entry(row, j)?;
            let from = self.page_offset(j) as usize;
            copy_piece(
                memory.data.slice_mut(at, size)?,
                &src[from..from + size as usize],
            )?;
        }
        Ok(())
    }

    /// Copies one page laid out whole (`src`) into page `page` of `pages`
    /// in the host pool, entry by entry (an L3 read landing in the pool).
    pub fn copy_page_in(
        &self,
        memory: &PoolMemory,
        pages: &HostPages,
        page: usize,
        src: &[u8],
    ) -> Result<(), String> {
        self.check_whole(src.len()).map_err(|e| self.named(e))?;
        for (j, &(buffer, host_at)) in pages.page(page).iter().enumerate() {
            let size = self.sizes()[j];
            let from = self.page_offset(j) as usize;
            copy_piece(
                memory.host[buffer].slice_mut(host_at, size)?,
                &src[from..from + size as usize],
            )
            .map_err(|e| self.named(e))?;
        }
        Ok(())
    }

    fn check_whole(&self, bytes: usize) -> Result<(), String> {
        if bytes as u64 != self.page_bytes() {
            return Err(format!(
                "a page has {} bytes, not {bytes}",
                self.page_bytes()
            ));
        }
        Ok(())
    }

    /// A batch's write, once its rows are marked invalid
    /// ([`RowStamps::begin_writes`]): page `positions[i]` of `pages` copied
    /// into row `writes[i].row`, then every row published.
    pub fn write_pages(
        &self,
        memory: &PoolMemory,
        pages: &HostPages,
        positions: &[usize],
        writes: &[RowWrite],
    ) -> Result<(), String> {
        let which: Vec<(usize, u64)> = positions
            .iter()
            .zip(writes)
            .map(|(&p, w)| (p, w.row))
            .collect();
        self.copy_pages(memory, pages, &which, Direction::ToSlab)
            .and_then(|()| memory.stamps.finish_writes(writes))
            .map_err(|e| self.named(e))
    }

    /// A batch's read: of `found` (position in the call, row, handle), the
    /// rows that hold their page (handle and the tag `tag_of(position)`) are
    /// copied into their host pages, and kept only where they still hold it
    /// after the copy. The positions served, and how many rows were copied.
    pub fn read_pages(
        &self,
        memory: &PoolMemory,
        pages: &HostPages,
        found: &[(usize, u64, i64)],
        tag_of: impl Fn(usize) -> i64,
    ) -> Result<(Vec<usize>, usize), String> {
        let stamps = &memory.stamps;
        // Every row's stamp and tag are fetched, and the keys' tags
        // computed, before any row is checked: the misses overlap.
        stamps.prefetch_rows(found.iter().map(|&(_, row, _)| row));
        let tags: Vec<i64> = found.iter().map(|&(i, ..)| tag_of(i)).collect();
        let mut copied = Vec::with_capacity(found.len());
        for (&(i, row, handle), &tag) in found.iter().zip(&tags) {
            if stamps.holds(row, handle, tag).map_err(|e| self.named(e))? {
                copied.push((i, RowWrite { row, handle, tag }));
            }
        }
        let which: Vec<(usize, u64)> = copied.iter().map(|&(i, w)| (i, w.row)).collect();
        self.copy_pages(memory, pages, &which, Direction::FromSlab)
            .map_err(|e| self.named(e))?;
        fence(Ordering::Acquire); // the bytes are read before the stamps are read again
        let mut served = Vec::with_capacity(copied.len());
        for &(i, w) in &copied {
            if stamps
                .holds(w.row, w.handle, w.tag)
                .map_err(|e| self.named(e))?
            {
                served.push(i);
            }
        }
        Ok((served, copied.len()))
    }

    /// One page's read (the tensor call): slab `row` into `out` (a page laid
    /// out whole) while it holds `handle` and `tag`, before and after.
    pub fn read_page(
        &self,
        memory: &PoolMemory,
        row: u64,
        handle: i64,
        tag: i64,
        out: Region,
    ) -> Result<ReadOutcome, String> {
        self.private(memory, &out, "out")?;
        let stamps = &memory.stamps;
        if !stamps.holds(row, handle, tag).map_err(|e| self.named(e))? {
            return Ok(ReadOutcome::Missing);
        }
        let bytes = out.slice_mut(0, out.len() as u64)?;
        self.copy_row_out(memory, row, bytes)
            .map_err(|e| self.named(e))?;
        fence(Ordering::Acquire); // the bytes are read before the stamps are read again
        Ok(
            if stamps.holds(row, handle, tag).map_err(|e| self.named(e))? {
                ReadOutcome::Served
            } else {
                ReadOutcome::Torn
            },
        )
    }

    /// The tensor calls' write: each page `values[i]` (laid out whole) into
    /// row `writes[i].row` unless the row holds it already, by the seqlock's
    /// sequence (invalid, copies, published); `after_invalidate` runs between
    /// the rows' invalidation and their copies (a fault-injection hook: an
    /// error from it stops the write there, its rows left invalid). How many
    /// rows were written.
    pub fn write_values(
        &self,
        memory: &PoolMemory,
        writes: &[RowWrite],
        values: &[Region],
        after_invalidate: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<usize, String> {
        if writes.len() != values.len() {
            return Err(format!("{} values for {} rows", values.len(), writes.len()));
        }
        for (i, v) in values.iter().enumerate() {
            self.private(memory, v, &format!("value {i}"))?;
            self.check_whole(v.len())
                .map_err(|e| self.named(format!("value {i}: {e}")))?;
        }
        let stamps = &memory.stamps;
        let mut todo = Vec::with_capacity(writes.len());
        for (w, v) in writes.iter().zip(values) {
            if !stamps
                .holds(w.row, w.handle, w.tag)
                .map_err(|e| self.named(e))?
            {
                todo.push((*w, *v));
            }
        }
        if todo.is_empty() {
            return Ok(0);
        }
        let rows: Vec<RowWrite> = todo.iter().map(|&(w, _)| w).collect();
        stamps.begin_writes(&rows).map_err(|e| self.named(e))?;
        after_invalidate()?;
        for (w, v) in &todo {
            self.copy_row_in(memory, w.row, v.slice(0, v.len() as u64)?)
                .map_err(|e| self.named(e))?;
        }
        stamps.finish_writes(&rows).map_err(|e| self.named(e))?;
        Ok(todo.len())
    }

    /// Refuses a caller's buffer that shares memory with the slab.
    fn private(&self, memory: &PoolMemory, r: &Region, what: &str) -> Result<(), String> {
        if r.overlaps(&memory.data) || memory.stamps.overlaps(r) {
            return Err(self.named(format!("{what} overlaps the slab")));
        }
        Ok(())
    }
}

/// Copies out each victim (`rows[i]`, key tag `tags[i]`) whose row this rank
/// writes (`row % node_size == local_rank`) and that carries the victim's page
/// in every pool of `sides` (a written stamp and its key tag, before and after
/// the copy) into `outs[pool]` (`rows.len()` pages laid out whole); the other
/// victims are not copied: a page leaves the slab whole (every pool's bytes)
/// or not at all. Per victim, whether it was copied.
pub fn copy_victims(
    sides: &[(&PageLayout, &PoolMemory)],
    rows: &[u64],
    tags: &[i64],
    node_size: u64,
    local_rank: u64,
    outs: &mut [Vec<u8>],
) -> Result<Vec<bool>, String> {
    let mut copied = vec![false; rows.len()];
    for (i, (&row, &tag)) in rows.iter().zip(tags).enumerate() {
        if row % node_size != local_rank {
            continue;
        }
        let mut whole = true;
        for ((layout, memory), out) in sides.iter().zip(outs.iter_mut()) {
            if !memory
                .stamps
                .carries(row, tag)
                .map_err(|e| layout.named(e))?
            {
                whole = false;
                break;
            }
            let page_bytes = layout.page_bytes() as usize;
            layout
                .copy_row_out(memory, row, &mut out[i * page_bytes..(i + 1) * page_bytes])
                .map_err(|e| layout.named(e))?;
        }
        if !whole {
            continue;
        }
        fence(Ordering::Acquire); // the bytes are read before the stamps are read again
        let mut still = true;
        for (layout, memory) in sides {
            still &= memory
                .stamps
                .carries(row, tag)
                .map_err(|e| layout.named(e))?;
        }
        copied[i] = still;
    }
    Ok(copied)
}

/// Of a batch's writes (each with what the caller tags it by), those whose
/// row does not hold its page already (a page stored again is not written
/// twice); every row's stamp and tag fetched before any is checked.
pub fn unwritten<T>(
    stamps: &RowStamps,
    writes: Vec<(T, RowWrite)>,
) -> Result<Vec<(T, RowWrite)>, String> {
    stamps.prefetch_rows(writes.iter().map(|(_, w)| w.row));
    let mut todo = Vec::with_capacity(writes.len());
    for (t, w) in writes {
        if !stamps.holds(w.row, w.handle, w.tag)? {
            todo.push((t, w));
        }
    }
    Ok(todo)
}
