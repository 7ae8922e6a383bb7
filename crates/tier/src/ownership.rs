//! Which CP rank owns which logical device page, and the rows one rank
//! copies between its device pool and the host slab: logical page `p` lives
//! on rank `p % cp_size` at pool row `p / cp_size`. Computed here once for
//! every caller (the controller's backups and load-backs, the compose
//! layout), so no rank can disagree with another about who moves a page.

use cpkv_copy::{runs_from_rows, Run};

use crate::config::{MAX_CP_SIZE, MAX_PAGES};
use crate::error::{Result, TierError};

/// This rank's share of a batch of pages, each paired with a slab row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRows {
    /// Per page of the batch, in its order: whether this rank owns it.
    pub mask: Vec<bool>,
    /// The owned pages' rows in this rank's pool, in batch order.
    pub pool_rows: Vec<u64>,
    /// The slab row of each owned page, paired with `pool_rows`.
    pub slab_rows: Vec<u64>,
    /// The load-back's runs (`pool[pool_rows[i]] = slab[slab_rows[i]]`,
    /// source 0): each constant-step stretch one run. A backup's runs are
    /// the same with the two sides swapped (the compression is symmetric).
    pub runs: Vec<Run>,
}

/// The rows `rank` of `cp_size` copies for `pages`, whose host copies are
/// `slab_rows` (one per page). Refuses, naming the value, a rank outside
/// `0..cp_size`, a `cp_size` outside `1..=MAX_CP_SIZE`, lengths that differ
/// and a page or slab row beyond `MAX_PAGES`.
pub fn owned_rows(rank: u64, cp_size: u64, pages: &[u64], slab_rows: &[u64]) -> Result<OwnedRows> {
    let bad = |name, reason: String| Err(TierError::Argument { name, reason });
    if cp_size == 0 || cp_size > MAX_CP_SIZE {
        return bad("cp_size", format!("{cp_size} is not in 1..={MAX_CP_SIZE}"));
    }
    if rank >= cp_size {
        return bad("rank", format!("{rank} is not in 0..{cp_size}"));
    }
    if pages.len() != slab_rows.len() {
        return bad(
            "slab_rows",
            format!(
                "has {} rows for {} pages (one per page)",
                slab_rows.len(),
                pages.len()
            ),
        );
    }
    if let Some(&page) = pages.iter().find(|&&p| p >= MAX_PAGES) {
        return Err(TierError::PageOutOfRange {
            page,
            capacity: MAX_PAGES,
        });
    }
    if let Some((i, row)) = slab_rows.iter().enumerate().find(|(_, &r)| r >= MAX_PAGES) {
        return bad(
            "slab_rows",
            format!("[{i}] = {row} is beyond the most host pages, {MAX_PAGES}"),
        );
    }
    let mask: Vec<bool> = pages.iter().map(|p| p % cp_size == rank).collect();
    let (pool_rows, owned_slab_rows): (Vec<u64>, Vec<u64>) = pages
        .iter()
        .zip(slab_rows)
        .zip(&mask)
        .filter(|(_, &owned)| owned)
        .map(|((page, slab), _)| (page / cp_size, *slab))
        .unzip();
    let runs = runs_from_rows(&pool_rows, &owned_slab_rows, 0);
    Ok(OwnedRows {
        mask,
        pool_rows,
        slab_rows: owned_slab_rows,
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_takes_every_cp_th_page_at_its_local_row() {
        let owned = owned_rows(1, 2, &[0, 1, 3, 5, 4, 7], &[10, 11, 12, 13, 14, 15]).unwrap();
        assert_eq!(owned.mask, [false, true, true, true, false, true]);
        assert_eq!(owned.pool_rows, [0, 1, 2, 3]);
        assert_eq!(owned.slab_rows, [11, 12, 13, 15]);
        let stretch = Run {
            count: 3,
            ..Run::contiguous(0, 0, 11, 3)
        };
        assert_eq!(owned.runs, [stretch, Run::contiguous(3, 0, 15, 1)]);
    }

    #[test]
    fn bad_arguments_are_named() {
        let message = |r: Result<OwnedRows>| r.unwrap_err().to_string();
        assert_eq!(message(owned_rows(2, 2, &[], &[])), "rank 2 is not in 0..2");
        assert!(message(owned_rows(0, 0, &[], &[])).starts_with("cp_size 0 "));
        assert!(message(owned_rows(0, 1, &[1], &[])).contains("0 rows for 1 pages"));
        assert!(message(owned_rows(0, 1, &[MAX_PAGES], &[0])).contains(&MAX_PAGES.to_string()));
        assert!(message(owned_rows(0, 1, &[0], &[MAX_PAGES])).starts_with("slab_rows [0]"));
    }
}
