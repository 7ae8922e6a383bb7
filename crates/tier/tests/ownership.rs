//! `owned_rows` against a model written from the rule alone: page `p` is
//! rank `p % cp`'s row `p / cp`, and the runs move exactly the owned pairs.

use cpkv_tier::{owned_rows, MAX_CP_SIZE};
use proptest::prelude::*;

/// Applies a run table to a pool of `rows` rows, each row holding the slab
/// row it was filled from (`None`: never written).
fn pool_after(runs: &[cpkv_copy::Run], rows: usize) -> Vec<Option<u64>> {
    let mut pool = vec![None; rows];
    for run in runs {
        assert_eq!(run.source, 0);
        for k in 0..run.count {
            let dst = (run.dst_row + k * run.dst_stride) as usize;
            pool[dst] = Some(run.src_row + k * run.src_stride);
        }
    }
    pool
}

proptest! {
    #[test]
    fn owned_rows_is_the_modulo_rule(
        cp in 1u64..6,
        rank_pick in any::<u64>(),
        pairs in prop::collection::vec((0u64..200, 0u64..200), 0..60),
        sorted in any::<bool>(),
    ) {
        let rank = rank_pick % cp;
        let mut pairs = pairs;
        if sorted {
            // Pages taken lowest first and contiguous slab objects: long runs.
            pairs.sort_unstable();
        }
        pairs.dedup_by_key(|p| p.0);
        let (pages, slab): (Vec<u64>, Vec<u64>) = pairs.iter().copied().unzip();
        let owned = owned_rows(rank, cp, &pages, &slab).unwrap();

        let mut mask = Vec::new();
        let mut want_pool = Vec::new();
        let mut want_slab = Vec::new();
        for (&page, &row) in pages.iter().zip(&slab) {
            mask.push(page % cp == rank);
            if page % cp == rank {
                want_pool.push(page / cp);
                want_slab.push(row);
            }
        }
        prop_assert_eq!(&owned.mask, &mask);
        prop_assert_eq!(&owned.pool_rows, &want_pool);
        prop_assert_eq!(&owned.slab_rows, &want_slab);

        // The runs fill each owned pool row from its slab row, and nothing else.
        let rows = 200 / cp as usize + 1;
        let mut expected = vec![None; rows];
        for (&p, &s) in want_pool.iter().zip(&want_slab) {
            expected[p as usize] = Some(s);
        }
        prop_assert_eq!(pool_after(&owned.runs, rows), expected);
        prop_assert!(owned.runs.len() <= want_pool.len());
    }

    #[test]
    fn a_refused_call_names_its_value(rank in 0u64..10, cp in 0u64..10) {
        let result = owned_rows(rank, cp, &[0], &[0]);
        if cp == 0 || cp > MAX_CP_SIZE {
            let prefix = format!("cp_size {cp} ");
            prop_assert!(result.unwrap_err().to_string().starts_with(&prefix));
        } else if rank >= cp {
            prop_assert_eq!(result.unwrap_err().to_string(), format!("rank {rank} is not in 0..{cp}"));
        } else {
            prop_assert!(result.is_ok());
        }
    }
}
