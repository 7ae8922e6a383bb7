//! Validation of a run table against the buffers it names, before any copy.

use std::fmt;

use crate::runs::{Run, RUN_COLUMNS};

/// Why a copy was refused; nothing was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyError {
    /// Rows of zero bytes, or a buffer that is not a whole number of rows.
    RowBytes {
        what: String,
        bytes: usize,
        row_bytes: usize,
    },
    /// Run `index` names a source the table does not have.
    UnknownSource {
        index: usize,
        source: u64,
        sources: usize,
    },
    /// Run `index` reads or writes past the end of a buffer.
    OutOfRange {
        index: usize,
        side: &'static str,
        last_row: u128,
        rows: usize,
    },
    /// Run `index` writes one row several times (`dst_stride` 0 with `count` > 1).
    ZeroDstStride { index: usize },
    /// A buffer handed to `CheckedRuns::copy` is not the size the runs were checked for.
    NotChecked { what: String },
    /// A flat run table entry is negative (`run`, `column` of `RUN_COLUMNS`).
    NegativeEntry {
        run: usize,
        column: usize,
        value: i64,
    },
    /// A flat run table whose length is not a whole number of runs.
    Ragged { values: usize },
}

impl fmt::Display for CopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CopyError::RowBytes {
                what,
                bytes,
                row_bytes,
            } => write!(
                f,
                "{what} holds {bytes} bytes, not a whole number of {row_bytes}-byte rows"
            ),
            CopyError::UnknownSource {
                index,
                source,
                sources,
            } => write!(
                f,
                "run {index} reads source {source}, the table has {sources} sources"
            ),
            CopyError::OutOfRange {
                index,
                side,
                last_row,
                rows,
            } => write!(
                f,
                "run {index} reaches {side} row {last_row}, the {side} buffer has {rows} rows"
            ),
            CopyError::ZeroDstStride { index } => write!(
                f,
                "run {index} has dst_stride 0 and count > 1 (it would write one row several times)"
            ),
            CopyError::NotChecked { what } => {
                write!(f, "{what} is not the size the run table was checked for")
            }
            CopyError::NegativeEntry { run, column, value } => {
                write!(
                    f,
                    "run {run} has a negative entry {value} in column {column}"
                )
            }
            CopyError::Ragged { values } => write!(
                f,
                "a run table of {values} values is not a whole number of {RUN_COLUMNS}-value runs"
            ),
        }
    }
}

impl std::error::Error for CopyError {}

/// The last row a run touches on one side (`u128`: no overflow for any u64 input).
fn last_row(first: u64, stride: u64, count: u64) -> u128 {
    u128::from(first) + u128::from(stride) * u128::from(count - 1)
}

/// Checks every run against a destination of `dst_rows` rows and sources of
/// `source_rows[s]` rows each.
pub(crate) fn check_runs(
    runs: &[Run],
    dst_rows: usize,
    source_rows: &[usize],
) -> Result<(), CopyError> {
    for (index, run) in runs.iter().enumerate() {
        if run.count == 0 {
            continue;
        }
        let Some(&rows) = usize::try_from(run.source)
            .ok()
            .and_then(|s| source_rows.get(s))
        else {
            return Err(CopyError::UnknownSource {
                index,
                source: run.source,
                sources: source_rows.len(),
            });
        };
        if run.dst_stride == 0 && run.count > 1 {
            return Err(CopyError::ZeroDstStride { index });
        }
        let dst_last = last_row(run.dst_row, run.dst_stride, run.count);
        if dst_last >= dst_rows as u128 {
            return Err(CopyError::OutOfRange {
                index,
                side: "destination",
                last_row: dst_last,
                rows: dst_rows,
            });
        }
        let src_last = last_row(run.src_row, run.src_stride, run.count);
        if src_last >= rows as u128 {
            return Err(CopyError::OutOfRange {
                index,
                side: "source",
                last_row: src_last,
                rows,
            });
        }
    }
    Ok(())
}

/// Rows in a buffer of `bytes` bytes, or the error naming it (`what`, built
/// only for the error: a name per source per call cost a small gather ~1 us).
pub(crate) fn rows_of(
    what: impl FnOnce() -> String,
    bytes: usize,
    row_bytes: usize,
) -> Result<usize, CopyError> {
    if row_bytes == 0 || !bytes.is_multiple_of(row_bytes) {
        return Err(CopyError::RowBytes {
            what: what(),
            bytes,
            row_bytes,
        });
    }
    Ok(bytes / row_bytes)
}
