//! The run table's flat int64 form (`RUN_COLUMNS` values a run, in `Run`'s
//! field order): how Python holds it, an `[R, 6]` array.

use crate::check::CopyError;
use crate::runs::{Run, RUN_COLUMNS};

/// The runs of a flat int64 run table (`RUN_COLUMNS` values a run, in
/// `Run`'s field order: how Python holds it, an `[R, 6]` array); the first
/// negative entry is refused, named.
pub fn runs_from_table(values: &[i64]) -> Result<Vec<Run>, CopyError> {
    if !values.len().is_multiple_of(RUN_COLUMNS) {
        return Err(CopyError::Ragged {
            values: values.len(),
        });
    }
    // One branch-free pass finds whether anything is negative (the common
    // answer); only then is the first offender located for the message.
    if values.iter().fold(0i64, |acc, &v| acc | v) < 0 {
        let at = values
            .iter()
            .position(|&v| v < 0)
            .expect("a negative entry");
        return Err(CopyError::NegativeEntry {
            run: at / RUN_COLUMNS,
            column: at % RUN_COLUMNS,
            value: values[at],
        });
    }
    Ok(values
        .chunks_exact(RUN_COLUMNS)
        .map(|r| Run {
            dst_row: r[0] as u64,
            dst_stride: r[1] as u64,
            count: r[2] as u64,
            source: r[3] as u64,
            src_row: r[4] as u64,
            src_stride: r[5] as u64,
        })
        .collect())
}

/// The flat int64 run table of `runs` (`runs_from_table`'s input form). Every
/// field of a run that came from a table, or from `runs_from_rows` over rows
/// below 2**63, fits an i64.
pub fn run_table(runs: &[Run]) -> Vec<i64> {
    runs.iter()
        .flat_map(|r| {
            [
                r.dst_row,
                r.dst_stride,
                r.count,
                r.source,
                r.src_row,
                r.src_stride,
            ]
        })
        .map(|v| v as i64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_reads_back_as_its_runs_and_a_negative_or_ragged_one_is_named() {
        let runs = vec![
            Run::contiguous(3, 1, 7, 4),
            Run {
                dst_stride: 2,
                src_stride: 0,
                ..Run::contiguous(0, 0, 5, 2)
            },
        ];
        let table = run_table(&runs);
        assert_eq!(table.len(), 2 * RUN_COLUMNS);
        assert_eq!(runs_from_table(&table).unwrap(), runs);
        let mut bad = table.clone();
        bad[RUN_COLUMNS + 4] = -9;
        assert_eq!(
            runs_from_table(&bad).unwrap_err().to_string(),
            "run 1 has a negative entry -9 in column 4"
        );
        assert!(matches!(
            runs_from_table(&table[1..]),
            Err(CopyError::Ragged { values: 11 })
        ));
        assert_eq!(runs_from_table(&[]).unwrap(), vec![]);
    }
}
