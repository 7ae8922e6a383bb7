//! The copy itself: one copy per contiguous stretch, one per row otherwise,
//! with the stores `Stores::for_bytes` picks for the whole table.

use crate::check::{check_runs, rows_of, CopyError};
use crate::runs::Run;
use crate::stores::{copy, copy_row, fence, Stores};

/// Executes `runs` from `sources` into `dst` (all rows of `row_bytes` bytes),
/// streaming past the cache when the table moves more than the last-level
/// cache holds. Every run is checked first; on an error nothing was written.
pub fn copy_runs(
    dst: &mut [u8],
    sources: &[&[u8]],
    row_bytes: usize,
    runs: &[Run],
) -> Result<(), CopyError> {
    copy_runs_with(dst, sources, row_bytes, runs, None)
}

/// `copy_runs` with the stores forced (`None`: chosen by size, as there).
pub fn copy_runs_with(
    dst: &mut [u8],
    sources: &[&[u8]],
    row_bytes: usize,
    runs: &[Run],
    stores: Option<Stores>,
) -> Result<(), CopyError> {
    let dst_rows = rows_of("the destination", dst.len(), row_bytes)?;
    let source_rows = sources
        .iter()
        .enumerate()
        .map(|(i, s)| rows_of(&format!("source {i}"), s.len(), row_bytes))
        .collect::<Result<Vec<_>, _>>()?;
    check_runs(runs, dst_rows, &source_rows)?;
    let stores = stores.unwrap_or_else(|| {
        // Checked above: every run's rows lie in `dst`, so this cannot overflow.
        let rows: u64 = runs.iter().map(|r| r.count).sum();
        Stores::for_bytes((rows as usize).saturating_mul(row_bytes))
    });
    // A run of no rows names no buffer (its source was not checked).
    for run in runs.iter().filter(|r| r.count > 0) {
        copy_checked(dst, sources[run.source as usize], row_bytes, run, stores);
    }
    fence(stores);
    Ok(())
}

/// One run, already checked (every row index is in range, so the casts fit).
fn copy_checked(dst: &mut [u8], src: &[u8], row_bytes: usize, run: &Run, stores: Stores) {
    let count = run.count as usize;
    let (d0, s0) = (
        run.dst_row as usize * row_bytes,
        run.src_row as usize * row_bytes,
    );
    if run.dst_stride == 1 && run.src_stride == 1 {
        let bytes = count * row_bytes;
        copy(&mut dst[d0..d0 + bytes], &src[s0..s0 + bytes], stores);
        return;
    }
    let (dst_step, src_step) = (
        run.dst_stride as usize * row_bytes,
        run.src_stride as usize * row_bytes,
    );
    let (mut d, mut s) = (d0, s0);
    for _ in 0..count {
        copy_row(&mut dst[d..d + row_bytes], &src[s..s + row_bytes], stores);
        d += dst_step;
        s += src_step;
    }
}
