//! The run table's row type, and the compression of a row mapping into runs.

/// Columns of a run as the Python side holds it (an int64 `[R, 6]` array).
pub const RUN_COLUMNS: usize = 6;

/// `dst[dst_row + k * dst_stride] = sources[source][src_row + k * src_stride]`, `k < count`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    pub dst_row: u64,
    pub dst_stride: u64,
    pub count: u64,
    pub source: u64,
    pub src_row: u64,
    pub src_stride: u64,
}

impl Run {
    /// Copies `count` consecutive rows to consecutive rows.
    pub fn contiguous(dst_row: u64, source: u64, src_row: u64, count: u64) -> Self {
        Run {
            dst_row,
            dst_stride: 1,
            count,
            source,
            src_row,
            src_stride: 1,
        }
    }
}

/// Runs moving `src_rows[i]` of `source` to `dst_rows[i]` for every `i`:
/// each maximal stretch where both sides advance by the same positive step
/// becomes one run (the tier's pages are taken lowest first and slab objects
/// are contiguous, so a copy is usually a handful of runs). Pairs keep their
/// order, so a repeated destination row ends with its last source, as a
/// plain loop over the pairs would.
pub fn runs_from_rows(dst_rows: &[u64], src_rows: &[u64], source: u64) -> Vec<Run> {
    assert_eq!(
        dst_rows.len(),
        src_rows.len(),
        "one source row per destination row"
    );
    let n = dst_rows.len();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < n {
        let (mut j, mut dst_step, mut src_step) = (i, 1, 1);
        if i + 1 < n && dst_rows[i + 1] > dst_rows[i] && src_rows[i + 1] > src_rows[i] {
            dst_step = dst_rows[i + 1] - dst_rows[i];
            src_step = src_rows[i + 1] - src_rows[i];
            j = i + 1;
            while j + 1 < n
                && dst_rows[j + 1] > dst_rows[j]
                && src_rows[j + 1] > src_rows[j]
                && dst_rows[j + 1] - dst_rows[j] == dst_step
                && src_rows[j + 1] - src_rows[j] == src_step
            {
                j += 1;
            }
        }
        runs.push(Run {
            dst_row: dst_rows[i],
            dst_stride: dst_step,
            count: (j - i + 1) as u64,
            source,
            src_row: src_rows[i],
            src_stride: src_step,
        });
        i = j + 1;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_stretches_become_one_run_each() {
        let runs = runs_from_rows(&[0, 2, 4, 5, 9], &[10, 11, 12, 20, 3], 1);
        let single = |dst_row, src_row| Run::contiguous(dst_row, 1, src_row, 1);
        let first = Run {
            dst_row: 0,
            dst_stride: 2,
            count: 3,
            source: 1,
            src_row: 10,
            src_stride: 1,
        };
        assert_eq!(runs, vec![first, single(5, 20), single(9, 3)]);
    }

    #[test]
    fn empty_mapping_has_no_runs() {
        assert!(runs_from_rows(&[], &[], 0).is_empty());
    }
}
