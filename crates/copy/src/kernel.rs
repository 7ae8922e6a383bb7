//! The copy itself: one `memcpy` per contiguous stretch, one per row otherwise.

use crate::check::{check_runs, rows_of, CopyError};
use crate::runs::Run;

/// Executes `runs` from `sources` into `dst` (all rows of `row_bytes` bytes).
/// Every run is checked first; on an error nothing was written.
pub fn copy_runs(
    dst: &mut [u8],
    sources: &[&[u8]],
    row_bytes: usize,
    runs: &[Run],
) -> Result<(), CopyError> {
    let dst_rows = rows_of("the destination", dst.len(), row_bytes)?;
    let source_rows = sources
        .iter()
        .enumerate()
        .map(|(i, s)| rows_of(&format!("source {i}"), s.len(), row_bytes))
        .collect::<Result<Vec<_>, _>>()?;
    check_runs(runs, dst_rows, &source_rows)?;
    // A run of no rows names no buffer (its source was not checked).
    for run in runs.iter().filter(|r| r.count > 0) {
        copy_checked(dst, sources[run.source as usize], row_bytes, run);
    }
    Ok(())
}

/// One run, already checked (every row index is in range, so the casts fit).
fn copy_checked(dst: &mut [u8], src: &[u8], row_bytes: usize, run: &Run) {
    let count = run.count as usize;
    let (d0, s0) = (
        run.dst_row as usize * row_bytes,
        run.src_row as usize * row_bytes,
    );
    if run.dst_stride == 1 && run.src_stride == 1 {
        let bytes = count * row_bytes;
        dst[d0..d0 + bytes].copy_from_slice(&src[s0..s0 + bytes]);
        return;
    }
    let (dst_step, src_step) = (
        run.dst_stride as usize * row_bytes,
        run.src_stride as usize * row_bytes,
    );
    let (mut d, mut s) = (d0, s0);
    for _ in 0..count {
        dst[d..d + row_bytes].copy_from_slice(&src[s..s + row_bytes]);
        d += dst_step;
        s += src_step;
    }
}
