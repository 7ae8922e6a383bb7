//! Row copies through a run table: the one CPU copy kernel behind the compose
//! gather (rows of 2 * cp sources into a dense buffer) and the host tier's
//! backup and load-back (rows of a device pool <-> rows of the slab).
//!
//! A run is `(dst_row, dst_stride, count, source, src_row, src_stride)`:
//! `dst[dst_row + k * dst_stride] = sources[source][src_row + k * src_stride]`
//! for `k < count`. `src_stride` 0 repeats one row (the zero dummy row);
//! `dst_stride` 1 with `src_stride` 1 is one contiguous copy of `count` rows.
//! The whole table is checked before the first byte moves, so a rejected
//! table leaves `dst` as it was.

mod check;
mod kernel;
mod runs;
mod stores;
mod table;

pub use check::CopyError;
pub use kernel::{copy_runs, copy_runs_with, CheckedRuns};
pub use runs::{runs_from_rows, Run, RUN_COLUMNS};
pub use stores::{streaming_threshold, Stores};
pub use table::{run_table, runs_from_table};
