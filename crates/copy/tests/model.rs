//! The kernel against a naive model: a byte-by-byte loop over every run.

use cpkv_copy::{copy_runs, copy_runs_with, runs_from_rows, CheckedRuns, CopyError, Run, Stores};
use proptest::prelude::*;

/// The model: every row of every run, one byte at a time, in table order
/// (deliberately not a memcpy: it must not share the kernel's shape).
#[allow(clippy::manual_memcpy)]
fn model(dst: &mut [u8], sources: &[Vec<u8>], row_bytes: usize, runs: &[Run]) {
    for run in runs {
        for k in 0..run.count {
            let d = (run.dst_row + k * run.dst_stride) as usize * row_bytes;
            let s = (run.src_row + k * run.src_stride) as usize * row_bytes;
            for b in 0..row_bytes {
                dst[d + b] = sources[run.source as usize][s + b];
            }
        }
    }
}

fn source_bytes(index: usize, rows: usize, row_bytes: usize) -> Vec<u8> {
    (0..rows * row_bytes)
        .map(|i| (i as u64 * 31 + index as u64 * 101 + 7) as u8)
        .collect()
}

/// Runs that may or may not fit: small numbers around the buffer sizes.
fn any_run(sources: u64) -> impl Strategy<Value = Run> {
    (
        0u64..24,
        0u64..4,
        0u64..6,
        0..sources + 1,
        0u64..20,
        0u64..4,
    )
        .prop_map(
            |(dst_row, dst_stride, count, source, src_row, src_stride)| Run {
                dst_row,
                dst_stride,
                count,
                source,
                src_row,
                src_stride,
            },
        )
}

/// `width` runs that interleave like a compose gather's `cp` owners of one
/// stretch: stride `stride`, destinations `dst_row, dst_row + 1, ...`, any
/// counts (a count that grows ends the kernel's group), any sources; a width
/// above the stride makes runs that overlap (and must keep table order).
fn interleaved_group(sources: u64) -> impl Strategy<Value = Vec<Run>> {
    (
        0u64..8,
        1u64..5,
        1usize..5,
        prop::collection::vec(0u64..5, 4),
        0u64..8,
    )
        .prop_flat_map(move |(dst_row, stride, width, counts, src_row)| {
            (
                Just((dst_row, stride, width, counts, src_row)),
                prop::collection::vec(0..sources, 4),
            )
        })
        .prop_map(|((dst_row, stride, width, counts, src_row), source)| {
            (0..width)
                .map(|i| Run {
                    dst_row: dst_row + i as u64,
                    dst_stride: stride,
                    count: counts[i],
                    source: source[i],
                    src_row,
                    src_stride: 1,
                })
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Valid tables copy exactly what the model copies, with either kind of
    /// stores (rows long enough for the streaming body and unaligned heads and
    /// tails included); invalid ones are refused with the destination untouched.
    #[test]
    fn kernel_matches_model(
        row_bytes in prop_oneof![1usize..40, 60usize..200],
        stores in prop_oneof![Just(None), Just(Some(Stores::Cached)), Just(Some(Stores::Streaming))],
        source_rows in prop::collection::vec(0usize..20, 1..5),
        dst_rows in 0usize..24,
        runs in prop::collection::vec(any_run(4), 0..12),
    ) {
        let sources: Vec<Vec<u8>> = source_rows
            .iter()
            .enumerate()
            .map(|(i, &rows)| source_bytes(i, rows, row_bytes))
            .collect();
        let views: Vec<&[u8]> = sources.iter().map(Vec::as_slice).collect();
        let before: Vec<u8> = (0..dst_rows * row_bytes).map(|i| (i % 251) as u8).collect();
        let mut dst = before.clone();
        let fits = runs.iter().all(|r| {
            r.count == 0
                || ((r.source as usize) < sources.len()
                    && !(r.dst_stride == 0 && r.count > 1)
                    && r.dst_row + (r.count - 1) * r.dst_stride < dst_rows as u64
                    && r.src_row + (r.count - 1) * r.src_stride < source_rows[r.source as usize] as u64)
        });
        match copy_runs_with(&mut dst, &views, row_bytes, &runs, stores) {
            Ok(()) => {
                prop_assert!(fits);
                let mut expected = before.clone();
                model(&mut expected, &sources, row_bytes, &runs);
                prop_assert_eq!(dst, expected);
            }
            Err(_) => {
                prop_assert!(!fits);
                prop_assert_eq!(dst, before);
            }
        }
    }

    /// Tables of interleaved groups (overlapping each other, mixed with
    /// arbitrary runs) copy exactly what the model copies in table order.
    #[test]
    fn interleaved_groups_match_model(
        row_bytes in prop_oneof![1usize..20, 64usize..130],
        stores in prop_oneof![Just(Some(Stores::Cached)), Just(Some(Stores::Streaming))],
        groups in prop::collection::vec(interleaved_group(3), 1..5),
        extra in prop::collection::vec(any_run(3), 0..3),
    ) {
        let (source_rows, dst_rows) = (16usize, 40usize);
        let sources: Vec<Vec<u8>> = (0..3).map(|i| source_bytes(i, source_rows, row_bytes)).collect();
        let views: Vec<&[u8]> = sources.iter().map(Vec::as_slice).collect();
        let mut runs: Vec<Run> = Vec::new();
        for (i, group) in groups.into_iter().enumerate() {
            runs.extend(group);
            if let Some(run) = extra.get(i) {
                runs.push(*run);
            }
        }
        let before: Vec<u8> = (0..dst_rows * row_bytes).map(|i| (i % 251) as u8).collect();
        let mut dst = before.clone();
        match copy_runs_with(&mut dst, &views, row_bytes, &runs, stores) {
            Ok(()) => {
                let mut expected = before.clone();
                model(&mut expected, &sources, row_bytes, &runs);
                prop_assert_eq!(dst, expected);
            }
            Err(_) => prop_assert_eq!(dst, before),
        }
    }

    /// Compressing a row mapping into runs changes nothing the copy does.
    #[test]
    fn runs_from_rows_is_the_row_loop(
        pairs in prop::collection::vec((0u64..64, 0u64..64), 0..40),
        sorted in any::<bool>(),
    ) {
        let mut pairs = pairs;
        if sorted {
            pairs.sort_unstable();
            pairs.dedup_by_key(|p| p.0);
        }
        let (dst_rows, src_rows): (Vec<u64>, Vec<u64>) = pairs.iter().copied().unzip();
        let runs = runs_from_rows(&dst_rows, &src_rows, 0);
        prop_assert_eq!(runs.iter().map(|r| r.count).sum::<u64>(), pairs.len() as u64);
        let row_bytes = 3;
        let source = source_bytes(0, 64, row_bytes);
        let mut by_runs = vec![0u8; 64 * row_bytes];
        copy_runs(&mut by_runs, &[&source], row_bytes, &runs).unwrap();
        let mut by_rows = vec![0u8; 64 * row_bytes];
        for (d, s) in pairs {
            let (d, s) = (d as usize * row_bytes, s as usize * row_bytes);
            by_rows[d..d + row_bytes].copy_from_slice(&source[s..s + row_bytes]);
        }
        prop_assert_eq!(by_runs, by_rows);
    }
}

#[test]
fn zero_row_bytes_and_ragged_buffers_are_refused() {
    let mut dst = vec![0u8; 8];
    assert!(matches!(
        copy_runs(&mut dst, &[&[0u8; 8]], 0, &[]),
        Err(CopyError::RowBytes { .. })
    ));
    assert!(matches!(
        copy_runs(&mut dst, &[&[0u8; 7]], 4, &[]),
        Err(CopyError::RowBytes { .. })
    ));
}

#[test]
fn huge_strides_do_not_overflow() {
    let mut dst = vec![0u8; 8];
    let run = Run {
        dst_row: 0,
        dst_stride: u64::MAX,
        count: u64::MAX,
        source: 0,
        src_row: 0,
        src_stride: 0,
    };
    assert!(matches!(
        copy_runs(&mut dst, &[&[1u8; 8]], 4, &[run]),
        Err(CopyError::OutOfRange { .. })
    ));
}

#[test]
fn a_checked_table_copies_only_into_buffers_of_the_checked_sizes() {
    let source = source_bytes(0, 6, 4);
    let runs = [Run {
        dst_row: 0,
        dst_stride: 2,
        count: 3,
        source: 0,
        src_row: 1,
        src_stride: 1,
    }];
    let checked = CheckedRuns::new(&runs, 4, 6, vec![6], None).unwrap();
    let (mut dst, mut want) = (vec![0u8; 24], vec![0u8; 24]);
    checked.copy(&mut dst, &[&source]).unwrap();
    model(&mut want, std::slice::from_ref(&source), 4, &runs);
    assert_eq!(dst, want);
    let bad: [(usize, Vec<&[u8]>); 3] = [
        (20, vec![&source[..]]),              // a short destination
        (24, vec![&source[..20]]),            // a short source
        (24, vec![&source[..], &source[..]]), // one source too many
    ];
    for (len, sources) in bad {
        let mut dst = vec![9u8; len];
        assert!(matches!(
            checked.copy(&mut dst, &sources),
            Err(CopyError::NotChecked { .. })
        ));
        assert!(dst.iter().all(|&b| b == 9), "nothing written");
    }
    // A table that does not fit is refused when checked.
    assert!(matches!(
        CheckedRuns::new(&runs, 4, 4, vec![6], None),
        Err(CopyError::OutOfRange { .. })
    ));
}
